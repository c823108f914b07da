"""Brokers that come and go, and leader balance, with real processes (127.0.0.246-250) under an
idempotent acks=all producer writing every partition: three nodes grow to five and a balanced
plan moves replicas onto the new brokers; a broker that leads partitions is drained, stopped and
unregistered by ``raftlog cluster remove-node``; a rolling restart of every node ends with
leadership balanced by the controller's automatic preferred-leader rebalance. In each, every
acknowledged record is read back once and in order, and no send fails."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kafka.admin import KafkaAdminClient

from dataplane.client import AdminClient, NewTopic, Producer
from dataplane.tools.entry import COMMAND as RAFTLOG
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port, wait_for
from metadata_quorum.rebalance import plan_reassignment
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.cluster_support import RANGES, fetch, read_all, wait_for_leaders

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-elastic-brokers")]
SPAN = 5  # addresses the module's clusters may grow onto


@contextmanager
def elastic_cluster(
    root: Path, nodes: int = 3, overrides: dict[str, str | int] | None = None
) -> Iterator[LocalCluster]:
    """``nodes`` combined nodes, on a port free on all SPAN addresses (nodes are added later)."""
    first_host = RANGES["elastic_brokers"]
    hosts = [f"127.0.0.{first_host + n}" for n in range(SPAN)]
    cluster = LocalCluster(
        root, nodes=nodes, first_host=first_host, port=pick_cluster_port(hosts),
        overrides=overrides or {},
    )  # fmt: skip
    try:
        cluster.up()
        yield cluster
    except BaseException:
        for spec in cluster.specs:
            if spec.log_path.exists():
                print(f"---- {spec.log_path}\n{spec.log_path.read_text()[-4000:]}")
        raise
    finally:
        for spec in cluster.specs:
            cluster.signal_node(spec.node_id, signal.SIGCONT)
        cluster.down()  # every node, those the CLI added too (cluster.json)


class Writer:
    """An idempotent acks=all producer sending one record to every partition in turn, waiting
    for each round; ``acked[p]`` is what partition p acknowledged, in order."""

    def __init__(self, cluster: LocalCluster, topic: str, partitions: int) -> None:
        self.cluster, self.topic, self.partitions = cluster, topic, partitions
        self.acked: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        self.errors: list[tuple[int, BaseException]] = []  # (partition, error)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="writer")

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=150)
        assert not self._thread.is_alive(), "the writer did not finish"

    @property
    def count(self) -> int:
        return sum(len(values) for values in self.acked.values())

    def wait_for_more(self, count: int, timeout_s: float = 60) -> None:
        wanted = self.count + count

        def written() -> bool:
            assert self.errors == [], f"sends failed: {self.errors[:3]}"
            return self.count >= wanted

        wait_for(f"{count} more acknowledged records", written, timeout_s)

    def _run(self) -> None:
        with Producer(self.cluster.bootstrap_servers, acks="all") as producer:
            n = 0
            while not self._stop.is_set() and not self.errors:
                futures = [
                    (p, value, producer.send(self.topic, value, partition=p))
                    for p in range(self.partitions)
                    for value in [f"{p}-{n:06d}".encode()]
                ]
                for p, value, future in futures:
                    try:
                        future.result(timeout=60)
                    except (KafkaError, TimeoutError) as error:
                        self.errors.append((p, error))
                        continue
                    self.acked[p].append(value)
                n += 1

    def check_stored(self, admin: AdminClient) -> None:
        """Every acknowledged record once and in order, in each partition's log."""
        assert self.errors == [], f"sends failed: {self.errors[:3]}"
        described = admin.describe_topics([self.topic])[self.topic]
        for p in described.partitions:
            address = self.cluster.broker_address(p.leader)
            end = fetch(address, self.topic, p.partition, 0).high_watermark
            stored = [r.value for r in read_all(address, self.topic, p.partition, end)]
            assert stored == self.acked[p.partition], f"partition {p.partition}"


def replicas_of(admin: AdminClient, topic: str) -> dict[tuple[str, int], tuple[int, ...]]:
    return {
        (topic, p.partition): p.replicas for p in admin.describe_topics([topic])[topic].partitions
    }


def leaders_of(admin: AdminClient, topic: str) -> Counter[int]:
    return Counter(p.leader for p in admin.describe_topics([topic])[topic].partitions)


def partition_dir(cluster: LocalCluster, node_id: int, topic: str, partition: int) -> Path:
    return cluster.spec(node_id).directory / "data" / f"{topic}-{partition}"


def running(pid: int) -> bool:
    """The process exists and is not a zombie waiting for init to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def raftlog(*args: str, timeout_s: float = 120) -> str:
    """A CLI command's stdout; it must succeed."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    done = subprocess.run(
        [*RAFTLOG, *args], env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, (done.stdout, done.stderr)
    return done.stdout


def test_three_brokers_grow_to_five_and_a_balanced_plan_moves_onto_them(
    tmp_path: Path,
) -> None:
    topic, partitions = "grow", 24
    with (
        elastic_cluster(tmp_path / "cluster") as cluster,
        AdminClient(cluster.bootstrap_servers) as admin,
    ):
        assert admin.create_topics([NewTopic(topic, partitions, 3)]) == {topic: None}
        wait_for_leaders(cluster, topic, partitions)
        with Writer(cluster, topic, partitions) as writer:
            writer.wait_for_more(200)
            assert [cluster.add_node(), cluster.add_node()] == [4, 5]
            brokers = {b.broker_id: b for b in admin.describe_cluster().brokers}
            assert sorted(brokers) == [1, 2, 3, 4, 5] and not brokers[5].fenced
            before = replicas_of(admin, topic)
            plan = plan_reassignment(before, [1, 2, 3, 4, 5])
            errors = admin.alter_partition_reassignments(plan)
            assert all(error is None for error in errors.values()), errors
            wait_for(
                "the moves to complete",
                lambda: not admin.list_partition_reassignments(),
                timeout_s=120,
            )
            writer.wait_for_more(200)
        after = replicas_of(admin, topic)
        assert after == plan
        held = Counter(b for replicas in after.values() for b in replicas)
        assert max(held.values()) - min(held.values()) <= 1 and len(held) == 5

        bootstrap = ",".join(cluster.bootstrap_servers)

        def balanced() -> dict[str, Any] | None:
            out = raftlog("cluster", "rebalance-leaders", "--json", "--bootstrap-server", bootstrap)
            answer: dict[str, Any] = json.loads(out)
            return answer if not answer["not_available"] else None

        answer = wait_for("every preferred replica to lead", balanced, timeout_s=60)
        for move in answer["moved"]:
            assert move["to"] == after[(topic, move["partition"])][0]
        leaders = leaders_of(admin, topic)
        assert sorted(leaders) == [1, 2, 3, 4, 5]
        assert max(leaders.values()) - min(leaders.values()) <= 1, leaders
        writer.check_stored(admin)
        for (_, p), replicas in before.items():
            for gone in set(replicas) - set(after[(topic, p)]):
                wait_for(
                    f"broker {gone} to delete {topic}-{p}",
                    lambda: not partition_dir(cluster, gone, topic, p).exists(),  # noqa: B023
                )
            for added in set(after[(topic, p)]) - set(replicas):
                assert partition_dir(cluster, added, topic, p).exists()


def kafka_unregister_broker(cluster: LocalCluster, broker_id: int) -> int:
    """UnregisterBroker v0 (key 64, flexible: header v2) on node 1's KAFKA listener: the error
    code it answers."""
    client_id = b"elastic-test"
    header = struct.pack(">hhih", 64, 0, 5, len(client_id)) + client_id + b"\0"
    frame = header + struct.pack(">i", broker_id) + b"\0"
    host, port = cluster.kafka_address(1).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", connection.recv(4, socket.MSG_WAITALL))[0]
        answer = connection.recv(size, socket.MSG_WAITALL)
    correlation_id, _tags, _throttle, error_code = struct.unpack_from(">ibih", answer)
    assert correlation_id == 5
    return int(error_code)


def test_a_broker_that_leads_partitions_is_drained_and_removed_under_load(
    tmp_path: Path,
) -> None:
    topic, partitions = "drain", 8
    root = tmp_path / "cluster"
    with elastic_cluster(root) as cluster, AdminClient(cluster.bootstrap_servers) as admin:
        added = json.loads(raftlog("cluster", "add-node", "--root", str(root), "--json"))
        assert added["node"] == 4 and added["address"] == cluster.broker_address(4)
        status = json.loads(raftlog("cluster", "status", "--root", str(root), "--json"))
        assert [(r["node"], r["role"], r["broker"]) for r in status][3] == (4, "broker", "unfenced")
        rotations = [(4, 1, 2), (1, 2, 3), (2, 3, 4), (3, 4, 1)]
        assignment = {p: rotations[p % 4] for p in range(partitions)}
        configs = {"min.insync.replicas": "2"}
        created = admin.create_topics(
            [NewTopic(topic, configs=configs, replica_assignment=assignment)]
        )
        assert created == {topic: None}
        wait_for_leaders(cluster, topic, partitions)
        assert leaders_of(admin, topic)[4] == 2
        hosted = {tp for tp, replicas in replicas_of(admin, topic).items() if 4 in replicas}
        with Writer(cluster, topic, partitions) as writer:
            writer.wait_for_more(100)
            with pytest.raises(KafkaError) as refused:
                admin.unregister_broker(4)
            assert refused.value.error is ErrorCode.INVALID_REQUEST
            assert "still hosts 6 replicas" in refused.value.message
            with pytest.raises(KafkaError) as unknown:
                admin.unregister_broker(9)
            assert unknown.value.error is ErrorCode.BROKER_ID_NOT_REGISTERED
            assert kafka_unregister_broker(cluster, 9) == ErrorCode.BROKER_ID_NOT_REGISTERED.code
            assert kafka_unregister_broker(cluster, 4) == ErrorCode.INVALID_REQUEST.code
            pid = cluster.pid(4)
            removed = json.loads(
                raftlog("cluster", "remove-node", "4", "--root", str(root), "--json")
            )
            writer.wait_for_more(100)
        assert removed["unregistered"] and removed["drained"]
        assert {(m["topic"], m["partition"]) for m in removed["moves"]} == hosted
        assert all(4 not in replicas for replicas in replicas_of(admin, topic).values())
        assert sorted(b.broker_id for b in admin.describe_cluster().brokers) == [1, 2, 3]
        kp = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers[:3])
        try:
            assert sorted(b["broker_id"] for b in kp.describe_cluster()["brokers"]) == [1, 2, 3]
        finally:
            kp.close()
        assert pid is not None
        wait_for(f"node 4 (pid {pid}) to be gone", lambda: not running(pid), timeout_s=10)
        status = json.loads(raftlog("cluster", "status", "--root", str(root), "--json"))
        assert [r["node"] for r in status] == [1, 2, 3]
        writer.check_stored(admin)


def test_a_rolling_restart_ends_with_leadership_balanced(tmp_path: Path) -> None:
    """Each node in turn is restarted (SIGTERM: its controlled shutdown moves its leadership
    away) and waited for back in every ISR; nothing but the controller's automatic rebalance
    (every second here) gives the returning node its preferred partitions back."""
    topic, partitions = "roll", 12
    overrides: dict[str, str | int] = {"leader.imbalance.check.interval.seconds": 1}
    with (
        elastic_cluster(tmp_path / "cluster", overrides=overrides) as cluster,
        AdminClient(cluster.bootstrap_servers) as admin,
    ):
        created = admin.create_topics(
            [NewTopic(topic, partitions, 3, {"min.insync.replicas": "2"})]
        )
        assert created == {topic: None}
        wait_for_leaders(cluster, topic, partitions)
        preferred = Counter(r[0] for r in replicas_of(admin, topic).values())
        assert preferred == {1: 4, 2: 4, 3: 4}

        def in_every_isr() -> bool:
            described = admin.describe_topics([topic])[topic].partitions
            return all(len(p.isr) == 3 for p in described)

        with Writer(cluster, topic, partitions) as writer:
            writer.wait_for_more(100)
            for node_id in (1, 2, 3):
                cluster.restart_node(node_id)
                cluster.wait_for_brokers([node_id])
                wait_for(f"node {node_id} back in every ISR", in_every_isr, timeout_s=60)
                writer.wait_for_more(50)

            def preferred_lead() -> bool:
                described = admin.describe_topics([topic])[topic].partitions
                return all(p.leader == p.replicas[0] for p in described)

            wait_for("the preferred replicas to lead again", preferred_lead, timeout_s=30)
            writer.wait_for_more(50)
        assert leaders_of(admin, topic) == {1: 4, 2: 4, 3: 4}
        writer.check_stored(admin)
