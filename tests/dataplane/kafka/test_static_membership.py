"""Static membership (KIP-345, ``group.instance.id``) with librdkafka on a real 3-node cluster
(127.0.0.174-176, the "kafka_groups" range, shared in turn with test_groups_classic.py): a static
consumer closed and started again within its session takes back its partitions while the other
member sees no rebalance, in a classic group and in a KIP-848 group alike; one away longer than
its session is removed and the other gets everything; a duplicate instance id is refused as Kafka
refuses it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import TopicPartition as RdTopicPartition

from dataplane.client import AdminClient, Consumer
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.cluster_support import create_topic, running_cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("kafka-groups-classic")]
SESSION_MS = 6_000  # the classic members' session.timeout.ms (group.min.session.timeout.ms)
CONSUMER_SESSION_MS = 6_000  # group.consumer.session.timeout.ms of the KIP-848 group


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides: dict[str, str | int] = {
        "group.consumer.session.timeout.ms": CONSUMER_SESSION_MS,
        "group.consumer.heartbeat.interval.ms": 500,
    }
    root = tmp_path_factory.mktemp("kafka-static")
    with running_cluster(root, "kafka_groups", overrides) as running:
        yield running


class Member:
    """A librdkafka consumer with a ``group.instance.id``; its rebalance callbacks counted."""

    def __init__(self, cluster: LocalCluster, group: str, topic: str, instance: str, protocol: str):
        self.errors: list[RdKafkaError] = []
        config: dict[str, object] = {
            "bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers), "group.id": group,
            "group.instance.id": instance, "group.protocol": protocol,
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "error_cb": self.errors.append,  # fatal errors (a fenced instance) come here
        }  # fmt: skip
        if protocol == "classic":
            config.update({"session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500})
        self.consumer = RdConsumer(config)
        self.callbacks = 0
        self.consumer.subscribe([topic], on_assign=self._rebalanced, on_revoke=self._rebalanced)

    def _rebalanced(self, consumer: RdConsumer, partitions: list[RdTopicPartition]) -> None:
        self.callbacks += 1

    def partitions(self) -> set[int]:
        """Poll once (callbacks run here), then what it holds."""
        for message in self.consumer.consume(num_messages=100, timeout=0.1):
            error = message.error()
            if error is not None:
                self.errors.append(error)
        return {tp.partition for tp in self.consumer.assignment()}

    def close(self) -> None:
        self.consumer.close()


def split(a: Member, b: Member) -> bool:
    mine, theirs = a.partitions(), b.partitions()
    return bool(mine) and bool(theirs) and mine | theirs == {0, 1, 2, 3} and not mine & theirs


def generation(admin: AdminClient, group: str) -> tuple[int, frozenset[str]]:
    described = admin.describe_groups([group])[group]
    return described.group_epoch, frozenset(m.member_id for m in described.members)


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_static_member_restarts_without_a_rebalance_and_leaves_by_its_session(
    cluster: LocalCluster, protocol: str
) -> None:
    topic = group = f"static-{protocol}"
    create_topic(cluster, topic, 4)
    admin = AdminClient(cluster.bootstrap_servers)
    a = Member(cluster, group, topic, "a", protocol)
    b = Member(cluster, group, topic, "b", protocol)
    members = [a, b]
    try:
        wait_for("both members to hold partitions", lambda: split(a, b), 60)
        epoch, before = wait_for("a settled group", lambda: _settled(admin, group, a, b), 30)
        held_a, held_b, b_callbacks = a.partitions(), b.partitions(), b.callbacks
        # a closes (static: it does not leave) and comes back under the same instance id
        a.close()
        a = Member(cluster, group, topic, "a", protocol)
        members.append(a)
        wait_for("the restarted a to hold its partitions", lambda: a.partitions() == held_a, 30)
        restarted_epoch, after = generation(admin, group)
        assert restarted_epoch == epoch, "no rebalance: the same generation / group epoch"
        assert len(after) == 2 and after != before, "a has a new member id in a's place"
        for _ in range(10):  # b polls on: no callback, the same partitions
            assert b.partitions() == held_b
        assert b.callbacks == b_callbacks, "b saw no rebalance"
        # a stops for longer than the session: it is removed and b gets everything
        a.close()
        stopped = time.monotonic()
        wait_for("b to hold every partition", lambda: b.partitions() == {0, 1, 2, 3}, 60)
        assert time.monotonic() - stopped > 0.5 * min(SESSION_MS, CONSUMER_SESSION_MS) / 1000
        assert b.callbacks > b_callbacks
        assert generation(admin, group)[0] > epoch
        assert not b.errors, b.errors
    finally:
        for member in members:
            member.close()
        admin.close()


def _settled(admin: AdminClient, group: str, a: Member, b: Member) -> tuple[int, frozenset[str]]:
    a.partitions()
    b.partitions()
    described = admin.describe_groups([group])[group]
    if described.state != "Stable" or len(described.members) != 2:
        return None  # type: ignore[return-value]
    return described.group_epoch, frozenset(m.member_id for m in described.members)


@pytest.mark.parametrize(
    ("protocol", "refused"),
    [("classic", "old"), ("consumer", "new")],
)
def test_a_duplicate_instance_id_is_refused_as_kafka_does(
    cluster: LocalCluster, protocol: str, refused: str
) -> None:
    """Classic: the newcomer takes the instance over and the old member is fenced
    (FENCED_INSTANCE_ID). KIP-848: the newcomer is refused while the instance is live
    (UNRELEASED_INSTANCE_ID). Both are fatal errors for librdkafka."""
    topic = group = f"static-dup-{protocol}"
    create_topic(cluster, topic, 2)
    first = Member(cluster, group, topic, "same", protocol)
    second: Member | None = None
    try:
        wait_for("the first member to hold partitions", lambda: bool(first.partitions()), 60)
        second = Member(cluster, group, topic, "same", protocol)
        loser = first if refused == "old" else second
        winner = second if refused == "old" else first

        # librdkafka's descriptions of FENCED_INSTANCE_ID and UNRELEASED_INSTANCE_ID
        expected = "fenced by other consumer" if refused == "old" else "still used by another"

        def refused_fatally() -> bool:
            winner.partitions()
            loser.partitions()
            return any(expected in e.str() for e in loser.errors)

        wait_for("the duplicate's fatal error", refused_fatally, 60)
        assert not winner.errors, winner.errors
    finally:
        first.close()
        if second is not None:
            second.close()


def test_our_consumer_with_a_group_instance_id_restarts_without_a_rebalance(
    cluster: LocalCluster,
) -> None:
    """``Consumer(group_instance_id=...)`` over gRPC: close leaves with epoch -2, the restarted
    consumer takes the partitions back at the same group epoch; a live duplicate is refused."""
    topic = group = "static-ours"
    create_topic(cluster, topic, 2)
    admin = AdminClient(cluster.bootstrap_servers)

    def static(instance: str) -> Consumer:
        consumer = Consumer(
            cluster.bootstrap_servers, group_id=group, group_instance_id=instance,
            auto_offset_reset="earliest",
        )  # fmt: skip
        consumer.subscribe([topic])
        return consumer

    def holds_all(consumer: Consumer) -> bool:
        consumer.poll(100)
        return {tp.partition for tp in consumer.assignment()} == {0, 1}

    first = static("ours")
    consumers = [first]
    try:
        wait_for("the consumer to hold both partitions", lambda: holds_all(first), 60)
        epoch = admin.describe_groups([group])[group].group_epoch
        first.close()
        again = static("ours")
        consumers.append(again)
        wait_for("the restarted consumer to hold them", lambda: holds_all(again), 30)
        assert admin.describe_groups([group])[group].group_epoch == epoch, "no rebalance"
        duplicate = static("ours")
        consumers.append(duplicate)

        def refused() -> ErrorCode | None:
            try:
                duplicate.poll(100)
            except KafkaError as error:
                return error.error
            return None

        assert wait_for("the duplicate's refusal", refused, 30) is ErrorCode.UNRELEASED_INSTANCE_ID
    finally:
        for consumer in consumers:
            consumer.close()
        admin.close()
