"""The producer's record accumulator (Kafka's ``RecordAccumulator``), free of network IO.

Records are appended to per-partition deques of batches. The last batch of a deque is open
until it reaches ``batch.size`` (estimated, uncompressed) or a later batch exists; a batch is
*ready* when it is full, ``linger.ms`` has passed since it was opened, a flush or close is in
progress, or it is a retry whose backoff has passed. The sender thread drains ready batches
(one per partition per request), and gives them back through :meth:`complete` (done, failed or
acks=0 sent), :meth:`reenqueue` (retry: back at the *front* of its deque) or, refused as too
large, :meth:`split` and :meth:`reenqueue_split` (its parts in its place, KIP-126).

Ordering rule: at most ``max_in_flight_per_partition`` batches of a partition are in flight:
1 without idempotence (a retry can never be overtaken by a later batch of its partition), up to
5 with it, since the broker's sequence check keeps their order (Kafka's rule). A batch that comes
back for a retry is put back in first-sent order among the retries at the front of its deque,
and a retry is only sent when nothing else of its partition is in flight, so retries go out one
at a time, in their original order.

Memory: every appended record reserves its estimated size out of ``buffer.memory``; an append
that does not fit waits, at most ``max.block.ms``, for completed batches to release theirs.

Time comes from the injected ``clock`` (seconds, monotonic), so the logic is unit-testable.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from dataplane.client._record_future import BatchResult, RecordFuture, header_bytes
from dataplane.client._types import TopicPartition
from raftlog.batch import HEADER_SIZE
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import Headers, ProducerRecord

RECORD_OVERHEAD_BYTES = 21  # length, attributes, timestamp and offset deltas, key/value lengths
HEADER_OVERHEAD_BYTES = 10  # a header's key and value length varints


def estimate_record_bytes(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    """An upper bound of the record's encoded size (Kafka's ``DefaultRecord.sizeInBytes``)."""
    size = RECORD_OVERHEAD_BYTES + (len(key) if key else 0) + (len(value) if value else 0)
    if not headers:
        return size  # the common case, on every send
    return size + header_bytes(headers) + HEADER_OVERHEAD_BYTES * len(headers)


def halving_index(sizes: Sequence[int]) -> int:
    """Where to cut records of these sizes (at least two) in two: the first record whose
    bytes, with those before it, reach half of all; at least one record on each side."""
    total = sum(sizes)
    running = 0
    for index, size in enumerate(sizes[:-1], start=1):
        running += size
        if 2 * running >= total:
            return index
    return len(sizes) - 1


class ProducerTimeoutError(KafkaError):
    """A bounded wait ran out: ``buffer.memory`` stayed full for ``max.block.ms``, metadata
    did not arrive, or a record was not delivered within ``delivery.timeout.ms``."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.REQUEST_TIMED_OUT, message)


class ProducerClosedError(RuntimeError):
    """send() after close()."""


@dataclass(slots=True, eq=False)
class ProducerBatch:
    """Records of one partition sent together. ``payload`` is the RecordBatch v2 bytes, set
    once by the sender when the batch is first drained, and reused by every retry."""

    tp: TopicPartition
    created_s: float
    result: BatchResult  # shared by the futures of its records
    records: list[ProducerRecord] = field(default_factory=list)
    estimated_bytes: int = HEADER_SIZE
    reserved_bytes: int = 0
    full: bool = False
    attempts: int = 0  # how many times it was drained (sent)
    retry_at_s: float = 0.0
    payload: bytes | None = None
    producer_id: int = -1  # the idempotent producer id the payload carries, -1 = none
    # when it was first sent, among all batches (() = not yet); the parts of a split batch
    # take its place: its order plus their index, so they sort before every later batch
    drain_order: tuple[int, ...] = ()
    in_flight: bool = False
    payload_sent: bool = False  # False: the broker cannot have stored it (a split's half)
    # sent (this time) while an earlier batch of its partition was still outstanding: the
    # broker may see it first, since concurrent requests are not ordered
    sent_behind: bool = False


class AppendResult(NamedTuple):
    future: RecordFuture | None  # None when aborted
    batch_full: bool  # the partition has a batch the sender should take now
    new_batch: bool  # this append opened a batch
    aborted: bool  # abort_on_new_batch and a batch would have been opened: nothing appended


_new_tuple = tuple.__new__


class ReadyResult(NamedTuple):
    partitions: list[TopicPartition]
    next_ready_s: float | None  # when the next not-yet-ready batch becomes ready


class RecordAccumulator:
    def __init__(
        self,
        *,
        batch_size: int,
        linger_ms: int,
        buffer_memory: int,
        clock: Callable[[], float],
        max_in_flight_per_partition: int = 1,
    ) -> None:
        self.batch_size = batch_size
        self.max_in_flight_per_partition = max_in_flight_per_partition
        self.linger_s = linger_ms / 1000
        self.buffer_memory = buffer_memory
        self._clock = clock
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)  # memory released or closed
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._in_flight: dict[TopicPartition, int] = {}
        # sent at least once and not complete, by partition: in flight or waiting to retry
        self._outstanding: dict[TopicPartition, set[ProducerBatch]] = {}
        self._next_drain_order = 0
        self._incomplete: set[ProducerBatch] = set()
        self._used_bytes = 0
        self._flushes = 0
        self._closed = False
        self._drain_start = 0

    # -- appending (application threads) -------------------------------------------------
    def append(
        self,
        tp: TopicPartition,
        record: ProducerRecord,
        *,
        abort_on_new_batch: bool = False,
        max_block_s: float = 0.0,
        size: int | None = None,
    ) -> AppendResult:
        """Add the record to the partition's open batch (or a new one) and return its future.
        ``size`` is the record's :func:`estimate_record_bytes` when the caller has it."""
        if size is None:
            size = estimate_record_bytes(record[0], record[1], record[3])
        if size > self.buffer_memory:
            raise KafkaError(
                ErrorCode.RECORD_LIST_TOO_LARGE,
                f"a record of ~{size} bytes exceeds buffer.memory={self.buffer_memory}",
            )
        deadline: float | None = None  # read the clock only when memory is short
        lock = self._lock
        lock.acquire()  # not a with statement: here (every send) it cost ~100 ns more
        try:
            while True:
                if self._closed:
                    raise ProducerClosedError("the producer is closed")
                queue = self._queues.get(tp)
                if queue is None:
                    queue = self._queues[tp] = deque()
                # the deque's last batch if it takes size more bytes (inline: once per record)
                batch = queue[-1] if queue else None
                if batch is not None and (
                    batch.full
                    or batch.payload is not None
                    or batch.estimated_bytes + size > self.batch_size
                ):
                    batch = None
                if batch is None and abort_on_new_batch:
                    return AppendResult(None, batch_full=False, new_batch=False, aborted=True)
                if self._used_bytes + size <= self.buffer_memory:
                    break
                if deadline is None:
                    deadline = self._clock() + max_block_s
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise ProducerTimeoutError(
                        f"buffer.memory={self.buffer_memory} stayed full for max.block.ms"
                    )
                self._space.wait(remaining)
            new_batch = batch is None
            if batch is None:
                batch = ProducerBatch(tp=tp, created_s=self._clock(), result=BatchResult(tp))
                queue.append(batch)
                self._incomplete.add(batch)
            self._used_bytes += size
            batch.reserved_bytes += size
            batch.estimated_bytes += size
            future = RecordFuture(batch.result, len(batch.records), record)
            batch.records.append(record)
            batch.full = batch.estimated_bytes >= self.batch_size
            # AppendResult(...) without NamedTuple.__new__'s Python frame: once per record
            return _new_tuple(
                AppendResult, (future, len(queue) > 1 or batch.full, new_batch, False)
            )
        finally:
            lock.release()

    # -- the sender thread -----------------------------------------------------------------
    def ready(self) -> ReadyResult:
        """Partitions whose first batch can be sent now (and are not muted), and when the
        earliest other batch will be ready."""
        now = self._clock()
        ready: list[TopicPartition] = []
        next_ready: float | None = None
        with self._lock:
            urgent = self._flushes > 0 or self._closed
            for tp, queue in self._queues.items():
                if not queue or not self._may_send_locked(tp, queue[0]):
                    continue
                first = queue[0]
                if first.attempts > 0:
                    ready_at = first.retry_at_s
                elif len(queue) > 1 or first.full or urgent:
                    ready_at = now
                else:
                    ready_at = first.created_s + self.linger_s
                if ready_at <= now:
                    ready.append(tp)
                elif next_ready is None or ready_at < next_ready:
                    next_ready = ready_at
        return ReadyResult(ready, next_ready)

    def drain(
        self, partitions: Sequence[TopicPartition], max_request_bytes: int
    ) -> list[ProducerBatch]:
        """Take the first batch of each of ``partitions`` (those of one broker) while the
        estimated request size stays within ``max_request_bytes`` (at least one batch), and
        mute their partitions. The start rotates so no partition starves."""
        drained: list[ProducerBatch] = []
        total = 0
        with self._lock:
            count = len(partitions)
            self._drain_start = (self._drain_start + 1) % max(count, 1)
            for index in range(count):
                tp = partitions[(self._drain_start + index) % count]
                queue = self._queues.get(tp)
                if not queue or not self._may_send_locked(tp, queue[0]):
                    continue
                if queue[0].retry_at_s > self._clock():
                    continue
                batch = queue[0]
                size = len(batch.payload) if batch.payload is not None else batch.estimated_bytes
                if drained and total + size > max_request_bytes:
                    break
                queue.popleft()
                batch.full = True
                batch.attempts += 1
                batch.in_flight = True
                batch.payload_sent = True
                self._in_flight[tp] = self._in_flight.get(tp, 0) + 1
                if not batch.drain_order:
                    batch.drain_order = (self._next_drain_order,)
                    self._next_drain_order += 1
                    self._outstanding.setdefault(tp, set()).add(batch)
                batch.sent_behind = any(
                    other.drain_order < batch.drain_order for other in self._outstanding[tp]
                )
                drained.append(batch)
                total += size
        return drained

    def _may_send_locked(self, tp: TopicPartition, first: ProducerBatch) -> bool:
        in_flight = self._in_flight.get(tp, 0)
        if first.attempts > 0:
            return in_flight == 0  # a retry goes alone, after everything sent before it
        return in_flight < self.max_in_flight_per_partition

    def _landed_locked(self, batch: ProducerBatch) -> None:
        if batch.in_flight:
            batch.in_flight = False
            self._in_flight[batch.tp] -= 1

    def reenqueue(self, batch: ProducerBatch, backoff_s: float) -> None:
        """Put a batch that failed with a retriable error back at the front of its deque, in
        first-sent order among the retries there, to be sent again after ``backoff_s``."""
        with self._lock:
            self._landed_locked(batch)
            batch.retry_at_s = self._clock() + backoff_s
            queue = self._queues.setdefault(batch.tp, deque())
            position = 0
            while (
                position < len(queue)
                and queue[position].attempts > 0
                and queue[position].drain_order < batch.drain_order
            ):
                position += 1
            queue.insert(position, batch)

    def split(self, batch: ProducerBatch) -> list[ProducerBatch]:
        """KIP-126: the two halves (by bytes, :func:`halving_index`) a batch refused as too
        large is resent as; not yet queued: the caller builds their payloads, then
        :meth:`reenqueue_split`. A half refused again is halved again, until the limit fits or
        a part is one record. (Kafka's ``ProducerBatch.split`` re-batches to ``batch.size``,
        which splits nothing when ``batch.size`` itself is above the topic's
        ``max.message.bytes``: the case this handles.) There is no compression-ratio estimate
        to lower as Kafka's does: batches are filled by their uncompressed size.

        Each half is a retry of its records: it keeps the batch's creation time (for
        ``delivery.timeout.ms``), attempts (a split does not count against ``retries``) and
        place in the send order."""
        assert len(batch.records) > 1, "a batch of one record cannot be split"
        sizes = [estimate_record_bytes(r[0], r[1], r[3]) for r in batch.records]
        cut = halving_index(sizes)
        parts = [
            ProducerBatch(
                tp=batch.tp,
                created_s=batch.created_s,
                result=BatchResult(batch.tp),
                records=batch.records[start:end],
                estimated_bytes=HEADER_SIZE + sum(sizes[start:end]),
                reserved_bytes=sum(sizes[start:end]),
                full=True,
                attempts=batch.attempts,
                retry_at_s=self._clock(),
                drain_order=(*batch.drain_order, index),
            )
            for index, (start, end) in enumerate(((0, cut), (cut, len(sizes))))
        ]
        # the reservation moves to the parts whole, also if the sizes were estimated otherwise
        parts[-1].reserved_bytes += batch.reserved_bytes - sum(p.reserved_bytes for p in parts)
        batch.result.split([(0, parts[0].result), (cut, parts[1].result)])
        return parts

    def reenqueue_split(self, batch: ProducerBatch, parts: list[ProducerBatch]) -> None:
        """Put the parts of a split ``batch`` at the front of its deque in its place (in
        first-sent order among the retries there); they take over its memory reservation."""
        with self._lock:
            self._landed_locked(batch)
            outstanding = self._outstanding.setdefault(batch.tp, set())
            outstanding.discard(batch)
            self._incomplete.discard(batch)  # without releasing: the parts hold its bytes
            batch.reserved_bytes = 0
            queue = self._queues.setdefault(batch.tp, deque())
            position = 0
            while (
                position < len(queue)
                and queue[position].attempts > 0
                and queue[position].drain_order < batch.drain_order
            ):
                position += 1
            for part in reversed(parts):
                queue.insert(position, part)
                outstanding.add(part)
                self._incomplete.add(part)

    def forget_unsent_payloads(self) -> None:
        """The producer id is given up: queued batches whose payload was built but never
        sent (halves of a split batch) drop it, with its old id and sequences, to be built
        again with the next id (Kafka's ``adjustSequencesDueToFailedBatch``: a failed half
        would otherwise leave a sequence gap before the halves after it)."""
        with self._lock:
            for queue in self._queues.values():
                for batch in queue:
                    if batch.payload is not None and not batch.payload_sent:
                        batch.payload = None
                        batch.producer_id = -1

    def complete(self, batch: ProducerBatch) -> None:
        """The batch is finished (its futures are or will be resolved): release its memory
        and its in-flight slot."""
        with self._lock:
            self._landed_locked(batch)
            self._finish_locked(batch)

    def _finish_locked(self, batch: ProducerBatch) -> None:
        self._outstanding.get(batch.tp, set()).discard(batch)
        if batch in self._incomplete:
            self._incomplete.discard(batch)
            self._used_bytes -= batch.reserved_bytes
            self._space.notify_all()

    def expire(self, delivery_timeout_s: float) -> list[ProducerBatch]:
        """Remove and return queued (not in-flight) batches older than ``delivery.timeout.ms``.
        The caller fails their futures."""
        now = self._clock()
        expired: list[ProducerBatch] = []
        with self._lock:
            for queue in self._queues.values():
                if queue and queue[0].created_s + delivery_timeout_s <= now:
                    keep = [b for b in queue if b.created_s + delivery_timeout_s > now]
                    expired.extend(b for b in queue if b.created_s + delivery_timeout_s <= now)
                    queue.clear()
                    queue.extend(keep)
            for batch in expired:
                self._finish_locked(batch)
        return expired

    def remove_queued(self, predicate: Callable[[TopicPartition], bool]) -> list[ProducerBatch]:
        """Remove and return every queued batch of the partitions ``predicate`` picks (a
        deleted topic, a forced close). The caller fails their futures."""
        removed: list[ProducerBatch] = []
        with self._lock:
            for tp, queue in self._queues.items():
                if queue and predicate(tp):
                    removed.extend(queue)
                    queue.clear()
            for batch in removed:
                self._finish_locked(batch)
        return removed

    # -- flush and close ---------------------------------------------------------------------
    def begin_flush(self) -> list[ProducerBatch]:
        """Make every batch ready now; return the incomplete ones to wait for."""
        with self._lock:
            self._flushes += 1
            return list(self._incomplete)

    def end_flush(self) -> None:
        with self._lock:
            self._flushes -= 1

    def close(self) -> None:
        """No more appends; every queued batch is ready now."""
        with self._lock:
            self._closed = True
            self._space.notify_all()

    def has_incomplete(self) -> bool:
        with self._lock:
            return bool(self._incomplete)

    def queued_topics(self) -> set[str]:
        with self._lock:
            return {tp.topic for tp, queue in self._queues.items() if queue}

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used_bytes
