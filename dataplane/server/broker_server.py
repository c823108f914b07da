"""The broker role of a node: its lifecycle with the quorum and the threads that drive it.

- The **lifecycle thread** registers the broker (a new incarnation id each start), then
  heartbeats every ``broker.heartbeat.interval.ms`` with the metadata offset it has applied; the
  controller unfences it once that offset reaches its registration. On SIGTERM it asks for a
  controlled shutdown and waits (bounded) until the controller moved its leaderships away.
- The **metadata thread** follows the quorum's committed records through FetchMetadata, applies
  them to its own image, and hands each new image to the replica manager, which gives every
  hosted partition its role, and to the fetcher manager.
- The **AlterPartition thread** sends the leaders' ISR changes to the controller, batched.

States follow Kafka's ``BrokerState``; ``_transition_to`` refuses any move not in the table.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dataplane.broker.alter_partition import PendingChanges
from dataplane.broker.fetcher import FetcherConfig, FetcherManager
from dataplane.broker.metrics import NodeMetrics, PartitionCounts, PartitionGauge
from dataplane.broker.partition import IsrChange, Partition, Role
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from dataplane.broker.replication_quota import QuotaGauge
from dataplane.broker.service import BrokerServicer, serve
from dataplane.coordinator.group_coordinator import (
    OFFSETS_TOPIC,
    GroupConfig,
    GroupCoordinator,
    GroupServicer,
)
from dataplane.coordinator.share_coordinator import (
    ShareCoordinator,
    ShareCoordinatorConfig,
    ShareCoordinatorServicer,
)
from dataplane.coordinator.share_grpc import GrpcShare
from dataplane.coordinator.share_manager import (
    CoordinatorPersister,
    SharePartitionManager,
    ShareSettings,
)
from dataplane.coordinator.transaction_coordinator import (
    TransactionConfig,
    TransactionCoordinator,
    TransactionServicer,
)
from dataplane.coordinator.transaction_markers import Channels, TransactionVerifier
from dataplane.kafka.auto_create import AutoCreateSettings
from dataplane.kafka.connection_limits import DynamicConnectionLimits, ListenerLimits
from dataplane.kafka.listener import LISTENER as KAFKA_LISTENER
from dataplane.kafka.listener import KafkaListener
from dataplane.kafka.sasl import KafkaListenerSecurity
from metadata_quorum.broker_describe import NodeConfigView
from metadata_quorum.client import ControllerClient
from metadata_quorum.codec import record_from_proto, snapshot_from_proto
from metadata_quorum.group_configs import GroupRules
from metadata_quorum.grpc_standard import Keepalive, NodeHealth
from metadata_quorum.image import MetadataDelta, MetadataImage, PartitionRegistration
from metadata_quorum.security.authorization import AccessControl, AuthorizerSettings
from metadata_quorum.security.channels import ClientSecurity
from metadata_quorum.security.grpc_auth import CredentialLookup, ServerSecurity
from metadata_quorum.security.scram import ScramCredential, ScramMechanism
from protos import broker_pb2 as pb
from protos import controller_pb2 as cpb
from protos import metadata_pb2 as mpb
from raftlog.clean_shutdown import (
    boot_id,
    forget_same_boot,
    note_same_boot,
    take_previous_incarnation,
    write_clean_shutdown_epoch,
)
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
METADATA_STREAM_WAIT_MS = 3000
METADATA_STREAM_DEADLINE_S = 5.0  # a stream from a paused controller is abandoned this soon
METADATA_FAULT_BACKOFF_S = 1.0  # after an update that could not be applied, before asking again
CONTROLLER_DEADLINE_S = 5.0
CONTROLLED_SHUTDOWN_ATTEMPTS = 2  # heartbeats in a row no controller answered: stop anyway
CONTROLLER_RPC_TIMEOUT_S = 1.5  # per controller tried: a paused one must not hold a heartbeat
ALTER_PARTITION_BATCH_MAX = 1000
ALTER_PARTITION_DEADLINE_S = 10.0
ALTER_PARTITION_RETRY_BACKOFF_S = 0.1  # after a failed request (Kafka waits 50 ms)
LOG_DIR_FAILURE_STATUS = 1  # the exit status of a broker whose log directory failed


IsrItem = tuple[IsrChange, "Partition | None"]  # a change and its partition, if hosted


class BrokerState(enum.Enum):
    NOT_RUNNING = "not running"
    STARTING = "starting"  # registering
    RECOVERY = "recovery"  # registered, fenced, catching up with the metadata
    RUNNING = "running"
    PENDING_CONTROLLED_SHUTDOWN = "pending controlled shutdown"
    SHUTTING_DOWN = "shutting down"


_LEGAL = {
    BrokerState.NOT_RUNNING: {BrokerState.STARTING, BrokerState.SHUTTING_DOWN},
    BrokerState.STARTING: {BrokerState.RECOVERY, BrokerState.SHUTTING_DOWN},
    BrokerState.RECOVERY: {
        BrokerState.RUNNING, BrokerState.STARTING, BrokerState.PENDING_CONTROLLED_SHUTDOWN,
        BrokerState.SHUTTING_DOWN,
    },
    BrokerState.RUNNING: {
        BrokerState.RECOVERY, BrokerState.STARTING, BrokerState.PENDING_CONTROLLED_SHUTDOWN,
        BrokerState.SHUTTING_DOWN,
    },
    BrokerState.PENDING_CONTROLLED_SHUTDOWN: {BrokerState.SHUTTING_DOWN, BrokerState.STARTING},
    BrokerState.SHUTTING_DOWN: set(),
}  # fmt: skip


@dataclass(frozen=True)
class BrokerSettings:
    broker_id: int
    host: str
    port: int
    rack: str | None
    cluster_id: str
    controller_addresses: list[str]
    heartbeat_interval_ms: int
    controlled_shutdown_timeout_ms: int
    replica: ReplicaManagerConfig
    fetcher: FetcherConfig
    groups: GroupConfig = field(default_factory=GroupConfig)
    transactions: TransactionConfig = field(default_factory=TransactionConfig)
    # share groups (KIP-932): the share coordinator over __share_group_state, and the share
    # partitions this broker leads
    share_coordinator: ShareCoordinatorConfig = field(default_factory=ShareCoordinatorConfig)
    share: ShareSettings = field(default_factory=ShareSettings)
    # groups' configs (Kafka 4): this node's defaults, bounds and file-set keys, for
    # DescribeConfigs of a group on the KAFKA listener (metadata_quorum/group_configs.py)
    group_rules: GroupRules = field(default_factory=GroupRules)
    # this node's config file as DescribeConfigs of this broker lists it (Kafka's KafkaConfig;
    # metadata_quorum/broker_describe.py)
    node_configs: NodeConfigView = field(default_factory=NodeConfigView)
    fault_produce_drop_response_every: int = 0  # chaos testing only: see ProduceResponseDropper
    kafka_listener: tuple[str, int] | None = None  # KAFKA://host:port: Kafka's binary protocol
    replica_selector: str | None = None  # replica.selector.class (KIP-392)
    fetch_session_cache_slots: int = 1000  # max.incremental.fetch.session.cache.slots
    # its TLS and SASL (listener.security.protocol.map, ssl.*, sasl.enabled.mechanisms, ...)
    kafka_security: KafkaListenerSecurity | None = None
    # socket.request.max.bytes, queued.max.requests, connections.max.idle.ms: the KAFKA
    # listener's, and the gRPC BROKER listener's where gRPC has the same limit (`grpc_limits`)
    kafka_limits: ListenerLimits = field(default_factory=ListenerLimits)
    # auto.create.topics.enable, num.partitions, default.replication.factor (Kafka clients'
    # Metadata requests create missing topics: dataplane/kafka/auto_create.py)
    auto_create: AutoCreateSettings = field(default_factory=AutoCreateSettings)
    # authorizer.class.name, super.users, allow.everyone.if.no.acl.found; None: no authorizer
    authorizer: AuthorizerSettings | None = None
    # the BROKER listener's TLS and authentication, given the credential lookup over this
    # broker's image (NodeConfig.server_security; None: plaintext)
    broker_security: Callable[[str, CredentialLookup], ServerSecurity | None] | None = None
    # how this broker reaches the controllers and the other brokers (None: plaintext)
    controller_client_security: ClientSecurity | None = None
    broker_client_security: ClientSecurity | None = None
    keepalive: Keepalive = field(default_factory=Keepalive)  # grpc.keepalive.* of the listener

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


GRPC_INT_MAX = 2**31 - 1


def grpc_limits(settings: BrokerSettings) -> list[tuple[str, int]]:
    """Kafka's limits as the BROKER listener's gRPC server options, where gRPC has one:
    socket.request.max.bytes bounds a message received, queued.max.requests the streams one
    connection has open at once (HTTP/2 flow control makes the client wait for more),
    connections.max.idle.ms closes a connection with no call for that long (GOAWAY: clients
    reconnect when they next call), and max.connections, when the node config file sets it, the
    connections gRPC accepts (fixed at start: gRPC cannot change it while serving; the per-IP
    limits have no gRPC counterpart)."""
    limits = settings.kafka_limits
    options = [
        ("grpc.max_receive_message_length", limits.socket_request_max_bytes),
        ("grpc.max_concurrent_streams", min(limits.queued_max_requests, GRPC_INT_MAX)),
    ]
    if limits.connections_max_idle_ms >= 0:
        idle_ms = min(max(limits.connections_max_idle_ms, 1), GRPC_INT_MAX)
        options.append(("grpc.max_connection_idle_ms", idle_ms))
    max_connections = dict(settings.replica.static_broker_configs).get("max.connections")
    if max_connections is not None:
        options.append(("grpc.max_allowed_incoming_connections", int(max_connections)))
    return options


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def halt_process(status: int) -> None:
    """Kafka's ``Exit.halt``: end the process now, after writing out the logs."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(status)


class Broker:
    def __init__(
        self,
        settings: BrokerSettings,
        log_dir: Path,
        metrics: NodeMetrics,
        clock_ms: Callable[[], int] = wall_clock_ms,
        halt: Callable[[int], None] = halt_process,
    ) -> None:
        self.settings = settings
        self._halt = halt
        self.metrics = metrics
        self.clock_ms = clock_ms
        self.state = BrokerState.NOT_RUNNING
        # the broker state; the image published vs the broker epoch (registration)
        self._state_lock, self._publish_lock = threading.Lock(), threading.Lock()
        self.broker_epoch = -1
        self.incarnation_id = uuid.uuid4().hex  # this process's; a restart is a new incarnation
        self._stop = threading.Event()
        self._shutdown_granted = threading.Event()
        self._shutdown_abandoned = False
        self.client = ControllerClient(
            settings.controller_addresses, deadline_s=CONTROLLER_DEADLINE_S,
            rpc_timeout_s=CONTROLLER_RPC_TIMEOUT_S, security=settings.controller_client_security,
        )  # fmt: skip
        # the leaders' ISR changes not yet answered by the controller, one per partition
        self._isr_changes: PendingChanges[tuple[str, int], IsrItem] = PendingChanges()
        # KIP-966: the last incarnation's proof of a clean shutdown (removed before any log
        # opens: a crash of this incarnation must not leave it behind), or that it died on this
        # boot (its page cache kept everything it wrote); sent at registration
        self.log_dir, self._log_dir_offline, self.boot_id = log_dir, False, boot_id()
        self.previous = take_previous_incarnation(log_dir, self.boot_id)
        self.replicas = ReplicaManager(
            settings.broker_id, log_dir, settings.replica, clock_ms, self._enqueue_isr,
            self._log_dir_failed, on_cache_released=metrics.page_cache_released.inc,
        )  # fmt: skip
        self.fetchers = FetcherManager(
            settings.broker_id, self._broker_address, lambda: self.broker_epoch,
            settings.fetcher, clock_ms, self.replicas.follower_quota,
            security=settings.broker_client_security,
        )  # fmt: skip
        # every request asks it, from the ACLs of this broker's image (issue 28)
        self.access = AccessControl(lambda: self.replicas.image, settings.authorizer)
        self.servicer = BrokerServicer(
            settings.broker_id, self.replicas, metrics, settings.cluster_id,
            settings.controller_addresses, self._enqueue_isr, self.allocate_producer_id,
            drop_produce_response_every=settings.fault_produce_drop_response_every,
            access=self.access, replica_selector=settings.replica_selector,
            fetch_session_cache_slots=settings.fetch_session_cache_slots,
        )  # fmt: skip
        self.groups = GroupCoordinator(
            settings.broker_id, settings.groups, self.replicas, self._create_topic, clock_ms
        )
        self.groups.access, self.group_servicer = self.access, GroupServicer(self.groups)
        # WriteTxnMarkers to a __consumer_offsets partition goes through its group shard.
        self.servicer.marker_writers[OFFSETS_TOPIC] = self.groups.write_marker
        self.transactions = TransactionCoordinator(
            settings.broker_id, settings.transactions, self.replicas, self._create_topic,
            self.allocate_producer_id, clock_ms, self._write_markers_here,
            offsets_partitions=settings.groups.offsets_topic_num_partitions,
        )  # fmt: skip
        self.transactions.channels.security = settings.broker_client_security
        self.transaction_servicer = TransactionServicer(self.transactions, self.access)
        self.servicer.init_transactional_producer = self.transaction_servicer.init_producer_id
        # KIP-890: partition leaders (and the group coordinator, for TxnOffsetCommit) ask the
        # transaction coordinator before a producer's first transactional batch
        verifier = TransactionVerifier(
            settings.broker_id, lambda: self.replicas.image, self.transactions.verify,
            self.transactions.channels,
        )  # fmt: skip
        self.servicer.verify_transaction = verifier
        self.groups.verify_transaction = self.servicer.verify_transaction  # TxnOffsetCommit
        finder = self.transaction_servicer.find_coordinator
        self.group_servicer.find_transaction_coordinator = finder
        self.share_coordinator = ShareCoordinator(
            settings.broker_id, settings.share_coordinator, self.replicas, self._create_topic,
            clock_ms,
        )  # fmt: skip
        self.share_servicer = ShareCoordinatorServicer(self.share_coordinator, self.access)
        self.group_servicer.find_share_coordinator = self.share_coordinator.find_coordinator
        self._share_channels = Channels(settings.broker_client_security)
        persister = CoordinatorPersister(self.share_coordinator, self._share_channels)
        self.share_manager = SharePartitionManager(
            self.replicas, persister, settings.share, clock_ms
        )
        self.groups.delete_share_state = persister.delete  # DeleteGroups of a share group
        share_door = GrpcShare(
            self.share_manager, lambda: self.replicas.image, self.access, clock_ms
        )
        self.servicer.share_fetch = share_door.share_fetch  # BrokerService's ShareFetch
        self.servicer.share_acknowledge = share_door.share_acknowledge
        self.server: grpc.Server | None = None
        # Set once the image holds this incarnation's registration: clients are served from then.
        self.serving = threading.Event()
        # grpc.health.v1 of the BROKER listener: SERVING while RUNNING (registered, unfenced)
        # and caught up with the metadata (`_update_health`)
        self.health = NodeHealth()
        self.kafka = (
            None
            if settings.kafka_listener is None
            else KafkaListener(
                self.servicer,
                self.group_servicer,
                *settings.kafka_listener,
                ready=self.serving,
                controller=self.client,
                transactions=self.transaction_servicer,
                security=settings.kafka_security,
                auto_create=settings.auto_create,
                fetch_session_cache_slots=settings.fetch_session_cache_slots,
                share_manager=self.share_manager,
                group_rules=settings.group_rules,
                node_configs=settings.node_configs,
                limits=settings.kafka_limits,
                connection_limits=DynamicConnectionLimits(
                    lambda: self.replicas.image,
                    settings.broker_id,
                    dict(settings.replica.static_broker_configs),
                ),
            )
        )
        self.image = MetadataImage()
        self._producer_ids_lock = threading.Lock()
        self._producer_ids = range(0)  # the rest of the block the controller gave this broker
        self._stream: grpc.Future | None = None
        self._threads = [
            threading.Thread(target=self._lifecycle, name="broker-lifecycle", daemon=True),
            threading.Thread(target=self._follow_metadata, name="broker-metadata", daemon=True),
            threading.Thread(target=self._send_isr_changes, name="broker-alter-isr", daemon=True),
        ]

    def _log_dir_failed(self, directory: Path, error: OSError) -> None:
        """Kafka's LogDirFailureChannel with one log directory: an IO error writing it (a full
        disk, EIO) takes it offline, and a broker with no online log directory halts — no
        controlled shutdown, no flush, no clean-shutdown marker: what memory holds no longer
        matches the files, so recovery at the next start decides what the log is. The
        controller sees the session end and moves leaderships to the other replicas."""
        self._log_dir_offline = True
        forget_same_boot(self.log_dir)  # an I/O error may have cost the page cache its pages
        log.critical(
            "broker %d: log directory %s failed (%s): it is the only log directory, so the "
            "broker halts (status %d); repair it (a full disk: free space) and start the node "
            "again",
            self.settings.broker_id, directory, error, LOG_DIR_FAILURE_STATUS,
        )  # fmt: skip
        self._halt(LOG_DIR_FAILURE_STATUS)

    # -- state ---------------------------------------------------------------------------------
    def _transition_to(self, state: BrokerState) -> None:
        with self._state_lock:
            if state is self.state:
                return
            if state not in _LEGAL[self.state]:
                raise AssertionError(f"illegal broker transition {self.state} -> {state}")
            log.info("broker %d: %s -> %s", self.settings.broker_id, self.state.value, state.value)
            self.state = state
            self._update_health()

    def _update_health(self) -> None:
        """The health service says SERVING exactly while the broker serves clients as a member
        of the cluster: RUNNING (registered and unfenced) with its image caught up; fenced,
        registering, catching up or shutting down it says NOT_SERVING, and once the broker
        stops, NOT_SERVING for good."""
        if self.state is BrokerState.SHUTTING_DOWN:
            self.health.shut_down()
            return
        self.health.set_serving(self.state is BrokerState.RUNNING and self.serving.is_set())

    def start(self) -> None:
        self._transition_to(BrokerState.STARTING)
        security = None
        if self.settings.broker_security is not None:
            security = self.settings.broker_security("BROKER", self._scram_credential)
        self.server = serve(
            self.servicer, self.settings.address, self.group_servicer, ready=self.serving,
            transactions=self.transaction_servicer, security=security,
            shares=self.share_servicer, limit_options=grpc_limits(self.settings),
            health=self.health, keepalive=self.settings.keepalive,
        )  # fmt: skip
        if self.kafka is not None:
            self.kafka.start()
        self.replicas.start()
        self.groups.start()
        self.transactions.start()
        self.share_coordinator.start()
        self.share_manager.start()
        for thread in self._threads:
            thread.start()
        log.info("broker %d serving on %s", self.settings.broker_id, self.settings.address)

    def _scram_credential(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        """The BROKER listener's SCRAM credentials: from this broker's current image."""
        return self.replicas.image.scram_credential(user, mechanism)

    def _endpoints(self) -> list[mpb.Endpoint]:
        settings = self.settings
        endpoints = [mpb.Endpoint(name="BROKER", host=settings.host, port=settings.port)]
        if settings.kafka_listener is not None:
            host, port = settings.kafka_listener
            endpoints.append(mpb.Endpoint(name=KAFKA_LISTENER, host=host, port=port))
        return endpoints

    def _broker_address(self, broker_id: int) -> str | None:
        broker = self.image.brokers.get(broker_id)
        endpoint = None if broker is None else broker.endpoint("BROKER")
        return None if endpoint is None else endpoint.address

    # -- lifecycle -----------------------------------------------------------------------------
    def _lifecycle(self) -> None:
        interval_s = self.settings.heartbeat_interval_ms / 1000
        failures = 0
        while not self._stop.is_set():
            try:
                if self.broker_epoch < 0:
                    self._register()
                self._heartbeat()
                failures = 0
            except KafkaError as error:
                failures += 1
                log.warning("broker %d: %s", self.settings.broker_id, error)
                if error.error in (
                    ErrorCode.STALE_BROKER_EPOCH,
                    ErrorCode.BROKER_ID_NOT_REGISTERED,
                ):
                    self.broker_epoch = -1
                    self._transition_to(BrokerState.STARTING)
                if (
                    self.state is BrokerState.PENDING_CONTROLLED_SHUTDOWN
                    and failures >= CONTROLLED_SHUTDOWN_ATTEMPTS
                ):
                    # No controller answers (the quorum is stopping too): nobody can move the
                    # leadership away, so stop without the grant, as Kafka gives up after retries.
                    self._shutdown_abandoned = True
                    self._shutdown_granted.set()
            wanting_shutdown = self.state is BrokerState.PENDING_CONTROLLED_SHUTDOWN
            self._stop.wait(interval_s / 4 if wanting_shutdown else interval_s)

    def _register(self) -> None:
        request = cpb.RegisterBrokerRequest(
            broker_id=self.settings.broker_id,
            incarnation_id=self.incarnation_id,
            endpoints=self._endpoints(),
            rack=self.settings.rack or "",
            static_configs=dict(self.settings.replica.static_broker_configs),
        )
        if self.previous.broker_epoch >= 0:
            request.previous_broker_epoch = self.previous.broker_epoch
        response = self.client.checked("RegisterBroker", request)
        with self._publish_lock:
            self.broker_epoch = response.broker_epoch
            if not self.serving.is_set():
                # The stream may have brought the registration before its answer came: with
                # nothing committed after it, no later update would publish that image.
                self._publish()
        note_same_boot(self.log_dir, self.broker_epoch, self.boot_id)
        self._transition_to(BrokerState.RECOVERY)
        log.info(
            "broker %d registered at epoch %d (previous broker epoch %d, proof: %s)",
            self.settings.broker_id, self.broker_epoch, self.previous.broker_epoch,
            self.previous.proof,
        )  # fmt: skip

    def _published_offset(self) -> int:
        """The metadata offset the heartbeat reports: -1 until this broker serves clients.

        The controller unfences a broker whose reported offset reaches its registration, and
        from then on every Metadata answer names it. Kafka's broker asks to be unfenced only
        once its first image is published and its listeners are enabled (BrokerServer's
        startup: the initial catch-up, the first publish, the socket server enabled, then
        ``setReadyToUnfence``). Reporting the image's offset while that image was still being
        published (the logs of an unclean shutdown recovering in ``apply_image``) unfenced a
        broker whose listeners still refused connections: kafka-python, told of it by another
        broker, sent it a request and failed on the closed connection."""
        return self.image.offset if self.serving.is_set() else -1

    def _heartbeat(self) -> None:
        want_shutdown = self.state is BrokerState.PENDING_CONTROLLED_SHUTDOWN
        request = cpb.BrokerHeartbeatRequest(
            broker_id=self.settings.broker_id,
            broker_epoch=self.broker_epoch,
            current_metadata_offset=self._published_offset(),
            want_shutdown=want_shutdown,
        )
        # The standbys hear it first, so whichever becomes active knows this broker's last
        # contact and fences a dead one on time (see metadata_quorum.cluster), and a live one
        # keeps them told while no active controller answers (an election, a dead or paused
        # one): asking the active controller first left them unheard then, and the next active
        # controller fenced live brokers whose last contact it knew was a session old.
        interval_s = self.settings.heartbeat_interval_ms / 1000
        self.client.tell_standbys("BrokerHeartbeat", request, interval_s / 4)
        # Never held longer than two intervals: the loop comes round and tells the standbys.
        deadline_s = min(CONTROLLER_DEADLINE_S, max(2 * interval_s, 0.5))
        response = self.client.checked("BrokerHeartbeat", request, deadline_s=deadline_s)
        if want_shutdown:
            if response.should_shut_down:
                self._shutdown_granted.set()
        elif response.is_fenced and self.state is BrokerState.RUNNING:
            self._transition_to(BrokerState.RECOVERY)
        elif not response.is_fenced and self.state is BrokerState.RECOVERY:
            self._transition_to(BrokerState.RUNNING)

    # -- metadata ------------------------------------------------------------------------------
    def _follow_metadata(self) -> None:
        turn = 0
        while not self._stop.is_set():
            # The active controller has the newest records; without one known, take turns.
            candidates = self.client.controllers  # the image's voters first (KIP-853)
            address = self.client.active_address or candidates[turn % len(candidates)]
            progressed = self._stream_from(address)
            if not progressed:
                turn += 1
                self._stop.wait(0.05)

    def _stream_from(self, address: str) -> bool:
        """Apply updates from one controller until its stream ends; True if any arrived."""
        request = cpb.FetchMetadataRequest(
            from_offset=self.image.offset + 1, max_wait_ms=METADATA_STREAM_WAIT_MS
        )
        progressed = False
        try:
            stream = self.client.stub(address).FetchMetadata(
                request, timeout=METADATA_STREAM_DEADLINE_S
            )
            self._stream = stream
            if self._stop.is_set():
                stream.cancel()
            for update in stream:
                self._apply_update(update)
                progressed = True
        except grpc.RpcError as error:
            log.debug("metadata stream from %s ended: %s", address, error)
        except Exception:
            # Kafka's metadata loading fault: counted and logged, and the broker goes on (the
            # stream starts again from the image's offset), never a silent end of this thread,
            # which would leave every partition at the last image published.
            self.metrics.metadata_load_errors.inc()
            log.exception("broker %d: metadata update from %s not applied",
                          self.settings.broker_id, address)  # fmt: skip
            self._stop.wait(METADATA_FAULT_BACKOFF_S)
        return progressed

    def _apply_update(self, update: cpb.MetadataUpdate) -> None:
        image = self.image
        if update.HasField("snapshot"):
            image = snapshot_from_proto(update.snapshot)
        delta = MetadataDelta(image)
        for item in update.records:
            if item.offset != delta.offset + 1:
                raise AssertionError(
                    f"metadata offsets must be contiguous: {item.offset} after {delta.offset}"
                )
            delta.replay(record_from_proto(item.record))
        image = delta.image()
        if image.voters != self.image.voters:
            self.client.learn([v.address for v in image.voters])
        with self._publish_lock:
            self.image = image
            self._publish()

    def _publish(self) -> None:
        """Publish ``self.image`` to the replica manager and the coordinators, once it holds
        this incarnation's registration (under ``_publish_lock``)."""
        image = self.image
        # Caught up with the quorum once the image holds this broker's own registration: every
        # record committed before it is in. (The controller serving the stream may itself lag.)
        caught_up = 0 <= self.broker_epoch <= image.offset
        if not caught_up and not self.serving.is_set():
            # Kafka's initial catch-up: nothing is published before the image is current. The
            # images on the way are history: one from before a reassignment that moved this
            # broker off a partition and back would delete the log it holds now (and with it
            # the records its place in the ISR or ELR promises).
            return
        me = image.brokers.get(self.settings.broker_id)
        may_lead = me is not None and me.incarnation_id == self.incarnation_id and not me.fenced
        self._publish_to("replicas", self._publish_replicas, image, caught_up, may_lead)
        self._publish_to("group coordinator", self.groups.on_image, image)
        self._publish_to("transaction coordinator", self.transactions.on_image)
        self._publish_to("share coordinator", self.share_coordinator.on_image)
        self._publish_to("share partitions", self.share_manager.on_image)
        if caught_up and not self.serving.is_set():
            self.serving.set()
            with self._state_lock:
                self._update_health()
            log.info(
                "broker %d: caught up with the metadata at offset %d; serving clients",
                self.settings.broker_id, image.offset,
            )  # fmt: skip

    def _publish_replicas(self, image: MetadataImage, caught_up: bool, may_lead: bool) -> None:
        followed = self.replicas.apply_image(image, caught_up=caught_up, may_lead=may_lead)
        hosted = self.replicas.topics_after_removals()
        if hosted is not None:
            self.metrics.forget_topics(hosted)
        self.fetchers.reconcile(followed)

    def _publish_to(self, publisher: str, publish: Callable[..., None], *args: Any) -> None:
        """One publisher's part of an image (Kafka's BrokerMetadataPublisher and its fault
        handler): a fault is counted and logged, and the others still get the image. The next
        image catches the faulty one up: the replica manager looks at every topic changed
        since the image it last applied whole."""
        try:
            publish(*args)
        except Exception:
            self.metrics.metadata_apply_errors.inc()
            log.exception("broker %d: the %s did not apply the metadata at offset %d",
                          self.settings.broker_id, publisher, self.image.offset)  # fmt: skip

    # -- AlterPartition ------------------------------------------------------------------------
    def _enqueue_isr(self, change: IsrChange) -> None:
        """A leader's ISR change, to go in the next AlterPartition request; refused with
        OPERATION_NOT_ATTEMPTED while the partition has one on the way (see
        :mod:`dataplane.broker.alter_partition`)."""
        try:
            partition: Partition | None = self.replicas.get(change.topic, change.partition)
        except KafkaError:
            partition = None
        if partition is not None:
            shrink = len(change.new_isr) < len(partition.isr)
            (self.metrics.isr_shrinks if shrink else self.metrics.isr_expands).inc()
        if not self._isr_changes.submit((change.topic, change.partition), (change, partition)):
            log.info("%s-%d: an ISR change is already on its way; %s not sent",
                     change.topic, change.partition, change.new_isr)  # fmt: skip
            if partition is not None:
                partition.isr_change_done(change, None, ErrorCode.OPERATION_NOT_ATTEMPTED)

    def _send_isr_changes(self) -> None:
        """Kafka's AlterPartitionManager: one request at a time with every change not yet
        answered; what is to be sent again (the request failed, the answer lacked it) goes
        after a short backoff."""
        while not self._stop.is_set():
            batch = self._isr_changes.take(ALTER_PARTITION_BATCH_MAX, timeout_s=0.5)
            wanted = []
            for key, item in batch:
                change, partition = item
                if partition is not None and not partition.proposes(change):
                    self._isr_changes.done(key, item)  # newer metadata reset it meanwhile
                else:
                    wanted.append((key, item))
            if wanted and not self._alter_partitions(wanted):
                self._stop.wait(ALTER_PARTITION_RETRY_BACKOFF_S)

    def _alter_partitions(self, batch: list[tuple[tuple[str, int], IsrItem]]) -> bool:
        """Send ``batch``; False if some of it is to be sent again (the request failed as a
        whole, or the answer lacks a change): the caller backs off first."""
        request = cpb.AlterPartitionRequest(
            broker_id=self.settings.broker_id,
            broker_epoch=self.broker_epoch,
            partitions=[
                cpb.AlterPartitionItem(
                    topic_id=c.topic_id.bytes,
                    partition=c.partition,
                    leader_epoch=c.leader_epoch,
                    new_isr=c.new_isr,
                    partition_epoch=c.partition_epoch,
                )
                for _, (c, _) in batch
            ],
        )
        try:
            response = self.client.checked(
                "AlterPartition", request, deadline_s=ALTER_PARTITION_DEADLINE_S
            )
        except KafkaError as error:
            log.warning("AlterPartition of %d changes failed, to be sent again: %s",
                        len(batch), error)  # fmt: skip
            return False
        complete = True
        by_id = {(s.topic_id, s.partition): s for s in response.partitions if s.topic_id}
        by_name = {(s.topic, s.partition): s for s in response.partitions if s.topic}
        for key, item in batch:
            change, partition = item
            state = by_id.get((change.topic_id.bytes, change.partition))
            state = by_name.get(key) if state is None else state
            if state is None and partition is not None and partition.proposes(change):
                log.warning("%s-%d: the AlterPartition answer lacks it; sent again", *key)
                complete = False
                continue
            self._isr_changes.done(key, item)
            if state is None or partition is None:
                continue
            if state.error_code:
                refused = ErrorCode.from_code(state.error_code)
                log.info("%s: ISR change to %s refused: %s", partition.name, change.new_isr,
                         refused.name)  # fmt: skip
                partition.isr_change_done(change, None, refused)
                continue
            partition.isr_change_done(
                change,
                PartitionRegistration(
                    tuple(state.replicas), tuple(state.isr), state.leader, state.leader_epoch,
                    state.partition_epoch,
                ),
            )  # fmt: skip
        return complete

    # -- internal topics ---------------------------------------------------------------------
    def _create_topic(
        self, name: str, partitions: int, replication_factor: int, configs: Mapping[str, str]
    ) -> None:
        """Create an internal topic through the controller (``__consumer_offsets``,
        ``__transaction_state``)."""
        topic = cpb.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=replication_factor,
            configs=dict(configs),
        )  # fmt: skip
        response = self.client.checked("CreateTopics", cpb.CreateTopicsRequest(topics=[topic]))
        for result in response.topics:
            if result.error_code:
                raise KafkaError(ErrorCode.from_code(result.error_code), result.error_message)

    def _write_markers_here(self, request: pb.WriteTxnMarkersRequest) -> pb.WriteTxnMarkersResponse:
        """The transaction coordinator's markers for partitions this broker leads."""
        return self.servicer.WriteTxnMarkers(request, None)

    # -- producer ids ------------------------------------------------------------------------
    def allocate_producer_id(self) -> int:
        """The next id of this broker's block; a new block from the controller when spent."""
        with self._producer_ids_lock:
            if not self._producer_ids:
                if self.broker_epoch < 0:
                    raise KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "broker not registered")
                response = self.client.checked(
                    "AllocateProducerIds",
                    cpb.AllocateProducerIdsRequest(
                        broker_id=self.settings.broker_id, broker_epoch=self.broker_epoch
                    ),
                )
                start = response.producer_id_start
                self._producer_ids = range(start, start + response.producer_id_len)
                log.info("broker %d: producer ids %d..%d", self.settings.broker_id, start,
                         start + response.producer_id_len - 1)  # fmt: skip
            producer_id = self._producer_ids[0]
            self._producer_ids = self._producer_ids[1:]
            return producer_id

    # -- shutdown ------------------------------------------------------------------------------
    def controlled_shutdown(self) -> bool:
        """Ask the controller to move leadership away; True once it let this broker go."""
        if self.state not in (BrokerState.RUNNING, BrokerState.RECOVERY):
            return False
        self._transition_to(BrokerState.PENDING_CONTROLLED_SHUTDOWN)
        done = self._shutdown_granted.wait(self.settings.controlled_shutdown_timeout_ms / 1000)
        granted = done and not self._shutdown_abandoned
        outcome = "granted" if granted else "given up: no controller moved its leadership"
        log.info("broker %d: controlled shutdown %s", self.settings.broker_id, outcome)
        return granted

    def stop(self) -> None:
        self._transition_to(BrokerState.SHUTTING_DOWN)
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()
        self.fetchers.close()
        self.share_manager.close()
        self._share_channels.close()
        self.share_coordinator.close()
        self.transactions.close()
        self.groups.close()
        if self.kafka is not None:
            self.kafka.stop()
        if self.server is not None:
            self.server.stop(grace=1.0).wait(5.0)
        # Before the joins: closing the controller client ends its retry loops and cancels its
        # calls in flight, so a thread in the middle of one (an AlterPartition resent to
        # controllers that are stopping too, a heartbeat) ends now rather than after its
        # deadline (10 s for AlterPartition, twice the join's 5 s): a stopping cluster waited
        # on each of its brokers in turn.
        self.client.close()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=5.0)
        self.replicas.close()
        self._mark_clean_shutdown()

    def _mark_clean_shutdown(self) -> None:
        """Every log is flushed and closed: leave the proof for the next start (Kafka's
        ``LogManager.shutdown(brokerEpoch)``), unless the log directory failed or this
        incarnation never registered (no epoch to prove)."""
        if self._log_dir_offline or self.broker_epoch < 0:
            return
        write_clean_shutdown_epoch(self.log_dir, self.broker_epoch)
        log.info(
            "broker %d: clean shutdown marker written (broker epoch %d)",
            self.settings.broker_id, self.broker_epoch,
        )  # fmt: skip

    # -- observation ---------------------------------------------------------------------------
    def partition_gauges(self) -> list[PartitionGauge]:
        return [
            PartitionGauge(
                p.topic, p.partition, p.high_watermark, p.log.log_end_offset,
                p.log.log_start_offset,
            )
            for p in self.replicas.partitions()
        ]  # fmt: skip

    def partition_counts(self) -> PartitionCounts:
        hosted = self.replicas.partitions()
        led = [p for p in hosted if p.role is Role.LEADER]
        under = sum(len(p.isr) < len(p.replicas) for p in led)
        return PartitionCounts(len(hosted), len(led), under)

    def quota_gauges(self) -> list[QuotaGauge]:
        return [self.replicas.leader_quota.gauge(), self.replicas.follower_quota.gauge()]
