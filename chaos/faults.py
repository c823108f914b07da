"""Faults on real node processes: SIGKILL and restart, SIGSTOP/SIGCONT, iptables partitions,
a full disk (chaos/disk.py), a power cut of one node or of all (chaos/power.py), a partition
reassignment started under the other faults, and a change of the controller quorum's voters
(chaos/membership.py).

`FaultInjector` owns every fault it starts until it is healed. Leaving its context — normally,
on an exception, on Ctrl-C — resumes every paused process, removes every iptables rule (its
`NetworkFaults` chain), frees every filled disk and restarts nothing: what was killed stays
down, the runner stops the cluster by pid. A fault is injected and healed by the same object, so
the record of what is in place is never split between two owners.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, Self

from chaos.disk import DiskFaults
from chaos.history import PowerCut
from chaos.network import NetworkFaults, NodeIdentity
from chaos.power import PowerFaults, wait_exited
from chaos.schedule import PlannedFault, split_sides

log = logging.getLogger(__name__)


# A reassign fault: move the planned fault's partition; a membership fault: add or remove a
# voter. Both through the cluster's admin API; (nodes involved, description, heal).
Mover = Callable[[PlannedFault], tuple[list[int], str, Callable[[], None]]]


class NodeProcesses(Protocol):
    """What the injector needs from a cluster: a node's pid, and a way to start it again."""

    def pid(self, node_id: int) -> int | None: ...

    def start(self, node_id: int) -> None: ...


@dataclass
class ActiveFault:
    """A fault in place: what to undo and what it hit."""

    planned: PlannedFault
    nodes: list[int]
    detail: str
    heal: Callable[[], None]
    cuts: list[PowerCut] = field(default_factory=list)  # a power-loss fault's, per node


class FaultInjector:
    """Injects and heals faults on `processes`, cutting the network through `network` and
    filling disks through `disks` (when the run's nodes have their own) and cutting their power
    through `power` (when their data is on forgetful filesystems)."""

    def __init__(
        self,
        processes: NodeProcesses,
        identities: dict[int, NodeIdentity],
        network: NetworkFaults,
        disks: DiskFaults | None = None,
        power: PowerFaults | None = None,
    ) -> None:
        self._processes = processes
        self._identities = identities
        self._network = network
        self._disks = disks
        self._power = power
        self._paused: dict[int, int] = {}  # node id -> pid stopped with SIGSTOP
        self._lock = threading.Lock()

    @property
    def node_ids(self) -> list[int]:
        return sorted(self._identities)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    # -- the fault kinds ------------------------------------------------------------------------
    def kill(self, node_id: int) -> Callable[[], None]:
        """SIGKILL the node; healing starts it again."""
        pid = self._processes.pid(node_id)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        return lambda: self._processes.start(node_id)

    def pause(self, node_id: int) -> Callable[[], None]:
        """SIGSTOP the node; healing sends SIGCONT."""
        pid = self._processes.pid(node_id)
        if pid is None:
            return lambda: None
        with self._lock:
            self._paused[node_id] = pid
        os.kill(pid, signal.SIGSTOP)
        return lambda: self._resume(node_id)

    def _resume(self, node_id: int) -> None:
        with self._lock:
            pid = self._paused.pop(node_id, None)
        if pid is not None:
            _signal_if_alive(pid, signal.SIGCONT)

    def partition(self, fault: PlannedFault) -> tuple[list[int], str]:
        """Cut the network as `fault.shape` says; (nodes hit, description). Heal with `heal`."""
        nodes = self.node_ids
        node = nodes[fault.node % len(nodes)]
        identity = self._identities
        if fault.shape == "one-way":
            peer = nodes[fault.peer % len(nodes)]
            self._network.cut_one_way(identity[node], identity[peer])
            return [node, peer], f"one-way {node} -> {peer}"
        if fault.shape == "split":
            minority, majority = split_sides(nodes, fault)
            for a in minority:
                for b in majority:
                    self._network.cut(identity[a], identity[b])
            return minority, f"split {minority} | {majority}"
        self._network.isolate(identity[node], [identity[n] for n in nodes if n != node])
        return [node], f"isolate {node}"

    def fill_disk(self, node_id: int) -> Callable[[], None]:
        """Fill the node's disk; healing frees it and starts the node again if it halted (a
        broker whose only log directory fails halts, as Kafka's does)."""
        if self._disks is None:
            raise ValueError("disk-full needs the run's nodes on their own disks (DiskFaults)")
        free = self._disks.fill(node_id)

        def heal() -> None:
            free()
            self._processes.start(node_id)  # a no-op for a node that is still running

        return heal

    def cut_power(self, node_ids: list[int], fault: PlannedFault) -> tuple[list[PowerCut], str]:
        """SIGKILL the nodes by pid, wait until every one is gone, then cut the power of each
        one's disk (`fault.cut_mode`; a torn cut tears with `fault.cut_seed` plus the node id);
        (what each cut dropped, description). Heal by starting the nodes again."""
        if self._power is None:
            raise ValueError("power-loss needs the run's nodes on forgetful filesystems")
        pids = [pid for node_id in node_ids if (pid := self._processes.pid(node_id)) is not None]
        for pid in pids:
            _signal_if_alive(pid, signal.SIGKILL)
        wait_exited(pids)
        cuts = [
            self._power.cut(node_id, fault.cut_seed + node_id, fault.cut_mode)
            for node_id in node_ids
        ]
        dropped = ", ".join(
            f"{c.node_id}: {c.dropped_names} names dropped, {c.reverted_files} files reverted"
            + (f", {len(c.torn)} torn" if c.torn else "")
            for c in cuts
        )
        return cuts, f"power cut ({fault.cut_mode}) {node_ids}: {dropped}"

    def _start_all(self, node_ids: list[int]) -> None:
        for node_id in node_ids:
            self._processes.start(node_id)

    def heal_network(self) -> None:
        self._network.heal()

    # -- one planned fault ----------------------------------------------------------------------
    def inject(
        self,
        fault: PlannedFault,
        *,
        controller: Callable[[], int],
        leader: Callable[[int], int],
        mover: Mover | None = None,
        voters: Mover | None = None,
        victim: Callable[[PlannedFault], int] | None = None,
        transformers: Mover | None = None,
    ) -> ActiveFault:
        """Put `fault` in place. `controller()` names the active controller, `leader(p)` the
        leader of workload partition p (-1: none; the fault then hits nobody); `mover` starts a
        reassign fault's move (through the cluster's admin API) and returns how to move back;
        `voters` adds or removes a controller (chaos/membership.py) and returns how to restore
        the voters. With the transactions workload (chaos/transactions.py), `victim` names the
        node a txn-coordinator-kill or output-leader-kill kills (-1: none) and `transformers`
        kills a transformer process and returns how to start it again."""
        nodes = self.node_ids
        kind = fault.kind
        if kind in ("reassign", "membership", "transformer-kill"):
            change = {"reassign": mover, "membership": voters}.get(kind, transformers)
            if change is None:
                raise ValueError(f"a {kind} fault needs the cluster's admin API to act through")
            hit, detail, heal = change(fault)
            return ActiveFault(fault, hit, detail, heal)
        if kind == "partition":
            hit, detail = self.partition(fault)
            return ActiveFault(fault, hit, detail, self.heal_network)
        if kind == "pause":
            node = nodes[fault.node % len(nodes)]
            return ActiveFault(fault, [node], f"SIGSTOP {node}", self.pause(node))
        if kind == "disk-full":
            node = nodes[fault.node % len(nodes)]
            return ActiveFault(fault, [node], f"fill the disk of {node}", self.fill_disk(node))
        if kind in ("power-loss", "power-loss-all"):
            hit = nodes if kind == "power-loss-all" else [nodes[fault.node % len(nodes)]]
            cuts, detail = self.cut_power(hit, fault)
            return ActiveFault(fault, hit, detail, lambda: self._start_all(hit), cuts)
        if kind == "kill":
            node = nodes[fault.node % len(nodes)]
        elif kind == "controller-kill":
            node = controller()
        elif kind in ("txn-coordinator-kill", "output-leader-kill"):
            if victim is None:
                raise ValueError(f"a {kind} fault needs the transactions workload")
            node = victim(fault)
        else:
            node = leader(fault.partition)
        if node < 0:
            return ActiveFault(fault, [], f"{kind}: nobody to kill", lambda: None)
        whose = {
            "leader-kill": f" (leader of partition {fault.partition})",
            "output-leader-kill": f" (leader of output partition {fault.partition})",
            "txn-coordinator-kill": " (a transformer's transaction coordinator)",
        }
        detail = f"SIGKILL {node}" + whose.get(kind, "")
        return ActiveFault(fault, [node], detail, self.kill(node))

    def release(self) -> None:
        """Resume every paused process and remove every cut; safe to call more than once."""
        with self._lock:
            paused = list(self._paused.values())
            self._paused.clear()
        for pid in paused:
            _signal_if_alive(pid, signal.SIGCONT)
        self._network.heal()
        if self._disks is not None:
            self._disks.free_all()


def _signal_if_alive(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        log.info("pid %d is gone; nothing to signal", pid)
