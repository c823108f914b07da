"""Consumer-group benchmark on a real 3-node cluster (127.0.0.64-66, reserved for it).

``python -m bench.groups_bench --out bench/results/latest.json [--quick]``

1. Consume: a group of 3 member *processes* (one consumer each, as deployed) reads a 6-partition
   topic of N 1 KiB records from the beginning: records/s from the group's first record to its
   last (the join is timed separately).
2. Rebalance on join: with 3 stable members, a 4th subscribes; seconds from its ``subscribe``
   until the group is Stable again with every partition owned (the incremental handover: a few
   heartbeat intervals).
3. Rebalance on death: a member is SIGKILLed; seconds until the group is Stable with its
   partitions owned by the others (bounded below by ``group.consumer.session.timeout.ms``, which
   is printed with it).

Every wait polls a condition with a deadline.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import RECORD_BYTES, REPO_ROOT, write_section
from dataplane.client import AdminClient, Consumer, NewTopic, Producer
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port, wait_for

FIRST_HOST = 64
PARTITIONS = 6
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 500
WAIT_S = 300.0
GROUP, TOPIC = "bench-group", "bench-groups"
# slots of the shared counter array: total, first-record time, last-record time, per member
TOTAL, FIRST_NS, LAST_NS, SUBSCRIBED_NS, MEMBER0 = 0, 1, 2, 3, 4
MAX_MEMBERS = 8


def member(bootstrap: list[str], name: str, total: int, counts: Any, stop: Any) -> None:
    """One group member process: consume and count until ``stop`` (or SIGKILL)."""
    consumer = Consumer(
        bootstrap, group_id=GROUP, client_id=name, auto_offset_reset="earliest",
        max_poll_records=5000, fetch_max_wait_ms=100,
    )  # fmt: skip
    consumer.subscribe([TOPIC])
    counts[SUBSCRIBED_NS] = time.monotonic_ns()  # the latest member to join
    index = int(name.rsplit("-", 1)[1])
    while not stop.is_set():
        polled = consumer.poll(timeout_ms=100)
        n = sum(len(records) for records in polled.values())
        if n:
            with counts.get_lock():
                if counts[TOTAL] == 0:
                    counts[FIRST_NS] = time.monotonic_ns()
                counts[TOTAL] += n
                counts[MEMBER0 + index] += n
                if counts[TOTAL] >= total and counts[LAST_NS] == 0:
                    counts[LAST_NS] = time.monotonic_ns()
    consumer.close()


def stable(admin: AdminClient, members: int) -> bool:
    described = admin.describe_groups([GROUP])[GROUP]
    owned = [tp for m in described.members for tp in m.assignment]
    return (
        described.state == "Stable"
        and len(described.members) == members
        and len(owned) == PARTITIONS
        and all(m.assignment for m in described.members)
    )


def run(root: Path, records: int, console: Console) -> dict[str, Any]:
    hosts = [f"127.0.0.{FIRST_HOST + n}" for n in range(3)]
    overrides: dict[str, str | int] = {
        "group.consumer.session.timeout.ms": SESSION_TIMEOUT_MS,
        "group.consumer.heartbeat.interval.ms": HEARTBEAT_MS,
    }
    cluster = LocalCluster(root, nodes=3, first_host=FIRST_HOST, port=pick_cluster_port(hosts),
                           overrides=overrides)  # fmt: skip
    ctx = mp.get_context("spawn")
    counts = ctx.Array("q", MEMBER0 + MAX_MEMBERS)
    stop = ctx.Event()
    processes: list[Any] = []
    try:
        console.log(f"starting 3 nodes on {', '.join(cluster.bootstrap_servers)}")
        cluster.up(timeout_s=WAIT_S)
        bootstrap = cluster.bootstrap_servers
        with AdminClient(bootstrap) as admin:
            assert admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, {})])[TOPIC] is None
        console.log(f"producing {records:,} records of {RECORD_BYTES} bytes")
        value = os.urandom(RECORD_BYTES)
        with Producer(bootstrap, linger_ms=20, batch_size=256 * 1024) as producer:
            for n in range(records):
                producer.send(TOPIC, value, key=str(n).encode())
            producer.flush()

        def start(index: int) -> Any:
            process = ctx.Process(target=member, args=(bootstrap, f"member-{index}", records,
                                                       counts, stop), daemon=True)  # fmt: skip
            process.start()
            processes.append(process)
            return process

        for index in range(3):
            start(index)
        with AdminClient(bootstrap) as admin:
            wait_for("all records consumed", lambda: counts[LAST_NS] > 0, WAIT_S)
            consume_s = (counts[LAST_NS] - counts[FIRST_NS]) / 1e9
            wait_for("a stable group of 3", lambda: stable(admin, 3), WAIT_S)

            joined_before = counts[SUBSCRIBED_NS]
            start(3)
            wait_for("the 4th member subscribed", lambda: counts[SUBSCRIBED_NS] != joined_before,
                     WAIT_S)  # fmt: skip
            wait_for("a stable group of 4", lambda: stable(admin, 4), WAIT_S)
            join_s = (time.monotonic_ns() - counts[SUBSCRIBED_NS]) / 1e9

            victim = processes[0]
            os.kill(victim.pid, signal.SIGKILL)
            died = time.monotonic()
            victim.join(10)
            wait_for("a stable group of 3 again", lambda: stable(admin, 3), WAIT_S)
            death_s = time.monotonic() - died
        per_member = [counts[MEMBER0 + i] for i in range(3)]
        return {
            "records": records,
            "record_bytes": RECORD_BYTES,
            "partitions": PARTITIONS,
            "group_consume_records_per_s": round(records / consume_s),
            "group_consume_mb_per_s": round(records * RECORD_BYTES / consume_s / 1e6, 1),
            "records_per_member": per_member,
            "rebalance_on_join_s": round(join_s, 2),
            "rebalance_on_death_s": round(death_s, 2),
            "session_timeout_ms": SESSION_TIMEOUT_MS,
            "heartbeat_interval_ms": HEARTBEAT_MS,
        }
    finally:
        stop.set()
        for process in processes:
            process.join(15)
            if process.is_alive():
                process.kill()
                process.join(5)
        cluster.down()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results JSON file to update")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / ".raftlog" / "bench")
    args = parser.parse_args(argv)
    console = Console()
    args.workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="groups-", dir=args.workdir))
    try:
        figures = run(root, 20_000 if args.quick else 300_000, console)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    write_section(args.out, "groups", figures)
    table = Table("figure", "value", title="consumer groups")
    for key, value in figures.items():
        table.add_row(key, str(value))
    console.print(table)
    console.print(f"figures written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
