"""Producer and consumer throughput tests, like Kafka's producer-perf-test and consumer-perf-test.

The cores, :func:`run_produce_perf` and :func:`run_consume_perf`, are plain functions returning
dataclasses, for the CLI (``raftlog perf produce|consume``) and for benchmarks alike. Latency is
measured per record from ``send`` to its future completing (``time.perf_counter`` by default).
Everything is bounded: the producer's ``buffer.memory`` bounds records in flight (``send``
blocks when it is full), latency samples are capped at :data:`MAX_LATENCY_SAMPLES` (every n-th
record once there are more), error messages kept at :data:`MAX_ERROR_SAMPLES`.
"""

from __future__ import annotations

import functools
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from dataplane.client import Consumer, Producer, TopicPartition
from dataplane.client._config import DEFAULT_BATCH_SIZE
from dataplane.client._record_future import BatchResult, RecordFuture
from metadata_quorum.security.channels import ClientSecurity

__all__ = [
    "ConsumePerfResult",
    "LatencySummary",
    "ProducePerfResult",
    "latency_summary",
    "run_consume_perf",
    "run_produce_perf",
]

MiB = 1024 * 1024
MAX_LATENCY_SAMPLES = 500_000
MAX_ERROR_SAMPLES = 5
PROGRESS_EVERY_RECORDS = 1000
POLL_TIMEOUT_MS = 200
THROTTLE_MIN_SLEEP_S = 0.002  # Kafka ThroughputThrottler MIN_SLEEP_NS
Acks = Literal[0, 1, -1, "all"]
CompressionType = Literal["none", "gzip", "snappy", "lz4", "zstd"]
Progress = Callable[[int], None]  # called with the records done so far


@dataclass(frozen=True)
class LatencySummary:
    avg: float
    p50: float
    p99: float
    p999: float
    max: float


@dataclass(frozen=True)
class ProducePerfResult:
    records: int  # records acknowledged
    seconds: float
    records_per_s: float
    mb_per_s: float  # MiB of values acknowledged per second
    latency_ms: LatencySummary
    errors: int
    error_samples: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ConsumePerfResult:
    records: int
    payload_bytes: int  # keys and values
    seconds: float
    records_per_s: float
    mb_per_s: float
    timed_out: bool  # stopped because nothing arrived for timeout_s

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _percentile(sorted_ms: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted samples (0.0 when there are none)."""
    if not sorted_ms:
        return 0.0
    rank = max(0, min(len(sorted_ms) - 1, int(fraction * len(sorted_ms) + 0.5) - 1))
    return sorted_ms[rank]


def latency_summary(
    samples_ms: Sequence[float], total_ms: float, count: int, max_ms: float
) -> LatencySummary:
    """avg over ``count`` records summing ``total_ms``; percentiles over the samples."""
    ordered = sorted(samples_ms)
    return LatencySummary(
        avg=total_ms / count if count else 0.0,
        p50=_percentile(ordered, 0.50),
        p99=_percentile(ordered, 0.99),
        p999=_percentile(ordered, 0.999),
        max=max_ms,
    )


class BatchTimes:
    """The send times of one batch's records, and its outcome once it arrived."""

    __slots__ = ("done_at", "error", "sent_at")

    def __init__(self) -> None:
        self.sent_at: list[float] = []
        self.error: BaseException | None = None
        self.done_at: float | None = None  # set last: then error is set too


class _Recorder:
    """Latencies and counts of the records sent, without a lock or a callback per record.

    Every record of a batch completes at the same instant, so the recorder keeps each batch's
    send times and registers one callback per batch, which only notes when the outcome came.
    The sending thread counts a batch once it has moved on to the next one (no record joins
    it any more) and its outcome is in, and :meth:`finish` counts the rest after the flush. A
    callback per record, counting under a lock, cost the producing process ~3 µs of its ~10 µs
    a record (closures, the lock, GIL hand-offs with the sender thread): inside the figures it
    was measuring. Not thread-safe: one thread sends and reads the figures."""

    def __init__(self, num_records: int, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._sample_every = max(1, -(-num_records // MAX_LATENCY_SAMPLES))
        self._batch: BatchResult | None = None  # the batch the last record went to
        self._times = BatchTimes()  # its records' send times
        self._pending: deque[BatchTimes] = deque()  # not yet counted, in send order
        self.acked = 0
        self.errors = 0
        self.total_ms = 0.0
        self.max_ms = 0.0
        self.samples_ms: list[float] = []
        self.error_samples: list[str] = []

    def watch(self, future: RecordFuture, sent_at: float) -> None:
        batch = future.batch
        if batch is not self._batch:  # the first record of a batch (or a refused record)
            self._batch, self._times = batch, BatchTimes()
            self._pending.append(self._times)
            self._count_done()
            batch.add_batch_callback(functools.partial(self._on_done, self._times))
        self._times.sent_at.append(sent_at)

    def _on_done(self, times: BatchTimes, batch: BatchResult) -> None:
        # the producer's sender thread: note the outcome, the sending thread counts
        times.error = batch.error
        times.done_at = self._clock()

    def _count_done(self) -> None:
        """Count the finished batches at the front (the current one still takes records)."""
        pending = self._pending
        while pending and pending[0] is not self._times and pending[0].done_at is not None:
            self._count(pending.popleft())

    def finish(self) -> None:
        """Count every batch; after the producer's flush, when every outcome is in."""
        self._batch = None
        self._times = BatchTimes()
        self._count_done()
        if self._pending:
            raise RuntimeError(f"{len(self._pending)} batches without an outcome after a flush")

    def _count(self, times: BatchTimes) -> None:
        sent_at, done_at, error = times.sent_at, times.done_at, times.error
        assert done_at is not None, "only finished batches are counted"
        if error is not None:
            self.errors += len(sent_at)
            if len(self.error_samples) < MAX_ERROR_SAMPLES:
                self.error_samples.append(str(error))
            return
        latencies = [(done_at - sent) * 1000 for sent in sent_at]
        first = self.acked
        self.acked += len(latencies)
        self.total_ms += sum(latencies)
        self.max_ms = max(self.max_ms, *latencies)
        every = self._sample_every  # keep the latency of every n-th acknowledged record
        self.samples_ms += latencies[(every - 1 - first % every) % every :: every]

    def summary(self) -> LatencySummary:
        return latency_summary(self.samples_ms, self.total_ms, self.acked, self.max_ms)


def _throttle(start: float, sent: int, throughput_per_s: float, clock: Callable[[], float]) -> None:
    """Sleep until record ``sent`` is due at ``throughput_per_s`` > 0 (a rate cap, not a
    sync), once it is at least ``THROTTLE_MIN_SLEEP_S`` ahead, as Kafka's ThroughputThrottler:
    a sleep per record (16 us apart at 62,000 a second) cost the sending process ~2 us a record
    and handed the GIL to the sender thread each time."""
    ahead_s = start + sent / throughput_per_s - clock()
    if ahead_s >= THROTTLE_MIN_SLEEP_S:
        time.sleep(ahead_s)


def run_produce_perf(
    bootstrap_servers: str | Sequence[str],
    topic: str,
    num_records: int,
    record_size: int = 1024,
    *,
    acks: Acks = "all",
    batch_size: int = DEFAULT_BATCH_SIZE,
    linger_ms: int = 5,
    compression_type: CompressionType = "none",
    throughput_per_s: float = -1,
    buffer_memory: int = 32 * MiB,
    security: ClientSecurity | None = None,
    on_progress: Progress | None = None,
    clock: Callable[[], float] = time.perf_counter,
    rng: random.Random | None = None,
) -> ProducePerfResult:
    """Send ``num_records`` values of ``record_size`` bytes (one random uppercase payload, as
    Kafka's tool) at most ``throughput_per_s`` per second (<= 0: unthrottled), wait for all."""
    if num_records < 1 or record_size < 0:
        raise ValueError(
            f"num_records >= 1 and record_size >= 0 needed: {num_records}, {record_size}"
        )
    payload = bytes((rng or random.Random()).choices(range(ord("A"), ord("Z") + 1), k=record_size))
    recorder = _Recorder(num_records, clock)
    producer = Producer(
        bootstrap_servers,
        acks=acks,
        batch_size=batch_size,
        linger_ms=linger_ms,
        compression_type=compression_type,
        buffer_memory=buffer_memory,
        security=security,
    )
    throttled = throughput_per_s > 0
    try:
        start = clock()
        for sent in range(num_records):
            if throttled:
                _throttle(start, sent, throughput_per_s, clock)
            sent_at = clock()  # before send, as Kafka's tool: a wait for buffer space counts
            recorder.watch(producer.send(topic, payload), sent_at)
            if on_progress is not None and (sent + 1) % PROGRESS_EVERY_RECORDS == 0:
                on_progress(sent + 1)
        producer.flush()
        seconds = clock() - start
    finally:
        producer.close()
    recorder.finish()
    if on_progress is not None:
        on_progress(num_records)
    return ProducePerfResult(
        records=recorder.acked,
        seconds=seconds,
        records_per_s=recorder.acked / seconds if seconds > 0 else 0.0,
        mb_per_s=recorder.acked * record_size / MiB / seconds if seconds > 0 else 0.0,
        latency_ms=recorder.summary(),
        errors=recorder.errors,
        error_samples=tuple(recorder.error_samples),
    )


def _remaining(consumer: Consumer, ends: dict[TopicPartition, int]) -> bool:
    return any(consumer.position(tp) < end for tp, end in ends.items())


def run_consume_perf(
    bootstrap_servers: str | Sequence[str],
    topic: str,
    num_records: int | None = None,
    timeout_s: float = 10.0,
    *,
    max_poll_records: int = 5000,
    fetch_max_wait_ms: int = 500,
    security: ClientSecurity | None = None,
    on_progress: Progress | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> ConsumePerfResult:
    """Read every partition of ``topic`` from the beginning: ``num_records`` records, or (None)
    up to the end offsets found at the start. Stops early when nothing arrives for
    ``timeout_s`` (``timed_out`` is then True)."""
    if num_records is not None and num_records < 1:
        raise ValueError(f"num_records must be >= 1 or None, got {num_records}")
    consumer = Consumer(
        bootstrap_servers,
        auto_offset_reset="earliest",
        max_poll_records=max_poll_records,
        fetch_max_wait_ms=fetch_max_wait_ms,
        security=security,
    )
    records = size_bytes = 0
    timed_out = False
    try:
        partitions = [
            TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))
        ]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(partitions) if num_records is None else {}
        start = last_arrival = clock()
        while (records < num_records) if num_records is not None else _remaining(consumer, ends):
            batches = consumer.poll(timeout_ms=POLL_TIMEOUT_MS)
            now = clock()
            if not batches and now - last_arrival >= timeout_s:
                timed_out = True  # the idle wait is not part of the figures
                break
            for batch in batches.values():
                records += len(batch)
                size_bytes += sum(len(r.key or b"") + len(r.value or b"") for r in batch)
            if batches:
                last_arrival = now
                if on_progress is not None:
                    on_progress(records)
        seconds = (last_arrival if timed_out else clock()) - start
    finally:
        consumer.close()
    return ConsumePerfResult(
        records=records,
        payload_bytes=size_bytes,
        seconds=seconds,
        records_per_s=records / seconds if seconds > 0 else 0.0,
        mb_per_s=size_bytes / MiB / seconds if seconds > 0 else 0.0,
        timed_out=timed_out,
    )
