"""Classic consumer groups (JoinGroup/SyncGroup/Heartbeat/LeaveGroup) with Kafka's own clients
on a real 3-node cluster (127.0.0.174-176): librdkafka's default group protocol and kafka-python's
KafkaConsumer share partitions, rebalance when a member leaves, commit, and a successor resumes
where the group left off; kafka-python's admin client lists and describes the groups."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer as RdConsumer
from kafka import KafkaAdminClient, KafkaConsumer
from kafka import TopicPartition as KpTopicPartition

from dataplane.client import AdminClient, Producer, TopicPartition
from dataplane.client.admin import GroupListing
from dataplane.tools.local_cluster import LocalCluster, wait_for
from tests.dataplane.cluster_support import create_topic, running_cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("kafka-groups-classic")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("kafka-groups"), "kafka_groups") as running:
        yield running


def kafka_servers(cluster: LocalCluster) -> str:
    return ",".join(cluster.kafka_bootstrap_servers)


def produce(
    cluster: LocalCluster, topic: str, prefix: str, count: int, partitions: int
) -> set[bytes]:
    """``count`` values dealt round-robin over the partitions: every member of a group that
    holds a partition has records to read (the sticky partitioner could leave some empty)."""
    values = sorted(f"{prefix}-{n}".encode() for n in range(count))
    with Producer(cluster.bootstrap_servers) as producer:
        for n, value in enumerate(values):
            producer.send(topic, value=value, partition=n % partitions)
        producer.flush()
    return set(values)


def rd_consumer(cluster: LocalCluster, group: str, topic: str) -> RdConsumer:
    """librdkafka with its default group protocol (classic: JoinGroup/SyncGroup)."""
    consumer = RdConsumer({
        "bootstrap.servers": kafka_servers(cluster), "group.id": group,
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
    })  # fmt: skip
    consumer.subscribe([topic])
    return consumer


def drain(consumers: list[RdConsumer], want: set[bytes]) -> dict[int, set[bytes]]:
    """Poll every consumer in turn until `want` was seen; what each one got."""
    got: dict[int, set[bytes]] = {n: set() for n in range(len(consumers))}

    def done() -> bool:
        for n, consumer in enumerate(consumers):
            for message in consumer.consume(num_messages=500, timeout=0.2):
                assert message.error() is None, message.error()
                got[n].add(message.value() or b"")
        return set().union(*got.values()) >= want

    wait_for(f"{len(want)} records through the group", done, 90)
    return got


def test_librdkafka_classic_members_share_rebalance_commit_and_a_successor_resumes(
    cluster: LocalCluster,
) -> None:
    create_topic(cluster, "classic-rd", 4)
    a = rd_consumer(cluster, "classic-rd-group", "classic-rd")
    b = rd_consumer(cluster, "classic-rd-group", "classic-rd")
    try:

        def split() -> bool:
            assert not any(drain([a, b], set()).values()), "nothing was written yet"
            mine, theirs = (
                {tp.partition for tp in a.assignment()},
                {tp.partition for tp in b.assignment()},
            )
            return bool(mine) and bool(theirs) and mine | theirs == {0, 1, 2, 3}

        # Both members in one generation before anything is written: had one read first
        # alone, the rebalance would hand it partitions it has not read (no offset to commit).
        wait_for("both members to hold partitions", split, 60)
        assert not {tp.partition for tp in a.assignment()} & {tp.partition for tp in b.assignment()}
        first_values = produce(cluster, "classic-rd", "first", 4000, partitions=4)
        got = drain([a, b], first_values)
        assert got[0] | got[1] == first_values and not got[0] & got[1], "each record read once"
        assert got[0] and got[1], "both members read their partitions"
        a.commit(asynchronous=False)
        b.commit(asynchronous=False)
        # a leaves (LeaveGroup): b is given every partition and reads what comes next.
        a.close()

        def b_alone() -> bool:
            assert not drain([b], set())[0], "nothing new was written yet"
            return {tp.partition for tp in b.assignment()} == {0, 1, 2, 3}

        wait_for("b to hold every partition after a left", b_alone, 60)
        second_values = produce(cluster, "classic-rd", "second", 400, partitions=4)
        assert drain([b], second_values)[0] == second_values, "b resumes at a's commits"
        b.commit(asynchronous=False)
    finally:
        a.close()
        b.close()
    third_values = produce(cluster, "classic-rd", "third", 100, partitions=4)
    successor = rd_consumer(cluster, "classic-rd-group", "classic-rd")
    try:
        resumed = drain([successor], third_values)[0]
    finally:
        successor.close()
    assert resumed == third_values, "the successor starts at the committed offsets"


def test_kafka_python_group_consumer_and_admin_client(cluster: LocalCluster) -> None:
    create_topic(cluster, "classic-kp", 2)
    values = produce(cluster, "classic-kp", "kp", 1000, partitions=2)
    consumer = KafkaConsumer(
        "classic-kp", bootstrap_servers=kafka_servers(cluster), group_id="classic-kp-group",
        auto_offset_reset="earliest", enable_auto_commit=False, session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )  # fmt: skip
    admin = KafkaAdminClient(bootstrap_servers=kafka_servers(cluster))
    try:
        seen: set[bytes] = set()

        def done() -> bool:
            # A generous poll timeout: kafka-python 3.0.12 loses a rebalance whose JoinGroup
            # and SyncGroup outlast the poll call that started it, when the leader rejoins only
            # because its metadata changed (its snapshot check clears before the join's result
            # is applied, and the member then never takes its partitions).
            for records in consumer.poll(timeout_ms=2000).values():
                seen.update(r.value for r in records)
            return seen >= values

        wait_for("kafka-python to read the topic through its group", done, 90)
        consumer.commit()
        committed = {p: consumer.committed(KpTopicPartition("classic-kp", p)) or 0 for p in (0, 1)}
        assert sum(committed.values()) == 1000
        listed = admin.list_groups()
        assert {
            "group_id": "classic-kp-group", "protocol_type": "consumer", "group_state": "Stable",
            "group_type": "classic",
        } in listed  # fmt: skip
        described = admin.describe_groups(["classic-kp-group"])["classic-kp-group"]
        assert (described["group_state"], described["protocol_data"]) == ("Stable", "range")
        (member,) = described["members"]
        assert member["member_metadata"]["topics"] == ["classic-kp"]
        assert member["member_assignment"]["assigned_partitions"] == [
            {"topic": "classic-kp", "partitions": [0, 1]}
        ]
        offsets = admin.list_group_offsets("classic-kp-group")["classic-kp-group"]
        assert {tp.partition: meta.offset for tp, meta in offsets.items()} == committed
        # The native admin client (gRPC) sees the same classic group.
        with AdminClient(cluster.bootstrap_servers) as native:
            assert GroupListing("classic-kp-group", "Stable", "classic") in native.list_groups()
            group = native.describe_groups(["classic-kp-group"])["classic-kp-group"]
        # Generation 1, or 2 when kafka-python's leader first assigned before its metadata
        # held the topic and rejoined once it did.
        assert (group.group_type, group.assignor) == ("classic", "range")
        assert group.group_epoch in (1, 2)
        (native_member,) = group.members
        assert native_member.assignment == {
            TopicPartition("classic-kp", 0),
            TopicPartition("classic-kp", 1),
        }
    finally:
        consumer.close()
        admin.close()
