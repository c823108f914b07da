"""Metadata quorum benchmark: write throughput and failover of a 3-controller quorum, over gRPC.

``python -m bench.quorum_bench --out bench/results/latest.json [--quick]``

A LocalCluster of 3 controller processes on 127.0.0.71-73 (reserved for this benchmark), data
in a temporary directory removed afterwards; 3 brokers registered by RPC (no broker processes)
with a session timeout longer than the run. Every figure is measured through ControllerService:

1. CreateTopics of one topic (1 partition, replication factor 3) per request, from 1 client
   thread and from 16 (each its own ControllerClient; the active controller pipelines
   concurrent requests into the Raft log): writes/s and latency percentiles.
2. AlterPartition from the partition leader, shrinking then expanding the ISR, each request
   carrying the leader and partition epochs of the previous response: 1 thread on one
   partition, 16 threads on 16 other partitions.
3. Failover: SIGKILL the active controller, time until the next CreateTopics commits (the
   client follows NOT_CONTROLLER and skips the dead node); restart the killed node and wait
   until it has caught up before the next round.

Every loop is bounded by a count and a time limit; every wait polls a condition with a deadline.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from bench import REPO_ROOT, write_section
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port
from metadata_quorum.client import ControllerClient
from protos import controller_pb2 as pb
from protos import metadata_pb2 as mpb
from raftlog.errors import ErrorCode, KafkaError

FIRST_HOST = 71  # 127.0.0.71-73 are this benchmark's
NODES = 3
BROKER_IDS = (1, 2, 3)
REPLICATION_FACTOR = 3
SESSION_TIMEOUT_MS = 3_600_000  # no broker heartbeats during the run: nobody is fenced
ELECTION_TIMEOUT_MS = 600
THREADS = (1, 16)
FAILOVER_TARGET_S = 3.0
CLUSTER_UP_TIMEOUT_S = 30.0
BARRIER_TIMEOUT_S = 30.0
FAILOVER_DEADLINE_S = 30.0  # the write after a SIGKILL must commit by then
CATCH_UP_DEADLINE_S = 60.0
LEADER_DEADLINE_S = 30.0
CLIENT_DEADLINE_S = 15.0  # one ControllerClient call, retries included
DESCRIBE_TIMEOUT_S = 2.0
POLL_S = 0.02


class BenchmarkError(RuntimeError):
    """A benchmark saw something wrong: a failed write, a node that did not catch up..."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise BenchmarkError(message)


@dataclass(frozen=True)
class Sizes:
    """What ``--quick`` shrinks. Every loop of the benchmark is bounded by one of these."""

    create_topics: tuple[int, int]  # topics created with 1 and with 16 threads
    alter_partition: tuple[int, int]  # AlterPartition requests with 1 and with 16 threads
    phase_max_s: float  # time bound of each measurement (fewer writes if reached)
    failovers: int


FULL = Sizes(
    create_topics=(2000, 4000), alter_partition=(1000, 4000), phase_max_s=20.0, failovers=5
)
QUICK = Sizes(create_topics=(64, 256), alter_partition=(64, 256), phase_max_s=5.0, failovers=2)
NOTES = (
    "One write is one request of one item (one topic, one partition's ISR); writes/s is "
    "requests completed over the wall time from the release of all threads to the last "
    "response; latency is per request, as the client sees it.",
    "3 controllers on one machine: every Raft append is msynced (RaftOptions.fsync) and the "
    "3 processes and the client share the CPUs listed in machine.cpu_count.",
    "Failover: seconds from SIGKILL of the active controller to the commit of the next "
    "CreateTopics, issued once the killed process is gone by a client that was following "
    "that controller. Includes election (controller.quorum.election.timeout.ms), the new "
    "controller's LeaderChange commit and the client's retry backoff (up to 0.5 s).",
)


# -- measurements --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    threads: int
    planned: int
    latencies_s: tuple[float, ...]
    seconds: float

    @property
    def writes(self) -> int:
        return len(self.latencies_s)

    def to_json(self) -> dict[str, Any]:
        ordered = sorted(self.latencies_s)
        cuts = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else []
        p50 = statistics.median(ordered) if ordered else 0.0
        p99 = cuts[98] if cuts else p50
        return {
            "threads": self.threads,
            "writes": self.writes,
            "planned": self.planned,
            "complete": self.writes == self.planned,
            "seconds": round(self.seconds, 3),
            "writes_per_s": round(self.writes / self.seconds, 1) if self.seconds else 0.0,
            "latency_ms_p50": round(p50 * 1000, 2),
            "latency_ms_p99": round(p99 * 1000, 2),
            "latency_ms_max": round(ordered[-1] * 1000, 2) if ordered else 0.0,
        }


Step = Callable[[int], None]  # one write: its index among the thread's writes


@dataclass
class Phase:
    """``planned`` writes shared by ``threads`` threads, each with its own client and step."""

    threads: int
    planned: int
    max_s: float
    make_step: Callable[[int, ControllerClient], Step]  # (thread index, its client) -> step
    stop: threading.Event = field(default_factory=threading.Event)

    def share(self, thread: int) -> int:
        return self.planned // self.threads + (thread < self.planned % self.threads)


def _worker(cluster: LocalCluster, phase: Phase, thread: int, barrier: threading.Barrier) -> Any:
    """Connect, warm up, wait for every thread, then write until done, stopped or out of time.
    Returns (latencies, end time)."""
    client = ControllerClient(cluster.controller_addresses, deadline_s=CLIENT_DEADLINE_S)
    try:
        try:
            step = phase.make_step(thread, client)
            warm_up(client)
        except BaseException:
            barrier.abort()
            raise
        barrier.wait(BARRIER_TIMEOUT_S)
        stop_at = time.perf_counter() + phase.max_s
        latencies: list[float] = []
        try:
            for n in range(phase.share(thread)):
                if phase.stop.is_set() or time.perf_counter() >= stop_at:
                    break
                started = time.perf_counter()
                step(n)
                latencies.append(time.perf_counter() - started)
        except BaseException:
            phase.stop.set()  # the other threads stop too: the run has failed
            raise
        return latencies, time.perf_counter()
    finally:
        client.close()


def run_phase(cluster: LocalCluster, phase: Phase) -> Run:
    """Run the phase's threads together; the clock starts when the last one is ready."""
    barrier = threading.Barrier(phase.threads + 1)
    executor = ThreadPoolExecutor(max_workers=phase.threads, thread_name_prefix="bench")
    try:
        futures: list[Future[Any]] = [
            executor.submit(_worker, cluster, phase, n, barrier) for n in range(phase.threads)
        ]
        try:
            barrier.wait(BARRIER_TIMEOUT_S)
        except threading.BrokenBarrierError:
            for future in futures:
                future.result(BARRIER_TIMEOUT_S)  # raises the thread's own error
            raise
        started = time.perf_counter()
        outcomes = [future.result(phase.max_s + 2 * CLIENT_DEADLINE_S) for future in futures]
    finally:
        phase.stop.set()
        barrier.abort()  # threads still waiting (the main thread was interrupted) give up
        executor.shutdown(wait=True, cancel_futures=True)
    latencies = tuple(latency for thread_latencies, _ in outcomes for latency in thread_latencies)
    ended = max(end for _, end in outcomes)
    return Run(phase.threads, phase.planned, latencies, ended - started)


def warm_up(client: ControllerClient) -> None:
    """A validate-only CreateTopics: finds the active controller and opens the channel to it,
    writes nothing."""
    topic = pb.CreatableTopic(name="bench-warm-up", num_partitions=1, replication_factor=1)
    client.create_topics([topic], validate_only=True)


# -- cluster -------------------------------------------------------------------------------------
@contextmanager
def running_cluster(workdir: Path, progress: Console) -> Iterator[LocalCluster]:
    """A 3-controller cluster under a fresh directory; on every way out each node is SIGKILLed
    by its pid and the directory is removed."""
    hosts = [f"127.0.0.{FIRST_HOST + n}" for n in range(NODES)]
    root = Path(tempfile.mkdtemp(prefix="quorum-", dir=workdir))
    overrides: dict[str, str | int] = {
        "broker.session.timeout.ms": SESSION_TIMEOUT_MS,
        "controller.quorum.election.timeout.ms": ELECTION_TIMEOUT_MS,
    }
    cluster = LocalCluster(
        root,
        nodes=NODES,
        first_host=FIRST_HOST,
        port=pick_cluster_port(hosts),
        overrides=overrides,
        roles="controller",  # the brokers' RPCs are what the benchmark sends
    )
    try:
        progress.log(f"starting 3 controllers on {', '.join(cluster.controller_addresses)}")
        cluster.up(timeout_s=CLUSTER_UP_TIMEOUT_S)
        yield cluster
    finally:
        try:
            stop_all(cluster)
        finally:
            shutil.rmtree(root)


def stop_all(cluster: LocalCluster) -> None:
    """SIGKILL every node by pid; try them all even if one fails, then report the failure."""
    errors: list[BaseException] = []
    for spec in cluster.specs:
        try:
            cluster.stop_node(spec.node_id, kill=True)
        except OSError as error:
            errors.append(error)
    if errors:
        raise BenchmarkError(f"could not stop every node: {errors}")


def register_brokers(client: ControllerClient) -> dict[int, int]:
    """Register and unfence the brokers by RPC, as a broker does; their broker epochs."""
    epochs: dict[int, int] = {}
    for broker_id in BROKER_IDS:
        endpoint = mpb.Endpoint(name="BROKER", host="127.0.0.1", port=9000 + broker_id)
        request = pb.RegisterBrokerRequest(
            broker_id=broker_id, incarnation_id=f"bench-{broker_id}", endpoints=[endpoint]
        )
        epochs[broker_id] = int(client.checked("RegisterBroker", request).broker_epoch)
    for broker_id, epoch in epochs.items():
        heartbeat = pb.BrokerHeartbeatRequest(
            broker_id=broker_id, broker_epoch=epoch, current_metadata_offset=2**62
        )
        response = client.checked("BrokerHeartbeat", heartbeat)
        require(not response.is_fenced, f"broker {broker_id} is still fenced")
    return epochs


def node_address(cluster: LocalCluster, node_id: int) -> str:
    return f"{cluster.spec(node_id).host}:{cluster.port}"


def active_controller(cluster: LocalCluster, client: ControllerClient, timeout_s: float) -> int:
    """The node that answers DescribeCluster naming itself the controller (so it is active,
    not just what a follower last heard)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for spec in cluster.specs:
            if cluster.pid(spec.node_id) is None:
                continue
            try:
                described = client.stub(node_address(cluster, spec.node_id)).DescribeCluster(
                    pb.DescribeClusterRequest(), timeout=DESCRIBE_TIMEOUT_S
                )
            except grpc.RpcError:
                continue  # down or starting: ask the others
            if described.controller_id == spec.node_id:
                return spec.node_id
        time.sleep(POLL_S)  # polling a condition with a deadline
    raise BenchmarkError(f"no active controller within {timeout_s} s; see {cluster.root}")


def describe_topics(
    client: ControllerClient, address: str, names: Sequence[str]
) -> pb.DescribeTopicsResponse | None:
    """DescribeTopics of ``names`` answered by one node (its committed image), None if down."""
    try:
        response: pb.DescribeTopicsResponse = client.stub(address).DescribeTopics(
            pb.DescribeTopicsRequest(names=list(names)), timeout=DESCRIBE_TIMEOUT_S
        )
    except grpc.RpcError:
        return None
    return response


# -- 1. CreateTopics -----------------------------------------------------------------------------
def create_topic(client: ControllerClient, name: str) -> None:
    topic = pb.CreatableTopic(name=name, num_partitions=1, replication_factor=REPLICATION_FACTOR)
    result = client.create_topics([topic]).topics[0]
    require(result.error_code == 0, f"CreateTopics {name}: {result.error_message}")


def topic_name(threads: int, n: int) -> str:
    return f"bench-t{threads:02d}-{n:05d}"


def create_topics_phase(threads: int, planned: int, max_s: float) -> Phase:
    def make_step(thread: int, client: ControllerClient) -> Step:
        def step(n: int) -> None:
            create_topic(client, topic_name(threads, thread + n * threads))

        return step

    return Phase(threads, planned, max_s, make_step)


def create_topics_benchmark(
    cluster: LocalCluster, sizes: Sizes, progress: Console
) -> tuple[list[dict[str, Any]], list[str]]:
    """Both runs, and the names of the topics the 1-thread run created (in order)."""
    runs: list[dict[str, Any]] = []
    created: list[str] = []
    for threads, planned in zip(THREADS, sizes.create_topics, strict=True):
        progress.log(f"CreateTopics: {planned} topics from {threads} thread(s)")
        run = run_phase(cluster, create_topics_phase(threads, planned, sizes.phase_max_s))
        # Placement reads every partition of the image: the cost grows with the topic count.
        runs.append({**run.to_json(), "topics_at_start": sum(r["writes"] for r in runs)})
        if threads == 1:
            created = [topic_name(1, n) for n in range(run.writes)]
    return runs, created


# -- 2. AlterPartition ---------------------------------------------------------------------------
@dataclass
class IsrFlipper:
    """One partition's leader, shrinking its ISR by the last follower and expanding it back,
    each request with the epochs the previous response returned."""

    topic: str
    topic_id: bytes
    leader: int
    broker_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_epoch: int
    partition_epoch: int

    def next_isr(self) -> tuple[int, ...]:
        if self.isr == self.replicas:
            followers = [b for b in self.replicas if b != self.leader]
            return tuple(b for b in self.replicas if b != followers[-1])
        return self.replicas

    def step(self, client: ControllerClient) -> None:
        new_isr = self.next_isr()
        item = pb.AlterPartitionItem(
            topic_id=self.topic_id,
            partition=0,
            leader_epoch=self.leader_epoch,
            new_isr=list(new_isr),
            partition_epoch=self.partition_epoch,
        )
        request = pb.AlterPartitionRequest(
            broker_id=self.leader, broker_epoch=self.broker_epoch, partitions=[item]
        )
        state = client.checked("AlterPartition", request).partitions[0]
        require(state.error_code == 0, f"AlterPartition {self.topic}: {state.error_message}")
        require(tuple(state.isr) == new_isr, f"{self.topic}: ISR {list(state.isr)}, not {new_isr}")
        require(state.partition_epoch > self.partition_epoch, f"{self.topic}: epoch not bumped")
        self.isr = tuple(state.isr)
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch


def isr_flippers(
    client: ControllerClient, address: str, names: Sequence[str], epochs: dict[int, int]
) -> list[IsrFlipper]:
    """Partition 0 of each topic as DescribeTopics on the active controller shows it."""
    described = describe_topics(client, address, names)
    require(described is not None, f"DescribeTopics on {address} failed")
    assert described is not None
    flippers = []
    for topic in described.topics:
        require(topic.error_code == 0 and len(topic.partitions) == 1, f"{topic.name}: {topic}")
        state = topic.partitions[0]
        replicas = tuple(state.replicas)
        require(tuple(state.isr) == replicas, f"{topic.name}: ISR {list(state.isr)} is not full")
        require(replicas[0] == state.leader, f"{topic.name}: leader {state.leader} not preferred")
        flipper = IsrFlipper(
            topic=topic.name,
            topic_id=topic.topic_id,
            leader=state.leader,
            broker_epoch=epochs[state.leader],
            replicas=replicas,
            isr=replicas,
            leader_epoch=state.leader_epoch,
            partition_epoch=state.partition_epoch,
        )
        flippers.append(flipper)
    return flippers


def alter_partition_phase(flippers: Sequence[IsrFlipper], planned: int, max_s: float) -> Phase:
    """Thread n drives ``flippers[n]``'s partition."""

    def make_step(thread: int, client: ControllerClient) -> Step:
        return lambda n: flippers[thread].step(client)

    return Phase(len(flippers), planned, max_s, make_step)


def alter_partition_benchmark(
    cluster: LocalCluster,
    sizes: Sizes,
    epochs: dict[int, int],
    topics: Sequence[str],
    progress: Console,
) -> list[dict[str, Any]]:
    """1 thread on the first topic's partition, 16 threads on the next 16 topics'."""
    require(len(topics) >= 1 + max(THREADS), f"{len(topics)} topics are too few")
    client = ControllerClient(cluster.controller_addresses, deadline_s=CLIENT_DEADLINE_S)
    try:
        leader = active_controller(cluster, client, LEADER_DEADLINE_S)
        address = node_address(cluster, leader)
        runs = []
        first = 0
        for threads, planned in zip(THREADS, sizes.alter_partition, strict=True):
            flippers = isr_flippers(client, address, topics[first : first + threads], epochs)
            first += threads
            progress.log(f"AlterPartition: {planned} ISR changes from {threads} thread(s)")
            phase = alter_partition_phase(flippers, planned, sizes.phase_max_s)
            runs.append({**run_phase(cluster, phase).to_json(), "partitions": threads})
        return runs
    finally:
        client.close()


# -- 3. failover ---------------------------------------------------------------------------------
def commit_topic(client: ControllerClient, name: str, deadline_s: float) -> int:
    """Create ``name``, retrying retriable errors until ``deadline_s``; the attempts it took.
    A retry finding the topic already there means an earlier attempt committed it."""
    deadline = time.monotonic() + deadline_s
    topic = pb.CreatableTopic(name=name, num_partitions=1, replication_factor=REPLICATION_FACTOR)
    attempts = 0
    while True:
        attempts += 1
        remaining = deadline - time.monotonic()
        require(remaining > 0, f"CreateTopics {name} did not commit within {deadline_s} s")
        try:
            result = client.create_topics([topic]).topics[0]
        except KafkaError as error:
            if not error.retriable:
                raise
            continue  # ControllerClient already backed off while following controllers
        if result.error_code == ErrorCode.TOPIC_ALREADY_EXISTS.code and attempts > 1:
            return attempts
        require(result.error_code == 0, f"CreateTopics {name}: {result.error_message}")
        return attempts


def wait_caught_up(
    cluster: LocalCluster, client: ControllerClient, node_id: int, name: str, offset: int
) -> None:
    """Poll DescribeTopics on ``node_id`` until its image reaches ``offset`` and holds ``name``."""
    deadline = time.monotonic() + CATCH_UP_DEADLINE_S
    address = node_address(cluster, node_id)
    while time.monotonic() < deadline:
        described = describe_topics(client, address, [name])
        if (
            described is not None
            and described.metadata_offset >= offset
            and described.topics[0].error_code == 0
        ):
            return
        time.sleep(POLL_S)  # polling a condition with a deadline
    raise BenchmarkError(f"node {node_id} did not reach offset {offset} in {CATCH_UP_DEADLINE_S} s")


def failover_once(cluster: LocalCluster, client: ControllerClient, round_: int) -> dict[str, Any]:
    """SIGKILL the active controller, time the next write; restart the node, wait for it."""
    name = f"bench-failover-{round_:02d}"
    killed = active_controller(cluster, client, LEADER_DEADLINE_S)
    warm_up(client)  # the client follows the controller about to be killed
    killed_at = time.perf_counter()
    cluster.stop_node(killed, kill=True)
    gone_s = time.perf_counter() - killed_at
    attempts = commit_topic(client, name, FAILOVER_DEADLINE_S)
    failover_s = time.perf_counter() - killed_at
    new_leader = active_controller(cluster, client, LEADER_DEADLINE_S)
    require(new_leader != killed, f"node {killed} was SIGKILLed but is still the controller")
    described = describe_topics(client, node_address(cluster, new_leader), [name])
    require(described is not None, f"DescribeTopics on node {new_leader} failed")
    assert described is not None
    restarted_at = time.perf_counter()
    cluster.start_node(killed)
    wait_caught_up(cluster, client, killed, name, described.metadata_offset)
    return {
        "killed": killed,
        "new_controller": new_leader,
        "seconds": round(failover_s, 3),
        "kill_to_gone_s": round(gone_s, 3),
        "attempts": attempts,
        "metadata_offset": described.metadata_offset,
        "catch_up_s": round(time.perf_counter() - restarted_at, 3),
        "meets_target": failover_s <= FAILOVER_TARGET_S,
    }


def failover_benchmark(cluster: LocalCluster, sizes: Sizes, progress: Console) -> dict[str, Any]:
    client = ControllerClient(cluster.controller_addresses, deadline_s=CLIENT_DEADLINE_S)
    runs = []
    try:
        for round_ in range(sizes.failovers):
            progress.log(f"failover {round_ + 1}/{sizes.failovers}: SIGKILL the controller")
            runs.append(failover_once(cluster, client, round_))
    finally:
        client.close()
    seconds = [run["seconds"] for run in runs]
    return {
        "target_s": FAILOVER_TARGET_S,
        "median_s": round(statistics.median(seconds), 3),
        "max_s": max(seconds),
        "meets_target": max(seconds) <= FAILOVER_TARGET_S,
        "runs": runs,
    }


# -- report --------------------------------------------------------------------------------------
def _mark(text: str, ok: bool) -> str:
    return text if ok else f"[red]{text}[/red]"


def writes_table(title: str, runs: list[dict[str, Any]], caption: str) -> Table:
    if not all(run["complete"] for run in runs):
        caption += "; red: writes done when the time bound stopped the run before all planned"
    table = Table(title=title, caption=caption)
    for column in ("threads", "writes", "seconds", "writes/s", "p50 ms", "p99 ms", "max ms"):
        table.add_column(column, justify="right")
    for run in runs:
        table.add_row(
            str(run["threads"]),
            _mark(f"{run['writes']:,}", run["complete"]),
            f"{run['seconds']:.2f}",
            f"{run['writes_per_s']:,.0f}",
            f"{run['latency_ms_p50']:.1f}",
            f"{run['latency_ms_p99']:.1f}",
            f"{run['latency_ms_max']:.1f}",
        )
    return table


def failover_table(failover: dict[str, Any]) -> Table:
    title = f"Controller failover after SIGKILL, target ≤ {failover['target_s']:.0f} s"
    caption = (
        f"median {failover['median_s']:.2f} s, max {failover['max_s']:.2f} s; "
        "catch-up: restart of the killed node until its image holds the new write"
    )
    table = Table(title=title, caption=caption)
    for column in ("round", "killed", "new", "seconds", "attempts", "catch-up s"):
        table.add_column(column, justify="right")
    for n, run in enumerate(failover["runs"], start=1):
        table.add_row(
            str(n),
            str(run["killed"]),
            str(run["new_controller"]),
            _mark(f"{run['seconds']:.2f}", run["meets_target"]),
            str(run["attempts"]),
            f"{run['catch_up_s']:.2f}",
        )
    return table


def print_report(console: Console, quorum: dict[str, Any], results: dict[str, Any]) -> None:
    machine = results["machine"]
    console.print(
        f"raftlog metadata quorum benchmark ({quorum['mode']}), {machine['cpu_count']} CPUs, "
        f"Python {machine['python']}, Linux {machine['kernel']}, {results['date']}"
    )
    topics = ", ".join(f"{run['topics_at_start']:,}" for run in quorum["create_topics"])
    console.print(
        writes_table(
            "CreateTopics, one topic (1 partition, RF 3) per request",
            quorum["create_topics"],
            f"topics in the cluster at the start of each run: {topics}",
        )
    )
    console.print(
        writes_table(
            "AlterPartition, ISR shrink / expand, one partition per request",
            quorum["alter_partition"],
            "partition epoch and leader epoch taken from each response",
        )
    )
    console.print(failover_table(quorum["failover"]))
    console.print(f"{quorum['duration_s']:.0f} s in all")


# -- main ----------------------------------------------------------------------------------------
def run_benchmarks(workdir: Path, sizes: Sizes, progress: Console) -> dict[str, Any]:
    started = time.perf_counter()
    load_avg_start = os.getloadavg()
    with running_cluster(workdir, progress) as cluster:
        client = ControllerClient(cluster.controller_addresses, deadline_s=CLIENT_DEADLINE_S)
        try:
            epochs = register_brokers(client)
        finally:
            client.close()
        create_runs, topics = create_topics_benchmark(cluster, sizes, progress)
        alter_runs = alter_partition_benchmark(cluster, sizes, epochs, topics, progress)
        failover = failover_benchmark(cluster, sizes, progress)
        hosts = [spec.host for spec in cluster.specs]
        port = cluster.port
    return {
        "mode": "quick" if sizes == QUICK else "full",
        "cluster": {
            "controllers": hosts,
            "port": port,
            "broker.session.timeout.ms": SESSION_TIMEOUT_MS,
            "controller.quorum.election.timeout.ms": ELECTION_TIMEOUT_MS,
            "brokers": list(BROKER_IDS),
        },
        "targets": {"failover_seconds_max": FAILOVER_TARGET_S},
        "notes": list(NOTES),
        "duration_s": round(time.perf_counter() - started, 1),
        # Other processes share the CPUs: the load averages say how much.
        "load_avg_start": [round(load, 2) for load in load_avg_start],
        "load_avg_end": [round(load, 2) for load in os.getloadavg()],
        "create_topics": create_runs,
        "alter_partition": alter_runs,
        "failover": failover,
    }


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through the finally that stops nodes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results JSON file to update")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=REPO_ROOT / ".raftlog" / "bench",
        help="where the controllers' data goes (a fresh directory inside it, removed afterwards)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    signal.signal(signal.SIGTERM, _interrupt)
    args.workdir.mkdir(parents=True, exist_ok=True)
    quorum = run_benchmarks(args.workdir, sizes, Console(stderr=True))
    results = write_section(args.out, "quorum", quorum)
    console = Console()
    print_report(console, quorum, results)
    console.print(f"figures written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
