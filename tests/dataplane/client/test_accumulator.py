"""The producer's RecordAccumulator as pure logic, with an injected clock."""

from __future__ import annotations

import threading

import pytest

from dataplane.client._accumulator import (
    ProducerClosedError,
    ProducerTimeoutError,
    RecordAccumulator,
    estimate_record_bytes,
    halving_index,
)
from dataplane.client._types import TopicPartition

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    def advance_ms(self, ms: float) -> None:
        self.now_s += ms / 1000


def record(value: bytes, ts: int = 1) -> tuple[bytes | None, bytes | None, int, tuple[()]]:
    return (None, value, ts, ())


def make(
    clock: FakeClock, batch_size: int = 1000, linger_ms: int = 10, memory: int = 1 << 20
) -> RecordAccumulator:
    return RecordAccumulator(
        batch_size=batch_size, linger_ms=linger_ms, buffer_memory=memory, clock=clock
    )


def test_a_batch_becomes_ready_after_linger_ms() -> None:
    clock = FakeClock()
    acc = make(clock, linger_ms=10)
    result = acc.append(TP0, record(b"a"))
    assert result.new_batch and not result.batch_full
    ready = acc.ready()
    assert ready.partitions == []
    assert ready.next_ready_s == pytest.approx(clock.now_s + 0.010)
    clock.advance_ms(9)
    assert acc.ready().partitions == []
    clock.advance_ms(1)
    assert acc.ready().partitions == [TP0]


def test_a_batch_is_ready_when_batch_size_is_reached() -> None:
    clock = FakeClock()
    size = estimate_record_bytes(None, b"x" * 100, ())
    acc = make(clock, batch_size=61 + 3 * size, linger_ms=10_000)
    assert not acc.append(TP0, record(b"x" * 100)).batch_full
    assert not acc.append(TP0, record(b"x" * 100)).batch_full
    assert acc.append(TP0, record(b"x" * 100)).batch_full
    assert acc.ready().partitions == [TP0]
    result = acc.append(TP0, record(b"x" * 100))
    assert result.new_batch and result.batch_full  # the previous batch waits to be sent
    drained = acc.drain([TP0], 1 << 20)
    assert [len(b.records) for b in drained] == [3]


def test_a_record_larger_than_batch_size_gets_its_own_full_batch() -> None:
    clock = FakeClock()
    acc = make(clock, batch_size=100)
    result = acc.append(TP0, record(b"x" * 500))
    assert result.new_batch and result.batch_full


def test_drain_takes_one_batch_per_partition_and_mutes_it_until_completed() -> None:
    clock = FakeClock()
    acc = make(clock, batch_size=100, linger_ms=0)
    for i in range(3):
        acc.append(TP0, record(bytes([i]) * 90))
    acc.append(TP1, record(b"b"))
    first = acc.drain([TP0, TP1], 1 << 20)
    assert sorted(b.tp.partition for b in first) == [0, 1]
    assert acc.ready().partitions == []  # both partitions are muted while in flight
    assert acc.drain([TP0, TP1], 1 << 20) == []
    [batch0] = [b for b in first if b.tp == TP0]
    acc.complete(batch0)
    assert acc.ready().partitions == [TP0]
    second = acc.drain([TP0], 1 << 20)
    assert second[0].records[0][1] == b"\x01" * 90  # in order


def test_a_retried_batch_goes_back_first_and_waits_for_its_backoff() -> None:
    clock = FakeClock()
    acc = make(clock, batch_size=100, linger_ms=0)
    acc.append(TP0, record(b"1" * 90))
    acc.append(TP0, record(b"2" * 90))
    [first] = acc.drain([TP0], 1 << 20)
    acc.reenqueue(first, backoff_s=0.1)
    assert acc.ready().partitions == []  # backing off: the later batch may not overtake it
    assert acc.drain([TP0], 1 << 20) == []
    clock.advance_ms(100)
    assert acc.ready().partitions == [TP0]
    [again] = acc.drain([TP0], 1 << 20)
    assert again is first and again.attempts == 2


def test_drain_respects_max_request_size_but_always_takes_one() -> None:
    clock = FakeClock()
    acc = make(clock, batch_size=10_000, linger_ms=0)
    for tp in (TP0, TP1):
        acc.append(tp, record(b"x" * 500))
    assert len(acc.drain([TP0, TP1], 600)) == 1
    assert len(acc.drain([TP0, TP1], 600)) == 1


def test_flush_makes_lingering_batches_ready() -> None:
    clock = FakeClock()
    acc = make(clock, linger_ms=60_000)
    acc.append(TP0, record(b"a"))
    assert acc.ready().partitions == []
    batches = acc.begin_flush()
    assert len(batches) == 1
    assert acc.ready().partitions == [TP0]
    acc.end_flush()
    assert acc.ready().partitions == []


def test_buffer_memory_blocks_then_times_out() -> None:
    clock = FakeClock()
    size = estimate_record_bytes(None, b"x" * 100, ())
    acc = make(clock, memory=size)
    acc.append(TP0, record(b"x" * 100))
    assert acc.used_bytes == size
    with pytest.raises(ProducerTimeoutError):
        acc.append(TP1, record(b"x" * 100), max_block_s=0.0)


def test_buffer_memory_is_released_when_a_batch_completes() -> None:
    clock = FakeClock()
    size = estimate_record_bytes(None, b"x" * 100, ())
    acc = make(clock, memory=size, linger_ms=0)
    acc.append(TP0, record(b"x" * 100))
    appended = threading.Event()

    def blocked_append() -> None:
        # the fake clock does not move, so this waits on the condition until memory frees up
        acc.append(TP1, record(b"x" * 100), max_block_s=30.0)
        appended.set()

    thread = threading.Thread(target=blocked_append)
    thread.start()
    assert not appended.wait(0.05)
    [batch] = acc.drain([TP0], 1 << 20)
    acc.complete(batch)
    assert appended.wait(10)
    thread.join(10)
    assert acc.used_bytes == size


def test_expire_removes_old_queued_batches_only() -> None:
    clock = FakeClock()
    acc = make(clock, batch_size=100, linger_ms=0)
    acc.append(TP0, record(b"1" * 90))
    clock.advance_ms(50)
    acc.append(TP0, record(b"2" * 90))
    clock.advance_ms(60)
    expired = acc.expire(delivery_timeout_s=0.1)
    assert [(b.records[0][1] or b"")[:1] for b in expired] == [b"1"]
    assert acc.ready().partitions == [TP0]


def test_abort_on_new_batch_appends_nothing() -> None:
    clock = FakeClock()
    acc = make(clock)
    result = acc.append(TP0, record(b"a"), abort_on_new_batch=True)
    assert result.aborted and not acc.has_incomplete()
    acc.append(TP0, record(b"a"))
    assert not acc.append(TP0, record(b"b"), abort_on_new_batch=True).aborted


def test_append_after_close_raises() -> None:
    acc = make(FakeClock())
    acc.close()
    with pytest.raises(ProducerClosedError):
        acc.append(TP0, record(b"a"))


def test_idempotent_partitions_pipeline_and_retries_go_alone_in_first_sent_order() -> None:
    clock = FakeClock()
    acc = RecordAccumulator(
        batch_size=10, linger_ms=0, buffer_memory=1 << 20, clock=clock,
        max_in_flight_per_partition=3,
    )  # fmt: skip
    for n in range(4):
        acc.append(TP0, record(b"value-%d" % n))  # each fills its own batch
    sent = [acc.drain([TP0], 1 << 20)[0] for _ in range(3)]
    assert acc.drain([TP0], 1 << 20) == [], "three in flight is the limit"
    assert [b.sent_behind for b in sent] == [False, True, True]
    # The first two come back for a retry, the later one first: back in first-sent order.
    acc.reenqueue(sent[1], backoff_s=0)
    acc.reenqueue(sent[0], backoff_s=0)
    assert acc.drain([TP0], 1 << 20) == [], "a retry waits until nothing is in flight"
    acc.complete(sent[2])
    retry = acc.drain([TP0], 1 << 20)
    assert retry == [sent[0]] and not retry[0].sent_behind
    assert acc.drain([TP0], 1 << 20) == [], "retries go one at a time"
    acc.complete(sent[0])
    assert acc.drain([TP0], 1 << 20) == [sent[1]]


@pytest.mark.parametrize(
    ("sizes", "cut"),
    [
        ([10, 10], 1),
        ([10, 10, 10], 2),  # the first record that reaches half goes left
        ([10, 10, 10, 10], 2),
        ([100, 10, 10], 1),  # one large record: alone on the left
        ([10, 10, 100], 2),  # ... or alone on the right
        ([1, 1, 1, 1, 1, 1, 1, 100], 7),
    ],
)
def test_a_split_cuts_a_batch_in_two_halves_by_bytes(sizes: list[int], cut: int) -> None:
    assert halving_index(sizes) == cut


def test_split_halves_take_the_batch_place_memory_and_send_order() -> None:
    """KIP-126: the halves of a refused batch go before a later batch's retry, one at a time,
    holding the refused batch's reservation until each completes."""
    clock = FakeClock()
    acc = RecordAccumulator(
        batch_size=100_000, linger_ms=0, buffer_memory=1 << 20, clock=clock,
        max_in_flight_per_partition=5,
    )  # fmt: skip
    values = [b"%d" % n * 20 for n in range(5)]
    futures = [acc.append(TP0, record(v)).future for v in values]
    [big] = acc.drain([TP0], 1 << 20)
    later_future = acc.append(TP0, record(b"later")).future
    [later] = acc.drain([TP0], 1 << 20)
    used = acc.used_bytes
    halves = acc.split(big)
    assert [len(h.records) for h in halves] == [3, 2]
    assert sum(h.reserved_bytes for h in halves) == big.reserved_bytes
    acc.reenqueue_split(big, halves)
    acc.reenqueue(later, backoff_s=0)  # e.g. OUT_OF_ORDER_SEQUENCE_NUMBER behind the big one
    assert acc.used_bytes == used
    sent = []
    for _ in range(3):
        [batch] = acc.drain([TP0], 1 << 20)
        assert acc.drain([TP0], 1 << 20) == [], "halves and retries go alone"
        sent.append(batch)
        acc.complete(batch)
        batch.result.succeed(base_offset=10 * len(sent), log_append_time_ms=-1)
    assert sent == [*halves, later]
    assert acc.used_bytes == 0 and not acc.has_incomplete()
    assert [f.result(0).offset for f in futures if f is not None] == [10, 11, 12, 20, 21]
    assert later_future is not None and later_future.result(0).offset == 30


def test_unsent_split_halves_forget_their_payload_when_the_producer_id_is_given_up() -> None:
    clock = FakeClock()
    acc = make(clock, batch_size=100_000, linger_ms=0)
    for value in (b"a" * 50, b"b" * 50):
        acc.append(TP0, record(value))
    [big] = acc.drain([TP0], 1 << 20)
    halves = acc.split(big)
    for half in halves:
        half.payload, half.producer_id = b"built with producer id 7", 7
    acc.reenqueue_split(big, halves)
    [first] = acc.drain([TP0], 1 << 20)
    acc.forget_unsent_payloads()
    assert first.payload is not None, "sent: the broker may have it, the bytes stay"
    assert halves[1].payload is None and halves[1].producer_id == -1
