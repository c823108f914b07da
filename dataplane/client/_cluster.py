"""The clients' view of the cluster: a thread-safe metadata cache and a pool of gRPC channels.

A :class:`Cluster` bootstraps from any of a list of ``host:port`` broker addresses
(``bootstrap.servers``), asks one broker for ``Metadata`` about the topics its owner cares
about, and answers "who leads this partition" from an immutable :class:`ClusterSnapshot`.
Callers that hit a stale leader call :meth:`Cluster.invalidate`; the next
:meth:`Cluster.maybe_refresh` asks again, no more often than the bounded exponential backoff
(``retry.backoff.ms`` doubling up to ``retry.backoff.max.ms``) allows. Every RPC carries a
deadline (``request.timeout.ms``).

Mapping a failed gRPC call to Kafka's error codes lives here, in :func:`rpc_error_code`, and
nowhere else in the client. Channels are made by ``open_channel`` with the client's
`ClientSecurity` (TLS, SASL session tokens; docs/security.md).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from metadata_quorum.grpc_errors import kafka_error_of
from metadata_quorum.security.channels import ClientSecurity, open_channel
from protos import broker_pb2 as pb
from protos import broker_pb2_grpc as pb_grpc
from protos import group_pb2_grpc as gpb_grpc
from protos import transaction_pb2_grpc as tpb_grpc
from protos import wire
from raftlog.errors import ErrorCode, KafkaError

_NO_ERROR = ErrorCode.NONE  # an enum member's class attribute costs ~90 ns: send reads this

NO_LEADER = -1

# what the public clients take as `security`: a ClientSecurity or its dotted properties
SecuritySetting = ClientSecurity | Mapping[str, str] | None


def client_security(setting: SecuritySetting) -> ClientSecurity | None:
    """`ClientSecurity` from the clients' `security` argument (ValueError names a bad key)."""
    if setting is None or isinstance(setting, ClientSecurity):
        return setting
    return ClientSecurity.from_properties(setting)


class BrokerChannel:
    """A broker's channel and its calls, made once (a stub makes a callable per method)."""

    __slots__ = ("channel", "fetch", "fetch_stream", "groups", "produce", "stub", "transactions")

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.stub = pb_grpc.BrokerServiceStub(channel)
        self.groups = gpb_grpc.GroupCoordinatorServiceStub(channel)
        self.transactions = tpb_grpc.TransactionCoordinatorServiceStub(channel)
        self.produce = wire.produce_method(channel)
        self.fetch = wire.fetch_method(channel)
        self.fetch_stream = wire.fetch_stream_method(channel)


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    leader_id: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...]
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: bytes
    error: ErrorCode
    error_message: str
    partitions: tuple[PartitionInfo, ...]  # sorted by partition id


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """One Metadata answer (merged over the topics asked about), never mutated."""

    cluster_id: str = ""
    controller_id: int = -1
    brokers: Mapping[int, BrokerInfo] = field(default_factory=dict)
    topics: Mapping[str, TopicInfo] = field(default_factory=dict)
    controller_addresses: tuple[str, ...] = ()

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        info = self.topics.get(topic)
        if info is None or not 0 <= partition < len(info.partitions):
            return None
        return info.partitions[partition]

    def leader(self, topic: str, partition: int) -> BrokerInfo | None:
        """The partition's leader when it is known and its address is known."""
        state = self.partition(topic, partition)
        if state is None or state.leader_id == NO_LEADER:
            return None
        return self.brokers.get(state.leader_id)

    def partition_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has, None when it is not (yet) known without error."""
        info = self.topics.get(topic)
        if info is None or info.error is not _NO_ERROR or not info.partitions:
            return None
        return len(info.partitions)

    def available_partitions(self, topic: str) -> list[int]:
        """Partitions of ``topic`` whose leader is known (Kafka's availablePartitionsForTopic)."""
        info = self.topics.get(topic)
        if info is None:
            return []
        return [p.partition for p in info.partitions if p.leader_id in self.brokers]


def parse_addresses(servers: str | Sequence[str]) -> list[str]:
    """``"h1:9092,h2:9092"`` or a list of ``host:port`` strings, checked."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    addresses = [item.strip() for item in items if item.strip()]
    if not addresses:
        raise ValueError("bootstrap.servers needs at least one host:port")
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"bootstrap address {address!r} is not host:port")
    return addresses


def rpc_error_code(error: grpc.RpcError) -> ErrorCode:
    """The Kafka error a failed gRPC call stands for: the one the server put in its trailers
    (metadata_quorum.grpc_errors), else from the status code gRPC itself ended the call with:
    UNAVAILABLE (no connection, broker down) and CANCELLED/ABORTED are NETWORK_EXCEPTION,
    DEADLINE_EXCEEDED is REQUEST_TIMED_OUT (both retriable); anything else means the broker
    refused the request itself."""
    carried = kafka_error_of(error)
    if carried is not None:
        return carried
    code = error.code() if isinstance(error, grpc.Call) else None
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED):
        return ErrorCode.NETWORK_EXCEPTION
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return ErrorCode.REQUEST_TIMED_OUT
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ErrorCode.RECORD_LIST_TOO_LARGE
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return ErrorCode.INVALID_REQUEST
    if code is grpc.StatusCode.UNAUTHENTICATED:  # no or refused credentials: not retriable
        return ErrorCode.SASL_AUTHENTICATION_FAILED
    return ErrorCode.UNKNOWN_SERVER_ERROR


def rpc_error(error: grpc.RpcError, what: str) -> KafkaError:
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    return KafkaError(rpc_error_code(error), f"{what}: {details}")


def _snapshot_from(
    response: pb.MetadataResponse, previous: ClusterSnapshot, replace_all: bool
) -> ClusterSnapshot:
    topics = {} if replace_all else dict(previous.topics)
    for topic in response.topics:
        partitions = sorted(
            (
                PartitionInfo(
                    partition=p.partition,
                    leader_id=p.leader_id,
                    leader_epoch=p.leader_epoch,
                    replicas=tuple(p.replicas),
                    isr=tuple(p.isr),
                    offline_replicas=tuple(p.offline_replicas),
                    error=ErrorCode.from_code(p.error_code),
                )
                for p in topic.partitions
            ),
            key=lambda p: p.partition,
        )
        if any(p.partition != index for index, p in enumerate(partitions)):
            raise KafkaError(
                ErrorCode.UNKNOWN_SERVER_ERROR, f"metadata for {topic.name} has partition gaps"
            )
        topics[topic.name] = TopicInfo(
            name=topic.name,
            topic_id=topic.topic_id,
            error=ErrorCode.from_code(topic.error_code),
            error_message=topic.error_message,
            partitions=tuple(partitions),
        )
    brokers = {b.node_id: BrokerInfo(b.node_id, b.host, b.port, b.rack) for b in response.brokers}
    return ClusterSnapshot(
        cluster_id=response.cluster_id,
        controller_id=response.controller_id,
        brokers=brokers,
        topics=topics,
        controller_addresses=tuple(response.controller_addresses),
    )


class Cluster:
    """Metadata cache + channel pool. Thread-safe: the producer's sender thread and the
    application's threads share one. Refreshes are serialised; readers never wait for one."""

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        metadata_max_age_ms: int = 300_000,
        clock: Callable[[], float] = time.monotonic,
        security: SecuritySetting = None,
    ) -> None:
        self.bootstrap = parse_addresses(bootstrap_servers)
        self.security = client_security(security)
        self.request_timeout_s = request_timeout_ms / 1000
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._retry_backoff_max_s = max(retry_backoff_max_ms, retry_backoff_ms) / 1000
        self._max_age_s = metadata_max_age_ms / 1000
        self._clock = clock
        self._lock = threading.Lock()  # guards the fields below
        self._refresh_lock = threading.Lock()  # one Metadata call at a time
        self._snapshot = ClusterSnapshot()
        self._topics: set[str] = set()
        self._stale = True
        self._last_attempt_s = -math.inf
        self._last_success_s = -math.inf
        self._failures = 0
        self._channels: dict[str, BrokerChannel] = {}
        self._closed = False

    # -- reading ---------------------------------------------------------------------------
    def snapshot(self) -> ClusterSnapshot:
        # No lock: a snapshot is immutable and replaced whole (one attribute store), and this
        # runs on every send, where taking a lock the sender thread also takes costs a GIL
        # hand-off whenever the two meet.
        return self._snapshot

    def add_topics(self, topics: Iterable[str]) -> None:
        """Ask about ``topics`` in every later refresh; a new one makes the cache stale."""
        with self._lock:
            new = set(topics) - self._topics
            if new:
                self._topics |= new
                self._stale = True

    def invalidate(self) -> None:
        """The cache was found wrong (a stale leader, a network error): refresh soon."""
        with self._lock:
            self._stale = True

    def backoff_s(self) -> float:
        """How long to wait before the next attempt after failures: exponential, bounded."""
        with self._lock:
            failures = self._failures
        return float(min(self._retry_backoff_s * 2 ** min(failures, 16), self._retry_backoff_max_s))

    def needs_refresh(self) -> bool:
        now = self._clock()
        with self._lock:
            due = self._stale or now - self._last_success_s >= self._max_age_s
            return due and now - self._last_attempt_s >= self._backoff_locked()

    def _backoff_locked(self) -> float:
        return float(
            min(self._retry_backoff_s * 2 ** min(self._failures, 16), self._retry_backoff_max_s)
        )

    # -- refreshing ------------------------------------------------------------------------
    def maybe_refresh(self) -> KafkaError | None:
        """Refresh when stale and the backoff has passed. Returns the failure (a value: the
        caller decides, usually to try again later) or None."""
        if not self.needs_refresh():
            return None
        try:
            self.refresh()
        except KafkaError as error:
            return error
        return None

    def refresh(self, topics: Iterable[str] = (), *, all_topics: bool = False) -> ClusterSnapshot:
        """Ask one broker (known brokers first, then the bootstrap list) for metadata about
        every topic of interest plus ``topics``. Raises KafkaError(NETWORK_EXCEPTION) when no
        broker answered."""
        self.add_topics(topics)
        with self._refresh_lock:
            with self._lock:
                wanted = sorted(self._topics)
                self._last_attempt_s = self._clock()
                self._stale = False
            request = pb.MetadataRequest(topics=wanted, all_topics=all_topics)
            failures: list[str] = []
            for address in self.candidates():
                try:
                    response = self.stub(address).Metadata(
                        request, timeout=min(self.request_timeout_s, 10.0)
                    )
                except grpc.RpcError as error:
                    failure = rpc_error(error, address)
                    if failure.error is ErrorCode.SASL_AUTHENTICATION_FAILED:
                        with self._lock:
                            self._failures += 1
                            self._stale = True
                        raise failure from None  # credentials refused: no broker takes them
                    failures.append(str(failure))
                    continue
                return self._install(response, all_topics)
            with self._lock:
                self._failures += 1
                self._stale = True
            raise KafkaError(
                ErrorCode.NETWORK_EXCEPTION, "no broker answered Metadata: " + "; ".join(failures)
            )

    def _install(self, response: pb.MetadataResponse, all_topics: bool) -> ClusterSnapshot:
        with self._lock:
            snapshot = _snapshot_from(response, self._snapshot, all_topics)
            self._snapshot = snapshot
            self._failures = 0
            self._last_success_s = self._clock()
            return snapshot

    def any_broker(self) -> str:
        """The address of some broker (a known one, else the first bootstrap address)."""
        return self.candidates()[0]

    def candidates(self) -> list[str]:
        """Brokers to ask, known ones first, then the bootstrap addresses."""
        known = [b.address for b in self.snapshot().brokers.values()]
        return known + [a for a in self.bootstrap if a not in known]

    def wait_for_topic(self, topic: str, timeout_s: float) -> TopicInfo:
        """Metadata for ``topic`` with its partitions, refreshing with backoff while it is
        unknown or in a retriable error, for at most ``timeout_s``. Raises its KafkaError."""
        deadline = self._clock() + timeout_s
        self.add_topics([topic])
        last: KafkaError | None = None
        while True:
            info = self.snapshot().topics.get(topic)
            if info is not None and info.error is ErrorCode.NONE and info.partitions:
                return info
            if info is not None and info.error is not ErrorCode.NONE:
                last = KafkaError(info.error, info.error_message or topic)
                if not info.error.retriable:
                    raise last
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise last or KafkaError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"{topic} not in metadata after {timeout_s}s",
                )
            self._sleep(min(self.backoff_s(), remaining) if last is not None else 0.0)
            try:
                self.refresh([topic])
            except KafkaError as error:
                if not error.error.retriable:  # refused credentials: waiting changes nothing
                    raise
                last = error

    def _sleep(self, seconds: float) -> None:
        """Back off between metadata attempts (not a synchronisation: nothing signals)."""
        if seconds > 0:
            time.sleep(seconds)

    # -- channels --------------------------------------------------------------------------
    def stub(self, target: BrokerInfo | str) -> pb_grpc.BrokerServiceStub:
        return self._channel(target).stub

    def group_stub(self, target: BrokerInfo | str) -> gpb_grpc.GroupCoordinatorServiceStub:
        """The group coordinator API of a broker (same listener, same channel)."""
        return self._channel(target).groups

    def transaction_stub(
        self, target: BrokerInfo | str
    ) -> tpb_grpc.TransactionCoordinatorServiceStub:
        """The transaction coordinator API of a broker (same listener, same channel)."""
        return self._channel(target).transactions

    def produce_method(self, target: BrokerInfo | str) -> grpc.UnaryUnaryMultiCallable:
        """Produce taking the bytes of ``protos.wire.encode`` (records beside the request)."""
        return self._channel(target).produce

    def fetch_method(self, target: BrokerInfo | str) -> grpc.UnaryUnaryMultiCallable:
        """Fetch answering a ``protos.wire.FetchAnswer`` (records as views of the answer)."""
        return self._channel(target).fetch

    def fetch_stream_method(self, target: BrokerInfo | str) -> grpc.UnaryStreamMultiCallable:
        """FetchStream answering ``protos.wire.FetchStreamAnswer`` messages."""
        return self._channel(target).fetch_stream

    def _channel(self, target: BrokerInfo | str) -> BrokerChannel:
        address = target.address if isinstance(target, BrokerInfo) else target
        with self._lock:
            if self._closed:
                raise KafkaError(ErrorCode.NETWORK_EXCEPTION, "the client is closed")
            channel = self._channels.get(address)
            if channel is None:
                channel = BrokerChannel(open_channel(address, self.security))
                self._channels[address] = channel
        return channel

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
        for channel in channels:
            channel.channel.close()
