"""The perf tool's latency recorder (one callback per batch, each record's own latency) and its
rate cap."""

from __future__ import annotations

import itertools
import time

import pytest

from dataplane.client._record_future import BatchResult, RecordFuture
from dataplane.client._types import TopicPartition
from dataplane.tools.perf import THROTTLE_MIN_SLEEP_S, _Recorder, _throttle
from raftlog.errors import ErrorCode, KafkaError

TP = TopicPartition("t", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def send(recorder: _Recorder, batch: BatchResult, index: int, at: float) -> None:
    recorder.watch(RecordFuture(batch, index, (None, b"v", 0, ())), at)


def rounded(samples: list[float]) -> list[float]:
    return sorted(round(ms, 6) for ms in samples)


def test_every_record_gets_its_latency_from_its_own_send_time() -> None:
    clock = Clock()
    recorder = _Recorder(num_records=6, clock=clock)
    first, second, third = BatchResult(TP), BatchResult(TP), BatchResult(TP)
    for index, at in enumerate((0.000, 0.001, 0.002)):
        send(recorder, first, index, at)
    send(recorder, second, 0, 0.003)
    clock.now = 0.010
    first.succeed(0, -1)
    assert recorder.acked == 0  # counted by the sending thread, when it moves on
    send(recorder, second, 1, 0.004)
    clock.now = 0.020
    second.succeed(3, -1)
    send(recorder, third, 0, 0.021)  # moved on: both earlier batches are counted
    assert recorder.acked == 5
    clock.now = 0.030
    third.succeed(5, -1)
    recorder.finish()
    summary = recorder.summary()
    assert recorder.acked == 6 and recorder.errors == 0
    assert rounded(recorder.samples_ms) == [8, 9, 9, 10, 16, 17]
    assert round(summary.max, 6) == 17 and round(summary.avg, 6) == 11.5


def test_records_sent_after_their_batch_completed_count_with_the_batch() -> None:
    """The sender may complete a batch between ``send`` returning and ``watch``."""
    clock = Clock()
    recorder = _Recorder(num_records=3, clock=clock)
    batch = BatchResult(TP)
    send(recorder, batch, 0, 0.0)
    clock.now = 0.005
    batch.succeed(0, -1)
    send(recorder, batch, 1, 0.001)  # its latency ends when the batch completed
    done_first = BatchResult(TP)
    done_first.succeed(2, -1)  # done before its first record was even noted
    send(recorder, done_first, 0, 0.002)
    recorder.finish()
    assert recorder.acked == 3
    assert rounded(recorder.samples_ms) == [3, 4, 5]


def test_a_batch_is_counted_only_once_its_outcome_is_in() -> None:
    clock = Clock()
    recorder = _Recorder(num_records=2, clock=clock)
    slow, fast = BatchResult(TP), BatchResult(TP)  # two partitions' batches
    send(recorder, slow, 0, 0.0)
    send(recorder, fast, 0, 0.0)
    fast.succeed(0, -1)
    send(recorder, BatchResult(TP), 0, 0.0)
    assert recorder.acked == 0  # the one in front has no outcome yet: counted in order
    with pytest.raises(RuntimeError, match="without an outcome"):
        recorder.finish()


def test_failed_batches_count_each_record_as_an_error() -> None:
    recorder = _Recorder(num_records=3, clock=Clock())
    batch = BatchResult(TP)
    for index in range(3):
        send(recorder, batch, index, 0.0)
    batch.fail(KafkaError(ErrorCode.NOT_ENOUGH_REPLICAS, "1 of 3 in sync"))
    recorder.finish()
    assert (recorder.acked, recorder.errors) == (0, 3)
    assert len(recorder.error_samples) == 1 and "NOT_ENOUGH_REPLICAS" in recorder.error_samples[0]


def test_beyond_the_sample_cap_every_nth_acknowledged_record_is_sampled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("dataplane.tools.perf.MAX_LATENCY_SAMPLES", 4)
    clock = Clock()
    recorder = _Recorder(num_records=12, clock=clock)  # every 3rd record: the 3rd, 6th, ...
    counter = itertools.count()
    for size in (2, 5, 5):  # batches that split the multiples of 3 differently
        batch = BatchResult(TP)
        for index in range(size):
            send(recorder, batch, index, next(counter) / 1000)
        clock.now = 1.0
        batch.succeed(0, -1)
    recorder.finish()
    assert recorder.acked == 12
    assert [round(1000 - ms) for ms in recorder.samples_ms] == [2, 5, 8, 11]


def test_the_rate_cap_sleeps_only_once_it_is_a_minimum_sleep_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)  # dataplane.tools.perf calls time.sleep
    clock = Clock()
    rate = 10_000.0  # one record every 0.1 ms
    due_soon = int(THROTTLE_MIN_SLEEP_S * rate) - 1
    _throttle(0.0, due_soon, rate, clock)
    assert slept == [], "a record due in less than the minimum sleep goes at once"
    _throttle(0.0, due_soon + 11, rate, clock)
    assert slept == [pytest.approx((due_soon + 11) / rate)]
    clock.now = 1.0
    _throttle(0.0, 5_000, rate, clock)  # behind: catches up without sleeping
    assert len(slept) == 1
