"""Kafka's connection and request limits, the accounting alone (issue 30 §2): the per-IP
overrides as Kafka reads them, the admission rule (Kafka's ConnectionQuotas), the permits that
bound queued.max.requests, the dynamic limits from the metadata image, the node config keys, a
frame over socket.request.max.bytes, and the gRPC options. The listener under a flood is
tests/dataplane/kafka/test_connection_limits_cluster.py."""

from __future__ import annotations

import socket
import struct
import threading
from types import MappingProxyType

import pytest

from dataplane.broker.fetcher import FetcherConfig
from dataplane.broker.replica_manager import ReplicaManagerConfig
from dataplane.kafka import codec as kc
from dataplane.kafka.connection_limits import (
    Admission,
    ConnectionLimits,
    ConnectionQuotas,
    DynamicConnectionLimits,
    ListenerLimits,
    RequestPermits,
    admission,
    resolve_host,
)
from dataplane.kafka.listener import _read_frame
from dataplane.server.broker_server import BrokerSettings, grpc_limits
from dataplane.server.config import NodeConfig
from metadata_quorum.configs import AlterOp, alter_dynamic_configs, broker_config
from metadata_quorum.connection_configs import parse_per_ip_overrides
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import ConfigResourceType
from raftlog.config import ConfigError

BROKER = ConfigResourceType.BROKER
NODE = {
    "node.id": 1, "process.roles": "broker,controller", "listeners": "BROKER://127.0.0.1:9092",
    "controller.quorum.voters": "1@127.0.0.1:9093", "log.dirs": "/tmp/unused",
}  # fmt: skip


# -- max.connections.per.ip.overrides --------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("", {}),
        ("hostName:100,127.0.0.1:200", {"hostName": 100, "127.0.0.1": 200}),
        (" 10.0.0.1 : 0 ,, ", {"10.0.0.1": 0}),
        ("::1:5", {"::1": 5}),  # split at the last colon: an IPv6 address keeps its own
    ],
)
def test_per_ip_overrides_are_read_as_kafka_reads_them(value: str, parsed: dict[str, int]) -> None:
    assert parse_per_ip_overrides(value) == parsed


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("127.0.0.1", "not host:count"),
        (":5", "not host:count"),
        ("bad host:5", "not host:count"),
        ("127.0.0.1:-1", "integer from 0"),
        ("127.0.0.1:x", "integer from 0"),
        ("127.0.0.1:2147483648", "integer from 0"),
        ("a:1,a:2", "given twice"),
    ],
)
def test_bad_per_ip_overrides_are_refused_naming_the_entry(value: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_per_ip_overrides(value)


def test_the_limits_are_dynamic_broker_configs_validated_as_kafka_does() -> None:
    new = alter_dynamic_configs(
        BROKER, "", {}, [(AlterOp.SET, "max.connections.per.ip", "5"),
                         (AlterOp.SET, "max.connections.per.ip.overrides", "127.0.0.9:50")],
    )  # fmt: skip
    assert new == {
        "max.connections.per.ip": "5",
        "max.connections.per.ip.overrides": "127.0.0.9:50",
    }
    assert alter_dynamic_configs(BROKER, "1", {}, [(AlterOp.SET, "max.connections", "7")]) == {
        "max.connections": "7"
    }
    with pytest.raises(ConfigError, match="can be set to zero only if"):
        alter_dynamic_configs(BROKER, "1", {}, [(AlterOp.SET, "max.connections.per.ip", "0")])
    with pytest.raises(ConfigError, match="not host:count"):
        alter_dynamic_configs(
            BROKER, "", {}, [(AlterOp.SET, "max.connections.per.ip.overrides", "nocount")]
        )
    with pytest.raises(ConfigError, match=r"max\.connections"):
        alter_dynamic_configs(BROKER, "", {}, [(AlterOp.SET, "max.connections", "-1")])


# -- admission (Kafka's ConnectionQuotas.inc) ------------------------------------------------------
LIMITS = ConnectionLimits(10, 2, MappingProxyType({"10.0.0.9": 4, "10.0.0.0": 0}))


@pytest.mark.parametrize(
    ("total", "from_address", "address", "verdict"),
    [
        (0, 0, "10.0.0.1", Admission.ADMIT),
        (3, 1, "10.0.0.1", Admission.ADMIT),
        (3, 2, "10.0.0.1", Admission.REFUSE),  # max.connections.per.ip: closed at once
        (3, 3, "10.0.0.9", Admission.ADMIT),  # its override allows 4
        (4, 4, "10.0.0.9", Admission.REFUSE),
        (0, 0, "10.0.0.0", Admission.REFUSE),  # an override of 0: never
        (10, 0, "10.0.0.1", Admission.WAIT),  # max.connections: the acceptor waits for a slot
        (10, 2, "10.0.0.1", Admission.WAIT),  # the slot first, as Kafka
    ],
)
def test_admission(total: int, from_address: int, address: str, verdict: Admission) -> None:
    assert admission(LIMITS, total, from_address, address) is verdict


def test_quotas_count_per_address_and_refuse_over_the_per_ip_limit() -> None:
    quotas, stopped = ConnectionQuotas(lambda: LIMITS), threading.Event()
    assert [quotas.inc("10.0.0.1", stopped) for _ in range(3)] == [
        Admission.ADMIT, Admission.ADMIT, Admission.REFUSE,
    ]  # fmt: skip
    assert quotas.inc("10.0.0.2", stopped) is Admission.ADMIT  # another address is served
    assert (quotas.total, quotas.count("10.0.0.1"), quotas.limit_for("10.0.0.9")) == (3, 2, 4)
    quotas.dec("10.0.0.1")
    assert quotas.inc("10.0.0.1", stopped) is Admission.ADMIT  # a closed one frees its place
    for address in ("10.0.0.1", "10.0.0.1", "10.0.0.2"):
        quotas.dec(address)
    assert quotas.total == 0
    with pytest.raises(AssertionError, match=r"no connection from 10\.0\.0\.1"):
        quotas.dec("10.0.0.1")


def test_at_max_connections_the_acceptor_waits_until_a_connection_closes() -> None:
    quotas, stopped = (
        ConnectionQuotas(lambda: ConnectionLimits(max_connections=1)),
        threading.Event(),
    )
    assert quotas.inc("10.0.0.1", stopped) is Admission.ADMIT
    verdicts: list[Admission] = []
    waiting = threading.Thread(target=lambda: verdicts.append(quotas.inc("10.0.0.2", stopped)))
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive() and not verdicts  # waits: nothing refused, nothing taken
    quotas.dec("10.0.0.1")
    waiting.join(10)
    assert verdicts == [Admission.ADMIT] and quotas.count("10.0.0.2") == 1


def test_a_raised_limit_or_a_stopped_listener_ends_the_wait() -> None:
    limits = [ConnectionLimits(max_connections=0)]
    quotas, stopped = ConnectionQuotas(lambda: limits[0]), threading.Event()
    verdicts: list[Admission] = []
    waiting = threading.Thread(target=lambda: verdicts.append(quotas.inc("10.0.0.1", stopped)))
    waiting.start()
    limits[0] = ConnectionLimits(max_connections=5)  # AlterConfigs raised it
    waiting.join(10)
    assert verdicts == [Admission.ADMIT]
    limits[0] = ConnectionLimits(max_connections=1)
    stopped.set()
    assert quotas.inc("10.0.0.1", stopped) is Admission.WAIT  # not counted
    assert quotas.total == 1


# -- queued.max.requests ---------------------------------------------------------------------------
def test_permits_bound_the_requests_in_flight_and_a_release_lets_the_next_in() -> None:
    permits, stopped = RequestPermits(2), threading.Event()
    assert permits.acquire(stopped) and permits.acquire(stopped)
    assert not permits.acquire(stopped, timeout_s=0.2)  # full: the connection stops reading
    assert permits.in_flight == 2
    taken: list[bool] = []
    waiting = threading.Thread(target=lambda: taken.append(permits.acquire(stopped)))
    waiting.start()
    permits.release()
    waiting.join(10)
    assert taken == [True] and permits.in_flight == 2
    stopped.set()
    assert not permits.acquire(stopped)  # a stopped listener serves nothing more
    permits.release()
    permits.release()
    with pytest.raises(AssertionError, match="released twice"):
        permits.release()


# -- the limits of the moment ---------------------------------------------------------------------
def test_dynamic_limits_follow_the_image_over_the_node_config_file() -> None:
    images = [MetadataImage()]
    resolved = {"kafka-client.example": ["10.0.0.7", "10.0.0.8"]}
    limits = DynamicConnectionLimits(
        lambda: images[0], 1, {"max.connections.per.ip": "3"},
        resolve=lambda host: resolved.get(host, [host]),
    )  # fmt: skip
    assert limits() == ConnectionLimits(max_connections_per_ip=3)
    assert limits() is limits()  # read again only when the image changes
    images[0] = MetadataImage(configs={
        (BROKER, ""): {"max.connections.per.ip": "4", "max.connections": "100"},
        (BROKER, "1"): {"max.connections.per.ip.overrides": "kafka-client.example:9"},
    })  # fmt: skip
    assert limits() == ConnectionLimits(100, 4, MappingProxyType({"10.0.0.7": 9, "10.0.0.8": 9}))
    other = broker_config(images[0], 2, {})  # broker 2 has only the cluster-wide values
    assert (other.max_connections_per_ip, other.max_connections_per_ip_overrides) == (4, "")


def test_an_override_host_is_an_address_or_what_it_resolves_to() -> None:
    assert resolve_host("127.0.0.142") == ["127.0.0.142"]
    assert "127.0.0.1" in resolve_host("localhost")
    assert resolve_host("no-such-host.invalid") == []


# -- node config ----------------------------------------------------------------------------------
def test_node_config_takes_kafkas_names_and_defaults() -> None:
    config = NodeConfig.parse(NODE)
    assert config.listener_limits == ListenerLimits(104857600, 500, 600000)
    assert "max.connections" not in config.static_broker_configs  # Kafka's default applies
    tuned = NodeConfig.parse({
        **NODE, "socket.request.max.bytes": 1024, "queued.max.requests": 8,
        "connections.max.idle.ms": -1, "max.connections": 50, "max.connections.per.ip": 0,
        "max.connections.per.ip.overrides": "127.0.0.142:3",
    })  # fmt: skip
    assert tuned.listener_limits == ListenerLimits(1024, 8, -1)
    assert tuned.listener_limits.idle_timeout_s is None
    assert tuned.static_broker_configs == {
        "max.connections": "50", "max.connections.per.ip": "0",
        "max.connections.per.ip.overrides": "127.0.0.142:3",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("socket.request.max.bytes", 0, "socket.request.max.bytes"),
        ("queued.max.requests", 0, "queued.max.requests"),
        ("connections.max.idle.ms", -2, "connections.max.idle.ms"),
        ("max.connections.per.ip", 0, "can be set to zero only if"),
        ("max.connections.per.ip.overrides", "127.0.0.1", "not host:count"),
    ],
)
def test_node_config_refuses_bad_limits(key: str, value: object, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        NodeConfig.parse({**NODE, key: value})


# -- socket.request.max.bytes ---------------------------------------------------------------------
def test_a_frame_over_socket_request_max_bytes_is_refused_before_its_body_is_read() -> None:
    server, client = socket.socketpair()
    with server, client:
        client.sendall(struct.pack(">i", 2**31 - 1) + b"only a few bytes")  # claims 2 GiB
        with pytest.raises(kc.FrameError, match=r"size = 2147483647 larger than 1024"):
            _read_frame(server, 1024)
        assert server.recv(64) == b"only a few bytes"  # nothing of the body was read
        client.sendall(struct.pack(">i", 1024) + bytes(1024))
        assert _read_frame(server, 1024) == bytes(1024)  # the limit itself is allowed


# -- the gRPC BROKER listener ---------------------------------------------------------------------
def test_grpc_options_carry_the_same_limits() -> None:
    config = NodeConfig.parse({
        **NODE, "socket.request.max.bytes": 2048, "queued.max.requests": 16,
        "connections.max.idle.ms": 30_000, "max.connections": 40,
    })  # fmt: skip
    settings = BrokerSettings(
        broker_id=1, host="127.0.0.1", port=9092, rack=None, cluster_id="c",
        controller_addresses=[],
        heartbeat_interval_ms=1000, controlled_shutdown_timeout_ms=1000,
        replica=ReplicaManagerConfig(
            static_broker_configs=tuple(config.static_broker_configs.items())
        ),
        fetcher=FetcherConfig(),
        kafka_limits=config.listener_limits,
    )  # fmt: skip
    assert dict(grpc_limits(settings)) == {
        "grpc.max_receive_message_length": 2048,
        "grpc.max_concurrent_streams": 16,
        "grpc.max_connection_idle_ms": 30_000,
        "grpc.max_allowed_incoming_connections": 40,
    }
