"""Floods against one node's KAFKA listener (issue 30 §2): Kafka's connection and request limits
keep a well-behaved client served, judged by kafka-python.

The node takes ``max.connections.per.ip=40`` with an override of 600 for 127.0.0.143 (the
slowloris source), ``connections.max.idle.ms=8000`` and ``socket.request.max.bytes`` of 4 MiB.
Flooding sockets bind their source address (127.0.0.142, 127.0.0.143); kafka-python connects
from 127.0.0.1. The accounting itself is tests/dataplane/kafka/test_connection_limits.py."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from dataplane.tools.local_cluster import LocalCluster, wait_for
from tests.dataplane.cluster_support import running_cluster

# 141-143 are also the raft tests' (tests/metadata_quorum/raft_node.py): their group, in turn
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("raft")]
PER_IP = 40
FLOOD, SLOWLORIS = "127.0.0.142", "127.0.0.143"
IDLE_MS = 8000
REQUEST_MAX_BYTES = 4 * 1024 * 1024
TOPIC = "limits"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path_factory.mktemp("limits"),
        "limits",
        overrides={
            "max.connections.per.ip": PER_IP,
            "max.connections.per.ip.overrides": f"{SLOWLORIS}:600",
            "connections.max.idle.ms": IDLE_MS,
            "socket.request.max.bytes": REQUEST_MAX_BYTES,
        },
        nodes=1,
    ) as running:
        admin = KafkaAdminClient(bootstrap_servers=running.kafka_bootstrap_servers)
        try:
            admin.create_topics([NewTopic(TOPIC, 1, 1)])
        finally:
            admin.close()
        yield running


def _api_versions(correlation_id: int) -> bytes:
    """An ApiVersions v0 request frame (client id null, empty body)."""
    frame = struct.pack(">hhih", 18, 0, correlation_id, -1)
    return struct.pack(">i", len(frame)) + frame


def _connect(cluster: LocalCluster, source: str | None = None) -> socket.socket:
    host, port = cluster.kafka_address(1).rsplit(":", 1)
    source_address = None if source is None else (source, 0)
    return socket.create_connection((host, int(port)), timeout=30, source_address=source_address)


def _served(connection: socket.socket, correlation_id: int = 1) -> bool:
    connection.sendall(_api_versions(correlation_id))
    head = connection.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return False
    answer = connection.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)
    return struct.unpack_from(">ih", answer) == (correlation_id, 0)


def _closed_by_broker(connection: socket.socket, timeout_s: float = 30) -> bool:
    """Whether the broker closes `connection` (EOF or reset) within `timeout_s`."""
    connection.settimeout(timeout_s)
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True


def _close_all(connections: list[socket.socket]) -> None:
    for connection in connections:
        connection.close()


def test_a_flood_over_max_connections_per_ip_is_refused_while_other_addresses_are_served(
    cluster: LocalCluster,
) -> None:
    flood: list[socket.socket] = []
    try:
        for n in range(PER_IP):
            flood.append(_connect(cluster, FLOOD))
            assert _served(flood[-1], n), f"connection {n} from {FLOOD}, within the limit"
        over = [_connect(cluster, FLOOD) for _ in range(20)]
        flood += over
        assert all(_closed_by_broker(connection) for connection in over)  # closed at once
        with _connect(cluster, SLOWLORIS) as other:
            assert _served(other)
        producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap_servers, acks=1)
        try:
            assert producer.send(TOPIC, b"from 127.0.0.1").get(timeout=30).offset >= 0
        finally:
            producer.close()
    finally:
        _close_all(flood)

    def a_place_again() -> bool | None:  # the broker sees the flood's sockets close
        with _connect(cluster, FLOOD) as again:
            return _served(again) or None

    wait_for(f"{FLOOD} to be served again", a_place_again, timeout_s=30)


def test_a_slowloris_flood_does_not_starve_a_well_behaved_producer(cluster: LocalCluster) -> None:
    stalled: list[socket.socket] = []
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap_servers, acks=1, linger_ms=0)
    try:
        producer.send(TOPIC, b"warm-up").get(timeout=30)
        for _ in range(300):  # a request's size and first bytes, then nothing more
            connection = _connect(cluster, SLOWLORIS)
            connection.sendall(struct.pack(">i", 1000) + b"\x00\x12\x00\x00\x00\x00\x00\x07")
            stalled.append(connection)
        latencies_s = []
        for n in range(200):
            started = time.monotonic()
            producer.send(TOPIC, b"during the flood %d" % n).get(timeout=30)
            latencies_s.append(time.monotonic() - started)
        latencies_s.sort()
        p99_s = latencies_s[int(len(latencies_s) * 0.99) - 1]
        print(
            f"\nproduce p99 during a 300-socket slowloris flood: {p99_s * 1000:.1f} ms "
            f"(median {latencies_s[len(latencies_s) // 2] * 1000:.1f} ms)"
        )
        assert p99_s < 2.0
        # connections.max.idle.ms closes every stalled one; the producer, busy, stays
        started = time.monotonic()
        assert all(_closed_by_broker(connection, timeout_s=60) for connection in stalled)
        assert time.monotonic() - started < 60
        producer.send(TOPIC, b"after the flood").get(timeout=30)
    finally:
        producer.close()
        _close_all(stalled)


def test_a_frame_over_socket_request_max_bytes_closes_only_its_connection(
    cluster: LocalCluster,
) -> None:
    with _connect(cluster) as good, _connect(cluster) as big, _connect(cluster) as huge:
        assert _served(good)
        big.sendall(struct.pack(">i", REQUEST_MAX_BYTES + 1) + bytes(1024))
        huge.sendall(struct.pack(">i", 2**31 - 1))  # claims 2 GiB: nothing is allocated
        assert _closed_by_broker(big) and _closed_by_broker(huge)
        assert _served(good, 2)
