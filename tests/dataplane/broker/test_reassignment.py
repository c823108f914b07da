"""Partition reassignment (KIP-455) with real processes: three combined nodes and a fourth that
is a broker only (127.0.0.231-234). A partition moves onto the new broker and off its leader
while an idempotent acks=all producer keeps writing; every acknowledged record is read back once
and in order, the leader hands over, the leaving replica deletes its log. A move to a broker that
cannot catch up (paused) is cancelled. Bad targets are refused with Kafka's error codes and
change nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import InvalidReplicationAssignmentError, NoReassignmentInProgressError

from dataplane.client import AdminClient, NewTopic, Producer, TopicPartition
from dataplane.client.admin import ConfigResource, ResourceType, TopicDescription
from dataplane.tools.entry import COMMAND
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.cluster_support import fetch, read_all, running_cluster, wait_for_leaders

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-reassignment")]
TOPIC = "moving"


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("reassignment")
    overrides: dict[str, str | int] = {"replica.lag.time.max.ms": 3000}
    with running_cluster(root, "reassignment", overrides, nodes=4, controllers=3) as running:
        yield running


@pytest.fixture
def admin(cluster: LocalCluster) -> Iterator[AdminClient]:
    client = AdminClient(cluster.bootstrap_servers)
    yield client
    client.close()


def described(admin: AdminClient) -> TopicDescription:
    return admin.describe_topics([TOPIC])[TOPIC]


def create_on_first_three(
    cluster: LocalCluster, admin: AdminClient, partitions: int, configs: dict[str, str]
) -> None:
    """The topic on brokers 1-3 only (leaders spread), so broker 4 is new to it."""
    orders = [(1, 2, 3), (2, 3, 1), (3, 1, 2)]
    assignment = {p: orders[p % 3] for p in range(partitions)}
    errors = admin.create_topics([NewTopic(TOPIC, configs=configs, replica_assignment=assignment)])
    assert errors == {TOPIC: None}
    wait_for_leaders(cluster, TOPIC, partitions)


def partition_dir(cluster: LocalCluster, node_id: int, partition: int) -> Path:
    return cluster.spec(node_id).directory / "data" / f"{TOPIC}-{partition}"


def test_a_partition_moves_off_its_leader_under_load(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    create_on_first_three(cluster, admin, 2, {"min.insync.replicas": "2"})
    before, untouched = described(admin).partitions
    leaving = before.leader
    target = (4, *[b for b in before.replicas if b != leaving])
    acked: list[bytes] = []
    stop = threading.Event()

    def write() -> None:
        with Producer(cluster.bootstrap_servers, acks="all") as producer:
            n = 0
            while not stop.is_set() or n < 200:
                value = f"{n:06d}".encode()
                producer.send(TOPIC, value, partition=0).result(timeout=30)
                acked.append(value)
                n += 1

    writer = threading.Thread(target=write, name="writer")
    writer.start()
    try:
        wait_for("records before the move", lambda: len(acked) >= 100 or None)
        errors = admin.alter_partition_reassignments({(TOPIC, 0): target})
        assert errors == {TopicPartition(TOPIC, 0): None}
        wait_for(
            "the move to complete",
            lambda: not admin.list_partition_reassignments() or None,
            timeout_s=90,
        )
    finally:
        stop.set()
        writer.join(timeout=120)
    assert not writer.is_alive()
    after = described(admin).partitions[0]
    assert after.replicas == target and set(after.isr) == set(target)
    assert after.leader in target and after.leader_epoch > before.leader_epoch
    assert (after.adding_replicas, after.removing_replicas) == ((), ())
    wait_for(
        "the leaving replica to delete its log",
        lambda: not partition_dir(cluster, leaving, 0).exists() or None,
    )
    assert partition_dir(cluster, 4, 0).exists()
    address = cluster.broker_address(after.leader)
    end = fetch(address, TOPIC, 0, 0).high_watermark
    stored = [r.value for r in read_all(address, TOPIC, 0, end)]
    assert stored == acked, "every acknowledged record once, in order"
    assert described(admin).partitions[1] == untouched


def test_a_move_that_cannot_catch_up_is_cancelled(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    create_on_first_three(cluster, admin, 1, {})
    before = described(admin).partitions[0]
    dropped = before.replicas[-1] if before.replicas[-1] != before.leader else before.replicas[1]
    target = tuple(4 if b == dropped else b for b in before.replicas)
    cluster.signal_node(4, signal.SIGSTOP)
    try:
        assert admin.alter_partition_reassignments({(TOPIC, 0): target}) == {
            TopicPartition(TOPIC, 0): None
        }
        ongoing = admin.list_partition_reassignments()
        assert ongoing[TopicPartition(TOPIC, 0)].adding_replicas == (4,)
        assert ongoing[TopicPartition(TOPIC, 0)].removing_replicas == (dropped,)
        cancelled = admin.alter_partition_reassignments({(TOPIC, 0): None})
        assert cancelled == {TopicPartition(TOPIC, 0): None}
    finally:
        cluster.signal_node(4, signal.SIGCONT)
    reverted = described(admin).partitions[0]
    assert set(reverted.replicas) == set(before.replicas) and 4 not in reverted.replicas
    assert reverted.leader == before.leader
    assert admin.list_partition_reassignments() == {}
    again = admin.alter_partition_reassignments({(TOPIC, 0): None})
    error = again[TopicPartition(TOPIC, 0)]
    assert error is not None and error.error is ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
    wait_for(
        "broker 4 to drop the replica it no longer hosts",
        lambda: not partition_dir(cluster, 4, 0).exists() or None,
    )


def test_bad_targets_are_refused_and_change_nothing(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    create_on_first_three(cluster, admin, 1, {})
    before = described(admin)
    cases = {
        (TOPIC, 0): (1, 2, 9),  # no broker 9
        (TOPIC, 5): (1, 2, 3),  # no partition 5
        ("absent", 0): (1, 2, 3),
    }
    errors = admin.alter_partition_reassignments(cases, allow_replication_factor_change=False)
    codes = {tp: e.error if e else None for tp, e in errors.items()}
    assert codes == {
        TopicPartition(TOPIC, 0): ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        TopicPartition(TOPIC, 5): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        TopicPartition("absent", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
    shrink = admin.alter_partition_reassignments(
        {(TOPIC, 0): (1, 2)}, allow_replication_factor_change=False
    )
    refused = shrink[TopicPartition(TOPIC, 0)]
    assert refused is not None and refused.error is ErrorCode.INVALID_REPLICATION_FACTOR
    assert described(admin) == before


def test_a_move_survives_the_failover_of_the_active_controller(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    """The move is in the metadata log: started, then the active controller is SIGKILLed while
    the new replica is held back (paused); the next controller completes it."""
    create_on_first_three(cluster, admin, 1, {})
    before = described(admin).partitions[0]
    target = (4, *before.replicas[:2])
    cluster.signal_node(4, signal.SIGSTOP)
    try:
        assert admin.alter_partition_reassignments({(TOPIC, 0): target}) == {
            TopicPartition(TOPIC, 0): None
        }
        active = cluster.wait_for_leader()
        cluster.stop_node(active, kill=True)
        wait_for("another active controller", lambda: cluster.wait_for_leader() != active or None)
        assert TopicPartition(TOPIC, 0) in admin.list_partition_reassignments()
    finally:
        cluster.signal_node(4, signal.SIGCONT)
    cluster.start_node(active)
    wait_for(
        "the move to complete after the failover",
        lambda: not admin.list_partition_reassignments() or None,
        timeout_s=90,
    )
    after = described(admin).partitions[0]
    assert after.replicas == target and set(after.isr) == set(target)


def test_kafka_python_moves_and_lists_through_the_kafka_listener(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    """kafka-python's KafkaAdminClient (AlterPartitionReassignments v1, ListPartition-
    Reassignments v0) against the KAFKA listener: a move, its progress, Kafka's error classes.
    The move is held back by a follower throttle of 1 byte/s on broker 4 (with more data than
    one fetch carries), so every broker keeps answering kafka-python meanwhile."""
    create_on_first_three(cluster, admin, 2, {})
    with Producer(cluster.bootstrap_servers, acks=1) as producer:
        for n in range(3000):
            producer.send(TOPIC, f"{n:06d}".encode().ljust(1024, b"."), partition=0)
        producer.flush()
    hold = {"follower.replication.throttled.rate": "1"}
    admin.alter_configs(ConfigResource(ResourceType.BROKER, "4"), hold)
    admin.alter_configs(
        ConfigResource(ResourceType.TOPIC, TOPIC),
        {"follower.replication.throttled.replicas": "0:4"},
    )
    kp = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
    try:
        answer = kp.alter_partition_reassignments(
            {KpTopicPartition(TOPIC, 0): [4, 1, 2], KpTopicPartition(TOPIC, 1): [1, 2, 9]}
        )
        assert answer[KpTopicPartition(TOPIC, 0)] is None
        assert answer[KpTopicPartition(TOPIC, 1)] is InvalidReplicationAssignmentError
        ongoing = kp.list_partition_reassignments()
        assert ongoing == {
            KpTopicPartition(TOPIC, 0): {
                "replicas": [4, 1, 2, 3],
                "adding_replicas": [4],
                "removing_replicas": [3],
            }
        }
        assert kp.list_partition_reassignments([KpTopicPartition(TOPIC, 1)]) == {}
        admin.alter_configs(
            ConfigResource(ResourceType.BROKER, "4"), {"follower.replication.throttled.rate": None}
        )
        wait_for(
            "the move to complete",
            lambda: not kp.list_partition_reassignments() or None,
            timeout_s=90,
        )
        cancelled = kp.alter_partition_reassignments({KpTopicPartition(TOPIC, 0): None})
        assert cancelled[KpTopicPartition(TOPIC, 0)] is NoReassignmentInProgressError
    finally:
        kp.close()
    assert described(admin).partitions[0].replicas == (4, 1, 2)


def test_the_cli_generates_executes_and_verifies_a_balanced_plan(
    cluster: LocalCluster, admin: AdminClient, tmp_path: Path
) -> None:
    """raftlog partitions reassign, as a user runs it: grow the topic onto broker 4."""
    create_on_first_three(cluster, admin, 4, {})
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    bootstrap = ",".join(cluster.bootstrap_servers)

    def raftlog(*args: str) -> subprocess.CompletedProcess[str]:
        command = [*COMMAND, "partitions", "reassign"]
        return subprocess.run(
            [*command, *args, "--bootstrap-server", bootstrap],
            env=env, capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip

    generated = raftlog("--generate", "--brokers", "1,2,3,4", "--topics", TOPIC, "--json")
    assert generated.returncode == 0, generated.stderr
    proposed = json.loads(generated.stdout)["proposed"]
    plan = {(p["topic"], p["partition"]): tuple(p["replicas"]) for p in proposed["partitions"]}
    assert sum(r.count(4) for r in plan.values()) == 3  # 12 replicas over 4 brokers
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(proposed))
    executed = raftlog("--execute", "--plan", str(plan_path))
    assert executed.returncode == 0 and "Traceback" not in executed.stderr, executed.stderr
    assert "Successfully started the reassignment of 4 partitions" in executed.stdout

    def verified() -> bool | None:
        return raftlog("--verify", "--plan", str(plan_path)).returncode == 0 or None

    wait_for("the plan to complete", verified, timeout_s=90)
    now = {(TOPIC, p.partition): p.replicas for p in described(admin).partitions}
    assert now == plan
    missing = raftlog("--verify", "--plan", str(tmp_path / "absent.json"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "absent.json" in missing.stderr


@pytest.mark.parametrize(
    ("target", "restarted"),
    [((4, 1, 3), True), ((1, 2, 3), False)],
    ids=["leader-stays-in-target-restarted", "leader-leaves-not-restarted"],
)
def test_the_leader_of_a_moving_partition_is_killed_and_the_move_completes(
    cluster: LocalCluster, admin: AdminClient, target: tuple[int, ...], restarted: bool
) -> None:
    """Partition 0 on (4, 1, 2), led by broker 4 (a broker only: its death leaves the quorum
    alone), moves to ``target`` under an idempotent acks=all producer. Broker 3, the replica
    being added, is held back by a follower throttle of 1 byte/s, so it is still catching up
    when broker 4 is SIGKILLed. Broker 1 takes the lead, the throttle is lifted, 3 catches up
    from the new leader; where 4 stays in the target it is restarted and rejoins the ISR. The
    move completes, and every acknowledged record is read back once and in order."""
    assignment = {0: (4, 1, 2)}
    configs = {"min.insync.replicas": "2", "follower.replication.throttled.replicas": "0:3"}
    errors = admin.create_topics([NewTopic(TOPIC, configs=configs, replica_assignment=assignment)])
    assert errors == {TOPIC: None}
    wait_for_leaders(cluster, TOPIC, 1)
    assert described(admin).partitions[0].leader == 4
    hold = ConfigResource(ResourceType.BROKER, "3")
    admin.alter_configs(hold, {"follower.replication.throttled.rate": "1"})
    acked: list[bytes] = []
    failures: list[KafkaError | TimeoutError] = []
    stop = threading.Event()

    def write() -> None:
        with Producer(cluster.bootstrap_servers, acks="all") as producer:
            n = 0
            while not stop.is_set():
                value = f"{n:06d}".encode()
                try:
                    producer.send(TOPIC, value, partition=0).result(timeout=60)
                except (KafkaError, TimeoutError) as error:  # asserted on below
                    failures.append(error)
                    return
                acked.append(value)
                n += 1

    def state() -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        p = described(admin).partitions[0]
        return p.leader, p.isr, p.adding_replicas

    writer = threading.Thread(target=write, name="writer")
    writer.start()
    try:
        wait_for("records before the move", lambda: len(acked) >= 100 or None)
        assert admin.alter_partition_reassignments({(TOPIC, 0): target}) == {
            TopicPartition(TOPIC, 0): None
        }
        started = len(acked)
        wait_for("writes during the catch-up", lambda: len(acked) >= started + 100 or None)
        leader, isr, adding = state()
        assert (leader, adding) == (4, (3,)) and 3 not in isr, "3 is still catching up"
        cluster.stop_node(4, kill=True)
        wait_for("a new leader", lambda: state()[0] not in (4, -1) or None, timeout_s=60)
        killed_at = len(acked)
        wait_for("writes to the new leader", lambda: len(acked) >= killed_at + 100 or None, 60)
        assert TopicPartition(TOPIC, 0) in admin.list_partition_reassignments()
        admin.alter_configs(hold, {"follower.replication.throttled.rate": None})
        if restarted:
            cluster.start_node(4)
        wait_for(
            "the move to complete",
            lambda: not admin.list_partition_reassignments() or None,
            timeout_s=120,
        )
        done_at = len(acked)
        wait_for("writes after the move", lambda: len(acked) >= done_at + 50 or None, 60)
    finally:
        stop.set()
        writer.join(timeout=120)
    assert not writer.is_alive()
    assert failures == []
    after = described(admin).partitions[0]
    assert after.replicas == target and set(after.isr) == set(target)
    assert (after.adding_replicas, after.removing_replicas) == ((), ())
    address = cluster.broker_address(after.leader)
    end = fetch(address, TOPIC, 0, 0).high_watermark
    stored = [r.value for r in read_all(address, TOPIC, 0, end)]
    assert len(stored) == len(set(stored)), "no record twice"
    assert stored == acked, "every acknowledged record once, in order"
