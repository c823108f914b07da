"""KIP-320: the consumer validates its position with OffsetForLeaderEpoch after a leader change.

The decision table is Kafka's ``SubscriptionState.maybeCompleteValidation``; the consumer runs
against in-process fake brokers whose epoch cache answers as a leader's does, and (in
``test_client_long_tail``) against a real cluster."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from dataplane.client import Consumer, ConsumerRecord, LogTruncationError, TopicPartition
from dataplane.client._validation import Outcome, validation_outcome
from raftlog.records import encode_batch
from tests.dataplane.fake_broker import FakeCluster, bootstrap, fake_brokers

TP0 = TopicPartition("t", 0)
FAST: dict[str, Any] = {
    "retry_backoff_ms": 10,
    "request_timeout_ms": 5_000,
    "fetch_max_wait_ms": 50,
}


@pytest.mark.parametrize(
    ("end_epoch", "end_offset", "policy", "expected"),
    [
        (3, 10, "none", Outcome("valid")),  # the epoch ends at the position
        (3, 12, "earliest", Outcome("valid")),  # ... or after it
        (3, 7, "earliest", Outcome("seek", offset=7, offset_epoch=3)),  # truncated below it
        (2, 7, "latest", Outcome("seek", offset=7, offset_epoch=2)),
        (-1, -1, "earliest", Outcome("reset")),  # the leader knows no such epoch
        (-1, -1, "latest", Outcome("reset")),
    ],
)
def test_a_validation_answer_decides_as_kafka(
    end_epoch: int, end_offset: int, policy: Any, expected: Outcome
) -> None:
    assert validation_outcome(TP0, 10, end_epoch, end_offset, policy) == expected


def test_a_truncation_without_a_reset_policy_is_an_error_with_the_divergent_offset() -> None:
    outcome = validation_outcome(TP0, 10, 3, 7, "none")
    assert outcome.kind == "truncated" and outcome.error is not None
    assert outcome.error.divergent_offset is not None
    assert (outcome.error.divergent_offset.offset, outcome.error.divergent_offset.leader_epoch) == (
        7,
        3,
    )
    unknown = validation_outcome(TP0, 10, -1, -1, "none")
    assert unknown.error is not None and unknown.error.divergent_offset is None


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with fake_brokers(2) as cluster:
        cluster.create_topic("t", 1, leaders=[1])
        yield cluster


def put(cluster: FakeCluster, values: list[bytes]) -> None:
    cluster.append("t", 0, encode_batch([(None, v, 1000, ()) for v in values]))


def poll_until(consumer: Consumer, count: int, timeout_s: float = 10) -> list[ConsumerRecord]:
    deadline = time.monotonic() + timeout_s
    got: list[ConsumerRecord] = []
    while len(got) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=100).values():
            got.extend(records)
    return got


def consume_then_elect(cluster: FakeCluster, consumer: Consumer, truncate: bool) -> None:
    """Consume a, b, c (epoch 0, offsets 0-2); broker 2 becomes leader (epoch 1), having
    lost b and c when ``truncate`` (an unclean election); x and y are written."""
    put(cluster, [b"a"])
    put(cluster, [b"b", b"c"])
    consumer.assign([TP0])
    consumer.seek(TP0, 0)
    assert [r.value for r in poll_until(consumer, 3)] == [b"a", b"b", b"c"]
    if truncate:
        cluster.truncate("t", 0, batches_kept=1)
    cluster.move_leader("t", 0, 2)
    put(cluster, [b"x", b"y"])


def test_after_a_clean_leader_change_the_position_stands(cluster: FakeCluster) -> None:
    with Consumer(bootstrap(cluster), auto_offset_reset="none", **FAST) as consumer:
        consume_then_elect(cluster, consumer, truncate=False)
        got = poll_until(consumer, 2)
        assert [(r.offset, r.value) for r in got] == [(3, b"x"), (4, b"y")]


def test_a_truncated_log_raises_log_truncation_without_a_reset_policy(
    cluster: FakeCluster,
) -> None:
    with Consumer(bootstrap(cluster), auto_offset_reset="none", **FAST) as consumer:
        consume_then_elect(cluster, consumer, truncate=True)
        with pytest.raises(LogTruncationError) as info:
            poll_until(consumer, 1)
        divergent = info.value.divergent_offset
        assert divergent is not None and (divergent.offset, divergent.leader_epoch) == (1, 0)
        assert info.value.position == 3
        consumer.seek(TP0, divergent.offset)  # the application decides: from the divergence
        assert [(r.offset, r.value) for r in poll_until(consumer, 2)] == [(1, b"x"), (2, b"y")]


def test_a_truncated_log_moves_the_position_back_to_the_divergence_with_a_reset_policy(
    cluster: FakeCluster,
) -> None:
    with Consumer(bootstrap(cluster), auto_offset_reset="latest", **FAST) as consumer:
        consume_then_elect(cluster, consumer, truncate=True)
        # offsets 1 and 2 now hold other records than b and c: they are read, not skipped
        assert [(r.offset, r.value) for r in poll_until(consumer, 2)] == [(1, b"x"), (2, b"y")]
        assert consumer.position(TP0) == 3
