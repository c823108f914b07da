"""End-to-end latency: a record produced (acks=all, RF 3, 1 KiB) until a consumer in another
process holds it, at half of the saturation rate measured in the same run (issue 32's target:
p99 ≤ 10 ms).

``python -m bench.e2e_latency --out bench/results/latest.json [--quick] [--rate N]``

A 3-node LocalCluster on 127.0.0.11-13 (``--first-host`` moves it), data in a temporary directory
removed afterwards.

1. Saturation: ``bench.sustained``'s raftlog run for ``SATURATION_S`` (no dirty-limit bound: a
   rate to take half of, not a disk figure) on a topic of its own; records/s over its last
   ``SATURATION_WINDOW_S``. ``--rate N`` skips it and offers N records/s instead.
2. For each client, on a fresh one-partition topic (RF 3, ``min.insync.replicas`` 2): a consumer
   *process* (``python -m bench.e2e_latency consume``, dying with this one) assigned to the
   partition from offset 0; ``WARMUP_RECORDS`` records to see it fetching; then records offered at
   ``LOAD`` x saturation for ``SECONDS`` by a producer in this process with the client's defaults
   (acks=all, linger.ms 5), each value starting with its send time, ``time.monotonic_ns()``. The
   consumer notes, per record, the time ``poll`` handed it over minus that stamp: CLOCK_MONOTONIC
   is one clock for every process of a Linux machine, so no clock sync is in the figure.

   - ``grpc``: raftlog's clients (``Producer``, ``Consumer``: long-poll Fetch, fetch.max.wait.ms
     500) on the BROKER listener;
   - ``kafka``: confluent-kafka (librdkafka, its defaults but acks=all) on the KAFKA listener.

3. JetStream (``bench.peer_bench``'s 3-node cluster on 127.0.0.21-23, a replicas=3 file stream,
   nats-py; skipped when nats-server is missing), at half of *its own* saturation (raftlog's
   rate would swamp it), measured the same way (``bench.sustained``'s JetStream run, time-bound):
   a consumer process with an ordered push consumer from the stream's start, the publisher's
   ``publish_async`` paced in this process. It runs first, and raftlog's gRPC clients run
   again at its rate (``grpc_at_jetstream_rate``): the same load for both.

The figures: p50, p99, p999 and max of receive - send, per client, and the records counted.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
import nats
import numpy
from nats.js.api import StorageType, StreamConfig
from rich.console import Console
from rich.table import Table

from bench import RECORD_BYTES, bench_main
from bench.dataplane_bench import cluster_in, create_topic, delete_topic
from bench.peer_bench import add_stream, jetstream_cluster
from bench.sustained import (
    QUANTILES,
    SustainedPlan,
    jetstream_config,
    jetstream_sustained,
    nearest_rank,
    raftlog_sustained,
    raftlog_topic_configs,
)
from dataplane.client import Consumer, Producer, TopicPartition
from dataplane.tools.local_cluster import LocalCluster, wait_for
from dataplane.tools.owned_process import popen_owned
from dataplane.tools.perf import THROTTLE_MIN_SLEEP_S

FIRST_HOST = 11  # the benchmarks' local cluster, 127.0.0.11-13 (ports picked free)
COPIES = 3
LOAD = 0.5  # the offered rate: this fraction of the saturation rate
SECONDS = {"full": 20.0, "quick": 2.0}
SATURATION_S = {"full": 10.0, "quick": 2.0}
SATURATION_WINDOW_S = {"full": 5.0, "quick": 1.0}
SEGMENT_BYTES = 16 * 1024 * 1024
WARMUP_RECORDS = 20
CLIENTS = ("grpc", "kafka")  # on raftlog; "jetstream": the peer, on its own cluster
JETSTREAM = "jetstream"
GRPC_AT_JETSTREAM_RATE = "grpc_at_jetstream_rate"  # raftlog's clients at JetStream's rate
JS_STREAM, JS_SUBJECT = "E2E", "e2e.data"
JS_SATURATION_STREAM, JS_SATURATION_SUBJECT = "E2ESAT", "e2e.saturation"
P99_TARGET_MS = 10.0
WAIT_S = 120.0
ABANDON_S = 1.0  # a failed run's producer: how long close() may still deliver
# a value: the send time (ns, CLOCK_MONOTONIC) first; warm-up records carry WARMUP_STAMP
STAMP = struct.Struct(">q")
WARMUP_STAMP = -1
CONSUMER_GROUP = "bench-e2e"


# -- the pure core ---------------------------------------------------------------------------
def stamped(sent_ns: int, padding: bytes) -> bytes:
    """A record's value: its send time, then ``padding`` up to the record size."""
    return STAMP.pack(sent_ns) + padding


def latency_ms(value: bytes, received_ns: int) -> float | None:
    """receive - send of a stamped value, ms; None for a warm-up record (or a foreign one)."""
    if len(value) < STAMP.size:
        return None
    (sent_ns,) = STAMP.unpack_from(value)
    return None if sent_ns < 0 else (received_ns - sent_ns) / 1e6


def due_in_s(start: float, sent: int, rate_per_s: float, now: float) -> float:
    """How long before record ``sent`` is due at ``rate_per_s`` (≤ 0: due now)."""
    return start + sent / rate_per_s - now


def summary(latencies_ms: Sequence[float], expected: int) -> dict[str, Any]:
    """The quantiles of receive - send (nearest rank, as ``bench.sustained``), with counts."""
    ordered = numpy.sort(numpy.asarray(latencies_ms, dtype=numpy.float64))
    return {
        "records": expected,
        "received": len(ordered),
        "latency_ms": {name: round(nearest_rank(ordered, q), 2) for name, q in QUANTILES},
    }


def saturation_plan(size: str) -> SustainedPlan:
    """``bench.sustained``'s run, bounded by time only."""
    return SustainedPlan(
        run_s_min=SATURATION_S[size], run_s_max=SATURATION_S[size] * 3,
        window_s=SATURATION_WINDOW_S[size], disk_bytes_min=0,
        retention_bytes=8 * SEGMENT_BYTES, segment_bytes=SEGMENT_BYTES, copies=COPIES,
        record_bytes=RECORD_BYTES,
    )  # fmt: skip


# -- the consumer process --------------------------------------------------------------------
@dataclass(frozen=True)
class ConsumerJob:
    client: str  # "grpc" or "kafka"
    bootstrap: list[str]
    topic: str
    count: int  # stamped records to wait for (warm-up ones aside)
    ready_path: Path  # created once the warm-up records came: it is fetching
    out_path: Path  # the latencies, float64 ms, written at the end

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "bench.e2e_latency", "consume", "--client", self.client,
            "--bootstrap", ",".join(self.bootstrap), "--topic", self.topic,
            "--count", str(self.count), "--ready", str(self.ready_path),
            "--latencies", str(self.out_path),
        ]  # fmt: skip


class _Collector:
    """The consumer process's tally: warm-up records, then each stamped one's latency."""

    def __init__(self, job: ConsumerJob) -> None:
        self.job = job
        self.warmed = 0
        self.latencies = array("d")

    def add(self, values: Sequence[bytes], received_ns: int) -> None:
        for value in values:
            found = latency_ms(value, received_ns)
            if found is None:
                self.warmed += 1
                if self.warmed == WARMUP_RECORDS:
                    self.job.ready_path.touch()
            else:
                self.latencies.append(found)

    @property
    def done(self) -> bool:
        return len(self.latencies) >= self.job.count


def consume(job: ConsumerJob, deadline_s: float = WAIT_S) -> None:
    """Read the partition from offset 0 until ``job.count`` stamped records came or the
    deadline passed; write their latencies."""
    collector = _Collector(job)
    deadline = time.monotonic() + deadline_s
    if job.client == "grpc":
        _consume_grpc(job, collector, deadline)
    elif job.client == JETSTREAM:
        asyncio.run(_consume_jetstream(job, collector, deadline))
    else:
        _consume_kafka(job, collector, deadline)
    job.out_path.write_bytes(collector.latencies.tobytes())


def _consume_grpc(job: ConsumerJob, collector: _Collector, deadline: float) -> None:
    tp = TopicPartition(job.topic, 0)
    with Consumer(job.bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        while not collector.done and time.monotonic() < deadline:
            polled = consumer.poll(100)
            received_ns = time.monotonic_ns()
            for records in polled.values():
                collector.add([r.value or b"" for r in records], received_ns)


def _consume_kafka(job: ConsumerJob, collector: _Collector, deadline: float) -> None:
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": ",".join(job.bootstrap), "group.id": CONSUMER_GROUP,
        "enable.auto.commit": False,
    })  # fmt: skip
    try:
        consumer.assign([confluent_kafka.TopicPartition(job.topic, 0, 0)])
        while not collector.done and time.monotonic() < deadline:
            # poll returns with the first message; consume(n, 0) then takes what is buffered.
            # consume(500, 0.1) alone waited for 500 messages or the whole 100 ms (librdkafka's
            # batch semantics): ~50 ms of every record's figure at low rates was that wait.
            first = consumer.poll(0.1)
            if first is None:
                continue
            messages = [first, *consumer.consume(500, 0)]
            received_ns = time.monotonic_ns()
            collector.add([m.value() or b"" for m in messages if m.error() is None], received_ns)
    finally:
        consumer.close()


async def _quiet(*_: Any) -> None:
    """nats-py's error callback: a server not up yet is retried, not news."""


async def _consume_jetstream(job: ConsumerJob, collector: _Collector, deadline: float) -> None:
    """An ordered push consumer from the stream's start (nats-py's low-latency reader: the
    server pushes each message as it is stored; no pull round trip)."""
    nc = await nats.connect(job.bootstrap, connect_timeout=5, error_cb=_quiet)
    try:
        js = nc.jetstream(timeout=10)
        subscription = await js.subscribe(job.topic, ordered_consumer=True)
        while not collector.done and time.monotonic() < deadline:
            try:
                message = await subscription.next_msg(timeout=0.1)
            except nats.errors.TimeoutError:
                continue
            collector.add([message.data], time.monotonic_ns())
    finally:
        await nc.close()


@contextmanager
def consumer_process(job: ConsumerJob) -> Iterator[subprocess.Popen[bytes]]:
    """The consumer, started and stopped by its pid (it dies with this process too)."""
    log = job.out_path.with_suffix(".log")
    with log.open("ab") as out:
        proc = popen_owned(job.argv(), stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT_S)


# -- the producers -----------------------------------------------------------------------------
Send = Callable[[bytes], None]


@contextmanager
def grpc_producer(bootstrap: list[str], topic: str) -> Iterator[Send]:
    producer = Producer(bootstrap, acks="all")

    def send(value: bytes) -> None:
        producer.send(topic, value, partition=0)

    delivered = False
    try:
        yield send
        producer.flush(WAIT_S)
        delivered = True
    finally:
        # a run that failed or was stopped (SIGTERM) does not wait for its records' delivery
        producer.close(None if delivered else ABANDON_S)


@contextmanager
def kafka_producer(bootstrap: list[str], topic: str) -> Iterator[Send]:
    producer = confluent_kafka.Producer({"bootstrap.servers": ",".join(bootstrap), "acks": "all"})

    def send(value: bytes) -> None:
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:  # librdkafka's queue is full: serve callbacks, then again
                producer.poll(0.01)
        producer.poll(0)

    yield send
    left = producer.flush(WAIT_S)
    if left:
        raise RuntimeError(f"{left} records not delivered by librdkafka in {WAIT_S} s")


def paced_sends(send: Send, rate_per_s: float, seconds: float) -> int:
    """Offer ``rate_per_s`` stamped records for ``seconds`` (sleeping once a record is
    ``THROTTLE_MIN_SLEEP_S`` ahead, as Kafka's ThroughputThrottler); the count sent."""
    padding = os.urandom(RECORD_BYTES - STAMP.size)
    count = max(1, int(rate_per_s * seconds))
    start = time.monotonic()
    for sent in range(count):
        ahead_s = due_in_s(start, sent, rate_per_s, time.monotonic())
        if ahead_s >= THROTTLE_MIN_SLEEP_S:
            time.sleep(ahead_s)  # pacing the offered rate, not a synchronisation
        send(stamped(time.monotonic_ns(), padding))
    return count


def e2e_run(
    bootstrap: list[str],
    client: str,
    topic: str,
    rate_per_s: float,
    seconds: float,
    workdir: Path,
) -> dict[str, Any]:
    """One client's run on ``topic`` (one partition, empty): the consumer process, the warm-up,
    the paced records; the summary of their latencies."""
    count = max(1, int(rate_per_s * seconds))
    job = ConsumerJob(
        client, bootstrap, topic, count, workdir / f"{topic}.ready", workdir / f"{topic}.latencies"
    )
    producer = grpc_producer if client == "grpc" else kafka_producer
    with consumer_process(job) as proc:
        with producer(bootstrap, topic) as send:
            for _ in range(WARMUP_RECORDS):
                send(STAMP.pack(WARMUP_STAMP))
            wait_for(
                f"the {client} consumer to fetch",
                lambda: job.ready_path.exists() or proc.poll() is not None,
                WAIT_S,
            )
            paced_sends(send, rate_per_s, seconds)
        status = proc.wait(timeout=WAIT_S)  # it ends once it holds every record
    if status != 0:
        raise RuntimeError(f"the {client} consumer exited {status}: {job.out_path}.log")
    latencies = numpy.frombuffer(job.out_path.read_bytes(), dtype=numpy.float64)
    return summary(latencies.tolist(), count)


async def _jetstream_figures(
    servers: list[str], size: str, workdir: Path, console: Console
) -> dict[str, Any]:
    """JetStream at half of its own saturation (its own rate: raftlog's would swamp it)."""
    nc = await nats.connect(servers, connect_timeout=5, error_cb=_quiet)
    try:
        js = nc.jetstream(timeout=10)
        plan = saturation_plan(size)
        await add_stream(js, jetstream_config(JS_SATURATION_STREAM, JS_SATURATION_SUBJECT, plan))
        console.log(f"JetStream saturation: {plan.run_s_min:.0f} s")
        saturated = await jetstream_sustained(js, JS_SATURATION_SUBJECT, plan)
        await js.delete_stream(JS_SATURATION_STREAM)
        rate = saturated["last"]["records_per_s"] * LOAD
        config = StreamConfig(
            name=JS_STREAM, subjects=[JS_SUBJECT], num_replicas=COPIES, storage=StorageType.FILE
        )
        await add_stream(js, config)
        count = max(1, int(rate * SECONDS[size]))
        job = ConsumerJob(
            JETSTREAM, servers, JS_SUBJECT, count, workdir / "js.ready", workdir / "js.latencies"
        )
        console.log(f"jetstream: {rate:,.0f} records/s for {SECONDS[size]:.0f} s")
        with consumer_process(job) as proc:
            for _ in range(WARMUP_RECORDS):
                await js.publish(JS_SUBJECT, STAMP.pack(WARMUP_STAMP))
            loop = asyncio.get_running_loop()
            deadline = time.monotonic() + WAIT_S
            while not job.ready_path.exists() and proc.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("the jetstream consumer did not fetch")
                await asyncio.sleep(0.05)  # polling a condition with a deadline
            padding = os.urandom(RECORD_BYTES - STAMP.size)
            pending = []
            start = time.monotonic()
            for sent in range(count):
                ahead_s = due_in_s(start, sent, rate, time.monotonic())
                if ahead_s >= THROTTLE_MIN_SLEEP_S:
                    await asyncio.sleep(ahead_s)  # pacing the offered rate
                value = stamped(time.monotonic_ns(), padding)
                pending.append(await js.publish_async(JS_SUBJECT, value, wait_stall=WAIT_S))
            await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), WAIT_S)
            status = await loop.run_in_executor(None, functools.partial(proc.wait, WAIT_S))
        if status != 0:
            raise RuntimeError(f"the jetstream consumer exited {status}: {job.out_path}.log")
        latencies = numpy.frombuffer(job.out_path.read_bytes(), dtype=numpy.float64)
        return {
            "saturation": {"records_per_s": saturated["last"]["records_per_s"]},
            "offered_records_per_s": round(rate),
            **summary(latencies.tolist(), count),
        }
    finally:
        await nc.close()


def jetstream_figures(size: str, workdir: Path, console: Console) -> dict[str, Any]:
    """The same run against a 3-node JetStream cluster (``bench.peer_bench``'s, 127.0.0.21-23),
    from nats-py; a consumer process with an ordered push consumer."""
    with jetstream_cluster(workdir, console) as cluster:
        return asyncio.run(_jetstream_figures(cluster.servers, size, workdir, console))


def kafka_bootstrap(cluster: LocalCluster, client: str) -> list[str]:
    return cluster.bootstrap_servers if client == "grpc" else cluster.kafka_bootstrap_servers


def saturation(cluster: LocalCluster, size: str, console: Console) -> dict[str, Any]:
    plan = saturation_plan(size)
    topic = "e2e-saturation"
    create_topic(cluster, topic, 1, raftlog_topic_configs(plan))
    console.log(f"saturation: {plan.run_s_min:.0f} s as fast as the gRPC client goes")
    figures = raftlog_sustained(cluster.bootstrap_servers, topic, plan)
    delete_topic(cluster, topic)
    return {"records_per_s": figures["last"]["records_per_s"]}


def measure(
    cluster: LocalCluster,
    size: str,
    console: Console,
    workdir: Path,
    rate_per_s: float | None = None,
    clients: Sequence[str] = CLIENTS,
    topic_prefix: str = "e2e",
) -> dict[str, Any]:
    """The section's figures on a running cluster (``bench.netem`` runs it in namespaces)."""
    figures: dict[str, Any] = {
        "record_bytes": RECORD_BYTES, "replication_factor": COPIES, "acks": "all",
        "load": LOAD, "offered_s": SECONDS[size], "p99_target_ms": P99_TARGET_MS,
    }  # fmt: skip
    if rate_per_s is None:
        figures["saturation"] = saturation(cluster, size, console)
        rate_per_s = figures["saturation"]["records_per_s"] * LOAD
    figures["offered_records_per_s"] = round(rate_per_s)
    for client in clients:
        topic = f"{topic_prefix}-{client}"
        create_topic(cluster, topic, 1)
        console.log(f"{client}: {rate_per_s:,.0f} records/s for {SECONDS[size]:.0f} s")
        figures[client] = e2e_run(
            kafka_bootstrap(cluster, client), client, topic, rate_per_s, SECONDS[size], workdir
        )
    return figures


def run(
    workdir: Path, size: str, console: Console, rate_per_s: float | None, first_host: int
) -> dict[str, Any]:
    """JetStream first (so raftlog's gRPC clients run at its rate too), then raftlog."""
    scratch = Path(tempfile.mkdtemp(prefix="e2e-", dir=workdir))
    try:
        peer = None
        if shutil.which("nats-server") is None:
            console.log(
                "[yellow]no nats-server: JetStream not run[/yellow] (make bench installs it)"
            )
        else:
            peer = jetstream_figures(size, scratch, console)
        with cluster_in(workdir, console, first_host) as cluster:
            figures = measure(cluster, size, console, scratch, rate_per_s)
            if peer is not None:
                rate = peer["offered_records_per_s"]
                create_topic(cluster, "e2e-grpc-at-jetstream", 1)
                console.log(f"grpc at JetStream's rate: {rate:,} records/s")
                figures[GRPC_AT_JETSTREAM_RATE] = {
                    "offered_records_per_s": rate,
                    **e2e_run(
                        cluster.bootstrap_servers, "grpc", "e2e-grpc-at-jetstream", rate,
                        SECONDS[size], scratch,
                    ),
                }  # fmt: skip
                figures[JETSTREAM] = peer
        return figures
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report(console: Console, figures: dict[str, Any]) -> None:
    table = Table(
        "client", "offered records/s", "received", "p50 ms", "p99 ms", "p999 ms", "max ms"
    )
    for client in (*CLIENTS, GRPC_AT_JETSTREAM_RATE, JETSTREAM):
        found = figures.get(client)
        if found is None:
            continue
        latency = found["latency_ms"]
        offered = found.get("offered_records_per_s", figures["offered_records_per_s"])
        table.add_row(
            client, f"{offered:,}", f"{found['received']:,}",
            *(str(latency[q]) for q in ("p50", "p99", "p999", "max")),
        )  # fmt: skip
    console.print(table)


def _consume_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.e2e_latency consume")
    parser.add_argument("--client", choices=(*CLIENTS, JETSTREAM), required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--latencies", type=Path, required=True)
    args = parser.parse_args(argv)
    job = ConsumerJob(
        args.client, args.bootstrap.split(","), args.topic, args.count, args.ready, args.latencies
    )
    consume(job)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``bench_main``'s options, ``--rate N`` (records/s offered; default: half the saturation
    measured first) and ``--first-host``; ``consume ...``: the consumer process."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["consume"]:
        return _consume_main(args[1:])
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument(
        "--rate",
        type=float,
        default=None,
        help="records/s offered (default: half the saturation measured first)",
    )
    own.add_argument(
        "--first-host",
        type=int,
        default=FIRST_HOST,
        help=f"the cluster's first address, 127.0.0.N (default {FIRST_HOST})",
    )
    options, rest = own.parse_known_args(args)

    def figures(workdir: Path, quick: bool, progress: Console) -> dict[str, Any]:
        size = "quick" if quick else "full"
        return run(workdir, size, progress, options.rate, options.first_host)

    return bench_main(
        rest, __doc__.splitlines()[0] if __doc__ else "", "end_to_end", figures, report, own
    )


if __name__ == "__main__":
    sys.exit(main())
