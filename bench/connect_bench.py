"""Connect and mirroring benchmark: two real 3-node clusters (source 127.0.0.201-203, target
127.0.0.204-206), the ``raftlog mirror`` and ``raftlog connect`` processes on 127.0.0.207.

``python -m bench.connect_bench --out bench/results/latest.json [--quick]``

1. Mirror throughput: a 6-partition topic pre-filled with N 1 KiB records is mirrored from the
   beginning by ``raftlog mirror`` (2 tasks): records/s from the first record on the target to
   the last (the mirror's start-up, until its first record lands, is timed separately).
2. Replication lag under a steady produce rate (2,000 records/s of 1 KiB for 30 s into another
   6-partition topic the mirror's regex picks up): every 100 ms the lag in records (source end
   offsets minus target end offsets, summed); and per record the lag in ms (the time it is
   consumed on the target minus its timestamp, stamped by the source producer). p50/p99 of each.
3. File source: ``raftlog connect standalone`` with a FileStreamSource reading a file of N lines
   (1 KiB each) into a topic on the target: records/s from the first record to the last.

Every wait polls a condition with a deadline; every process is stopped by its pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench import RECORD_BYTES, REPO_ROOT, bench_main
from bench.dataplane_bench import cluster_in, create_topic
from dataplane.client import Consumer, Producer, TopicPartition
from dataplane.tools.entry import COMMAND as RAFTLOG
from dataplane.tools.local_cluster import LocalCluster, free_port, wait_for
from dataplane.tools.owned_process import popen_owned
from raftlog.errors import KafkaError

SOURCE_HOST, TARGET_HOST, WORKER_HOST = 201, 204, "127.0.0.207"
PARTITIONS = 6
WAIT_S = 300.0
SAMPLE_S = 0.1


@contextmanager
def process(
    args: Sequence[str], log_path: Path, ready_url: str
) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with log_path.open("ab") as log:
        proc = popen_owned(list(args), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{args[3]} exited: {log_path.read_text()[-2000:]}")
            try:
                return httpx.get(ready_url, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(f"{args[3]} answering", ready, WAIT_S)
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)


def end_total(consumer: Consumer, topic: str, partitions: int = PARTITIONS) -> int:
    ends = consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    return sum(ends.values())


def fill(cluster: LocalCluster, topic: str, records: int) -> None:
    value = os.urandom(RECORD_BYTES)
    with Producer(cluster.bootstrap_servers, linger_ms=20) as producer:
        for n in range(records):
            producer.send(topic, value, partition=n % PARTITIONS)
        producer.flush(WAIT_S)


def mirror_throughput(
    source: LocalCluster, target: LocalCluster, records: int, console: Console
) -> dict[str, Any]:
    probe = Consumer(target.bootstrap_servers)
    try:
        started = time.monotonic()
        wait_for("the first mirrored record", lambda: (
            probe_topic_exists(probe, "A.bench-prefill") and end_total(probe, "A.bench-prefill") > 0
        ), WAIT_S)  # fmt: skip
        first = time.monotonic()
        wait_for("every record mirrored", lambda: end_total(probe, "A.bench-prefill") >= records,
                 WAIT_S)  # fmt: skip
        last = time.monotonic()
    finally:
        probe.close()
    seconds = last - first
    console.log(f"mirrored {records} records in {seconds:.1f} s")
    return {
        "records": records,
        "record_bytes": RECORD_BYTES,
        "startup_seconds": round(first - started, 2),
        "seconds": round(seconds, 2),
        "records_per_s": round(records / seconds),
        "mb_per_s": round(records * RECORD_BYTES / seconds / 1e6, 1),
    }


def probe_topic_exists(consumer: Consumer, topic: str) -> bool:
    try:
        return len(consumer.partitions_for_topic(topic)) == PARTITIONS
    except KafkaError:  # not created yet: keep polling
        return False


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def steady_lag(
    source: LocalCluster, target: LocalCluster, rate_per_s: int, duration_s: float,
    console: Console,
) -> dict[str, Any]:  # fmt: skip
    topic, remote = "bench-steady", "A.bench-steady"
    create_topic(source, topic, PARTITIONS)
    lag_ms: list[float] = []
    stop = threading.Event()
    target_consumer = Consumer(target.bootstrap_servers, fetch_max_wait_ms=50,
                               auto_offset_reset="earliest", max_poll_records=5000)  # fmt: skip
    source_probe, target_probe = Consumer(source.bootstrap_servers), Consumer(
        target.bootstrap_servers)  # fmt: skip
    try:
        wait_for(f"{remote} created", lambda: probe_topic_exists(target_probe, remote), WAIT_S)
        target_consumer.assign([TopicPartition(remote, p) for p in range(PARTITIONS)])

        def consume() -> None:
            while not stop.is_set():
                for records in target_consumer.poll(100).values():
                    now_ms = time.time() * 1000
                    lag_ms.extend(now_ms - r.timestamp for r in records)

        reader = threading.Thread(target=consume, name="lag-reader")
        reader.start()
        value = os.urandom(RECORD_BYTES)
        lag_records: list[int] = []
        with Producer(source.bootstrap_servers, linger_ms=5) as producer:
            begin = time.monotonic()
            sent = 0
            next_sample = begin
            while (now := time.monotonic()) - begin < duration_s:
                due = int((now - begin) * rate_per_s)
                for _ in range(due - sent):
                    producer.send(topic, value)
                sent = max(sent, due)
                if now >= next_sample:
                    behind = end_total(source_probe, topic) - end_total(target_probe, remote)
                    lag_records.append(behind)
                    next_sample = now + SAMPLE_S
                stop.wait(0.005)  # pacing the load generator, not synchronisation
            producer.flush(WAIT_S)
        wait_for("the steady topic mirrored", lambda: end_total(target_probe, remote)
                 >= end_total(source_probe, topic), WAIT_S)  # fmt: skip
        wait_for("the lag reader caught up", lambda: len(lag_ms) >= sent, 60)
        stop.set()
        reader.join(30)
    finally:
        stop.set()
        target_consumer.close()
        source_probe.close()
        target_probe.close()
    console.log(f"steady: {sent} records at {rate_per_s}/s, {len(lag_records)} lag samples")
    return {
        "rate_per_s": rate_per_s,
        "duration_s": duration_s,
        "records": sent,
        "lag_records_p50": percentile(lag_records, 0.5),
        "lag_records_p99": percentile(lag_records, 0.99),
        "lag_records_max": max(lag_records, default=0),
        "lag_p50_ms": round(percentile(lag_ms, 0.5), 1),
        "lag_p99_ms": round(percentile(lag_ms, 0.99), 1),
        "lag_mean_ms": round(statistics.fmean(lag_ms), 1) if lag_ms else 0.0,
    }


def file_source(target: LocalCluster, work: Path, lines: int, console: Console) -> dict[str, Any]:
    create_topic(target, "file-bench", 1)
    path = work / "lines.txt"
    line = b"x" * (RECORD_BYTES - 1) + b"\n"
    with path.open("wb") as f:
        for _ in range(lines):
            f.write(line)
    url = f"http://{WORKER_HOST}:{free_port(WORKER_HOST)}"
    worker = work / "worker.json"
    worker.write_text(json.dumps({
        "bootstrap.servers": ",".join(target.bootstrap_servers), "listeners": url,
        "offset.storage.file.filename": str(work / "offsets.json"),
    }))  # fmt: skip
    connector = work / "file.json"
    config = {"connector.class": "FileStreamSource", "file": str(path), "topic": "file-bench"}
    connector.write_text(json.dumps({"name": "file-bench", "config": config}))
    probe = Consumer(target.bootstrap_servers)
    args = [*RAFTLOG, "connect", "standalone", str(worker), str(connector)]
    try:
        with process(args, work / "connect.log", url + "/connectors"):
            wait_for("the first line", lambda: end_total(probe, "file-bench", 1) > 0, WAIT_S)
            first = time.monotonic()
            wait_for("every line", lambda: end_total(probe, "file-bench", 1) >= lines, WAIT_S)
            seconds = time.monotonic() - first
    finally:
        probe.close()
    console.log(f"file source: {lines} lines in {seconds:.1f} s")
    return {"lines": lines, "line_bytes": RECORD_BYTES, "seconds": round(seconds, 2),
            "records_per_s": round(lines / seconds)}  # fmt: skip


def run(workdir: Path, quick: bool, console: Console) -> dict[str, Any]:
    prefill = 5_000 if quick else 100_000
    rate, duration = (500, 5.0) if quick else (2_000, 30.0)
    lines = 10_000 if quick else 100_000
    root = Path(tempfile.mkdtemp(prefix="connect-", dir=workdir))
    try:
        with ExitStack() as stack:
            source = stack.enter_context(cluster_in(root, console, SOURCE_HOST))
            target = stack.enter_context(cluster_in(root, console, TARGET_HOST))
            figures: dict[str, Any] = {"file_source": file_source(target, root, lines, console)}
            create_topic(source, "bench-prefill", PARTITIONS)
            fill(source, "bench-prefill", prefill)
            url = f"http://{WORKER_HOST}:{free_port(WORKER_HOST)}"
            args = [
                *RAFTLOG, "mirror", "--source-bootstrap", ",".join(source.bootstrap_servers),
                "--target-bootstrap", ",".join(target.bootstrap_servers), "--source-alias", "A",
                "--topics-regex", "bench-.*", "--tasks-max", "2", "--listeners", url,
                "--set", "refresh.topics.interval.ms=1000",
            ]  # fmt: skip
            with process(args, root / "mirror.log", url + "/connectors"):
                figures["mirror"] = mirror_throughput(source, target, prefill, console)
                figures["mirror_lag"] = steady_lag(source, target, rate, duration, console)
            return figures
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(console: Console, figures: dict[str, Any]) -> None:
    table = Table("figure", "value", title="Connect and mirroring")
    m, lag, f = figures["mirror"], figures["mirror_lag"], figures["file_source"]
    table.add_row("mirror throughput (1 KiB records)",
                  f"{m['records_per_s']:,} records/s ({m['mb_per_s']} MB/s; start-up "
                  f"{m['startup_seconds']} s)")  # fmt: skip
    table.add_row(f"lag at {lag['rate_per_s']:,} records/s, records p50 / p99",
                  f"{lag['lag_records_p50']:,} / {lag['lag_records_p99']:,}")  # fmt: skip
    table.add_row("lag, ms p50 / p99", f"{lag['lag_p50_ms']} / {lag['lag_p99_ms']}")
    table.add_row("file source (1 KiB lines)", f"{f['records_per_s']:,} records/s")
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main(argv, "Connect and mirroring benchmark", "connect", run, report)


if __name__ == "__main__":
    raise SystemExit(main())
