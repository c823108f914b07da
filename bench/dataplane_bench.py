"""Data-plane benchmark: produce and consume through a real 3-node cluster, leader failover, and
where the produce path spends its time.

``python -m bench.dataplane_bench --out bench/results/latest.json [--quick]``

A LocalCluster of 3 combined nodes on 127.0.0.74-76 (reserved for this benchmark; ``--first-host
N`` moves it), data in a temporary directory removed afterwards.

1. ``raftlog perf produce``'s core (:func:`dataplane.tools.perf.run_produce_perf`): 1 KiB records,
   acks=all, replication factor 3, ``min.insync.replicas`` 2, 6 partitions, the idempotent
   producer's defaults (batch.size 16 KiB, linger.ms 5): records/s, MB/s, latency percentiles.
2. ``raftlog perf consume``'s core: the same records read back from the beginning.
3. Failover: one producer thread writes acks=all records one at a time to a 1-partition topic;
   the partition's leader is SIGKILLed; the figure is the time from the kill to the first
   acknowledgement of a record sent after it. Each round restarts the node and waits until it is
   back in the ISR.
4. Profile: a second produce run under py-spy (the busiest node and this client process),
   folded into the functions that hold the most non-idle samples.

Section ``idempotence`` (also alone, with ``--idempotence-only``):

5. Idempotent vs plain produce, same cluster, same topic (6 partitions, RF 3, acks=all both):
   the idempotent producer as configured by default (5 batches in flight per partition), the
   idempotent producer with one batch in flight (what a plain producer is limited to, to keep its
   order), and ``enable.idempotence=false``; rounds alternate the variants. Records/s and the
   brokers' CPU seconds.
6. Partition open time with a large log (1 KiB idempotent batches from 200 producer ids, 128 MiB
   segments, 4.5 segments): the producer state from snapshots (after a clean stop: the one at the
   log end; as after SIGKILL: the last roll's, plus the active segment's headers) against a full
   rescan of the batch headers (no snapshots, what opening did before they existed).

Every loop is bounded; every wait polls a condition with a deadline.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import REPO_ROOT, write_section
from bench.profiles import py_spy
from dataplane.broker.malloc_tuning import tune_malloc
from dataplane.broker.partition import Partition
from dataplane.client import AdminClient, NewTopic, Producer
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port, wait_for
from dataplane.tools.perf import run_consume_perf, run_produce_perf
from metadata_quorum.image import PartitionRegistration
from raftlog.config import LogConfig
from raftlog.errors import KafkaError
from raftlog.log import CLEAN_SHUTDOWN_MARKER, Log, wall_clock_ms
from raftlog.records import encode_batch

FIRST_HOST = 74  # 127.0.0.74-76 are this benchmark's
RECORD_BYTES = 1024
PARTITIONS = 6
FAILOVER_TARGET_S = 5.0
PACED_FRACTION = 0.5  # the paced run offers half the unthrottled throughput
WAIT_S = 60.0
# Leaf frames of threads that wait (py-spy samples them too): not where time goes.
IDLE_LEAVES = (
    "wait (threading.py", ".poll (pysyncobj", "select (selectors.py", "_serve (grpc",
    "_worker (concurrent", "channel_spin (grpc", "_blocking (grpc", "_wait_for_tstate_lock",
    "accept (socket.py",
)  # fmt: skip


MiB = 1024 * 1024
OPEN_SEGMENT_BYTES = 128 * MiB
OPEN_PRODUCERS = 200
OPEN_ROUNDS = 3


@dataclass(frozen=True)
class Sizes:
    produce_records: int
    paced_s: int
    profile_records: int
    failover_rounds: int
    profile_s: int
    idempotence_records: int
    idempotence_rounds: int
    open_log_bytes: int


FULL = Sizes(
    produce_records=100_000, paced_s=10, profile_records=60_000, failover_rounds=3, profile_s=8,
    idempotence_records=30_000, idempotence_rounds=3, open_log_bytes=576 * MiB,
)  # fmt: skip
QUICK = Sizes(
    produce_records=3_000, paced_s=1, profile_records=3_000, failover_rounds=1, profile_s=2,
    idempotence_records=2_000, idempotence_rounds=1, open_log_bytes=6 * MiB,
)  # fmt: skip


@dataclass(frozen=True)
class ProduceVariant:
    name: str
    idempotent: bool
    max_in_flight: int  # max.in.flight.requests.per.connection (a plain producer sends 1)


PRODUCE_VARIANTS = (
    ProduceVariant("idempotent", True, 5),
    ProduceVariant("idempotent_1_in_flight", True, 1),
    ProduceVariant("plain", False, 5),
)


@contextmanager
def cluster_in(
    workdir: Path,
    console: Console,
    first_host: int = FIRST_HOST,
    overrides: dict[str, str | int] | None = None,
) -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix="dataplane-", dir=workdir))
    hosts = [f"127.0.0.{first_host + n}" for n in range(3)]
    port = pick_cluster_port(hosts)
    cluster = LocalCluster(root, nodes=3, first_host=first_host, port=port, overrides=overrides)
    try:
        console.log(f"starting 3 nodes on {', '.join(cluster.bootstrap_servers)}")
        cluster.up(timeout_s=WAIT_S)
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)


def create_topic(
    cluster: LocalCluster, name: str, partitions: int, configs: dict[str, str] | None = None
) -> None:
    """RF 3, ``min.insync.replicas`` 2 unless ``configs`` says otherwise; returns once every
    partition has a leader."""
    admin = AdminClient(cluster.bootstrap_servers)
    try:
        settings = {"min.insync.replicas": "2", **(configs or {})}
        errors = admin.create_topics([NewTopic(name, partitions, 3, settings)])
        if errors[name] is not None:
            raise errors[name]  # type: ignore[misc]
        wait_for(f"leaders of {name}", lambda: all(
            p.leader >= 0 for p in admin.describe_topics([name])[name].partitions))  # fmt: skip
    finally:
        admin.close()


def delete_topic(cluster: LocalCluster, name: str) -> None:
    """Delete ``name``; its error raised, if any."""
    admin = AdminClient(cluster.bootstrap_servers)
    try:
        error = admin.delete_topics([name])[name]
    finally:
        admin.close()
    if error is not None:
        raise error


# -- failover ----------------------------------------------------------------------------------
def failover_round(cluster: LocalCluster, topic: str) -> float:
    """Seconds from SIGKILL of the partition's leader to the first acks=all write after it."""
    admin = AdminClient(cluster.bootstrap_servers)
    acks: list[tuple[float, float]] = []  # (sent, acknowledged) monotonic times
    stop = threading.Event()

    def write() -> None:
        with Producer(cluster.bootstrap_servers, linger_ms=0, delivery_timeout_ms=60_000) as p:
            while not stop.is_set():
                sent = time.monotonic()
                try:
                    p.send(topic, b"x" * 100).result(timeout=WAIT_S)
                except KafkaError:
                    continue
                acks.append((sent, time.monotonic()))

    writer = threading.Thread(target=write, name="failover-writer")
    writer.start()
    try:
        wait_for("writes flowing", lambda: len(acks) > 50)
        leader = admin.describe_topics([topic])[topic].partitions[0].leader
        cluster.stop_node(leader, kill=True)
        killed = time.monotonic()
        wait_for("writes after the kill", lambda: any(s > killed for s, _ in acks))
        resumed = min(a for s, a in acks if s > killed)
        cluster.start_node(leader)
        wait_for("the old leader back in the ISR", lambda: leader in (
            admin.describe_topics([topic])[topic].partitions[0].isr))  # fmt: skip
        return resumed - killed
    finally:
        stop.set()
        writer.join(timeout=WAIT_S)
        admin.close()


# -- profile -------------------------------------------------------------------------------------
def profile(pids: dict[str, int], seconds: int, out_dir: Path) -> list[subprocess.Popen[bytes]]:
    """Start py-spy on each process (raw folded stacks); the caller waits for them."""
    spy = py_spy()
    return [
        subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(pid),
                "--format",
                "raw",
                "--rate",
                "200",
                "--duration",
                str(seconds),
                "--nonblocking",
                "-o",
                str(out_dir / f"{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]


def hot_functions(folded: Path, top: int = 12) -> list[dict[str, Any]]:
    """Self and inclusive share of the non-idle samples, per function."""
    if not folded.exists():
        return []  # py-spy could not attach (no ptrace here): no profile, the figures stand
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    busy = 0
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith(("thread ", "process "))]
        if not frames or any(tag in frames[-1] for tag in IDLE_LEAVES):
            continue
        busy += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
    return [
        {"function": f, "self_pct": round(100 * n / busy, 1),
         "inclusive_pct": round(100 * inclusive[f] / busy, 1)}
        for f, n in own.most_common(top)
    ] if busy else []  # fmt: skip


def profiled_produce(cluster: LocalCluster, sizes: Sizes, console: Console) -> dict[str, Any]:
    out_dir = Path(tempfile.mkdtemp(prefix="profile-"))
    pids = {"node-1": cluster.pid(1) or 0, "client": os.getpid()}
    console.log(f"profiling a produce run with py-spy for {sizes.profile_s} s")
    spies = profile(pids, sizes.profile_s, out_dir)
    try:
        run_produce_perf(cluster.bootstrap_servers, "perf", sizes.profile_records, RECORD_BYTES)
    finally:
        for spy in spies:
            spy.wait(timeout=WAIT_S)
    result = {name: hot_functions(out_dir / f"{name}.txt") for name in pids}
    shutil.rmtree(out_dir, ignore_errors=True)
    return result


# -- the run ---------------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- idempotence ---------------------------------------------------------------------------------
def produce_variant(
    cluster: LocalCluster, topic: str, records: int, variant: ProduceVariant
) -> dict[str, Any]:
    """``records`` records of RECORD_BYTES with acks=all as ``variant`` configures the producer:
    records/s over the whole run (sends and the final flush) and the brokers' CPU seconds."""
    payload = b"R" * RECORD_BYTES
    pids = [cluster.pid(n) or 0 for n in (1, 2, 3)]
    cpu_before = sum(cpu_seconds(pid) for pid in pids)
    with Producer(
        cluster.bootstrap_servers, acks="all", enable_idempotence=variant.idempotent,
        max_in_flight_requests_per_connection=variant.max_in_flight,
    ) as producer:  # fmt: skip
        start = time.perf_counter()
        futures = [producer.send(topic, payload) for _ in range(records)]
        producer.flush(timeout=WAIT_S * 5)
        seconds = time.perf_counter() - start
    errors = sum(future.exception() is not None for future in futures)
    return {
        "records_per_s": round((records - errors) / seconds, 1),
        "node_cpu_s": round(sum(cpu_seconds(pid) for pid in pids) - cpu_before, 2),
        "errors": errors,
    }


def idempotence_throughput(cluster: LocalCluster, sizes: Sizes, console: Console) -> dict[str, Any]:
    """Every variant once per round, rounds alternating, into one topic: medians per variant."""
    create_topic(cluster, "idempotence", PARTITIONS)
    runs: dict[str, list[dict[str, Any]]] = {v.name: [] for v in PRODUCE_VARIANTS}
    for round_number in range(sizes.idempotence_rounds):
        for variant in PRODUCE_VARIANTS:
            console.log(f"produce round {round_number + 1}: {variant.name}")
            runs[variant.name].append(
                produce_variant(cluster, "idempotence", sizes.idempotence_records, variant)
            )
    return {
        "records": sizes.idempotence_records,
        "partitions": PARTITIONS,
        "acks": "all",
        "variants": {
            name: {
                "records_per_s_median": statistics.median(r["records_per_s"] for r in found),
                "node_cpu_s_median": statistics.median(r["node_cpu_s"] for r in found),
                "errors": sum(r["errors"] for r in found),
                "runs": found,
            }
            for name, found in runs.items()
        },
    }


def build_partition_log(directory: Path, size_bytes: int) -> int:
    """Idempotent batches of one 1 KiB record, producer ids in turn, appended through a
    leader Partition (so the rolls take snapshots), until the log holds ``size_bytes``; then a
    clean stop. Returns the number of batches."""
    log = Log(directory, LogConfig.parse({"segment.bytes": str(OPEN_SEGMENT_BYTES)}))
    partition = Partition("open", 0, uuid.UUID(int=1), log, 1, wall_clock_ms)
    partition.make_leader(PartitionRegistration((1,), (1,), 1, 0, 0))
    value, now_ms = b"v" * RECORD_BYTES, wall_clock_ms()
    batches = 0
    while log.size_bytes < size_bytes:
        producer_id = 1000 + batches % OPEN_PRODUCERS
        sequence = batches // OPEN_PRODUCERS
        payload = encode_batch(
            [(b"k", value, now_ms, ())], producer_id=producer_id, producer_epoch=0,
            base_sequence=sequence,
        )  # fmt: skip
        partition.append_as_leader(payload, -1, 1)
        batches += 1
    partition.stop()
    log.close()
    return batches


def open_partition(directory: Path, *, clean: bool, snapshots: bool) -> tuple[float, float]:
    """Seconds to open the log and then the Partition (its producer state). ``clean``: after a
    clean stop (marker and the snapshot at the log end); else as after SIGKILL (no marker, only
    the rolls' snapshots). Without ``snapshots`` every snapshot is removed first."""
    bases = {int(path.name[:20]) for path in directory.glob("*.log")}
    for path in directory.glob("*.snapshot"):
        if not snapshots or (not clean and int(path.name[:20]) not in bases):
            path.unlink()
    if not clean:
        (directory / CLEAN_SHUTDOWN_MARKER).unlink(missing_ok=True)
    started = time.perf_counter()
    log = Log(directory, LogConfig.parse({"segment.bytes": str(OPEN_SEGMENT_BYTES)}))
    opened_log = time.perf_counter()
    partition = Partition("open", 0, uuid.UUID(int=1), log, 1, wall_clock_ms)
    done = time.perf_counter()
    if clean:
        partition.stop()  # a clean stop: the snapshot at the log end, the marker
        log.close()
    else:
        log.abandon()  # a crash: nothing written
    return opened_log - started, done - opened_log


def partition_open_times(workdir: Path, sizes: Sizes, console: Console) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="open-", dir=workdir)) / "open-0"
    try:
        console.log(f"building a {sizes.open_log_bytes // MiB} MiB partition log")
        batches = build_partition_log(directory, sizes.open_log_bytes)
        figures: dict[str, Any] = {
            "log_bytes": sizes.open_log_bytes, "segment_bytes": OPEN_SEGMENT_BYTES,
            "batches": batches, "producer_ids": OPEN_PRODUCERS, "rounds": OPEN_ROUNDS,
        }  # fmt: skip
        # Order matters: the snapshot cases first, each leaving the directory as it found it;
        # the full rescans remove every snapshot.
        for name, clean, snapshots in (
            ("clean_with_snapshots", True, True),
            ("unclean_with_snapshots", False, True),
            ("clean_full_rescan", True, False),
            ("unclean_full_rescan", False, False),
        ):
            console.log(f"opening the partition: {name}")
            times = [open_partition(directory, clean=clean, snapshots=snapshots)
                     for _ in range(OPEN_ROUNDS)]  # fmt: skip
            figures[name] = {
                "open_s_median": round(statistics.median(a + b for a, b in times), 3),
                "producer_state_s_median": round(statistics.median(b for _, b in times), 3),
            }
        return figures
    finally:
        shutil.rmtree(directory.parent, ignore_errors=True)


def idempotence_section(
    throughput: dict[str, Any],
    load_start: tuple[float, ...],
    workdir: Path,
    sizes: Sizes,
    console: Console,
) -> dict[str, Any]:
    """The produce figures (measured on a cluster) and the partition open times (measured
    here, once the cluster is down, so its nodes do not share the cores)."""
    return {
        "produce": throughput,
        "partition_open": partition_open_times(workdir, sizes, console),
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    }


def run_benchmarks(
    workdir: Path, sizes: Sizes, console: Console, first_host: int = FIRST_HOST
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``dataplane`` section's figures and the ``idempotence`` section's, one cluster."""
    load_start = os.getloadavg()
    with cluster_in(workdir, console, first_host) as cluster:
        create_topic(cluster, "perf", PARTITIONS)
        create_topic(cluster, "failover", 1)
        pids = {n: cluster.pid(n) or 0 for n in (1, 2, 3)}
        cpu_before = {n: cpu_seconds(p) for n, p in pids.items()}
        console.log(f"produce: {sizes.produce_records:,} records of {RECORD_BYTES} B, acks=all")
        produced = run_produce_perf(
            cluster.bootstrap_servers, "perf", sizes.produce_records, RECORD_BYTES
        )
        node_cpu = {n: round(cpu_seconds(p) - cpu_before[n], 2) for n, p in pids.items()}
        rate = max(1, int(produced.records_per_s * PACED_FRACTION))
        console.log(f"produce paced at {rate:,} records/s: latency without queueing")
        paced = run_produce_perf(
            cluster.bootstrap_servers, "perf", max(100, rate * sizes.paced_s), RECORD_BYTES,
            throughput_per_s=rate,
        )  # fmt: skip
        console.log("consume: the same records from the beginning")
        consumed = run_consume_perf(
            cluster.bootstrap_servers, "perf", produced.records + paced.records
        )
        rounds = []
        for n in range(sizes.failover_rounds):
            console.log(f"failover round {n + 1}/{sizes.failover_rounds}")
            rounds.append(round(failover_round(cluster, "failover"), 3))
        profiled = profiled_produce(cluster, sizes, console)
        load_end = os.getloadavg()  # the dataplane section's end, the idempotence section's start
        throughput = idempotence_throughput(cluster, sizes, console)
    idempotence = idempotence_section(throughput, load_end, workdir, sizes, console)
    return {
        "nodes": 3,
        "partitions": PARTITIONS,
        "replication_factor": 3,
        "record_bytes": RECORD_BYTES,
        "produce": asdict(produced),
        "produce_node_cpu_s": node_cpu,
        "produce_paced": asdict(paced),
        "consume": asdict(consumed),
        "failover_s": rounds,
        "failover_target_s": FAILOVER_TARGET_S,
        "profile": profiled,
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in load_end],
    }, idempotence


def print_idempotence(console: Console, figures: dict[str, Any]) -> None:
    produce, opened = figures["produce"], figures["partition_open"]
    table = Table(
        title=f"idempotence: {produce['records']:,} records of {RECORD_BYTES} B, acks=all, "
        f"{produce['partitions']} partitions, RF 3"
    )
    for column in ("producer", "records/s (median)", "broker CPU s (median)", "errors"):
        table.add_column(column, justify="left" if column == "producer" else "right")
    for name, found in produce["variants"].items():
        table.add_row(
            name, f"{found['records_per_s_median']:,.0f}", f"{found['node_cpu_s_median']:.1f}",
            str(found["errors"]),
        )  # fmt: skip
    console.print(table)
    table = Table(
        title=f"partition open: {opened['log_bytes'] // MiB} MiB, {opened['batches']:,} batches, "
        f"{opened['segment_bytes'] // MiB} MiB segments"
    )
    for column in ("case", "open s (median)", "of which producer state s"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for case in ("clean_with_snapshots", "clean_full_rescan", "unclean_with_snapshots",
                 "unclean_full_rescan"):  # fmt: skip
        table.add_row(
            case, f"{opened[case]['open_s_median']:.3f}",
            f"{opened[case]['producer_state_s_median']:.3f}",
        )  # fmt: skip
    console.print(table)


def print_report(console: Console, figures: dict[str, Any]) -> None:
    produce, consume = figures["produce"], figures["consume"]
    table = Table(title="data plane: 3 nodes, RF 3, 1 KiB records, acks=all")
    table.add_column("measure")
    table.add_column("value", justify="right")
    latency = produce["latency_ms"]
    rows = [
        ("produce records/s", f"{produce['records_per_s']:,.0f}"),
        ("produce MiB/s", f"{produce['mb_per_s']:.1f}"),
        ("produce latency p50 / p99 / p999 ms",
         f"{latency['p50']:.1f} / {latency['p99']:.1f} / {latency['p999']:.1f}"),
        ("produce errors", str(produce["errors"])),
        (f"paced at {figures['produce_paced']['records_per_s']:,.0f}/s: latency p50 / p99 ms",
         f"{figures['produce_paced']['latency_ms']['p50']:.1f} / "
         f"{figures['produce_paced']['latency_ms']['p99']:.1f}"),
        ("consume records/s", f"{consume['records_per_s']:,.0f}"),
        ("consume MiB/s", f"{consume['mb_per_s']:.1f}"),
        ("leader failover s (target <= 5)", ", ".join(str(s) for s in figures["failover_s"])),
    ]  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    for process, functions in figures["profile"].items():
        print_hot_functions(console, f"produce path profile: {process}", functions)


def print_hot_functions(console: Console, title: str, functions: list[dict[str, Any]]) -> None:
    """A py-spy summary (``hot_functions``) as a table: self and inclusive share per function."""
    hot = Table(title=f"{title} (share of busy samples)")
    hot.add_column("self %", justify="right")
    hot.add_column("incl %", justify="right")
    hot.add_column("function")
    for entry in functions:
        hot.add_row(str(entry["self_pct"]), str(entry["inclusive_pct"]), entry["function"])
    console.print(hot)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through the finally that stops nodes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results JSON file to update")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / ".raftlog" / "bench")
    parser.add_argument(
        "--idempotence-only", action="store_true",
        help="only the idempotence section (produce variants, partition open time)",
    )  # fmt: skip
    parser.add_argument(
        "--first-host", type=int, default=FIRST_HOST, help="the cluster's first 127.0.0.N"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    args.workdir.mkdir(parents=True, exist_ok=True)
    tune_malloc()  # the producers and consumers run in this process, as the raftlog CLI's do
    sizes, log_console, console = QUICK if args.quick else FULL, Console(stderr=True), Console()
    if args.idempotence_only:
        load_start = os.getloadavg()
        with cluster_in(args.workdir, log_console, args.first_host) as cluster:
            throughput = idempotence_throughput(cluster, sizes, log_console)
        idempotence = idempotence_section(throughput, load_start, args.workdir, sizes, log_console)
    else:
        figures, idempotence = run_benchmarks(args.workdir, sizes, log_console, args.first_host)
        write_section(args.out, "dataplane", figures)
        print_report(console, figures)
    write_section(args.out, "idempotence", idempotence)
    print_idempotence(console, idempotence)
    console.print(f"figures written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
