"""The producer against in-process fake brokers: batching, ordering, retries, errors."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dataplane.client import Producer, RecordMetadata
from dataplane.client.partitioner import partition_for_key
from dataplane.client.producer import ProducerClosedError
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.fake_broker import FakeCluster, bootstrap, fake_brokers

FAST: dict[str, Any] = {
    "retry_backoff_ms": 10,
    "request_timeout_ms": 5_000,
    "delivery_timeout_ms": 20_000,
}


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with fake_brokers(2) as cluster:
        cluster.create_topic("t", 2, leaders=[1, 2])
        yield cluster


def test_send_and_flush_assigns_offsets_in_order(cluster: FakeCluster) -> None:
    with Producer(bootstrap(cluster), linger_ms=50, **FAST) as producer:
        futures = [producer.send("t", value=b"%d" % i, partition=0) for i in range(100)]
        producer.flush(timeout=10)
        metas = [f.result(timeout=0) for f in futures]
    assert [m.offset for m in metas] == list(range(100))
    assert all(m.topic == "t" and m.partition == 0 for m in metas)
    assert metas[0].serialized_value_size == 1 and metas[0].serialized_key_size == -1
    assert cluster.values("t", 0) == [b"%d" % i for i in range(100)]


def test_one_request_per_broker_holds_many_partitions() -> None:
    with fake_brokers(1) as cluster:
        cluster.create_topic("t", 4)
        with Producer(bootstrap(cluster), linger_ms=1000, **FAST) as producer:
            futures = [producer.send("t", value=b"v", partition=p) for p in range(4)]
            producer.flush(timeout=10)
            assert all(f.result(0).offset == 0 for f in futures)
        [request] = cluster.produce_requests
        assert sorted(p.partition for t in request.topics for p in t.partitions) == [0, 1, 2, 3]
        assert request.acks == -1


def test_keyed_records_use_murmur2(cluster: FakeCluster) -> None:
    with Producer(bootstrap(cluster), **FAST) as producer:
        metas = [producer.send("t", value=b"v", key=b"k%d" % i) for i in range(20)]
        producer.flush(timeout=10)
        for i, future in enumerate(metas):
            assert future.result(0).partition == partition_for_key(b"k%d" % i, 2)


def test_batch_size_splits_batches(cluster: FakeCluster) -> None:
    with Producer(bootstrap(cluster), batch_size=1000, linger_ms=10_000, **FAST) as producer:
        futures = [producer.send("t", value=b"x" * 100, partition=0) for i in range(30)]
        # ~7 records fill a batch: full batches go without waiting for linger.ms or flush
        for future in futures[:21]:
            future.result(timeout=10)
        assert not futures[-1].done()  # the last, open batch lingers
        producer.flush(timeout=10)
    assert len(cluster.topics["t"][0].batches) >= 4
    assert cluster.values("t", 0) == [b"x" * 100] * 30


def test_not_leader_is_retried_after_a_metadata_refresh_in_order(cluster: FakeCluster) -> None:
    cluster.inject("t", 0, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    with Producer(bootstrap(cluster), linger_ms=0, batch_size=200, **FAST) as producer:
        # the first batch meets NOT_LEADER (leader 1 is still the leader): retried in place
        producer.send("t", value=b"warm", partition=0).result(timeout=10)
        cluster.inject("t", 0, ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_ENOUGH_REPLICAS)
        cluster.move_leader("t", 0, 2)
        futures = [producer.send("t", value=b"%d" % i, partition=0) for i in range(50)]
        producer.flush(timeout=15)
        offsets = [f.result(0).offset for f in futures]
    assert offsets == sorted(offsets) and len(set(offsets)) == 50
    assert cluster.values("t", 0) == [b"warm"] + [b"%d" % i for i in range(50)]


def test_a_network_failure_is_retried() -> None:
    with fake_brokers(1) as cluster:
        cluster.create_topic("t", 1)
        address = bootstrap(cluster)[0]
        cluster.inject("t", 0, ErrorCode.REQUEST_TIMED_OUT, ErrorCode.LEADER_NOT_AVAILABLE)
        with Producer([address], linger_ms=0, **FAST) as producer:
            assert producer.send("t", value=b"a").result(timeout=10).offset == 0


def test_non_retriable_error_fails_the_future(cluster: FakeCluster) -> None:
    cluster.inject("t", 1, ErrorCode.INVALID_RECORD)
    with Producer(bootstrap(cluster), linger_ms=0, **FAST) as producer:
        future = producer.send("t", value=b"bad", partition=1)
        with pytest.raises(KafkaError) as info:
            future.result(timeout=10)
        assert info.value.error is ErrorCode.INVALID_RECORD
        assert producer.send("t", value=b"good", partition=1).result(timeout=10).offset == 0


def test_a_refused_producer_id_fails_the_records_and_is_asked_again_for_the_next(
    cluster: FakeCluster,
) -> None:
    """An idempotent producer refused InitProducerId for good (CLUSTER_AUTHORIZATION_FAILED:
    neither IDEMPOTENT_WRITE nor WRITE on a topic) fails its records at once, does not ask
    again while idle, and asks again for the next record: allowed by then, it is delivered."""
    cluster.init_producer_id_errors.extend([ErrorCode.CLUSTER_AUTHORIZATION_FAILED] * 100)
    with Producer(bootstrap(cluster), linger_ms=0, **FAST) as producer:
        with pytest.raises(KafkaError) as info:
            producer.send("t", value=b"refused", partition=0).result(timeout=10)
        assert info.value.error is ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        left = len(cluster.init_producer_id_errors)
        time.sleep(0.5)  # an idle window in which no request may be made: what is tested
        assert len(cluster.init_producer_id_errors) == left
        cluster.init_producer_id_errors.clear()  # the ACL is granted
        assert producer.send("t", value=b"allowed", partition=0).result(timeout=10).offset == 0
    assert cluster.values("t", 0) == [b"allowed"]


def test_retries_are_bounded(cluster: FakeCluster) -> None:
    cluster.inject("t", 0, *[ErrorCode.NOT_ENOUGH_REPLICAS] * 3)
    with Producer(bootstrap(cluster), linger_ms=0, retries=1, **FAST) as producer:
        with pytest.raises(KafkaError) as info:
            producer.send("t", value=b"a", partition=0).result(timeout=10)
        assert info.value.error is ErrorCode.NOT_ENOUGH_REPLICAS


def test_unknown_topic_fails_after_max_block_ms(cluster: FakeCluster) -> None:
    with Producer(bootstrap(cluster), max_block_ms=200, **FAST) as producer:
        with pytest.raises(KafkaError) as info:
            producer.send("missing", value=b"a").result(timeout=10)
        assert info.value.error is ErrorCode.REQUEST_TIMED_OUT


def test_partition_out_of_range_fails(cluster: FakeCluster) -> None:
    with Producer(bootstrap(cluster), **FAST) as producer:
        with pytest.raises(KafkaError) as info:
            producer.send("t", value=b"a", partition=7).result(timeout=10)
        assert info.value.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_record_too_large_fails_without_sending(cluster: FakeCluster) -> None:
    with Producer(bootstrap(cluster), max_request_size=1000, **FAST) as producer:
        with pytest.raises(KafkaError) as info:
            producer.send("t", value=b"x" * 2000).result(timeout=10)
        assert info.value.error is ErrorCode.MESSAGE_TOO_LARGE
    assert cluster.produce_requests == []


def test_a_batch_refused_once_as_too_large_is_split_and_delivered(cluster: FakeCluster) -> None:
    cluster.inject("t", 0, ErrorCode.MESSAGE_TOO_LARGE)
    with Producer(bootstrap(cluster), linger_ms=200, batch_size=10_000, **FAST) as producer:
        futures = [producer.send("t", value=b"v%d" % n, partition=0) for n in range(3)]
        producer.flush(timeout=10)
        assert [f.result(0).offset for f in futures] == [0, 1, 2]
    assert cluster.values("t", 0) == [b"v0", b"v1", b"v2"]
    # refused whole, then the halves: two records, then one
    assert len(cluster.produce_requests) == 3


@pytest.mark.parametrize("idempotent", [True, False])
def test_batches_above_max_message_bytes_are_split_until_they_fit(
    cluster: FakeCluster, idempotent: bool
) -> None:
    """KIP-126: batch.size far above the topic's limit; every record lands once, in order,
    with offsets and callbacks from the part it went to (the fake checks the sequences)."""
    cluster.topics["t"][0].max_message_bytes = 700
    acks: Any = "all" if idempotent else 1
    done: list[int] = []
    with Producer(
        bootstrap(cluster), linger_ms=500, batch_size=100_000, acks=acks,
        enable_idempotence=idempotent, **FAST,
    ) as producer:  # fmt: skip
        futures = [
            producer.send(
                "t", value=b"%03d" % n + b"x" * 97, partition=0,
                callback=lambda meta, error: done.append(meta.offset if meta else -1),
            )
            for n in range(40)
        ]  # fmt: skip
        producer.flush(timeout=20)
        assert [f.result(0).offset for f in futures] == list(range(40))
    assert sorted(done) == list(range(40))
    assert [v[:3] if v else b"" for v in cluster.values("t", 0)] == [b"%03d" % n for n in range(40)]
    assert all(len(batch) <= 700 for batch in cluster.topics["t"][0].batches)


def test_one_record_above_max_message_bytes_fails_and_the_others_land(
    cluster: FakeCluster,
) -> None:
    cluster.topics["t"][0].max_message_bytes = 500
    with Producer(bootstrap(cluster), linger_ms=500, batch_size=100_000, **FAST) as producer:
        futures = [
            producer.send("t", value=value, partition=0)
            for value in (b"a" * 100, b"b" * 600, b"c" * 100)
        ]
        producer.flush(timeout=20)
        with pytest.raises(KafkaError) as info:
            futures[1].result(0)
        assert info.value.error is ErrorCode.MESSAGE_TOO_LARGE
        assert futures[0].result(0).offset == 0
        # the failed record's sequence is a gap: the half after it goes with a new producer
        # id (its payload, built with the old one, was never sent)
        assert futures[2].result(0).offset == 1
    assert cluster.values("t", 0) == [b"a" * 100, b"c" * 100]


def test_acks_zero_completes_with_offset_minus_one(cluster: FakeCluster) -> None:
    with Producer(bootstrap(cluster), acks=0, **FAST) as producer:
        meta = producer.send("t", value=b"a", partition=0).result(timeout=10)
        assert meta.offset == -1
        producer.flush(timeout=10)
    assert cluster.produce_requests[0].acks == 0


@pytest.mark.parametrize("compression", ["gzip", "snappy", "lz4", "zstd"])
def test_compression_round_trips(cluster: FakeCluster, compression: str) -> None:
    with Producer(bootstrap(cluster), compression_type=compression, **FAST) as producer:  # type: ignore[arg-type]
        for i in range(10):
            producer.send("t", value=b"value-%d" % i, partition=1, headers=[("h", b"v")])
        producer.flush(timeout=10)
    assert cluster.values("t", 1) == [b"value-%d" % i for i in range(10)]


def test_null_keys_stick_to_one_partition_per_batch(cluster: FakeCluster) -> None:
    with Producer(bootstrap(cluster), linger_ms=10_000, **FAST) as producer:
        futures = [producer.send("t", value=b"v") for _ in range(10)]
        producer.flush(timeout=10)
        assert len({f.result(0).partition for f in futures}) == 1


def test_callback_gets_metadata_or_exception(cluster: FakeCluster) -> None:
    results: list[tuple[RecordMetadata | None, BaseException | None]] = []
    with Producer(bootstrap(cluster), **FAST) as producer:
        producer.send("t", value=b"a", partition=0, callback=lambda m, e: results.append((m, e)))
        producer.flush(timeout=10)
    [(meta, error)] = results
    assert error is None and meta is not None and meta.offset == 0


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_delivery_timeout_fails_records_of_an_unreachable_leader() -> None:
    with fake_brokers(1) as cluster:
        cluster.brokers[2] = f"127.0.0.1:{closed_port()}"  # metadata names a dead leader
        cluster.create_topic("t", 1, leaders=[2])
        with Producer(
            bootstrap(cluster)[:1],
            retry_backoff_ms=10,
            request_timeout_ms=300,
            delivery_timeout_ms=800,
            linger_ms=0,
        ) as producer:
            with pytest.raises(KafkaError) as info:
                producer.send("t", value=b"a").result(timeout=10)
            assert info.value.error is ErrorCode.REQUEST_TIMED_OUT
            assert "delivery.timeout.ms" in str(info.value)


def test_send_after_close_raises(cluster: FakeCluster) -> None:
    producer = Producer(bootstrap(cluster), **FAST)
    producer.close()
    with pytest.raises(ProducerClosedError):
        producer.send("t", value=b"a")
