"""FetchStream against a real cluster (docs/api.md "Streaming Fetch"): node 1 is the controller
and a broker, node 2 a broker that leads the topic's one partition (replicas [2, 1]).

The client's FetchStream, read_committed, receives every committed record once and in order
and none of an aborted transaction's; a SIGKILL of the leader ends the raw stream UNAVAILABLE
(the connection is gone) and the FetchStream follows the leadership to node 1 and goes on from
the next offset, nothing twice, nothing skipped."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from dataplane.client import AdminClient, FetchStream, NewTopic, Producer, TopicPartition
from dataplane.tools.local_cluster import LocalCluster, wait_for
from protos import broker_pb2 as pb
from protos.wire import fetch_stream_method
from tests.dataplane.cluster_support import metadata, running_cluster

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("grpc-stream")]
TOPIC = "streamed"
TP = TopicPartition(TOPIC, 0)
OVERRIDES: dict[str, str | int] = {
    "transaction.state.log.num.partitions": 1,
    "transaction.state.log.replication.factor": 2,
    "transaction.state.log.min.isr": 1,
    "offsets.topic.replication.factor": 2,
}
SETTINGS: dict[str, Any] = {"request_timeout_ms": 10_000, "max_block_ms": 60_000}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path_factory.mktemp("grpc-stream"), "grpc_stream", OVERRIDES, nodes=2, controllers=1
    ) as running:
        running.wait_for_brokers()
        admin = AdminClient(running.bootstrap_servers)
        try:
            errors = admin.create_topics([NewTopic(TOPIC, 1, replica_assignment={0: [2, 1]})])
            assert errors[TOPIC] is None, errors[TOPIC]
        finally:
            admin.close()
        yield running


def take(stream: FetchStream, count: int) -> list[bytes]:
    seen: list[bytes] = []

    def arrived() -> bool:
        for records in stream.poll(500).values():
            seen.extend(r.value or b"" for r in records)
        return len(seen) >= count

    wait_for(f"{count} records", arrived, 30)
    return seen


def test_read_committed_gets_committed_records_once_in_order_then_follows_a_killed_leader(
    cluster: LocalCluster,
) -> None:
    wait_for("node 2 to lead", lambda: _leader(cluster) == 2 or None, 30)
    raw: Any = None
    with (
        FetchStream(cluster.bootstrap_servers, {TP: 0}, isolation_level="read_committed") as stream,
        Producer(cluster.bootstrap_servers, transactional_id="streamer", acks=-1, **SETTINGS) as p,
        grpc.insecure_channel(cluster.broker_address(2)) as channel,
    ):
        p.init_transactions(60)
        expected: list[bytes] = []
        for name, commit in (("a", True), ("b", False), ("c", True)):
            p.begin_transaction()
            for n in range(5):
                p.send(TOPIC, b"%s%d" % (name.encode(), n), partition=0)
            p.flush(30)
            if commit:
                p.commit_transaction(30)
                expected += [b"%s%d" % (name.encode(), n) for n in range(5)]
            else:
                p.abort_transaction(30)
        assert take(stream, 10) == expected
        raw = fetch_stream_method(channel)(
            pb.FetchStreamRequest(topics=[pb.FetchStreamTopic(name=TOPIC, partitions=[
                pb.FetchStreamPartition(partition=0, fetch_offset=0, current_leader_epoch=-1)
            ])]),
            timeout=60,
        )  # fmt: skip
        next(raw)  # subscribed, at node 2
        cluster.signal_node(2, signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as ended:
            for _ in raw:
                pass
        assert ended.value.code() is grpc.StatusCode.UNAVAILABLE, ended.value
        print(f"the leader killed: the stream ended {ended.value.code()}")
        wait_for("node 1 to lead", lambda: _leader(cluster) == 1 or None, 30)
        p.begin_transaction()
        for n in range(5):
            p.send(TOPIC, b"d%d" % n, partition=0)
        p.commit_transaction(30)
        assert take(stream, 5) == [b"d%d" % n for n in range(5)]
        assert stream.poll(200) == {}, "nothing twice"


def _leader(cluster: LocalCluster) -> int | None:
    described = metadata(cluster, 1, TOPIC)
    if described is None or described.error_code or not described.partitions:
        return None
    return int(described.partitions[0].leader_id)
