"""Storage engine benchmark: append, read and crash-recovery throughput of one partition's Log.

``python -m bench.storage_bench --out bench/results/latest.json [--quick] [--only append ...]``

1. Append 1 KiB records in 16 KiB, 256 KiB and 1 MiB batches, without fsync and with
   ``flush.on.ack=true``; next to each, the raw limit: a plain loop of ``os.write`` of the same
   bytes into a file with the same fsync policy. Append MB/s is reported as a percentage of raw.
2. Read the whole log back, 1 MiB per ``Log.read``, from a warm and from a cold page cache.
3. SIGKILL a child process appending to a log once it has written 1 GiB, then time the unclean
   recovery (``Log(directory)``) with the page cache as the kill left it, and with it evicted.

Each run uses a fresh directory that is deleted afterwards; ``os.sync()`` before every timed run
starts it without another run's writeback or discards in flight. Medians over the repeats are
reported; every run is in the JSON.
"""

from __future__ import annotations

import argparse
import functools
import os
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import RECORD_BYTES, REPO_ROOT, build_batch, write_section
from dataplane.tools.owned_process import popen_owned
from raftlog.batch import read_header
from raftlog.config import LogConfig
from raftlog.log import Log

MiB = 1024 * 1024
GiB = 1024 * MiB
MB = 1_000_000
BATCH_RECORDS = (16, 256, 1024)  # 1 KiB records: 16 KiB, 256 KiB and 1 MiB batches
READ_RECORDS_PER_BATCH = 16
READ_MAX_BYTES = MiB
RECOVERY_RECORDS_PER_BATCH = 16
APPEND_TARGET_PERCENT = 50.0
RECOVERY_TARGET_S = 10.0
KILL_WAIT_S = 30.0
READY_LINE_MAX_BYTES = 4096
PREFAULT_CHUNK_BYTES = MiB
PREFAULT_MARGIN_BYTES = 64 * MiB
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
# A 1 MiB batch of 1 KiB records is 1,059,773 bytes: above Kafka's default max.message.bytes.
APPEND_CONFIG = {"segment.bytes": str(GiB), "max.message.bytes": str(2 * MiB)}


class BenchmarkError(RuntimeError):
    """A benchmark saw something wrong (a lost batch, a clean recovery after SIGKILL...)."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise BenchmarkError(message)


@dataclass(frozen=True)
class Sizes:
    """What ``--quick`` shrinks. Every loop of the benchmark is bounded by one of these."""

    append_bytes: int  # data of one no-fsync run; also the batch bound of an fsync run
    fsync_seconds: float  # time bound of one fsync run
    repeats: int  # alternating raw/log runs per append case (median reported)
    read_bytes: int
    read_repeats: int
    recovery_bytes: int  # the writer is killed once it has written this much
    recovery_segment_bytes: int
    ready_deadline_s: float  # how long the writer may take to write recovery_bytes
    drop_caches: bool  # also write /proc/sys/vm/drop_caches when evicting (not in tests)


FULL = Sizes(
    append_bytes=GiB,
    fsync_seconds=3.0,
    repeats=5,
    read_bytes=GiB,
    read_repeats=3,
    recovery_bytes=GiB,
    recovery_segment_bytes=256 * MiB,
    ready_deadline_s=300.0,
    drop_caches=True,
)
QUICK = Sizes(
    append_bytes=8 * MiB,
    fsync_seconds=0.1,
    repeats=1,
    read_bytes=8 * MiB,
    read_repeats=1,
    recovery_bytes=8 * MiB,
    recovery_segment_bytes=2 * MiB,
    ready_deadline_s=60.0,
    drop_caches=False,
)
NOTES = (
    "MB is 10**6 bytes; batch_bytes is the encoded batch (1 KiB values plus record and batch "
    "headers); figures are medians over the runs listed.",
    "Every timed append run starts after os.sync() and, without fsync, right after as many "
    "bytes as it will write were written to a scratch file and deleted: this VM reports free "
    "pages to its host (virtio-balloon), and writes into such pages were up to 3x slower at "
    "random. Recycled pages are the steady state of a broker with a full page cache.",
    "max.message.bytes is raised to 2 MiB: a batch of 1024 records of 1 KiB is 1,059,773 bytes.",
    "Cold reads: the first read after evicting the log's pages is 'cold'; 'cold_again' evicts "
    "and reads once more. Here it ran about 4x faster: this VM's host caches the disk image, "
    "so only the first read after writing comes from the device.",
    "Recovery opens the log of a SIGKILLed writer: 'warm' with the page cache as the kill left it, "
    "'cold' after the segment files were fsynced and evicted (as after a machine restart).",
)


@dataclass(frozen=True)
class Run:
    batches: int
    records: int
    size_bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.size_bytes / self.seconds / MB

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def us_per_batch(self) -> float:
        return self.seconds / self.batches * 1e6

    def to_json(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "records": self.records,
            "bytes": self.size_bytes,
            "seconds": round(self.seconds, 4),
            "mb_per_s": round(self.mb_per_s, 1),
            "records_per_s": round(self.records_per_s),
            "us_per_batch": round(self.us_per_batch, 2),
        }


@contextmanager
def scratch_dir(parent: Path) -> Iterator[Path]:
    """A fresh directory, deleted afterwards so its pages leave the page cache with it."""
    path = Path(tempfile.mkdtemp(prefix="run-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path)


def drive(step: Callable[[], object], max_batches: int, seconds: float | None) -> tuple[int, float]:
    """Call ``step`` ``max_batches`` times, or until ``seconds`` have passed if given."""
    started = time.perf_counter()
    if seconds is None:
        for _ in range(max_batches):
            step()
        return max_batches, time.perf_counter() - started
    stop_at = started + seconds
    done = 0
    while done < max_batches and time.perf_counter() < stop_at:
        step()
        done += 1
    return done, time.perf_counter() - started


# -- append --------------------------------------------------------------------------------------
def _write_and_fsync(fd: int, data: bytes) -> None:
    os.write(fd, data)
    os.fsync(fd)


@dataclass(frozen=True)
class Workload:
    """One append run: ``max_batches`` appends of ``batch``, or with fsync as many as fit in
    ``fsync_s`` seconds; ``prefault_bytes`` of page cache recycled just before (see settle)."""

    batch: bytes
    records: int  # per batch
    max_batches: int
    fsync_s: float | None  # None: no fsync
    prefault_bytes: int

    def run(self, batches: int, seconds: float) -> Run:
        return Run(batches, batches * self.records, batches * len(self.batch), seconds)


def settle(scratch: Path, prefault_bytes: int) -> None:
    """Start every timed run from the same state: no writeback in flight (``os.sync``), then
    ``prefault_bytes`` of page cache written and freed just before. This VM reports free pages
    to its host (virtio-balloon free page reporting), and the first touch of a reported page is a
    host fault: appends into reported pages ran at a third of the speed of appends into
    recycled ones, at random. A broker's full page cache recycles pages: that is what we time."""
    os.sync()
    if prefault_bytes <= 0:
        return
    path = scratch / "prefault"
    chunk = bytes(PREFAULT_CHUNK_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for _ in range(-(-prefault_bytes // len(chunk))):
            os.write(fd, chunk)
    finally:
        os.close(fd)
    path.unlink()


def raw_run(scratch: Path, work: Workload) -> Run:
    """The limit: ``os.write`` of the batch bytes in a loop, ``os.fsync`` after each if fsync."""
    path = scratch / "raw.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write = _write_and_fsync if work.fsync_s is not None else os.write
        settle(scratch, work.prefault_bytes)
        batches, seconds = drive(
            functools.partial(write, fd, work.batch), work.max_batches, work.fsync_s
        )
        require(os.fstat(fd).st_size == batches * len(work.batch), f"{path} is missing writes")
    finally:
        os.close(fd)
    return work.run(batches, seconds)


def log_run(scratch: Path, work: Workload) -> Run:
    """``Log.append`` of the batch in a loop, with ``flush.on.ack=true`` if fsync."""
    flush_on_ack = "true" if work.fsync_s is not None else "false"
    config = LogConfig.parse({**APPEND_CONFIG, "flush.on.ack": flush_on_ack})
    log = Log(scratch / "bench-0", config)
    try:
        settle(scratch, work.prefault_bytes)
        step = functools.partial(log.append, work.batch, leader_epoch=0)
        batches, seconds = drive(step, work.max_batches, work.fsync_s)
        require(log.size_bytes == batches * len(work.batch), f"{scratch} is missing appends")
        require(log.log_end_offset == batches * work.records, f"{scratch} has a wrong log end")
    finally:
        log.abandon()  # no flush: closing would write a no-fsync run's gigabyte to disk
    return work.run(batches, seconds)


def append_case(workdir: Path, records: int, fsync: bool, sizes: Sizes) -> dict[str, Any]:
    """Alternate raw and log runs of one batch size and fsync policy; report the medians."""
    batch = build_batch(records)
    max_batches = max(1, sizes.append_bytes // len(batch))
    work = Workload(
        batch,
        records,
        max_batches,
        fsync_s=sizes.fsync_seconds if fsync else None,
        prefault_bytes=0 if fsync else max_batches * len(batch) + PREFAULT_MARGIN_BYTES,
    )
    raw_runs: list[Run] = []
    log_runs: list[Run] = []
    for _ in range(sizes.repeats):
        with scratch_dir(workdir) as scratch:
            raw_runs.append(raw_run(scratch, work))
        with scratch_dir(workdir) as scratch:
            log_runs.append(log_run(scratch, work))
    log_mb_per_s = statistics.median(run.mb_per_s for run in log_runs)
    raw_mb_per_s = statistics.median(run.mb_per_s for run in raw_runs)
    percent = 100 * log_mb_per_s / raw_mb_per_s
    return {
        "records_per_batch": records,
        "record_bytes": RECORD_BYTES,
        "batch_bytes": len(batch),
        "fsync": fsync,
        "records_per_s": round(statistics.median(run.records_per_s for run in log_runs)),
        "mb_per_s": round(log_mb_per_s, 1),
        "raw_mb_per_s": round(raw_mb_per_s, 1),
        "percent_of_raw": round(percent, 1),
        "meets_target": percent >= APPEND_TARGET_PERCENT,
        "us_per_batch": round(statistics.median(run.us_per_batch for run in log_runs), 2),
        "raw_us_per_batch": round(statistics.median(run.us_per_batch for run in raw_runs), 2),
        "runs": [
            {"log": log.to_json(), "raw": raw.to_json()}
            for log, raw in zip(log_runs, raw_runs, strict=True)
        ],
    }


def append_benchmark(workdir: Path, sizes: Sizes, progress: Console) -> list[dict[str, Any]]:
    cases = []
    for fsync in (False, True):
        for records in BATCH_RECORDS:
            progress.log(f"append: {records} records per batch, fsync={fsync}")
            cases.append(append_case(workdir, records, fsync, sizes))
    return cases


# -- read ----------------------------------------------------------------------------------------
def scan_batches(data: bytes) -> tuple[int, int]:
    """(next offset after the last batch, records) of whole batches, from their headers only."""
    position = records = next_offset = 0
    while position < len(data):
        header = read_header(data, position)
        records += header.record_count
        next_offset = header.next_offset
        position += header.size_bytes
    require(position == len(data), "Log.read returned a torn batch")
    return next_offset, records


def read_all(log: Log) -> Run:
    """Read from the log start to the log end, ``READ_MAX_BYTES`` per ``Log.read``."""
    offset, end = log.log_start_offset, log.log_end_offset
    reads = records = size_bytes = 0
    started = time.perf_counter()
    while offset < end:
        data = log.read(offset, READ_MAX_BYTES)
        next_offset, batch_records = scan_batches(data)
        require(next_offset > offset, f"Log.read at offset {offset} made no progress")
        offset = next_offset
        reads += 1
        records += batch_records
        size_bytes += len(data)
    seconds = time.perf_counter() - started
    require(size_bytes == log.size_bytes, "the read did not return the whole log")
    return Run(reads, records, size_bytes, seconds)


def _try_drop_caches() -> bool:
    try:
        DROP_CACHES.write_text("1\n")
    except OSError:
        return False  # not root, or a container: fadvise alone was used (the result says so)
    return True


def evict_from_page_cache(directory: Path, *, drop_caches: bool) -> str:
    """fsync each file of ``directory`` (dirty pages cannot be dropped) and advise the kernel
    to drop its pages; also drop all clean caches if asked and allowed. Says what was used."""
    for path in sorted(directory.iterdir()):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    method = "posix_fadvise(POSIX_FADV_DONTNEED)"
    if drop_caches and _try_drop_caches():
        method += " + drop_caches=1"
    return method


def read_summary(runs: list[Run]) -> dict[str, Any]:
    return {
        "mb_per_s": round(statistics.median(run.mb_per_s for run in runs), 1),
        "records_per_s": round(statistics.median(run.records_per_s for run in runs)),
        "seconds": round(statistics.median(run.seconds for run in runs), 3),
        "reads": runs[0].batches,
        "runs": [run.to_json() for run in runs],
    }


def read_benchmark(workdir: Path, sizes: Sizes, progress: Console) -> dict[str, Any]:
    batch = build_batch(READ_RECORDS_PER_BATCH)
    with scratch_dir(workdir) as directory:
        log = Log(directory / "bench-0", LogConfig.parse(APPEND_CONFIG))
        try:
            progress.log(f"read: writing a {_size_label(sizes.read_bytes)} log")
            for _ in range(max(1, sizes.read_bytes // len(batch))):
                log.append(batch, leader_epoch=0)
            log.flush()
            progress.log("read: warm page cache")
            warm = [read_all(log) for _ in range(sizes.read_repeats)]
            progress.log("read: cold page cache, then evicted again")
            cold: list[Run] = []
            for _ in range(2):
                eviction = evict_from_page_cache(log.directory, drop_caches=sizes.drop_caches)
                cold.append(read_all(log))
            return {
                "log_bytes": log.size_bytes,
                "records_per_batch": READ_RECORDS_PER_BATCH,
                "batch_bytes": len(batch),
                "max_bytes_per_read": READ_MAX_BYTES,
                "warm": read_summary(warm),
                "cold": {**read_summary(cold[:1]), "eviction": eviction},
                "cold_again": {**read_summary(cold[1:]), "eviction": eviction},
            }
        finally:
            log.close()


# -- recovery ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WriterReady:
    """What the writer announced before it was killed."""

    written_bytes: int
    log_end_offset: int


def wait_for_ready(process: subprocess.Popen[bytes], deadline_s: float) -> WriterReady:
    """Read the writer's ``ready <bytes> <offset>`` line, polling its stdout until a deadline."""
    assert process.stdout is not None and process.stderr is not None
    fd = process.stdout.fileno()
    line = b""
    deadline = time.monotonic() + deadline_s
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while b"\n" not in line:
            remaining = deadline - time.monotonic()
            require(remaining > 0, f"the writer was not ready within {deadline_s} s")
            require(len(line) < READY_LINE_MAX_BYTES, f"the writer printed {line[:200]!r}")
            if not selector.select(remaining):
                continue
            chunk = os.read(fd, READY_LINE_MAX_BYTES)
            if not chunk:
                status = process.wait(timeout=KILL_WAIT_S)
                stderr = process.stderr.read().decode(errors="replace")
                raise BenchmarkError(f"the writer exited with {status} before ready: {stderr}")
            line += chunk
    word, written, offset = line.split(b"\n", 1)[0].decode().split()
    require(word == "ready", f"unexpected line from the writer: {line!r}")
    return WriterReady(int(written), int(offset))


def writer_command(directory: Path, sizes: Sizes) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.recovery_writer",
        f"--dir={directory}",
        f"--segment-bytes={sizes.recovery_segment_bytes}",
        f"--records-per-batch={RECOVERY_RECORDS_PER_BATCH}",
        f"--ready-bytes={sizes.recovery_bytes}",
        f"--max-bytes={4 * sizes.recovery_bytes}",
        f"--max-seconds={2 * sizes.ready_deadline_s}",
    ]


def kill_writer_once_ready(directory: Path, sizes: Sizes) -> WriterReady:
    """Start the writer, SIGKILL it by pid once it has written ``recovery_bytes``. The writer
    is killed on every path out of here, also when waiting for it fails."""
    process = popen_owned(  # dies with the benchmark, also when it is killed
        writer_command(directory, sizes),
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        ready = wait_for_ready(process, sizes.ready_deadline_s)
        require(process.poll() is None, "the writer stopped before it was killed")
        os.kill(process.pid, signal.SIGKILL)
        status = process.wait(timeout=KILL_WAIT_S)
        require(status == -signal.SIGKILL, f"the writer ended with {status}, not by SIGKILL")
        return ready
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=KILL_WAIT_S)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def check_recovered(log: Log, ready: WriterReady, batch_bytes: int) -> None:
    """An unclean recovery that kept every whole batch and ends at a batch boundary."""
    require(not log.recovery.clean_shutdown, "recovery after SIGKILL found a clean marker")
    batches, torn_bytes = divmod(log.size_bytes, batch_bytes)
    require(torn_bytes == 0, f"the log ends {torn_bytes} bytes into a batch")
    require(
        log.log_end_offset == batches * RECOVERY_RECORDS_PER_BATCH,
        f"log end offset {log.log_end_offset} does not match {batches} batches",
    )
    require(
        log.log_end_offset >= ready.log_end_offset,
        f"log end offset {log.log_end_offset} is below the {ready.log_end_offset} announced",
    )


def recovery_case(workdir: Path, sizes: Sizes, *, cold: bool) -> dict[str, Any]:
    with scratch_dir(workdir) as scratch:
        directory = scratch / "bench-0"
        ready = kill_writer_once_ready(directory, sizes)
        eviction = "none: the page cache as SIGKILL left it"
        if cold:
            eviction = evict_from_page_cache(directory, drop_caches=sizes.drop_caches)
        config = LogConfig.parse({"segment.bytes": str(sizes.recovery_segment_bytes)})
        started = time.perf_counter()
        log = Log(directory, config)
        seconds = time.perf_counter() - started
        try:
            check_recovered(log, ready, len(build_batch(RECOVERY_RECORDS_PER_BATCH)))
            scanned = sum(r.valid_bytes + r.dropped_bytes for r in log.recovery.recovered)
            return {
                "seconds": round(seconds, 3),
                "recovery_duration_ms": round(log.recovery.duration_ms, 1),
                "scanned_bytes": scanned,
                "scanned_gib": round(scanned / GiB, 3),
                "mb_per_s": round(scanned / seconds / MB, 1),
                "segments": log.segment_count,
                "segments_recovered": len(log.recovery.recovered),
                "dropped_bytes": log.recovery.dropped_bytes,
                "written_at_ready_bytes": ready.written_bytes,
                "log_end_offset": log.log_end_offset,
                "log_bytes": log.size_bytes,
                "clean_shutdown": log.recovery.clean_shutdown,
                "eviction": eviction,
                "meets_target": seconds <= RECOVERY_TARGET_S,
            }
        finally:
            log.close()


def recovery_benchmark(workdir: Path, sizes: Sizes, progress: Console) -> dict[str, Any]:
    progress.log("recovery: SIGKILL a writer, recover with the page cache as it was left")
    warm = recovery_case(workdir, sizes, cold=False)
    progress.log("recovery: SIGKILL a writer, evict its files, recover")
    cold = recovery_case(workdir, sizes, cold=True)
    return {
        "segment_bytes": sizes.recovery_segment_bytes,
        "records_per_batch": RECOVERY_RECORDS_PER_BATCH,
        "batch_bytes": len(build_batch(RECOVERY_RECORDS_PER_BATCH)),
        "target_s": RECOVERY_TARGET_S,
        "warm": warm,
        "cold": cold,
    }


# -- report --------------------------------------------------------------------------------------
def _size_label(size_bytes: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (1024, "KiB")):
        if size_bytes >= unit:
            return f"{round(size_bytes / unit, 1):g} {name}"
    return f"{size_bytes} B"


def _batch_label(records_per_batch: int) -> str:
    """The nominal size: 16 records of 1 KiB are a "16 KiB" batch (16,589 bytes encoded)."""
    return _size_label(records_per_batch * RECORD_BYTES)


def _mark(text: str, ok: bool) -> str:
    return text if ok else f"[red]{text}[/red]"


def append_table(cases: list[dict[str, Any]]) -> Table:
    table = Table(title=f"Append, {RECORD_BYTES} B records (median of runs)")
    columns = ("batch", "fsync", "records/s", "MB/s", "raw MB/s", "% raw", "µs/batch", "raw µs")
    for column in columns:
        table.add_column(column, justify="left" if column == "batch" else "right")
    for case in cases:
        table.add_row(
            _batch_label(case["records_per_batch"]),
            "on ack" if case["fsync"] else "no",
            f"{case['records_per_s']:,}",
            f"{case['mb_per_s']:,.0f}",
            f"{case['raw_mb_per_s']:,.0f}",
            _mark(f"{case['percent_of_raw']:.0f}%", case["meets_target"]),
            f"{case['us_per_batch']:,.1f}",
            f"{case['raw_us_per_batch']:,.1f}",
        )
    return table


def read_table(read: dict[str, Any]) -> Table:
    title = (
        f"Read of {_size_label(read['log_bytes'])} "
        f"({_batch_label(read['records_per_batch'])} batches, "
        f"{_size_label(read['max_bytes_per_read'])} reads)"
    )
    table = Table(title=title, caption=f"cold: {read['cold']['eviction']}", min_width=64)
    for column in ("page cache", "records/s", "MB/s", "seconds"):
        table.add_column(column, justify="left" if column == "page cache" else "right")
    for name in ("warm", "cold", "cold_again"):
        case = read[name]
        table.add_row(
            name.replace("_", " "),
            f"{case['records_per_s']:,}",
            f"{case['mb_per_s']:,.0f}",
            f"{case['seconds']:.2f}",
        )
    return table


def recovery_table(recovery: dict[str, Any]) -> Table:
    title = (
        f"Recovery after SIGKILL, segment.bytes {recovery['segment_bytes'] // MiB} MiB, "
        f"target ≤ {recovery['target_s']:.0f} s"
    )
    caption = "segments: recovered/all; dropped: bytes of the torn tail truncated"
    table = Table(title=title, caption=caption)
    columns = ("page cache", "seconds", "GiB read", "MB/s", "segments", "dropped", "LEO")
    for column in columns:
        table.add_column(column, justify="left" if column == "page cache" else "right")
    for name in ("warm", "cold"):
        case = recovery[name]
        table.add_row(
            name,
            _mark(f"{case['seconds']:.2f}", case["meets_target"]),
            f"{case['scanned_gib']:.3f}",
            f"{case['mb_per_s']:,.0f}",
            f"{case['segments_recovered']}/{case['segments']}",
            f"{case['dropped_bytes']:,}",
            f"{case['log_end_offset']:,}",
        )
    return table


# -- main ----------------------------------------------------------------------------------------
PARTS = ("append", "read", "recovery")


def run_benchmarks(
    workdir: Path, sizes: Sizes, progress: Console, parts: Sequence[str] = PARTS
) -> dict[str, Any]:
    """Run the ``parts`` asked for; the results hold a section for each part that ran."""
    started = time.perf_counter()
    load_avg_start = os.getloadavg()
    ran: dict[str, Any] = {}
    if "append" in parts:
        ran["append"] = append_benchmark(workdir, sizes, progress)
    if "read" in parts:
        ran["read"] = read_benchmark(workdir, sizes, progress)
    if "recovery" in parts:
        ran["recovery"] = recovery_benchmark(workdir, sizes, progress)
    return {
        "mode": "quick" if sizes == QUICK else "full",
        "targets": {
            "append_percent_of_raw_min": APPEND_TARGET_PERCENT,
            "recovery_seconds_max": RECOVERY_TARGET_S,
        },
        "notes": list(NOTES),
        "duration_s": round(time.perf_counter() - started, 1),
        "workdir": str(workdir.parent),
        # Other processes share the CPUs: the load averages say how much.
        "load_avg_start": [round(load, 2) for load in load_avg_start],
        "load_avg_end": [round(load, 2) for load in os.getloadavg()],
        "parts": [part for part in PARTS if part in ran],
        **ran,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results JSON file to update")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of < 30 s")
    parser.add_argument(
        "--only",
        action="append",
        choices=PARTS,
        help="run only this part (repeatable); the storage section written to --out then "
        "holds only the parts that ran",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=REPO_ROOT / ".raftlog" / "bench",
        help="where the temporary logs go (a fresh directory inside it, removed afterwards)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    console = Console()
    progress = Console(stderr=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="storage-", dir=args.workdir))
    try:
        storage = run_benchmarks(workdir, sizes, progress, args.only or PARTS)
    finally:
        shutil.rmtree(workdir)
    results = write_section(args.out, "storage", storage)
    machine = results["machine"]
    console.print(
        f"raftlog storage benchmark ({storage['mode']}), {machine['cpu_count']} CPUs, "
        f"Python {machine['python']}, Linux {machine['kernel']}, {results['date']}"
    )
    if "append" in storage:
        console.print(append_table(storage["append"]))
    if "read" in storage:
        console.print(read_table(storage["read"]))
    if "recovery" in storage:
        console.print(recovery_table(storage["recovery"]))
    console.print(f"{storage['duration_s']:.0f} s in all; figures written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
