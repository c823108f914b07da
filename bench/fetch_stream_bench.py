"""The server-streaming Fetch against the unary long-poll Fetch loop, on a 1-node cluster
(127.0.0.239; 239-241 are this benchmark's).

``python -m bench.fetch_stream_bench --out bench/results/latest.json [--quick]``

One partition, records of ``RECORD_BYTES`` carrying their send time; a producer (acks=1,
linger 0) in this process and a reader in a thread of it: the :class:`Consumer` (``poll``: one
unary Fetch per round, long polling up to ``fetch.max.wait.ms``, the next one sent as the
records are handed over) or the :class:`FetchStream` (one stream, pushed). For each, at

- **low** rate: ``LOW_RATE_PER_S`` records/s, paced (latency matters, the reader mostly waits);
- **high** rate: as fast as the producer goes;

end-to-end latency (send → the reader holds the record; p50, p99) and the broker's CPU per
delivered record (``/proc/<pid>/stat`` of the node, produce included: the same in both modes,
so the difference is the fetching). Every wait polls a condition with a deadline.
"""

from __future__ import annotations

import shutil
import statistics
import struct
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import RECORD_BYTES, bench_main
from bench.dataplane_bench import cpu_seconds
from dataplane.client import AdminClient, Consumer, FetchStream, NewTopic, Producer, TopicPartition
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port, wait_for

FIRST_HOST = 239
TOPIC = "bench-fetch-stream"
TP = TopicPartition(TOPIC, 0)
LOW_RATE_PER_S = 100
RECORDS = {"full": {"low": 2_000, "high": 100_000}, "quick": {"low": 300, "high": 10_000}}
MODES = ("fetch", "stream")
WAIT_S = 120.0
STAMP = struct.Struct(">q")  # the send time, ns on the monotonic clock, first in the value


class Reader(threading.Thread):
    """Reads ``count`` records from ``start`` and notes each one's latency."""

    def __init__(self, mode: str, bootstrap: list[str], start: int, count: int) -> None:
        super().__init__(name=f"bench-{mode}", daemon=True)
        self.mode, self.bootstrap, self.start_offset, self.count = mode, bootstrap, start, count
        self.latencies_ms: list[float] = []
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.mode == "stream":
                with FetchStream(self.bootstrap, {TP: self.start_offset}) as stream:
                    self._read(stream.poll)
            else:
                with Consumer(self.bootstrap, fetch_max_wait_ms=500) as consumer:
                    consumer.assign([TP])
                    consumer.seek(TP, self.start_offset)
                    self._read(consumer.poll)
        except Exception as error:  # noqa: BLE001 - run_one raises it in the main thread
            self.error = error

    def _read(self, poll: Any) -> None:
        deadline = time.monotonic() + WAIT_S
        while len(self.latencies_ms) < self.count and time.monotonic() < deadline:
            polled = poll(100)
            now_ns = time.monotonic_ns()
            self.ready.set()
            for records in polled.values():
                for record in records:
                    sent_ns = STAMP.unpack_from(record.value or b"")[0]
                    self.latencies_ms.append((now_ns - sent_ns) / 1e6)


def run_one(cluster: LocalCluster, mode: str, rate: str, count: int) -> dict[str, Any]:
    with Consumer(cluster.bootstrap_servers) as probe:
        start = probe.end_offsets([TP])[TP]
    reader = Reader(mode, cluster.bootstrap_servers, start, count)
    reader.start()
    wait_for(f"the {mode} reader", lambda: reader.ready.is_set() or reader.error, 30)
    pid = cluster.pid(1) or 0
    cpu_before = cpu_seconds(pid)
    padding = b"p" * (RECORD_BYTES - STAMP.size)
    started = time.monotonic()
    with Producer(cluster.bootstrap_servers, acks=1, linger_ms=0) as producer:
        for n in range(count):
            if rate == "low":
                send_at = started + n / LOW_RATE_PER_S
                while (left := send_at - time.monotonic()) > 0:
                    time.sleep(left)  # pacing the sends, not waiting for a condition
            producer.send(TOPIC, STAMP.pack(time.monotonic_ns()) + padding, partition=0)
        producer.flush(60)
    reader.join(WAIT_S)
    elapsed_s = time.monotonic() - started
    cpu_s = cpu_seconds(pid) - cpu_before
    if reader.error is not None:
        raise reader.error
    latencies = sorted(reader.latencies_ms)
    if len(latencies) != count:
        raise RuntimeError(f"{mode} {rate}: {len(latencies)} of {count} records delivered")
    return {
        "records": count,
        "records_per_s": round(count / elapsed_s),
        "latency_p50_ms": round(statistics.median(latencies), 2),
        "latency_p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))], 2),
        "broker_cpu_us_per_record": round(cpu_s / count * 1e6, 1),
    }


def run(workdir: Path, quick: bool, progress: Console) -> dict[str, Any]:
    sizes = RECORDS["quick" if quick else "full"]
    root = Path(tempfile.mkdtemp(prefix="fetch-stream-", dir=workdir))
    host = f"127.0.0.{FIRST_HOST}"
    cluster = LocalCluster(root, nodes=1, first_host=FIRST_HOST, port=pick_cluster_port([host]))
    figures: dict[str, Any] = {"low_rate_per_s": LOW_RATE_PER_S, "record_bytes": RECORD_BYTES}
    try:
        cluster.up()
        cluster.wait_for_brokers()
        admin = AdminClient(cluster.bootstrap_servers)
        try:
            errors = admin.create_topics([NewTopic(TOPIC, 1, 1)])
            assert errors[TOPIC] is None, errors[TOPIC]
        finally:
            admin.close()
        for rate in ("low", "high"):
            for mode in MODES:
                progress.print(f"{mode} at the {rate} rate: {sizes[rate]} records")
                figures.setdefault(rate, {})[mode] = run_one(cluster, mode, rate, sizes[rate])
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)
    return figures


def report(console: Console, figures: dict[str, Any]) -> None:
    table = Table("rate", "mode", "records/s", "p50 ms", "p99 ms", "broker µs CPU/record")
    for rate in ("low", "high"):
        for mode in MODES:
            f = figures[rate][mode]
            table.add_row(rate, mode, str(f["records_per_s"]), str(f["latency_p50_ms"]),
                          str(f["latency_p99_ms"]), str(f["broker_cpu_us_per_record"]))  # fmt: skip
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main(argv, __doc__.splitlines()[0] if __doc__ else "", "fetch_stream", run, report)


if __name__ == "__main__":
    raise SystemExit(main())
