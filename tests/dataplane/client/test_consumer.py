"""The consumer against in-process fake brokers: positions, resets, leaders, offset lookups."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dataplane.client import Consumer, ConsumerRecord, TopicPartition
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import encode_batch
from tests.dataplane.fake_broker import FakeCluster, bootstrap, fake_brokers

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
FAST: dict[str, Any] = {
    "retry_backoff_ms": 10,
    "request_timeout_ms": 5_000,
    "fetch_max_wait_ms": 100,
}


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with fake_brokers(2) as cluster:
        cluster.create_topic("t", 2, leaders=[1, 2])
        yield cluster


def put(cluster: FakeCluster, tp: TopicPartition, values: list[bytes], ts: int = 1000) -> None:
    records = [(b"k", v, ts + i, (("h", b"x"),)) for i, v in enumerate(values)]
    cluster.append(tp.topic, tp.partition, encode_batch(records))


def poll_until(consumer: Consumer, count: int, timeout_s: float = 10) -> list[ConsumerRecord]:
    deadline = time.monotonic() + timeout_s
    got: list[ConsumerRecord] = []
    while len(got) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            got.extend(records)
    return got


def test_poll_returns_records_from_the_beginning(cluster: FakeCluster) -> None:
    put(cluster, TP0, [b"a", b"b"])
    put(cluster, TP1, [b"c"])
    with Consumer(bootstrap(cluster), auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([TP0, ("t", 1)])
        assert consumer.assignment() == {TP0, TP1}
        got = poll_until(consumer, 3)
        assert sorted((r.partition, r.offset, r.value) for r in got) == [
            (0, 0, b"a"),
            (0, 1, b"b"),
            (1, 0, b"c"),
        ]
        assert got[0].key == b"k" and got[0].headers == (("h", b"x"),)
        assert consumer.position(TP0) == 2 and consumer.position(TP1) == 1


def test_seek_inside_a_batch_skips_earlier_records(cluster: FakeCluster) -> None:
    put(cluster, TP0, [b"%d" % i for i in range(10)])
    with Consumer(bootstrap(cluster), **FAST) as consumer:
        consumer.assign([TP0])
        consumer.seek(TP0, 5)
        got = poll_until(consumer, 5)
        assert [r.offset for r in got] == [5, 6, 7, 8, 9]


def test_max_poll_records_keeps_the_rest_for_the_next_poll(cluster: FakeCluster) -> None:
    put(cluster, TP0, [b"%d" % i for i in range(25)])
    with Consumer(bootstrap(cluster), max_poll_records=10, **FAST) as consumer:
        consumer.assign([TP0])
        consumer.seek_to_beginning()
        sizes = []
        for _ in range(3):
            batch = consumer.poll(timeout_ms=5000)
            sizes.append(len(batch[TP0]))
            assert consumer.position(TP0) == sum(sizes)
        assert sizes == [10, 10, 5]


def test_the_next_fetch_is_sent_before_the_records_in_hand_are_returned(
    cluster: FakeCluster,
) -> None:
    """Pipelining: while the caller works on one fetch's records, the next is being served."""
    for first in range(0, 20, 5):
        put(cluster, TP0, [b"%d" % i for i in range(first, first + 5)])
    with Consumer(bootstrap(cluster), max_partition_fetch_bytes=1, **FAST) as consumer:
        consumer.assign([TP0])
        consumer.seek(TP0, 0)
        assert [r.offset for r in consumer.poll(timeout_ms=5000)[TP0]] == [0, 1, 2, 3, 4]
        with cluster.lock:
            assert cluster.lock.wait_for(lambda: ("t", 0, 5) in cluster.fetch_offsets, 10)
        got = poll_until(consumer, 15)
        assert [r.offset for r in got] == list(range(5, 20))
        assert consumer.position(TP0) == 20


def test_a_seek_does_not_wait_for_a_fetch_in_flight_from_the_old_position(
    cluster: FakeCluster,
) -> None:
    put(cluster, TP0, [b"a", b"b", b"c"])
    long_poll = {**FAST, "fetch_max_wait_ms": 30_000}
    with Consumer(bootstrap(cluster), **long_poll) as consumer:
        consumer.assign([TP0])
        consumer.seek(TP0, 0)
        assert len(poll_until(consumer, 3)) == 3  # and a 30 s long poll at offset 3 goes out
        with cluster.lock:
            assert cluster.lock.wait_for(lambda: ("t", 0, 3) in cluster.fetch_offsets, 10)
        consumer.seek(TP0, 1)
        # the stale long poll is cancelled, not waited for: well within its 30 s
        assert [r.value for r in poll_until(consumer, 2, timeout_s=10)] == [b"b", b"c"]


def test_latest_reset_starts_at_the_end(cluster: FakeCluster) -> None:
    put(cluster, TP0, [b"old"])
    with Consumer(bootstrap(cluster), **FAST) as consumer:
        consumer.assign([TP0])
        assert consumer.position(TP0) == 1
        assert consumer.poll(timeout_ms=0) == {}
        put(cluster, TP0, [b"new"])
        assert [r.value for r in poll_until(consumer, 1)] == [b"new"]


def test_long_poll_returns_records_appended_while_waiting(cluster: FakeCluster) -> None:
    with Consumer(
        bootstrap(cluster),
        fetch_max_wait_ms=5000,
        **{k: v for k, v in FAST.items() if k != "fetch_max_wait_ms"},
    ) as consumer:
        consumer.assign([TP0])
        consumer.position(TP0)
        writer = threading.Thread(target=put, args=(cluster, TP0, [b"late"]))
        writer.start()
        got = poll_until(consumer, 1)
        writer.join(10)
        assert [r.value for r in got] == [b"late"]


def test_out_of_range_applies_auto_offset_reset(cluster: FakeCluster) -> None:
    put(cluster, TP0, [b"a", b"b"])
    with Consumer(bootstrap(cluster), auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([TP0])
        consumer.seek(TP0, 100)
        assert [r.offset for r in poll_until(consumer, 2)] == [0, 1]


def test_out_of_range_raises_with_reset_none(cluster: FakeCluster) -> None:
    with Consumer(bootstrap(cluster), auto_offset_reset="none", **FAST) as consumer:
        consumer.assign([TP0])
        with pytest.raises(KafkaError) as info:
            consumer.position(TP0)
        assert info.value.error is ErrorCode.OFFSET_OUT_OF_RANGE
        consumer.seek(TP0, 100)
        with pytest.raises(KafkaError) as info:
            consumer.poll(timeout_ms=2000)
        assert info.value.error is ErrorCode.OFFSET_OUT_OF_RANGE


def test_consumer_follows_a_leader_change(cluster: FakeCluster) -> None:
    put(cluster, TP0, [b"a"])
    with Consumer(bootstrap(cluster), auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([TP0])
        assert [r.value for r in poll_until(consumer, 1)] == [b"a"]
        cluster.move_leader("t", 0, 2)  # epoch 1: the old leader answers NOT_LEADER
        put(cluster, TP0, [b"b"])
        got = poll_until(consumer, 1)
        assert [(r.offset, r.value, r.leader_epoch) for r in got] == [(1, b"b", 1)]


def test_offset_lookups(cluster: FakeCluster) -> None:
    put(cluster, TP0, [b"a", b"b", b"c"], ts=1000)
    with Consumer(bootstrap(cluster), **FAST) as consumer:
        assert consumer.beginning_offsets([TP0, TP1]) == {TP0: 0, TP1: 0}
        assert consumer.end_offsets([TP0, TP1]) == {TP0: 3, TP1: 0}
        found = consumer.offsets_for_times({TP0: 1001, TP1: 5})
        assert found == {TP0: (1, 1001), TP1: None}
        assert consumer.partitions_for_topic("t") == {0, 1}


def test_position_of_an_unassigned_partition_is_an_error(cluster: FakeCluster) -> None:
    with Consumer(bootstrap(cluster), **FAST) as consumer, pytest.raises(ValueError):
        consumer.position(TP0)
