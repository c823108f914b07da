"""The power-loss fault on real node processes (chaos/power.py, chaos/faults.py): a partition's
leader loses power with Kafka's default durability (its unsynced tail is dropped from its forgetful
filesystem, torn), starts again, and the cluster keeps every acknowledged record where it was
acknowledged: a minority losing power loses nothing, as the other replicas hold the records.
After the cluster stops, each node's files pass the crash-consistency check, and every mount is
gone with its FUSE process. A mount whose FUSE process was killed is unmounted by the sweep
(``raftlog chaos sweep``).

Three combined nodes on 127.0.0.131-133 (as root): the addresses of tests/chaos/test_chaos_run.py,
so the modules share an xdist group and never run at once. Every node is stopped by its pid and
every mount unmounted in a ``finally``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from chaos.faults import FaultInjector
from chaos.lazyfs import ForgetfulFS, available
from chaos.network import NetworkFaults, ensure_node_identity, node_user_name
from chaos.power import PowerFaults, process_exited, sweep_mounts
from chaos.schedule import PlannedFault
from dataplane.client import AdminClient, NewTopic
from dataplane.tools.check_data import check_node_dir
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port, wait_for
from tests.chaos.partition_io import produce, read_all

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.xdist_group("chaos_run"),  # tests/chaos/test_chaos_run.py: the same addresses
    pytest.mark.skipif(os.geteuid() != 0, reason="iptables and FUSE mounts need root"),
    pytest.mark.skipif(available() is not None, reason=f"no FUSE: {available()}"),
]
FIRST_HOST = 131
TOPIC = "power"
RECORDS = 100


class _Nodes:
    """The injector's view of a LocalCluster: a node's pid, and a way to start it again."""

    def __init__(self, local: LocalCluster) -> None:
        self.local = local

    def pid(self, node_id: int) -> int | None:
        return self.local.pid(node_id)

    def start(self, node_id: int) -> None:
        self.local.start_node(node_id)


def test_a_leader_that_loses_power_comes_back_and_nothing_acknowledged_is_lost(
    tmp_path: Path,
) -> None:
    hosts = [f"127.0.0.{FIRST_HOST + n}" for n in range(3)]
    local = LocalCluster(
        tmp_path / "cluster", nodes=3, first_host=FIRST_HOST, port=pick_cluster_port(hosts)
    )
    identities = {
        n: ensure_node_identity(node_user_name(FIRST_HOST + n - 1), [hosts[n - 1]])
        for n in (1, 2, 3)
    }
    power = PowerFaults()
    admin: AdminClient | None = None
    fuse_pids: set[int] = set()
    try:
        for spec in local.specs:
            backing = tmp_path / "forgetful" / f"node-{spec.node_id}"
            power.mount(spec.node_id, spec.directory / "data", backing, 0, 0)
        fuse_pids |= set(power.fuse_pids.values())
        local.up(timeout_s=60)
        bootstrap = local.bootstrap_servers
        admin = AdminClient(bootstrap, request_timeout_ms=10_000)
        topic = NewTopic(TOPIC, 1, 3, configs={"min.insync.replicas": "2"})
        assert admin.create_topics([topic]) == {TOPIC: None}
        acked = produce(bootstrap, TOPIC, "before", RECORDS)
        leader = admin.describe_topics([TOPIC])[TOPIC].partitions[0].leader

        fault = PlannedFault(
            id=1, kind="power-loss", at_s=0, length_s=3, node=leader - 1, cut_mode="torn",
            cut_seed=5,
        )  # fmt: skip
        with NetworkFaults(list(identities.values())) as network:
            injector = FaultInjector(_Nodes(local), identities, network, power=power)
            active = injector.inject(fault, controller=lambda: -1, leader=lambda _: leader)
            assert active.nodes == [leader]
            (cut,) = active.cuts
            assert (cut.node_id, cut.mode) == (leader, "torn")
            assert cut.reverted_files + cut.dropped_names > 0, "the unsynced tail was dropped"
            assert local.pid(leader) is None, "down until the heal"
            fuse_pids |= set(power.fuse_pids.values())  # the cut mounted it again
            active.heal()

        def isr_complete() -> bool:
            return len(admin.describe_topics([TOPIC])[TOPIC].partitions[0].isr) == 3

        wait_for("the node that lost power back in the ISR", isr_complete, 90)
        acked |= produce(bootstrap, TOPIC, "after", 20)
        stored = read_all(bootstrap, TOPIC)
        misplaced = {v: o for v, o in acked.items() if stored.get(o) != v}
        assert not misplaced, f"{len(misplaced)} acknowledged records lost or moved"
        assert len(stored) == len(set(stored.values())), "a record stored twice"

        local.down()
        for spec in local.specs:
            report = check_node_dir(spec.directory / "data")
            assert report.ok, f"node {spec.node_id}: {report.problems}"
    finally:
        if admin is not None:
            admin.close()
        local.down()
        power.close()
    mounts = Path("/proc/self/mounts").read_text()
    assert str(tmp_path) not in mounts, "a forgetful filesystem is still mounted"
    assert all(process_exited(pid) for pid in fuse_pids), "a FUSE process outlived its mount"


def test_sweep_unmounts_a_forgetful_filesystem_whose_process_was_killed(tmp_path: Path) -> None:
    fs = ForgetfulFS(tmp_path / "backing", tmp_path / "mount")
    fs.mount()
    try:
        assert fs.pid is not None
        os.kill(fs.pid, signal.SIGKILL)  # the harness and its FUSE process killed together
        wait_for("the FUSE process gone", lambda: process_exited(fs.pid or 0), 30)
        assert str(tmp_path / "mount") in Path("/proc/self/mounts").read_text()
        assert tmp_path / "mount" in sweep_mounts()
        assert str(tmp_path / "mount") not in Path("/proc/self/mounts").read_text()
    finally:
        fs.unmount()
