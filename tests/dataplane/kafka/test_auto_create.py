"""Auto-created topics and metadata that shows an admin change at once, on the KAFKA listener of a
real 3-node cluster (127.0.0.18-20, ``num.partitions=2``), judged by Kafka's own clients
(confluent-kafka's Producer, Consumer and AdminClient, kafka-python's KafkaProducer) and by raw
requests on one connection to one broker, where the race of "create, then ask the same broker a
millisecond later" is certain to be run:

- a producer to a topic never created delivers, and the topic has ``num.partitions`` partitions;
- CreateTopics, CreatePartitions and DeleteTopics, each followed at once by a Metadata request
  to the same broker, see the change (leaders included);
- a consumer subscribing to a missing topic, a request with ``allow_auto_topic_creation=false``,
  an invalid name and an internal topic's name create nothing;
- a cluster-wide ``default.replication.factor`` above the live brokers gets
  INVALID_REPLICATION_FACTOR;
- a broker restarted with ``auto.create.topics.enable=false`` answers UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer
from confluent_kafka.admin import AdminClient as RdAdminClient
from confluent_kafka.cimpl import NewPartitions as RdNewPartitions
from confluent_kafka.cimpl import NewTopic as RdNewTopic
from kafka import KafkaProducer

from dataplane.client import AdminClient
from dataplane.client.admin import ConfigResource, ResourceType
from dataplane.kafka import codec as kc
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import (
    create_topic,
    metadata,
    running_cluster,
    wait_for_leaders,
)
from tests.dataplane.kafka.raw_connection import RawKafkaConnection

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("auto_create")]
NUM_PARTITIONS = 2
OVERRIDES: dict[str, str | int] = {
    "num.partitions": NUM_PARTITIONS,
    "offsets.topic.num.partitions": 3,
    "group.initial.rebalance.delay.ms": 0,
}
UNKNOWN = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path_factory.mktemp("auto-create"), "auto_create", overrides=OVERRIDES
    ) as running:
        yield running


def exists_nowhere(cluster: LocalCluster, topic: str) -> bool:
    """No broker's metadata (gRPC, which never creates) knows ``topic``."""
    for spec in cluster.specs:
        described = metadata(cluster, spec.node_id, topic)
        assert described is not None, f"broker {spec.node_id} did not answer"
        if described.error_code not in (UNKNOWN, ErrorCode.INVALID_TOPIC_EXCEPTION.code):
            return False
    return True


# -- raw requests: one connection to one broker -----------------------------------------------
class KafkaConnection(RawKafkaConnection):
    """With the Metadata request these tests send."""

    def metadata(self, topic: str, allow_auto_topic_creation: bool = False) -> Any:
        """The topic's entry in a Metadata v12 answer."""
        answer = self.call(kc.API_METADATA, 12, {
            "topics": [{"name": topic, "topic_id": uuid.UUID(int=0)}],
            "allow_auto_topic_creation": allow_auto_topic_creation,
            "include_topic_authorized_operations": False,
        })  # fmt: skip
        [described] = answer.topics
        return described


@pytest.fixture
def broker_2(cluster: LocalCluster) -> Iterator[KafkaConnection]:
    connection = KafkaConnection(cluster.kafka_address(2))
    try:
        yield connection
    finally:
        connection.close()


def partitions_with_leaders(described: Any) -> int:
    assert described.error_code == 0, described
    assert all(p.error_code == 0 and p.leader_id >= 0 for p in described.partitions)
    return len(described.partitions)


# -- auto-creation ------------------------------------------------------------------------------
def test_a_confluent_producer_to_a_never_created_topic_delivers(cluster: LocalCluster) -> None:
    servers = ",".join(cluster.kafka_bootstrap_servers)
    producer = RdProducer({"bootstrap.servers": servers, "message.timeout.ms": 30_000})
    reports: list[Any] = []
    for n in range(10):
        producer.produce(
            "auto-rd", value=b"v%d" % n, on_delivery=lambda err, msg: reports.append(err)
        )
    assert producer.flush(60) == 0
    assert reports == [None] * 10
    assert len(wait_for_leaders(cluster, "auto-rd", NUM_PARTITIONS)) == NUM_PARTITIONS
    admin = RdAdminClient({"bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers)})
    listed = admin.list_topics(topic="auto-rd", timeout=30).topics["auto-rd"]
    assert listed.error is None and len(listed.partitions) == NUM_PARTITIONS
    assert all(len(p.replicas) == 1 for p in listed.partitions.values())  # replication factor 1


def test_a_kafka_python_producer_to_a_never_created_topic_delivers(cluster: LocalCluster) -> None:
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap_servers)
    try:
        sent = producer.send("auto-kp", b"value").get(timeout=60)
    finally:
        producer.close(timeout=10)
    assert sent.topic == "auto-kp" and sent.offset == 0
    assert len(wait_for_leaders(cluster, "auto-kp", NUM_PARTITIONS)) == NUM_PARTITIONS


def test_the_metadata_answer_that_creates_a_topic_shows_its_leaders(
    broker_2: KafkaConnection,
) -> None:
    described = broker_2.metadata("auto-raw", allow_auto_topic_creation=True)
    assert partitions_with_leaders(described) == NUM_PARTITIONS


def test_what_is_never_auto_created(cluster: LocalCluster, broker_2: KafkaConnection) -> None:
    # a consumer's request (librdkafka, the Java client: allow.auto.create.topics=false)
    assert broker_2.metadata("not-allowed").error_code == UNKNOWN
    # an internal topic: its coordinator creates it when first used (no transaction yet)
    internal = broker_2.metadata("__transaction_state", allow_auto_topic_creation=True)
    assert internal.error_code == UNKNOWN and internal.is_internal
    invalid = broker_2.metadata("not valid!", allow_auto_topic_creation=True)
    assert invalid.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION.code
    for topic in ("not-allowed", "__transaction_state", "not valid!"):
        assert exists_nowhere(cluster, topic), topic


def test_a_consumer_subscribing_to_a_missing_topic_does_not_create_it(
    cluster: LocalCluster,
) -> None:
    """The consumer subscribes to a topic that exists and one that does not: once it has joined
    its group (which it does once the metadata shows the first), it has asked for both."""
    create_topic(cluster, "consumed", 1)
    missing = "never-subscribed-into-being"
    assigned: list[list[Any]] = []
    consumer = RdConsumer({
        "bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers),
        "group.id": "auto-create-consumers", "topic.metadata.refresh.interval.ms": 500,
    })  # fmt: skip
    try:
        consumer.subscribe(["consumed", missing], on_assign=lambda c, ps: assigned.append(ps))
        deadline = time.monotonic() + 60
        while not assigned:
            assert time.monotonic() < deadline, "the consumer never joined its group"
            consumer.poll(0.5)
        for _ in range(4):  # and a few metadata refreshes more
            consumer.poll(0.5)
    finally:
        consumer.close()
    assert [p.topic for p in assigned[0]] == ["consumed"]
    assert exists_nowhere(cluster, missing)


def test_a_replication_factor_above_the_live_brokers_is_refused(
    cluster: LocalCluster, broker_2: KafkaConnection
) -> None:
    """The cluster-wide default set through the controller wins over the node's file. Until
    broker 2's image has the new value its auto-created topics get the old one, so each probe
    names a new topic."""
    admin = AdminClient(cluster.bootstrap_servers)
    everywhere = ConfigResource(ResourceType.BROKER, "")
    probes = iter(range(1000))
    code = ErrorCode.INVALID_REPLICATION_FACTOR.code

    def refused() -> str | None:
        topic = f"too-wide-{next(probes)}"
        return topic if broker_2.metadata(topic, True).error_code == code else None

    try:
        admin.alter_configs(everywhere, {"default.replication.factor": "4"})
        try:
            topic = wait_for("broker 2 to see default.replication.factor=4", refused)
        finally:
            admin.alter_configs(everywhere, {"default.replication.factor": None})
    finally:
        admin.close()
    assert exists_nowhere(cluster, topic)


# -- admin changes are seen by the next Metadata request --------------------------------------
def test_create_then_metadata_on_the_same_connection_shows_the_leaders(
    broker_2: KafkaConnection,
) -> None:
    for n in range(5):
        topic = f"race-create-{n}"
        created = broker_2.call(kc.API_CREATE_TOPICS, 7, {
            "topics": [{"name": topic, "num_partitions": 3, "replication_factor": 3,
                        "assignments": [], "configs": []}],
            "timeout": 0, "validate_only": False,
        })  # fmt: skip
        assert [t.error_code for t in created.topics] == [0]
        assert partitions_with_leaders(broker_2.metadata(topic)) == 3


def test_create_partitions_then_metadata_shows_the_new_partitions(
    broker_2: KafkaConnection,
) -> None:
    assert partitions_with_leaders(broker_2.metadata("race-grow", True)) == NUM_PARTITIONS
    for count in (3, 4, 5):
        grown = broker_2.call(kc.API_CREATE_PARTITIONS, 3, {
            "topics": [{"name": "race-grow", "count": count, "assignments": None}],
            "timeout": 0, "validate_only": False,
        })  # fmt: skip
        assert [r.error_code for r in grown.results] == [0]
        assert partitions_with_leaders(broker_2.metadata("race-grow")) == count


def test_delete_then_metadata_no_longer_shows_the_topic(broker_2: KafkaConnection) -> None:
    for n in range(3):
        topic = f"race-delete-{n}"
        assert partitions_with_leaders(broker_2.metadata(topic, True)) == NUM_PARTITIONS
        deleted = broker_2.call(kc.API_DELETE_TOPICS, 6, {
            "topics": [{"name": topic, "topic_id": uuid.UUID(int=0)}], "timeout": 0,
        })  # fmt: skip
        assert [r.error_code for r in deleted.responses] == [0]
        assert broker_2.metadata(topic).error_code == UNKNOWN


def test_confluent_admin_create_describe_grow_delete_at_once(cluster: LocalCluster) -> None:
    """A client that waits for nothing: each answer is followed at once by list_topics."""
    admin = RdAdminClient({"bootstrap.servers": cluster.kafka_address(1)})
    for n in range(3):
        topic = f"rd-race-{n}"
        for future in admin.create_topics([RdNewTopic(topic, 2, 3)]).values():
            future.result(timeout=30)
        described = admin.list_topics(topic=topic, timeout=30).topics[topic]
        assert described.error is None and len(described.partitions) == 2
        assert all(p.leader >= 0 for p in described.partitions.values())
        for future in admin.create_partitions([RdNewPartitions(topic, 4)]).values():
            future.result(timeout=30)
        assert len(admin.list_topics(topic=topic, timeout=30).topics[topic].partitions) == 4
        for future in admin.delete_topics([topic]).values():
            future.result(timeout=30)
        assert topic not in admin.list_topics(timeout=30).topics


# -- auto.create.topics.enable=false ----------------------------------------------------------
@pytest.fixture
def broker_3_without_auto_create(cluster: LocalCluster) -> Iterator[KafkaConnection]:
    """Node 3 restarted with auto.create.topics.enable=false; restored afterwards."""
    cluster.overrides = {**OVERRIDES, "auto.create.topics.enable": "false"}
    try:
        cluster.restart_node(3)
        cluster.wait_for_brokers(timeout_s=60)
        connection = wait_for(
            "node 3's KAFKA listener", lambda: _connect(cluster.kafka_address(3)), timeout_s=60
        )
        try:
            yield connection
        finally:
            connection.close()
    finally:
        cluster.overrides = dict(OVERRIDES)
        cluster.restart_node(3)
        cluster.wait_for_brokers(timeout_s=60)


def _connect(address: str) -> KafkaConnection | None:
    try:
        connection = KafkaConnection(address)
        connection.metadata("probe")  # refused (closed) until the broker has caught up
    except OSError:
        return None
    return connection


def test_a_broker_with_auto_create_off_answers_unknown_and_creates_nothing(
    cluster: LocalCluster, broker_3_without_auto_create: KafkaConnection
) -> None:
    described = broker_3_without_auto_create.metadata("off-topic", allow_auto_topic_creation=True)
    assert described.error_code == UNKNOWN
    assert exists_nowhere(cluster, "off-topic")
