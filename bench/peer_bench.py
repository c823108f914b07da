"""Side by side with the benchmark peer, NATS JetStream: the same workload, in one run, against a
3-node JetStream cluster (a replicas=3, file-backed stream) on 127.0.0.21-23 and a 3-node raftlog
cluster on 127.0.0.11-13, each from its Python client (nats-py; raftlog's gRPC client).

``python -m bench.peer_bench --out bench/results/latest.json [--quick] [--fio-direct-mib N]``

1. Produce 1 KiB records as fast as the client goes, every one acknowledged by the replicated
   store (raftlog: acks=all, RF 3, min.insync.replicas 2, one partition; JetStream: pipelined
   ``publish_async``, each PubAck awaited): records/s and MB/s.
2. Consume them from the beginning, three times (raftlog: a new Consumer each time; JetStream:
   a new pull consumer without acks, fetching 1,000 at a time): the median pass's records/s.
3. Latency at half of each system's own saturation rate (from step 1): the same 1 KiB
   records offered at that steady rate for ``LATENCY_SECONDS``, each one's time from send to
   acknowledgement: p50, p99, p999.

Every measured run of either system starts the same way (``measured_run``): the page cache's
dirty data written back to the disk (``os.sync``), so no run pays for the writeback of what the
runs before it wrote, and the heap set up before it frozen (``frozen_heap``), as long-running
Python services do after start-up.
4. Sustained produce (``bench.sustained``), on a topic / stream of its own bounded by
   ``retention.bytes`` / ``max_bytes``: as fast as the client goes for at least 30 s and until
   the replicas wrote three times the kernel's dirty-page limit; records/s and the p99 latency
   of the last 20 s.
5. Leader failover: SIGKILL the leader of the written partition (raftlog) / of the stream
   (JetStream) under a writer sending one record at a time; seconds until the first write sent
   after the kill is acknowledged. The killed node is started again after each round.

Each system's produce runs (steps 1 and 4) are also sampled system-wide with ``perf record -a``
(``bench.cpu_profile``): CPU µs per record, split by who ran (each system's leader, each
follower and the client, one process each; idle) and by what ran (the copy into page-cache pages,
other kernel work, Python, gRPC's C core, libc, CRC32C), kernel and C libraries included, which
py-spy does not see. At 999 samples a second per CPU, perf itself took 0.19 CPU seconds in a
6 s recording of both cores kept busy here (~1.6% of the machine).

Before either system starts, the free space is checked against what the sustained runs may
keep, then the machine's limits are measured (``bench.limits``): fio's sequential 64 KiB writes
(fdatasync and buffered), its direct writes and reads of 4 GiB in the work directory, and
iperf3 over loopback. After raftlog's
measured runs, it produces and consumes once more while py-spy samples its brokers
(``bench.profiles``; sampling slows them, so those runs are not figures): the folded stacks go
to ``bench/results/profiles/`` and their summary (busiest functions; the share under the
per-record codec, which must be nil on the broker) into the results.

Each process either system runs is stopped by its pid at the end, also on failure. The ratio
columns are raftlog ÷ JetStream (above 1: raftlog is faster; for latency and failover, below 1)
and raftlog ÷ the limit: produce MB/s against the disk's rates divided by the replication factor
(three copies on one disk; the target: sustained ≥ 90% of fio's direct write rate ÷ 3), consume
MB/s against loopback TCP.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from rich.console import Console

from bench import REPO_ROOT, bench_main, machine_info, utc_now
from bench.cpu_profile import STOP_TIMEOUT_S as PERF_READ_TIMEOUT_S
from bench.cpu_profile import breakdown, system_sampling
from bench.dataplane_bench import cluster_in, create_topic, delete_topic, failover_round
from bench.limits import FIO_DIRECT_BYTES, measure_limits, tool_version
from bench.peer_report import print_report
from bench.profiles import sampling, summarize
from bench.sustained import (
    FREE_MARGIN_BYTES,
    RETENTION_CHECK_INTERVAL_MS,
    SustainedPlan,
    check_free_space,
    device_written_bytes,
    jetstream_config,
    jetstream_sustained,
    plan_for,
    raftlog_sustained,
    raftlog_topic_configs,
    read_dirty_limit,
)
from dataplane.client import AdminClient
from dataplane.client.admin import PartitionDescription
from dataplane.tools.local_cluster import LocalCluster, free_port, wait_for
from dataplane.tools.owned_process import popen_owned
from dataplane.tools.perf import (
    THROTTLE_MIN_SLEEP_S,
    LatencySummary,
    latency_summary,
    run_consume_perf,
    run_produce_perf,
)
from raftlog.errors import ErrorCode, KafkaError

RAFTLOG_FIRST_HOST = 11
NATS_FIRST_HOST = 21
RECORD_BYTES = 1024
COPIES = 3  # the replication factor of both systems: each record is written three times
RECORDS = {"full": 100_000, "quick": 2_000}
FAILOVER_ROUNDS = {"full": 3, "quick": 1}
LATENCY_SECONDS = {"full": 10.0, "quick": 1.0}
CONSUME_PASSES = 3  # each reads everything from the beginning; the median pass is the figure
LATENCY_LOAD = 0.5  # the latency run offers this fraction of the measured saturation rate
PROFILES_DIR = REPO_ROOT / "bench" / "results" / "profiles"
STREAM, SUBJECT, TOPIC = "BENCH", "bench.data", "peer-bench"
SUSTAINED_STREAM, SUSTAINED_SUBJECT = "SUSTAINED", "bench.sustained"
SUSTAINED_TOPIC = "peer-sustained"
WAIT_S = 120.0
NATS_PENDING = 4_000  # publish_async acknowledgements outstanding at once
FETCH_BATCH = 1_000
STOP_TIMEOUT_S = 10.0


# -- the JetStream cluster -------------------------------------------------------------------------
@dataclass
class NatsNode:
    name: str
    host: str
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None


class JetStreamCluster:
    """Three nats-server processes with JetStream, routed to each other."""

    def __init__(self, root: Path, first_host: int = NATS_FIRST_HOST) -> None:
        self.root = root
        hosts = [f"127.0.0.{first_host + n}" for n in range(3)]
        self.port = free_port(hosts[0])
        self.route_port = free_port(hosts[0])
        self.nodes = [
            NatsNode(f"n{n + 1}", host, root / f"n{n + 1}.conf", root / f"n{n + 1}.log")
            for n, host in enumerate(hosts)
        ]
        for node in self.nodes:
            routes = ", ".join(
                f"nats-route://{other.host}:{self.route_port}"
                for other in self.nodes
                if other is not node
            )
            node.config.write_text(
                f"server_name: {node.name}\n"
                f"listen: {node.host}:{self.port}\n"
                f'jetstream {{ store_dir: "{root / node.name}" }}\n'
                f"cluster {{ name: bench, listen: {node.host}:{self.route_port}, "
                f"routes: [{routes}] }}\n"
            )

    @property
    def servers(self) -> list[str]:
        return [f"nats://{node.host}:{self.port}" for node in self.nodes]

    def start(self, node: NatsNode) -> None:
        server = shutil.which("nats-server")
        if server is None:
            raise RuntimeError("nats-server is not installed (make bench installs it)")
        with node.log.open("ab") as log:
            node.proc = popen_owned(  # dies with the benchmark, also when it is killed
                [server, "-c", str(node.config)], stdout=log, stderr=subprocess.STDOUT
            )

    def stop(self, node: NatsNode, kill: bool = False) -> None:
        proc = node.proc
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT_S)

    def node(self, name: str) -> NatsNode:
        return next(node for node in self.nodes if node.name == name)


@contextmanager
def jetstream_cluster(workdir: Path, console: Console) -> Iterator[JetStreamCluster]:
    root = Path(tempfile.mkdtemp(prefix="jetstream-", dir=workdir))
    cluster = JetStreamCluster(root)
    try:
        console.log(f"starting 3 JetStream servers: {', '.join(cluster.servers)}")
        for node in cluster.nodes:
            cluster.start(node)
        yield cluster
    finally:
        for node in cluster.nodes:
            cluster.stop(node)
        shutil.rmtree(root, ignore_errors=True)


async def _quiet(*_: Any) -> None:
    """nats-py's callbacks: a killed server's refused reconnects are the point, not news."""


async def _connect(cluster: JetStreamCluster) -> tuple[Any, JetStreamContext]:
    nc = await nats.connect(
        cluster.servers, connect_timeout=2, reconnect_time_wait=0.2, max_reconnect_attempts=-1,
        error_cb=_quiet, disconnected_cb=_quiet, reconnected_cb=_quiet,
    )  # fmt: skip
    return nc, nc.jetstream(timeout=5)


async def _create_stream(js: JetStreamContext) -> None:
    """Add the replicas=3 file stream."""
    config = StreamConfig(name=STREAM, subjects=[SUBJECT], num_replicas=3, storage=StorageType.FILE)
    await add_stream(js, config)


async def add_stream(js: JetStreamContext, config: StreamConfig) -> None:
    """Add a stream once the cluster has a JetStream meta leader."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            await js.add_stream(config)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)  # polling a condition with a deadline


async def nats_produce(js: JetStreamContext, records: int) -> dict[str, Any]:
    payload = os.urandom(RECORD_BYTES)
    failed = 0
    started = time.perf_counter()
    futures = [await js.publish_async(SUBJECT, payload, wait_stall=WAIT_S) for _ in range(records)]
    for future in futures:
        try:
            await asyncio.wait_for(future, WAIT_S)
        except Exception:  # noqa: BLE001 - a publish not acknowledged is counted, not raised
            failed += 1
    seconds = time.perf_counter() - started
    acked = records - failed
    return {
        "records": acked,
        "failed": failed,
        "seconds": round(seconds, 3),
        "records_per_s": round(acked / seconds),
        "mb_per_s": round(acked * RECORD_BYTES / seconds / 1e6, 1),
    }


async def nats_consume(js: JetStreamContext, records: int, reader: str) -> dict[str, Any]:
    subscription = await js.pull_subscribe(
        SUBJECT, durable=reader, config=ConsumerConfig(ack_policy=AckPolicy.NONE)
    )
    got = 0
    started = time.perf_counter()
    deadline = time.monotonic() + WAIT_S
    while got < records and time.monotonic() < deadline:
        try:
            messages = await subscription.fetch(FETCH_BATCH, timeout=5)
        except nats.errors.TimeoutError:
            continue
        got += len(messages)
    seconds = time.perf_counter() - started
    return {"records": got, "seconds": round(seconds, 3), "records_per_s": round(got / seconds)}


async def nats_latency(js: JetStreamContext, rate_per_s: float, seconds: float) -> dict[str, Any]:
    """Offer ``rate_per_s`` publishes for ``seconds``; each one's send-to-PubAck time."""
    loop = asyncio.get_running_loop()
    payload = os.urandom(RECORD_BYTES)
    count = max(1, int(rate_per_s * seconds))
    latencies_ms: list[float] = []
    failed = 0

    def settle(sent: float, future: asyncio.Future[Any]) -> None:
        nonlocal failed
        if future.cancelled() or future.exception() is not None:
            failed += 1
        else:
            latencies_ms.append((loop.time() - sent) * 1000)

    futures = []
    start = loop.time()
    for n in range(count):
        ahead_s = start + n / rate_per_s - loop.time()
        if ahead_s >= THROTTLE_MIN_SLEEP_S:  # the pacing of raftlog's perf tool (and Kafka's)
            await asyncio.sleep(ahead_s)  # pacing the offered rate, not a synchronisation
        sent = loop.time()
        future = await js.publish_async(SUBJECT, payload, wait_stall=WAIT_S)
        future.add_done_callback(functools.partial(settle, sent))
        futures.append(future)
    await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), WAIT_S)
    return _latency_figures(rate_per_s, seconds, latencies_ms, failed)


@contextmanager
def measured_run() -> Iterator[None]:
    """The start of every measured run of either system: nothing dirty in the page cache, and
    the heap frozen (``frozen_heap``).

    Without the ``os.sync``, a run paid for the writes of the runs before it. The kernel keeps
    written data dirty in the page cache until it is 30 s old (``vm.dirty_expire_centisecs``)
    or the dirty data passes ``vm.dirty_background_ratio`` (~2.3 GB here), and then writes it
    back while the next run goes on. Seen here in 10 s runs at half saturation, one after
    another: the first one's p99 14-27 ms, the ones after it 90-900 ms. In those, a segment's
    ``writev`` blocked up to ~400 ms in the kernel with the partition's lock held, and reads
    of pages under writeback waited too (``/proc/<pid>/task/*/stack``: page locks, writeback
    throttling ``wbt_wait``, the discard a rename issues on this ``discard``-mounted ext4).
    Both systems get the same start."""
    os.sync()
    with frozen_heap():
        yield


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Move every object alive now out of the garbage collector's sight (``gc.freeze``) for the
    block, as long-running Python services do after start-up: a full collection then walks
    only what the block allocates. Every measured run of both systems gets it; without it the
    full collections of this process (clusters, clients, earlier results) put tens of ms into
    raftlog's p99 here and took ~7% off its consume rate."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _median_pass(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """The median pass by records/s, with every pass's rate alongside."""
    ranked = sorted(passes, key=lambda done: done["records_per_s"])
    median = ranked[len(ranked) // 2]
    return {**median, "passes_records_per_s": [done["records_per_s"] for done in passes]}


def _latency_figures(
    rate_per_s: float, seconds: float, latencies_ms: list[float], failed: int
) -> dict[str, Any]:
    total_ms, worst_ms = sum(latencies_ms), max(latencies_ms, default=0.0)
    summary = latency_summary(latencies_ms, total_ms, len(latencies_ms), worst_ms)
    return _latency_section(rate_per_s, seconds, len(latencies_ms), failed, summary)


def _latency_section(
    rate_per_s: float, seconds: float, acknowledged: int, failed: int, summary: LatencySummary
) -> dict[str, Any]:
    quantiles = {"p50": summary.p50, "p99": summary.p99, "p999": summary.p999, "max": summary.max}
    return {
        "offered_records_per_s": round(rate_per_s),
        "seconds": seconds,
        "acknowledged": acknowledged,
        "failed": failed,
        "latency_ms": {name: round(value, 2) for name, value in quantiles.items()},
    }


async def nats_failover(cluster: JetStreamCluster, js: JetStreamContext) -> float:
    """SIGKILL the stream leader under a one-at-a-time writer; seconds to the next PubAck."""
    leader = (await js.stream_info(STREAM)).cluster
    assert leader is not None and leader.leader is not None, "a replicated stream has a leader"
    victim = cluster.node(leader.leader)
    for _ in range(50):  # writes flowing
        await js.publish(SUBJECT, b"x" * 100, timeout=5)
    cluster.stop(victim, kill=True)
    killed = time.monotonic()
    deadline = killed + WAIT_S
    resumed: float | None = None
    while resumed is None and time.monotonic() < deadline:
        try:
            await js.publish(SUBJECT, b"x" * 100, timeout=1)
            resumed = time.monotonic()
        except Exception:  # noqa: BLE001 - no leader yet: timeouts and "no responders"
            continue
    cluster.start(victim)
    if resumed is None:
        raise TimeoutError("JetStream took no write after its leader was killed")
    # the stream whole again before the next round: the killed server back and caught up
    while time.monotonic() < deadline:
        info = (await js.stream_info(STREAM)).cluster
        replicas = [] if info is None else list(info.replicas or [])
        if len(replicas) == 2 and all(r.current and not r.offline for r in replicas):
            break
        await asyncio.sleep(0.2)  # polling a condition with a deadline
    return resumed - killed


async def _stream_pids(
    cluster: JetStreamCluster, js: JetStreamContext, stream: str
) -> dict[str, list[int]]:
    """The pids of the stream's leader and of each follower, once it has a leader."""
    deadline = time.monotonic() + WAIT_S
    while (leader := (await js.stream_info(stream)).cluster) is None or leader.leader is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the stream {stream} has no leader")
        await asyncio.sleep(0.2)  # polling a condition with a deadline
    pids = {node.name: node.proc.pid for node in cluster.nodes if node.proc is not None}
    followers = [pid for name, pid in pids.items() if name != leader.leader]
    return process_roles(pids[leader.leader], followers)


def process_roles(leader: int | None, followers: Sequence[int | None]) -> dict[str, list[int]]:
    """The roles the CPU breakdown reports, one process each: ``leader``, ``follower_1``..."""
    roles = {"leader": [] if leader is None else [leader]}
    for n, pid in enumerate(followers, start=1):
        roles[f"follower_{n}"] = [] if pid is None else [pid]
    return roles


async def _jetstream_sustained(
    cluster: JetStreamCluster, js: JetStreamContext, plan: SustainedPlan, console: Console
) -> dict[str, Any]:
    """The sustained run on a stream of its own (bounded by ``max_bytes``), removed after."""
    await js.add_stream(jetstream_config(SUSTAINED_STREAM, SUSTAINED_SUBJECT, plan))
    roles = {**await _stream_pids(cluster, js, SUSTAINED_STREAM), "client": [os.getpid()]}
    console.log(f"JetStream sustained: >= {plan.run_s_min:.0f} s, >= {plan.disk_bytes_min:,} B")
    with measured_run(), system_sampling(cluster.root / "sustained.perf") as samples:
        before = device_written_bytes(cluster.root)
        sustained = await jetstream_sustained(js, SUSTAINED_SUBJECT, plan)
        sustained["device_written_bytes"] = _written_since(cluster.root, before)
    sustained["cpu"] = _sustained_cpu(samples, roles, sustained)
    await js.delete_stream(SUSTAINED_STREAM)
    return sustained


def _written_since(path: Path, before: int | None) -> int | None:
    after = device_written_bytes(path)
    return None if before is None or after is None else after - before


def _sustained_cpu(
    samples: Path, roles: dict[str, list[int]], sustained: dict[str, Any]
) -> dict[str, Any]:
    """perf's breakdown of a sustained run (its file can be large: read, then removed)."""
    try:
        return breakdown(
            samples, roles, sustained["records"], sustained["disk_bytes"],
            timeout_s=PERF_READ_TIMEOUT_S + sustained["seconds"],
        )  # fmt: skip
    finally:
        samples.unlink(missing_ok=True)


async def run_jetstream(
    cluster: JetStreamCluster,
    records: int,
    rounds: int,
    size: str,
    plan: SustainedPlan,
    console: Console,
) -> dict[str, Any]:
    nc, js = await _connect(cluster)
    try:
        await _create_stream(js)
        console.log(f"JetStream produce: {records:,} records of {RECORD_BYTES} B")
        roles = {**await _stream_pids(cluster, js, STREAM), "client": [os.getpid()]}
        with measured_run(), system_sampling(cluster.root / "produce.perf") as samples:
            produced = await nats_produce(js, records)
        produced["cpu"] = breakdown(
            samples, roles, produced["records"], produced["records"] * RECORD_BYTES * COPIES
        )
        console.log(f"JetStream consume x{CONSUME_PASSES}")
        passes = []
        for n in range(CONSUME_PASSES):
            with measured_run():
                passes.append(await nats_consume(js, produced["records"], f"bench-reader-{n}"))
        consumed = _median_pass(passes)
        rate = produced["records_per_s"] * LATENCY_LOAD
        console.log(f"JetStream latency at {rate:,.0f} records/s")
        with measured_run():
            latency = await nats_latency(js, rate, LATENCY_SECONDS[size])
        sustained = await _jetstream_sustained(cluster, js, plan, console)
        console.log(f"JetStream failover x{rounds}")
        failover = [round(await nats_failover(cluster, js), 3) for _ in range(rounds)]
    finally:
        await nc.close()
    return {
        "produce": produced,
        "sustained": sustained,
        "consume": consumed,
        "latency_at_half_saturation": latency,
        "failover_s": failover,
    }


# -- raftlog ---------------------------------------------------------------------------------------
def _replica_pids(cluster: LocalCluster, topic: str = TOPIC) -> dict[str, list[int]]:
    """The pids of the written partition's leader and of each follower."""
    admin = AdminClient(cluster.bootstrap_servers)

    def described() -> PartitionDescription | None:
        try:
            return admin.describe_topics([topic])[topic].partitions[0]
        except KafkaError as error:  # the broker asked may not know the new topic yet
            if error.retriable or error.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                return None
            raise

    try:
        partition = wait_for(f"{topic} described", described)
    finally:
        admin.close()
    followers = [cluster.pid(node) for node in partition.replicas if node != partition.leader]
    return process_roles(cluster.pid(partition.leader), followers)


def _raftlog_sustained(
    cluster: LocalCluster, plan: SustainedPlan, console: Console
) -> dict[str, Any]:
    """The sustained run on a topic of its own (bounded by ``retention.bytes``), deleted after."""
    create_topic(cluster, SUSTAINED_TOPIC, 1, raftlog_topic_configs(plan))
    roles = {**_replica_pids(cluster, SUSTAINED_TOPIC), "client": [os.getpid()]}
    console.log(f"raftlog sustained: >= {plan.run_s_min:.0f} s, >= {plan.disk_bytes_min:,} B")
    with measured_run(), system_sampling(cluster.root / "sustained.perf") as samples:
        before = device_written_bytes(cluster.root)
        sustained = raftlog_sustained(cluster.bootstrap_servers, SUSTAINED_TOPIC, plan)
        sustained["device_written_bytes"] = _written_since(cluster.root, before)
    sustained["cpu"] = _sustained_cpu(samples, roles, sustained)
    delete_topic(cluster, SUSTAINED_TOPIC)
    return sustained


def _profiled_runs(cluster: LocalCluster, records: int, console: Console) -> dict[str, Any]:
    """Produce and consume once more with py-spy sampling the brokers. Apart from the figures
    above: sampling two brokers at 200 Hz took ~40% off the produce rate here."""
    replicas = _replica_pids(cluster)
    brokers = {"leader": replicas["leader"][0], "follower": replicas["follower_1"][0]}
    console.log(f"raftlog again, {records:,} records, py-spy on {brokers} (not in the figures)")
    with sampling(brokers, PROFILES_DIR, "produce") as produce_profiles:
        run_produce_perf(cluster.bootstrap_servers, TOPIC, records, RECORD_BYTES)
    with sampling({"leader": brokers["leader"]}, PROFILES_DIR, "consume") as consume_profiles:
        run_consume_perf(cluster.bootstrap_servers, TOPIC, records)
    return {
        **{f"produce_{role}": summarize(path) for role, path in produce_profiles.items()},
        **{f"consume_{role}": summarize(path) for role, path in consume_profiles.items()},
    }


def run_raftlog(
    cluster: LocalCluster,
    records: int,
    rounds: int,
    size: str,
    plan: SustainedPlan,
    console: Console,
) -> dict[str, Any]:
    create_topic(cluster, TOPIC, 1)  # min.insync.replicas 2, RF 3, once it has a leader
    roles = {**_replica_pids(cluster), "client": [os.getpid()]}
    console.log(f"raftlog produce: {records:,} records of {RECORD_BYTES} B")
    with measured_run(), system_sampling(cluster.root / "produce.perf") as samples:
        produced = run_produce_perf(cluster.bootstrap_servers, TOPIC, records, RECORD_BYTES)
    cpu = breakdown(samples, roles, produced.records, produced.records * RECORD_BYTES * COPIES)
    console.log(f"raftlog consume x{CONSUME_PASSES}")
    passes = []
    for _ in range(CONSUME_PASSES):
        with measured_run():
            done = run_consume_perf(cluster.bootstrap_servers, TOPIC, produced.records)
        passes.append({
            "records": done.records,
            "seconds": round(done.seconds, 3),
            "records_per_s": round(done.records_per_s),
            "mb_per_s": round(done.payload_bytes / done.seconds / 1e6, 1),
        })  # fmt: skip
    consumed = _median_pass(passes)
    rate = produced.records_per_s * LATENCY_LOAD
    console.log(f"raftlog latency at {rate:,.0f} records/s")
    with measured_run():
        steady = run_produce_perf(
            cluster.bootstrap_servers, TOPIC, max(1, int(rate * LATENCY_SECONDS[size])),
            RECORD_BYTES, throughput_per_s=rate,
        )  # fmt: skip
    sustained = _raftlog_sustained(cluster, plan, console)
    profiles = _profiled_runs(cluster, records, console)
    console.log(f"raftlog failover x{rounds}")
    failover = [round(failover_round(cluster, TOPIC), 3) for _ in range(rounds)]
    return {
        "produce": {
            "records": produced.records,
            "failed": produced.errors,
            "seconds": round(produced.seconds, 3),
            "records_per_s": round(produced.records_per_s),
            "mb_per_s": round(produced.records * RECORD_BYTES / produced.seconds / 1e6, 1),
            "cpu": cpu,
        },
        "sustained": sustained,
        "consume": consumed,
        "latency_at_half_saturation": _latency_section(
            rate, LATENCY_SECONDS[size], steady.records, steady.errors, steady.latency_ms
        ),
        "failover_s": failover,
        "broker_profiles": profiles,
    }


# -- the run ---------------------------------------------------------------------------------------
def run(
    workdir: Path, size: str, console: Console, direct_bytes: int | None = None
) -> dict[str, Any]:
    """The whole comparison; ``direct_bytes``: the size of fio's direct jobs (default: 4 GiB,
    64 MiB for a quick run)."""
    records, rounds = RECORDS[size], FAILOVER_ROUNDS[size]
    dirty = read_dirty_limit()
    plan = plan_for(size, dirty, COPIES, RECORD_BYTES)
    fio_bytes = FIO_DIRECT_BYTES[size] if direct_bytes is None else direct_bytes
    needed = max(plan.space_needed_bytes(), fio_bytes) + FREE_MARGIN_BYTES[size]
    free = shutil.disk_usage(workdir).free
    check_free_space(free, needed, workdir)
    started = utc_now()
    console.log("the machine's limits: fio, iperf3")
    hosts = (f"127.0.0.{RAFTLOG_FIRST_HOST}", f"127.0.0.{RAFTLOG_FIRST_HOST + 1}")
    limits = measure_limits(workdir, hosts, size, COPIES, direct_bytes)
    with jetstream_cluster(workdir, console) as jetstream:
        peer = asyncio.run(run_jetstream(jetstream, records, rounds, size, plan, console))
    # the sustained topic's segments are deleted every few seconds, not every 5 minutes
    retention: dict[str, str | int] = {
        "log.retention.check.interval.ms": RETENTION_CHECK_INTERVAL_MS
    }
    with cluster_in(workdir, console, RAFTLOG_FIRST_HOST, retention) as cluster:
        ours = run_raftlog(cluster, records, rounds, size, plan, console)
    return {
        "date": started,
        "machine": machine_info(),
        "record_bytes": RECORD_BYTES,
        "records": records,
        "replication_factor": COPIES,
        "limits": limits,
        "sustained_plan": {
            **plan.to_json(),
            "dirty_limit": dirty.to_json(),
            "free_bytes_before": free,
        },
        "raftlog": {**ours, "hosts": "127.0.0.11-13", "partitions": 1, "client": "gRPC client"},
        "jetstream": {
            **peer,
            "hosts": "127.0.0.21-23",
            "client": "nats-py",
            "server": tool_version("nats-server"),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``bench_main``'s options, and ``--fio-direct-mib``: the size of fio's direct jobs."""
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument(
        "--fio-direct-mib",
        type=int,
        default=None,
        help="the size of fio's direct jobs in MiB (default 4,096; less with --quick)",
    )
    options, rest = own.parse_known_args(argv)
    direct_bytes = None if options.fio_direct_mib is None else options.fio_direct_mib * 1024 * 1024

    def figures(workdir: Path, quick: bool, progress: Console) -> dict[str, Any]:
        return run(workdir, "quick" if quick else "full", progress, direct_bytes)

    return bench_main(rest, __doc__.splitlines()[0], "peer", figures, print_report, own)


if __name__ == "__main__":
    sys.exit(main())
