"""The fault injector undoes everything it did, also when the run is interrupted.

Real processes (``sleep``, run as node users raftlog-n134 and raftlog-n135 on 127.0.0.134-135,
the addresses reserved for this module), real signals, real iptables rules. Every process the
test starts is killed by its pid in a ``finally``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaos.faults import FaultInjector
from chaos.history import TXN_FAULT_KINDS
from chaos.network import NetworkFaults, NodeIdentity, ensure_node_identity, node_user_name, spawn
from chaos.schedule import PlannedFault
from dataplane.tools.local_cluster import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="iptables and node users need root"),
]
HOSTS = (134, 135)
REPO = Path(__file__).resolve().parents[2]


def process_state(pid: int) -> str:
    """The one-letter state of /proc/<pid>/stat: R, S, T (stopped), Z..."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def chain_exists(chain: str) -> bool:
    listing = subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True)
    return chain in listing.stdout


class SleepingNodes:
    """Two node processes (``sleep``) standing in for nodes: the injector needs pids."""

    def __init__(self) -> None:
        self.identities = {
            i: ensure_node_identity(node_user_name(host), [f"127.0.0.{host}"])
            for i, host in enumerate(HOSTS, start=1)
        }
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        for node_id in self.identities:
            self.start(node_id)

    def pid(self, node_id: int) -> int | None:
        proc = self.procs.get(node_id)
        return None if proc is None or proc.poll() is not None else proc.pid

    def start(self, node_id: int) -> None:
        self.procs[node_id] = spawn(self.identities[node_id], ["sleep", "600"])

    def kill_all(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def nodes() -> Iterator[SleepingNodes]:
    started = SleepingNodes()
    try:
        yield started
    finally:
        started.kill_all()


def identities_of(nodes: SleepingNodes) -> list[NodeIdentity]:
    return list(nodes.identities.values())


def test_an_interrupted_run_resumes_paused_nodes_and_removes_every_rule(
    nodes: SleepingNodes,
) -> None:
    pid_1 = nodes.pid(1)
    assert pid_1 is not None
    # Ctrl-C as a terminal delivers it: a test run started in the background inherits SIGINT
    # ignored, and Python then leaves it so (the interrupt never came in such a CI run).
    interactive = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupted_run(nodes, pid_1)
    finally:
        signal.signal(signal.SIGINT, interactive)


def interrupted_run(nodes: SleepingNodes, pid_1: int) -> None:
    with (
        pytest.raises(KeyboardInterrupt),
        NetworkFaults(identities_of(nodes)) as network,
        FaultInjector(nodes, nodes.identities, network) as injector,
    ):
        chain = network.chain
        injector.pause(1)
        injector.partition(PlannedFault(id=1, kind="partition", at_s=0, length_s=1))
        assert process_state(pid_1) == "T"
        assert network.cuts(), "the partition is in place"
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: KeyboardInterrupt in this thread
        wait_for("the interrupt", lambda: False, 5)  # interrupted long before this fails
    assert process_state(pid_1) != "T", "the paused node was resumed"
    assert not chain_exists(chain), "every rule of the run was removed"


def test_kill_heals_by_starting_the_node_again(nodes: SleepingNodes) -> None:
    old = nodes.pid(2)
    with (
        NetworkFaults(identities_of(nodes)) as network,
        FaultInjector(nodes, nodes.identities, network) as injector,
    ):
        fault = PlannedFault(id=1, kind="kill", at_s=0, length_s=1, node=1)
        active = injector.inject(fault, controller=lambda: -1, leader=lambda p: -1)
        assert active.nodes == [2]
        wait_for("node 2 to die", lambda: nodes.pid(2) is None, 10)
        active.heal()
        new = nodes.pid(2)
        assert new is not None and new != old


def test_a_fault_aimed_at_nobody_does_nothing(nodes: SleepingNodes) -> None:
    with (
        NetworkFaults(identities_of(nodes)) as network,
        FaultInjector(nodes, nodes.identities, network) as injector,
    ):
        fault = PlannedFault(id=1, kind="controller-kill", at_s=0, length_s=1)
        active = injector.inject(fault, controller=lambda: -1, leader=lambda p: -1)
        assert active.nodes == []
        assert all(nodes.pid(n) is not None for n in (1, 2))


def test_a_membership_fault_acts_through_the_voter_changes_it_is_given(
    nodes: SleepingNodes,
) -> None:
    healed: list[int] = []

    def voters(fault: PlannedFault) -> tuple[list[int], str, Callable[[], None]]:
        return [4], f"add controller 4 ({fault.change})", lambda: healed.append(fault.id)

    with (
        NetworkFaults(identities_of(nodes)) as network,
        FaultInjector(nodes, nodes.identities, network) as injector,
    ):
        fault = PlannedFault(id=3, kind="membership", at_s=0, length_s=1, change="add")
        with pytest.raises(ValueError, match="membership"):
            injector.inject(fault, controller=lambda: -1, leader=lambda p: -1)
        active = injector.inject(fault, controller=lambda: -1, leader=lambda p: -1, voters=voters)
        assert (active.nodes, active.detail) == ([4], "add controller 4 (add)")
        active.heal()
        assert healed == [3]
        assert all(nodes.pid(n) is not None for n in (1, 2)), "no node was touched"


def test_transaction_faults_kill_the_victim_they_are_given(nodes: SleepingNodes) -> None:
    """txn-coordinator-kill and output-leader-kill SIGKILL the node the transactions workload
    names (chaos/transactions.py) and start it again; transformer-kill acts through the
    workload; without the workload's hooks they are refused."""
    old = nodes.pid(1)
    healed: list[int] = []

    def transformers(fault: PlannedFault) -> tuple[list[int], str, Callable[[], None]]:
        return [], f"SIGKILL transformer {fault.node}", lambda: healed.append(fault.id)

    with (
        NetworkFaults(identities_of(nodes)) as network,
        FaultInjector(nodes, nodes.identities, network) as injector,
    ):
        for kind in TXN_FAULT_KINDS:
            refused = PlannedFault(id=1, kind=kind, at_s=0, length_s=1)
            with pytest.raises(ValueError, match=kind):
                injector.inject(refused, controller=lambda: -1, leader=lambda p: -1)
        fault = PlannedFault(id=2, kind="output-leader-kill", at_s=0, length_s=1, partition=4)
        active = injector.inject(
            fault, controller=lambda: -1, leader=lambda p: -1, victim=lambda f: 1
        )
        assert (active.nodes, active.detail) == ([1], "SIGKILL 1 (leader of output partition 4)")
        wait_for("node 1 to die", lambda: nodes.pid(1) is None, 10)
        active.heal()
        assert nodes.pid(1) not in (None, old)
        nobody = PlannedFault(id=3, kind="txn-coordinator-kill", at_s=0, length_s=1)
        missed = injector.inject(
            nobody, controller=lambda: -1, leader=lambda p: -1, victim=lambda f: -1
        )
        assert missed.nodes == [] and "nobody" in missed.detail
        killed = PlannedFault(id=4, kind="transformer-kill", at_s=0, length_s=1, node=1)
        active = injector.inject(
            killed, controller=lambda: -1, leader=lambda p: -1, transformers=transformers
        )
        assert (active.nodes, active.detail) == ([], "SIGKILL transformer 1")
        active.heal()
        assert healed == [4]


def test_a_run_started_in_the_background_still_unwinds_on_sigint() -> None:
    """A background job inherits SIGINT ignored; `raftlog chaos run` takes it back, so the
    SIGINT a harness interrupts its run with unwinds it (rules removed, nodes stopped)."""
    probe = (
        "import sys, time\n"
        "from chaos.cli import _interrupt_on_signals\n"
        "_interrupt_on_signals()\n"
        "try:\n"  # ready only once inside: the SIGINT may come as soon as it is read
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
        "except KeyboardInterrupt:\n"
        "    print('unwound', flush=True)\n"
    )
    # SIGINT ignored, then exec: what a shell's `&` hands a background job
    argv = ["sh", "-c", 'trap "" INT; exec "$0" -c "$1"', sys.executable, probe]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert out == "unwound\n"
    finally:
        proc.kill()
        proc.wait(timeout=10)
