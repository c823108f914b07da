"""BrokerService's transactional paths on a real replica manager, without processes (issue 27):
Produce needs a transactional id for transactional records and verifies the first batch of a
transaction (KIP-890) through ``verify_transaction``; Fetch and ListOffsets honour
``isolation_level``; WriteTxnMarkers writes markers (or hands them to an internal topic's
writer) with Kafka's errors per partition; DescribeProducers; both new RPCs are registered."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataplane.broker.metrics import NodeMetrics
from dataplane.broker.partition import IsrChange
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from dataplane.broker.service import BrokerServicer, _add_broker_service, _Handlers
from metadata_quorum.features import BOOTSTRAP_FEATURES
from metadata_quorum.image import MetadataImage, PartitionRegistration, TopicImage
from protos import broker_pb2 as pb
from raftlog.errors import ErrorCode
from raftlog.records import encode_batch
from tests.dataplane.broker.test_replication_core import Clock

TOPIC = "orders"
TOPIC_ID = uuid.UUID(int=2727)
TXN_ID = "orders-writer"


def image() -> MetadataImage:
    """Broker 1 leads partition 0 alone; partition 1 is led by broker 2."""
    partitions = {
        0: PartitionRegistration((1,), (1,), 1, 0, 0),
        1: PartitionRegistration((2, 1), (2, 1), 2, 0, 0),
    }
    return MetadataImage(
        offset=10,
        topics={TOPIC_ID: TopicImage(TOPIC, TOPIC_ID, partitions)},
        topic_ids={TOPIC: TOPIC_ID},
        features=dict(BOOTSTRAP_FEATURES),  # a new cluster's levels: KIP-848, share groups on
    )


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[ReplicaManager]:
    def alter(change: IsrChange) -> None:
        pass

    def failed(directory: Path, error: OSError) -> None:
        raise AssertionError(f"no log dir failure expected: {directory}: {error}")

    manager = ReplicaManager(1, tmp_path, ReplicaManagerConfig(), Clock(), alter, failed)
    manager.apply_image(image(), caught_up=True)
    yield manager
    manager.close()


class Verifier:
    """Stands in for the transaction coordinator's KIP-890 answer."""

    def __init__(self) -> None:
        self.answer = ErrorCode.NONE
        self.asked: list[tuple[str, int, int, str, int]] = []

    def __call__(
        self, txn_id: str, producer_id: int, epoch: int, topic: str, index: int
    ) -> ErrorCode:
        self.asked.append((txn_id, producer_id, epoch, topic, index))
        return self.answer


@pytest.fixture
def servicer(replicas: ReplicaManager) -> BrokerServicer:
    return BrokerServicer(1, replicas, NodeMetrics(), "test", [], lambda c: None, lambda: 0)


def produce(
    servicer: BrokerServicer, records: bytes, txn_id: str = TXN_ID, partition: int = 0
) -> pb.ProducePartitionResponse:
    request = pb.ProduceRequest(
        acks=-1, timeout_ms=5_000, transactional_id=txn_id,
        topics=[pb.ProduceTopic(name=TOPIC, partitions=[
            pb.ProducePartition(partition=partition, records=records)])],
    )  # fmt: skip
    return servicer.Produce(request, None).topics[0].partitions[0]


def txn(producer_id: int, sequence: int, *values: bytes, epoch: int = 0) -> bytes:
    return encode_batch(
        [(None, v, 1_000_000, ()) for v in values], producer_id=producer_id,
        producer_epoch=epoch, base_sequence=sequence, is_transactional=True,
    )  # fmt: skip


def fetch(
    servicer: BrokerServicer, isolation_level: int, offset: int = 0
) -> pb.FetchPartitionResponse:
    request = pb.FetchRequest(
        replica_id=-1, max_bytes=1 << 20, isolation_level=isolation_level,
        topics=[pb.FetchTopic(name=TOPIC, partitions=[
            pb.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20,
                              current_leader_epoch=-1)])],
    )  # fmt: skip
    return servicer.Fetch(request, None).topics[0].partitions[0]


def latest(servicer: BrokerServicer, isolation_level: int) -> pb.ListOffsetsPartitionResponse:
    request = pb.ListOffsetsRequest(
        replica_id=-1, isolation_level=isolation_level,
        topics=[pb.ListOffsetsTopic(name=TOPIC, partitions=[
            pb.ListOffsetsPartition(partition=0, timestamp=-1, current_leader_epoch=-1)])],
    )  # fmt: skip
    return servicer.ListOffsets(request, None).topics[0].partitions[0]


def markers(
    servicer: BrokerServicer,
    producer_id: int,
    *,
    commit: bool,
    epoch: int = 0,
    topic: str = TOPIC,
    partitions: tuple[int, ...] = (0,),
) -> list[tuple[int, int]]:
    request = pb.WriteTxnMarkersRequest(markers=[pb.TxnMarker(
        producer_id=producer_id, producer_epoch=epoch, committed=commit, coordinator_epoch=4,
        topics=[pb.TxnMarkerTopic(name=topic, partitions=partitions)])])  # fmt: skip
    response = servicer.WriteTxnMarkers(request, None)
    [result] = response.markers
    assert result.producer_id == producer_id
    return [(p.partition, p.error_code) for t in result.topics for p in t.partitions]


def test_transactional_records_need_a_transactional_id(servicer: BrokerServicer) -> None:
    answer = produce(servicer, txn(7, 0, b"x"), txn_id="")
    assert answer.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
    assert fetch(servicer, 0).high_watermark == 0, "nothing stored"


def test_the_first_batch_of_a_transaction_is_verified(servicer: BrokerServicer) -> None:
    verifier = Verifier()
    servicer.verify_transaction = verifier
    verifier.answer = ErrorCode.INVALID_TXN_STATE  # the partition is not in the transaction
    assert produce(servicer, txn(7, 0, b"x")).error_code == ErrorCode.INVALID_TXN_STATE.code
    verifier.answer = ErrorCode.CONCURRENT_TRANSACTIONS  # retriable for old clients too
    assert produce(servicer, txn(7, 0, b"x")).error_code == ErrorCode.NOT_ENOUGH_REPLICAS.code
    assert fetch(servicer, 0).high_watermark == 0, "nothing stored"
    verifier.answer = ErrorCode.NONE
    assert produce(servicer, txn(7, 0, b"x")).error_code == 0
    assert produce(servicer, txn(7, 1, b"y")).error_code == 0  # open here: not asked again
    assert verifier.asked == [(TXN_ID, 7, 0, TOPIC, 0)] * 3
    assert markers(servicer, 7, commit=True) == [(0, 0)]
    assert produce(servicer, txn(7, 2, b"z")).error_code == 0  # a new transaction: asked
    assert len(verifier.asked) == 4


def test_read_committed_fetch_and_list_offsets_stop_at_the_lso(servicer: BrokerServicer) -> None:
    assert produce(servicer, txn(7, 0, b"a1", b"a2")).error_code == 0  # 0-1
    plain = encode_batch([(None, b"p", 1_000_000, ())])
    assert produce(servicer, plain).error_code == 0  # 2
    committed, uncommitted = fetch(servicer, 1), fetch(servicer, 0)
    assert (committed.high_watermark, committed.last_stable_offset) == (3, 0)
    assert committed.records == b"" and len(uncommitted.records) > 0
    assert uncommitted.last_stable_offset == 0, "filled whatever the isolation level"
    assert (latest(servicer, 1).offset, latest(servicer, 0).offset) == (0, 3)
    assert markers(servicer, 7, commit=False) == [(0, 0)]  # 3
    committed = fetch(servicer, 1)
    assert committed.last_stable_offset == 4 and len(committed.records) > 0
    assert [(a.producer_id, a.first_offset) for a in committed.aborted_transactions] == [(7, 0)]
    assert latest(servicer, 1).offset == 4
    # from inside the aborted range (its marker at 3 is read): it is still returned
    assert len(fetch(servicer, 1, offset=2).aborted_transactions) == 1
    bad = fetch(servicer, 2)
    assert bad.error_code == ErrorCode.INVALID_REQUEST.code


def test_write_txn_markers_answers_per_partition(servicer: BrokerServicer) -> None:
    assert produce(servicer, txn(7, 0, b"x", epoch=3)).error_code == 0
    assert markers(servicer, 7, commit=True, epoch=2) == [
        (0, ErrorCode.INVALID_PRODUCER_EPOCH.code)
    ]
    assert markers(servicer, 7, commit=True, epoch=3, partitions=(0, 1, 9)) == [
        (0, 0),
        (1, ErrorCode.NOT_LEADER_OR_FOLLOWER.code),
        (9, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code),
    ]
    assert markers(servicer, 7, commit=True, topic="nope") == [
        (0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code)
    ]
    written: list[tuple[int, int, int, bool, int]] = []

    def writer(
        index: int, producer_id: int, epoch: int, commit: bool, coordinator_epoch: int
    ) -> None:
        written.append((index, producer_id, epoch, commit, coordinator_epoch))

    servicer.marker_writers["__consumer_offsets"] = writer
    assert markers(servicer, 7, commit=False, epoch=3, topic="__consumer_offsets",
                   partitions=(12,)) == [(12, 0)]  # fmt: skip
    assert written == [(12, 7, 3, False, 4)]


def test_describe_producers(servicer: BrokerServicer) -> None:
    produce(servicer, txn(7, 0, b"x", b"y", epoch=1))
    idempotent = encode_batch([(None, b"i", 1_000_000, ())], producer_id=8, producer_epoch=0,
                              base_sequence=0)  # fmt: skip
    produce(servicer, idempotent, txn_id="")
    markers(servicer, 9, commit=False, epoch=2)  # a producer only a marker knows
    request = pb.DescribeProducersRequest(
        topics=[pb.DescribeProducersTopic(name=TOPIC, partitions=[0, 1])]
    )
    [answer] = servicer.DescribeProducers(request, None).topics
    mine, theirs = answer.partitions
    assert theirs.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code
    described = {
        p.producer_id: (p.producer_epoch, p.last_sequence, p.coordinator_epoch,
                        p.current_txn_start_offset)
        for p in mine.active_producers
    }  # fmt: skip
    assert described == {7: (1, 1, -1, 0), 8: (0, 0, -1, -1), 9: (2, -1, 4, -1)}
    assert all(p.last_timestamp > 0 for p in mine.active_producers)


def test_the_new_rpcs_are_registered(servicer: BrokerServicer) -> None:
    collected = _Handlers()

    class Server:
        def add_generic_rpc_handlers(self, handlers: object) -> None:
            pass

        def add_registered_method_handlers(self, service: str, handlers: dict[str, object]) -> None:
            collected.handlers.update(handlers)

    _add_broker_service(servicer, Server())
    assert {"WriteTxnMarkers", "DescribeProducers"} <= set(collected.handlers)
