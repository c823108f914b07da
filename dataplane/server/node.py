"""The node launcher: ``raftlog node --config node.toml``.

A node runs the roles its configuration names. The controller role runs the Raft metadata log, the
replicated metadata state, the controller (write path, sessions, timers) and ControllerService on
the CONTROLLER listener. The broker role (:mod:`dataplane.server.broker_server`) serves
BrokerService on the BROKER listener. A METRICS listener, when configured, serves Prometheus metrics
over HTTP (HTTPS when ``listener.security.protocol.map`` names METRICS:SSL). ``console.listener``,
when set, serves the web console (:mod:`dataplane.console`), reading through this node's own BROKER
listener with the client library.

SIGTERM and SIGINT stop the node cleanly: the broker asks for a controlled shutdown (its
leaderships move away first), then the gRPC servers drain and the logs and the Raft journal close.
"""

from __future__ import annotations

import logging
import signal
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import grpc

from dataplane.broker.fetcher import FetcherConfig
from dataplane.broker.gc_pauses import GcPolicy
from dataplane.broker.malloc_tuning import tune_malloc
from dataplane.broker.metrics import ControllerGauge, NodeMetrics, PartitionCounts
from dataplane.broker.replica_manager import ReplicaManagerConfig
from dataplane.console.server import Console, ConsoleServer
from dataplane.console.sessions import Sessions
from dataplane.coordinator.classic_group import ClassicLimits
from dataplane.coordinator.group_coordinator import GroupConfig
from dataplane.coordinator.share_coordinator import ShareCoordinatorConfig
from dataplane.coordinator.share_group import ShareLimits
from dataplane.coordinator.share_manager import ShareSettings
from dataplane.coordinator.transaction_coordinator import TransactionConfig
from dataplane.kafka.auto_create import AutoCreateSettings
from dataplane.kafka.sasl import KafkaListenerSecurity
from dataplane.schema_registry import http as schema_registry_http
from dataplane.schema_registry.registry import Registry
from dataplane.server.broker_server import Broker, BrokerSettings
from dataplane.server.config import NodeConfig
from dataplane.server.node_config_view import node_config_view
from metadata_quorum.client import ControllerClient
from metadata_quorum.codec import voter_from_proto
from metadata_quorum.controller import MetadataState, QuorumController
from metadata_quorum.grpc_standard import NodeHealth
from metadata_quorum.raft import (
    MetadataLog,
    RaftOptions,
    RaftTiming,
    log_exists,
    read_raft_secret,
)
from metadata_quorum.raft_tls import RaftPeers, RaftTlsFiles
from metadata_quorum.records import NO_LEADER
from metadata_quorum.security.authorization import AccessControl
from metadata_quorum.security.channels import ClientSecurity
from metadata_quorum.security.scram import ScramCredential, ScramMechanism
from metadata_quorum.security.tls import TlsSettings
from metadata_quorum.service import ControllerServicer, Voter, serve
from metadata_quorum.voters import current_voters
from protos import controller_pb2 as cpb
from raftlog.config import ConfigError
from raftlog.errors import KafkaError

log = logging.getLogger(__name__)
SHUTDOWN_GRACE_S = 5.0
RESIGN_WAIT_S = 3.0  # a stopping active controller waits this long for another to take over
POLL_S = 0.02
JOIN_ASK_S = 10.0  # a joining controller asks the quorum for its voters within this


@dataclass
class ControllerRole:
    state: MetadataState
    metadata_log: MetadataLog
    controller: QuorumController
    servicer: ControllerServicer
    server: grpc.Server
    health: NodeHealth

    def resign(self) -> None:
        """A node that stops hands the quorum's leadership over first, as Kafka's resigning
        Raft leader does: an active controller that kept ticking while the rest of its node
        stopped fenced live brokers whose heartbeats it no longer took in. Best effort: a sole
        voter, or no voter taking over within RESIGN_WAIT_S, stops as it is."""
        if not self.metadata_log.is_leader() or len(self.metadata_log.voters()) < 2:
            return
        log.info(
            "node %d: handing the active controller over before stopping", self.controller.node_id
        )
        self.metadata_log.transfer_leadership()
        deadline = time.monotonic() + RESIGN_WAIT_S
        while self.metadata_log.is_leader() and time.monotonic() < deadline:
            time.sleep(POLL_S)  # polling a condition with a deadline
        if self.metadata_log.is_leader():
            log.warning(
                "node %d: no controller took over within %.0f s",
                self.controller.node_id,
                RESIGN_WAIT_S,
            )

    def stop(self) -> None:
        self.health.shut_down()  # probes see NOT_SERVING for the grace period
        self.servicer.stop_streams = True
        self.state.close()  # FetchMetadata streams end now, not after their max wait
        self.server.stop(grace=SHUTDOWN_GRACE_S).wait(SHUTDOWN_GRACE_S)
        self.controller.close()
        self.metadata_log.close()


def joining_voters(config: NodeConfig, me: Voter, data_dir: Path) -> list[Voter]:
    """The voters a controller starts its log with. A voter of controller.quorum.voters, or a
    node whose log exists (it then uses the log's own voter set), takes the configured ones. A
    controller that joins a running quorum (KIP-853) asks it for its current voters, so that it
    knows whichever voter leads when it is added, not only those its configuration names. One
    given only controller.quorum.bootstrap.servers has nothing to fall back on: with no answer
    within JOIN_ASK_S it does not start (ConfigError)."""
    static = config.voters
    if me in static or log_exists(data_dir):
        return static
    client = ControllerClient(
        config.controller_addresses, deadline_s=JOIN_ASK_S,
        security=config.node_client_security("CONTROLLER"),
    )  # fmt: skip
    try:
        described = client.call("DescribeCluster", cpb.DescribeClusterRequest())
        learned = [voter_from_proto(v) for v in described.voters]
    except KafkaError as error:
        if not static:
            raise ConfigError(
                f"controller.quorum.bootstrap.servers {config.bootstrap_servers}: no controller "
                f"said who votes ({error.message}); bootstrap servers join a running quorum, "
                "the first controllers of a cluster take controller.quorum.voters"
            ) from error
        log.warning("the quorum did not say who votes (%s): starting with %s", error, static)
        learned = []
    finally:
        client.close()
    if not learned and not static:
        raise ConfigError(
            f"controller.quorum.bootstrap.servers {config.bootstrap_servers}: the quorum "
            "named no voters yet; retry once it has an active controller"
        )
    log.info("joining the quorum of voters %s", [v.node_id for v in learned or static])
    return learned or static


def raft_options(config: NodeConfig) -> RaftOptions:
    """What protects the Raft transport (`NodeConfig.raft_transport_security`). TLS (the
    CONTROLLER listener's protocol is SSL or SASL_SSL, or
    controller.quorum.raft.transport.security=tls): TLS 1.3 with the node's keystore and
    truststore, both sides presenting a certificate of the truststore's CA that names their
    Raft address's host, whose principal (ssl.principal.mapping.rules) is a super user when the
    node runs an authorizer. "encryption" with controller.quorum.raft.secret.file: encrypted and
    authenticated with the file's secret. Otherwise plaintext. docs/security.md#raft-transport."""
    try:
        security = config.raft_transport_security
        if security == "tls":
            assert config.ssl_keystore_location and config.ssl_truststore_location  # validated
            authorizer = config.authorizer_settings
            peers = RaftPeers(
                config.ssl_principal_mapping_rules,
                authorizer.super_users if authorizer is not None else None,
            )
            files = RaftTlsFiles(
                config.ssl_keystore_location, config.ssl_truststore_location,
                config.ssl_key_password,
            )  # fmt: skip
            return RaftOptions(tls=files, tls_peers=peers)
        path = config.controller_quorum_raft_secret_file
        if security == "plaintext" or path is None:
            return RaftOptions()
        return RaftOptions(secret=read_raft_secret(path))
    except ValueError as error:
        raise ConfigError(str(error)) from error


def start_controller(config: NodeConfig) -> ControllerRole:
    me = config.controller_voter()
    data_dir = Path(config.log_dirs) / "__cluster_metadata"
    voters = joining_voters(config, me, data_dir)  # until the image records the voters
    state = MetadataState()

    def leader_id_of(raft_address: str | None) -> int:
        known = current_voters(state.image, voters)
        return next((v.node_id for v in known if v.raft_address == raft_address), NO_LEADER)

    election_max_s = config.controller_quorum_election_timeout_ms / 1000
    metadata_log = MetadataLog(
        me.raft_address,
        [v.raft_address for v in voters],
        data_dir,
        state,
        RaftTiming.for_election_timeout(election_max_s),
        raft_options(config),
    )
    controller = QuorumController(
        me.node_id,
        state,
        metadata_log,
        leader_id_of=leader_id_of,
        session_timeout_ms=config.broker_session_timeout_ms,
        rebalance_interval_ms=config.leader_imbalance_check_interval_seconds * 1000,
        static_voters=voters,
    )
    access = AccessControl(lambda: state.image, config.authorizer_settings)
    servicer = ControllerServicer(
        controller,
        config.cluster_id,
        access,
        config.node_client_security("CONTROLLER"),
        group_rules=config.group_rules(),
    )

    def credentials(user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return state.image.scram_credential(user, mechanism)  # the current image, every call

    # CONTROLLER's TLS and authentication
    security = config.server_security("CONTROLLER", credentials)
    health = NodeHealth()
    server = serve(
        servicer, me.address, security=security, health=health, keepalive=config.keepalive
    )
    controller.on_serving = health.set_serving
    controller.start()
    log.info("controller %d serving on %s (raft %s)", me.node_id, me.address, me.raft_address)
    return ControllerRole(state, metadata_log, controller, servicer, server, health)


def kafka_listener_security(config: NodeConfig) -> KafkaListenerSecurity:
    """The KAFKA listener's TLS and SASL from the node's configuration (docs/security.md); the
    SCRAM credentials are read from the broker's metadata image."""
    protocol = config.security_protocol("KAFKA")
    return KafkaListenerSecurity(
        protocol, config.tls_settings("KAFKA"), tuple(config.sasl_mechanisms),
        config.connections_max_reauth_ms,
        config.principal_mapping_rules,
    )  # fmt: skip


def metrics_tls(config: NodeConfig) -> ssl.SSLContext | None:
    """The METRICS listener's TLS (``METRICS:SSL`` in listener.security.protocol.map): the
    node's keystore, client certificates as its ``ssl.client.auth`` says; None: plain HTTP."""
    tls = config.tls_settings("METRICS")
    return tls.server_context() if tls is not None else None


def start_broker(config: NodeConfig, metrics: NodeMetrics) -> Broker:
    host, port = config.broker_listener()
    settings = BrokerSettings(
        broker_id=config.node_id,
        host=host,
        port=port,
        rack=config.broker_rack,
        replica_selector=config.replica_selector_class,
        fetch_session_cache_slots=config.max_incremental_fetch_session_cache_slots,
        cluster_id=config.cluster_id,
        controller_addresses=config.controller_addresses,
        heartbeat_interval_ms=config.broker_heartbeat_interval_ms,
        controlled_shutdown_timeout_ms=config.controlled_shutdown_timeout_ms,
        fault_produce_drop_response_every=config.fault_produce_drop_response_every,
        kafka_listener=config.listener("KAFKA"),
        kafka_security=kafka_listener_security(config),
        kafka_limits=config.listener_limits,
        keepalive=config.keepalive,
        auto_create=AutoCreateSettings(
            enabled=config.auto_create_topics_enable,
            num_partitions=config.num_partitions,
            default_replication_factor=config.default_replication_factor,
        ),
        broker_security=config.server_security,
        controller_client_security=config.node_client_security("CONTROLLER"),
        broker_client_security=config.node_client_security("BROKER"),
        authorizer=config.authorizer_settings,
        replica=ReplicaManagerConfig(
            replica_lag_time_max_ms=config.replica_lag_time_max_ms,
            log_retention_check_interval_ms=config.log_retention_check_interval_ms,
            log_cache_tail_bytes=config.log_cache_tail_bytes,
            static_broker_configs=tuple(sorted(config.static_broker_configs.items())),
        ),
        fetcher=FetcherConfig(
            replica_fetch_max_bytes=config.replica_fetch_max_bytes,
            replica_fetch_response_max_bytes=config.replica_fetch_response_max_bytes,
            replica_fetch_wait_max_ms=config.replica_fetch_wait_max_ms,
            replica_socket_timeout_ms=config.replica_socket_timeout_ms,
        ),
        groups=GroupConfig(
            session_timeout_ms=config.group_consumer_session_timeout_ms,
            heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms,
            max_size=config.group_consumer_max_size,
            offsets_topic_num_partitions=config.offsets_topic_num_partitions,
            offsets_topic_replication_factor=config.offsets_topic_replication_factor,
            offsets_topic_segment_bytes=config.offsets_topic_segment_bytes,
            offsets_retention_minutes=config.offsets_retention_minutes,
            offsets_retention_check_interval_ms=config.offsets_retention_check_interval_ms,
            offset_metadata_max_bytes=config.offset_metadata_max_bytes,
            offsets_commit_timeout_ms=config.offsets_commit_timeout_ms,
            classic=ClassicLimits(
                min_session_timeout_ms=config.group_min_session_timeout_ms,
                max_session_timeout_ms=config.group_max_session_timeout_ms,
                initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
                max_size=config.group_max_size,
            ),
            share=ShareLimits(
                session_timeout_ms=config.group_share_session_timeout_ms,
                max_size=config.group_share_max_size,
            ),
            share_heartbeat_interval_ms=config.group_share_heartbeat_interval_ms,
        ),
        transactions=TransactionConfig(
            state_log_num_partitions=config.transaction_state_log_num_partitions,
            state_log_replication_factor=config.transaction_state_log_replication_factor,
            state_log_min_isr=config.transaction_state_log_min_isr,
            state_log_segment_bytes=config.transaction_state_log_segment_bytes,
            max_timeout_ms=config.transaction_max_timeout_ms,
            id_expiration_ms=config.transactional_id_expiration_ms,
            abort_timed_out_interval_ms=(
                config.transaction_abort_timed_out_transaction_cleanup_interval_ms
            ),
            remove_expired_interval_ms=(
                config.transaction_remove_expired_transaction_cleanup_interval_ms
            ),
        ),
        share_coordinator=ShareCoordinatorConfig(
            state_topic_num_partitions=config.share_coordinator_state_topic_num_partitions,
            state_topic_replication_factor=(
                config.share_coordinator_state_topic_replication_factor
            ),
            state_topic_min_isr=config.share_coordinator_state_topic_min_isr,
            state_topic_segment_bytes=config.share_coordinator_state_topic_segment_bytes,
            write_timeout_ms=config.share_coordinator_write_timeout_ms,
            snapshot_update_records_per_snapshot=(
                config.share_coordinator_snapshot_update_records_per_snapshot
            ),
        ),
        share=ShareSettings(
            record_lock_duration_ms=config.group_share_record_lock_duration_ms,
            delivery_count_limit=config.group_share_delivery_count_limit,
            partition_max_record_locks=config.group_share_partition_max_record_locks,
            max_share_sessions=config.group_share_max_share_sessions,
        ),
        group_rules=config.group_rules(),
        node_configs=node_config_view(config),
    )
    broker = Broker(settings, Path(config.log_dirs), metrics)
    broker.start()
    return broker


def start_schema_registry(
    config: NodeConfig,
) -> tuple[schema_registry_http.RegistryHttpServer, threading.Thread] | None:
    """The schema registry on ``schema.registry.listener`` (None when unset), reading and
    writing ``_schemas`` through this node's own BROKER listener."""
    address = config.schema_registry_address()
    if address is None:
        return None
    host, port = config.broker_listener()
    registry = Registry(
        [f"{host}:{port}"], config.node_client_security("BROKER"),
        config.schema_registry_timeout_ms / 1000,
    )  # fmt: skip
    return schema_registry_http.serve(registry, *address)


def _controller_gauge(role: ControllerRole | None) -> ControllerGauge | None:
    if role is None:
        return None
    status = role.metadata_log.status()
    return ControllerGauge(
        active=role.controller.is_active,
        metadata_offset=role.state.image.offset,
        term=status.term,
        has_quorum=status.has_quorum,
        tick_gap_max_s=status.tick_gap_max_s,
    )


def start_console(config: NodeConfig) -> ConsoleServer | None:
    """The web console on console.listener, reading through this node's BROKER listener; its
    clients connect at the first request. On a SASL BROKER listener every user logs in with
    their SCRAM name and password and reads as themselves; the charts' sampler reads as this
    node (its certificate), and shows a user only what their own reads let them open."""
    address, broker = config.console_address, config.listener("BROKER")
    if address is None:
        return None
    assert broker is not None, "NodeConfig requires a BROKER listener with console.listener"
    bootstrap = [f"{broker[0]}:{broker[1]}"]
    sessions = None
    protocol = config.security_protocol("BROKER")
    if protocol.startswith("SASL_"):
        mechanisms = sorted(config.sasl_mechanisms, key=lambda m: m != "SCRAM-SHA-512")

        trusted = config.ssl_truststore_location if protocol == "SASL_SSL" else None

        def security_for(user: str, password: str) -> ClientSecurity:
            return ClientSecurity.model_validate({
                "security_protocol": protocol, "ssl_ca_location": trusted,
                "sasl_mechanism": mechanisms[0], "sasl_username": user, "sasl_password": password,
            })  # fmt: skip

        sessions = Sessions(bootstrap, security_for)
    console = Console(
        bootstrap,
        security=config.node_client_security("BROKER"),
        sample_interval_s=config.console_sample_interval_ms / 1000,
        connect_url=config.console_connect_url,
        sessions=sessions,
    )
    tls = None
    if config.console_tls:
        tls = TlsSettings(
            config.ssl_keystore_location, config.ssl_truststore_location, config.ssl_key_password
        ).server_context()
    return ConsoleServer(console, *address, tls=tls).start()


def tune_interpreter(config: NodeConfig) -> None:
    """The process-wide settings a node runs with, for good: glibc's malloc (malloc_tuning.py)
    and CPython's thread switch interval (``gil.switch.interval.us``, docs/operations.md)."""
    log.info("malloc settings applied: %s", tune_malloc() or "none")
    sys.setswitchinterval(config.gil_switch_interval_us / 1_000_000)
    log.info("GIL switch interval: %d us", config.gil_switch_interval_us)


def run(config: NodeConfig) -> None:
    """Run until SIGTERM/SIGINT."""
    tune_interpreter(config)
    Path(config.log_dirs).mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    metrics = NodeMetrics()
    GcPolicy(metrics.gc_pauses, config.gc_full_scan_interval_ms / 1000).install(stop)
    controller = start_controller(config) if config.is_controller else None
    broker = start_broker(config, metrics) if config.is_broker else None
    metrics.watch(
        broker.partition_gauges if broker is not None else list,
        broker.partition_counts if broker is not None else lambda: PartitionCounts(0, 0, 0),
        lambda: _controller_gauge(controller),
    )
    if broker is not None:
        metrics.watch_replication_quotas(broker.quota_gauges)
        metrics.watch_fetch_sessions(broker.servicer.follower_sessions.gauge, "raftlog_replica")
        if broker.kafka is not None:
            metrics.watch_fetch_sessions(broker.kafka.fetch.gauge)
    metrics_listener = config.listener("METRICS")
    http = None
    if metrics_listener is not None:
        http = metrics.serve(*metrics_listener, tls=metrics_tls(config))
    console = start_console(config)
    registry = start_schema_registry(config) if broker is not None else None
    if broker is not None and registry is not None:  # value.schema.validation asks it
        broker.servicer.schema_id_known = registry[0].api.registry.knows_id
    try:
        stop.wait()
    finally:
        if registry is not None:
            schema_registry_http.shutdown(*registry)
        if controller is not None:
            controller.resign()
        if broker is not None:
            broker.controlled_shutdown()
            broker.stop()
        if controller is not None:
            controller.stop()
        if http is not None:
            http.shutdown()
        if console is not None:
            console.stop()
    log.info("node %d stopped", config.node_id)
