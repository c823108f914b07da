"""An elastic cluster, measured: moving a partition, and what a larger cluster costs.

``python -m bench.elastic_bench --out bench/results/latest.json [--quick]``

A cluster of 5 nodes on 127.0.0.51-55 (reserved for this benchmark): nodes 1-3 are combined
controllers and brokers, 4 and 5 brokers only.

1. Scaling: produce records/s (acks=all, RF 3, 1 KiB, 12 partitions) on the first three brokers
   alone, then with brokers 4 and 5 started and the topic placed over all five. On one 2-core
   machine more brokers add processes, not cores: the figure shows the cost of coordination,
   not capacity.
2. Moving a partition: a partition holding ``move_mib`` MiB (1 GiB; 64 MiB with ``--quick``) on
   brokers 1-3 gets broker 4 in place of a follower, unthrottled, then broker 5 in place of 4
   under a replication throttle of 100 MB/s (an eighth with ``--quick``). Seconds from
   AlterPartitionReassignments until each move is complete (the new replica in the ISR, the old
   one's log deleted), and MB/s. Meanwhile a paced producer (acks=all) writes another topic; its
   records/s and p99 during each move are printed beside the same producer's before them.

3. Controllers: a quorum of three controller-only nodes on 127.0.0.56-58, its metadata log
   holding 2,000 records (config changes), gets a fourth (127.0.0.59, started with the three as
   its voters, so it joins): seconds from AddRaftVoter until it is a voter that has caught up
   (lag 0 at the active controller), then seconds for RemoveRaftVoter to take it out again.

Every wait polls a condition with a deadline.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import RECORD_BYTES, bench_main
from dataplane.client import AdminClient, NewTopic
from dataplane.client.admin import ConfigResource, RaftVoter, ResourceType
from dataplane.server.config import NodeConfig
from dataplane.tools.entry import COMMAND
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port, wait_for
from dataplane.tools.owned_process import popen_owned
from dataplane.tools.partition_commands import clear_throttles, plan_throttles, set_throttles
from dataplane.tools.perf import ProducePerfResult, run_produce_perf

FIRST_HOST = 51  # 127.0.0.51-55 are this benchmark's
NODES, CONTROLLERS = 5, 3
SCALING_PARTITIONS = 12
LIVE_RATE_PER_S = 2000  # the paced producer beside the move
THROTTLE_BYTES_PER_S = 100_000_000  # the throttled move (an eighth of it for --quick)
MOVE_WAIT_S = 1800.0
MiB = 1024 * 1024


def _create(admin: AdminClient, topic: NewTopic) -> None:
    error = admin.create_topics([topic])[topic.name]
    if error is not None:
        raise error

    def led() -> bool:
        partitions = admin.describe_topics([topic.name])[topic.name].partitions
        return all(p.leader >= 0 for p in partitions)

    wait_for(f"leaders of {topic.name}", lambda: led() or None, timeout_s=60)


def _produce(bootstrap: list[str], topic: str, records: int, rate: float = -1) -> ProducePerfResult:
    return run_produce_perf(
        bootstrap, topic, records, RECORD_BYTES, acks="all", throughput_per_s=rate
    )


def _spread(brokers: int) -> dict[int, list[int]]:
    """RF-3 replicas of the scaling topic's partitions, round robin over ``brokers``."""
    return {p: [1 + (p + i) % brokers for i in range(3)] for p in range(SCALING_PARTITIONS)}


def _timed_move(
    cluster: LocalCluster, admin: AdminClient, target: tuple[int, ...]
) -> tuple[float, list[ProducePerfResult]]:
    """Move moving-0 to ``target`` while a paced producer writes ``live``: the seconds until
    the move completed, and the producer's runs meanwhile."""
    during: list[ProducePerfResult] = []
    stop = threading.Event()

    def live() -> None:
        while not stop.is_set():
            during.append(
                _produce(cluster.bootstrap_servers, "live", LIVE_RATE_PER_S * 2, LIVE_RATE_PER_S)
            )

    writer = threading.Thread(target=live, name="live-producer")
    started = time.monotonic()
    errors = admin.alter_partition_reassignments({("moving", 0): target})
    if any(errors.values()):
        raise RuntimeError(f"the move was refused: {errors}")
    writer.start()
    try:
        wait_for(
            "the move to complete",
            lambda: not admin.list_partition_reassignments() or None,
            timeout_s=MOVE_WAIT_S,
        )
        return time.monotonic() - started, during
    finally:
        stop.set()
        writer.join(timeout=120)


def _live(prefix: str, runs: list[ProducePerfResult]) -> dict[str, Any]:
    acked, spent = sum(r.records for r in runs), sum(r.seconds for r in runs)
    return {
        f"{prefix}_records_per_s": round(acked / spent) if spent else 0,
        f"{prefix}_p99_ms": round(max((r.latency_ms.p99 for r in runs), default=0.0), 2),
        f"{prefix}_errors": sum(r.errors for r in runs),
    }


def move(
    cluster: LocalCluster, admin: AdminClient, move_mib: int, progress: Console
) -> dict[str, Any]:
    _create(admin, NewTopic("moving", replica_assignment={0: [1, 2, 3]}))
    _create(admin, NewTopic("live", replica_assignment={0: [1, 2, 3], 1: [2, 3, 1]}))
    records = move_mib * MiB // RECORD_BYTES
    progress.print(f"filling moving-0 with {move_mib} MiB")
    filled = _produce(cluster.bootstrap_servers, "moving", records)
    moved_bytes = filled.records * RECORD_BYTES
    before = _produce(cluster.bootstrap_servers, "live", LIVE_RATE_PER_S * 10, LIVE_RATE_PER_S)
    progress.print("moving it onto broker 4, unthrottled")
    seconds, during = _timed_move(cluster, admin, (1, 2, 4))
    throttle = THROTTLE_BYTES_PER_S // (8 if move_mib < 256 else 1)
    progress.print(f"moving it onto broker 5 at {throttle / 1e6:.0f} MB/s")
    target = (1, 2, 5)  # what `raftlog partitions reassign --execute --throttle` sets and clears
    throttles = plan_throttles(admin.describe_topics(["moving"]), {("moving", 0): target})
    set_throttles(admin, throttles, throttle)
    try:
        throttled_s, throttled = _timed_move(cluster, admin, target)
    finally:
        clear_throttles(admin, throttles.brokers, ["moving"])
    return {
        "move_mib": move_mib,
        "seconds": round(seconds, 2),
        "move_mb_per_s": round(moved_bytes / seconds / 1e6, 1),
        "throttle_mb_per_s": round(throttle / 1e6, 1),
        "throttled_seconds": round(throttled_s, 2),
        "throttled_move_mb_per_s": round(moved_bytes / throttled_s / 1e6, 1),
        "live_before_records_per_s": round(before.records_per_s),
        "live_before_p99_ms": round(before.latency_ms.p99, 2),
        **_live("live_during", during),
        **_live("live_throttled", throttled),
    }


CONTROLLER_HOST = 56  # 127.0.0.56-59: the controller quorum of section 3


def _controller_config(root: Path, node_id: int, port: int) -> Path:
    host = f"127.0.0.{CONTROLLER_HOST - 1 + node_id}"
    voters = ",".join(f"{n}@127.0.0.{CONTROLLER_HOST - 1 + n}:{port}" for n in (1, 2, 3))
    config = NodeConfig.parse({
        "node.id": node_id, "process.roles": "controller", "controller.quorum.voters": voters,
        "listeners": f"CONTROLLER://{host}:{port}", "log.dirs": str(root / f"c{node_id}"),
    })  # fmt: skip
    path = root / f"c{node_id}.toml"
    path.write_text(config.to_toml())
    return path


def controllers(root: Path, records: int) -> dict[str, Any]:
    """Section 3: the time to add a caught-up voter to a metadata log of ``records`` records
    (cluster-wide config changes), and to remove it."""
    hosts = [f"127.0.0.{CONTROLLER_HOST + n}" for n in range(4)]
    port = pick_cluster_port(hosts)
    procs: dict[int, subprocess.Popen[bytes]] = {}
    try:
        for node_id in (1, 2, 3, 4):
            argv = [*COMMAND, "node", "--config",
                    str(_controller_config(root, node_id, port))]  # fmt: skip
            with (root / f"c{node_id}.log").open("ab") as out:
                procs[node_id] = popen_owned(argv, stdout=out, stderr=subprocess.STDOUT)
        addresses = [f"{h}:{port}" for h in hosts[:3]]
        with AdminClient(bootstrap_controllers=addresses) as admin:
            wait_for("an active controller", lambda: admin.describe_quorum().leader_id >= 0 or None)
            cluster_wide = ConfigResource(ResourceType.BROKER, "")
            for n in range(records):
                admin.alter_configs(
                    cluster_wide, {"leader.imbalance.per.broker.percentage": str(n % 100)}
                )
            new = RaftVoter(4, hosts[3], port, port + 1)
            started = time.monotonic()
            admin.add_raft_voter(new)

            def caught_up() -> bool:
                voters = {v.node_id: v for v in admin.describe_quorum().voters}
                return 4 in voters and voters[4].lag == 0

            wait_for("the new voter to catch up", lambda: caught_up() or None, timeout_s=60)
            add_s = time.monotonic() - started
            started = time.monotonic()
            admin.remove_raft_voter(4)
            remove_s = time.monotonic() - started
        return {
            "metadata_records": records,
            "add_voter_caught_up_s": round(add_s, 3),
            "remove_voter_s": round(remove_s, 3),
        }
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=30)


def run(workdir: Path, quick: bool, progress: Console) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="elastic-", dir=workdir))
    hosts = [f"127.0.0.{FIRST_HOST + n}" for n in range(NODES)]
    cluster = LocalCluster(
        root, nodes=NODES, controllers=CONTROLLERS, first_host=FIRST_HOST,
        port=pick_cluster_port(hosts),
    )  # fmt: skip
    try:
        for node_id in range(1, CONTROLLERS + 1):
            cluster.start_node(node_id)
        cluster.wait_for_leader(timeout_s=60)
        cluster.wait_for_brokers(list(range(1, CONTROLLERS + 1)), timeout_s=60)
        with AdminClient(cluster.bootstrap_servers[:CONTROLLERS]) as admin:
            records = 20_000 if quick else 100_000
            progress.print("scaling: three brokers")
            _create(admin, NewTopic("scale-3", replica_assignment=_spread(3)))
            three = _produce(cluster.bootstrap_servers[:CONTROLLERS], "scale-3", records)
            for node_id in range(CONTROLLERS + 1, NODES + 1):
                cluster.start_node(node_id)
            cluster.wait_for_brokers(timeout_s=60)
            progress.print("scaling: five brokers")
            _create(admin, NewTopic("scale-5", replica_assignment=_spread(5)))
            five = _produce(cluster.bootstrap_servers, "scale-5", records)
            figures: dict[str, Any] = {
                "scaling": {
                    "records": records,
                    "three_brokers_records_per_s": round(three.records_per_s),
                    "five_brokers_records_per_s": round(five.records_per_s),
                    "three_brokers_p99_ms": round(three.latency_ms.p99, 2),
                    "five_brokers_p99_ms": round(five.latency_ms.p99, 2),
                }
            }
            progress.print("moving a partition")
            figures["move"] = move(cluster, admin, 64 if quick else 1024, progress)
        cluster.down()
        progress.print("adding and removing a controller")
        figures["controllers"] = controllers(root, 100 if quick else 2000)
        return figures
    except BaseException:
        for spec in cluster.specs:
            if spec.log_path.exists():
                progress.print(f"---- {spec.log_path}\n{spec.log_path.read_text()[-3000:]}")
        raise
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)


def report(console: Console, figures: dict[str, Any]) -> None:
    for section, values in figures.items():
        table = Table("figure", "value", title=f"elastic: {section}")
        for key, value in values.items():
            table.add_row(key, f"{value:,}" if isinstance(value, int) else str(value))
        console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main(argv, __doc__.splitlines()[0], "elastic", run, report)


if __name__ == "__main__":
    raise SystemExit(main())
