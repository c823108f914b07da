"""A real 3-controller quorum: node processes on 127.0.0.21-23, gRPC, pysyncobj, SIGKILL."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import grpc
import pytest

from dataplane.tools.cluster_status import cluster_status_rows
from dataplane.tools.local_cluster import LocalCluster, NodeSpec
from metadata_quorum.client import ControllerClient
from metadata_quorum.codec import record_from_proto, snapshot_from_proto
from metadata_quorum.image import MetadataImage, replay
from protos import controller_pb2 as pb
from protos import metadata_pb2 as mpb
from raftlog.errors import ErrorCode
from tests.metadata_quorum.quorum_support import (
    create_topics,
    describe_node,
    make_cluster,
    register_brokers,
    topic_summary,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("quorum"), pytest.mark.timeout(240)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = make_cluster(tmp_path / "cluster", first_host=21)
    try:
        cluster.up(timeout_s=30)
        yield cluster
    finally:
        for spec in cluster.specs:
            cluster.stop_node(spec.node_id, kill=True)


def _converged(
    cluster: LocalCluster, node_ids: list[int], expected: dict[str, tuple[bytes, int]]
) -> Callable[[], bool]:
    def check() -> bool:
        for node_id in node_ids:
            described = describe_node(cluster, node_id)
            if described is None or topic_summary(described) != expected:
                return False
        return True

    return check


def test_quorum_survives_sigkill_of_active_controller_and_of_everyone(
    cluster: LocalCluster,
) -> None:
    client = cluster.client()
    try:
        register_brokers(client, [1, 2, 3])
        create_topics(client, [f"topic-{n:02d}" for n in range(50)])
        leader = cluster.wait_for_leader()
        described = describe_node(cluster, leader)
        assert described is not None
        expected = topic_summary(described)
        assert len(expected) == 50

        killed_at = time.monotonic()
        cluster.stop_node(leader, kill=True)
        create_topics(client, ["after-failover"])
        failover_s = time.monotonic() - killed_at
        print(f"controller failover: next write committed {failover_s:.2f} s after SIGKILL")
        new_leader = cluster.wait_for_leader()
        assert new_leader != leader
        after = describe_node(cluster, new_leader)
        assert after is not None
        expected = topic_summary(after)
        assert len(expected) == 51

        cluster.start_node(leader)
        survivors = [s.node_id for s in cluster.specs]
        wait_for(_converged(cluster, survivors, expected), 30, "the restarted node to catch up")

        for spec in cluster.specs:
            cluster.stop_node(spec.node_id, kill=True)
        cluster.up(timeout_s=30)
        wait_for(
            _converged(cluster, survivors, expected), 30, "every node to replay the same image"
        )
        create_topics(client, ["after-restart"])
    finally:
        client.close()


def test_followers_answer_writes_with_not_controller_and_clients_follow(
    cluster: LocalCluster,
) -> None:
    leader = cluster.wait_for_leader()
    follower = next(s for s in cluster.specs if s.node_id != leader)
    only_follower = ControllerClient([f"{follower.host}:{cluster.port}"])
    try:
        register_brokers(only_follower, [1, 2, 3])  # follows NOT_CONTROLLER to the leader
        create_topics(only_follower, ["followed"])
        described = describe_node(cluster, follower.node_id)
        assert described is not None
        wait_for(
            lambda: (
                "followed" in topic_summary(describe_node(cluster, follower.node_id) or described)
            ),
            10,
            "the follower to apply the topic",
        )
    finally:
        only_follower.close()


def _quorum_with_match_indexes(
    cluster: LocalCluster, spec: NodeSpec
) -> pb.DescribeQuorumResponse | None:
    """DescribeQuorum asked of this one node, if it names every voter's match index."""
    client = ControllerClient([f"{spec.host}:{cluster.port}"])
    try:
        quorum = client.describe_quorum(f"{spec.host}:{cluster.port}")
    except grpc.RpcError:
        return None
    finally:
        client.close()
    return quorum if all(v.match_index >= 0 for v in quorum.voters) else None


def _status_rows_with_figures(cluster: LocalCluster) -> list[dict[str, object]] | None:
    rows = cluster_status_rows(cluster)
    figures = all(isinstance(r["match"], int) and isinstance(r["lag"], int) for r in rows)
    return rows if figures else None


def test_every_controller_describes_each_voters_match_index_and_lag(
    cluster: LocalCluster,
) -> None:
    """Only the active controller knows how far each voter's log matches its own. A standby
    forwards DescribeQuorum there, so ``raftlog cluster status`` shows every voter's match
    index and lag whichever node it asks (it showed "-" when it asked a standby)."""
    client = cluster.client()
    stop = threading.Event()

    def keep_writing() -> None:
        for n in range(10_000):
            if stop.is_set():
                return
            create_topics(client, [f"busy-{n:05d}"], partitions=1)

    try:
        register_brokers(client, [1, 2, 3])
        writer = threading.Thread(target=keep_writing, name="busy-quorum")
        writer.start()
        try:  # while the quorum commits topic after topic
            busy = wait_for(lambda: _status_rows_with_figures(cluster), 20, "status figures")
            assert [r["role"] for r in busy].count("active controller") == 1
            assert all(int(str(r["lag"])) >= 0 for r in busy)
        finally:
            stop.set()
            writer.join(timeout=30)
        assert not writer.is_alive()
    finally:
        client.close()

    leader = cluster.wait_for_leader()
    for spec in cluster.specs:  # an idle quorum, asked of each node: the leader's figures
        quorum = wait_for(
            partial(_quorum_with_match_indexes, cluster, spec),
            20,
            f"node {spec.node_id} to describe every voter's match index",
        )
        assert quorum.leader_id == leader and quorum.has_quorum
        voters = {v.node_id: v for v in quorum.voters}
        assert sorted(voters) == [1, 2, 3]
        last_index = voters[leader].match_index
        assert voters[leader].lag == 0 and last_index >= quorum.commit_index > 0
        for voter in voters.values():
            assert 0 <= voter.match_index <= last_index
            assert voter.lag == last_index - voter.match_index

    rows = wait_for(lambda: _status_rows_with_figures(cluster), 20, "status figures")
    assert {r["node"]: r["role"] for r in rows}[leader] == "active controller"


def test_fetch_metadata_streams_records_that_rebuild_the_image(cluster: LocalCluster) -> None:
    client = cluster.client()
    try:
        register_brokers(client, [1, 2, 3])
        create_topics(client, ["fetched-a", "fetched-b"])
        leader = cluster.wait_for_leader()
        spec = cluster.spec(leader)
        stream = client.stub(f"{spec.host}:{cluster.port}").FetchMetadata(
            pb.FetchMetadataRequest(from_offset=0, max_wait_ms=300), timeout=10
        )
        image = MetadataImage()
        for update in stream:
            if update.HasField("snapshot"):
                image = snapshot_from_proto(update.snapshot)
            for item in update.records:
                assert item.offset == image.offset + 1, "deltas arrive in offset order, no gaps"
                image = replay(image, record_from_proto(item.record))
        described = describe_node(cluster, leader)
        assert described is not None
        assert image.offset >= described.metadata_offset
        assert {
            name: (image.topics[tid].topic_id.bytes, len(image.topics[tid].partitions))
            for name, tid in image.topic_ids.items()
        } == topic_summary(described)
        assert sorted(image.brokers) == [1, 2, 3]
        assert all(not b.fenced for b in image.brokers.values())
    finally:
        client.close()


def _sessions_of(tmp_path: Path, session_timeout_ms: int) -> Iterator[LocalCluster]:
    cluster = make_cluster(
        tmp_path / "cluster",
        first_host=24,
        overrides={"broker.session.timeout.ms": session_timeout_ms},
    )
    try:
        cluster.up(timeout_s=30)
        yield cluster
    finally:
        for spec in cluster.specs:
            cluster.stop_node(spec.node_id, kill=True)


@pytest.fixture
def short_sessions(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from _sessions_of(tmp_path, 1500)


def test_a_silent_broker_is_fenced_and_loses_leadership_and_isr(
    short_sessions: LocalCluster,
) -> None:
    cluster = short_sessions
    client = cluster.client()
    stop = threading.Event()
    beater: threading.Thread | None = None
    try:
        epochs = register_brokers(client, [1, 2, 3])

        def heartbeat_1_and_2() -> None:
            while not stop.wait(0.3):
                for broker_id in (1, 2):
                    client.call(
                        "BrokerHeartbeat",
                        pb.BrokerHeartbeatRequest(
                            broker_id=broker_id,
                            broker_epoch=epochs[broker_id],
                            current_metadata_offset=2**62,
                        ),
                    )

        beater = threading.Thread(target=heartbeat_1_and_2, daemon=True)
        beater.start()
        create_topics(client, ["liveness"], partitions=6)

        def fenced_and_moved() -> bool:
            cluster_view = client.call("DescribeCluster", pb.DescribeClusterRequest())
            fenced = {b.broker_id for b in cluster_view.brokers if b.fenced}
            topics = client.call("DescribeTopics", pb.DescribeTopicsRequest(names=["liveness"]))
            partitions = topics.topics[0].partitions
            return fenced == {3} and all(p.leader in (1, 2) and 3 not in p.isr for p in partitions)

        wait_for(fenced_and_moved, 20, "broker 3 to be fenced and dropped from every ISR")
        topics = client.call("DescribeTopics", pb.DescribeTopicsRequest(names=["liveness"]))
        moved = [p for p in topics.topics[0].partitions if p.replicas[0] == 3]
        assert moved and all(p.leader_epoch >= 1 for p in moved)
    finally:
        stop.set()
        if beater is not None:
            beater.join(timeout=10)
        client.close()


@pytest.fixture
def six_second_sessions(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from _sessions_of(tmp_path, 6000)


def test_a_broker_dead_before_a_controller_election_is_fenced_when_its_session_ends(
    six_second_sessions: LocalCluster,
) -> None:
    """Brokers tell the standby controllers of their heartbeats too (as a broker does with
    ``tell_standbys``), so the controller elected after the active one dies fences broker 3,
    silent since t0, at about t0 + 6 s: not a whole session after its own election (≥ t0 + 10 s
    here, Kafka's grace), and without fencing the brokers that kept beating."""
    cluster = six_second_sessions
    client = cluster.client()
    stop = threading.Event()
    beating = {1, 2, 3}
    told: dict[int, int] = {}  # broker -> rounds in which both standbys heard it
    beater: threading.Thread | None = None
    try:
        epochs = register_brokers(client, [1, 2, 3])

        def heartbeat() -> None:
            while not stop.wait(0.25):
                for broker_id in sorted(beating):
                    request = pb.BrokerHeartbeatRequest(
                        broker_id=broker_id,
                        broker_epoch=epochs[broker_id],
                        current_metadata_offset=2**62,
                    )
                    client.call("BrokerHeartbeat", request)
                    if len(client.tell_standbys("BrokerHeartbeat", request, timeout_s=0.2)) == 2:
                        told[broker_id] = told.get(broker_id, 0) + 1

        beater = threading.Thread(target=heartbeat, daemon=True)
        beater.start()
        wait_for(lambda: told.get(3, 0) >= 3, 10, "both standbys hearing broker 3")
        beating.discard(3)
        silent_since = time.monotonic()
        wait_for(lambda: time.monotonic() - silent_since > 4.0, 10, "4 s of broker 3's silence")
        cluster.stop_node(cluster.wait_for_leader(10), kill=True)

        def fenced() -> set[int]:
            view = client.call("DescribeCluster", pb.DescribeClusterRequest())
            return {b.broker_id for b in view.brokers if b.fenced}

        wait_for(lambda: 3 in fenced(), 20, "broker 3 fenced by the new controller")
        fenced_after_s = time.monotonic() - silent_since
        assert fenced_after_s < 9.0, f"fenced {fenced_after_s:.1f} s after its last heartbeat"
        assert fenced() == {3}, "the brokers that kept beating stay unfenced"
    finally:
        stop.set()
        if beater is not None:
            beater.join(timeout=10)
        client.close()


def test_admin_rpcs_end_to_end(cluster: LocalCluster) -> None:
    """Configs, partitions, deletion, elections, producer ids and the quorum view over gRPC."""
    client = cluster.client()
    try:
        epochs = register_brokers(client, [1, 2, 3])
        create_topics(client, ["admin"], partitions=2)
        topic = pb.ConfigResource(resource_type=mpb.CONFIG_RESOURCE_TOPIC, resource_name="admin")

        bad = client.checked(
            "AlterConfigs",
            pb.AlterConfigsRequest(
                resources=[
                    pb.AlterConfigsResource(
                        resource=topic,
                        configs=[pb.AlterableConfig(name="retention.ms", value="-7")],
                    )
                ]
            ),
        )
        assert bad.resources[0].error_code == ErrorCode.INVALID_CONFIG.code
        assert "retention.ms" in bad.resources[0].error_message
        good = client.checked(
            "AlterConfigs",
            pb.AlterConfigsRequest(
                resources=[
                    pb.AlterConfigsResource(
                        resource=topic,
                        configs=[pb.AlterableConfig(name="min.insync.replicas", value="2")],
                    )
                ]
            ),
        )
        assert good.resources[0].error_code == 0
        described = client.checked(
            "DescribeConfigs", pb.DescribeConfigsRequest(resources=[topic])
        ).resources[0]
        entries = {e.name: (e.value, e.is_default) for e in described.entries}
        assert entries["min.insync.replicas"] == ("2", False)
        assert entries["retention.ms"] == (str(7 * 24 * 3600 * 1000), True)

        grown = client.checked(
            "CreatePartitions",
            pb.CreatePartitionsRequest(
                topics=[
                    pb.CreatePartitionsTopic(name="admin", count=4),
                    pb.CreatePartitionsTopic(name="admin-missing", count=4),
                ]
            ),
        )
        assert [t.error_code for t in grown.topics] == [
            0,
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code,
        ]
        shrink = client.checked(
            "CreatePartitions",
            pb.CreatePartitionsRequest(topics=[pb.CreatePartitionsTopic(name="admin", count=1)]),
        )
        assert shrink.topics[0].error_code == ErrorCode.INVALID_PARTITIONS.code

        elected = client.checked("ElectLeaders", pb.ElectLeadersRequest())
        assert {p.error_code for p in elected.partitions} == {ErrorCode.ELECTION_NOT_NEEDED.code}

        first = client.checked(
            "AllocateProducerIds",
            pb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=epochs[1]),
        )
        second = client.checked(
            "AllocateProducerIds",
            pb.AllocateProducerIdsRequest(broker_id=2, broker_epoch=epochs[2]),
        )
        assert second.producer_id_start == first.producer_id_start + first.producer_id_len
        stale = client.call(
            "AllocateProducerIds", pb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=-5)
        )
        assert stale.status.error_code == ErrorCode.STALE_BROKER_EPOCH.code

        deleted = client.checked("DeleteTopics", pb.DeleteTopicsRequest(names=["admin"]))
        assert deleted.topics[0].error_code == 0
        gone = client.checked("DescribeTopics", pb.DescribeTopicsRequest(names=["admin"]))
        assert gone.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code

        def described() -> pb.DescribeQuorumResponse | None:
            """The leader's view once it knows every voter's match index (a leader elected
            meanwhile learns them from its first round of appends)."""
            leader = cluster.spec(cluster.wait_for_leader())
            quorum = client.describe_quorum(f"{leader.host}:{cluster.port}")  # match indexes
            if quorum.leader_id != leader.node_id or not all(v.lag >= 0 for v in quorum.voters):
                return None
            return quorum

        quorum = wait_for(described, 30, "every voter's lag on the leader")
        assert quorum.has_quorum and len(quorum.voters) == 3
    finally:
        client.close()
