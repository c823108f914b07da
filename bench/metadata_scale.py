"""Metadata at scale: what KRaft promises (many partitions, fast failover, fast restarts).

``python -m bench.metadata_scale --partitions 10000 --out bench/results/latest.json``

A LocalCluster of 3 combined nodes on 127.0.0.11-13 (``--first-host N`` moves it), data in a
temporary directory removed afterwards; every partition has replication factor 3, so every
broker hosts every partition.

1. Create: topics of ``--topic-partitions`` (100) partitions, one CreateTopics per topic and
   one request after the other, as a user's script would, until ``--partitions`` exist.
   Figures: the time until the last CreateTopics committed, metadata records/s (the metadata
   offset's advance over that time), and the time until every broker hosts every partition
   and no leader reports one under-replicated (the brokers' own gauges, METRICS listener).
2. Memory: each broker's RSS after minus before, over the partitions it hosts; the size of a
   metadata snapshot of the image (what the controller writes when it compacts its log,
   ``encode_snapshot``) and of ``raft.snapshot`` on disk if a compaction ran.
3. Produce: 1 KiB records, acks=all, to one partition, then to ``--produce-partitions``
   (1,000) partitions at once (round robin, the producer's defaults): records/s each; target:
   the many-partition rate >= 50% of the one-partition rate.
4. Controller failover: SIGKILL of the active controller (a combined node: its broker dies
   too), time to the next committed write (an AlterConfigs of a topic that succeeds); target
   <= 3 s.
5. Broker restart: the node killed in 4 started again; the time until it is unfenced, and
   until it hosts every partition and every replica is back in the ISR; target <= 60 s.

``--set KEY=VALUE`` (repeatable): a node setting every node starts with (for instance Kafka's
``controller.quorum.election.timeout.ms=1000``); the figures name them (``node_settings``).

``--profile``: py-spy (if it can attach) samples node 1 during creation and the restarted node
during its restart; the busiest functions are printed and stored beside the figures.

Every loop is bounded; every wait polls a condition with a deadline.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import REPO_ROOT, write_section
from bench.dataplane_bench import hot_functions, print_hot_functions, profile
from dataplane.broker.malloc_tuning import tune_malloc
from dataplane.client import Producer
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port, wait_for
from metadata_quorum.client import ControllerClient
from metadata_quorum.codec import encode_snapshot, record_from_proto, snapshot_from_proto
from metadata_quorum.image import MetadataDelta, MetadataImage
from protos import controller_pb2 as pb
from protos import metadata_pb2 as mpb
from raftlog.errors import KafkaError

FIRST_HOST = 11  # 127.0.0.11-13: the local cluster's
NODES = 3
REPLICATION_FACTOR = 3
RECORD_BYTES = 1024
TOPIC_PARTITIONS = 100
PRODUCE_PARTITIONS = 1000
FAILOVER_TARGET_S = 3.0
RESTART_TARGET_S = 60.0
MANY_PARTITIONS_TARGET_FRACTION = 0.5
UP_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 1800.0  # 10,000 partitions on a slow 2-core machine
WRITE_TIMEOUT_S = 60.0
METRICS_TIMEOUT_S = 30.0
POLL_S = 1.0  # between two polls of every broker's gauges
SNAPSHOT_WAIT_MS = 200


@dataclass(frozen=True)
class Sizes:
    partitions: int
    topic_partitions: int
    produce_partitions: int
    produce_records: int


def sizes_for(partitions: int, produce_records: int) -> Sizes:
    topic_partitions = min(TOPIC_PARTITIONS, partitions)
    if partitions % topic_partitions:
        raise ValueError(f"--partitions must be a multiple of {topic_partitions}")
    return Sizes(partitions, topic_partitions, min(PRODUCE_PARTITIONS, partitions), produce_records)


def topic_name(n: int) -> str:
    return f"scale-{n:05d}"


# -- observing the nodes ---------------------------------------------------------------------------
def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for pid {pid}")


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


GAUGES = ("raftlog_partitions", "raftlog_under_replicated_partitions")


def broker_gauges(cluster: LocalCluster, node_id: int) -> dict[str, float] | None:
    """The broker's partition count and under-replicated count (its METRICS listener), None
    while it does not answer. The scrape names them: a whole one builds three series for every
    partition (~0.5 s of the broker's CPU at 10,000), and this poll, scraping every broker all
    the time, made their Raft ticks a second late and the controllers change every few seconds
    while a restarted broker caught up."""
    url = f"http://{cluster.metrics_address(node_id)}/metrics?" + "&".join(
        f"name[]={name}" for name in GAUGES
    )
    found: dict[str, float] = {}
    try:
        with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT_S) as response:
            for raw in response:
                if raw.startswith(b"raftlog_partitions ") or raw.startswith(
                    b"raftlog_under_replicated_partitions "
                ):
                    name, value = raw.decode().split()
                    found[name] = float(value)
    except OSError:
        return None
    return found if len(found) == len(GAUGES) else None


def all_hosted_and_in_sync(cluster: LocalCluster, partitions: int) -> bool:
    """Every broker hosts ``partitions`` replicas and no leader has one out of its ISR. A node
    that died meanwhile fails the run at once (its log says why: at ~4,000 partitions a
    broker once ran out of file descriptors)."""
    for spec in cluster.specs:
        if cluster.pid(spec.node_id) is None:
            raise RuntimeError(f"node {spec.node_id} died: see {spec.log_path}")
        gauges = broker_gauges(cluster, spec.node_id)
        if gauges is None or gauges["raftlog_partitions"] != partitions:
            return False
        if gauges["raftlog_under_replicated_partitions"] != 0:
            return False
    return True


def wait_polling(what: str, probe: Callable[[], bool], timeout_s: float) -> None:
    """``wait_for`` with a slower poll: each probe reads every broker's gauges."""
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(POLL_S)  # polling a condition with a deadline


def metadata_offset(client: ControllerClient) -> int:
    described = client.checked("DescribeTopics", pb.DescribeTopicsRequest(names=["-"]))
    return int(described.metadata_offset)


def active_controller(cluster: LocalCluster) -> int:
    return cluster.wait_for_leader(timeout_s=UP_TIMEOUT_S)


# -- 1. create -----------------------------------------------------------------------------------
def create_all(
    cluster: LocalCluster, client: ControllerClient, sizes: Sizes, console: Console
) -> dict[str, Any]:
    topics = sizes.partitions // sizes.topic_partitions
    first_offset = metadata_offset(client)
    started = time.perf_counter()
    latencies: list[float] = []
    for n in range(topics):
        topic = pb.CreatableTopic(
            name=topic_name(n), num_partitions=sizes.topic_partitions,
            replication_factor=REPLICATION_FACTOR,
        )  # fmt: skip
        sent = time.perf_counter()
        result = client.create_topics([topic]).topics[0]
        latencies.append(time.perf_counter() - sent)
        if result.error_code != 0:
            raise RuntimeError(f"CreateTopics {topic.name}: {result.error_message}")
        if (n + 1) % max(1, topics // 10) == 0:
            console.log(f"created {n + 1}/{topics} topics ({time.perf_counter() - started:.1f} s)")
    created_s = time.perf_counter() - started
    records = metadata_offset(client) - first_offset
    console.log("waiting until every broker hosts every partition, none under-replicated")
    wait_polling(
        "every partition hosted and in sync",
        lambda: all_hosted_and_in_sync(cluster, sizes.partitions),
        READY_TIMEOUT_S,
    )
    ready_s = time.perf_counter() - started
    tenth = max(1, topics // 10)
    return {
        "topics": topics,
        "partitions": sizes.partitions,
        "replication_factor": REPLICATION_FACTOR,
        "create_seconds": round(created_s, 2),
        "ready_seconds": round(ready_s, 2),
        "metadata_records": records,
        "metadata_records_per_s": round(records / created_s, 1),
        "partitions_per_s": round(sizes.partitions / created_s, 1),
        # the first and last tenth's CreateTopics latency: flat if creation scales linearly
        "create_topic_first_tenth_ms": round(statistics.median(latencies[:tenth]) * 1000, 1),
        "create_topic_last_tenth_ms": round(statistics.median(latencies[-tenth:]) * 1000, 1),
    }


# -- 2. memory and the snapshot --------------------------------------------------------------------
def node_resources(cluster: LocalCluster) -> dict[str, dict[str, int]]:
    found = {}
    for spec in cluster.specs:
        pid = cluster.pid(spec.node_id)
        if pid is not None:
            found[str(spec.node_id)] = {
                "rss_bytes": rss_bytes(pid), "threads": threads_of(pid),
                "open_files": open_files(pid),
            }  # fmt: skip
    return found


def fetch_image(client: ControllerClient, address: str) -> MetadataImage:
    """The whole committed image as a broker would build it: FetchMetadata from offset 0."""
    image = MetadataImage()
    request = pb.FetchMetadataRequest(from_offset=0, max_wait_ms=SNAPSHOT_WAIT_MS)
    for update in client.stub(address).FetchMetadata(request, timeout=WRITE_TIMEOUT_S):
        if update.HasField("snapshot"):
            image = snapshot_from_proto(update.snapshot)
        delta = MetadataDelta(image)
        for item in update.records:
            delta.replay(record_from_proto(item.record))
        image = delta.image()
        if image.offset >= update.high_offset:
            break
    return image


def snapshot_sizes(cluster: LocalCluster, client: ControllerClient) -> dict[str, Any]:
    leader = active_controller(cluster)
    address = f"{cluster.spec(leader).host}:{cluster.port}"
    started = time.perf_counter()
    image = fetch_image(client, address)
    fetch_s = time.perf_counter() - started
    started = time.perf_counter()
    encoded = encode_snapshot(image)
    encode_s = time.perf_counter() - started
    on_disk = sorted(
        path.stat().st_size for path in cluster.root.glob("node-*/data/**/raft.snapshot")
    )
    partitions = sum(len(t.partitions) for t in image.topics.values())
    return {
        "metadata_offset": image.offset,
        "snapshot_bytes": len(encoded),
        "snapshot_bytes_per_partition": round(len(encoded) / max(partitions, 1), 1),
        "image_fetch_seconds": round(fetch_s, 3),
        "snapshot_encode_seconds": round(encode_s, 3),
        "raft_snapshot_files_bytes": on_disk,
    }


def memory_per_partition(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], hosted: int
) -> dict[str, Any]:
    per_node = {
        node: round((after[node]["rss_bytes"] - before[node]["rss_bytes"]) / hosted)
        for node in after
        if node in before
    }
    return {
        "hosted_per_broker": hosted,
        "rss_bytes_per_partition": per_node,
        "rss_bytes_per_partition_median": statistics.median(per_node.values()) if per_node else 0,
        "before": before,
        "after": after,
    }


# -- 3. produce -----------------------------------------------------------------------------------
def produce_rate(cluster: LocalCluster, targets: Sequence[tuple[str, int]], records: int) -> float:
    """Records/s of ``records`` 1 KiB acks=all records sent round robin to ``targets``."""
    payload = b"R" * RECORD_BYTES
    with Producer(cluster.bootstrap_servers, acks="all") as producer:
        for topic, partition in targets:  # metadata and connections before the clock starts
            producer.send(topic, payload, partition=partition)
        producer.flush(timeout=WRITE_TIMEOUT_S * 5)
        started = time.perf_counter()
        futures = []
        for n in range(records):
            topic, partition = targets[n % len(targets)]
            futures.append(producer.send(topic, payload, partition=partition))
        producer.flush(timeout=WRITE_TIMEOUT_S * 5)
        seconds = time.perf_counter() - started
    errors = sum(future.exception() is not None for future in futures)
    if errors:
        raise RuntimeError(f"{errors} of {records} records failed")
    return records / seconds


def produce_comparison(cluster: LocalCluster, sizes: Sizes, console: Console) -> dict[str, Any]:
    many = [
        (topic_name(n // sizes.topic_partitions), n % sizes.topic_partitions)
        for n in range(sizes.produce_partitions)
    ]
    console.log(f"produce {sizes.produce_records:,} records to 1 partition")
    one = produce_rate(cluster, many[:1], sizes.produce_records)
    console.log(f"produce {sizes.produce_records:,} records to {len(many):,} partitions")
    spread = produce_rate(cluster, many, sizes.produce_records)
    return {
        "records": sizes.produce_records,
        "record_bytes": RECORD_BYTES,
        "acks": "all",
        "one_partition_records_per_s": round(one, 1),
        "partitions": len(many),
        "many_partitions_records_per_s": round(spread, 1),
        "many_to_one_ratio": round(spread / one, 3),
        "target_ratio": MANY_PARTITIONS_TARGET_FRACTION,
        "meets_target": spread / one >= MANY_PARTITIONS_TARGET_FRACTION,
    }


# -- 4. controller failover, 5. broker restart ---------------------------------------------------
def commit_alter_configs(client: ControllerClient, topic: str, value: str) -> int:
    """AlterConfigs of ``topic``'s retention.ms until it succeeds; the attempts it took."""
    request = pb.AlterConfigsRequest(
        resources=[
            pb.AlterConfigsResource(
                resource=pb.ConfigResource(
                    resource_type=mpb.CONFIG_RESOURCE_TOPIC, resource_name=topic
                ),
                configs=[pb.AlterableConfig(name="retention.ms", value=value, op=pb.SET)],
            )
        ]
    )
    deadline = time.monotonic() + WRITE_TIMEOUT_S
    attempts = 0
    while True:
        attempts += 1
        try:
            response = client.checked("AlterConfigs", request)
        except KafkaError as error:
            if not error.retriable or time.monotonic() > deadline:
                raise
            continue  # ControllerClient already backed off while following controllers
        error_code = response.resources[0].error_code
        if error_code != 0:
            raise RuntimeError(f"AlterConfigs {topic}: {response.resources[0].error_message}")
        return attempts


def failover_and_restart(
    cluster: LocalCluster, client: ControllerClient, sizes: Sizes, console: Console,
    profile_dir: Path | None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:  # fmt: skip
    killed = active_controller(cluster)
    commit_alter_configs(client, topic_name(0), "604800001")  # the client knows the controller
    console.log(f"SIGKILL node {killed}, the active controller")
    killed_at = time.perf_counter()
    cluster.stop_node(killed, kill=True)
    attempts = commit_alter_configs(client, topic_name(0), "604800002")
    failover_s = time.perf_counter() - killed_at
    new_controller = active_controller(cluster)
    failover = {
        "killed": killed,
        "new_controller": new_controller,
        "seconds": round(failover_s, 3),
        "attempts": attempts,
        "target_s": FAILOVER_TARGET_S,
        "meets_target": failover_s <= FAILOVER_TARGET_S,
    }
    # The others must have fenced it and taken its leaderships first: that is the state a
    # broker restarts into.
    cluster.wait_for_brokers([n for n in (1, 2, 3) if n != killed], timeout_s=UP_TIMEOUT_S)
    wait_for(f"node {killed} fenced", lambda: _fenced(client, killed), timeout_s=UP_TIMEOUT_S)
    old_epoch = _broker_epoch(client, killed)
    console.log(f"restart node {killed}")
    log_offsets = {spec.node_id: _log_size(spec.log_path) for spec in cluster.specs}
    restarted_at = time.perf_counter()
    pid = cluster.start_node(killed)
    spies = profile({"restart": pid}, 20, profile_dir) if profile_dir else []
    # Registered again (a new broker epoch) and unfenced: a controller whose image is behind
    # still shows the old registration unfenced (one run measured 0.0 s that way).
    wait_for(
        f"node {killed} registered again and unfenced",
        lambda: _broker_epoch(client, killed, unfenced=True) not in (None, old_epoch),
        timeout_s=READY_TIMEOUT_S,
    )
    unfenced_s = time.perf_counter() - restarted_at
    wait_polling(
        f"node {killed}'s replicas back in the ISR",
        lambda: all_hosted_and_in_sync(cluster, sizes.partitions),
        READY_TIMEOUT_S,
    )
    in_sync_s = time.perf_counter() - restarted_at
    for spy in spies:
        spy.wait(timeout=UP_TIMEOUT_S)
    refusals = isr_refusals(cluster, log_offsets)
    console.log(f"ISR changes refused during the restart: {refusals or 'none'}")
    restart = {
        "node": killed,
        "unfenced_s": round(unfenced_s, 2),
        "all_in_isr_s": round(in_sync_s, 2),
        "isr_refusals": refusals,
        "target_s": RESTART_TARGET_S,
        "meets_target": in_sync_s <= RESTART_TARGET_S,
    }
    hot = {"restart": hot_functions(profile_dir / "restart.txt")} if profile_dir else {}
    return failover, restart, hot


_REFUSED = re.compile(rb"ISR change to .* refused: ([A-Z_]+)")


def _log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def isr_refusals(cluster: LocalCluster, offsets: dict[int, int]) -> dict[str, int]:
    """The ISR changes the controller refused, by error, that the nodes logged since
    ``offsets`` (each node's log size then): a leader proposing against a partition epoch that
    moved is what kept a restarted broker out of the ISRs at 10,000 partitions."""
    counts: Counter[str] = Counter()
    for spec in cluster.specs:
        if not spec.log_path.exists():
            continue
        with spec.log_path.open("rb") as logged:
            logged.seek(offsets.get(spec.node_id, 0))
            for line in logged:
                found = _REFUSED.search(line)
                if found:
                    counts[found.group(1).decode()] += 1
    return dict(sorted(counts.items()))


def _broker_epoch(client: ControllerClient, broker_id: int, unfenced: bool = False) -> int | None:
    """The broker's registered epoch (only if unfenced, with ``unfenced``); None if none."""
    described = client.checked("DescribeCluster", pb.DescribeClusterRequest())
    for broker in described.brokers:
        if broker.broker_id == broker_id and not (unfenced and broker.fenced):
            return int(broker.broker_epoch)
    return None


def _fenced(client: ControllerClient, broker_id: int) -> bool:
    described = client.checked("DescribeCluster", pb.DescribeClusterRequest())
    return any(b.broker_id == broker_id and b.fenced for b in described.brokers)


# -- the run -------------------------------------------------------------------------------------
@contextmanager
def cluster_in(
    workdir: Path, console: Console, first_host: int, overrides: dict[str, str] | None = None,
    keep_logs: bool = False,
) -> Iterator[LocalCluster]:  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="metadata-scale-", dir=workdir))
    hosts = [f"127.0.0.{first_host + n}" for n in range(NODES)]
    cluster = LocalCluster(
        root, nodes=NODES, first_host=first_host, port=pick_cluster_port(hosts),
        overrides=dict(overrides or {}),
    )  # fmt: skip
    failed = True
    try:
        console.log(f"starting {NODES} nodes on {', '.join(cluster.bootstrap_servers)}")
        cluster.up(timeout_s=UP_TIMEOUT_S)
        yield cluster
        failed = False
    finally:
        cluster.down()
        for spec in cluster.specs if failed or keep_logs else ():
            if spec.log_path.exists():
                logs = root.parent / f"{root.name}-node-{spec.node_id}.log"
                shutil.copyfile(spec.log_path, logs)
                why = "the run failed" if failed else "--keep-logs"
                console.log(f"{why}: node {spec.node_id}'s log is kept in {logs}")
        shutil.rmtree(root, ignore_errors=True)


def run_benchmark(
    workdir: Path, sizes: Sizes, console: Console, first_host: int = FIRST_HOST,
    profile_s: int = 0, overrides: dict[str, str] | None = None, keep_logs: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Every figure of the ``metadata_scale`` section, on one cluster. ``profile_s`` > 0:
    py-spy on node 1 for that long from the first CreateTopics, and on the restarted node.
    ``overrides``: node settings every node starts with (``--set``), named in the figures."""
    load_start = os.getloadavg()
    # kept for reading (py-spy's raw folded stacks): its path is logged
    profile_dir = (
        Path(tempfile.mkdtemp(prefix="scale-profile-", dir=workdir)) if profile_s else None
    )
    hot: dict[str, Any] = {}
    try:
        with cluster_in(workdir, console, first_host, overrides, keep_logs) as cluster:
            client = ControllerClient(cluster.controller_addresses, deadline_s=WRITE_TIMEOUT_S)
            try:
                before = node_resources(cluster)
                spies = (
                    profile({"create": cluster.pid(1) or 0}, profile_s, profile_dir)
                    if profile_dir else []
                )  # fmt: skip
                console.log(f"creating {sizes.partitions:,} partitions at RF 3")
                created = create_all(cluster, client, sizes, console)
                for spy in spies:
                    spy.wait(timeout=profile_s + UP_TIMEOUT_S)
                if profile_dir:
                    hot["create"] = hot_functions(profile_dir / "create.txt")
                memory = memory_per_partition(before, node_resources(cluster), sizes.partitions)
                snapshot = snapshot_sizes(cluster, client)
                produce = produce_comparison(cluster, sizes, console)
                failover, restart, restart_hot = failover_and_restart(
                    cluster, client, sizes, console, profile_dir
                )
                hot.update(restart_hot)
            finally:
                client.close()
    finally:
        if profile_dir:
            console.log(f"py-spy's folded stacks are in {profile_dir}")
    figures: dict[str, Any] = {
        "nodes": NODES,
        "partitions": sizes.partitions,
        "topic_partitions": sizes.topic_partitions,
        "create": created,
        "memory": memory,
        "snapshot": snapshot,
        "produce": produce,
        "controller_failover": failover,
        "broker_restart": restart,
        "node_settings": dict(overrides or {}),
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    }
    if hot:
        figures["profile"] = hot
    return figures


def _mark(text: str, ok: bool) -> str:
    return text if ok else f"[red]{text}[/red]"


def print_report(console: Console, figures: dict[str, Any]) -> None:
    created, memory, snapshot = figures["create"], figures["memory"], figures["snapshot"]
    produce, failover = figures["produce"], figures["controller_failover"]
    restart = figures["broker_restart"]
    table = Table(
        title=f"metadata at scale: {figures['partitions']:,} partitions, RF 3, "
        f"{figures['nodes']} nodes"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("create: last CreateTopics committed s", f"{created['create_seconds']:.1f}"),
        ("create: metadata records/s", f"{created['metadata_records_per_s']:,.0f}"),
        ("create: CreateTopics ms, first / last tenth",
         f"{created['create_topic_first_tenth_ms']:.0f} / "
         f"{created['create_topic_last_tenth_ms']:.0f}"),
        ("create: every partition hosted and in sync s", f"{created['ready_seconds']:.1f}"),
        ("broker RSS per partition (median) B",
         f"{memory['rss_bytes_per_partition_median']:,.0f}"),
        ("metadata snapshot B", f"{snapshot['snapshot_bytes']:,}"),
        ("produce 1 partition records/s", f"{produce['one_partition_records_per_s']:,.0f}"),
        (f"produce {produce['partitions']:,} partitions records/s",
         _mark(f"{produce['many_partitions_records_per_s']:,.0f} "
               f"({produce['many_to_one_ratio']:.0%})", produce["meets_target"])),
        ("controller failover s (target <= 3)",
         _mark(f"{failover['seconds']:.2f}", failover["meets_target"])),
        ("broker restart: unfenced s", f"{restart['unfenced_s']:.1f}"),
        ("broker restart: all replicas in ISR s (target <= 60)",
         _mark(f"{restart['all_in_isr_s']:.1f}", restart["meets_target"])),
        ("broker restart: ISR changes refused",
         ", ".join(f"{n:,} {e}" for e, n in restart["isr_refusals"].items()) or "none"),
    ]  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    for phase, functions in figures.get("profile", {}).items():
        print_hot_functions(console, f"py-spy, {phase}", functions)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through the finally that stops nodes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        help="results JSON file to update (section "
        "metadata_scale); without it the figures are only printed",
    )
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--produce-records", type=int, default=50_000)
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / ".raftlog" / "bench")
    parser.add_argument("--first-host", type=int, default=FIRST_HOST)
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="SECONDS",
        help="py-spy node 1 for SECONDS from the first CreateTopics",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a node setting for every node (repeatable), e.g. "
        "controller.quorum.election.timeout.ms=1000",
    )
    parser.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the nodes' logs beside the work directory (a failed run keeps them anyway)",
    )
    args = parser.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.set)
    signal.signal(signal.SIGTERM, _interrupt)
    args.workdir.mkdir(parents=True, exist_ok=True)
    tune_malloc()  # the producer runs in this process, as the raftlog CLI's does
    sizes = sizes_for(args.partitions, args.produce_records)
    figures = run_benchmark(
        args.workdir, sizes, Console(stderr=True), args.first_host, args.profile, overrides,
        args.keep_logs,
    )  # fmt: skip
    if args.out is not None:
        write_section(args.out, "metadata_scale", figures)
    print_report(Console(), figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
