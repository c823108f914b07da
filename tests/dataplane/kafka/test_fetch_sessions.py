"""Fetch sessions (KIP-227) and follower fetching (KIP-392) on the KAFKA listener of a real
3-node cluster (127.0.0.31-33, shared in turn with test_transactions_kafka.py): node N is in
rack ``rack-N`` and every broker runs Kafka's RackAwareReplicaSelector.

kafka-python's consumer opens fetch sessions and reads through incremental fetches (the
brokers' ``raftlog_kafka_fetch_requests_total`` counts them), across assignment changes
(forgotten partitions) and a leader change (a session on the new leader). librdkafka never
opens a session (it sends epoch -1) and is served in full. A consumer whose ``client.rack`` is
a follower's rack is sent there by the leader and reads every record from that follower
(its ``raftlog_follower_bytes_out_total`` shows it). Raw requests check the session errors."""

from __future__ import annotations

import io
import re
import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from kio.serial import entity_reader, entity_writer

from dataplane.broker.replica_selector import RACK_AWARE_REPLICA_SELECTOR
from dataplane.client import AdminClient
from dataplane.kafka import codec as kc
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import create_topic, running_cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("kafka-transactions")]
WAIT_S = 90


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides: dict[str, str | int] = {
        "replica.selector.class": RACK_AWARE_REPLICA_SELECTOR,
        "transaction.state.log.num.partitions": 5,
    }
    racks: dict[int, dict[str, str | int]] = {n: {"broker.rack": f"rack-{n}"} for n in (1, 2, 3)}
    root = tmp_path_factory.mktemp("fetch-sessions")
    with running_cluster(root, "kafka_txn", overrides, node_overrides=racks) as running:
        yield running


def servers(cluster: LocalCluster) -> str:
    return ",".join(cluster.kafka_bootstrap_servers)


def metric(cluster: LocalCluster, node_id: int, name: str, labels: str) -> float:
    """One sample of a node's Prometheus metrics (0 when it has none yet)."""
    url = f"http://{cluster.metrics_address(node_id)}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    sample = rf"{name}\{{{re.escape(labels)}\}}" if labels else name
    found = re.search(rf"^{sample} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def fetches(cluster: LocalCluster, context: str, node_ids: Any = (1, 2, 3)) -> float:
    label = f'context="{context}"'
    return sum(metric(cluster, n, "raftlog_kafka_fetch_requests_total", label) for n in node_ids)


def produce(cluster: LocalCluster, topic: str, values: dict[int, list[bytes]]) -> None:
    """The values of each partition, acks=all, in order."""
    producer = RdProducer({"bootstrap.servers": servers(cluster), "acks": "all", "linger.ms": 5})
    for partition, items in values.items():
        for value in items:
            producer.produce(topic, value=value, partition=partition)
            producer.poll(0)
    assert producer.flush(WAIT_S) == 0


def kp_consumer(cluster: LocalCluster, **extra: Any) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=servers(cluster), group_id=None, enable_auto_commit=False,
        fetch_max_wait_ms=100, auto_offset_reset="earliest", **extra,
    )  # fmt: skip


def kp_read(consumer: KafkaConsumer, want: int, got: dict[int, list[bytes]]) -> None:
    """Poll until ``want`` more records came, each appended to its partition's list."""
    target = sum(map(len, got.values())) + want

    def done() -> bool:
        for tp, records in consumer.poll(timeout_ms=200).items():
            got.setdefault(tp.partition, []).extend(r.value for r in records)
        return sum(map(len, got.values())) >= target

    wait_for(f"{want} records", done, WAIT_S)


def test_kafka_python_reads_through_incremental_fetches_and_forgets_partitions(
    cluster: LocalCluster,
) -> None:
    create_topic(cluster, "sessions", 6)
    first = {p: [b"first-%d-%d" % (p, n) for n in range(40)] for p in range(6)}
    produce(cluster, "sessions", first)
    incremental = fetches(cluster, "incremental")
    consumer = kp_consumer(cluster)
    try:
        partitions = [KpTopicPartition("sessions", p) for p in range(6)]
        consumer.assign(partitions)
        got: dict[int, list[bytes]] = {}
        kp_read(consumer, 240, got)
        assert got == first
        # the assignment shrinks: the dropped partitions are forgotten by their sessions
        consumer.assign(partitions[:3])
        for p in range(3):
            consumer.seek(partitions[p], 40)
        second = {p: [b"second-%d-%d" % (p, n) for n in range(30)] for p in range(6)}
        produce(cluster, "sessions", second)
        got = {}
        kp_read(consumer, 90, got)
        for tp, records in consumer.poll(timeout_ms=1000).items():  # nothing of the others
            got.setdefault(tp.partition, []).extend(r.value for r in records)
        assert got == {p: second[p] for p in range(3)}
        # and grows again: they come back where the consumer says
        consumer.assign(partitions)
        for p in range(6):
            consumer.seek(partitions[p], 70 if p < 3 else 40)
        third = {p: [b"third-%d-%d" % (p, n) for n in range(10)] for p in range(6)}
        produce(cluster, "sessions", third)
        got = {}
        kp_read(consumer, 120, got)
        assert got == {p: (second[p] if p >= 3 else []) + third[p] for p in range(6)}
    finally:
        consumer.close()
    assert fetches(cluster, "incremental") - incremental >= 10  # sessions were in use


def test_a_leader_change_moves_the_consumer_to_a_session_on_the_new_leader(
    cluster: LocalCluster,
) -> None:
    leaders = create_topic(cluster, "session-leader", 1)
    old = leaders[0].leader_id
    replicas = list(leaders[0].replicas)
    new = next(b for b in replicas if b != old)
    produce(cluster, "session-leader", {0: [b"before-%d" % n for n in range(50)]})
    consumer = kp_consumer(cluster)
    try:
        consumer.assign([KpTopicPartition("session-leader", 0)])
        got: dict[int, list[bytes]] = {}
        kp_read(consumer, 50, got)
        full_on_new = fetches(cluster, "full", [new])
        incremental_on_new = fetches(cluster, "incremental", [new])
        admin = AdminClient(cluster.bootstrap_servers)
        try:
            order = [new] + [b for b in replicas if b != new]
            assert admin.alter_partition_reassignments({("session-leader", 0): order}) == {
                ("session-leader", 0): None
            }
            wait_for("the reordered replicas", lambda: not admin.list_partition_reassignments(), 60)
            admin.elect_leaders("preferred", [("session-leader", 0)])

            def moved() -> bool:
                partition = admin.describe_topics(["session-leader"])["session-leader"]
                return partition.partitions[0].leader == new

            wait_for(f"broker {new} leading", moved, 60)
        finally:
            admin.close()
        # kafka-python validates its position with the new leader (OffsetForLeaderEpoch,
        # KIP-320) before it fetches on there
        produce(cluster, "session-leader", {0: [b"after-%d" % n for n in range(50)]})
        kp_read(consumer, 50, got)
        assert got[0] == [b"before-%d" % n for n in range(50)] + [
            b"after-%d" % n for n in range(50)
        ]

        def incremental() -> bool:
            assert consumer.poll(timeout_ms=100) == {}
            return fetches(cluster, "incremental", [new]) > incremental_on_new + 3

        wait_for("incremental fetches on the new leader", incremental, 30)
    finally:
        consumer.close()
    assert fetches(cluster, "full", [new]) > full_on_new  # a new session there


def follower_of(cluster: LocalCluster, topic: str) -> tuple[int, list[int]]:
    """A one-partition topic's leader and followers, once every replica is in the ISR."""
    leaders = create_topic(cluster, topic, 1)
    admin = AdminClient(cluster.bootstrap_servers)
    try:

        def full_isr() -> bool:
            return len(admin.describe_topics([topic])[topic].partitions[0].isr) == 3

        wait_for(f"{topic}'s whole ISR", full_isr, 60)
    finally:
        admin.close()
    leader = leaders[0].leader_id
    return leader, [b for b in leaders[0].replicas if b != leader]


def follower_bytes(cluster: LocalCluster, node_id: int, topic: str) -> float:
    return metric(cluster, node_id, "raftlog_follower_bytes_out_total", f'topic="{topic}"')


def test_librdkafka_in_a_followers_rack_reads_from_that_follower(cluster: LocalCluster) -> None:
    leader, followers = follower_of(cluster, "rack-rd")
    values = [b"rack-%04d" % n for n in range(2000)]
    produce(cluster, "rack-rd", {0: values})
    near = followers[0]
    consumer = RdConsumer({
        "bootstrap.servers": servers(cluster), "group.id": "rack-rd", "client.rack": f"rack-{near}",
        "enable.auto.commit": False, "fetch.wait.max.ms": 100,
    })  # fmt: skip
    got: list[bytes] = []
    try:
        consumer.assign([RdTopicPartition("rack-rd", 0, 0)])

        def done() -> bool:
            for message in consumer.consume(num_messages=1000, timeout=0.2):
                if message.error() is None:
                    got.append(message.value() or b"")
            return len(got) >= len(values)

        wait_for("every record", done, WAIT_S)
    finally:
        consumer.close()
    assert got == values
    assert follower_bytes(cluster, near, "rack-rd") >= sum(map(len, values))
    assert follower_bytes(cluster, followers[1], "rack-rd") == 0
    assert follower_bytes(cluster, leader, "rack-rd") == 0


def test_kafka_python_in_a_followers_rack_reads_from_that_follower(cluster: LocalCluster) -> None:
    leader, followers = follower_of(cluster, "rack-kp")
    values = [b"kp-%04d" % n for n in range(500)]
    produce(cluster, "rack-kp", {0: values})
    near = followers[1]
    consumer = kp_consumer(cluster, client_rack=f"rack-{near}")
    try:
        consumer.assign([KpTopicPartition("rack-kp", 0)])
        got: dict[int, list[bytes]] = {}
        kp_read(consumer, len(values), got)
    finally:
        consumer.close()
    assert got == {0: values}
    assert follower_bytes(cluster, near, "rack-kp") >= sum(map(len, values))
    assert follower_bytes(cluster, leader, "rack-kp") == 0


class Raw:
    """Fetch v12 requests on one connection, as bytes a client would send."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.socket = socket.create_connection((host, int(port)), timeout=30)
        self.correlation_id = 0

    def fetch(
        self,
        session_id: int,
        epoch: int,
        partitions: dict[int, int],
        forgotten: tuple[int, ...] = (),
    ) -> Any:
        """The answer to a fetch of ``partitions`` (index: fetch offset) of topic "raw"."""
        self.correlation_id += 1
        schema = kc.request_schema(kc.API_FETCH, 12)
        header = kc.to_entity(schema.__header_schema__, {
            "request_api_key": kc.API_FETCH, "request_api_version": 12,
            "correlation_id": self.correlation_id, "client_id": "fetch-session-test",
        })  # fmt: skip
        body = kc.to_entity(schema, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": session_id, "session_epoch": epoch,
            "topics": [{"topic": "raw", "partitions": [
                {"partition": p, "current_leader_epoch": -1, "fetch_offset": offset,
                 "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 16}
                for p, offset in partitions.items()]}] if partitions else [],
            "forgotten_topics_data": [{"topic": "raw", "partitions": list(forgotten)}]
            if forgotten else [],
            "rack_id": "",
        })  # fmt: skip
        buffer = io.BytesIO()
        entity_writer(schema.__header_schema__)(buffer, header)
        entity_writer(schema)(buffer, body)
        frame = buffer.getvalue()
        self.socket.sendall(kc.SIZE.pack(len(frame)) + frame)
        (size,) = kc.SIZE.unpack(self.socket.recv(kc.SIZE.size, socket.MSG_WAITALL))
        answer = self.socket.recv(size, socket.MSG_WAITALL)
        response = kc.response_schema(kc.API_FETCH, 12)
        head, offset = entity_reader(response.__header_schema__)(answer, 0)
        assert head.correlation_id == self.correlation_id
        return entity_reader(response)(answer, offset)[0]


def named(answer: Any) -> list[int]:
    return [p.partition_index for topic in answer.responses for p in topic.partitions]


def test_raw_fetches_open_use_and_close_a_session_with_kafkas_errors(
    cluster: LocalCluster,
) -> None:
    leaders = create_topic(cluster, "raw", 1, rf=1)
    produce(cluster, "raw", {0: [b"one", b"two"]})
    raw = Raw(cluster.kafka_address(leaders[0].leader_id))
    try:
        unknown = raw.fetch(123_456, 1, {0: 0})
        assert unknown.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND.code
        assert unknown.session_id == 0 and named(unknown) == []
        full = raw.fetch(0, 0, {0: 0})  # a full fetch: a session, every partition
        assert full.error_code == 0 and full.session_id > 0 and named(full) == [0]
        assert full.responses[0].partitions[0].records
        session = full.session_id
        quiet = raw.fetch(session, 1, {0: 2})  # read to the end: nothing new, nothing named
        assert (quiet.error_code, quiet.session_id, named(quiet)) == (0, session, [])
        wrong = raw.fetch(session, 5, {})
        assert wrong.error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH.code
        produce(cluster, "raw", {0: [b"three"]})
        news = raw.fetch(session, 2, {})  # the session survived the wrong epoch
        assert news.error_code == 0 and named(news) == [0]
        assert news.responses[0].partitions[0].high_watermark == 3
        assert named(raw.fetch(session, 3, {}, forgotten=(0,))) == []  # forgot its last one
        assert raw.fetch(session, 4, {}).error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND.code
        final = raw.fetch(0, -1, {0: 0})  # librdkafka's kind: no session
        assert (final.error_code, final.session_id, named(final)) == (0, 0, [0])
    finally:
        raw.socket.close()


def test_followers_replicate_through_incremental_fetch_sessions(cluster: LocalCluster) -> None:
    """Over gRPC, the followers' fetchers hold a session with each leader (the BROKER
    listener's cache) and fetch incrementally; librdkafka's acks=all produce to 12 partitions
    completes through them, and a consumer reads every record back."""
    create_topic(cluster, "replicated", 12)

    def incremental() -> float:
        label = 'context="incremental"'
        return sum(
            metric(cluster, n, "raftlog_replica_fetch_requests_total", label) for n in (1, 2, 3)
        )

    before = incremental()
    values = {p: [b"r-%d-%d" % (p, n) for n in range(25)] for p in range(12)}
    produce(cluster, "replicated", values)
    wait_for("incremental follower fetches", lambda: incremental() > before + 10, WAIT_S)
    for node in (1, 2, 3):  # every node leads some of the 12 partitions: two followers each
        sessions = metric(cluster, node, "raftlog_replica_fetch_sessions", "")
        assert sessions >= 2, f"node {node}: {sessions} follower sessions"
    consumer = kp_consumer(cluster)
    try:
        consumer.assign([KpTopicPartition("replicated", p) for p in range(12)])
        got: dict[int, list[bytes]] = {}
        kp_read(consumer, 300, got)
        assert got == values
    finally:
        consumer.close()
