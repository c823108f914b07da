"""The producer's futures: one outcome per batch, shared by its records' futures."""

from __future__ import annotations

import logging
import threading

import pytest

from dataplane.client._record_future import BatchResult, RecordFuture
from dataplane.client._types import TopicPartition
from raftlog.errors import ErrorCode, KafkaError

TP = TopicPartition("t", 3)


def futures_of(result: BatchResult, count: int) -> list[RecordFuture]:
    return [RecordFuture(result, n, (b"k", b"0123456789", 1_000 + n, ())) for n in range(count)]


def test_a_batch_result_completes_every_record_future_with_its_own_offset() -> None:
    result = BatchResult(TP)
    futures = futures_of(result, 3)
    seen: list[int] = []
    futures[1].add_done_callback(lambda f: seen.append(f.result().offset))
    assert not any(f.done() for f in futures) and futures[0].running()
    with pytest.raises(TimeoutError):
        futures[0].result(timeout=0.01)
    result.succeed(base_offset=40, log_append_time_ms=-1)
    assert [f.result(0).offset for f in futures] == [40, 41, 42]
    assert [f.offset(0) for f in futures] == [40, 41, 42], "offset() is result().offset"
    assert [f.result(0).timestamp for f in futures] == [1_000, 1_001, 1_002]  # CreateTime
    assert seen == [41]
    late: list[int] = []
    futures[2].add_done_callback(lambda f: late.append(f.result().offset))  # done: at once
    assert late == [42]
    assert not futures[0].cancel() and not futures[0].cancelled()


def test_log_append_time_replaces_the_records_timestamps_and_acks_0_has_no_offset() -> None:
    result = BatchResult(TP)
    (future,) = futures_of(result, 1)
    result.succeed(base_offset=-1, log_append_time_ms=77)
    metadata = future.result(0)
    assert (metadata.offset, metadata.timestamp) == (-1, 77)
    assert future.offset(0) == -1
    assert (metadata.serialized_key_size, metadata.serialized_value_size) == (1, 10)


def test_a_failed_batch_fails_every_record_and_is_set_once() -> None:
    result = BatchResult(TP)
    futures = futures_of(result, 2)
    error = KafkaError(ErrorCode.NOT_ENOUGH_REPLICAS, "2 of 3")
    result.fail(error)
    assert all(f.exception(0) is error for f in futures)
    with pytest.raises(KafkaError):
        futures[0].result(0)
    with pytest.raises(KafkaError):
        futures[0].offset(0)
    with pytest.raises(RuntimeError, match="set twice"):
        result.succeed(0, -1)


def test_a_raising_callback_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    result = BatchResult(TP)
    first, second = futures_of(result, 2)
    ran: list[RecordFuture] = []

    def boom(_: RecordFuture) -> None:
        raise ValueError("a caller's bug")

    first.add_done_callback(boom)
    second.add_done_callback(ran.append)
    with caplog.at_level(logging.ERROR):
        result.succeed(0, -1)
    assert ran == [second]
    assert "a producer callback raised" in caplog.text and "a caller's bug" in caplog.text


def test_a_record_refused_before_batching_has_a_failed_future() -> None:
    error = KafkaError(ErrorCode.MESSAGE_TOO_LARGE, "too big")
    future = RecordFuture.failed(TP, error)
    assert future.done() and future.exception(0) is error


def _add_recording_callbacks(futures: list[RecordFuture], ran: list[int]) -> None:
    for future in futures:
        future.add_done_callback(lambda done: ran.append(done.result().offset))


def test_callbacks_added_while_the_batch_completes_each_run_exactly_once() -> None:
    """add_callback takes no lock: racing a completion, no callback is lost or run twice."""
    for _ in range(50):
        result = BatchResult(TP)
        futures = futures_of(result, 2_000)
        ran: list[int] = []
        adder = threading.Thread(target=_add_recording_callbacks, args=(futures, ran))
        adder.start()
        result.succeed(0, -1)
        adder.join(10)
        assert sorted(ran) == list(range(2_000))


def test_a_batch_callback_runs_once_for_the_batch_also_when_added_late() -> None:
    result = BatchResult(TP)
    (future,) = futures_of(result, 1)
    assert future.batch is result
    seen: list[BatchResult] = []
    result.add_batch_callback(seen.append)
    result.succeed(base_offset=5, log_append_time_ms=-1)
    result.add_batch_callback(seen.append)  # already done: at once
    assert seen == [result, result]


def test_the_metadata_sizes_come_from_the_record() -> None:
    result = BatchResult(TP)
    headers = (("trace", b"abc"), ("é", None))
    future = RecordFuture(result, 0, (None, b"value", 7, headers))
    result.succeed(base_offset=3, log_append_time_ms=-1)
    metadata = future.result(0)
    assert (metadata.serialized_key_size, metadata.serialized_value_size) == (-1, 5)
    assert metadata.serialized_header_size == len("trace") + 3 + len("é".encode())
    assert (metadata.offset, metadata.timestamp) == (3, 7)


def test_a_split_batch_completes_when_its_parts_have_each_record_from_its_own() -> None:
    """KIP-126: the parts land at unrelated offsets and may fail alone; a part may be split
    again. Callbacks (per record and per batch) run once every part is settled."""
    result = BatchResult(TP)
    futures = futures_of(result, 5)
    left, right = BatchResult(TP), BatchResult(TP)
    result.split([(0, left), (3, right)])
    right_left, right_right = BatchResult(TP), BatchResult(TP)
    right.split([(0, right_left), (1, right_right)])
    seen: list[BatchResult] = []
    result.add_batch_callback(seen.append)
    left.succeed(base_offset=100, log_append_time_ms=-1)
    right_left.succeed(base_offset=200, log_append_time_ms=-1)
    assert not result.done() and not futures[0].done() and seen == []
    too_large = KafkaError(ErrorCode.MESSAGE_TOO_LARGE, "one record too large")
    right_right.fail(too_large)
    assert result.done() and seen == [result] and result.error is too_large
    assert [f.result(0).offset for f in futures[:4]] == [100, 101, 102, 200]
    assert [f.offset(0) for f in futures[:4]] == [100, 101, 102, 200]
    assert futures[4].exception(0) is too_large
    with pytest.raises(KafkaError):
        futures[4].offset(0)
    with pytest.raises(RuntimeError):
        result.split([(0, BatchResult(TP))])
