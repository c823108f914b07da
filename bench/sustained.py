"""Sustained produce runs: what a writer gets from a system once the page cache stops hiding the
disk, for raftlog and for JetStream (``bench.peer_bench`` runs both beside the 100,000-record
burst).

A burst of 100,000 records of 1 KiB (300 MB on disk with three replicas) fits in the page cache:
the kernel takes it as dirty pages and writes it back later, so the burst measures memory
copies. A writer that goes on meets the kernel's dirty-page limit (``vm.dirty_bytes``, or
``vm.dirty_ratio`` percent of the memory the kernel may fill with dirty pages), beyond which
``write`` waits for the disk. So a sustained run lasts at least ``RUN_S_MIN`` *and* until the
replicas together have written ``DIRTY_LIMIT_TIMES`` times that limit; its figures are those
of the last ``WINDOW_S`` seconds (records acknowledged, per second, and the p99 of their
latencies from send to acknowledgement), long after the first dirty pages had to be written.

The kernel computes the limit from its dirtyable memory (free pages and the file cache); this
module reads ``MemAvailable`` from ``/proc/meminfo`` instead (:func:`dirty_limit`): it also
counts reclaimable kernel memory, so it is a little larger than the kernel's figure, and a run
planned from it is a little longer than needed, never shorter.

Disk use is bounded: the topic's ``retention.bytes`` (raftlog, deleted in ``segment.bytes``
steps on the brokers' retention check) and the stream's ``max_bytes`` (JetStream, old messages
discarded) keep ``RETAINED_DIRTY_TIMES`` times the dirty limit across the replicas. Data is
deleted only once that much more was written after it, so it had left the page cache for the
disk (dirty pages of a deleted file are dropped unwritten, which would let a run dodge the
disk). :func:`check_free_space` refuses a run the free space cannot hold.

The pure core (the limit, the plan, :class:`TailWindow`) takes plain numbers and an injected
clock; the two runners are thin loops around it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy
from nats.js.api import StorageType, StreamConfig
from nats.js.client import JetStreamContext
from numpy.typing import NDArray

from dataplane.client import Producer
from dataplane.client._config import DEFAULT_BATCH_SIZE
from dataplane.client._record_future import BatchResult, RecordFuture
from dataplane.tools.perf import BatchTimes

MiB, GiB = 1 << 20, 1 << 30
DIRTY_LIMIT_TIMES = 3  # the replicas write at least this many dirty limits in a run
RETAINED_DIRTY_TIMES = 2  # retention keeps this many dirty limits, all replicas together
RUN_S_MIN = {"full": 30.0, "quick": 5.0}
WINDOW_S = {"full": 20.0, "quick": 3.0}  # the figures are those of the run's last seconds
# a run that has not written its bytes by then stops and says so (JetStream's Python client
# wrote ~23 MB/s to the disk here: 14 GB in ~10 minutes)
RUN_S_MAX = {"full": 1800.0, "quick": 30.0}
SEGMENT_BYTES = {"full": 128 * MiB, "quick": 16 * MiB}
QUICK_DISK_BYTES = 64 * MiB  # a quick run: a smoke test, not the dirty limit
FREE_MARGIN_BYTES = {"full": 2 * GiB, "quick": 256 * MiB}  # beside the runs, for everyone else
RETENTION_CHECK_INTERVAL_MS = 5_000  # the brokers' log.retention.check.interval.ms for the run
CHECK_EVERY_RECORDS = 1_000  # raftlog's sending loop asks whether to stop this often
WAIT_S = 120.0
QUANTILES = (("p50", 0.50), ("p99", 0.99), ("p999", 0.999), ("max", 1.0))


# -- the dirty-page limit ----------------------------------------------------------------------
@dataclass(frozen=True)
class DirtyLimit:
    limit_bytes: int
    source: str  # which kernel setting gave it, and from what
    dirty_bytes: int  # vm.dirty_bytes (0: not set, the ratio applies)
    dirty_ratio: int  # vm.dirty_ratio, percent
    mem_available_bytes: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def dirty_limit(dirty_bytes: int, dirty_ratio: int, mem_available_bytes: int) -> DirtyLimit:
    """The kernel's dirty-page limit: ``vm.dirty_bytes`` when set (the kernel then ignores the
    ratio), else ``vm.dirty_ratio`` percent of the available memory."""
    if dirty_bytes < 0 or not 0 <= dirty_ratio <= 100 or mem_available_bytes < 0:
        raise ValueError(
            f"not kernel settings: {dirty_bytes}, {dirty_ratio}, {mem_available_bytes}"
        )
    if dirty_bytes > 0:
        limit, source = dirty_bytes, "vm.dirty_bytes"
    else:
        limit = mem_available_bytes * dirty_ratio // 100
        source = f"vm.dirty_ratio ({dirty_ratio}%) of MemAvailable"
    return DirtyLimit(limit, source, dirty_bytes, dirty_ratio, mem_available_bytes)


def mem_available_bytes(meminfo: str) -> int:
    """``MemAvailable`` of ``/proc/meminfo``'s text, in bytes (the file says kB: KiB)."""
    for line in meminfo.splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            number, unit = value.split()
            assert unit == "kB", f"/proc/meminfo in {unit}"
            return int(number) * 1024
    raise ValueError("no MemAvailable in /proc/meminfo (a kernel before 3.14?)")


def read_dirty_limit(proc: Path = Path("/proc")) -> DirtyLimit:
    vm = proc / "sys" / "vm"
    return dirty_limit(
        int((vm / "dirty_bytes").read_text()),
        int((vm / "dirty_ratio").read_text()),
        mem_available_bytes((proc / "meminfo").read_text()),
    )


# -- the plan --------------------------------------------------------------------------------
@dataclass(frozen=True)
class SustainedPlan:
    """How long a run lasts and how much it keeps. Bytes are the records' values as written by
    all ``copies`` replicas (batch headers aside)."""

    run_s_min: float
    run_s_max: float
    window_s: float
    disk_bytes_min: int  # the replicas together write at least this
    retention_bytes: int  # per replica: the topic's retention.bytes, the stream's max_bytes
    segment_bytes: int
    copies: int
    record_bytes: int

    def __post_init__(self) -> None:
        assert 0 < self.window_s <= self.run_s_min <= self.run_s_max, "window within a run"
        assert self.segment_bytes <= self.retention_bytes, "retention holds whole segments"

    def disk_bytes(self, records: int) -> int:
        return records * self.record_bytes * self.copies

    def done(self, elapsed_s: float, acknowledged: int) -> bool:
        """Whether a run ``elapsed_s`` in, with ``acknowledged`` records, stops sending."""
        if elapsed_s >= self.run_s_max:
            return True
        return elapsed_s >= self.run_s_min and self.disk_bytes(acknowledged) >= self.disk_bytes_min

    def reached(self, seconds: float, acknowledged: int) -> bool:
        """Whether a finished run met both bounds (not stopped by ``run_s_max`` short)."""
        return seconds >= self.run_s_min and self.disk_bytes(acknowledged) >= self.disk_bytes_min

    def space_needed_bytes(self) -> int:
        """The disk one run may fill: every replica's retained bytes, the active segment and
        one more awaiting the retention check (runs of the two systems follow each other; each
        system's files are removed before the next starts)."""
        return self.copies * (self.retention_bytes + 2 * self.segment_bytes)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def plan_for(size: str, dirty: DirtyLimit, copies: int, record_bytes: int) -> SustainedPlan:
    """The full run: ``DIRTY_LIMIT_TIMES`` dirty limits written, ``RETAINED_DIRTY_TIMES`` kept;
    a quick one: a few seconds and ``QUICK_DISK_BYTES``."""
    segment = SEGMENT_BYTES[size]
    if size == "quick":
        disk_min, retained = QUICK_DISK_BYTES, 4 * segment
    else:
        disk_min = DIRTY_LIMIT_TIMES * dirty.limit_bytes
        retained = max(RETAINED_DIRTY_TIMES * dirty.limit_bytes // copies, 4 * segment)
    return SustainedPlan(
        run_s_min=RUN_S_MIN[size],
        run_s_max=RUN_S_MAX[size],
        window_s=WINDOW_S[size],
        disk_bytes_min=disk_min,
        retention_bytes=-(-retained // segment) * segment,  # whole segments
        segment_bytes=segment,
        copies=copies,
        record_bytes=record_bytes,
    )


def check_free_space(free_bytes: int, needed_bytes: int, where: Path) -> None:
    """Refuse, saying why, a run that could fill the disk."""
    if free_bytes < needed_bytes:
        raise RuntimeError(
            f"the sustained runs need {needed_bytes / 1e9:.1f} GB free in {where} "
            f"(retention of both systems' runs, fio's file and a margin), "
            f"{free_bytes / 1e9:.1f} GB are: free space, or run with --quick"
        )


# -- the last seconds of a run ---------------------------------------------------------------
class TailWindow:
    """The acknowledgements of the last ``window_s`` seconds of a run: (time, latencies) per
    acknowledged batch, older ones dropped as newer ones come (bounded: a window's worth).

    Times are the clock's (seconds); latencies milliseconds. Batches may come a little out of
    order (two partitions, two callbacks): the front is dropped only once it is older than the
    window before the newest, and :meth:`summary` counts by time, not by position."""

    def __init__(self, window_s: float, started_at: float) -> None:
        assert window_s > 0, "a window has a length"
        self.window_s = window_s
        self.started_at = started_at
        self.newest = started_at
        self._batches: deque[tuple[float, array[float]]] = deque()

    def add(self, done_at: float, latencies_ms: Sequence[float]) -> None:
        if not latencies_ms:
            return
        self._batches.append((done_at, array("d", latencies_ms)))
        self.newest = max(self.newest, done_at)
        horizon = self.newest - self.window_s
        while self._batches and self._batches[0][0] <= horizon:
            self._batches.popleft()

    def summary(self, ended_at: float | None = None) -> dict[str, Any]:
        """Records/s and latency quantiles of the acknowledgements in the window that ends at
        ``ended_at`` (default: the newest), or since the start when the run was shorter."""
        end = self.newest if ended_at is None else ended_at
        start = max(self.started_at, end - self.window_s)
        inside = [batch for done_at, batch in self._batches if start < done_at <= end]
        latencies = numpy.sort(
            numpy.concatenate([numpy.frombuffer(b) for b in inside or [array("d")]])
        )
        span = end - start
        quantiles = {name: nearest_rank(latencies, q) for name, q in QUANTILES}
        return {
            "window_s": round(span, 3),
            "records": len(latencies),
            "records_per_s": round(len(latencies) / span) if span > 0 else 0,
            "latency_ms": {name: round(value, 2) for name, value in quantiles.items()},
        }


def nearest_rank(sorted_ms: Sequence[float] | NDArray[numpy.float64], fraction: float) -> float:
    """The nearest-rank percentile of sorted samples, as ``raftlog perf`` (and Kafka's tool)
    computes it; 0.0 when there are none."""
    if len(sorted_ms) == 0:
        return 0.0
    rank = max(0, min(len(sorted_ms) - 1, int(fraction * len(sorted_ms) + 0.5) - 1))
    return float(sorted_ms[rank])


def run_figures(
    plan: SustainedPlan, seconds: float, acknowledged: int, failed: int, tail: dict[str, Any]
) -> dict[str, Any]:
    """A sustained run's results: the whole run's counts and the last window's figures."""
    return {
        "seconds": round(seconds, 3),
        "records": acknowledged,
        "failed": failed,
        "disk_bytes": plan.disk_bytes(acknowledged),
        "reached_disk_bytes_min": plan.reached(seconds, acknowledged),
        "whole_run_records_per_s": round(acknowledged / seconds) if seconds > 0 else 0,
        "last": tail,
        "mb_per_s": round(tail["records_per_s"] * plan.record_bytes / 1e6, 1),
    }


# -- raftlog ---------------------------------------------------------------------------------
class _WindowRecorder:
    """``dataplane.tools.perf``'s recorder, feeding a :class:`TailWindow` instead of a sample of
    the whole run: one callback per batch notes when it completed (on the producer's sender
    thread); the sending thread counts a batch once it sends to another one (no record joins
    it any more) and its outcome is in."""

    def __init__(self, window: TailWindow, clock: Callable[[], float]) -> None:
        self.window = window
        self._clock = clock
        self._result: BatchResult | None = None
        self._batch = BatchTimes()
        self._pending: deque[BatchTimes] = deque()  # bounded by the producer's buffer.memory
        self.acknowledged = 0
        self.failed = 0

    def watch(self, future: RecordFuture, sent_at: float) -> None:
        result = future.batch
        if result is not self._result:
            self._result, self._batch = result, BatchTimes()
            self._pending.append(self._batch)
            result.add_batch_callback(functools.partial(self._on_done, self._batch))
        self._batch.sent_at.append(sent_at)

    def _on_done(self, batch: BatchTimes, result: BatchResult) -> None:
        batch.error = result.error
        batch.done_at = self._clock()

    def count_done(self) -> None:
        pending = self._pending
        while pending and pending[0] is not self._batch and pending[0].done_at is not None:
            batch = pending.popleft()
            assert batch.done_at is not None, "only finished batches are counted"
            if batch.error is not None:
                self.failed += len(batch.sent_at)
                continue
            self.acknowledged += len(batch.sent_at)
            self.window.add(batch.done_at, [(batch.done_at - s) * 1000 for s in batch.sent_at])

    def finish(self) -> None:
        """Count every batch; after the producer's flush, when every outcome is in."""
        self._result, self._batch = None, BatchTimes()
        self.count_done()
        if self._pending:
            raise RuntimeError(f"{len(self._pending)} batches without an outcome after a flush")


def raftlog_sustained(
    bootstrap_servers: Sequence[str],
    topic: str,
    plan: SustainedPlan,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Produce to ``topic`` as fast as the client goes (acks=all, the perf tool's producer
    settings) until ``plan`` says stop; wait for every outcome."""
    payload = os.urandom(plan.record_bytes)
    producer = Producer(bootstrap_servers, acks="all", batch_size=DEFAULT_BATCH_SIZE, linger_ms=5)
    try:
        start = clock()
        recorder = _WindowRecorder(TailWindow(plan.window_s, start), clock)
        sent = 0
        while sent % CHECK_EVERY_RECORDS or not plan.done(clock() - start, recorder.acknowledged):
            sent_at = clock()  # before send, as Kafka's tool: a wait for buffer space counts
            recorder.watch(producer.send(topic, payload), sent_at)
            sent += 1
            if sent % CHECK_EVERY_RECORDS == 0:
                recorder.count_done()
        producer.flush()
        seconds = clock() - start
    finally:
        producer.close()
    recorder.finish()
    tail = recorder.window.summary()
    return run_figures(plan, seconds, recorder.acknowledged, recorder.failed, tail)


def raftlog_topic_configs(plan: SustainedPlan) -> dict[str, str]:
    return {
        "min.insync.replicas": "2",
        "retention.bytes": str(plan.retention_bytes),
        "segment.bytes": str(plan.segment_bytes),
    }


# -- JetStream -------------------------------------------------------------------------------
def jetstream_config(name: str, subject: str, plan: SustainedPlan) -> StreamConfig:
    """A replicas=3 file stream holding at most the plan's retention (old messages go first)."""
    return StreamConfig(
        name=name,
        subjects=[subject],
        num_replicas=plan.copies,
        storage=StorageType.FILE,
        max_bytes=plan.retention_bytes,
    )


async def jetstream_sustained(
    js: JetStreamContext, subject: str, plan: SustainedPlan
) -> dict[str, Any]:
    """Publish to ``subject`` as fast as nats-py goes (pipelined ``publish_async``, at most its
    pending limit unacknowledged) until ``plan`` says stop; wait for every PubAck."""
    loop = asyncio.get_running_loop()
    payload = os.urandom(plan.record_bytes)
    start = loop.time()
    window = TailWindow(plan.window_s, start)
    outstanding: set[asyncio.Future[Any]] = set()  # bounded by nats-py's pending limit
    counts = {"acknowledged": 0, "failed": 0}

    def settle(sent: float, future: asyncio.Future[Any]) -> None:
        outstanding.discard(future)
        if future.cancelled() or future.exception() is not None:
            counts["failed"] += 1
            return
        now = loop.time()
        counts["acknowledged"] += 1
        window.add(now, ((now - sent) * 1000,))

    while not plan.done(loop.time() - start, counts["acknowledged"]):
        sent = loop.time()
        future = await js.publish_async(subject, payload, wait_stall=WAIT_S)
        outstanding.add(future)
        future.add_done_callback(functools.partial(settle, sent))
    if outstanding:
        await asyncio.wait_for(asyncio.gather(*outstanding, return_exceptions=True), WAIT_S)
    seconds = loop.time() - start
    tail = window.summary()
    return run_figures(plan, seconds, counts["acknowledged"], counts["failed"], tail)


# -- the disk under the runs -----------------------------------------------------------------
def device_written_bytes(path: Path) -> int | None:
    """Bytes written so far to the block device holding ``path`` (``/sys/dev/block``'s
    sectors written, 512 bytes each, whoever wrote them); None where there is no such file."""
    st_dev = os.stat(path).st_dev
    stat = Path(f"/sys/dev/block/{os.major(st_dev)}:{os.minor(st_dev)}/stat")
    try:
        fields = stat.read_text().split()
    except OSError:
        return None  # not a block device (tmpfs, overlay): the figure is left out
    return int(fields[6]) * 512
