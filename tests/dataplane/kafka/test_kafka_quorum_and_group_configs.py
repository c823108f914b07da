"""DescribeQuorum, ListConfigResources and groups' configs (Kafka 4) through Kafka's own clients
(kafka-python, confluent-kafka) against a real 3-node cluster on the "kafka" range
(127.0.0.171-173, shared with test_protocol.py and test_kafka_admin_extras.py: the xdist group
runs them one after the other). The bounds are lowered so a per-group session can be short.
The rules are tested pure in tests/metadata_quorum/test_group_configs.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaException, ShareConsumer
from confluent_kafka import Producer as RdProducer
from confluent_kafka.admin import AdminClient as RdAdminClient
from confluent_kafka.admin import ResourceType  # type: ignore[attr-defined]
from confluent_kafka.admin._config import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from kafka import KafkaAdminClient

from dataplane.kafka import codec as kc
from dataplane.tools.local_cluster import LocalCluster, wait_for
from tests.dataplane.cluster_support import create_topic, running_cluster
from tests.dataplane.kafka.raw_connection import RawKafkaConnection

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("kafka-protocol")]
OVERRIDES: dict[str, str | int] = {
    "group.consumer.min.session.timeout.ms": 2_000,
    "group.consumer.min.heartbeat.interval.ms": 100,
    "group.share.min.record.lock.duration.ms": 1_000,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("kafka-quorum-groups")
    with running_cluster(root, "kafka", OVERRIDES) as running:
        yield running


def rd_admin(cluster: LocalCluster) -> RdAdminClient:
    return RdAdminClient({"bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers)})


def set_group_configs(cluster: LocalCluster, group: str, values: dict[str, str]) -> None:
    resource = ConfigResource(
        ResourceType.GROUP, group,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in values.items()
        ],
    )  # fmt: skip
    admin = rd_admin(cluster)  # alive until its answer: librdkafka drops it with the handle
    admin.incremental_alter_configs([resource])[resource].result(30)


def test_describe_metadata_quorum(cluster: LocalCluster, kp_admin: KafkaAdminClient) -> None:
    quorum = kp_admin.describe_metadata_quorum()
    (topic,) = quorum["topics"]
    assert topic["topic_name"] == "__cluster_metadata"
    (partition,) = topic["partitions"]
    assert partition.get("error_code", 0) == 0, partition
    voters = {v["replica_id"]: v for v in partition["current_voters"]}
    assert set(voters) == {1, 2, 3}
    assert partition["leader_id"] in voters and partition["leader_epoch"] >= 1
    assert partition["high_watermark"] > 0
    leader = voters[partition["leader_id"]]
    assert leader["log_end_offset"] >= partition["high_watermark"]
    assert leader["last_caught_up_timestamp"] > 0
    assert {o["replica_id"] for o in partition["observers"]} == {1, 2, 3}
    nodes = {n["node_id"]: n["listeners"] for n in quorum["nodes"]}
    assert set(nodes) == {1, 2, 3}
    assert all(ls and ls[0]["name"] == "CONTROLLER" for ls in nodes.values())


def test_group_configs_alter_describe_and_list(
    cluster: LocalCluster, kp_admin: KafkaAdminClient
) -> None:
    set_group_configs(cluster, "configured", {"share.auto.offset.reset": "earliest"})
    resource = ConfigResource(ResourceType.GROUP, "configured")
    admin = rd_admin(cluster)

    def described_after_the_alter() -> Any:
        # a broker answers from its metadata image, which follows the controller's commit
        # (Kafka's brokers answer from their metadata cache the same way)
        described = admin.describe_configs([resource])[resource].result(30)
        return described if described["share.auto.offset.reset"].value == "earliest" else None

    described = wait_for("the broker to see the group config", described_after_the_alter, 30)
    reset = described["share.auto.offset.reset"]
    assert reset.value == "earliest" and reset.source == ConfigSource.GROUP_CONFIG.value
    session = described["consumer.session.timeout.ms"]
    assert session.source != ConfigSource.GROUP_CONFIG.value
    # an invalid value is refused and nothing changes
    bad = ConfigResource(
        ResourceType.GROUP, "configured",
        incremental_configs=[ConfigEntry("consumer.session.timeout.ms", "500",
                                         incremental_operation=AlterConfigOpType.SET)],
    )  # fmt: skip
    with pytest.raises(KafkaException, match=r"INVALID_CONFIG|greater than or equal"):
        admin.incremental_alter_configs([bad])[bad].result(30)
    listed = kp_admin.list_config_resources()
    assert "configured" in listed.get("group", [])
    assert {"1", "2", "3"} <= set(listed.get("broker", []))


def test_share_group_earliest_reads_records_from_before_it_existed(cluster: LocalCluster) -> None:
    """A share partition of a group with share.auto.offset.reset=earliest starts at the log
    start: records produced before the group existed are delivered."""
    topic, group = "before-share", f"share-{uuid.uuid4().hex[:6]}"
    create_topic(cluster, topic, 1)
    producer = RdProducer({"bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers)})
    for n in range(10):
        producer.produce(topic, value=f"old-{n}".encode())
    assert producer.flush(30) == 0
    set_group_configs(cluster, group, {"share.auto.offset.reset": "earliest"})
    consumer = ShareConsumer({
        "bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers), "group.id": group,
    })  # fmt: skip
    seen: set[bytes] = set()
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 45
        while len(seen) < 10 and time.monotonic() < deadline:
            for message in consumer.poll(1.0) or []:
                value = message.value()
                if message.error() is None and value is not None:
                    seen.add(value)
    finally:
        consumer.close()
    assert seen == {f"old-{n}".encode() for n in range(10)}


def _coordinator(cluster: LocalCluster, group: str) -> RawKafkaConnection:
    """A connection to the group's coordinator (FindCoordinator v4, key type 0)."""
    bootstrap = RawKafkaConnection(cluster.kafka_bootstrap_servers[0])
    try:

        def found() -> Any:
            answer = bootstrap.call(kc.API_FIND_COORDINATOR, 4, {
                "key_type": 0, "coordinator_keys": [group],
            })  # fmt: skip
            (coordinator,) = answer.coordinators
            return coordinator if coordinator.error_code == 0 else None

        coordinator = wait_for(f"the coordinator of {group}", found)
    finally:
        bootstrap.close()
    return RawKafkaConnection(f"{coordinator.host}:{coordinator.port}")


def test_consumer_group_honours_its_session_timeout(cluster: LocalCluster) -> None:
    """A KIP-848 member of a group with consumer.session.timeout.ms=3000 is told the group's
    heartbeat interval, and once it stops heartbeating it is removed after about 3 s, not the
    broker's 45 s."""
    topic, group = "short-session", f"kip848-{uuid.uuid4().hex[:6]}"
    create_topic(cluster, topic, 1)
    set_group_configs(cluster, group, {"consumer.session.timeout.ms": "3000",
                                       "consumer.heartbeat.interval.ms": "500"})  # fmt: skip
    coordinator = _coordinator(cluster, group)
    try:
        joined = coordinator.call(kc.API_CONSUMER_GROUP_HEARTBEAT, 0, {
            "group_id": group, "member_id": str(uuid.uuid4()), "member_epoch": 0,
            "instance_id": None, "rack_id": None, "rebalance_timeout": 30_000,
            "subscribed_topic_names": [topic], "server_assignor": None, "topic_partitions": [],
        })  # fmt: skip
        assert joined.error_code == 0
        assert kc.millis(joined.heartbeat_interval) == 500
        silent_since = time.monotonic()

        def members() -> int:
            answer = coordinator.call(kc.API_CONSUMER_GROUP_DESCRIBE, 0, {
                "group_ids": [group], "include_authorized_operations": False,
            })  # fmt: skip
            return len(answer.groups[0].members)

        assert members() == 1
        wait_for("the silent member removed", lambda: members() == 0, 30)
        assert time.monotonic() - silent_since < 20  # the broker's default is 45 s
    finally:
        coordinator.close()
