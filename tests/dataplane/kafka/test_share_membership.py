"""Share groups' membership (KIP-932: ShareGroupHeartbeat, ShareGroupDescribe) on a real 3-node
cluster (127.0.0.174-176, the "kafka_groups" range, shared in turn with the other group modules):
librdkafka's ShareConsumer members join, three members on one partition all hold it, one leaves
and the others carry on with a new group epoch, and every record is consumed by exactly one of
them; raw requests (the listener's own codec) check the protocol's answers: the client-chosen
member id, assignments by topic id, Kafka's errors, ListGroups / DescribeGroups / DeleteGroups of
a share group, and a member whose session ends being removed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer as RdProducer
from confluent_kafka import ShareConsumer

from dataplane.client import AdminClient
from dataplane.kafka import codec as kc
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import create_topic, running_cluster
from tests.dataplane.kafka.raw_connection import RawKafkaConnection

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("kafka-groups-classic")]
SESSION_MS = 6_000  # group.share.session.timeout.ms


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides: dict[str, str | int] = {
        "group.share.session.timeout.ms": SESSION_MS,
        "group.share.heartbeat.interval.ms": 500,
        "share.coordinator.state.topic.num.partitions": 3,
    }
    root = tmp_path_factory.mktemp("share-membership")
    with running_cluster(root, "kafka_groups", overrides) as running:
        yield running


def _coordinator(cluster: LocalCluster, group: str) -> RawKafkaConnection:
    """A connection to the group's coordinator (FindCoordinator, key type 0 as Kafka)."""
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


def _heartbeat(
    connection: RawKafkaConnection, group: str, member: str, epoch: int, topics: Any = None
) -> Any:
    return connection.call(kc.API_SHARE_GROUP_HEARTBEAT, 1, {
        "group_id": group, "member_id": member, "member_epoch": epoch,
        "rack_id": None, "subscribed_topic_names": topics,
    })  # fmt: skip


def _describe(connection: RawKafkaConnection, group: str) -> Any:
    answer = connection.call(kc.API_SHARE_GROUP_DESCRIBE, 1, {
        "group_ids": [group], "include_authorized_operations": False,
    })  # fmt: skip
    (described,) = answer.groups
    return described


def _assigned(described: Any) -> dict[str, set[int]]:
    return {
        m.member_id: {p for t in m.assignment.topic_partitions for p in t.partitions}
        for m in described.members
    }


def _share_consumer(cluster: LocalCluster, group: str, topic: str) -> ShareConsumer:
    consumer = ShareConsumer({
        "bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers), "group.id": group,
    })  # fmt: skip
    consumer.subscribe([topic])
    return consumer


def test_librdkafka_members_share_one_partition_and_one_leaves(cluster: LocalCluster) -> None:
    topic, group = "share-members", "share-members-group"
    create_topic(cluster, topic, 1)
    coordinator = _coordinator(cluster, group)
    members = [_share_consumer(cluster, group, topic) for _ in range(3)]
    try:

        def all_hold_it() -> Any:
            for member in members:
                member.poll(0.1)
            described = _describe(coordinator, group)
            assigned = _assigned(described)
            whole = len(assigned) == 3 and all(p == {0} for p in assigned.values())
            settled = all(m.member_epoch == described.group_epoch for m in described.members)
            return described if whole and settled else None

        described = wait_for("three members holding partition 0", all_hold_it, 60)
        assert (described.group_state, described.assignor_name) == ("Stable", "simple")
        assert all(m.subscribed_topic_names == (topic,) for m in described.members)
        (topic_partitions,) = described.members[0].assignment.topic_partitions
        assert topic_partitions.topic_name == topic
        before = described.group_epoch

        producer = RdProducer({"bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers)})
        received: list[bytes] = []

        def poll_all() -> None:
            for member in members:  # implicit acknowledgement: accepted on the next poll
                for message in member.poll(0.2):
                    value = message.value()
                    if message.error() is None and value is not None:
                        received.append(value)

        def warmed_up() -> bool:
            # share.auto.offset.reset is latest: the share partition starts where the log ends
            # when its leader first serves a ShareFetch, so wait until a record gets through
            producer.produce(topic, b"warm-up")
            producer.flush(10)
            poll_all()
            return bool(received)

        wait_for("the share partition serving records", warmed_up, 60)
        produced = [f"record-{i}".encode() for i in range(30)]
        for value in produced:
            producer.produce(topic, value)
        assert producer.flush(30) == 0

        def consumed_all() -> bool:
            poll_all()
            return sorted(v for v in received if v != b"warm-up") == sorted(produced)

        wait_for("every record consumed by one member", consumed_all, 60)
        records = [v for v in received if v != b"warm-up"]
        assert len(records) == len(set(records)) == len(produced)  # each once, by one member

        members.pop().close()  # leaves: epoch -1

        def two_left() -> Any:
            for member in members:
                member.poll(0.1)
            after = _describe(coordinator, group)
            assigned = _assigned(after)
            both = len(assigned) == 2 and all(p == {0} for p in assigned.values())
            return after if both else None

        after = wait_for("two members left holding partition 0", two_left, 30)
        assert after.group_epoch > before and after.group_state == "Stable"
    finally:
        for member in members:
            member.close()
        coordinator.close()


def test_heartbeat_answers_errors_and_listing(cluster: LocalCluster) -> None:
    topic, group = "share-raw", "share-raw-group"
    create_topic(cluster, topic, 2)
    coordinator = _coordinator(cluster, group)
    member = str(uuid.uuid4())
    try:
        joined = _heartbeat(coordinator, group, member, 0, [topic])
        assert joined.error_code == 0 and joined.member_id == member and joined.member_epoch == 1
        assert joined.heartbeat_interval.total_seconds() == 0.5
        (assigned,) = joined.assignment.topic_partitions
        assert sorted(assigned.partitions) == [0, 1]
        again = _heartbeat(coordinator, group, member, 1)
        assert (again.error_code, again.member_epoch, again.assignment) == (0, 1, None)
        # Kafka's refusals: no member id (v1), a stale epoch, an unknown member
        assert _heartbeat(coordinator, group, "", 0, [topic]).error_code == (
            ErrorCode.INVALID_REQUEST.code
        )
        assert _heartbeat(coordinator, group, member, 7).error_code == (
            ErrorCode.FENCED_MEMBER_EPOCH.code
        )
        assert _heartbeat(coordinator, group, "nobody", 1).error_code == (
            ErrorCode.UNKNOWN_MEMBER_ID.code
        )
        # listed as a share group; DescribeGroups (classic) sees no such group; not deletable
        listed = coordinator.call(kc.API_LIST_GROUPS, 5, {
            "states_filter": [], "types_filter": ["share"],
        })  # fmt: skip
        mine = [g for g in listed.groups if g.group_id == group]
        assert [(g.group_type, g.group_state, g.protocol_type) for g in mine] == [
            ("share", "Stable", "share")
        ]
        classic = coordinator.call(kc.API_DESCRIBE_GROUPS, 5, {
            "groups": [group], "include_authorized_operations": False,
        })  # fmt: skip
        assert classic.groups[0].group_state == "Dead"
        delete = {"groups_names": [group]}
        refused = coordinator.call(kc.API_DELETE_GROUPS, 2, delete)
        assert refused.results[0].error_code == ErrorCode.NON_EMPTY_GROUP.code
        unknown = _describe(coordinator, "no-such-share-group")
        assert unknown.error_code == ErrorCode.GROUP_ID_NOT_FOUND.code

        # a member that stops heartbeating is removed once its session ends
        def gone() -> bool:
            return not _describe(coordinator, group).members

        wait_for("the silent member removed", gone, SESSION_MS / 1000 + 20)
        assert _describe(coordinator, group).group_state == "Empty"
        with AdminClient(cluster.bootstrap_servers) as admin:
            described = admin.describe_groups([group])[group]
            assert (described.group_type, described.state) == ("share", "Empty")
        deleted = coordinator.call(kc.API_DELETE_GROUPS, 2, delete)
        assert deleted.results[0].error_code == 0
        assert _describe(coordinator, group).error_code == ErrorCode.GROUP_ID_NOT_FOUND.code
    finally:
        coordinator.close()


def test_a_consumer_group_id_is_not_a_share_group(cluster: LocalCluster) -> None:
    topic, group = "share-other", "share-other-group"
    create_topic(cluster, topic, 1)
    coordinator = _coordinator(cluster, group)
    try:
        consumer = coordinator.call(kc.API_CONSUMER_GROUP_HEARTBEAT, 0, {
            "group_id": group, "member_id": str(uuid.uuid4()), "member_epoch": 0,
            "instance_id": None, "rack_id": None, "rebalance_timeout": 30_000,
            "subscribed_topic_names": [topic], "server_assignor": None, "topic_partitions": [],
        })  # fmt: skip
        assert consumer.error_code == 0
        refused = _heartbeat(coordinator, group, str(uuid.uuid4()), 0, [topic])
        assert refused.error_code == ErrorCode.GROUP_ID_NOT_FOUND.code
        described = _describe(coordinator, group)
        assert described.error_code == ErrorCode.GROUP_ID_NOT_FOUND.code
    finally:
        coordinator.close()
