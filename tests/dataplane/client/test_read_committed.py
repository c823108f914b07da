"""read_committed reading: the aborted-batch filter alone (Kafka's Fetcher algorithm), then the
consumer against a fake broker that answers like a read_committed leader."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from dataplane.client import Consumer, TopicPartition
from dataplane.client._read_committed import drop_aborted
from dataplane.client.consumer import whole_batches
from protos import broker_pb2 as pb
from protos import broker_pb2_grpc as pb_grpc
from raftlog.batch import OFFSET_LENGTH_EPOCH, iter_batches
from raftlog.records import encode_batch, iter_records
from raftlog.txn import encode_marker
from tests.dataplane.fake_broker import FakeBroker, FakeCluster

TP = TopicPartition("t", 0)


def at(base_offset: int, batch: bytes) -> bytes:
    """``batch`` with its base offset set (as a leader assigns it)."""
    return (
        OFFSET_LENGTH_EPOCH.pack(base_offset, len(batch) - 12, 0)
        + batch[OFFSET_LENGTH_EPOCH.size :]
    )


def data(base_offset: int, producer_id: int, *values: bytes, txn: bool = True) -> bytes:
    records = [(None, v, 0, ()) for v in values]
    return at(
        base_offset,
        encode_batch(records, producer_id=producer_id, producer_epoch=0, base_sequence=0,
                     is_transactional=txn),
    )  # fmt: skip


def marker(base_offset: int, producer_id: int, commit: bool) -> bytes:
    return at(
        base_offset,
        encode_marker(producer_id, 0, commit=commit, coordinator_epoch=0, timestamp_ms=0),
    )


def values(log: bytes) -> list[bytes | None]:
    """Every data record's value (control batches left out, as the consumer does)."""
    return [
        record.value
        for position, header in iter_batches(log)
        if not header.is_control
        for record in iter_records(log[position : position + header.size_bytes])
    ]


# producer 1 commits a0 a1 (offsets 0-1, marker 4), producer 2 aborts b0 b1 (2-3, marker 5),
# producer 2 commits c0 (6, marker 7), a plain record p (8)
LOG = b"".join([
    data(0, 1, b"a0", b"a1"), data(2, 2, b"b0", b"b1"), marker(4, 1, True),
    marker(5, 2, False), data(6, 2, b"c0"), marker(7, 2, True), data(8, -1, b"p", txn=False),
])  # fmt: skip


def test_no_aborted_transactions_keep_the_bytes() -> None:
    assert drop_aborted(LOG, []) is LOG


def test_an_aborted_transaction_is_dropped_until_its_marker() -> None:
    kept = drop_aborted(LOG, [(2, 2)])
    assert values(kept) == [b"a0", b"a1", b"c0", b"p"]
    assert values(LOG) == [b"a0", b"a1", b"b0", b"b1", b"c0", b"p"]
    # the markers stay (they take offsets); only the aborted data batch went
    assert [h.base_offset for _, h in iter_batches(kept)] == [0, 4, 5, 6, 7, 8]


def test_a_producer_aborted_twice_and_one_that_started_before_the_fetch() -> None:
    log = b"".join([
        data(10, 3, b"x0"), marker(11, 3, False),  # aborted, first offset 10
        data(12, 3, b"x1"), marker(13, 3, True),  # committed
        data(14, 3, b"x2"), data(15, 4, b"y0"), marker(16, 3, False),  # aborted, first 14
    ])  # fmt: skip
    assert values(drop_aborted(log, [(3, 14), (3, 10)])) == [b"x1", b"y0"]
    # an aborted transaction that began before the fetched range (first offset 5)
    assert values(drop_aborted(log, [(3, 5)])) == [b"x1", b"x2", b"y0"]


def test_an_aborted_transaction_whose_first_offset_is_later_spares_the_earlier_batches() -> None:
    log = data(0, 5, b"early") + marker(1, 5, True) + data(2, 5, b"late") + marker(3, 5, False)
    assert values(drop_aborted(log, [(5, 2)])) == [b"early"]


# -- the consumer ----------------------------------------------------------------------------------
class ReadCommittedBroker(FakeBroker):
    """Answers every fetch with the partition's batches, the aborted transactions of
    ``cluster.aborted`` and the LSO of ``cluster.lso`` (a read_committed leader's answer),
    recording the isolation levels asked for."""

    def __init__(self, cluster: FakeCluster, node_id: int) -> None:
        super().__init__(cluster, node_id)
        self.isolation_levels: list[int] = []
        self.aborted: list[tuple[int, int]] = []
        self.lso = -1

    def Fetch(self, request: pb.FetchRequest, context: grpc.ServicerContext) -> pb.FetchResponse:
        self.isolation_levels.append(request.isolation_level)
        response = super().Fetch(request, context)
        for topic in response.topics:
            for part in topic.partitions:
                part.last_stable_offset = self.lso
                if request.isolation_level == 1 and self.lso >= 0:  # up to the LSO only
                    part.records = b"".join(
                        bytes(part.records[p : p + h.size_bytes])
                        for p, h in iter_batches(part.records)
                        if h.next_offset <= self.lso
                    )
                if request.isolation_level == 1:
                    part.aborted_transactions.extend(
                        pb.AbortedTransaction(producer_id=p, first_offset=o)
                        for p, o in self.aborted
                    )
        return response

    def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.ServicerContext
    ) -> pb.ListOffsetsResponse:
        response = super().ListOffsets(request, context)
        if request.isolation_level == 1:
            for topic in response.topics:
                for part in topic.partitions:
                    if part.offset >= 0 and self.lso >= 0:
                        part.offset = min(part.offset, self.lso)
        return response


@pytest.fixture
def broker() -> Iterator[tuple[str, ReadCommittedBroker]]:
    cluster = FakeCluster()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = ReadCommittedBroker(cluster, 1)
    pb_grpc.add_BrokerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    cluster.brokers[1] = f"127.0.0.1:{port}"
    cluster.create_topic("t", 1)
    state = cluster.topics["t"][0]
    state.batches = [LOG[p : p + h.size_bytes] for p, h in iter_batches(LOG)]
    state.log_end_offset = 9
    try:
        yield cluster.brokers[1], servicer
    finally:
        server.stop(grace=None)


def read_all(consumer: Consumer, end: int) -> list[bytes | None]:
    consumer.assign([TP])
    consumer.seek(TP, 0)
    seen: list[bytes | None] = []
    for _ in range(50):
        seen += [r.value for r in consumer.poll(200).get(TP, [])]
        if consumer.position(TP) >= end:
            break
    return seen


def test_read_committed_drops_aborted_records(broker: tuple[str, ReadCommittedBroker]) -> None:
    address, servicer = broker
    servicer.aborted, servicer.lso = [(2, 2)], 9
    with Consumer(address, isolation_level="read_committed") as consumer:
        assert read_all(consumer, 9) == [b"a0", b"a1", b"c0", b"p"]
        assert consumer.position(TP) == 9  # past the markers and the dropped batch
        assert consumer.current_lag(TP) == 0
    assert set(servicer.isolation_levels) == {1}


def test_read_uncommitted_sees_aborted_records_but_no_markers(
    broker: tuple[str, ReadCommittedBroker],
) -> None:
    address, servicer = broker
    servicer.aborted, servicer.lso = [(2, 2)], 9
    with Consumer(address) as consumer:
        assert read_all(consumer, 9) == [b"a0", b"a1", b"b0", b"b1", b"c0", b"p"]
    assert set(servicer.isolation_levels) == {0}


def test_end_offsets_and_lag_follow_the_isolation_level(
    broker: tuple[str, ReadCommittedBroker],
) -> None:
    address, servicer = broker
    servicer.lso = 4  # a transaction open from offset 4 on, say
    with Consumer(address, isolation_level="read_committed", max_poll_records=1) as committed:
        assert committed.end_offsets([TP]) == {TP: 4}
        committed.assign([TP])
        committed.seek(TP, 0)
        assert committed.current_lag(TP) is None  # no fetch answer yet
        assert [r.value for r in committed.poll(5_000)[TP]] == [b"a0"]
        assert committed.current_lag(TP) == 3  # to the LSO (4), not the high watermark (9)
    with Consumer(address) as uncommitted:
        assert uncommitted.end_offsets([TP]) == {TP: 9}


def test_whole_batches_then_filter_keeps_the_next_offset() -> None:
    fetched = whole_batches(TP, LOG, 0)
    kept = fetched._replace(data=drop_aborted(fetched.data, [(2, 2)]))
    assert kept.next_offset == 9 and len(kept.data) < len(LOG)


def test_group_metadata_without_membership() -> None:
    with Consumer("127.0.0.1:1", group_id="g") as consumer:
        metadata = consumer.group_metadata()
    assert (metadata.group_id, metadata.generation_id, metadata.member_id) == ("g", -1, "")
    with Consumer("127.0.0.1:1") as plain, pytest.raises(ValueError, match="group_id"):
        plain.group_metadata()
