"""The KAFKA listener: Kafka's binary protocol in front of the same broker core as gRPC.

A broker whose ``listeners`` name ``KAFKA://host:port`` accepts Kafka clients (librdkafka, kcat,
kafka-python) there. Each request is read into its version's schema (dataplane/kafka/codec.py),
turned into the BrokerService request the gRPC front door takes, served by the same
`BrokerServicer` (produce with acks 0/1/all and idempotence, fetch long polls, list offsets,
producer ids), and the answer is written back in the version the client asked for. Metadata
points clients at every live broker's KAFKA endpoint (brokers register it with the controller).

Connections are served one request at a time, in order, as a Kafka broker does (a client may
pipeline; responses keep the order; nothing is read ahead of the request being served), with one
difference: an acks=all Produce is appended in order and then waits for its ISR on the
connection's `_InOrder` responder, while the next request is read and served; answers still
leave in request order. Kafka keeps the connection muted through that wait, so one connection
carries one produce per replication round; a round took ~9 ms here at low rates (the Python
client's sequential acks=all p50), and librdkafka, sending a request per linger.ms (5 ms),
fell behind at 300 records/s (end-to-end p50 833 ms and growing). Kafka's
limits bound what clients can hold: socket.request.max.bytes, queued.max.requests,
max.connections, max.connections.per.ip(.overrides) and connections.max.idle.ms
(dataplane/kafka/connection_limits.py). A frame that is not a request closes its connection only;
an API or version not served is answered UNSUPPORTED_VERSION for ApiVersions (in its v0 layout,
KIP-511) and closes the connection otherwise, as Kafka's broker does. Served here: ApiVersions,
Metadata, Produce, Fetch, ListOffsets, InitProducerId, DeleteRecords, and through
dataplane/kafka/groups.py the GroupServicer's FindCoordinator, ConsumerGroupHeartbeat,
OffsetCommit and OffsetFetch, through dataplane/kafka/share.py share groups' ShareFetch and
ShareAcknowledge (KIP-932), through dataplane/kafka/transactions.py the transaction APIs,
and through dataplane/kafka/admin.py the admin requests the controller answers (versions in
`kafka_codec.SUPPORTED`); dataplane/kafka/log_dirs.py answers DescribeLogDirs and
AlterReplicaLogDirs, dataplane/kafka/describe_topic_partitions.py DescribeTopicPartitions,
dataplane/kafka/describe_quorum.py DescribeQuorum, dataplane/kafka/config_resources.py
ListConfigResources (and groups' DescribeConfigs), and ApiVersions carries the feature levels
(dataplane/kafka/features.py).
Fetch (dataplane/kafka/fetch.py) keeps fetch sessions (KIP-227, `fetch_sessions.py`) and
passes the consumer's rack on (KIP-392: follower fetching).

Security (dataplane/kafka/sasl.py): on an SSL or SASL_SSL listener each connection's thread
does its TLS handshake; on SASL_PLAINTEXT or SASL_SSL a `ConnectionAuthenticator` sees every
request first. Each request is served inside ``acting_as(session)``, the connection's principal.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import queue
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from dataplane.broker import authorization as authz
from dataplane.broker.fetch_sessions import CACHE_SLOTS_DEFAULT
from dataplane.broker.service import BrokerServicer
from dataplane.coordinator.group_coordinator import GroupServicer
from dataplane.coordinator.share_manager import SharePartitionManager
from dataplane.kafka import codec as kc
from dataplane.kafka.admin import KafkaAdmin
from dataplane.kafka.auto_create import AutoCreateSettings, AutoTopicCreation, is_internal
from dataplane.kafka.config_resources import KafkaConfigResources
from dataplane.kafka.connection_limits import (
    Admission,
    ConnectionLimits,
    ConnectionQuotas,
    ListenerLimits,
    RequestPermits,
)
from dataplane.kafka.describe_quorum import KafkaDescribeQuorum
from dataplane.kafka.describe_topic_partitions import KafkaDescribeTopicPartitions
from dataplane.kafka.features import api_versions_features, disabled_apis, feature_refusal
from dataplane.kafka.fetch import KafkaFetch
from dataplane.kafka.groups import KafkaGroups
from dataplane.kafka.log_dirs import KafkaLogDirs
from dataplane.kafka.sasl import (
    AUTHENTICATION_READ_TIMEOUT_S,
    PLAINTEXT,
    Answer,
    AuthenticationFailure,
    CertificateRefused,
    Close,
    ClosingAnswer,
    ConnectionAuthenticator,
    KafkaListenerSecurity,
    RawToken,
    Serve,
    audit_failure,
    principal_of_certificate,
    tls_accept,
)
from dataplane.kafka.security_admin import KafkaSecurityAdmin
from dataplane.kafka.share import KafkaShare
from dataplane.kafka.transactions import KafkaTransactions, TransactionServices
from metadata_quorum.broker_describe import NodeConfigView
from metadata_quorum.client import ControllerClient
from metadata_quorum.group_configs import GroupRules
from metadata_quorum.security.acl import CLUSTER_NAME, ResourceType
from metadata_quorum.security.principal import ANONYMOUS, acting_as
from metadata_quorum.security.scram import ScramCredential, ScramMechanism
from protos import broker_pb2 as pb
from raftlog.errors import ErrorCode
from raftlog.log import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIERED_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
)

log = logging.getLogger(__name__)
LISTENER = "KAFKA"
ACCEPT_BACKLOG = 128
IOV_MAX = os.sysconf("SC_IOV_MAX")  # the most buffers one sendmsg takes
# A connection closing for its latest request first sends the answers still replicating, for
# up to a client's request.timeout.ms (Kafka's default): how long the client waits for them.
CLOSING_DRAIN_S = 30.0


class _DropResponse(Exception):
    """Fault injection (fault.produce.drop.response.every) lost this answer: close instead."""


class _RequestFailed(Exception):
    """A request whose handling raised what no handler should (a bug): logged once with its
    traceback and the request's API, and its connection closed; the broker serves on."""

    def __init__(self, frame: bytes, cause: Exception) -> None:
        head = frame[:8].ljust(8, b"\0")
        api_key, api_version = kc.API_KEY_VERSION.unpack_from(head)
        (correlation_id,) = kc.SIZE.unpack_from(head, 4)
        super().__init__(
            f"unexpected error serving api key {api_key} v{api_version} (correlation id "
            f"{correlation_id}): {type(cause).__name__}: {cause}"
        )
        self.cause = cause


class Replicating:
    """A Produce answer still waiting for the ISR: ``finish`` waits and gives the data."""

    def __init__(self, finish: Callable[[], kc.Data]) -> None:
        self.finish = finish


class _Later:
    """A response frame still to be made: ``finish`` waits for it (see `_InOrder`)."""

    def __init__(self, finish: Callable[[], list[kc.Buffer]]) -> None:
        self.finish = finish


Outgoing = list[kc.Buffer] | _Later
Handled = kc.Data | Replicating | None  # a handler's answer (None: acks=0, no answer)


class _InOrder:
    """A connection's answers that must wait for earlier ones still replicating: sent in
    request order by one thread, started when the first acks=all Produce waits. While it holds
    any, every later answer of the connection goes through it too. A failure (the peer gone,
    a dropped answer, a handler's bug) closes the connection, which ends the reading thread."""

    def __init__(self, connection: socket.socket, peer: Any, release: Callable[[], None]) -> None:
        self._connection = connection
        self._peer = peer
        self._release = release  # the request permit a `_Later` held
        self._queue: queue.SimpleQueue[Outgoing | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._sent = threading.Condition(self._lock)  # notified when nothing is held any more
        self._held = 0  # answers queued or being sent
        self._running = True
        self._thread = threading.Thread(target=self._run, name="kafka-conn-answers", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._held > 0

    def put(self, answer: Outgoing) -> None:
        with self._lock:
            self._held += 1
        self._queue.put(answer)

    def close(self) -> None:
        """No more answers: the thread ends once it has sent (or dropped) what it holds."""
        self._queue.put(None)

    def drain(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) until every answer queued is sent."""
        with self._sent:
            self._sent.wait_for(lambda: self._held == 0 or not self._running, timeout_s)

    def _run(self) -> None:
        try:
            self._send_in_order()
        finally:
            with self._sent:
                self._running = False
                self._sent.notify_all()

    def _send_in_order(self) -> None:
        failed = False
        while (answer := self._queue.get()) is not None:
            try:
                if isinstance(answer, _Later):
                    try:  # a closed connection's answers are not waited for
                        parts = None if failed else answer.finish()
                    finally:
                        self._release()
                else:
                    parts = answer
                if not failed and parts is not None:
                    send_frame(self._connection, parts)
            except (OSError, _DropResponse) as error:
                failed = self._fail(failed, error, logging.INFO)
            except Exception as error:  # noqa: BLE001  (a bug: this connection closes, not the broker)
                failed = self._fail(failed, error, logging.ERROR)
            finally:
                with self._sent:
                    self._held -= 1
                    if self._held == 0:
                        self._sent.notify_all()

    def _fail(self, failed: bool, error: Exception, level: int) -> bool:
        if not failed:
            log.log(level, "Kafka connection from %s closed: %s", self._peer, error,
                    exc_info=level >= logging.ERROR)  # fmt: skip
            with contextlib.suppress(OSError):
                self._connection.shutdown(socket.SHUT_RDWR)  # the reading thread ends
        return True


def _drain(in_order: _InOrder | None) -> None:
    """Before a connection closes for its latest request (an expired SASL session, a frame or
    an API it may not send, a handler's bug), the answers of the requests before it still go
    out: Kafka, serving a connection's requests one at a time, had sent them. A Produce that
    was appended and whose answer was lost is sent again by a client without idempotence
    (librdkafka's default), and written twice."""
    if in_order is not None:
        in_order.drain(CLOSING_DRAIN_S)


# Served by the connection's authenticator (dataplane/kafka/sasl.py), not by a handler.
AUTHENTICATION_APIS = frozenset((kc.API_SASL_HANDSHAKE, kc.API_SASL_AUTHENTICATE))


class _Call:
    """What BrokerServicer reads of a gRPC call context, for a request from this listener."""

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False  # nothing to hold: a dropped answer closes the connection at once

    def time_remaining(self) -> float | None:
        return 0.0

    def abort(self, code: Any, details: str) -> None:
        raise _DropResponse(details)


class KafkaListener:
    """Accepts Kafka clients on `host:port` and serves them with `servicer`."""

    def __init__(
        self,
        servicer: BrokerServicer,
        groups: GroupServicer,
        host: str,
        port: int,
        ready: threading.Event | None = None,
        controller: ControllerClient | None = None,
        transactions: TransactionServices | None = None,
        security: KafkaListenerSecurity | None = None,
        clock_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
        auto_create: AutoCreateSettings | None = None,
        fetch_session_cache_slots: int = CACHE_SLOTS_DEFAULT,
        share_manager: SharePartitionManager | None = None,
        group_rules: GroupRules | None = None,
        # this node's config file, for DescribeConfigs of this broker (None: every default)
        node_configs: NodeConfigView | None = None,
        limits: ListenerLimits | None = None,
        connection_limits: Callable[[], ConnectionLimits] = ConnectionLimits,
    ) -> None:
        self.servicer = servicer
        self.ready = ready
        self.security = security or PLAINTEXT
        # SCRAM credentials from the image of the moment (a new user can log in at once)
        self._credentials = self.security.credentials or self._image_credential
        tls = self.security.tls if self.security.uses_tls else None
        self._tls = None if tls is None else tls.server_context()
        self._clock_ms = clock_ms
        self.address = (host, port)
        self._socket: socket.socket | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        # socket.request.max.bytes, queued.max.requests, connections.max.idle.ms (static) and
        # max.connections(.per.ip) (dynamic): dataplane/kafka/connection_limits.py
        self.limits = limits or ListenerLimits()
        self.quotas = ConnectionQuotas(connection_limits)
        self.requests = RequestPermits(self.limits.queued_max_requests)
        self._auto_create: AutoTopicCreation | None = None
        self._share: KafkaShare | None = None
        self._connection_index = itertools.count()
        # Fetch with its sessions (KIP-227), max.incremental.fetch.session.cache.slots of them
        self.fetch = KafkaFetch(servicer, LISTENER, fetch_session_cache_slots, clock_ms)
        self._handlers: dict[int, Callable[[kc.Request], Handled]] = {
            kc.API_VERSIONS: self._api_versions,
            kc.API_METADATA: self._metadata,
            kc.API_PRODUCE: self._produce,
            kc.API_FETCH: self.fetch.handle,
            kc.API_LIST_OFFSETS: self._list_offsets,
            kc.API_INIT_PRODUCER_ID: self._init_producer_id,
            kc.API_DELETE_RECORDS: self._delete_records,
            kc.API_OFFSET_FOR_LEADER_EPOCH: self._offset_for_leader_epoch,
        }
        log_dirs = KafkaLogDirs(servicer.replicas.log_dir, servicer.replicas.partitions,
                                servicer.access)  # fmt: skip
        self._handlers.update(log_dirs.handlers())
        topic_partitions = KafkaDescribeTopicPartitions(
            lambda described: servicer.Metadata(described, _Call()), is_internal,
            lambda: list(servicer.replicas.image.topic_ids), uuid_of,
            lambda name: self._operations(authz.TOPIC, name, True),
        )  # fmt: skip
        self._handlers.update(topic_partitions.handlers())
        group_apis = KafkaGroups(groups, lambda: servicer.replicas.image, LISTENER, _Call)
        self._handlers.update(group_apis.handlers())
        if share_manager is not None:  # share groups' ShareFetch / ShareAcknowledge (KIP-932)
            share_apis = KafkaShare(
                share_manager, lambda: servicer.replicas.image, servicer.access, LISTENER,
                clock_ms,
            )  # fmt: skip
            self._handlers.update(share_apis.handlers())
            self._share = share_apis  # told when a connection closes (its share sessions end)
        if transactions is not None:
            txn_apis = KafkaTransactions(transactions, groups, servicer, _Call)
            self._handlers.update(txn_apis.handlers())
        # ListConfigResources, and the DescribeConfigs this broker answers itself: groups (with
        # its group defaults), itself (its node config), its loggers, client metrics
        config_resources = KafkaConfigResources(
            lambda: servicer.replicas.image, group_rules or GroupRules(), servicer.access,
            servicer.broker_id, node_configs,
        )  # fmt: skip
        self._handlers.update(config_resources.handlers())
        if controller is not None:
            admin = KafkaAdmin(
                controller, lambda: servicer.replicas.image, servicer.broker_id,
                servicer.cluster_id, LISTENER, servicer.access,
                wait_for_image=servicer.replicas.wait_for_image,
                config_resources=config_resources,
            )  # fmt: skip
            self._handlers.update(KafkaDescribeQuorum(controller, servicer.access).handlers())
            self._auto_create = AutoTopicCreation(
                auto_create or AutoCreateSettings(), controller, lambda: servicer.replicas.image,
                servicer.replicas.wait_for_image, servicer.access,
            )  # fmt: skip
            self._handlers.update(admin.handlers())
            self._handlers.update(KafkaSecurityAdmin(controller, servicer.access).handlers())

    def _image_credential(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return self.servicer.replicas.image.scram_credential(user, mechanism)

    def start(self) -> None:
        listening = socket.create_server(self.address, backlog=ACCEPT_BACKLOG)
        self._socket = listening
        threading.Thread(target=self._accept, name="kafka-accept", daemon=True).start()
        log.info("Kafka protocol listener (%s) on %s:%d", self.security.protocol, *self.address)

    def stop(self) -> None:
        self._stopped.set()
        if self._socket is not None:
            self._socket.close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            _close(connection)

    # -- connections ----------------------------------------------------------------------------
    def _accept(self) -> None:
        assert self._socket is not None
        while not self._stopped.is_set():
            try:
                connection, peer = self._socket.accept()
            except OSError:
                return  # closed by stop()
            if self.ready is not None and not self.ready.is_set():
                # Catching up with the metadata: refused as by a broker that is down, so the
                # client tries another (Kafka enables its listeners only once caught up).
                log.debug("Kafka connection from %s refused: still catching up", peer)
                _close(connection)
                continue
            if not self._admit(connection, peer[0]):
                continue
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._connections.add(connection)
            threading.Thread(
                target=self._serve, args=(connection, peer), name="kafka-conn", daemon=True
            ).start()

    def _admit(self, connection: socket.socket, host: str) -> bool:
        """Whether the connection counts within max.connections.per.ip (else it is closed at
        once); waits while the listener has max.connections open."""
        verdict = self.quotas.inc(host, self._stopped)
        if verdict is Admission.ADMIT:
            return True
        if verdict is Admission.REFUSE:
            log.info(
                "Rejected connection from %s, address already has the configured maximum of "
                "%d connections", host, self.quotas.limit_for(host),
            )  # fmt: skip
        _close(connection)
        return False

    def _serve(self, connection: socket.socket, peer: Any) -> None:
        connection_id = self._connection_id(peer)
        in_order: _InOrder | None = None  # once an answer waits for replication
        try:
            connection, auth = self._authenticator(connection, peer[0])
            while not self._stopped.is_set():
                # connections.max.idle.ms: a client that sends nothing, or stalls inside a
                # request (slowloris), is closed; until authenticated, sooner
                timeout_s = self.limits.idle_timeout_s
                if not auth.authenticated:
                    timeout_s = min(timeout_s or math.inf, AUTHENTICATION_READ_TIMEOUT_S)
                if connection.gettimeout() != timeout_s:
                    connection.settimeout(timeout_s)
                frame = _read_frame(connection, self.limits.socket_request_max_bytes)
                if frame is None:
                    return
                answer = self._serve_request(frame, f"/{peer[0]}", auth, connection_id)
                if answer is None:
                    continue
                if isinstance(answer, _Later) or (in_order is not None and in_order.busy):
                    if in_order is None:
                        in_order = _InOrder(connection, peer, self.requests.release)
                    in_order.put(answer)
                else:
                    send_frame(connection, answer)
        except ClosingAnswer as closing:
            _drain(in_order)  # its answer goes after those of earlier requests
            with contextlib.suppress(OSError):
                connection.sendall(closing.answer)
            log.info("Kafka connection from %s closed: %s", peer, closing)
        except _RequestFailed as failed:
            _drain(in_order)
            log.error("Kafka connection from %s closed: %s", peer, failed, exc_info=failed.cause)
        except (kc.FrameError, _DropResponse) as error:
            _drain(in_order)
            log.info("Kafka connection from %s closed: %s", peer, error)
        except OSError as error:  # the peer is gone (or idle): nothing more reaches it
            log.info("Kafka connection from %s closed: %s", peer, error)
        finally:
            if in_order is not None:
                in_order.close()
            with self._lock:
                self._connections.discard(connection)
            _close(connection)
            self.quotas.dec(peer[0])
            if self._share is not None:  # its share sessions end, their records go back now
                self._share.connection_closed(connection_id)

    def _connection_id(self, peer: Any) -> str:
        """Kafka's connection id: local address-peer address-index (unique per listener)."""
        host, port = self.address
        return f"{host}:{port}-{peer[0]}:{peer[1]}-{next(self._connection_index)}"

    def _serve_request(
        self, frame: bytes, client_host: str, auth: ConnectionAuthenticator, connection_id: str
    ) -> Outgoing | None:
        """One request, served once queued.max.requests leaves room (while the connection
        waits it reads nothing more: back-pressure). An answer still replicating (`_Later`)
        keeps its permit until the connection's `_InOrder` has finished it."""
        if not self.requests.acquire(self._stopped):
            raise OSError("the listener stopped")
        answer = None
        try:
            answer = self._respond(frame, client_host, auth, connection_id)
            return answer
        except (OSError, kc.FrameError, _DropResponse):  # FrameError: ClosingAnswer too
            raise
        except Exception as error:  # a handler's bug: this connection closes, not the broker
            raise _RequestFailed(frame, error) from error
        finally:
            if not isinstance(answer, _Later):
                self.requests.release()

    def _authenticator(
        self, connection: socket.socket, host: str
    ) -> tuple[socket.socket, ConnectionAuthenticator]:
        """The connection after its TLS handshake (SSL, SASL_SSL; on this connection's thread,
        with a deadline) and its authenticator. A failed handshake or an unmapped certificate
        is audited and raises OSError: only this connection closes."""
        principal = ANONYMOUS
        if self._tls is not None:
            try:
                secured = tls_accept(connection, self._tls)
            except OSError as error:
                audit_failure(_tls_failure(host, f"TLS handshake failed: {error}"))
                raise
            with self._lock:
                self._connections.discard(connection)
                self._connections.add(secured)
            connection = secured
            if not self.security.uses_sasl:
                try:
                    principal = principal_of_certificate(secured, self.security.mapping_rules)
                except CertificateRefused as refused:
                    audit_failure(_tls_failure(host, str(refused)))
                    with self._lock:
                        self._connections.discard(secured)
                    _close(secured)
                    raise
        return connection, ConnectionAuthenticator(
            self.security, self._credentials, host, principal
        )

    def handle(
        self,
        frame: bytes,
        client_host: str = "",
        auth: ConnectionAuthenticator | None = None,
        connection_id: str = "",
    ) -> bytes | None:
        """The response frame to one request frame (None: acks=0 produce, no answer), served
        as `auth`'s session (default: an ANONYMOUS PLAINTEXT connection). Raises FrameError
        for a frame that must close the connection (ClosingAnswer: after writing its answer)."""
        parts = self.respond(frame, client_host, auth, connection_id)
        return None if parts is None else b"".join(parts)

    def respond(
        self,
        frame: bytes,
        client_host: str = "",
        auth: ConnectionAuthenticator | None = None,
        connection_id: str = "",
    ) -> list[kc.Buffer] | None:
        """`handle`'s answer as the buffers of its frame (`kc.encode_response_parts`: a Fetch
        answer's records by reference), which the connection sends as they are."""
        answer = self._respond(frame, client_host, auth, connection_id)
        return answer.finish() if isinstance(answer, _Later) else answer

    def _respond(
        self,
        frame: bytes,
        client_host: str = "",
        auth: ConnectionAuthenticator | None = None,
        connection_id: str = "",
    ) -> Outgoing | None:
        """`respond`, but an acks=all Produce's answer still waiting for the ISR is a
        `_Later`, made once it is replicated."""
        if auth is not None and auth.expects_raw_token:
            return [self._raw_token(frame, auth)]
        try:
            request = kc.parse_request(frame, client_host, connection_id)
        except kc.UnsupportedVersion as unsupported:
            if unsupported.api_key != kc.API_VERSIONS:
                raise
            versions = self._api_versions_data(ErrorCode.UNSUPPORTED_VERSION)
            return [kc.encode_response(kc.API_VERSIONS, 0, unsupported.correlation_id, versions)]
        if auth is None:
            auth = ConnectionAuthenticator(PLAINTEXT, self._credentials, client_host.lstrip("/"))
        step = auth.receive(request, self._clock_ms())
        if not isinstance(step, Serve):
            return [self._sasl_answer(request, step)]
        with acting_as(auth.session):
            # an API the finalized feature levels switch off is refused (kafka/features.py)
            refused = feature_refusal(self.servicer.replicas.image, request)
            data = refused if refused is not None else self._handler(request)(request)
        # Kafka's request logger's line, at DEBUG: the BROKER_LOGGER resource turns it on
        log.debug(
            "Completed request: api key %d v%d, correlation id %d, client %s from %s as %s",
            request.api_key, request.api_version, request.correlation_id, request.client_id,
            client_host, auth.session.principal,
        )  # fmt: skip
        if data is None:
            return None
        if isinstance(data, Replicating):
            finish = data.finish
            return _Later(
                lambda: kc.encode_response_parts(
                    request.api_key, request.api_version, request.correlation_id, finish()
                )
            )
        return kc.encode_response_parts(
            request.api_key, request.api_version, request.correlation_id, data
        )

    def _handler(self, request: kc.Request) -> Callable[[kc.Request], Handled]:
        """The API's handler. One this listener was built without (the admin APIs need the
        controller) is not advertised, and a request for it closes the connection, as Kafka's
        broker does for an API it has not enabled."""
        handler = self._handlers.get(request.api_key)
        if handler is None:
            raise kc.FrameError(
                f"Received request api key {request.api_key} with version "
                f"{request.api_version} which is not enabled"
            )
        return handler

    def _enabled(self, api_key: int) -> bool:
        return api_key in self._handlers or api_key in AUTHENTICATION_APIS

    def _raw_token(self, frame: bytes, auth: ConnectionAuthenticator) -> bytes:
        """After SaslHandshake v0 the frame is a bare SASL token, and so is the reply."""
        step = auth.receive_token(frame, self._clock_ms())
        if isinstance(step, RawToken):
            return kc.SIZE.pack(len(step.token)) + step.token
        assert isinstance(step, Close), step
        if step.failure is not None:
            audit_failure(step.failure)
        raise kc.FrameError(step.reason)

    def _sasl_answer(self, request: kc.Request, step: Answer | RawToken | Close) -> bytes:
        if not isinstance(step, Answer):
            assert isinstance(step, Close), f"{step} answers no request"
            if step.failure is not None:
                audit_failure(step.failure)
            raise kc.FrameError(step.reason)
        if step.failure is not None:
            audit_failure(step.failure)
        answer = kc.encode_response(
            request.api_key, request.api_version, request.correlation_id, step.data
        )
        if step.close:
            raise ClosingAnswer(answer, f"authentication failed: {step.failure}")
        return answer

    # -- the APIs ---------------------------------------------------------------------------------
    def _api_versions(self, request: kc.Request) -> kc.Data:
        features = api_versions_features(self.servicer.replicas.image, request.api_version)
        return {**self._api_versions_data(ErrorCode.NONE), **features}

    def _api_versions_data(self, error: ErrorCode) -> kc.Data:
        """The APIs served, but those the finalized feature levels switch off."""
        disabled = disabled_apis(self.servicer.replicas.image)
        return {
            "error_code": error.code,
            "api_keys": [
                {"api_key": key, "min_version": low, "max_version": high}
                for key, (low, high) in sorted(kc.SUPPORTED.items())
                if key not in disabled and self._enabled(key)
            ],
            "throttle_time": 0,
        }

    def _metadata(self, request: kc.Request) -> kc.Data:
        topics = kc.field(request.body, "topics")
        all_topics = topics is None or (request.api_version == 0 and not topics)
        image = self.servicer.replicas.image
        by_id = {topic_id: name for name, topic_id in image.topic_ids.items()}
        names = [  # v10+ may name a topic by id only (KIP-516); an unknown id is not described
            t.name if t.name is not None else by_id.get(kc.field(t, "topic_id"), "")
            for t in topics or ()
        ]
        names = [name for name in names if name]
        # v8+: the client may ask what it may do on each topic (and, v8-10, on the cluster)
        topics_asked = bool(kc.field(request.body, "include_topic_authorized_operations", False))
        cluster_asked = bool(kc.field(request.body, "include_cluster_authorized_operations", False))
        described = self.servicer.Metadata(
            pb.MetadataRequest(topics=names, all_topics=all_topics), _Call()
        )
        if self._auto_create is not None and not all_topics:
            self._auto_create.fill_in(
                described,
                bool(kc.field(request.body, "allow_auto_topic_creation", True)),
                lambda created: self.servicer.Metadata(pb.MetadataRequest(topics=created), _Call()),
            )
        brokers = []
        for broker in image.unfenced_brokers():
            endpoint = broker.endpoint(LISTENER)
            if endpoint is not None:
                brokers.append({
                    "node_id": broker.broker_id, "host": endpoint.host, "port": endpoint.port,
                    "rack": broker.rack,
                })  # fmt: skip
        return {
            "throttle_time": 0,
            "brokers": brokers,
            "cluster_id": described.cluster_id,
            # Kafka clients cannot reach controllers: name this broker, which forwards (KIP-590).
            "controller_id": self.servicer.broker_id,
            "topics": [
                _topic_metadata(topic, self._operations(authz.TOPIC, topic.name, topics_asked))
                for topic in described.topics
            ],
            "cluster_authorized_operations": self._operations(
                authz.CLUSTER, CLUSTER_NAME, cluster_asked
            ),
        }

    def _operations(self, resource_type: ResourceType, name: str, requested: bool) -> int:
        return authz.authorized_operations(self.servicer.access, resource_type, name, requested)

    def _produce(self, request: kc.Request) -> Handled:
        """The broker's produce of a skeleton request (no records in it) and the records
        beside it, as its gRPC door takes them (protos.wire): a megabyte of records put in a
        protobuf message was copied into each level of it and out again. A connection's
        requests are served in order, so a sequence gap is real, not waited on."""
        body = request.body
        acks = int(body.acks)
        skeleton = pb.ProduceRequest(
            acks=acks,
            timeout_ms=kc.millis(body.timeout),
            transactional_id=kc.field(body, "transactional_id") or "",
        )
        records: list[bytes] = []
        for topic in body.topic_data:
            partitions = skeleton.topics.add(name=topic.name).partitions
            for p in topic.partition_data:
                partitions.add(partition=p.index)
                records.append(p.records or b"")
        appended = self.servicer.produce_append(skeleton, records, _Call(), sequence_wait_s=0.0)
        if acks == 0:
            return None
        if isinstance(appended, pb.ProduceResponse):
            return _produce_data(appended)
        return Replicating(lambda: _produce_data(appended.finish()))

    def _list_offsets(self, request: kc.Request) -> kc.Data:
        """A partition whose timestamp is a sentinel its version does not know (or no sentinel
        at all) is answered UNSUPPORTED_VERSION here, as Kafka's ReplicaManager does; the rest
        go to the broker core."""
        body, version = request.body, request.api_version
        listed = self.servicer.ListOffsets(
            pb.ListOffsetsRequest(
                replica_id=body.replica_id,
                isolation_level=int(kc.field(body, "isolation_level", 0)),
                topics=[
                    pb.ListOffsetsTopic(
                        name=topic.name,
                        partitions=[
                            pb.ListOffsetsPartition(
                                partition=p.partition_index,
                                timestamp=p.timestamp,
                                current_leader_epoch=kc.field(p, "current_leader_epoch", -1),
                            )
                            for p in topic.partitions
                            if list_offsets_timestamp_supported(p.timestamp, version)
                        ],
                    )
                    for topic in body.topics
                ],
            ),
            _Call(),
        )
        topics = _by_topic(listed.topics, "name", "partitions", _listed)
        unsupported = ErrorCode.UNSUPPORTED_VERSION.code
        for topic, answered in zip(body.topics, topics, strict=True):
            answered["partitions"].extend([
                {"partition_index": p.partition_index, "error_code": unsupported, "timestamp": -1,
                 "offset": -1, "leader_epoch": -1}
                for p in topic.partitions
                if not list_offsets_timestamp_supported(p.timestamp, version)
            ])  # fmt: skip
        return {"throttle_time": 0, "topics": topics}

    def _offset_for_leader_epoch(self, request: kc.Request) -> kc.Data:
        """OffsetForLeaderEpoch: where each asked epoch ends in the leader's log, which a
        consumer asks after a leader change to learn whether its position survived (KIP-320):
        dataplane/broker/offset_for_leader_epoch.py. Raftlog's followers ask over gRPC."""
        body = request.body
        answer = self.servicer.OffsetForLeaderEpoch(
            pb.OffsetForLeaderEpochRequest(
                topics=[
                    pb.OffsetForLeaderEpochTopic(
                        name=topic.topic,
                        partitions=[
                            pb.OffsetForLeaderEpochPartition(
                                partition=p.partition,
                                current_leader_epoch=p.current_leader_epoch,
                                leader_epoch=p.leader_epoch,
                            )
                            for p in topic.partitions
                        ],
                    )
                    for topic in body.topics
                ]
            ),
            _Call(),
        )
        return {
            "throttle_time": 0,
            "topics": _by_topic(answer.topics, "topic", "partitions", _epoch_end),
        }

    def _delete_records(self, request: kc.Request) -> kc.Data:
        """DeleteRecords, sent by clients to each partition's leader (Kafka's AdminClient
        groups the partitions by leader): see dataplane/broker/delete_records.py."""
        body = request.body
        answer = self.servicer.DeleteRecords(
            pb.DeleteRecordsRequest(
                timeout_ms=kc.millis(body.timeout),
                topics=[
                    pb.DeleteRecordsTopic(
                        name=topic.name,
                        partitions=[
                            pb.DeleteRecordsPartition(partition=p.partition_index, offset=p.offset)
                            for p in topic.partitions
                        ],
                    )
                    for topic in body.topics
                ],
            ),
            _Call(),
        )
        return {
            "throttle_time": 0,
            "topics": _by_topic(answer.topics, "name", "partitions", _trimmed),
        }

    def _init_producer_id(self, request: kc.Request) -> kc.Data:
        body = request.body
        init = pb.InitProducerIdRequest(
            transactional_id=body.transactional_id or "",
            transaction_timeout_ms=kc.millis(body.transaction_timeout),
        )
        if kc.field(body, "producer_id", -1) >= 0:  # v3+: KIP-360, the producer recovers
            init.producer_id = body.producer_id
            init.producer_epoch = body.producer_epoch
        answer = self.servicer.InitProducerId(init, _Call())
        return {
            "throttle_time": 0,
            "error_code": answer.error_code,
            "producer_id": answer.producer_id,
            "producer_epoch": answer.producer_epoch,
        }


def _by_topic(
    topics: Any, name_field: str, partitions_field: str, partition: Callable[[Any], kc.Data]
) -> list[kc.Data]:
    """A BrokerService answer's topics, each partition turned into Kafka's fields."""
    return [
        {name_field: topic.name, partitions_field: [partition(p) for p in topic.partitions]}
        for topic in topics
    ]


def _epoch_end(p: pb.OffsetForLeaderEpochPartitionResponse) -> kc.Data:
    return {
        "error_code": p.error_code, "partition": p.partition,
        "leader_epoch": p.leader_epoch, "end_offset": p.end_offset,
    }  # fmt: skip


def _produce_data(answer: pb.ProduceResponse) -> kc.Data:
    return {
        "responses": _by_topic(answer.topics, "name", "partition_responses", _produced),
        "throttle_time": 0,
    }


def _produced(p: pb.ProducePartitionResponse) -> kc.Data:
    return {
        "index": p.partition, "error_code": p.error_code, "base_offset": p.base_offset,
        "log_append_time": p.log_append_time_ms, "log_start_offset": p.log_start_offset,
        "record_errors": [], "error_message": p.error_message or None,
    }  # fmt: skip


# The first ListOffsets version that knows each sentinel timestamp (Kafka's ReplicaManager
# ``timestampMinSupportedVersion``): max timestamp (KIP-734), the local log start (KIP-405), the
# last tiered offset (KIP-1005)
LIST_OFFSETS_SENTINEL_MIN_VERSION = {
    LATEST_TIMESTAMP: 1, EARLIEST_TIMESTAMP: 1, MAX_TIMESTAMP: 7, EARLIEST_LOCAL_TIMESTAMP: 8,
    LATEST_TIERED_TIMESTAMP: 9,
}  # fmt: skip


def list_offsets_timestamp_supported(timestamp: int, version: int) -> bool:
    """Whether ListOffsets ``version`` can look ``timestamp`` up: any time (>= 0), or a
    sentinel that version defines."""
    if timestamp >= 0:
        return True
    minimum = LIST_OFFSETS_SENTINEL_MIN_VERSION.get(timestamp)
    return minimum is not None and version >= minimum


def _trimmed(p: pb.DeleteRecordsPartitionResponse) -> kc.Data:
    return {"partition_index": p.partition, "low_watermark": p.low_watermark,
            "error_code": p.error_code}  # fmt: skip


def _listed(p: pb.ListOffsetsPartitionResponse) -> kc.Data:
    return {
        "partition_index": p.partition, "error_code": p.error_code, "timestamp": p.timestamp,
        "offset": p.offset, "leader_epoch": p.leader_epoch,
    }  # fmt: skip


def _topic_metadata(topic: pb.TopicMetadata, operations: int) -> kc.Data:
    return {
        "error_code": topic.error_code,
        "name": topic.name,
        "topic_id": uuid_of(topic.topic_id),
        "is_internal": is_internal(topic.name),
        "partitions": [
            {
                "error_code": p.error_code,
                "partition_index": p.partition,
                "leader_id": p.leader_id,
                "leader_epoch": p.leader_epoch,
                "replica_nodes": list(p.replicas),
                "isr_nodes": list(p.isr),
                "offline_replicas": list(p.offline_replicas),
            }
            for p in topic.partitions
        ],
        "topic_authorized_operations": operations,
    }


def uuid_of(raw: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=raw) if len(raw) == 16 else uuid.UUID(int=0)


def _tls_failure(host: str, reason: str) -> AuthenticationFailure:
    return AuthenticationFailure(host, "SSL", None, reason)


def _read_exactly(connection: socket.socket, size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = connection.recv(min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _read_frame(connection: socket.socket, max_bytes: int = kc.MAX_FRAME_BYTES) -> bytes | None:
    """The next request frame, None when the client closed the connection between frames. A
    size above ``max_bytes`` (socket.request.max.bytes) closes the connection before anything
    is read or allocated for it (Kafka's InvalidReceiveException)."""
    head = _read_exactly(connection, kc.SIZE.size)
    if head is None:
        return None
    (size,) = kc.SIZE.unpack(head)
    if not 0 < size <= max_bytes:
        raise kc.FrameError(
            f"Invalid receive (size = {size} larger than {max_bytes}: socket.request.max.bytes)"
            if size > max_bytes else f"Invalid receive (size = {size})"
        )  # fmt: skip
    frame = _read_exactly(connection, size)
    if frame is None:
        raise kc.FrameError("the connection closed inside a frame")
    return frame


def send_frame(connection: socket.socket, parts: list[kc.Buffer]) -> None:
    """Write a response frame's buffers in order: one ``sendmsg`` (a gather write, as Kafka's
    broker writes a response's buffers) and more only for what the socket did not take at
    once. TLS encrypts in user space (no gather write): each buffer goes to ``sendall``."""
    if isinstance(connection, ssl.SSLSocket):
        for part in parts:
            connection.sendall(part)
        return
    pending = [memoryview(part) for part in parts if len(part)]
    first = 0
    while first < len(pending):
        sent = connection.sendmsg(pending[first : first + IOV_MAX])
        while first < len(pending) and sent >= len(pending[first]):
            sent -= len(pending[first])
            first += 1
        if sent:
            pending[first] = pending[first][sent:]


def _close(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)
    connection.close()
