"""Group administration over the Kafka protocol with Kafka's own clients, on a real 3-node
cluster (127.0.0.174-176, shared in turn with the other modules of the "kafka-groups-classic"
group): librdkafka's AdminClient describes a KIP-848 group through ConsumerGroupDescribe (its
members, assignments, the group epoch) and deletes groups with DeleteGroups (refused while the
group has members, as Kafka does); kafka-python's admin client deletes a classic group."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    ConsumerGroupType,
    KafkaError,
    KafkaException,
    TopicCollection,
)
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient as RdAdmin
from kafka import KafkaAdminClient

from dataplane.kafka import codec as kc
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import create_topic, running_cluster
from tests.dataplane.kafka.raw_connection import RawKafkaConnection

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("kafka-groups-classic")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("kafka-group-admin"), "kafka_groups") as running:
        yield running


def servers(cluster: LocalCluster) -> str:
    return ",".join(cluster.kafka_bootstrap_servers)


def member(cluster: LocalCluster, group: str, topic: str, protocol: str) -> RdConsumer:
    consumer = RdConsumer({
        "bootstrap.servers": servers(cluster), "group.id": group, "group.protocol": protocol,
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        **({"session.timeout.ms": 6000} if protocol == "classic" else {}),
    })  # fmt: skip
    consumer.subscribe([topic])
    return consumer


def assigned(consumer: RdConsumer) -> bool:
    consumer.poll(0.2)
    return bool(consumer.assignment())


def describe(admin: RdAdmin, group: str) -> object:
    return admin.describe_consumer_groups([group], request_timeout=30)[group].result(timeout=30)


def test_librdkafka_describes_a_kip_848_group_and_deletes_it_once_empty(
    cluster: LocalCluster,
) -> None:
    create_topic(cluster, "admin-848", 3)
    admin = RdAdmin({"bootstrap.servers": servers(cluster)})
    consumer = member(cluster, "admin-848-group", "admin-848", "consumer")
    try:
        wait_for("an assignment", lambda: assigned(consumer), 60)
        consumer.commit(offsets=[RdTopicPartition("admin-848", 0, 7)], asynchronous=False)

        def stable() -> object | None:
            consumer.poll(0.1)
            group = describe(admin, "admin-848-group")
            return group if str(group.state).endswith("STABLE") else None  # type: ignore[attr-defined]

        group = wait_for("the group to be described Stable", stable, 60)
        assert group.type == ConsumerGroupType.CONSUMER  # type: ignore[attr-defined]
        assert group.partition_assignor == "uniform"  # type: ignore[attr-defined]
        (described,) = group.members  # type: ignore[attr-defined]
        held = {(tp.topic, tp.partition) for tp in described.assignment.topic_partitions}
        assert held == {("admin-848", p) for p in range(3)}
        with pytest.raises(KafkaException) as busy:
            admin.delete_consumer_groups(["admin-848-group"])["admin-848-group"].result(30)
        assert busy.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
    finally:
        consumer.close()

    def deleted() -> bool:
        future = admin.delete_consumer_groups(["admin-848-group"])["admin-848-group"]
        try:
            future.result(timeout=30)
        except KafkaException as error:  # the leave may still be on its way
            assert error.args[0].code() == KafkaError.NON_EMPTY_GROUP, error
            return False
        return True

    wait_for("the emptied group to be deleted", deleted, 60)
    with pytest.raises(KafkaException) as gone:
        admin.delete_consumer_groups(["admin-848-group"])["admin-848-group"].result(30)
    assert gone.value.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND
    offsets = admin.list_consumer_group_offsets(
        [_request("admin-848-group", RdTopicPartition("admin-848", 0))]
    )["admin-848-group"].result(timeout=30)
    assert [tp.offset for tp in offsets.topic_partitions] == [-1001]  # no committed offset


def _request(group: str, tp: RdTopicPartition) -> ConsumerGroupTopicPartitions:
    return ConsumerGroupTopicPartitions(group, [tp])


def test_kafka_python_deletes_a_classic_group(cluster: LocalCluster) -> None:
    create_topic(cluster, "admin-classic", 2)
    consumer = member(cluster, "admin-classic-group", "admin-classic", "classic")
    try:
        wait_for("an assignment", lambda: assigned(consumer), 60)
        consumer.commit(offsets=[RdTopicPartition("admin-classic", 1, 3)], asynchronous=False)
    finally:
        consumer.close()  # a classic member leaves with LeaveGroup: the group is empty
    admin = KafkaAdminClient(bootstrap_servers=servers(cluster), request_timeout_ms=30_000)
    try:
        results = dict(admin.delete_groups(["admin-classic-group", "never-was"]))
        # kafka-python 3 names each outcome by its error class
        assert results == {"admin-classic-group": "OK", "never-was": "GroupIdNotFoundError"}
        assert "admin-classic-group" not in {g[0] for g in admin.list_groups()}
    finally:
        admin.close()


def test_librdkafka_reads_what_it_may_do_on_topics_the_cluster_and_groups(
    cluster: LocalCluster,
) -> None:
    """Authorized operations (Metadata v8+, DescribeCluster, DescribeGroups v3+): with no
    authorizer, every operation Kafka supports on each resource type."""
    create_topic(cluster, "admin-ops", 1)
    admin = RdAdmin({"bootstrap.servers": servers(cluster)})
    topic = admin.describe_topics(
        TopicCollection(["admin-ops"]), include_authorized_operations=True
    )["admin-ops"].result(timeout=30)
    assert {op.name for op in topic.authorized_operations} == {
        "READ", "WRITE", "CREATE", "DESCRIBE", "DELETE", "ALTER", "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
    }  # fmt: skip
    described = admin.describe_cluster(include_authorized_operations=True).result(timeout=30)
    assert {op.name for op in described.authorized_operations} == {
        "CREATE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE",
        "ALTER", "DESCRIBE",
    }  # fmt: skip
    consumer = member(cluster, "admin-ops-group", "admin-ops", "classic")
    try:
        wait_for("an assignment", lambda: assigned(consumer), 60)
        group = admin.describe_consumer_groups(
            ["admin-ops-group"], include_authorized_operations=True
        )["admin-ops-group"].result(timeout=30)
    finally:
        consumer.close()
    assert {op.name for op in group.authorized_operations} == {"READ", "DESCRIBE", "DELETE"}


def test_a_group_only_offsets_name_is_a_simple_classic_group(cluster: LocalCluster) -> None:
    """A consumer that assigns itself and commits makes a classic group with no protocol type
    (Kafka's "simple consumer group"), listed under the classic type, not the consumer one."""
    create_topic(cluster, "admin-simple", 1)
    consumer = RdConsumer({"bootstrap.servers": servers(cluster), "group.id": "admin-simple-group"})
    try:
        consumer.assign([RdTopicPartition("admin-simple", 0, 0)])
        consumer.commit(offsets=[RdTopicPartition("admin-simple", 0, 5)], asynchronous=False)
    finally:
        consumer.close()
    admin = RdAdmin({"bootstrap.servers": servers(cluster)})

    def listed(kind: ConsumerGroupType) -> set[str]:
        found = admin.list_consumer_groups(types={kind}, request_timeout=30).result(timeout=30)
        return {g.group_id for g in found.valid}

    assert "admin-simple-group" in listed(ConsumerGroupType.CLASSIC)
    assert "admin-simple-group" not in listed(ConsumerGroupType.CONSUMER)
    (simple,) = [
        g
        for g in admin.list_consumer_groups(request_timeout=30).result(timeout=30).valid
        if g.group_id == "admin-simple-group"
    ]
    assert simple.is_simple_consumer_group


def test_find_coordinator_answers_share_partition_keys(cluster: LocalCluster) -> None:
    """Key type 2 (KIP-932): a share-partition key "group:topicId:partition" names the share
    coordinator that keeps its state in __share_group_state; a malformed key is INVALID_REQUEST."""
    raw = RawKafkaConnection(cluster.kafka_bootstrap_servers[0])

    def find() -> Any:
        answer = raw.call(kc.API_FIND_COORDINATOR, 4, {
            "key_type": 2, "coordinator_keys": ["queue:AAAAAAAAAAAAAAAAAAAAAQ:0", "queue:0"],
        })  # fmt: skip
        found = answer.coordinators[0]
        # the first asks create __share_group_state: COORDINATOR_NOT_AVAILABLE, retriable
        return None if found.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE.code else answer

    try:
        answer = wait_for("the share coordinator", find, 60)
    finally:
        raw.close()
    found, malformed = answer.coordinators
    assert found.error_code == 0 and found.node_id in {s.node_id for s in cluster.specs}
    assert malformed.error_code == ErrorCode.INVALID_REQUEST.code
