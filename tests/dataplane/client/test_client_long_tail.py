"""The client library's long tail against a real cluster (issue 29): the producer splits a batch
the topic refuses as too large (KIP-126), and the consumer validates its position after a leader
change (KIP-320), detecting a log truncated by an unclean leader election; librdkafka does the
same through the Kafka listener's OffsetForLeaderEpoch.

One controller (node 1) and two broker-only nodes (2 and 3), so that both of a partition's
replicas on 2 and 3 can be down at once, as an unclean election needs, with the quorum intact.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import TopicPartition as RdTopicPartition

from dataplane.client import (
    AdminClient,
    Consumer,
    ConsumerRecord,
    LogTruncationError,
    NewTopic,
    Producer,
    TopicPartition,
)
from dataplane.client._validation import Outcome
from dataplane.client._validation import validate as real_validate
from dataplane.client.admin import PartitionDescription
from dataplane.kafka import codec as kc
from dataplane.tools.local_cluster import LocalCluster, wait_for
from protos import broker_pb2 as pb
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.cluster_support import running_cluster, stub, wait_for_leaders
from tests.dataplane.kafka.raw_connection import RawKafkaConnection

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-client")]

OVERRIDES: dict[str, str | int] = {
    # a killed broker is fenced (and leaves the ISR) within seconds, not the default 9 s
    "broker.session.timeout.ms": 4_000,
    "broker.heartbeat.interval.ms": 500,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("client-long-tail")
    with running_cluster(root, "client", OVERRIDES, nodes=3, controllers=1) as running:
        yield running


@pytest.fixture
def admin(cluster: LocalCluster) -> Iterator[AdminClient]:
    client = AdminClient(cluster.bootstrap_servers)
    try:
        yield client
    finally:
        client.close()


def create(
    cluster: LocalCluster, admin: AdminClient, name: str, replicas: list[int], **configs: str
) -> None:
    topic = NewTopic(name, 1, -1, configs, replica_assignment={0: replicas})
    errors = admin.create_topics([topic])
    assert errors[name] is None, errors[name]
    wait_for_leaders(cluster, name, 1)


def partition(admin: AdminClient, topic: str) -> PartitionDescription:
    return admin.describe_topics([topic])[topic].partitions[0]


def produce(cluster: LocalCluster, topic: str, values: list[bytes], **settings: Any) -> None:
    with Producer(cluster.bootstrap_servers, linger_ms=5, **settings) as producer:
        futures = [producer.send(topic, value, partition=0) for value in values]
        producer.flush(timeout=120)
    for future in futures:
        future.result(timeout=0)


def poll_values(consumer: Consumer, count: int, timeout_s: float = 60) -> list[ConsumerRecord]:
    deadline = time.monotonic() + timeout_s
    got: list[ConsumerRecord] = []
    while len(got) < count:
        assert time.monotonic() < deadline, f"{len(got)} of {count} records within {timeout_s} s"
        for records in consumer.poll(timeout_ms=200).values():
            got.extend(records)
    return got


def read_all(cluster: LocalCluster, topic: str) -> list[ConsumerRecord]:
    with Consumer(cluster.bootstrap_servers, auto_offset_reset="earliest") as consumer:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        return poll_values(consumer, end)


def test_batches_above_max_message_bytes_are_split_and_delivered_once_in_order(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    """KIP-126: batch.size 256 KiB against a 2 KB max.message.bytes; the idempotent producer's
    batches are halved until they fit, every record lands once, in send order, and each
    future has its record's offset."""
    create(cluster, admin, "split", [2, 3, 1], **{"max.message.bytes": "2000"})
    values = [b"%04d-" % n + b"v" * 95 for n in range(400)]
    with Producer(
        cluster.bootstrap_servers, batch_size=256 * 1024, linger_ms=300, retry_backoff_ms=20
    ) as producer:
        assert producer.config.idempotent
        futures = [producer.send("split", value, partition=0) for value in values]
        producer.flush(timeout=120)
        offsets = [future.result(timeout=0).offset for future in futures]
    assert offsets == list(range(400))
    stored = read_all(cluster, "split")
    assert [r.value for r in stored] == values
    # one record larger than the limit still fails alone
    with Producer(cluster.bootstrap_servers, batch_size=256 * 1024, linger_ms=300) as producer:
        small, large = producer.send("split", b"s" * 100), producer.send("split", b"L" * 3000)
        producer.flush(timeout=120)
        assert small.result(timeout=0).offset == 400
        error = large.exception(timeout=0)
        assert isinstance(error, KafkaError) and error.error is ErrorCode.MESSAGE_TOO_LARGE


def test_a_consumer_validates_its_position_after_the_leader_is_killed(
    cluster: LocalCluster, admin: AdminClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KIP-320 after a clean election: the new leader confirms the position (OffsetForLeaderEpoch
    over the real RPC) and the consumer goes on without a loss or a duplicate."""
    outcomes: list[Outcome] = []

    def spy(*args: Any, **kwargs: Any) -> dict[TopicPartition, Outcome]:
        found = real_validate(*args, **kwargs)
        outcomes.extend(found.values())
        return found

    monkeypatch.setattr("dataplane.client.consumer.validate", spy)  # a spy: the real RPC runs
    create(cluster, admin, "validated", [2, 3, 1], **{"min.insync.replicas": "2"})
    first = [b"first-%d" % n for n in range(100)]
    then = [b"then-%d" % n for n in range(100)]
    produce(cluster, "validated", first)
    tp = TopicPartition("validated", 0)
    with Consumer(cluster.bootstrap_servers, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got = poll_values(consumer, 100)
        victim = partition(admin, "validated").leader
        cluster.stop_node(victim, kill=True)
        try:
            produce(cluster, "validated", then)
            got += poll_values(consumer, 100)
        finally:
            cluster.start_node(victim)
    assert [r.value for r in got] == first + then
    assert [r.offset for r in got] == list(range(200))
    assert Outcome("valid") in outcomes, "the position was validated with the new leader"
    wait_for("the old leader back in the ISR", lambda: victim in (
        partition(admin, "validated").isr), timeout_s=60)  # fmt: skip


def test_a_log_truncated_by_an_unclean_election_raises_log_truncation(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    """Replicas 2 (leader) and 3; 3 is killed, 2 takes records alone (min.insync.replicas 1)
    and the consumer reads them; 2 is killed and 3, restarted, is elected uncleanly without
    them. The consumer's validation finds its epoch ends below its position."""
    create(
        cluster, admin, "unclean", [2, 3],
        **{"unclean.leader.election.enable": "true", "min.insync.replicas": "1"},
    )  # fmt: skip
    produce(cluster, "unclean", [b"kept-%d" % n for n in range(20)])
    wait_for("both replicas in the ISR", lambda: set(partition(admin, "unclean").isr) == {2, 3})
    tp = TopicPartition("unclean", 0)
    with Consumer(cluster.bootstrap_servers, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        cluster.stop_node(3, kill=True)
        try:
            wait_for("3 out of the ISR", lambda: partition(admin, "unclean").isr == (2,), 60)
            produce(cluster, "unclean", [b"lost-%d" % n for n in range(10)])
            assert len(poll_values(consumer, 30)) == 30
            cluster.stop_node(2, kill=True)
            cluster.start_node(3)
            wait_for("3 elected uncleanly", lambda: partition(admin, "unclean").leader == 3, 60)
            produce(cluster, "unclean", [b"new-%d" % n for n in range(5)])
            deadline = time.monotonic() + 60
            with pytest.raises(LogTruncationError) as info:
                while time.monotonic() < deadline:
                    assert not consumer.poll(timeout_ms=200), "nothing is read past a truncation"
        finally:
            for node in (3, 2):  # whatever failed, both nodes run again for the next tests
                cluster.start_node(node)
    divergent = info.value.divergent_offset
    assert info.value.position == 30
    assert divergent is not None and divergent.offset == 20
    wait_for("2 back in the ISR", lambda: 2 in partition(admin, "unclean").isr, timeout_s=60)
    values = [r.value for r in read_all(cluster, "unclean")]
    assert values == [b"kept-%d" % n for n in range(20)] + [b"new-%d" % n for n in range(5)]


def test_offset_for_leader_epoch_answers_as_kafkas_leader(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    """The RPC itself: the end of an epoch on the leader (the log end offset for the latest),
    fenced with a stale leader epoch, refused by a follower and for an unknown partition."""
    create(cluster, admin, "epochs", [2, 3, 1])
    produce(cluster, "epochs", [b"v%d" % n for n in range(7)])
    described = partition(admin, "epochs")
    follower = next(node for node in described.isr if node != described.leader)

    def ask(
        node: int, topic: str, current: int, epoch: int
    ) -> pb.OffsetForLeaderEpochPartitionResponse:
        request = pb.OffsetForLeaderEpochRequest(topics=[pb.OffsetForLeaderEpochTopic(
            name=topic, partitions=[pb.OffsetForLeaderEpochPartition(
                partition=0, current_leader_epoch=current, leader_epoch=epoch)])])  # fmt: skip
        response = stub(cluster.broker_address(node)).OffsetForLeaderEpoch(request, timeout=10)
        answer: pb.OffsetForLeaderEpochPartitionResponse = response.topics[0].partitions[0]
        return answer

    latest = ask(described.leader, "epochs", described.leader_epoch, described.leader_epoch)
    assert (latest.error_code, latest.leader_epoch, latest.end_offset) == (
        0, described.leader_epoch, 7,
    )  # fmt: skip
    unchecked = ask(described.leader, "epochs", -1, described.leader_epoch + 5)
    assert (unchecked.leader_epoch, unchecked.end_offset) == (-1, -1), "an epoch not yet begun"
    if described.leader_epoch > 0:
        fenced = ask(described.leader, "epochs", described.leader_epoch - 1, 0)
        assert fenced.error_code == ErrorCode.FENCED_LEADER_EPOCH.code
    newer = ask(described.leader, "epochs", described.leader_epoch + 1, 0)
    assert newer.error_code == ErrorCode.UNKNOWN_LEADER_EPOCH.code
    on_follower = ask(follower, "epochs", described.leader_epoch, described.leader_epoch)
    assert on_follower.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code
    assert on_follower.leader_id == described.leader
    missing = ask(described.leader, "no-such-topic", -1, 0)
    assert missing.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code


def test_librdkafka_validates_its_position_over_the_kafka_listener(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    """librdkafka sends OffsetForLeaderEpoch (v3+: the listener serves 2-4) when a partition's
    leader epoch grows, and reads on from the new leader with no loss and no duplicate; the raw
    request answers what the gRPC one does."""
    create(cluster, admin, "rd-epochs", [3, 2, 1], **{"min.insync.replicas": "2"})
    first = [b"first-%d" % n for n in range(50)]
    then = [b"then-%d" % n for n in range(50)]
    produce(cluster, "rd-epochs", first)
    described = partition(admin, "rd-epochs")
    raw = RawKafkaConnection(cluster.kafka_address(described.leader))
    try:
        answer = raw.call(kc.API_OFFSET_FOR_LEADER_EPOCH, 4, {
            "replica_id": -1, "topics": [{"topic": "rd-epochs", "partitions": [{
                "partition": 0, "current_leader_epoch": described.leader_epoch,
                "leader_epoch": described.leader_epoch}]}],
        })  # fmt: skip
    finally:
        raw.close()
    (ended,) = answer.topics[0].partitions
    assert (ended.error_code, ended.leader_epoch, ended.end_offset) == (
        0, described.leader_epoch, 50,
    )  # fmt: skip
    logged: list[str] = []

    class Lines:
        def log(self, level: int, message: str, *args: Any, **kwargs: Any) -> None:
            logged.append(message % args if args else message)

    consumer = RdConsumer({
        "bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers), "group.id": "rd-epochs",
        "enable.auto.commit": False, "debug": "protocol", "topic.metadata.refresh.interval.ms": 500,
    }, logger=Lines())  # fmt: skip
    got: list[bytes] = []

    def read(count: int) -> bool:
        for message in consumer.consume(num_messages=100, timeout=0.2):
            assert message.error() is None, message.error()
            got.append(message.value() or b"")
        return len(got) >= count

    try:
        consumer.assign([RdTopicPartition("rd-epochs", 0, 0)])
        wait_for("the first records", lambda: read(50), 60)
        cluster.stop_node(described.leader, kill=True)
        try:
            produce(cluster, "rd-epochs", then)
            wait_for("the records from the new leader", lambda: read(100), 90)
        finally:
            cluster.start_node(described.leader)
    finally:
        consumer.close()
    assert got == first + then
    assert any("OffsetForLeaderEpoch" in line for line in logged), "librdkafka validated"
    wait_for("the old leader back in the ISR", lambda: described.leader in (
        partition(admin, "rd-epochs").isr), timeout_s=60)  # fmt: skip
