"""The cluster demo behind ``make demo``: acknowledged writes survive a leader's SIGKILL.

1. Start the local 3-node cluster (combined nodes on 127.0.0.11-13) and create ``events``
   (6 partitions, replication factor 3, min.insync.replicas 2).
2. Produce records with acks=all; each value carries its sequence number. Half-way, SIGKILL the
   leader of partition 0, measure how long until acks=all writes to partition 0 are acknowledged
   again, and restart the killed node (it returns as a follower and catches up).
3. Consume every partition from the beginning and check that every acknowledged record came
   back exactly once, in the order it was acknowledged within its partition.
4. Print a table and stop the cluster (also on failure).
"""

from __future__ import annotations

import functools
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dataplane.client import AdminClient, Consumer, NewTopic, Producer, RecordMetadata
from dataplane.tools.local_cluster import LocalCluster
from raftlog.errors import KafkaError

TOPIC = "events"
PARTITIONS = 6
VALUE_BYTES = 100
KEYS = 1000
DEADLINE_S = 600.0


@dataclass
class Acks:
    """What the producer's callbacks saw; written on the sender thread, read after flush."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    by_partition: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # (offset, seq)
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    killed_at: float | None = None
    resumed_at: float | None = None

    def record(self, seq: int, sent_at: float, meta: RecordMetadata | None, error: object) -> None:
        now = time.monotonic()
        with self.lock:
            if meta is None or error is not None:
                self.failed += 1
                self.errors[repr(error)[:300]] = self.errors.get(repr(error)[:300], 0) + 1
                return
            self.by_partition.setdefault(meta.partition, []).append((meta.offset, seq))
            if (
                meta.partition == 0
                and self.killed_at is not None
                and self.resumed_at is None
                and sent_at > self.killed_at
            ):
                self.resumed_at = now


@dataclass(frozen=True)
class DemoResult:
    sent: int
    acknowledged: int
    failed: int
    consumed: int
    missing: int
    duplicated: int
    out_of_order: int
    failover_s: float
    produce_s: float
    consume_s: float
    killed_node: int


def _value(seq: int) -> bytes:
    return f"{seq:012d}".encode().ljust(VALUE_BYTES, b".")


def produce(cluster: LocalCluster, records: int, console: Console) -> tuple[Acks, int, float]:
    acks = Acks()
    killed = -1
    started = time.monotonic()
    with Producer(cluster.bootstrap_servers, acks="all", linger_ms=5) as producer:
        for seq in range(records):
            if seq == records // 2:
                killed = _kill_leader_of_partition_0(cluster, acks, console)
            producer.send(
                TOPIC,
                _value(seq),
                key=b"key-%d" % (seq % KEYS),
                callback=functools.partial(acks.record, seq, time.monotonic()),
            )
            if seq == records // 2 + 1000:
                console.print(f"restarting node {killed}; it returns as a follower")
                cluster.start_node(killed)
        producer.flush(timeout=DEADLINE_S)
    return acks, killed, time.monotonic() - started


def _kill_leader_of_partition_0(cluster: LocalCluster, acks: Acks, console: Console) -> int:
    admin = AdminClient(cluster.bootstrap_servers)
    try:
        leader = admin.describe_topics([TOPIC])[TOPIC].partitions[0].leader
    finally:
        admin.close()
    console.print(f"half-way: SIGKILL node {leader}, the leader of {TOPIC}-0")
    cluster.stop_node(leader, kill=True)
    with acks.lock:
        acks.killed_at = time.monotonic()
    return leader


def consume(cluster: LocalCluster) -> tuple[dict[int, list[tuple[int, int]]], float]:
    """Every record of every partition up to its end offset: partition -> [(offset, seq)]."""
    started = time.monotonic()
    seen: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}
    with Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest") as consumer:
        partitions = [(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        deadline = time.monotonic() + DEADLINE_S
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            if time.monotonic() > deadline:
                raise TimeoutError("consuming the topic took longer than the demo allows")
            for tp, batch in consumer.poll(timeout_ms=500).items():
                seen[tp.partition] += [(r.offset, int((r.value or b"")[:12])) for r in batch]
    return seen, time.monotonic() - started


def check(acks: Acks, seen: dict[int, list[tuple[int, int]]]) -> tuple[int, int, int]:
    """(missing, duplicated, out of order) acknowledged records."""
    missing = duplicated = out_of_order = 0
    for partition, acked in acks.by_partition.items():
        stored = [seq for _, seq in sorted(seen.get(partition, []))]
        positions: dict[int, int] = {}
        for index, seq in enumerate(stored):
            if seq in positions:
                duplicated += 1
            positions.setdefault(seq, index)
        last = -1
        for _, seq in sorted(acked):
            if seq not in positions:
                missing += 1
                continue
            if positions[seq] < last:
                out_of_order += 1
            last = positions[seq]
    return missing, duplicated, out_of_order


def run_cluster_demo(root: Path, records: int, console: Console) -> DemoResult:
    shutil.rmtree(root, ignore_errors=True)
    cluster = LocalCluster(root, nodes=3)
    try:
        console.print("starting 3 nodes on 127.0.0.11-13 (controller + broker each)")
        cluster.up(timeout_s=60)
        admin = AdminClient(cluster.bootstrap_servers)
        try:
            errors = admin.create_topics(
                [NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})]
            )
            if errors[TOPIC] is not None:
                raise errors[TOPIC]  # type: ignore[misc]
        finally:
            admin.close()
        console.print(f"producing {records:,} records to {TOPIC} with acks=all")
        acks, killed, produce_s = produce(cluster, records, console)
        for error, count in sorted(acks.errors.items(), key=lambda kv: -kv[1]):
            console.print(f"{count:,} records failed: {error}")
        console.print("consuming every partition from the beginning")
        seen, consume_s = consume(cluster)
        missing, duplicated, out_of_order = check(acks, seen)
        acknowledged = sum(len(v) for v in acks.by_partition.values())
        failover_s = (acks.resumed_at or float("nan")) - (acks.killed_at or float("nan"))
        return DemoResult(
            records, acknowledged, acks.failed, sum(len(v) for v in seen.values()), missing,
            duplicated, out_of_order, failover_s, produce_s, consume_s, killed,
        )  # fmt: skip
    finally:
        cluster.down()


def print_result(result: DemoResult, console: Console) -> None:
    table = Table(title="raftlog cluster demo")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("records sent", f"{result.sent:,}"),
        ("acknowledged (acks=all)", f"{result.acknowledged:,}"),
        ("failed (not acknowledged)", f"{result.failed:,}"),
        ("consumed", f"{result.consumed:,}"),
        ("acknowledged but missing", f"{result.missing:,}"),
        ("acknowledged and duplicated", f"{result.duplicated:,}"),
        ("out of per-partition order", f"{result.out_of_order:,}"),
        (f"failover of {TOPIC}-0 after SIGKILL of node {result.killed_node}",
         f"{result.failover_s:.2f} s"),
        ("produce throughput", f"{result.sent / result.produce_s:,.0f} records/s"),
        ("consume throughput", f"{result.consumed / result.consume_s:,.0f} records/s"),
    ]  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)


def main(root: Path, records: int) -> int:
    console = Console()
    try:
        result = run_cluster_demo(root, records, console)
    except (KafkaError, TimeoutError, OSError) as error:
        console.print(f"[red]demo failed:[/red] {error}")
        return 1
    print_result(result, console)
    ok = (
        result.missing == 0
        and result.duplicated == 0
        and result.out_of_order == 0
        and result.failed == 0
    )
    if ok:
        console.print("every acknowledged record came back exactly once, in order")
        shutil.rmtree(root, ignore_errors=True)
        return 0
    console.print(
        "[red]records failed, or acknowledged ones were lost, duplicated or reordered[/red]; "
        f"see {root}"
    )
    return 1
