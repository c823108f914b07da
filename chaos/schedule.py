"""The fault schedule of a chaos run, drawn from its seed: the same seed, the same schedule.

Faults come one at a time, so each one's effect (and the recovery after it) can be told apart:
a warm-up without faults, then for each fault a quiet gap and the fault itself (injected at
`at_s`, healed `length_s` later), until the next one would not end before the cool-down that
lets the cluster settle before the workloads stop. The kinds go round in a shuffled order, so a
run long enough for as many faults as kinds injects every kind at least once.

What a planned fault hits is fixed here as positions, not node ids picked at run time: `node`
is an index into the run's nodes (kill, pause, partition, disk-full), `peer` the second node of
a one-way cut, `partition` the workload partition whose leader a leader-kill kills (or that a
reassign moves). Only a controller-kill's victim is whoever is the active controller when it
fires, and a reassign's target depends on the partition's replicas then (`reassign_target`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from chaos.history import FaultKind

PartitionShape = Literal["isolate", "split", "one-way"]

# (shortest, longest) seconds a fault of each kind lasts before it is healed.
LENGTH_S: dict[FaultKind, tuple[float, float]] = {
    "kill": (3.0, 8.0),
    "pause": (2.0, 6.0),
    "partition": (4.0, 10.0),
    "controller-kill": (3.0, 6.0),
    "leader-kill": (3.0, 6.0),
    "disk-full": (3.0, 8.0),
    "reassign": (4.0, 8.0),
}
GAP_S = (3.0, 6.0)  # quiet time before each fault


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
    """The faults of a run, in time order."""
    if not kinds:
        return []
    if nodes < 2 and any(k != "leader-kill" for k in kinds):
        raise ValueError("faults between nodes need at least 2 nodes")
    rng = random.Random(seed)
    warm_up, cool_down = phases(duration_s)
    order = list(dict.fromkeys(kinds))
    rng.shuffle(order)
    faults: list[PlannedFault] = []
    now = warm_up
    while True:
        kind = order[len(faults) % len(order)]
        at = round(now + (rng.uniform(*GAP_S) if faults else 0.0), 3)
        length = round(rng.uniform(*LENGTH_S[kind]), 3)
        if at + length > duration_s - cool_down:
            return faults
        node, peer = rng.sample(range(nodes), 2) if nodes >= 2 else (0, 0)
        shape: PartitionShape = rng.choice(["isolate", "split", "one-way"])
        if shape == "split" and nodes < 4:
            shape = "isolate"  # with 3 nodes the minority side is one node
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
            )
        )
        now = at + length


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
