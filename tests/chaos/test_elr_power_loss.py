"""KIP-966 on real node processes: the last in-sync replica loses power and is not elected.

The power-loss chaos run (seed 1, default durability) lost 34,980 acknowledged records this way:
a partition's ISR shrank to one replica, that replica lost power, restarted with an empty log,
was still the whole ISR and was elected; the others truncated to it. Here, with Kafka's default
durability and eligible leader replicas on (the bootstrap level): node 1 is SIGKILLed (the ISR
goes to 3, 2), node 2 stops (the ISR is 3 alone, below min.insync.replicas 2, so 2 becomes an
eligible leader replica), then node 3 loses power with nothing fsynced. Nodes 3 and 1 come back
first: 3 lost power, so it proves nothing and leaves the ISR for the last known ELR, and 1 was
never eligible, so the partition stays offline (a real client's DescribeTopicPartitions shows
it), until node 2 returns and is elected. Node 2 stops either with a controlled shutdown (its
proof is Kafka's clean-shutdown marker) or by SIGKILL (raftlog's same-boot note: Kafka would
keep this partition offline for good).
Every acknowledged record is then at its offset, and every node's files pass the
crash-consistency check.

Three combined nodes on 127.0.0.131-133 (as root, with FUSE): the addresses of
tests/chaos/test_chaos_run.py, so the modules share an xdist group and never run at once. Every
node is stopped by its pid and the mount unmounted in a ``finally``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from kafka import KafkaAdminClient

from chaos.lazyfs import available
from chaos.power import PowerFaults, process_exited, wait_exited
from dataplane.client import AdminClient, NewTopic
from dataplane.client.admin import PartitionDescription
from dataplane.tools.check_data import check_node_dir
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port, wait_for
from raftlog.clean_shutdown import CLEAN_SHUTDOWN_FILE
from raftlog.errors import KafkaError
from tests.chaos.partition_io import produce, read_all

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.xdist_group("chaos_run"),  # tests/chaos/test_chaos_run.py: the same addresses
    pytest.mark.skipif(os.geteuid() != 0, reason="FUSE mounts need root"),
    pytest.mark.skipif(available() is not None, reason=f"no FUSE: {available()}"),
]
FIRST_HOST = 131
TOPIC = "elr"
RECORDS = 200
NO_STATE = (-2, (), (), ())


def connect(local: LocalCluster) -> AdminClient:
    """An admin client, once some broker serves (the nodes are starting)."""
    clients: list[AdminClient] = []

    def connected() -> bool:
        try:
            clients.append(AdminClient(local.bootstrap_servers, request_timeout_ms=10_000))
        except KafkaError:
            return False
        return True

    wait_for("a broker serving", connected, 90)
    return clients[0]


def registered_previous(local: LocalCluster, node_id: int) -> tuple[int, str]:
    """The previous broker epoch the node's latest registration sent and its proof (the log
    line)."""
    found = re.findall(
        r"registered at epoch \d+ \(previous broker epoch (-?\d+), proof: ([a-z ]+)\)",
        local.spec(node_id).log_path.read_text(errors="replace"),
    )
    assert found, f"node {node_id} never registered"
    epoch, proof = found[-1]
    return int(epoch), proof


@pytest.mark.parametrize("how_2_stops", ["controlled shutdown", "SIGKILL"])
def test_the_last_isr_member_losing_power_is_not_elected_and_nothing_is_lost(
    tmp_path: Path, how_2_stops: str
) -> None:
    hosts = [f"127.0.0.{FIRST_HOST + n}" for n in range(3)]
    local = LocalCluster(
        tmp_path / "cluster", nodes=3, first_host=FIRST_HOST, port=pick_cluster_port(hosts)
    )
    power = PowerFaults()
    admin: AdminClient | None = None
    try:
        three = local.spec(3)
        power.mount(3, three.directory / "data", tmp_path / "forgetful" / "node-3", 0, 0)
        local.up(timeout_s=60)
        admin = AdminClient(local.bootstrap_servers, request_timeout_ms=10_000)
        control = admin

        def partition() -> PartitionDescription:
            return control.describe_topics([TOPIC])[TOPIC].partitions[0]

        topic = NewTopic(
            TOPIC, replica_assignment={0: [3, 2, 1]}, configs={"min.insync.replicas": "2"}
        )
        assert admin.create_topics([topic]) == {TOPIC: None}
        wait_for("3 leads", lambda: partition().leader == 3, 30)
        acked = produce(local.bootstrap_servers, TOPIC, "v", RECORDS)

        local.stop_node(1, kill=True)
        wait_for("1 out of the ISR", lambda: partition().isr == (3, 2), 60)
        # SIGTERM: a controlled shutdown, the marker written; SIGKILL: nothing but the note
        # that it ran on this boot (its page cache kept every record it wrote)
        local.stop_node(2, kill=how_2_stops == "SIGKILL")
        marker = local.spec(2).directory / "data" / CLEAN_SHUTDOWN_FILE
        assert marker.exists() is (how_2_stops == "controlled shutdown")
        pid = local.pid(3)
        assert pid is not None
        local.stop_node(3, kill=True)
        wait_exited([pid])
        cut = power.cut(3, seed=1, mode="all")
        assert cut.reverted_files + cut.dropped_names > 0, "node 3's records were never fsynced"

        admin.close()
        admin = None
        local.start_node(3)
        local.start_node(1)  # a quorum (1, 3) again; both restarted uncleanly
        admin = control = connect(local)
        offline = (-1, (), (2,), (3,))

        def state() -> tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
            try:
                p = partition()
            except KafkaError:  # a broker still catching up with the metadata
                return NO_STATE
            return p.leader, p.isr, p.elr, p.last_known_elr

        wait_for(f"offline with ELR [2], last known ELR [3]: {offline}",
                 lambda: state() == offline, 90)  # fmt: skip
        assert registered_previous(local, 3) == (-1, "none"), "the power cut left no proof"
        assert registered_previous(local, 1)[1] == "same boot", "a SIGKILL loses no page"
        kp = KafkaAdminClient(bootstrap_servers=local.kafka_bootstrap_servers)
        try:
            (described,) = kp.describe_topic_partitions([TOPIC])["topics"][0]["partitions"]
        finally:
            kp.close()
        assert described["leader_id"] == -1
        assert described["eligible_leader_replicas"] == [2]
        assert described["last_known_elr"] == [3]

        local.start_node(2)
        wait_for("2 elected from the ELR", lambda: partition().leader == 2, 90)
        epoch, proof = registered_previous(local, 2)
        assert epoch >= 0
        assert proof == ("clean shutdown" if how_2_stops == "controlled shutdown" else "same boot")
        wait_for("every replica back in the ISR",
                 lambda: sorted(partition().isr) == [1, 2, 3], 120)  # fmt: skip
        assert (partition().elr, partition().last_known_elr) == ((), ())
        stored = read_all(local.bootstrap_servers, TOPIC)
        misplaced = {v: o for v, o in acked.items() if stored.get(o) != v}
        assert not misplaced, f"{len(misplaced)} acknowledged records lost or moved"

        admin.close()
        admin = None
        local.down()
        for spec in local.specs:
            report = check_node_dir(spec.directory / "data")
            assert report.ok, f"node {spec.node_id}: {report.problems}"
    finally:
        if admin is not None:
            admin.close()
        local.down()
        fuse_pids = list(power.fuse_pids.values())
        power.close()
    assert all(process_exited(pid) for pid in fuse_pids), "a FUSE process outlived its mount"
