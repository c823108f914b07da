"""The storage demo behind ``make demo`` (until the cluster demo replaces it).

1. A child process writes 1 KiB records in 16 KiB batches round-robin into a 4-partition log
   directory with small segments, flushing every few batches and reporting the flushed offsets.
2. Mid-way the parent kills it with SIGKILL, reopens every partition (unclean recovery), and checks
   that every batch written before the last reported flush is there, that every record reads back
   as written (CRC and content), and that each log ends at a batch boundary.
3. The rest of the records are written, a keyed topic is compacted, and a table shows the result.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dataplane.tools.owned_process import popen_owned
from raftlog.batch import iter_batches
from raftlog.config import LogConfig
from raftlog.log import Log, RecoveryReport
from raftlog.records import Record, encode_batch, iter_records

RECORD_BYTES = 1024
BATCH_RECORDS = 16
FLUSH_EVERY_BATCHES = 64
EVENTS_TOPIC = "demo-events"
TABLE_TOPIC = "demo-table"
CONFIG = LogConfig.parse({"segment.bytes": 16 * 1024 * 1024, "index.interval.bytes": 4096})
TABLE_CONFIG = CONFIG.with_overrides({"cleanup.policy": "compact", "segment.bytes": 4 * 1024**2})
PROGRESS_DEADLINE_S = 300.0
console = Console()


def expected_value(partition: int, offset: int) -> bytes:
    return f"p{partition:02d}o{offset:012d}|".encode().ljust(RECORD_BYTES, b"~")


def event_batch(partition: int, first_offset: int, count: int, timestamp_ms: int) -> bytes:
    records = [
        Record(-1, timestamp_ms, None, expected_value(partition, first_offset + n))
        for n in range(count)
    ]
    return encode_batch(records)


def open_partitions(directory: Path, partitions: int) -> list[Log]:
    return [Log(directory / f"{EVENTS_TOPIC}-{p}", CONFIG) for p in range(partitions)]


# -- the writer (child process) ------------------------------------------------------------------
def write_events(directory: Path, partitions: int, total_records: int, *, report: bool) -> None:
    """Append until the partitions hold ``total_records``; flush every FLUSH_EVERY_BATCHES
    batches and, if ``report``, print the flushed log end offsets as one JSON line and, when
    done, keep the logs open until standard input closes (the demo kills it before that)."""
    logs = open_partitions(directory, partitions)
    written = sum(log.log_end_offset for log in logs)
    batches = 0
    while written < total_records:
        partition = batches % partitions
        log = logs[partition]
        count = min(BATCH_RECORDS, total_records - written)
        now_ms = time.time_ns() // 1_000_000
        log.append(event_batch(partition, log.log_end_offset, count, now_ms), leader_epoch=0)
        written += count
        batches += 1
        if batches % FLUSH_EVERY_BATCHES == 0:
            for each in logs:
                each.flush()
            if report:
                flushed = [each.log_end_offset for each in logs]
                print(json.dumps({"written": written, "flushed": flushed}), flush=True)
    if report:
        for log in logs:
            log.flush()
        print(json.dumps({"written": written, "flushed": [log.log_end_offset for log in logs]}))
        sys.stdout.flush()
        sys.stdin.read()
    for log in logs:
        log.close()


# -- the parent ----------------------------------------------------------------------------------
@dataclass
class PartitionCheck:
    partition: int
    flushed_offset: int
    recovery: RecoveryReport
    log_end_offset: int = 0
    verified_records: int = 0


def run_demo(directory: Path, *, total_records: int, partitions: int, keep: bool) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    try:
        started = time.perf_counter()
        flushed = kill_writer_midway(directory, partitions, total_records)
        checks = recover_and_verify(directory, flushed)
        write_events(directory, partitions, total_records, report=False)
        compaction = compact_keyed_topic(directory)
        show(directory, checks, compaction, total_records, time.perf_counter() - started)
    finally:
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)


def kill_writer_midway(directory: Path, partitions: int, total_records: int) -> list[int]:
    """Start the writer, SIGKILL it once half the records are flushed; the last flushed offsets."""
    command = [
        sys.executable,
        "-m",
        "dataplane.tools.storage_demo",
        "write",
        str(directory),
        str(partitions),
        str(total_records),
    ]
    writer = popen_owned(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    flushed: list[int] = [0] * partitions
    try:
        assert writer.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(writer.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + PROGRESS_DEADLINE_S
            while sum(flushed) < total_records // 2:
                if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                    raise TimeoutError("the writer reported no progress in time")
                line = writer.stdout.readline()
                if not line:
                    raise RuntimeError(f"the writer exited early with {writer.wait()}")
                flushed = json.loads(line)["flushed"]
        console.print(f"writer pid {writer.pid}: {sum(flushed):,} records flushed, sending SIGKILL")
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        for stream in (writer.stdin, writer.stdout):
            if stream is not None:
                stream.close()
    return flushed


def recover_and_verify(directory: Path, flushed: list[int]) -> list[PartitionCheck]:
    checks = []
    for partition, log in enumerate(open_partitions(directory, len(flushed))):
        check = PartitionCheck(partition, flushed[partition], log.recovery)
        assert not log.recovery.clean_shutdown, "a SIGKILLed writer leaves no clean marker"
        assert log.log_end_offset >= flushed[partition], (
            f"partition {partition} lost flushed records: ends at {log.log_end_offset}, "
            f"{flushed[partition]} were flushed"
        )
        data = log.read(0, log.size_bytes + 1)
        batch_bytes = sum(header.size_bytes for _, header in iter_batches(data))  # CRCs checked
        assert batch_bytes == log.size_bytes, "the log ends at a batch boundary"
        for expected_offset, record in enumerate(iter_records(data)):
            assert record.offset == expected_offset
            assert record.value == expected_value(partition, expected_offset), (
                f"partition {partition} offset {expected_offset} reads back wrong"
            )
            check.verified_records += 1
        check.log_end_offset = log.log_end_offset
        log.close()
        checks.append(check)
    return checks


@dataclass
class CompactionSummary:
    keys: int
    records_before: int
    records_after: int
    bytes_before: int
    bytes_after: int
    segments_before: int
    segments_after: int


def compact_keyed_topic(directory: Path, keys: int = 2000, updates: int = 10) -> CompactionSummary:
    log = Log(directory / f"{TABLE_TOPIC}-0", TABLE_CONFIG)
    latest: dict[bytes, bytes] = {}
    for round_ in range(updates):
        for first in range(0, keys, BATCH_RECORDS):
            records = []
            for k in range(first, min(keys, first + BATCH_RECORDS)):
                key, value = f"user-{k:05d}".encode(), f"r{round_}|".encode().ljust(1000, b"=")
                records.append(Record(-1, time.time_ns() // 1_000_000, key, value))
                latest[key] = value
            log.append(encode_batch(records), leader_epoch=0)
    before = (keys * updates, log.size_bytes, log.segment_count)
    result = log.compact(force=True)
    assert result is not None
    after = list(iter_records(log.read(0, log.size_bytes + 1)))
    survivors = {record.key: record.value for record in after}
    assert survivors == latest, "compaction kept the latest value of every key"
    summary = CompactionSummary(
        keys, before[0], len(after), before[1], log.size_bytes, before[2], log.segment_count
    )
    log.close()
    return summary


def show(
    directory: Path,
    checks: list[PartitionCheck],
    compaction: CompactionSummary,
    total_records: int,
    elapsed_s: float,
) -> None:
    table = Table(title=f"{total_records:,} records of 1 KiB, writer SIGKILLed mid-way")
    for column in (
        "partition",
        "records",
        "segments",
        "bytes",
        "flushed at kill",
        "recovered at",
        "dropped bytes",
        "recovery ms",
    ):
        table.add_column(column, justify="right")
    for check, log in zip(checks, open_partitions(directory, len(checks)), strict=True):
        table.add_row(
            str(check.partition),
            f"{log.log_end_offset:,}",
            str(log.segment_count),
            f"{log.size_bytes:,}",
            f"{check.flushed_offset:,}",
            f"{check.log_end_offset:,}",
            str(check.recovery.dropped_bytes),
            f"{check.recovery.duration_ms:.0f}",
        )
        log.close()
    console.print(table)
    compacted = Table(title=f"compaction of {TABLE_TOPIC} ({compaction.keys:,} keys)")
    for column in ("", "records", "bytes", "segments"):
        compacted.add_column(column, justify="right")
    compacted.add_row(
        "before",
        f"{compaction.records_before:,}",
        f"{compaction.bytes_before:,}",
        str(compaction.segments_before),
    )
    compacted.add_row(
        "after",
        f"{compaction.records_after:,}",
        f"{compaction.bytes_after:,}",
        str(compaction.segments_after),
    )
    console.print(compacted)
    verified = sum(check.verified_records for check in checks)
    console.print(
        f"[green]ok[/green]: {verified:,} records verified after recovery, "
        f"every flushed batch intact, {elapsed_s:.1f} s in all"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="storage demo writer (run by the demo)")
    parser.add_argument("role", choices=["write"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("partitions", type=int)
    parser.add_argument("total_records", type=int)
    args = parser.parse_args()
    write_events(args.directory, args.partitions, args.total_records, report=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
