"""Authorization end to end through the KAFKA listener (issue 28), judged by kafka-python.

PLAINTEXT clients are ``User:ANONYMOUS``. The cluster runs Kafka's StandardAuthorizer with no
super users and ``allow.everyone.if.no.acl.found=true`` (so the nodes, ANONYMOUS too on their
PLAINTEXT listeners, and the first admin requests go through: no ACL names the cluster). Once an
ACL lets ANONYMOUS READ a topic, that topic has ACLs: producing to it is refused with
TOPIC_AUTHORIZATION_FAILED while consuming works, and a topic with no ACL stays open. Helpers
H1-H3's tests cover authenticated principals over SASL and TLS."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError as KpKafkaError
from kafka.errors import TopicAuthorizationFailedError

from dataplane.tools.local_cluster import LocalCluster, wait_for
from metadata_quorum.security.acl import AclOperation, PatternType, PermissionType, ResourceType
from protos import controller_pb2 as cpb
from protos import metadata_pb2 as mpb
from tests.dataplane.cluster_support import running_cluster
from tests.dataplane.kafka.raw_connection import RawKafkaConnection

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("kafka-authorization")]
OPEN, GUARDED = "open-topic", "read-only-topic"
TOPIC_AUTHORIZATION_FAILED = 29


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path_factory.mktemp("kafka-authorization"),
        "kafka_authorization",
        overrides={
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "true",
            "super.users": "",
        },
        nodes=1,
    ) as running:
        yield running


def send(producer: KafkaProducer, topic: str, value: bytes) -> object:
    return producer.send(topic, value).get(timeout=30)


def test_anonymous_may_read_but_not_write_a_guarded_topic(cluster: LocalCluster) -> None:
    servers = cluster.kafka_bootstrap_servers
    admin = KafkaAdminClient(bootstrap_servers=servers)
    try:
        admin.create_topics([NewTopic(t, 1, 1) for t in (OPEN, GUARDED)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=servers, retries=0, acks=1)
    try:
        send(producer, GUARDED, b"before the ACL")
        read_only = mpb.AclBindingEntry(
            resource_type=ResourceType.TOPIC, resource_name=GUARDED,
            pattern_type=PatternType.LITERAL, principal="User:ANONYMOUS", host="*",
            operation=AclOperation.READ, permission_type=PermissionType.ALLOW,
        )  # fmt: skip
        controller = cluster.client()
        answer = controller.checked("CreateAcls", cpb.CreateAclsRequest(creations=[read_only]))
        assert [r.error_code for r in answer.results] == [0]

        def guarded_here() -> bool:
            """The broker's authorizer has the ACL: the topic now has ACLs, none of which lets
            ANONYMOUS DESCRIBE_CONFIGS (READ implies DESCRIBE only). A probe that stores nothing,
            unlike a produce that would land while the ACL is still on its way."""
            connection = RawKafkaConnection(servers[0])
            try:
                answer = connection.call(32, 4, {  # DescribeConfigs
                    "resources": [{"resource_type": 2, "resource_name": GUARDED,
                                   "configuration_keys": None}],
                    "include_synonyms": False, "include_documentation": False,
                })  # fmt: skip
            finally:
                connection.close()
            return bool(answer.results[0].error_code == TOPIC_AUTHORIZATION_FAILED)

        wait_for("the broker to take the ACL", guarded_here, timeout_s=60)
        with pytest.raises(TopicAuthorizationFailedError):
            send(producer, GUARDED, b"after the ACL")
        send(producer, OPEN, b"no ACL names this topic")  # still open
    finally:
        producer.close()
    # read up to the log end offset (not until a consumer_timeout_ms of silence: 20 s idle)
    consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    guarded = TopicPartition(GUARDED, 0)
    values: list[bytes] = []

    def read_to_the_end() -> bool:
        for records in consumer.poll(timeout_ms=500).values():
            values.extend(record.value for record in records)
        return bool(consumer.position(guarded) >= end)

    try:
        consumer.assign([guarded])
        consumer.seek_to_beginning(guarded)
        end = consumer.end_offsets([guarded])[guarded]
        wait_for(f"{GUARDED} read to its end offset {end}", read_to_the_end, timeout_s=60)
    except KpKafkaError as error:
        raise AssertionError(f"ANONYMOUS may READ {GUARDED}: {error!r}") from error
    finally:
        consumer.close()
    assert values == [b"before the ACL"]
