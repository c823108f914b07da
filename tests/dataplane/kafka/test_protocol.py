"""Kafka's own clients against the KAFKA listener of a real 3-node cluster (127.0.0.171-173):
librdkafka (confluent-kafka and kcat) and kafka-python produce and consume unchanged, and what
they write is what the gRPC client reads, byte for byte, and the other way round. Protocol edges
(unsupported versions, malformed frames) are checked on raw sockets."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient as RdAdminClient
from confluent_kafka.cimpl import NewTopic as RdNewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka import errors as kafka_errors
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType as KpResourceType
from kafka.admin import NewPartitions as KpNewPartitions
from kafka.admin import NewTopic as KpNewTopic

from dataplane.client import AdminClient, Consumer, Producer, TopicPartition
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.cluster_support import create_topic, running_cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("kafka-protocol")]
KCAT = shutil.which("kcat")
Row = tuple[int, int, bytes | None, bytes | None]  # partition, offset, key, value


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("kafka"), "kafka") as running:
        yield running


def kafka_servers(cluster: LocalCluster) -> str:
    return ",".join(cluster.kafka_bootstrap_servers)


def grpc_rows(cluster: LocalCluster, topic: str, partitions: int) -> list[Row]:
    """Every record of `topic` read with the gRPC client, up to the end offsets."""
    rows: list[Row] = []
    with Consumer(cluster.bootstrap_servers) as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)

        def done() -> bool:
            for records in consumer.poll(timeout_ms=200).values():
                rows.extend((r.partition, r.offset, r.key, r.value) for r in records)
            return all(consumer.position(tp) >= end for tp, end in ends.items())

        wait_for(f"{topic} read over gRPC", done, 60)
    return sorted(rows)


def librdkafka_rows(cluster: LocalCluster, topic: str, partitions: int, count: int) -> list[Row]:
    consumer = RdConsumer({
        "bootstrap.servers": kafka_servers(cluster), "group.id": "unused-assign-only",
        "enable.auto.commit": False,
    })  # fmt: skip
    rows: list[Row] = []
    try:
        consumer.assign([RdTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])

        def done() -> bool:
            for message in consumer.consume(num_messages=1000, timeout=0.5):
                assert message.error() is None, message.error()
                partition, offset = message.partition(), message.offset()
                assert partition is not None and offset is not None
                rows.append((partition, offset, message.key(), message.value()))
            return len(rows) >= count

        wait_for(f"{count} records of {topic} over the Kafka protocol", done, 60)
    finally:
        consumer.close()
    return sorted(rows)


def test_librdkafka_idempotent_producer_and_consumer_round_trip(cluster: LocalCluster) -> None:
    create_topic(cluster, "rd-events", 3, configs={"min.insync.replicas": "2"})
    delivered: list[tuple[int, int]] = []
    errors: list[object] = []

    def on_delivery(error: object, message: object) -> None:
        if error is not None:
            errors.append(error)
        else:
            delivered.append((message.partition(), message.offset()))  # type: ignore[attr-defined]

    producer = RdProducer({
        "bootstrap.servers": kafka_servers(cluster), "enable.idempotence": True, "acks": "all",
        "compression.type": "zstd", "linger.ms": 5,
    })  # fmt: skip
    for n in range(3000):
        producer.produce("rd-events", key=f"k{n % 17}".encode(), value=f"v{n}".encode(),
                         on_delivery=on_delivery)  # fmt: skip
        producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == [] and len(delivered) == 3000

    over_grpc = grpc_rows(cluster, "rd-events", 3)
    assert sorted((p, o) for p, o, _, _ in over_grpc) == sorted(delivered)
    assert sorted(v or b"" for _, _, _, v in over_grpc) == sorted(
        f"v{n}".encode() for n in range(3000)
    )
    assert librdkafka_rows(cluster, "rd-events", 3, 3000) == over_grpc


def test_grpc_writes_read_by_librdkafka_and_kafka_python(cluster: LocalCluster) -> None:
    create_topic(cluster, "grpc-events", 2)
    with Producer(cluster.bootstrap_servers, compression_type="lz4") as producer:
        for n in range(500):
            producer.send("grpc-events", key=None if n % 5 == 0 else f"k{n}".encode(),
                          value=f"g{n}".encode(), partition=n % 2)  # fmt: skip
        producer.flush()
    written = grpc_rows(cluster, "grpc-events", 2)
    assert len(written) == 500
    assert librdkafka_rows(cluster, "grpc-events", 2, 500) == written

    consumer = KafkaConsumer(
        bootstrap_servers=kafka_servers(cluster), group_id=None, enable_auto_commit=False,
    )  # fmt: skip
    got: list[Row] = []
    try:
        tps = [KpTopicPartition("grpc-events", p) for p in range(2)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        assert ends == {tp: max(o for p, o, _, _ in written if p == tp.partition) + 1 for tp in tps}

        def read_to_the_ends() -> bool:  # not until a consumer_timeout_ms of silence
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((m.partition, m.offset, m.key, m.value) for m in records)
            return all(consumer.position(tp) >= ends[tp] for tp in tps)

        wait_for("kafka-python read grpc-events to its end offsets", read_to_the_ends, 60)
    finally:
        consumer.close()
    assert sorted(got) == written


def test_kafka_python_producer_acks_all(cluster: LocalCluster) -> None:
    create_topic(cluster, "kp-events", 3)
    producer = KafkaProducer(
        bootstrap_servers=kafka_servers(cluster), acks="all", compression_type="gzip"
    )
    try:
        futures = [producer.send("kp-events", value=f"p{n}".encode()) for n in range(600)]
        producer.flush(30)
        sent = sorted((f.get(10).partition, f.get(10).offset) for f in futures)
    finally:
        producer.close()
    stored = grpc_rows(cluster, "kp-events", 3)
    assert [(p, o) for p, o, _, _ in stored] == sent
    assert sorted(v or b"" for *_, v in stored) == sorted(f"p{n}".encode() for n in range(600))


def test_kcat_lists_produces_and_consumes(cluster: LocalCluster) -> None:
    assert KCAT is not None, "kcat is missing: make test installs it (apt-get install kcat)"
    create_topic(cluster, "kcat-events", 3)
    servers = kafka_servers(cluster)
    listing = subprocess.run([KCAT, "-b", servers, "-L", "-t", "kcat-events"], capture_output=True,
                             text=True, timeout=30, check=True).stdout  # fmt: skip
    assert "3 brokers:" in listing
    for spec in cluster.specs:
        assert f"broker {spec.node_id} at {cluster.kafka_address(spec.node_id)}" in listing
    assert 'topic "kcat-events" with 3 partitions:' in listing

    lines = "".join(f"line-{n}\n" for n in range(1000))
    subprocess.run([KCAT, "-b", servers, "-P", "-t", "kcat-events", "-X", "acks=all",
                    "-X", "enable.idempotence=true", "-z", "lz4"],
                   input=lines, text=True, timeout=60, check=True)  # fmt: skip
    consumed = subprocess.run([KCAT, "-b", servers, "-C", "-t", "kcat-events", "-o", "beginning",
                               "-e", "-q"], capture_output=True, text=True, timeout=60,
                              check=True).stdout.split()  # fmt: skip
    assert sorted(consumed) == sorted(f"line-{n}" for n in range(1000))
    assert sorted(v or b"" for *_, v in grpc_rows(cluster, "kcat-events", 3)) == sorted(
        f"line-{n}".encode() for n in range(1000)
    )


def test_a_leader_sigkill_under_a_librdkafka_acks_all_run_loses_nothing(
    cluster: LocalCluster,
) -> None:
    """librdkafka's idempotent producer through a leader SIGKILL: it finds the new leader from
    Metadata, retries what was not acknowledged, and every delivered record is stored once, at the
    offset its delivery report gave."""
    create_topic(cluster, "rd-failover", 3, configs={"min.insync.replicas": "2"})
    admin = AdminClient(cluster.bootstrap_servers)
    delivered: dict[bytes, tuple[int, int]] = {}
    failed: list[object] = []

    def on_delivery(error: object, message: Any) -> None:
        if error is None:
            delivered[message.value()] = (message.partition(), message.offset())
        else:
            failed.append(error)

    producer = RdProducer({
        "bootstrap.servers": kafka_servers(cluster), "enable.idempotence": True, "acks": "all",
        "linger.ms": 2, "message.timeout.ms": 120_000,
    })  # fmt: skip
    sent = 0

    def send(until: int) -> None:
        nonlocal sent
        while sent < until:
            producer.produce("rd-failover", value=b"f-%08d" % sent, on_delivery=on_delivery)
            producer.poll(0)
            sent += 1
        producer.flush(0.1)

    try:
        send(3000)
        wait_for("the first records delivered", lambda: producer.flush(0.5) == 0, 60)
        victim = admin.describe_topics(["rd-failover"])["rd-failover"].partitions[0].leader
        send(4000)
        cluster.stop_node(victim, kill=True)
        send(8000)
        assert producer.flush(120) == 0
        cluster.start_node(victim)

        def rejoined() -> bool:
            topic = admin.describe_topics(["rd-failover"])["rd-failover"]
            return all(victim in p.isr for p in topic.partitions)

        wait_for("the old leader back in every ISR", rejoined, 90)
    finally:
        admin.close()
    assert failed == [] and len(delivered) == 8000
    stored = grpc_rows(cluster, "rd-failover", 3)
    assert len(stored) == 8000  # nothing twice
    assert {(p, o): v for p, o, _, v in stored} == {at: v for v, at in delivered.items()}


def _group_consumer(cluster: LocalCluster, group: str) -> RdConsumer:
    """librdkafka in a consumer group with KIP-848's protocol (ConsumerGroupHeartbeat)."""
    consumer = RdConsumer({
        "bootstrap.servers": kafka_servers(cluster), "group.id": group,
        "group.protocol": "consumer", "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })  # fmt: skip
    consumer.subscribe(["grp-events"])
    return consumer


def _consume(consumer: RdConsumer, count: int) -> list[bytes]:
    values: list[bytes] = []

    def done() -> bool:
        for message in consumer.consume(num_messages=1000, timeout=0.5):
            assert message.error() is None, message.error()
            values.append(message.value() or b"")
        return len(values) >= count

    wait_for(f"{count} records through the group", done, 60)
    return values


def test_a_librdkafka_group_consumer_commits_and_a_successor_resumes(
    cluster: LocalCluster,
) -> None:
    """FindCoordinator (answered with the KAFKA endpoint), ConsumerGroupHeartbeat with topic ids
    (Metadata by topic id resolves them), OffsetCommit and OffsetFetch, against the same group
    coordinator the gRPC client uses."""
    create_topic(cluster, "grp-events", 3)
    with Producer(cluster.bootstrap_servers) as producer:
        for n in range(3000):
            producer.send("grp-events", value=f"first-{n}".encode())
        producer.flush()
    first = _group_consumer(cluster, "kafka-group")
    try:
        values = _consume(first, 3000)
        assert sorted(values) == sorted(f"first-{n}".encode() for n in range(3000))
        assert {tp.partition for tp in first.assignment()} == {0, 1, 2}
        first.commit(asynchronous=False)
        committed = first.committed(first.assignment(), timeout=10)
        # The sticky partitioner may leave a partition empty: nothing stored, nothing committed
        # there (OFFSET_INVALID, -1001); every record is below some committed offset.
        assert sum(max(tp.offset, 0) for tp in committed) == 3000
    finally:
        first.close()
    with Producer(cluster.bootstrap_servers) as producer:
        for n in range(100):
            producer.send("grp-events", value=f"second-{n}".encode())
        producer.flush()
    successor = _group_consumer(cluster, "kafka-group")
    try:
        resumed = _consume(successor, 100)
    finally:
        successor.close()
    assert sorted(resumed) == sorted(f"second-{n}".encode() for n in range(100))


def test_kafka_python_admin_client_manages_topics_through_the_controller(
    cluster: LocalCluster,
) -> None:
    """CreateTopics, CreatePartitions, DescribeConfigs, DescribeCluster and DeleteTopics from
    kafka-python's KafkaAdminClient, forwarded to the controller; the native admin client sees
    every change, and refusals come back with Kafka's errors."""
    admin = KafkaAdminClient(bootstrap_servers=kafka_servers(cluster))
    native = AdminClient(cluster.bootstrap_servers)
    try:
        created = admin.create_topics([
            KpNewTopic("kp-admin", num_partitions=2, replication_factor=3,
                       topic_configs={"retention.ms": "3600000"}),
        ])  # fmt: skip
        assert created["topics"][0]["error_code"] == 0

        def partitions() -> int:  # (a controller that answers reads may lag a moment)
            try:
                return len(native.describe_topics(["kp-admin"])["kp-admin"].partitions)
            except KafkaError as error:
                assert error.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, error
                return 0

        wait_for("kp-admin's 2 partitions", lambda: partitions() == 2, timeout_s=30)
        with pytest.raises(kafka_errors.TopicAlreadyExistsError):
            admin.create_topics([KpNewTopic("kp-admin", num_partitions=1, replication_factor=3)])
        with pytest.raises(kafka_errors.InvalidReplicationFactorError):
            admin.create_topics([KpNewTopic("kp-too-many", num_partitions=1, replication_factor=9)])
        admin.create_partitions({"kp-admin": KpNewPartitions(total_count=4)})
        wait_for("kp-admin's 4 partitions", lambda: partitions() == 4, timeout_s=30)
        configs = admin.describe_configs([KpConfigResource(KpResourceType.TOPIC, "kp-admin")])
        retention = configs["topic"]["kp-admin"]["retention.ms"]
        assert (retention["value"], retention["config_source"]) == (
            "3600000",
            "DYNAMIC_TOPIC_CONFIG",
        )
        described = admin.describe_cluster()
        listed = {f"{b['host']}:{b['port']}" for b in described["brokers"]}
        assert listed == set(cluster.kafka_bootstrap_servers)
        admin.delete_topics(["kp-admin"])
        wait_for(
            "kp-admin to be gone", lambda: "kp-admin" not in native.list_topics(), timeout_s=30
        )
        with pytest.raises(kafka_errors.UnknownTopicOrPartitionError):
            admin.delete_topics(["kp-admin"])
    finally:
        admin.close()
        native.close()


def test_librdkafka_admin_client_creates_and_deletes_topics(cluster: LocalCluster) -> None:
    admin = RdAdminClient({"bootstrap.servers": kafka_servers(cluster)})
    for future in admin.create_topics([RdNewTopic("rd-admin", 3, 3)]).values():
        future.result(timeout=30)

    def partitions() -> int:  # brokers learn of the topic a moment after the controller
        described = admin.list_topics(timeout=10).topics.get("rd-admin")
        return 0 if described is None or described.error else len(described.partitions)

    wait_for("rd-admin in librdkafka's metadata", lambda: partitions() == 3, timeout_s=30)
    for future in admin.delete_topics(["rd-admin"]).values():
        future.result(timeout=30)


# -- protocol edges on raw sockets ------------------------------------------------------------
def _request(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    client_id = b"raw-test"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    if version >= 3 and api_key == 18:  # flexible ApiVersions: header v2 (tagged fields)
        header += b"\0"
    frame = header + body
    return struct.pack(">i", len(frame)) + frame


def _connect(cluster: LocalCluster) -> socket.socket:
    host, port = cluster.kafka_address(1).rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _response(connection: socket.socket) -> bytes:
    size = struct.unpack(">i", connection.recv(4, socket.MSG_WAITALL))[0]
    return connection.recv(size, socket.MSG_WAITALL)


def test_api_versions_of_an_unknown_version_answers_unsupported_version_in_v0(
    cluster: LocalCluster,
) -> None:
    with _connect(cluster) as connection:
        connection.sendall(_request(18, 99, 7))
        answer = _response(connection)
    correlation_id, error_code, count = struct.unpack_from(">ihi", answer)
    assert (correlation_id, error_code) == (7, 35)  # UNSUPPORTED_VERSION
    keys = {struct.unpack_from(">hhh", answer, 10 + 6 * n) for n in range(count)}
    assert (18, 0, 4) in keys and (0, 3, 11) in keys


def test_a_malformed_frame_closes_only_its_connection(cluster: LocalCluster) -> None:
    with _connect(cluster) as bad, _connect(cluster) as good:
        bad.sendall(struct.pack(">i", 6) + b"\x00\x03\x00\x00\x00\x00")  # no whole header
        assert bad.recv(1) == b""  # closed by the broker
        good.sendall(_request(18, 0, 1))
        assert struct.unpack_from(">ih", _response(good)) == (1, 0)


def test_an_unknown_api_key_closes_the_connection(cluster: LocalCluster) -> None:
    with _connect(cluster) as connection:
        connection.sendall(_request(999, 0, 3))
        deadline = time.monotonic() + 10
        while connection.recv(1) != b"":
            assert time.monotonic() < deadline


def test_bytes_after_a_request_body_are_ignored_as_kafka_does(cluster: LocalCluster) -> None:
    """librdkafka 2.x's all-topics Metadata v12 (its admin list_topics) ends with three bytes
    the schema does not have; Kafka reads the fields and ignores the rest, and so must we."""
    frame = bytes.fromhex("0003000c00000004000772646b61666b610000000000010000")
    with _connect(cluster) as connection:
        connection.sendall(struct.pack(">i", len(frame)) + frame)
        answer = _response(connection)
    assert struct.unpack_from(">i", answer) == (4,)
