"""Finalized feature levels that switch APIs off and on again, as on Kafka 4, through
kafka-python's update_features and librdkafka's KIP-848 consumer, against a real one-node
cluster on the "kafka" range (127.0.0.171, shared with test_protocol.py and the other modules of
the "kafka-protocol" xdist group, which runs them one after the other). The rules are tested
pure in tests/metadata_quorum/test_features.py and test_feature_gates.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer
from kafka import KafkaAdminClient

from dataplane.kafka import codec as kc
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import create_topic, running_cluster
from tests.dataplane.kafka.raw_connection import RawKafkaConnection

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("kafka-protocol")]
CONSUMER_GROUP_APIS = {kc.API_CONSUMER_GROUP_HEARTBEAT, kc.API_CONSUMER_GROUP_DESCRIBE}
SHARE_APIS = {
    kc.API_SHARE_GROUP_HEARTBEAT, kc.API_SHARE_GROUP_DESCRIBE, kc.API_SHARE_FETCH,
    kc.API_SHARE_ACKNOWLEDGE,
}  # fmt: skip
BOOTSTRAP = {"metadata.version": 23, "kraft.version": 1, "group.version": 1,
             "share.version": 1, "transaction.version": 1,
             "eligible.leader.replicas.version": 1}  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("kafka-feature-levels")
    one_node: dict[str, str | int] = {
        "offsets.topic.replication.factor": 1,
        "share.coordinator.state.topic.replication.factor": 1,
    }
    with running_cluster(root, "kafka", one_node, nodes=1) as running:
        yield running


def finalized(admin: KafkaAdminClient) -> dict[str, int]:
    return {
        name: levels["finalized"][1]
        for name, levels in admin.describe_features().items()
        if "finalized" in levels
    }


def call(cluster: LocalCluster, api_key: int, version: int, data: dict[str, Any]) -> Any:
    """One request on a connection of its own (ApiVersions: what a new client learns)."""
    connection = RawKafkaConnection(cluster.kafka_bootstrap_servers[0])
    try:
        return connection.call(api_key, version, data)
    finally:
        connection.close()


def advertised(cluster: LocalCluster) -> set[int]:
    versions = {"client_software_name": "raftlog-test", "client_software_version": "1"}
    return {a.api_key for a in call(cluster, kc.API_VERSIONS, 3, versions).api_keys}


def group_consumer(cluster: LocalCluster, group: str, logged: list[str]) -> RdConsumer:
    """librdkafka with KIP-848's protocol; its errors and group log lines into ``logged``."""
    logger = logging.getLogger(f"rdkafka.{group}")
    logger.addHandler(_Collect(logged))
    logger.setLevel(logging.DEBUG)
    consumer = RdConsumer({
        "bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers), "group.id": group,
        "group.protocol": "consumer", "auto.offset.reset": "earliest", "debug": "cgrp",
        "error_cb": lambda error: logged.append(str(error)),
    }, logger=logger)  # fmt: skip
    consumer.subscribe(["levels"])
    return consumer


class _Collect(logging.Handler):
    """librdkafka's log lines (its ``logger``) into a list."""

    def __init__(self, into: list[str]) -> None:
        super().__init__()
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


def test_group_version_0_refuses_kip_848_until_raised_again(
    cluster: LocalCluster, kp_admin: KafkaAdminClient
) -> None:
    wait_for("the bootstrap levels", lambda: finalized(kp_admin) == BOOTSTRAP, 60)
    assert advertised(cluster) >= CONSUMER_GROUP_APIS | SHARE_APIS
    create_topic(cluster, "levels", 1, rf=1)
    producer = RdProducer({"bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers)})
    for n in range(10):
        producer.produce("levels", f"r{n}".encode())
    assert producer.flush(30) == 0

    down = kp_admin.update_features({"group.version": ("SAFE_DOWNGRADE", 0)})
    assert down == {"group.version": "OK"}
    wait_for("KIP-848 off", lambda: not CONSUMER_GROUP_APIS & advertised(cluster), 60)
    assert "group.version" not in finalized(kp_admin)
    assert advertised(cluster) >= SHARE_APIS  # share groups stay on
    refused = call(cluster, kc.API_CONSUMER_GROUP_HEARTBEAT, 1, {
        "group_id": "g", "member_id": "m", "member_epoch": 0, "topic_partitions": [],
        "subscribed_topic_names": ["levels"], "rebalance_timeout": 30_000,
    })  # fmt: skip
    assert refused.error_code == ErrorCode.UNSUPPORTED_VERSION.code
    assert "group.version is 0" in refused.error_message

    logged: list[str] = []
    consumer = group_consumer(cluster, "levels-off", logged)

    def refused_to_librdkafka() -> bool:
        message = consumer.poll(0.5)
        assert message is None or message.error() is not None, "a record without a group"
        return any("ConsumerGroupHeartbeatRequest not supported by broker" in m for m in logged)

    try:  # librdkafka sees no ConsumerGroupHeartbeat, as against a Kafka broker at level 0
        wait_for("librdkafka's 'not supported by broker'", refused_to_librdkafka, 60)
    finally:
        consumer.close()

    assert kp_admin.update_features({"group.version": 1}) == {"group.version": "OK"}
    wait_for("KIP-848 on", lambda: advertised(cluster) >= CONSUMER_GROUP_APIS, 60)
    consumer = group_consumer(cluster, "levels-on", [])
    values: list[bytes] = []
    try:

        def consumed() -> bool:
            for message in consumer.consume(num_messages=100, timeout=0.5):
                assert message.error() is None, message.error()
                values.append(message.value() or b"")
            return len(values) >= 10

        wait_for("the records through KIP-848 again", consumed, 60)
    finally:
        consumer.close()
    assert sorted(values) == sorted(f"r{n}".encode() for n in range(10))


def test_share_version_0_refuses_share_groups_until_raised_again(
    cluster: LocalCluster, kp_admin: KafkaAdminClient
) -> None:
    wait_for("share groups on", lambda: finalized(kp_admin).get("share.version") == 1, 60)
    down = kp_admin.update_features({"share.version": ("SAFE_DOWNGRADE", 0)})
    assert down == {"share.version": "OK"}
    wait_for("share groups off", lambda: not SHARE_APIS & advertised(cluster), 60)
    refused = call(cluster, kc.API_SHARE_GROUP_HEARTBEAT, 1, {
        "group_id": "s", "member_id": "m", "member_epoch": 0,
        "subscribed_topic_names": ["levels"],
    })  # fmt: skip
    assert refused.error_code == ErrorCode.UNSUPPORTED_VERSION.code
    assert "share.version is 0" in refused.error_message
    assert kp_admin.update_features({"share.version": 1}) == {"share.version": "OK"}
    wait_for("share groups on again", lambda: advertised(cluster) >= SHARE_APIS, 60)
    joined = call(cluster, kc.API_SHARE_GROUP_HEARTBEAT, 1, {
        "group_id": "s", "member_id": "m", "member_epoch": 0,
        "subscribed_topic_names": ["levels"],
    })  # fmt: skip
    assert joined.error_code == 0, joined.error_message
