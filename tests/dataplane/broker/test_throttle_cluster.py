"""Replication throttles with real processes: three combined nodes and a fourth that is a broker
only (127.0.0.224-227). Two partitions hold 10 MiB each; one moves onto broker 4 unthrottled, the
other through ``raftlog partitions reassign --execute --throttle`` at 1 MiB/s, which must take
about size / rate (generously: this runs on small machines) and clearly longer than the
unthrottled move, while an acks=all producer keeps writing to the partition being moved (its
in-sync followers are never throttled). ``--verify`` removes the throttles once the move is
complete; running ``--execute`` again with another ``--throttle`` changes the rate of a move
under way."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType as KpResourceType

from dataplane.client import AdminClient, NewTopic, Producer, TopicPartition
from dataplane.client.admin import ConfigResource, ResourceType
from dataplane.tools.entry import COMMAND
from dataplane.tools.local_cluster import LocalCluster, wait_for
from tests.dataplane.cluster_support import running_cluster, wait_for_leaders

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-throttle")]
TOPIC = "big"
MIB = 1024 * 1024
PARTITION_BYTES = 10 * MIB
VALUE_BYTES = 16 * 1024
THROTTLE_BYTES_PER_S = MIB
RATES = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
UNTHROTTLED = str(2**63 - 1)


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path_factory.mktemp("throttle"), "throttle", nodes=4, controllers=3
    ) as running:
        yield running


def fill(cluster: LocalCluster, partitions: list[int]) -> None:
    """PARTITION_BYTES of incompressible values into each partition, acks=all."""
    with Producer(cluster.bootstrap_servers, acks="all", linger_ms=20) as producer:
        futures = [
            producer.send(TOPIC, os.urandom(VALUE_BYTES), partition=p)
            for p in partitions
            for _ in range(PARTITION_BYTES // VALUE_BYTES)
        ]
        producer.flush()
        for future in futures:
            future.result(timeout=60)


def moving(admin: AdminClient, partition: int) -> bool:
    return TopicPartition(TOPIC, partition) in admin.list_partition_reassignments()


def wait_moved(admin: AdminClient, partition: int, timeout_s: float = 90) -> None:
    wait_for(f"{TOPIC}-{partition} to move", lambda: not moving(admin, partition), timeout_s)


def log_bytes(cluster: LocalCluster, node_id: int, partition: int) -> int:
    directory = cluster.spec(node_id).directory / "data" / f"{TOPIC}-{partition}"
    return sum(f.stat().st_size for f in directory.glob("*.log"))


def broker_rates(admin: AdminClient, broker_id: int) -> tuple[str, str]:
    resource = ConfigResource(ResourceType.BROKER, str(broker_id))
    entries = admin.describe_configs([resource])[resource]
    return entries[RATES[0]].value, entries[RATES[1]].value


def kafka_broker_config(cluster: LocalCluster, broker_id: int, key: str) -> tuple[str, str]:
    """A broker's config as kafka-python's DescribeConfigs shows it: (value, source)."""
    kp = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
    try:
        resource = KpConfigResource(KpResourceType.BROKER, str(broker_id))
        entry = kp.describe_configs([resource])["broker"][str(broker_id)][key]
    finally:
        kp.close()
    return entry["value"], entry["config_source"]


def held_back(cluster: LocalCluster, node_id: int) -> float:
    """raftlog_replication_throttled_held_back_total of the node, both sides."""
    url = f"http://{cluster.metrics_address(node_id)}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        lines = response.read().decode().splitlines()
    prefix = "raftlog_replication_throttled_held_back_total{"
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))


class LiveWriter:
    """An acks=all producer writing small records to one partition, about 50 a second."""

    def __init__(self, cluster: LocalCluster, partition: int) -> None:
        self.cluster = cluster
        self.partition = partition
        self.latencies_s: list[float] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._write, name="live-writer")

    def _write(self) -> None:
        with Producer(self.cluster.bootstrap_servers, acks="all", linger_ms=0) as producer:
            n = 0
            while not self.stop.wait(0.02):  # the workload's pace
                started = time.monotonic()
                try:
                    value = f"live-{n:06d}".encode() * 10
                    producer.send(TOPIC, value, partition=self.partition).result(timeout=30)
                except Exception as error:  # noqa: BLE001 (kept and asserted on)
                    self.errors.append(error)
                    return
                self.latencies_s.append(time.monotonic() - started)
                n += 1

    def __enter__(self) -> LiveWriter:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()


def test_a_throttled_move_takes_size_over_rate_and_live_produce_goes_on(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    bootstrap = ",".join(cluster.bootstrap_servers)

    def reassign(*args: str) -> subprocess.CompletedProcess[str]:
        command = [*COMMAND, "partitions", "reassign"]
        return subprocess.run(
            [*command, *args, "--bootstrap-server", bootstrap],
            env=env, capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip

    def plan(name: str, partition: int, replicas: list[int]) -> str:
        path = tmp_path / name
        entry = {"topic": TOPIC, "partition": partition, "replicas": replicas}
        path.write_text(json.dumps({"version": 1, "partitions": [entry]}))
        return str(path)

    with AdminClient(cluster.bootstrap_servers) as admin:
        assignment = {0: (1, 2), 1: (2, 3)}
        assert admin.create_topics([NewTopic(TOPIC, replica_assignment=assignment)]) == {
            TOPIC: None
        }
        wait_for_leaders(cluster, TOPIC, 2)
        fill(cluster, [0, 1])

        # unthrottled: partition 1 onto broker 4
        started = time.monotonic()
        assert admin.alter_partition_reassignments({(TOPIC, 1): (2, 4)}) == {
            TopicPartition(TOPIC, 1): None
        }
        wait_moved(admin, 1)
        unthrottled_s = time.monotonic() - started
        assert admin.describe_topics([TOPIC])[TOPIC].partitions[1].replicas == (2, 4)
        assert log_bytes(cluster, 4, 1) >= PARTITION_BYTES

        # throttled at 1 MiB/s: partition 0 onto broker 4, under live produce
        throttled_plan = plan("throttled.json", 0, [1, 4])
        with LiveWriter(cluster, 0) as writer:
            executed = reassign("--execute", "--plan", throttled_plan,
                                "--throttle", str(THROTTLE_BYTES_PER_S))  # fmt: skip
            started = time.monotonic()
            assert executed.returncode == 0, executed.stderr
            assert f"throttle limit was set to {THROTTLE_BYTES_PER_S} B/s" in executed.stdout
            for broker_id in (1, 2, 4):  # the current replicas and the new one
                assert broker_rates(admin, broker_id) == (str(THROTTLE_BYTES_PER_S),) * 2
            assert broker_rates(admin, 3) == (UNTHROTTLED,) * 2
            assert kafka_broker_config(cluster, 4, RATES[0]) == (
                str(THROTTLE_BYTES_PER_S), "DYNAMIC_BROKER_CONFIG",
            )  # fmt: skip
            configs = admin.describe_topics([TOPIC])[TOPIC].configs
            assert configs["leader.replication.throttled.replicas"] == "0:1,0:2"
            assert configs["follower.replication.throttled.replicas"] == "0:4"
            assert moving(admin, 0)
            not_yet = reassign("--verify", "--plan", throttled_plan)
            assert not_yet.returncode == 1 and "in progress" in not_yet.stdout
            wait_moved(admin, 0)
            throttled_s = time.monotonic() - started
        assert admin.describe_topics([TOPIC])[TOPIC].partitions[0].replicas == (1, 4)
        assert log_bytes(cluster, 4, 0) >= PARTITION_BYTES
        assert writer.errors == []
        latencies = sorted(writer.latencies_s)
        print(
            f"10 MiB onto broker 4: unthrottled {unthrottled_s:.1f} s, at 1 MiB/s "
            f"{throttled_s:.1f} s; live acks=all produce meanwhile: {len(latencies)} records, "
            f"median {latencies[len(latencies) // 2] * 1000:.0f} ms, max {latencies[-1]:.2f} s"
        )
        nominal_s = PARTITION_BYTES / THROTTLE_BYTES_PER_S
        assert throttled_s >= 0.5 * nominal_s, "the throttle bounds the catch-up"
        assert throttled_s <= 4 * nominal_s, "and does not starve it"
        assert throttled_s > 2 * unthrottled_s
        assert len(latencies) >= 2 * nominal_s, "live produce went on during the move"
        assert latencies[-1] < 5.0, "in-sync followers are not throttled: acks=all is not slowed"
        assert held_back(cluster, 1) + held_back(cluster, 4) > 0

        verified = reassign("--verify", "--plan", throttled_plan)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "Cleared the throttle rates of brokers 1,2,4" in verified.stdout
        assert f"Cleared the throttled replicas of topics {TOPIC}" in verified.stdout
        for broker_id in (1, 2, 3, 4):
            assert broker_rates(admin, broker_id) == (UNTHROTTLED,) * 2
        assert admin.describe_topics([TOPIC])[TOPIC].configs == {}

        # a move held back by a tiny throttle; --execute again with a new rate lets it finish
        stuck_plan = plan("stuck.json", 1, [2, 3])
        executed = reassign("--execute", "--plan", stuck_plan, "--throttle", "10240")
        assert executed.returncode == 0, executed.stderr
        wait_for("the throttle to hold the move back", lambda: held_back(cluster, 3) > 0)
        assert moving(admin, 1)
        faster = 100 * MIB
        executed = reassign("--execute", "--plan", stuck_plan, "--throttle", str(faster))
        assert executed.returncode == 0, executed.stderr
        assert "1 partitions were already moving to their target" in executed.stdout
        assert broker_rates(admin, 3) == (str(faster),) * 2
        wait_moved(admin, 1, timeout_s=30)  # at 10 KiB/s it would take 1000 s
        assert reassign("--verify", "--plan", stuck_plan).returncode == 0
        assert broker_rates(admin, 3) == (UNTHROTTLED,) * 2
