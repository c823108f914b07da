"""A node's configuration: a pydantic model with Kafka's dotted names, from TOML + environment.

```toml
"node.id" = 1
"process.roles" = "controller,broker"
"controller.quorum.voters" = "1@127.0.0.11:9093,2@127.0.0.12:9093,3@127.0.0.13:9093"
"listeners" = "CONTROLLER://127.0.0.11:9093"
"log.dirs" = ".raftlog/cluster/node-1"
```

Environment variables override file values: ``RAFTLOG_NODE_ID=2`` sets ``node.id`` (upper case,
dots as underscores, ``RAFTLOG_`` prefix). Every number has bounds, unknown keys are refused, and
an error names the key.

The voters string names each controller's CONTROLLER listener (gRPC), as Kafka's does. The Raft
transport between controllers listens on the same host at that port plus
``controller.quorum.raft.port.offset`` (default 1).

Instead of the voters, a node may name ``controller.quorum.bootstrap.servers`` (KIP-853, Kafka
3.9): some controllers' CONTROLLER addresses, ``host:port,...``, through which it finds the
running quorum and learns its voters from the metadata (exactly one of the two). A broker uses
them as its first controller addresses; a controller that is not yet a voter asks them who votes
and waits, an observer, until ``raftlog quorum add-controller`` adds it. A quorum's first
controllers take ``controller.quorum.voters``: bootstrap servers need a quorum that runs.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dataplane.broker.replica_selector import RACK_AWARE_REPLICA_SELECTOR, REPLICA_SELECTORS
from dataplane.kafka.connection_limits import (
    CONNECTIONS_MAX_IDLE_MS_DEFAULT,
    QUEUED_MAX_REQUESTS_DEFAULT,
    SOCKET_REQUEST_MAX_BYTES_DEFAULT,
    ListenerLimits,
)
from metadata_quorum.configs import BROKER_KEYS, validate_broker_log_configs
from metadata_quorum.connection_configs import (
    PER_IP_OVERRIDES_MAX_CHARS,
    check_per_ip_limits,
    parse_per_ip_overrides,
)
from metadata_quorum.group_configs import BROKER_SYNONYMS as GROUP_BROKER_SYNONYMS
from metadata_quorum.group_configs import GroupConfigBounds, GroupConfigs, GroupRules
from metadata_quorum.grpc_standard import Keepalive
from metadata_quorum.security.authorization import STANDARD_AUTHORIZERS, AuthorizerSettings
from metadata_quorum.security.channels import ClientSecurity
from metadata_quorum.security.grpc_auth import CredentialLookup, GrpcAuthenticator, ServerSecurity
from metadata_quorum.security.node_cert import NODE_CERT_MECHANISM
from metadata_quorum.security.principal import PrincipalMappingRules
from metadata_quorum.security.tls import ClientAuth, TlsSettings
from metadata_quorum.service import Voter
from metadata_quorum.topic_config_defs import BROKER_SYNONYMS
from raftlog.config import INT64_MAX, ConfigError, describe_validation_error

ENV_PREFIX = "RAFTLOG_"
ROLES = frozenset({"controller", "broker"})


def _property(value: Any) -> str:
    """A config file's value (TOML may type it) as Kafka's property string."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse_listeners(value: str) -> dict[str, tuple[str, int]]:
    """``"CONTROLLER://127.0.0.11:9093,BROKER://127.0.0.11:9092"`` → {name: (host, port)}."""
    out: dict[str, tuple[str, int]] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        name, sep, rest = part.partition("://")
        host, colon, port = rest.rpartition(":")
        if not sep or not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"listener {part!r} is not NAME://host:port")
        if name in out:
            raise ValueError(f"listener {name} is given twice")
        out[name.upper()] = (host, int(port))
    return out


SECURITY_PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
SASL_MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"})


def parse_security_protocol_map(value: str) -> dict[str, str]:
    """``"KAFKA:SASL_SSL,BROKER:SSL"`` → {listener: protocol}."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        name, colon, protocol = part.partition(":")
        if not colon or not name or protocol.upper() not in SECURITY_PROTOCOLS:
            raise ValueError(
                f"listener.security.protocol.map: {part!r} is not LISTENER:PROTOCOL with "
                f"PROTOCOL one of {sorted(SECURITY_PROTOCOLS)}"
            )
        out[name.upper()] = protocol.upper()
    return out


def parse_bootstrap_servers(value: str) -> list[str]:
    """``"127.0.0.11:9093,127.0.0.12:9093"`` → the addresses, each host:port, in order."""
    servers: list[str] = []
    for part in filter(None, (p.strip() for p in value.split(","))):
        host, colon, port = part.rpartition(":")
        if not host or not colon or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bootstrap server {part!r} is not host:port")
        if part in servers:
            raise ValueError(f"bootstrap server {part} is given twice")
        servers.append(part)
    if not servers:
        raise ValueError("at least one bootstrap server is needed")
    return servers


def parse_voters(value: str, raft_port_offset: int) -> list[Voter]:
    """``"1@127.0.0.11:9093,2@127.0.0.12:9093"`` → voters, ordered by node id."""
    voters: dict[int, Voter] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        node, at, address = part.partition("@")
        host, colon, port = address.rpartition(":")
        if not at or not node.isdigit() or not colon or not port.isdigit():
            raise ValueError(f"voter {part!r} is not id@host:port")
        node_id = int(node)
        if node_id in voters:
            raise ValueError(f"voter {node_id} is given twice")
        voters[node_id] = Voter(node_id, host, int(port), int(port) + raft_port_offset)
    if not voters:
        raise ValueError("at least one voter is needed")
    return [voters[k] for k in sorted(voters)]


class NodeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    node_id: int = Field(alias="node.id", ge=0, le=2**31 - 1)
    process_roles: frozenset[str] = Field(alias="process.roles", min_length=1)
    # exactly one of the two (see the module docstring)
    controller_quorum_voters: str | None = Field(
        None, alias="controller.quorum.voters", min_length=1
    )
    controller_quorum_bootstrap_servers: str | None = Field(
        None, alias="controller.quorum.bootstrap.servers", min_length=1
    )
    controller_quorum_raft_port_offset: int = Field(
        1, alias="controller.quorum.raft.port.offset", ge=1, le=1000
    )
    listeners: str = Field(alias="listeners", min_length=1)
    log_dirs: Path = Field(alias="log.dirs")
    cluster_id: str = Field("raftlog-local", alias="cluster.id", min_length=1, max_length=64)
    broker_session_timeout_ms: int = Field(
        9000, alias="broker.session.timeout.ms", ge=100, le=3_600_000
    )
    broker_heartbeat_interval_ms: int = Field(
        2000, alias="broker.heartbeat.interval.ms", ge=10, le=600_000
    )
    leader_imbalance_check_interval_seconds: int = Field(
        300, alias="leader.imbalance.check.interval.seconds", ge=1, le=86_400
    )
    controller_quorum_election_timeout_ms: int = Field(
        600, alias="controller.quorum.election.timeout.ms", ge=50, le=10_000
    )
    # Not a Kafka setting: CPython's thread switch interval (sys.setswitchinterval), in
    # microseconds. A thread that waits for the GIL gets it after at most this long per busy
    # thread ahead of it, each time a system call gave it up: the Raft tick thread makes several
    # per tick, so at CPython's 5,000 the busy threads of a node hosting thousands of partitions
    # delayed its heartbeats past the election timeout (docs/operations.md#many-partitions).
    gil_switch_interval_us: int = Field(1000, alias="gil.switch.interval.us", ge=100, le=100_000)
    # Not a Kafka setting: how often CPython's garbage collector visits every object (a full
    # scan). Between full scans the survivors of each collection are frozen (gc.freeze), which
    # no collection visits; 0 leaves CPython's collector as it is, whose full collections at
    # 10,000 partitions paused a node 400-1,190 ms every 7-17 s (dataplane/broker/gc_pauses.py).
    gc_full_scan_interval_ms: int = Field(
        600_000, alias="gc.full.scan.interval.ms", ge=0, le=86_400_000
    )

    broker_rack: str | None = Field(None, alias="broker.rack", min_length=1, max_length=255)
    # Not a Kafka setting (Redpanda's console idea, issue 33): HTTP://host:port of the web
    # console this node serves (dataplane/console); unset, none
    console_listener: str | None = Field(None, alias="console.listener", min_length=1)
    # how often the console samples offsets, groups and ISRs for its charts (an hour is kept)
    console_sample_interval_ms: int = Field(
        10_000, alias="console.sample.interval.ms", ge=100, le=600_000
    )
    # a Connect worker's REST API whose connectors and mirrors the console shows
    console_connect_url: str | None = Field(
        None, alias="console.connect.url", pattern=r"^https?://[^/\s]+/?$"
    )
    # KIP-392: which replica a consumer that sends its rack reads from (None: the leader)
    replica_selector_class: str | None = Field(None, alias="replica.selector.class")
    # KIP-227: fetch sessions each listener keeps, the KAFKA listener's for consumers, the
    # BROKER listener's for followers (0: none, every fetch is full)
    max_incremental_fetch_session_cache_slots: int = Field(
        1000, alias="max.incremental.fetch.session.cache.slots", ge=0, le=1_000_000
    )
    replica_lag_time_max_ms: int = Field(
        30_000, alias="replica.lag.time.max.ms", ge=100, le=3_600_000
    )
    replica_fetch_wait_max_ms: int = Field(500, alias="replica.fetch.wait.max.ms", ge=0, le=60_000)
    # a follower's fetch gives up after this (Kafka's: at least replica.fetch.wait.max.ms)
    replica_socket_timeout_ms: int = Field(
        30_000, alias="replica.socket.timeout.ms", ge=1_000, le=3_600_000
    )
    replica_fetch_max_bytes: int = Field(
        1024 * 1024, alias="replica.fetch.max.bytes", ge=1024, le=64 * 1024 * 1024
    )
    replica_fetch_response_max_bytes: int = Field(
        10 * 1024 * 1024, alias="replica.fetch.response.max.bytes", ge=1024, le=100 * 1024 * 1024
    )
    log_retention_check_interval_ms: int = Field(
        300_000, alias="log.retention.check.interval.ms", ge=100, le=86_400_000
    )
    # Auto-created topics (dataplane/kafka/auto_create.py): a Kafka client's Metadata request
    # naming a missing topic creates it with these sizes (a cluster-wide value set through the
    # controller wins over this file's); Kafka's names, defaults and bounds (short RF)
    auto_create_topics_enable: bool = Field(True, alias="auto.create.topics.enable")
    num_partitions: int = Field(1, alias="num.partitions", ge=1, le=100_000)
    default_replication_factor: int = Field(1, alias="default.replication.factor", ge=1, le=32_767)
    # Dynamic broker configs given statically (Kafka's STATIC_BROKER_CONFIG): they apply from
    # start, below any value set through the controller (see metadata_quorum.configs). None:
    # not set here (Kafka's default, 2^63-1 bytes/s, is unthrottled).
    leader_replication_throttled_rate: int | None = Field(
        None, alias="leader.replication.throttled.rate", ge=0, le=INT64_MAX
    )
    follower_replication_throttled_rate: int | None = Field(
        None, alias="follower.replication.throttled.rate", ge=0, le=INT64_MAX
    )
    # Kafka's connection limits, dynamic too (None: not set here; Kafka's default, 2^31-1, is
    # unlimited), and the KAFKA listener's static ones: dataplane/kafka/connection_limits.py
    max_connections: int | None = Field(None, alias="max.connections", ge=0, le=2**31 - 1)
    max_connections_per_ip: int | None = Field(
        None, alias="max.connections.per.ip", ge=0, le=2**31 - 1
    )
    max_connections_per_ip_overrides: str | None = Field(
        None, alias="max.connections.per.ip.overrides", max_length=PER_IP_OVERRIDES_MAX_CHARS
    )
    socket_request_max_bytes: int = Field(
        SOCKET_REQUEST_MAX_BYTES_DEFAULT, alias="socket.request.max.bytes", ge=1, le=2**31 - 1
    )
    queued_max_requests: int = Field(
        QUEUED_MAX_REQUESTS_DEFAULT, alias="queued.max.requests", ge=1, le=2**31 - 1
    )
    connections_max_idle_ms: int = Field(
        CONNECTIONS_MAX_IDLE_MS_DEFAULT, alias="connections.max.idle.ms", ge=-1, le=INT64_MAX
    )
    # The schema registry (docs/schema-registry.md): Confluent's REST API on this address,
    # HTTP://host:port (Redpanda's port is 8081), served by a broker; unset, no registry
    schema_registry_listener: str | None = Field(None, alias="schema.registry.listener")
    schema_registry_timeout_ms: int = Field(
        30_000, alias="schema.registry.timeout.ms", ge=100, le=600_000
    )

    @model_validator(mode="after")
    def _schema_registry(self) -> NodeConfig:
        self.schema_registry_address()
        return self

    def schema_registry_address(self) -> tuple[str, int] | None:
        """``schema.registry.listener`` as (host, port), None when unset."""
        if self.schema_registry_listener is None:
            return None
        listener = parse_listeners(self.schema_registry_listener)
        if list(listener) != ["HTTP"]:
            raise ValueError(
                f"schema.registry.listener: {self.schema_registry_listener!r} is not "
                "HTTP://host:port"
            )
        return listener["HTTP"]

    @model_validator(mode="after")
    def _replica_socket_timeout(self) -> NodeConfig:
        """Kafka's rule: a fetch must not time out while the leader may still be holding it."""
        if self.replica_socket_timeout_ms < self.replica_fetch_wait_max_ms:
            raise ValueError(
                f"replica.socket.timeout.ms {self.replica_socket_timeout_ms} must be at least "
                f"replica.fetch.wait.max.ms {self.replica_fetch_wait_max_ms}"
            )
        return self

    @model_validator(mode="after")
    def _connection_limits(self) -> NodeConfig:
        """max.connections.per.ip.overrides as Kafka reads it; a per-IP limit of 0 needs it."""
        overrides = self.max_connections_per_ip_overrides or ""
        parse_per_ip_overrides(overrides)
        if self.max_connections_per_ip is not None:
            check_per_ip_limits(self.max_connections_per_ip, overrides)
        return self

    # gRPC keepalive of the BROKER and CONTROLLER listeners (not Kafka settings: gRPC's own
    # options, dotted; metadata_quorum.grpc_standard.Keepalive, docs/api.md)
    grpc_keepalive_time_ms: int = Field(
        60_000, alias="grpc.keepalive.time.ms", ge=1_000, le=7_200_000
    )
    grpc_keepalive_timeout_ms: int = Field(
        20_000, alias="grpc.keepalive.timeout.ms", ge=1_000, le=600_000
    )
    grpc_http2_min_ping_interval_without_data_ms: int = Field(
        10_000, alias="grpc.http2.min.ping.interval.without.data.ms", ge=1_000, le=7_200_000
    )
    grpc_keepalive_permit_without_calls: bool = Field(
        True, alias="grpc.keepalive.permit.without.calls"
    )
    grpc_http2_max_ping_strikes: int = Field(2, alias="grpc.http2.max.ping.strikes", ge=0, le=100)

    @property
    def keepalive(self) -> Keepalive:
        return Keepalive(
            time_ms=self.grpc_keepalive_time_ms,
            timeout_ms=self.grpc_keepalive_timeout_ms,
            min_ping_interval_without_data_ms=self.grpc_http2_min_ping_interval_without_data_ms,
            permit_without_calls=self.grpc_keepalive_permit_without_calls,
            max_ping_strikes=self.grpc_http2_max_ping_strikes,
        )

    @property
    def listener_limits(self) -> ListenerLimits:
        """The KAFKA listener's static limits."""
        return ListenerLimits(
            self.socket_request_max_bytes, self.queued_max_requests, self.connections_max_idle_ms
        )

    # Not a Kafka setting: the bytes at the end of each partition's log kept in the page cache;
    # older ones are written back and dropped from it (raftlog.log.Log.release_page_cache).
    # 0 leaves the page cache to the kernel, as Kafka does.
    log_cache_tail_bytes: int = Field(
        64 * 1024 * 1024, alias="log.cache.tail.bytes", ge=0, le=2**50
    )
    # The topic configs' broker defaults this file sets (Kafka's synonyms: log.retention.hours,
    # log.roll.ms, compression.type, ...; metadata_quorum.topic_config_defs), as strings: this
    # broker applies them to its topics below any dynamic value (STATIC_BROKER_CONFIG) and
    # registers them, so DescribeConfigs shows them. Given as top-level keys, gathered here.
    topic_config_defaults: dict[str, str] = Field(
        default_factory=dict, alias="topic.config.defaults"
    )

    @model_validator(mode="before")
    @classmethod
    def _gather_topic_config_defaults(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or not BROKER_SYNONYMS.keys() & data.keys():
            return data
        given = {k: v for k, v in data.items() if k not in BROKER_SYNONYMS}
        gathered = {k: _property(v) for k, v in data.items() if k in BROKER_SYNONYMS}
        return {**given, "topic.config.defaults": gathered}

    @field_validator("topic_config_defaults")
    @classmethod
    def _valid_topic_config_defaults(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - BROKER_SYNONYMS.keys())
        if unknown:
            raise ValueError(f"not a topic config default: {', '.join(unknown)}")
        try:
            validate_broker_log_configs(value)
        except ConfigError as error:
            raise ValueError(error.message) from error
        return value

    # Fault injection for chaos tests, never for production: every Nth Produce request (acks 1
    # or all) is served in full and its response then never sent (0 = off). See
    # dataplane.broker.service.ProduceResponseDropper.
    fault_produce_drop_response_every: int = Field(
        0, alias="fault.produce.drop.response.every", ge=0, le=1_000_000
    )
    controlled_shutdown_timeout_ms: int = Field(
        30_000, alias="controlled.shutdown.timeout.ms", ge=0, le=600_000
    )
    group_consumer_session_timeout_ms: int = Field(
        45_000, alias="group.consumer.session.timeout.ms", ge=100, le=3_600_000
    )
    group_consumer_heartbeat_interval_ms: int = Field(
        5_000, alias="group.consumer.heartbeat.interval.ms", ge=10, le=3_600_000
    )
    group_consumer_max_size: int = Field(
        2**31 - 1, alias="group.consumer.max.size", ge=1, le=2**31 - 1
    )
    # share groups' membership (KIP-932, ShareGroupHeartbeat): Kafka's ShareGroupConfig bounds
    group_share_session_timeout_ms: int = Field(
        45_000, alias="group.share.session.timeout.ms", ge=100, le=3_600_000
    )
    group_share_heartbeat_interval_ms: int = Field(
        5_000, alias="group.share.heartbeat.interval.ms", ge=10, le=3_600_000
    )
    group_share_max_size: int = Field(200, alias="group.share.max.size", ge=1, le=1000)
    # classic (JoinGroup/SyncGroup) groups: the member names its session timeout within these
    group_min_session_timeout_ms: int = Field(
        6_000, alias="group.min.session.timeout.ms", ge=1, le=3_600_000
    )
    group_max_session_timeout_ms: int = Field(
        1_800_000, alias="group.max.session.timeout.ms", ge=1, le=3_600_000
    )
    group_initial_rebalance_delay_ms: int = Field(
        3_000, alias="group.initial.rebalance.delay.ms", ge=0, le=600_000
    )
    group_max_size: int = Field(2**31 - 1, alias="group.max.size", ge=1, le=2**31 - 1)
    # the bounds of groups' own timeouts (Kafka 4's group configs: consumer.session.timeout.ms,
    # ...; metadata_quorum/group_configs.py), Kafka's defaults. The broker's own defaults above
    # are not held to them (raftlog's test clusters run shorter sessions).
    group_consumer_min_session_timeout_ms: int = Field(
        45_000, alias="group.consumer.min.session.timeout.ms", ge=1, le=2**31 - 1
    )
    group_consumer_max_session_timeout_ms: int = Field(
        60_000, alias="group.consumer.max.session.timeout.ms", ge=1, le=2**31 - 1
    )
    group_consumer_min_heartbeat_interval_ms: int = Field(
        5_000, alias="group.consumer.min.heartbeat.interval.ms", ge=1, le=2**31 - 1
    )
    group_consumer_max_heartbeat_interval_ms: int = Field(
        15_000, alias="group.consumer.max.heartbeat.interval.ms", ge=1, le=2**31 - 1
    )
    group_share_min_session_timeout_ms: int = Field(
        45_000, alias="group.share.min.session.timeout.ms", ge=1, le=2**31 - 1
    )
    group_share_max_session_timeout_ms: int = Field(
        60_000, alias="group.share.max.session.timeout.ms", ge=1, le=2**31 - 1
    )
    group_share_min_heartbeat_interval_ms: int = Field(
        5_000, alias="group.share.min.heartbeat.interval.ms", ge=1, le=2**31 - 1
    )
    group_share_max_heartbeat_interval_ms: int = Field(
        15_000, alias="group.share.max.heartbeat.interval.ms", ge=1, le=2**31 - 1
    )
    group_share_min_record_lock_duration_ms: int = Field(
        15_000, alias="group.share.min.record.lock.duration.ms", ge=1_000, le=30_000
    )
    group_share_max_record_lock_duration_ms: int = Field(
        60_000, alias="group.share.max.record.lock.duration.ms", ge=30_000, le=3_600_000
    )
    offsets_topic_num_partitions: int = Field(
        50, alias="offsets.topic.num.partitions", ge=1, le=10_000
    )
    offsets_topic_replication_factor: int = Field(
        3, alias="offsets.topic.replication.factor", ge=1, le=32_767
    )
    offsets_topic_segment_bytes: int = Field(
        100 * 1024 * 1024, alias="offsets.topic.segment.bytes", ge=1024, le=2**31 - 1
    )
    offsets_retention_minutes: int = Field(
        10_080, alias="offsets.retention.minutes", ge=1, le=2**31 - 1
    )
    offsets_retention_check_interval_ms: int = Field(
        600_000, alias="offsets.retention.check.interval.ms", ge=100, le=86_400_000
    )
    offset_metadata_max_bytes: int = Field(
        4096, alias="offset.metadata.max.bytes", ge=0, le=1024 * 1024
    )
    offsets_commit_timeout_ms: int = Field(
        5_000, alias="offsets.commit.timeout.ms", ge=1, le=600_000
    )
    # the transaction coordinator (dataplane.coordinator.transaction_coordinator)
    transaction_state_log_num_partitions: int = Field(
        50, alias="transaction.state.log.num.partitions", ge=1, le=10_000
    )
    transaction_state_log_replication_factor: int = Field(
        3, alias="transaction.state.log.replication.factor", ge=1, le=32_767
    )
    transaction_state_log_min_isr: int = Field(
        2, alias="transaction.state.log.min.isr", ge=1, le=32_767
    )
    transaction_state_log_segment_bytes: int = Field(
        100 * 1024 * 1024, alias="transaction.state.log.segment.bytes", ge=1024, le=2**31 - 1
    )
    transaction_max_timeout_ms: int = Field(
        900_000, alias="transaction.max.timeout.ms", ge=1, le=2**31 - 1
    )
    transactional_id_expiration_ms: int = Field(
        7 * 24 * 3600 * 1000, alias="transactional.id.expiration.ms", ge=1, le=2**31 - 1
    )
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = Field(
        10_000, alias="transaction.abort.timed.out.transaction.cleanup.interval.ms", ge=1,
        le=2**31 - 1,
    )  # fmt: skip
    transaction_remove_expired_transaction_cleanup_interval_ms: int = Field(
        3_600_000, alias="transaction.remove.expired.transaction.cleanup.interval.ms", ge=1,
        le=2**31 - 1,
    )  # fmt: skip
    # share groups (KIP-932): the share partitions a leader serves (bounds as Kafka's
    # ShareGroupConfig), and the share coordinator over __share_group_state
    group_share_record_lock_duration_ms: int = Field(
        30_000, alias="group.share.record.lock.duration.ms", ge=1_000, le=3_600_000
    )
    group_share_delivery_count_limit: int = Field(
        5, alias="group.share.delivery.count.limit", ge=2, le=10
    )
    group_share_partition_max_record_locks: int = Field(
        2_000, alias="group.share.partition.max.record.locks", ge=100, le=10_000
    )
    group_share_max_share_sessions: int = Field(
        2_000, alias="group.share.max.share.sessions", ge=1, le=100_000
    )
    share_coordinator_state_topic_num_partitions: int = Field(
        50, alias="share.coordinator.state.topic.num.partitions", ge=1, le=10_000
    )
    share_coordinator_state_topic_replication_factor: int = Field(
        3, alias="share.coordinator.state.topic.replication.factor", ge=1, le=32_767
    )
    share_coordinator_state_topic_min_isr: int = Field(
        2, alias="share.coordinator.state.topic.min.isr", ge=1, le=32_767
    )
    share_coordinator_state_topic_segment_bytes: int = Field(
        100 * 1024 * 1024, alias="share.coordinator.state.topic.segment.bytes", ge=1024,
        le=2**31 - 1,
    )  # fmt: skip
    share_coordinator_write_timeout_ms: int = Field(
        5_000, alias="share.coordinator.write.timeout.ms", ge=1, le=600_000
    )
    # updates written between two snapshots of a share partition's state (0: only snapshots)
    share_coordinator_snapshot_update_records_per_snapshot: int = Field(
        500, alias="share.coordinator.snapshot.update.records.per.snapshot", ge=0, le=100_000
    )

    # -- security (docs/security.md) ---------------------------------------------------------
    # listener name -> PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; a listener not named is
    # PLAINTEXT. BROKER and CONTROLLER take PLAINTEXT, SSL or SASL_SSL (nodes authenticate to
    # each other by certificate, so a SASL gRPC listener needs TLS).
    listener_security_protocol_map: str = Field(
        "CONTROLLER:PLAINTEXT,BROKER:PLAINTEXT,KAFKA:PLAINTEXT,METRICS:PLAINTEXT",
        alias="listener.security.protocol.map",
    )
    # PEM files: the keystore holds this node's private key and certificate chain, the
    # truststore the CA certificates it trusts (for client certificates and for the other nodes)
    ssl_keystore_location: Path | None = Field(None, alias="ssl.keystore.location")
    ssl_keystore_type: Literal["PEM"] = Field("PEM", alias="ssl.keystore.type")
    ssl_key_password: str | None = Field(None, alias="ssl.key.password", min_length=1)
    ssl_truststore_location: Path | None = Field(None, alias="ssl.truststore.location")
    ssl_truststore_type: Literal["PEM"] = Field("PEM", alias="ssl.truststore.type")
    ssl_client_auth: ClientAuth = Field("none", alias="ssl.client.auth")
    # Kafka's per-listener overrides, listener.name.<listener in lower case>.ssl.client.auth:
    # one field per listener raftlog has (the model forbids unknown keys); unset, a listener
    # takes ssl.client.auth. See `client_auth`.
    listener_name_controller_ssl_client_auth: ClientAuth | None = Field(
        None, alias="listener.name.controller.ssl.client.auth"
    )
    listener_name_broker_ssl_client_auth: ClientAuth | None = Field(
        None, alias="listener.name.broker.ssl.client.auth"
    )
    listener_name_kafka_ssl_client_auth: ClientAuth | None = Field(
        None, alias="listener.name.kafka.ssl.client.auth"
    )
    listener_name_metrics_ssl_client_auth: ClientAuth | None = Field(
        None, alias="listener.name.metrics.ssl.client.auth"
    )
    ssl_principal_mapping_rules: str = Field(
        "DEFAULT", alias="ssl.principal.mapping.rules", min_length=1
    )
    sasl_enabled_mechanisms: str = Field(
        "SCRAM-SHA-256,SCRAM-SHA-512", alias="sasl.enabled.mechanisms", min_length=1
    )
    connections_max_reauth_ms: int = Field(0, alias="connections.max.reauth.ms", ge=0, le=2**63 - 1)
    authorizer_class_name: str = Field("", alias="authorizer.class.name")
    super_users: str = Field("", alias="super.users")
    allow_everyone_if_no_acl_found: bool = Field(False, alias="allow.everyone.if.no.acl.found")
    # Not a Kafka setting (KRaft's Raft rides the CONTROLLER listener): a file holding the
    # shared secret that encrypts and authenticates the Raft transport between controllers,
    # for quorums whose CONTROLLER listener has no TLS
    controller_quorum_raft_secret_file: Path | None = Field(
        None, alias="controller.quorum.raft.secret.file"
    )
    # Not a Kafka setting either: what protects that transport. "encryption": the secret above
    # (plaintext without one); "tls": TLS 1.3 with mutual certificates, this node's
    # ssl.keystore.location / ssl.truststore.location, peers that are nodes (super.users).
    # Unset: as Kafka, the CONTROLLER listener's protocol decides (`raft_transport_security`).
    # docs/security.md#raft-transport
    controller_quorum_raft_transport_security: Literal["encryption", "tls"] | None = Field(
        None, alias="controller.quorum.raft.transport.security"
    )

    @model_validator(mode="after")
    def _security_settings(self) -> NodeConfig:
        protocols = parse_security_protocol_map(self.listener_security_protocol_map)
        for name in ("BROKER", "CONTROLLER"):
            if protocols.get(name) == "SASL_PLAINTEXT":
                raise ValueError(
                    f"listener.security.protocol.map: {name} cannot be SASL_PLAINTEXT (nodes "
                    "authenticate to each other by certificate): use SSL or SASL_SSL"
                )
        if protocols.get("METRICS", "PLAINTEXT") not in ("PLAINTEXT", "SSL"):
            raise ValueError(
                f"listener.security.protocol.map: METRICS cannot be {protocols['METRICS']} (it "
                "serves HTTP, with no SASL): use PLAINTEXT or SSL"
            )
        tls = [n for n in self.listener_map if protocols.get(n, "PLAINTEXT").endswith("SSL")]
        if tls and self.ssl_keystore_location is None:
            raise ValueError(f"listeners {tls} use TLS: ssl.keystore.location must name a PEM file")
        if tls and self.ssl_truststore_location is None:
            raise ValueError(
                f"listeners {tls} use TLS: ssl.truststore.location must name the CA's PEM file"
            )
        self._raft_transport_settings()
        mechanisms = set(self.sasl_mechanisms)
        if not mechanisms or not mechanisms <= SASL_MECHANISMS:
            raise ValueError(
                f"sasl.enabled.mechanisms: {sorted(mechanisms - SASL_MECHANISMS)} unsupported; "
                f"use some of {sorted(SASL_MECHANISMS)}"
            )
        PrincipalMappingRules(self.ssl_principal_mapping_rules)
        if self.authorizer_class_name and self.authorizer_class_name not in STANDARD_AUTHORIZERS:
            raise ValueError(
                f"authorizer.class.name: {self.authorizer_class_name!r} is unknown; use "
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer (or empty for none)"
            )
        AuthorizerSettings.parse(self.super_users, self.allow_everyone_if_no_acl_found)
        return self

    def _raft_transport_settings(self) -> None:
        if self.raft_transport_security != "tls" or "controller" not in self.process_roles:
            return  # a broker-only node runs no Raft
        given = self.controller_quorum_raft_transport_security
        why = (
            "controller.quorum.raft.transport.security=tls" if given == "tls"
            else f"the CONTROLLER listener is {self.security_protocol('CONTROLLER')}, so the Raft "
            "transport uses TLS"
        )  # fmt: skip
        if self.ssl_keystore_location is None or self.ssl_truststore_location is None:
            raise ValueError(
                f"{why}: ssl.keystore.location and ssl.truststore.location must name the node's "
                "PEM keystore and the CA's PEM file"
            )
        if self.controller_quorum_raft_secret_file is not None:
            raise ValueError(
                f"{why}, not controller.quorum.raft.secret.file: remove the secret file (or set "
                "controller.quorum.raft.transport.security=encryption to use it instead)"
            )
        authorizer = self.authorizer_settings
        if authorizer is not None and not authorizer.super_users:
            raise ValueError(
                f"{why}: with an authorizer a Raft peer must be a super user, and super.users "
                "names none: add the controllers' principals (User:node-1;...)"
            )

    @property
    def raft_transport_security(self) -> Literal["plaintext", "encryption", "tls"]:
        """What protects the Raft transport. As Kafka secures the quorum's traffic with the
        CONTROLLER listener's protocol: TLS when that listener is SSL or SASL_SSL and the node
        has a keystore and a truststore, unless controller.quorum.raft.transport.security says
        otherwise; "encryption" is the secret file's (plaintext without one)."""
        setting = self.controller_quorum_raft_transport_security
        if setting is None:
            tls_listener = self.security_protocol("CONTROLLER") in ("SSL", "SASL_SSL")
            stores = self.ssl_keystore_location and self.ssl_truststore_location
            setting = "tls" if tls_listener and stores else "encryption"
        if setting == "encryption" and self.controller_quorum_raft_secret_file is None:
            return "plaintext"
        return setting

    @property
    def security_protocols(self) -> dict[str, str]:
        """Each listener's security protocol (PLAINTEXT where the map is silent)."""
        protocols = parse_security_protocol_map(self.listener_security_protocol_map)
        return {name: protocols.get(name, "PLAINTEXT") for name in self.listener_map}

    def security_protocol(self, listener: str) -> str:
        return parse_security_protocol_map(self.listener_security_protocol_map).get(
            listener, "PLAINTEXT"
        )

    def client_auth(self, listener: str) -> ClientAuth:
        """The listener's ``ssl.client.auth``: its ``listener.name.<listener>.ssl.client.auth``
        override if set (Kafka's per-listener form), else the node-wide setting."""
        overrides: dict[str, ClientAuth | None] = {
            "CONTROLLER": self.listener_name_controller_ssl_client_auth,
            "BROKER": self.listener_name_broker_ssl_client_auth,
            "KAFKA": self.listener_name_kafka_ssl_client_auth,
            "METRICS": self.listener_name_metrics_ssl_client_auth,
        }
        return overrides.get(listener) or self.ssl_client_auth

    def tls_settings(self, listener: str) -> TlsSettings | None:
        """The TLS of this node's `listener` as a server (None unless SSL or SASL_SSL): the
        node's keystore and truststore, and the listener's ``ssl.client.auth``."""
        if self.security_protocol(listener) not in ("SSL", "SASL_SSL"):
            return None
        return TlsSettings(
            self.ssl_keystore_location, self.ssl_truststore_location,
            self.ssl_key_password, self.client_auth(listener),
        )  # fmt: skip

    @property
    def sasl_mechanisms(self) -> list[str]:
        return [m.strip() for m in self.sasl_enabled_mechanisms.split(",") if m.strip()]

    @property
    def principal_mapping_rules(self) -> PrincipalMappingRules:
        return PrincipalMappingRules(self.ssl_principal_mapping_rules)

    @property
    def authorizer_settings(self) -> AuthorizerSettings | None:
        """None when no authorizer is configured: every request is allowed."""
        if not self.authorizer_class_name:
            return None
        return AuthorizerSettings.parse(self.super_users, self.allow_everyone_if_no_acl_found)

    def _proves_certificate_by_exchange(self, listener: str) -> bool:
        """Whether nodes prove their certificate on gRPC `listener` with RAFTLOG-NODE-CERT:
        on SASL_SSL, and on SSL with ``ssl.client.auth=requested`` (grpcio cannot ask for an
        optional certificate in the handshake; ``required`` asks for it in TLS)."""
        protocol = self.security_protocol(listener)
        return protocol == "SASL_SSL" or (
            protocol == "SSL" and self.client_auth(listener) == "requested"
        )

    def node_client_security(self, listener: str) -> ClientSecurity | None:
        """How this node reaches another node's gRPC `listener` (BROKER or CONTROLLER; every
        node has the same listener.security.protocol.map): None over PLAINTEXT; else TLS with
        this node's keystore as its certificate, proven in TLS or by RAFTLOG-NODE-CERT."""
        protocol = self.security_protocol(listener)
        if protocol not in ("SSL", "SASL_SSL"):
            return None
        by_exchange = self._proves_certificate_by_exchange(listener)
        return ClientSecurity(
            security_protocol="SASL_SSL" if protocol == "SASL_SSL" else "SSL",
            ssl_ca_location=self.ssl_truststore_location,
            ssl_certificate_location=self.ssl_keystore_location,
            ssl_key_location=self.ssl_keystore_location,
            ssl_key_password=self.ssl_key_password,
            sasl_mechanism=NODE_CERT_MECHANISM if by_exchange else "SCRAM-SHA-512",
        )

    def server_security(
        self, listener: str, credentials: CredentialLookup
    ) -> ServerSecurity | None:
        """The TLS and authentication of this node's gRPC `listener`; None over PLAINTEXT
        (every call runs as the node itself, as before issue 28). `credentials` reads the SCRAM
        credentials of the node's current metadata image."""
        protocol = self.security_protocol(listener)
        if protocol == "PLAINTEXT":
            return None
        tls = self.tls_settings(listener)
        authorities = None
        if tls is not None and (protocol == "SASL_SSL" or tls.client_auth != "none"):
            authorities = tls.trusted()  # RAFTLOG-NODE-CERT is offered
        authenticator = GrpcAuthenticator(
            listener, protocol, self.sasl_mechanisms, self.connections_max_reauth_ms,
            self.principal_mapping_rules, credentials, certificate_authorities=authorities,
        )  # fmt: skip
        return ServerSecurity(tls, authenticator)

    @model_validator(mode="after")
    def _heartbeat_below_session(self) -> NodeConfig:
        if self.group_consumer_heartbeat_interval_ms >= self.group_consumer_session_timeout_ms:
            raise ValueError(
                "group.consumer.heartbeat.interval.ms must be below "
                "group.consumer.session.timeout.ms"
            )
        if self.group_share_heartbeat_interval_ms >= self.group_share_session_timeout_ms:
            raise ValueError(
                "group.share.heartbeat.interval.ms must be below group.share.session.timeout.ms"
            )
        return self

    @field_validator("process_roles", mode="before")
    @classmethod
    def _split_roles(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = frozenset(p.strip() for p in value.split(",") if p.strip())
        unknown = set(value) - ROLES
        if unknown:
            raise ValueError(f"unknown roles {sorted(unknown)}; use controller and/or broker")
        return value

    @field_validator("replica_selector_class")
    @classmethod
    def _check_replica_selector(cls, value: str | None) -> str | None:
        if value is not None and value not in REPLICA_SELECTORS:
            raise ValueError(f"unknown replica selector; use {RACK_AWARE_REPLICA_SELECTOR}")
        return value

    @field_validator("listeners")
    @classmethod
    def _check_listeners(cls, value: str) -> str:
        parse_listeners(value)
        return value

    @field_validator("console_listener")
    @classmethod
    def _check_console_listener(cls, value: str | None) -> str | None:
        if value is not None and list(parse_listeners(value)) not in (["HTTP"], ["HTTPS"]):
            raise ValueError(f"console.listener {value!r} is not HTTP:// or HTTPS://host:port")
        return value

    @field_validator("controller_quorum_voters")
    @classmethod
    def _check_voters(cls, value: str | None) -> str | None:
        if value is not None:
            parse_voters(value, 1)
        return value

    @field_validator("controller_quorum_bootstrap_servers")
    @classmethod
    def _check_bootstrap_servers(cls, value: str | None) -> str | None:
        if value is not None:
            parse_bootstrap_servers(value)
        return value

    @model_validator(mode="after")
    def _console_reads_through_own_broker(self) -> NodeConfig:
        """The console reads through this node's own BROKER listener: as a client without
        credentials on PLAINTEXT; on SASL_SSL each user logs in with their SCRAM name and
        password (dataplane/console/sessions.py), which must not cross the network in clear, so
        the console is served over HTTPS there. An SSL listener (certificates only) has no
        passwords to log in with: ``raftlog console --command-config`` serves that cluster."""
        if self.console_listener is None:
            return self
        if not self.is_broker or self.listener("BROKER") is None:
            raise ValueError("console.listener needs the broker role and a BROKER listener")
        protocol = self.security_protocol("BROKER")
        if protocol == "SSL":
            raise ValueError(
                "console.listener: users log in to the console with SCRAM, which an SSL BROKER "
                "listener (certificates only) has not; run raftlog console --command-config "
                "with a user's certificate instead"
            )
        if protocol.startswith("SASL_") and not self.console_tls:
            raise ValueError(
                f"console.listener: users log in with their passwords on a {protocol} BROKER "
                "listener, so the console must be HTTPS://host:port"
            )
        if self.console_tls and self.ssl_keystore_location is None:
            raise ValueError("console.listener HTTPS:// needs ssl.keystore.location")
        return self

    @model_validator(mode="after")
    def _voters_or_bootstrap_servers(self) -> NodeConfig:
        voters, bootstrap = self.controller_quorum_voters, self.controller_quorum_bootstrap_servers
        if voters is None and bootstrap is None:
            raise ValueError(
                "controller.quorum.bootstrap.servers must name some controllers, or "
                "controller.quorum.voters must name the quorum's voters: give one"
            )
        if voters is not None and bootstrap is not None:
            raise ValueError(
                "give controller.quorum.voters or controller.quorum.bootstrap.servers, not both"
            )
        return self

    @property
    def static_broker_configs(self) -> dict[str, str]:
        """The dynamic broker configs this file sets, as Kafka's property strings."""
        values = self.model_dump(by_alias=True)
        statics = {key: str(values[key]) for key in BROKER_KEYS if values.get(key) is not None}
        return statics | self.topic_config_defaults

    def group_rules(self) -> GroupRules:
        """What group configs are validated and described with: this node's group
        coordinator settings as the defaults, its bounds, and which of them its file sets."""
        defaults = GroupConfigs(
            consumer_session_timeout_ms=self.group_consumer_session_timeout_ms,
            consumer_heartbeat_interval_ms=self.group_consumer_heartbeat_interval_ms,
            share_session_timeout_ms=self.group_share_session_timeout_ms,
            share_heartbeat_interval_ms=self.group_share_heartbeat_interval_ms,
            share_record_lock_duration_ms=self.group_share_record_lock_duration_ms,
        )
        c = self
        bounds = GroupConfigBounds(
            consumer_session_timeout_ms=(
                c.group_consumer_min_session_timeout_ms,
                c.group_consumer_max_session_timeout_ms,
            ),
            consumer_heartbeat_interval_ms=(
                c.group_consumer_min_heartbeat_interval_ms,
                c.group_consumer_max_heartbeat_interval_ms,
            ),
            share_session_timeout_ms=(
                c.group_share_min_session_timeout_ms,
                c.group_share_max_session_timeout_ms,
            ),
            share_heartbeat_interval_ms=(
                c.group_share_min_heartbeat_interval_ms,
                c.group_share_max_heartbeat_interval_ms,
            ),
            share_record_lock_duration_ms=(
                c.group_share_min_record_lock_duration_ms,
                c.group_share_max_record_lock_duration_ms,
            ),
        )
        fields = type(self).model_fields
        set_keys = frozenset(fields[name].alias or name for name in self.model_fields_set)
        return GroupRules(defaults, bounds, set_keys & frozenset(GROUP_BROKER_SYNONYMS.values()))

    @property
    def raft_port_offset(self) -> int:
        return self.controller_quorum_raft_port_offset

    @property
    def voters(self) -> list[Voter]:
        """controller.quorum.voters; empty for a node given bootstrap servers instead."""
        if self.controller_quorum_voters is None:
            return []
        return parse_voters(self.controller_quorum_voters, self.controller_quorum_raft_port_offset)

    @property
    def bootstrap_servers(self) -> list[str]:
        """controller.quorum.bootstrap.servers; empty for a node given the voters instead."""
        if self.controller_quorum_bootstrap_servers is None:
            return []
        return parse_bootstrap_servers(self.controller_quorum_bootstrap_servers)

    @property
    def controller_addresses(self) -> list[str]:
        """The CONTROLLER addresses this node finds the quorum through at first: the voters'
        or the bootstrap servers (the metadata's voters take over once known, KIP-853)."""
        return [v.address for v in self.voters] or self.bootstrap_servers

    @property
    def console_address(self) -> tuple[str, int] | None:
        """console.listener's host and port; None when unset."""
        if self.console_listener is None:
            return None
        return next(iter(parse_listeners(self.console_listener).values()))

    @property
    def console_tls(self) -> bool:
        """Whether console.listener is HTTPS (the node's keystore)."""
        listener = self.console_listener
        return listener is not None and list(parse_listeners(listener)) == ["HTTPS"]

    @property
    def listener_map(self) -> dict[str, tuple[str, int]]:
        return parse_listeners(self.listeners)

    @property
    def is_controller(self) -> bool:
        return "controller" in self.process_roles

    @property
    def is_broker(self) -> bool:
        return "broker" in self.process_roles

    def listener(self, name: str) -> tuple[str, int] | None:
        return self.listener_map.get(name)

    def broker_listener(self) -> tuple[str, int]:
        listener = self.listener("BROKER")
        if listener is None:
            raise ConfigError("listeners: the broker role needs a BROKER://host:port listener")
        return listener

    def controller_voter(self) -> Voter:
        """This node's voter entry; its CONTROLLER listener must match it. A controller that
        is not among the voters joins an existing quorum: it waits, known to nobody, until
        ``raftlog quorum add-controller`` makes it a voter (KIP-853); its entry is its
        CONTROLLER listener, whose address no voter may use."""
        mine = [v for v in self.voters if v.node_id == self.node_id]
        listener = self.listener_map.get("CONTROLLER")
        if not mine:
            if listener is None:
                raise ConfigError(
                    f"node.id {self.node_id} is not in controller.quorum.voters (or has only "
                    "bootstrap servers) and has no CONTROLLER listener to join the quorum with"
                )
            joining = Voter(self.node_id, *listener, listener[1] + self.raft_port_offset)
            taken = [v.node_id for v in self.voters if {v.address, v.raft_address} & {
                joining.address, joining.raft_address}]  # fmt: skip
            if taken:
                raise ConfigError(
                    f"listeners: CONTROLLER {joining.address} is voter {taken[0]}'s address"
                )
            return joining
        if listener != (mine[0].host, mine[0].port):
            raise ConfigError(
                f"listeners: CONTROLLER must be {mine[0].address} as in controller.quorum.voters"
            )
        return mine[0]

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> NodeConfig:
        try:
            return cls.model_validate(dict(values))
        except ValidationError as error:
            raise ConfigError(describe_validation_error(error)) from error

    @classmethod
    def load(cls, path: Path, environ: Mapping[str, str] | None = None) -> NodeConfig:
        """The TOML file, then ``RAFTLOG_*`` environment overrides."""
        try:
            values: dict[str, Any] = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise ConfigError(f"{path}: {error}") from error
        env = os.environ if environ is None else environ
        for field in cls.model_fields.values():
            key = field.alias or ""
            name = ENV_PREFIX + key.upper().replace(".", "_")
            if name in env:
                values[key] = env[name]
        return cls.parse(values)

    def to_toml(self) -> str:
        lines = []
        values = self.model_dump(by_alias=True)
        values |= values.pop("topic.config.defaults")  # top-level keys, as they were given
        for key, raw in values.items():
            if raw is None:
                continue
            value = ",".join(sorted(raw)) if isinstance(raw, frozenset) else raw
            value = str(value) if isinstance(value, Path) else value
            rendered = f'"{value}"' if isinstance(value, str) else str(value).lower()
            lines.append(f'"{key}" = {rendered}')
        return "\n".join(lines) + "\n"
