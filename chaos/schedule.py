"""The fault schedule of a chaos run, drawn from its seed: the same seed, the same schedule.

Faults come one at a time, so each one's effect (and the recovery after it) can be told apart:
a warm-up without faults, then for each fault a quiet gap and the fault itself (injected at
`at_s`, healed `length_s` later), until the next one would not end before the cool-down that
lets the cluster settle before the workloads stop. The kinds go round in a shuffled order, and
in the first round, when the run has room for every kind at its shortest, each draw leaves room
for the kinds still to come (`plan`), so a run long enough for one of each injects every kind.

What a planned fault hits is fixed here as positions, not node ids picked at run time: `node`
is an index into the run's nodes (kill, pause, partition, disk-full), `peer` the second node of
a one-way cut, `partition` the workload partition whose leader a leader-kill kills (or that a
reassign moves, or the output partition whose leader an output-leader-kill kills); `node` also
picks the transformer a transformer-kill or a txn-coordinator-kill aims at (modulo their
count). Only a controller-kill's victim is whoever is the active controller when it fires (and
a txn-coordinator-kill's whoever leads the transformer's coordinator), and a reassign's
target depends on the partition's replicas then (`reassign_target`).
A power-loss fault's cut mode ("all" or "torn") and the seed its cut tears with are drawn here
too. A membership fault's `change` is drawn here: "add" a controller, or "remove" the voter at
position `node` among the live ones, only where the voters left are at least `VOTERS_MIN`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from chaos.history import POWER_FAULT_KINDS, FaultKind
from chaos.lazyfs import CutMode

PartitionShape = Literal["isolate", "split", "one-way"]
MembershipChange = Literal["add", "remove"]

# (shortest, longest) seconds a fault of each kind lasts before it is healed.
LENGTH_S: dict[FaultKind, tuple[float, float]] = {
    "kill": (3.0, 8.0),
    "pause": (2.0, 6.0),
    "partition": (4.0, 10.0),
    "controller-kill": (3.0, 6.0),
    "leader-kill": (3.0, 6.0),
    "disk-full": (3.0, 8.0),
    "reassign": (4.0, 8.0),
    # an add includes starting the new controller and its catch-up: 2-3 s idle, 6-12 s loaded
    "membership": (8.0, 14.0),
    # SIGKILL, the cut (the forgetful filesystem drops what was not fsynced and mounts again:
    # a Python FUSE process starting, 1-3 s on a busy machine) are done at injection; the heal
    # starts the node(s), which recover their logs from what survived
    "power-loss": (3.0, 8.0),
    "power-loss-all": (4.0, 8.0),
    # the transactions workload's: a coordinator's or an output leader's node down, a transformer
    # process down (its heal starts the next incarnation)
    "txn-coordinator-kill": (3.0, 6.0),
    "output-leader-kill": (3.0, 6.0),
    "transformer-kill": (2.0, 5.0),
}
GAP_S = (3.0, 6.0)  # quiet time before each fault
# A membership fault removes a voter only where at least this many are left: a quorum that
# still survives the loss of one while the change is in place (every run has 3 or more voters).
VOTERS_MIN = 3


@dataclass(frozen=True)
class PlannedFault:
    id: int
    kind: FaultKind
    at_s: float
    length_s: float
    node: int = 0  # index into the run's nodes
    peer: int = 0  # index of the other side of a one-way cut
    shape: PartitionShape = "isolate"
    partition: int = 0  # workload partition of a leader-kill
    change: MembershipChange = "add"  # what a membership fault does to the voters
    # a power-loss fault's cut: drop every unsynced byte ("all"), or keep a torn prefix of each
    # file's last unsynced write ("torn"), drawn with `cut_seed`
    cut_mode: CutMode = "all"
    cut_seed: int = 0

    @property
    def end_s(self) -> float:
        return self.at_s + self.length_s


def phases(duration_s: float) -> tuple[float, float]:
    """(warm-up, cool-down) seconds of a run of `duration_s`."""
    warm_up = min(10.0, max(3.0, 0.08 * duration_s))
    return round(warm_up, 3), round(min(30.0, max(8.0, 0.1 * duration_s)), 3)


def plan(
    seed: int, duration_s: float, kinds: list[FaultKind], nodes: int, partitions: int
) -> list[PlannedFault]:
    """The faults of a run, in time order. `nodes` is also the number of voters (every node of
    a chaos cluster is a controller)."""
    if not kinds:
        return []
    if nodes < 2 and any(k != "leader-kill" for k in kinds):
        raise ValueError("faults between nodes need at least 2 nodes")
    rng = random.Random(seed)
    warm_up, cool_down = phases(duration_s)
    end = duration_s - cool_down
    order = list(dict.fromkeys(kinds))
    rng.shuffle(order)
    # Every kind fits at its shortest: keep room for the kinds still to come in the first round.
    fits = warm_up + _shortest(order) - GAP_S[0] <= end
    faults: list[PlannedFault] = []
    now = warm_up
    while True:
        kind = order[len(faults) % len(order)]
        to_come = order[len(faults) + 1 :] if fits else []
        room = end - _shortest(to_come) - now + _FLOAT_SLACK_S
        gap_low, gap_high = GAP_S if faults else (0.0, 0.0)
        low, high = LENGTH_S[kind]
        if gap_low + low > room:
            return faults
        gap = _ms(rng.uniform(gap_low, min(gap_high, room - low))) if faults else 0.0
        at = round(now + max(gap_low, gap), 3)  # both on the millisecond grid: no drift
        length = max(low, _ms(rng.uniform(low, min(high, room - gap))))
        node, peer = rng.sample(range(nodes), 2) if nodes >= 2 else (0, 0)
        shape: PartitionShape = rng.choice(["isolate", "split", "one-way"])
        if shape == "split" and nodes < 4:
            shape = "isolate"  # with 3 nodes the minority side is one node
        change: MembershipChange = "add"
        if kind == "membership" and nodes - 1 >= VOTERS_MIN:
            change = rng.choice(["add", "remove"])
        cut_mode: CutMode = "all"
        cut_seed = 0
        if kind in POWER_FAULT_KINDS:  # drawn only here: other kinds' schedules stay as they were
            cut_mode = rng.choice(["all", "torn"])
            cut_seed = rng.randrange(1 << 31)
        faults.append(
            PlannedFault(
                id=len(faults) + 1,
                kind=kind,
                at_s=at,
                length_s=length,
                node=node,
                peer=peer,
                shape=shape,
                partition=rng.randrange(partitions),
                change=change,
                cut_mode=cut_mode,
                cut_seed=cut_seed,
            )
        )
        now = at + length


_FLOAT_SLACK_S = 1e-9  # sums of milliseconds in binary floating point


def _ms(seconds: float) -> float:
    """Down to whole milliseconds (never up: a fault must not end past the room it was given)."""
    return math.floor(seconds * 1000) / 1000


def _shortest(kinds: list[FaultKind]) -> float:
    """Seconds `kinds` take one after another at their shortest, each with its shortest gap."""
    return sum(GAP_S[0] + LENGTH_S[k][0] for k in kinds)


def reassign_target(
    replicas: tuple[int, ...], nodes: list[int], fault: PlannedFault
) -> tuple[int, ...]:
    """Where a `reassign` fault moves a partition whose replicas are `replicas`: the replica at
    position `fault.node` leaves; a node that holds no replica (position `fault.peer` among
    them) comes in first, so the leadership moves to it when the move completes. With every
    node a replica already (3 nodes, RF 3), the partition shrinks by one replica instead; the
    heal moves it back, so the returning replica catches up from an empty log."""
    leaving = replicas[fault.node % len(replicas)]
    staying = tuple(b for b in replicas if b != leaving)
    outsiders = [n for n in nodes if n not in replicas]
    if not outsiders:
        return staying
    return (outsiders[fault.peer % len(outsiders)], *staying)


def split_sides(nodes: list[int], fault: PlannedFault) -> tuple[list[int], list[int]]:
    """The minority and the majority of a `split` partition: the minority holds the fault's
    node and, with 5 or more nodes, the next one (wrapping round)."""
    size = max(1, (len(nodes) - 1) // 2)
    minority = [nodes[(fault.node + i) % len(nodes)] for i in range(size)]
    return minority, [n for n in nodes if n not in minority]
