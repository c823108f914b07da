"""Transactions in the broker on a real 3-node cluster, RF 3 (127.0.0.201-203), over raw gRPC
(issue 27): transactional batches (their producer's transaction opened at the coordinator, which
the partition leader asks first, KIP-890) hold a read_committed fetch at the last stable offset;
WriteTxnMarkers sent straight to the leader ends them (abort: the fetch returns the aborted
transaction; commit: the records become visible), the LSO moving past; a SIGKILLed leader's
successor has the same open transaction, LSO and aborted index (followers applied the markers);
confluent-kafka's read_committed consumer, reading those Kafka bytes, sees exactly the committed
records. Bad input: markers where the broker does not lead, of an old epoch, of no topic."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import TopicPartition

from dataplane.tools.local_cluster import LocalCluster, wait_for
from protos import broker_pb2 as pb
from raftlog.batch import iter_batches
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import (
    create_topic,
    metadata,
    produce,
    running_cluster,
    stub,
    values_batch,
)
from tests.dataplane.coordinator.txn_support import Producer, leader_address

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("dataplane-transactions-broker")]

TOPIC = "ledger"
E = ErrorCode


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides: dict[str, str | int] = {"transaction.state.log.num.partitions": 3}
    root = tmp_path_factory.mktemp("transactions-broker")
    with running_cluster(root, "transactions_broker", overrides) as running:
        create_topic(running, TOPIC, 1, configs={"min.insync.replicas": "2"})
        yield running


def committed_read(address: str, offset: int = 0) -> pb.FetchPartitionResponse:
    """A read_committed fetch of the partition from ``offset``."""
    request = pb.FetchRequest(
        replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 22, isolation_level=1,
        topics=[pb.FetchTopic(name=TOPIC, partitions=[pb.FetchPartition(
            partition=0, fetch_offset=offset, current_leader_epoch=-1,
            partition_max_bytes=1 << 22)])],
    )  # fmt: skip
    answer: pb.FetchPartitionResponse = (
        stub(address).Fetch(request, timeout=10).topics[0].partitions[0]
    )
    return answer


def marker(
    address: str, producer_id: int, epoch: int, *, commit: bool, topic: str = TOPIC
) -> ErrorCode:
    """WriteTxnMarkers for one partition, straight to ``address`` (coordinator epoch 0: a real
    coordinator's later markers are never older)."""
    request = pb.WriteTxnMarkersRequest(markers=[pb.TxnMarker(
        producer_id=producer_id, producer_epoch=epoch, committed=commit, coordinator_epoch=0,
        topics=[pb.TxnMarkerTopic(name=topic, partitions=[0])])])  # fmt: skip
    response = stub(address).WriteTxnMarkers(request, timeout=40)
    return ErrorCode.from_code(response.markers[0].topics[0].partitions[0].error_code)


def opened(cluster: LocalCluster, tid: str, *values: bytes, inits: int = 1) -> tuple[Producer, int]:
    """A producer of ``tid`` (initialised ``inits`` times: each bumps its epoch) whose
    transaction holds the partition and ``values``; the offset its first batch got."""
    producer = Producer(cluster, tid)
    for _ in range(inits):
        assert producer.init().error_code == 0
    assert producer.add(TOPIC, 0).error_code == 0
    first = producer.send(TOPIC, 0, list(values[:1]), 0)
    assert first.error_code == 0, first.error_message
    if values[1:]:
        more = producer.send(TOPIC, 0, list(values[1:]), 1)
        assert more.error_code == 0, more.error_message
    return producer, first.base_offset


def aborted_of(answer: pb.FetchPartitionResponse) -> list[tuple[int, int]]:
    return [(a.producer_id, a.first_offset) for a in answer.aborted_transactions]


def test_markers_move_the_lso_and_read_committed_sees_only_the_committed(
    cluster: LocalCluster,
) -> None:
    leader = leader_address(cluster, TOPIC, 0)
    doomed, doomed_first = opened(cluster, "h1-doomed", b"aborted-0", b"aborted-1")
    plain = produce(leader, TOPIC, 0, values_batch([b"plain-0"]))
    assert plain.error_code == 0
    held = committed_read(leader)
    assert held.last_stable_offset == doomed_first < plain.base_offset < held.high_watermark
    read_up_to = max((h.next_offset for _, h in iter_batches(held.records)), default=0)
    assert read_up_to <= held.last_stable_offset, "nothing at or above the LSO is returned"

    assert marker(leader, doomed.producer_id, doomed.epoch, commit=False) is E.NONE
    moved = committed_read(leader)  # the marker is replicated when WriteTxnMarkers answers
    assert moved.last_stable_offset == moved.high_watermark > plain.base_offset
    assert (doomed.producer_id, doomed_first) in aborted_of(moved)

    kept, _ = opened(cluster, "h1-kept", b"committed-0", b"committed-1", inits=2)
    assert kept.epoch >= 1
    assert marker(leader, kept.producer_id, kept.epoch, commit=True) is E.NONE
    after = committed_read(leader)
    assert after.last_stable_offset == after.high_watermark
    assert aborted_of(after) == aborted_of(moved), "a commit adds no aborted transaction"

    # bad input: nothing is stored
    end = committed_read(leader).high_watermark
    stale = marker(leader, kept.producer_id, kept.epoch - 1, commit=False)
    assert stale is E.INVALID_PRODUCER_EPOCH
    follower = next(
        cluster.broker_address(s.node_id)
        for s in cluster.specs
        if cluster.broker_address(s.node_id) != leader
    )
    assert marker(follower, kept.producer_id, kept.epoch, commit=True) is E.NOT_LEADER_OR_FOLLOWER
    assert marker(leader, 1, 0, commit=True, topic="no-such-topic") is E.UNKNOWN_TOPIC_OR_PARTITION
    assert committed_read(leader).high_watermark == end

    assert produce(leader, TOPIC, 0, values_batch([b"end"])).error_code == 0
    assert read_kafka(cluster, "read_committed") == [
        b"plain-0", b"committed-0", b"committed-1", b"end",
    ]  # fmt: skip
    # the aborted records are in the log: the consumer dropped them by the aborted list
    assert b"aborted-0" in read_kafka(cluster, "read_uncommitted")


def read_kafka(cluster: LocalCluster, isolation_level: str) -> list[bytes]:
    """The partition's values as librdkafka's consumer returns them, up to the record ``end``."""
    consumer = RdConsumer({
        "bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers),
        "group.id": "h1-reader", "enable.auto.commit": False,
        "isolation.level": isolation_level,
    })  # fmt: skip
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    values: list[bytes] = []
    try:

        def reached_end() -> bool:
            for message in consumer.consume(num_messages=100, timeout=0.5):
                if message.error() is None:
                    values.append(message.value() or b"")
            return b"end" in values

        wait_for(f"the {isolation_level} consumer to reach the end", reached_end, 90)
    finally:
        consumer.close()
    return values


def test_a_new_leader_has_the_open_transaction_and_the_aborted_index(
    cluster: LocalCluster,
) -> None:
    old_leader = leader_address(cluster, TOPIC, 0)
    gone, gone_first = opened(cluster, "h1-gone", b"gone-0")  # an abort the index must keep
    assert marker(old_leader, gone.producer_id, gone.epoch, commit=False) is E.NONE
    before_open = committed_read(old_leader)
    pending, first = opened(cluster, "h1-pending", b"pending-0")
    assert first >= before_open.high_watermark
    described = describe_producers(old_leader)
    assert described[pending.producer_id].current_txn_start_offset == first
    held = committed_read(old_leader)
    assert held.last_stable_offset == first
    assert (gone.producer_id, gone_first) in aborted_of(held)
    # ListOffsets over the Kafka protocol: a read_committed consumer's end is the LSO
    assert kafka_end(cluster, "read_committed") == first
    assert kafka_end(cluster, "read_uncommitted") == held.high_watermark > first

    wait_for("every replica in the ISR", lambda: in_sync(cluster), 60)
    old_id = next(
        s.node_id for s in cluster.specs if cluster.broker_address(s.node_id) == old_leader
    )
    cluster.stop_node(old_id, kill=True)
    try:
        new_leader = leader_address(cluster, TOPIC, 0)
        assert new_leader != old_leader

        def same_lso() -> pb.FetchPartitionResponse | None:
            try:
                answer = committed_read(new_leader)
            except grpc.RpcError:
                return None
            return answer if not answer.error_code and answer.last_stable_offset == first else None

        successor = wait_for("the new leader's LSO at the open transaction", same_lso, 60)
        assert aborted_of(successor) == aborted_of(held), "the followers applied the aborts"
        assert describe_producers(new_leader)[pending.producer_id].current_txn_start_offset == first

        assert marker(new_leader, pending.producer_id, pending.epoch, commit=False) is E.NONE
        ended = committed_read(new_leader)
        assert ended.last_stable_offset == ended.high_watermark > first
        assert aborted_of(ended) == sorted([*aborted_of(held), (pending.producer_id, first)],
                                           key=lambda a: a[1])  # fmt: skip
    finally:
        cluster.start_node(old_id)
        cluster.wait_for_brokers(timeout_s=60)


def kafka_end(cluster: LocalCluster, isolation_level: str) -> int:
    """The partition's end offset as librdkafka asks it (ListOffsets latest)."""
    consumer = RdConsumer({
        "bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers),
        "group.id": "h1-ends", "isolation.level": isolation_level,
    })  # fmt: skip
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)
    finally:
        consumer.close()
    return int(high)


def describe_producers(address: str) -> dict[int, pb.ProducerStateEntry]:
    request = pb.DescribeProducersRequest(
        topics=[pb.DescribeProducersTopic(name=TOPIC, partitions=[0])]
    )
    answer = stub(address).DescribeProducers(request, timeout=10).topics[0].partitions[0]
    assert answer.error_code == 0, answer.error_message
    return {p.producer_id: p for p in answer.active_producers}


def in_sync(cluster: LocalCluster) -> bool:
    live = [s.node_id for s in cluster.specs if cluster.pid(s.node_id) is not None]
    described = metadata(cluster, live[0], TOPIC)
    return described is not None and len(described.partitions[0].isr) == 3
