"""What ``Producer.send`` returns: Kafka's ``FutureRecordMetadata`` over a batch's
``ProduceRequestResult``.

Every record of a batch is acknowledged or fails together, so the outcome lives once per batch
(:class:`BatchResult`: one event, one lock, the callbacks registered while it was pending) and a
record's future (:class:`RecordFuture`) is a small slotted object pointing at it with the
record's position and sizes. A ``concurrent.futures.Future`` per record cost ~3.6 µs of CPU
(its condition variable, ``set_running_or_notify_cancel``, ``set_result`` under the lock); this
costs ~0.5 µs, and completing a batch of 1,000 records is one event instead of 1,000.

The surface is the part of ``concurrent.futures.Future`` a producer's caller uses: ``result``,
``exception``, ``done``, ``add_done_callback`` (called with the future, on the producer's sender
thread, or at once when already done), ``cancel`` (always False: an accepted record cannot be
taken back, as with Kafka's producer). ``concurrent.futures.wait`` does not take it; wait with
``result(timeout)`` or ``Producer.flush``.

A batch the broker refuses as too large is split and its parts resent (KIP-126, see
``_sender``): its :class:`BatchResult` then completes when every part has, and each record's
future reads its offset and error from the part it went to (:meth:`BatchResult.locate`).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from dataplane.client._types import RecordMetadata, TopicPartition
from raftlog.records import Headers, ProducerRecord

__all__ = ["BatchResult", "RecordFuture"]

LOG = logging.getLogger(__name__)

DoneCallback = Callable[["RecordFuture"], object]
BatchCallback = Callable[["BatchResult"], object]


class BatchResult:
    """The outcome of one batch, set once: its base offset and log-append time, or an error.

    Callbacks wait in a deque, added without a lock (``add_callback`` runs once per record on
    the caller's thread, and a lock the sender thread also takes would cost a GIL hand-off
    whenever the two meet). Each runs exactly once: whoever pops it from the deque runs it,
    the completing thread after setting the outcome, or an adder who finds the outcome set
    after adding (``deque.popleft`` is atomic)."""

    __slots__ = (
        "_callbacks",
        "_done",
        "_set",
        "_unsettled_parts",
        "base_offset",
        "error",
        "log_append_time_ms",
        "parts",
        "tp",
    )

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.base_offset = -1  # -1: unknown (acks=0)
        self.log_append_time_ms = -1  # -1: the records' own (CreateTime) timestamps
        self.error: BaseException | None = None
        # Set when the batch was refused as too large and split (KIP-126): (the index of the
        # part's first record in this batch, the part's result), in record order. The records'
        # outcomes are then the parts' (nested when a part is split again); this result
        # completes once every part has, with the first part's error, if any, as its own.
        self.parts: tuple[tuple[int, BatchResult], ...] | None = None
        self._unsettled_parts = 0
        self._set = threading.Lock()  # taken once, by the first completion
        self._done = threading.Event()
        # (a record's future, a DoneCallback) or (this batch, a BatchCallback)
        self._callbacks: deque[tuple[Any, Callable[[Any], object]]] = deque()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float | None) -> bool:
        # is_set first: a done callback asks its future for the outcome, once per record, and
        # Event.wait takes the event's Condition even when the event is already set
        return self._done.is_set() or self._done.wait(timeout_s)

    def succeed(self, base_offset: int, log_append_time_ms: int) -> None:
        self._complete(base_offset, log_append_time_ms, None)

    def fail(self, error: BaseException) -> None:
        self._complete(-1, -1, error)

    def _complete(
        self, base_offset: int, log_append_time_ms: int, error: BaseException | None
    ) -> None:
        if not self._set.acquire(blocking=False):
            raise RuntimeError(f"the result of a batch of {self.tp} was set twice")
        self.base_offset, self.log_append_time_ms = base_offset, log_append_time_ms
        self.error = error
        self._done.set()
        self._run_callbacks()

    def split(self, parts: list[tuple[int, BatchResult]]) -> None:
        """The batch was split into ``parts`` (first record index, result), resent instead of
        it: its records' futures follow them. Called once, on the sender thread, before any
        part can complete."""
        if self.parts is not None or self._done.is_set():
            raise RuntimeError(f"a batch of {self.tp} that is settled or split was split")
        self._unsettled_parts = len(parts)
        self.parts = tuple(parts)
        for _, part in parts:
            part.add_batch_callback(self._part_settled)

    def _part_settled(self, part: BatchResult) -> None:
        self._unsettled_parts -= 1  # parts settle on the sender thread, one at a time
        if self._unsettled_parts > 0:
            return
        assert self.parts is not None, "only a split batch has parts"
        error = next((p.error for _, p in self.parts if p.error is not None), None)
        self._complete(-1, -1, error)

    def locate(self, index: int) -> tuple[BatchResult, int]:
        """The result holding this batch's record ``index`` and its index there: itself, or
        after a split the part (of a part...) the record went to."""
        result = self
        while result.parts is not None:
            start, part = next((s, p) for s, p in reversed(result.parts) if s <= index)
            result, index = part, index - start
        return result, index

    def add_callback(self, future: RecordFuture, callback: DoneCallback) -> None:
        self._add(future, callback)

    def add_batch_callback(self, callback: BatchCallback) -> None:
        """``callback(self)`` once the outcome is set (at once when it is): one callback for
        all the batch's records, for a caller that watches many records (see ``perf``)."""
        self._add(self, callback)

    def _add(self, argument: RecordFuture | BatchResult, callback: Callable[[Any], object]) -> None:
        self._callbacks.append((argument, callback))
        if self._done.is_set():
            self._run_callbacks()

    def _run_callbacks(self) -> None:
        callbacks = self._callbacks
        while True:
            try:
                future, callback = callbacks.popleft()
            except IndexError:
                return
            _invoke(callback, future)


def header_bytes(headers: Headers) -> int:
    """The bytes of a record's header keys (UTF-8) and values: its serialized header size."""
    if not headers:
        return 0  # the common case: no generator for nothing
    return sum(len(k.encode()) + (len(v) if v is not None else 0) for k, v in headers)


def _invoke(callback: Callable[[Any], object], future: RecordFuture | BatchResult) -> None:
    """A raising callback is logged with its traceback and the others still run, as
    ``concurrent.futures`` does: the sender thread must go on settling batches."""
    try:
        callback(future)
    except Exception:
        LOG.exception("a producer callback raised (%r)", callback)


class RecordFuture:
    """The future of one record of a batch."""

    __slots__ = ("_record", "_relative_offset", "_result")

    def __init__(self, result: BatchResult, relative_offset: int, record: ProducerRecord) -> None:
        self._result = result
        self._relative_offset = relative_offset
        self._record = record  # sizes and timestamp are read from it when asked for

    @classmethod
    def failed(cls, tp: TopicPartition, error: BaseException) -> RecordFuture:
        """A future for a record refused before it reached a batch (no metadata, too large)."""
        result = BatchResult(tp)
        result.fail(error)
        return cls(result, 0, (None, None, -1, ()))

    def done(self) -> bool:
        return self._result.done()

    def running(self) -> bool:
        return not self._result.done()

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        """Records cannot be taken back once accepted: always False."""
        return False

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._settled(timeout)[0].error

    def _settled(self, timeout: float | None) -> tuple[BatchResult, int]:
        """The result holding the record's outcome (its batch's, or after a split its part's)
        and the record's index there, once the batch completed."""
        result = self._result
        if not result.wait(timeout):
            raise TimeoutError(f"no answer for a record of {result.tp} within {timeout} s")
        if result.parts is None:
            return result, self._relative_offset
        return result.locate(self._relative_offset)  # its own part's outcome

    def offset(self, timeout: float | None = None) -> int:
        """The record's offset in its partition (-1 with acks=0): ``result().offset``
        without building the rest of the metadata, for a caller that settles many records."""
        result, relative_offset = self._settled(timeout)
        if result.error is not None:
            raise result.error
        return -1 if result.base_offset < 0 else result.base_offset + relative_offset

    def result(self, timeout: float | None = None) -> RecordMetadata:
        result, relative_offset = self._settled(timeout)
        if result.error is not None:
            raise result.error
        key, value, timestamp_ms, headers = self._record
        tp = result.tp
        return RecordMetadata(
            tp.topic,
            tp.partition,
            -1 if result.base_offset < 0 else result.base_offset + relative_offset,
            timestamp_ms if result.log_append_time_ms < 0 else result.log_append_time_ms,
            -1 if key is None else len(key),
            -1 if value is None else len(value),
            header_bytes(headers),
        )

    def add_done_callback(self, callback: DoneCallback) -> None:
        self._result.add_callback(self, callback)

    @property
    def batch(self) -> BatchResult:
        """The outcome this record shares with the rest of its batch."""
        return self._result

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "failed" if self._result.error else "done"
        return f"<RecordFuture {self._result.tp} +{self._relative_offset} {state}>"
