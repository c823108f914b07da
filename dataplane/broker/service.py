"""BrokerService: Produce, Fetch, FetchStream, ListOffsets, Metadata, InitProducerId,
WriteTxnMarkers, DescribeProducers and DeleteRecords over gRPC (FetchStream, a server-streaming
consumer Fetch: dataplane.broker.fetch_stream).

Every partition-level problem is answered in that partition's entry with Kafka's error code; the
RPC fails only when the request itself is broken. Long polls (acks=all, fetch ``min_bytes``)
wait on events the partitions set on every append, high watermark move and role change, bounded
by the request's own timeout.

Transactions (issue 27). A transactional batch needs the request's ``transactional_id``
(Kafka answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED without it). When the broker server sets
``verify_transaction``, the first transactional batch of a producer with no open transaction on
a partition is verified with the transaction coordinator first (KIP-890), outside the partition's
lock, holding a guard a marker voids (``Partition.start_verification``). Fetch and ListOffsets
honour ``isolation_level`` (read_committed: up to the last stable offset, with the aborted
transactions of what was read). WriteTxnMarkers appends the coordinator's markers, each
partition's through the writer its internal topic registered in ``marker_writers`` or as an
acks=all append, and answers once they are replicated.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from dataplane.broker import authorization as authz
from dataplane.broker import delete_records, fetch_stream, offset_for_leader_epoch
from dataplane.broker.answer_errors import fill_error
from dataplane.broker.fetch_sessions import CACHE_SLOTS_DEFAULT
from dataplane.broker.follower_sessions import FollowerSessions
from dataplane.broker.log_dirs import disk_usage, log_dir_path, replica_logs
from dataplane.broker.metrics import NodeMetrics
from dataplane.broker.partition import (
    ON_APPEND,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    IsrChange,
    LeaderView,
    Partition,
    Role,
)
from dataplane.broker.producer_state import SENTINEL, VerificationGuard
from dataplane.broker.replica_manager import ReplicaManager
from dataplane.broker.replica_selector import ReplicaView, preferred_read_replica
from dataplane.broker.schema_validation import SchemaIdKnown, check_schema_ids
from metadata_quorum.grpc_errors import abort
from metadata_quorum.grpc_standard import (
    DEFAULT_KEEPALIVE,
    Keepalive,
    NodeHealth,
    RichErrors,
    add_standard_services,
    is_standard_method,
)
from metadata_quorum.image import MetadataImage
from metadata_quorum.replication import INTERNAL_TOPICS, validate_topic_name
from metadata_quorum.request_authorization import check_cluster
from metadata_quorum.request_handler_pool import KEEP_ALIVE_S, RequestHandlerPool
from metadata_quorum.security.acl import AclOperation
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl
from metadata_quorum.security.grpc_auth import AUTHENTICATION_SERVICE, ServerSecurity
from protos import broker_pb2 as pb
from protos import broker_pb2_grpc as pb_grpc
from protos import group_pb2 as gpb
from protos import group_pb2_grpc as gpb_grpc
from protos import share_pb2 as spb
from protos import share_pb2_grpc as spb_grpc
from protos import transaction_pb2 as tpb
from protos import transaction_pb2_grpc as tpb_grpc
from protos import wire
from protos.wire import FetchAnswer, Records
from raftlog.batch import HEADER_SIZE, NO_PRODUCER_ID, read_header
from raftlog.errors import ErrorCode, KafkaError, OffsetOutOfRangeError
from raftlog.log import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIERED_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
)

log = logging.getLogger(__name__)
MAX_WAIT_MS_MAX = 60_000
PRODUCE_TIMEOUT_MS_MAX = 300_000
MAX_MESSAGE_BYTES = 100 * 1024 * 1024  # socket.request.max.bytes
# FetchStream calls at once, without `serve` (in-process callers); `serve`: half its pool
FETCH_STREAMS_MAX = 32
ACKS = (0, 1, -1)
DEBUGGING_REPLICA_ID = -2
BROKER_LISTENER = "BROKER"  # the gRPC listener's name in a broker's registration
# written by their coordinators only (groups, transactions)
# How long an idempotent batch that overtook an earlier one of its producer waits for it: a
# concurrent request is served within milliseconds; one that was lost is resent by the client.
SEQUENCE_WAIT_S = 1.0
# How long WriteTxnMarkers waits for its markers' replication (Kafka: request.timeout.ms)
MARKER_TIMEOUT_MS = 30_000
# Errors of a transaction verification that older clients may not retry: answered as
# NOT_ENOUGH_REPLICAS, retriable without a metadata refresh (Kafka's ReplicaManager does this)
VERIFICATION_RETRIABLE = frozenset({
    ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_COORDINATOR,
})  # fmt: skip
# (transactional id, producer id, producer epoch, topic, partition) -> NONE or the refusal
TransactionVerifier = Callable[[str, int, int, str, int], ErrorCode]
# (partition, producer id, producer epoch, commit, coordinator epoch): returns once the marker
# is stored and replicated, or raises KafkaError
MarkerWriter = Callable[[int, int, int, bool, int], None]


DEADLINE_PASSED_ON_ARRIVAL = "the call's deadline passed before the broker read it: none appended"
DEADLINE_PASSED_REPLICATING = (
    "the call's deadline passed before the ISR replicated the batch; it stays appended: retry "
    "it with the same producer id, epoch and sequence to learn its offsets"
)


def _call_deadline(context: Any) -> float | None:
    """The gRPC call's deadline on the monotonic clock; None: the client set none."""
    remaining_s = context.time_remaining()
    return None if remaining_s is None else time.monotonic() + remaining_s


def wait_until(
    partitions: list[Partition],
    deadline: float,
    done: Callable[[], bool],
    high_watermarks: Sequence[int] | None = None,
    context: Any = None,
) -> None:
    """Wait until ``done()`` or the deadline, woken by any of ``partitions``: by any change,
    or with ``high_watermarks`` (one per partition) by one of role, epoch or ISR and once the
    high watermark reaches its mark (``ON_APPEND``: on appends; see ``Partition.add_waiter``).
    With the call's gRPC ``context``, also when the call ends (cancelled by the client, its
    deadline passed, the connection lost): nobody waits for the answer, so the waiter leaves
    the partitions at once instead of at ``deadline``."""
    event = threading.Event()
    for n, partition in enumerate(partitions):
        partition.add_waiter(event, None if high_watermarks is None else high_watermarks[n])
    if context is not None:
        context.add_callback(event.set)  # False: it has ended already, is_active says so
    try:
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (context is not None and not context.is_active()):
                return
            event.wait(remaining)
            event.clear()
    finally:
        for partition in partitions:
            partition.remove_waiter(event)


class _Waker:
    """What one partition sets for a waiter on many (``wait_for_each``): it says which
    partition woke the waiter, then wakes it."""

    __slots__ = ("event", "index", "woken")

    def __init__(self, event: threading.Event, index: int, woken: deque[int]) -> None:
        self.event, self.index, self.woken = event, index, woken

    def set(self) -> None:
        self.woken.append(self.index)  # before the event: the waiter reads it once woken
        self.event.set()


def wait_for_each(
    partitions: list[Partition],
    deadline: float,
    settled: Callable[[int], bool],
    high_watermarks: Sequence[int],
    context: Any = None,
) -> set[int]:
    """Wait until ``settled(i)`` for each of ``partitions`` (its index), woken as
    ``wait_until`` with ``high_watermarks``, until the deadline or the end of the gRPC call of
    ``context``; return the indexes not settled. Each index is asked once at first, then only
    when its own partition woke the waiter. An acks=all produce asked every pending partition
    at each wake-up: quadratic in a request's partitions, hundreds when records spread over
    1,000 partitions (no end-to-end gain measured there: that run waits elsewhere)."""
    event = threading.Event()
    woken: deque[int] = deque()
    wakers = [_Waker(event, index, woken) for index in range(len(partitions))]
    for partition, waker, mark in zip(partitions, wakers, high_watermarks, strict=True):
        partition.add_waiter(waker, mark)
    if context is not None:
        context.add_callback(event.set)  # False: it has ended already, is_active says so
    pending = set(range(len(partitions)))
    try:
        asked: Iterable[int] = range(len(partitions))
        while True:
            pending.difference_update([i for i in asked if i in pending and settled(i)])
            if not pending:
                return pending
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (context is not None and not context.is_active()):
                return pending
            event.wait(remaining)
            event.clear()
            asked = set()
            while woken:
                asked.add(woken.popleft())
    finally:
        for partition, waker in zip(partitions, wakers, strict=True):
            partition.remove_waiter(waker)


DROPPED_RESPONSES_HELD_MAX = 16  # fault injection: server threads lost answers may hold


class ProduceResponseDropper:
    """Fault injection for chaos testing, off by default: with ``fault.produce.drop.response.every``
    N > 0, every Nth Produce request that expects an answer (acks 1 or all) is served in full
    (appended, and for acks=all replicated) and its response is then lost. The call is held
    unanswered until the client's deadline passes or it cancels, so the client sees
    DEADLINE_EXCEEDED after its ``request.timeout.ms``, as when an answer is lost on the way;
    then the call ends UNAVAILABLE. Each held call holds a server thread, so at most
    ``DROPPED_RESPONSES_HELD_MAX`` are held at once; beyond that the call ends UNAVAILABLE at
    once (an answer lost with a reset connection). The client's retry meets records already
    stored: an idempotent producer gets their original offsets, a plain one stores them twice."""

    def __init__(self, every: int) -> None:
        self.every = every
        self._lock = threading.Lock()
        self._answered = 0  # Produce requests that expected an answer
        self._held = 0

    def maybe_drop(self, context: Any) -> None:
        """Return to let the response go; raise (grpc's abort) to lose it."""
        if self.every <= 0:
            return
        with self._lock:
            self._answered += 1
            if self._answered % self.every:
                return
            hold = self._held < DROPPED_RESPONSES_HELD_MAX
            self._held += hold
            request_number = self._answered
        log.info("fault.produce.drop.response.every=%d: dropping the response of request %d",
                 self.every, request_number)  # fmt: skip
        try:
            if hold:
                ended = threading.Event()
                if context.add_callback(ended.set):  # False: the call has already ended
                    remaining_s = context.time_remaining()
                    held_max_s = PRODUCE_TIMEOUT_MS_MAX / 1000
                    ended.wait(held_max_s if remaining_s is None else min(remaining_s, held_max_s))
        finally:
            with self._lock:
                self._held -= hold
        context.abort(
            grpc.StatusCode.UNAVAILABLE, "response dropped: fault.produce.drop.response.every"
        )


@dataclass
class PendingProduce:
    """A produce appended, its acks=all partitions still waiting for the ISR."""

    servicer: BrokerServicer
    request: pb.ProduceRequest
    response: pb.ProduceResponse
    waiting: list[tuple[Partition, int, int, int, Any]]
    context: Any
    started: float
    call_deadline: float | None
    grpc_deadline: bool
    deadline: float  # monotonic: the end of the request's timeout_ms, counted from the append

    def finish(self) -> pb.ProduceResponse:
        """Wait for the replication (up to the request's timeout) and answer."""
        return self.servicer._finish_produce(self)


class BrokerServicer(pb_grpc.BrokerServiceServicer):
    # Set by the broker server: InitProducerId with a transactional id, answered by this
    # broker's transaction coordinator (dataplane.coordinator.transaction_coordinator).
    init_transactional_producer: (
        Callable[[pb.InitProducerIdRequest], pb.InitProducerIdResponse] | None
    ) = None
    # Set by the broker server: asks a transactional id's coordinator whether the producer's
    # transaction is ongoing and includes the partition (KIP-890); None: no verification.
    verify_transaction: TransactionVerifier | None = None
    # Set by the node when it runs a schema registry: whether a schema id is registered, for
    # topics with key/value.schema.validation (dataplane.broker.schema_validation); None: no
    # registry here, and a produce to such a topic is refused.
    schema_id_known: SchemaIdKnown | None = None
    # Set by the broker server: share groups' ShareFetch / ShareAcknowledge (KIP-932), served by
    # the broker's share partition manager (dataplane.coordinator.share_grpc); None: no share
    # groups here.
    share_fetch: Callable[[pb.ShareFetchRequest], pb.ShareFetchResponse] | None = None
    share_acknowledge: (
        Callable[[pb.ShareAcknowledgeRequest], pb.ShareAcknowledgeResponse] | None
    ) = None

    def __init__(
        self,
        broker_id: int,
        replicas: ReplicaManager,
        metrics: NodeMetrics,
        cluster_id: str,
        controller_addresses: list[str],
        alter_partition: Callable[[IsrChange], None],
        allocate_producer_id: Callable[[], int],
        *,
        drop_produce_response_every: int = 0,
        access: AccessControl = ALLOW_ALL,
        replica_selector: str | None = None,
        fetch_session_cache_slots: int = CACHE_SLOTS_DEFAULT,
    ) -> None:
        self.broker_id = broker_id
        self.access = access  # who may do what (dataplane.broker.authorization)
        # replica.selector.class (KIP-392; None: the leader serves every consumer)
        self.replica_selector = replica_selector
        self.replicas = replicas
        self.metrics = metrics
        self.cluster_id = cluster_id
        self.controller_addresses = controller_addresses
        self.alter_partition = alter_partition
        self.allocate_producer_id = allocate_producer_id
        self.produce_faults = ProduceResponseDropper(drop_produce_response_every)
        # FetchStream calls running at once (each holds a server thread); `serve` sets the
        # bound from its pool's size
        self.fetch_streams = fetch_stream.StreamSlots(FETCH_STREAMS_MAX)
        # internal topic -> how its coordinator writes a marker there (``__consumer_offsets``:
        # the group coordinator, which also applies the transaction's pending offsets)
        self.marker_writers: dict[str, MarkerWriter] = {}
        # followers' fetch sessions (KIP-227): dataplane.broker.follower_sessions
        self.follower_sessions = FollowerSessions(
            self, replicas.clock_ms, lambda: replicas.config.replica_lag_time_max_ms,
            metrics.replica_fetches, fetch_session_cache_slots,
        )  # fmt: skip

    # -- Produce -------------------------------------------------------------------------------
    def Produce(self, request: pb.ProduceRequest, context: Any) -> pb.ProduceResponse:
        """A request with its records inside (in-process callers; the Kafka listener calls
        `produce` with the records beside the request). Its requests come one at a time, in
        order: a sequence gap there is real, not waited on."""
        records = [item.records for topic in request.topics for item in topic.partitions]
        return self.produce(request, records, context, sequence_wait_s=0.0)

    def produce(
        self,
        request: pb.ProduceRequest,
        records: Sequence[Records],
        context: Any,
        *,
        sequence_wait_s: float = SEQUENCE_WAIT_S,
        grpc_deadline: bool = False,
    ) -> pb.ProduceResponse:
        """``request``'s partitions' records are ``records``, in message order (from the wire:
        views of the received bytes, see ``protos.wire``). An idempotent batch that overtook
        an earlier one of its producer waits for it up to ``sequence_wait_s`` (gRPC serves a
        client's concurrent requests in any order: see ``dataplane.broker.partition``).

        ``grpc_deadline``: ``context`` is a gRPC call's, whose deadline bounds the request: one
        that arrives past it is refused before anything is appended, and acks=all stops
        waiting when it passes (or the client cancels) and ends DEADLINE_EXCEEDED. What was
        appended stays: the producer's retry of the same batch (same producer id, epoch and
        sequence) is answered with its first offsets, not stored again."""
        appended = self.produce_append(
            request, records, context, sequence_wait_s=sequence_wait_s, grpc_deadline=grpc_deadline
        )
        return appended if isinstance(appended, pb.ProduceResponse) else appended.finish()

    def produce_append(
        self,
        request: pb.ProduceRequest,
        records: Sequence[Records],
        context: Any,
        *,
        sequence_wait_s: float = SEQUENCE_WAIT_S,
        grpc_deadline: bool = False,
    ) -> pb.ProduceResponse | PendingProduce:
        """`produce` up to its wait for acks=all: the answer, or the appended request still
        waiting for the ISR (its `finish` waits and answers). The Kafka listener appends a
        connection's requests in order and lets their replication waits overlap (dataplane/
        kafka/listener.py)."""
        started = time.perf_counter()
        call_deadline = _call_deadline(context) if grpc_deadline else None
        if call_deadline is not None and call_deadline <= time.monotonic():
            abort(context, KafkaError(ErrorCode.REQUEST_TIMED_OUT, DEADLINE_PASSED_ON_ARRIVAL))
        if not request.transactional_id and any(map(_is_transactional, records)):
            return _refuse_all(
                request,
                ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "transactional records need the producer's transactional id",
            )
        if request.transactional_id and any(map(_is_transactional, records)):
            refused = authz.transactional_id_denied(self.access, request.transactional_id)
            if refused is not None:
                return _refuse_all(request, refused.error, refused.message)
        denied = authz.denied_topics(
            self.access, AclOperation.WRITE, (t.name for t in request.topics)
        )
        response = pb.ProduceResponse()
        waiting: list[tuple[Partition, int, int, int, Any]] = []
        each = iter(records)
        for topic in request.topics:
            out = response.topics.add(name=topic.name)
            for item in topic.partitions:
                data = next(each)
                result = out.partitions.add(
                    partition=item.partition, base_offset=-1, log_append_time_ms=-1,
                    log_start_offset=-1, leader_id=-1, leader_epoch=-1,
                )  # fmt: skip
                try:
                    if topic.name in denied:  # nothing of it is appended
                        raise authz.topic_denied(AclOperation.WRITE, topic.name)
                    waiting += self._append(
                        request, topic.name, item.partition, data, result, sequence_wait_s
                    )
                except KafkaError as error:
                    fill_error(result, error)
                    self.metrics.request_errors.labels("produce", error.error.name).inc()
        # the request's timeout runs from its append, also when its wait starts later (the
        # Kafka listener finishes a connection's requests in order)
        timeout_ms = min(max(request.timeout_ms, 0), PRODUCE_TIMEOUT_MS_MAX)
        pending = PendingProduce(
            self, request, response, waiting, context, started, call_deadline, grpc_deadline,
            time.monotonic() + timeout_ms / 1000,
        )  # fmt: skip
        return pending if waiting else pending.finish()

    def _finish_produce(self, pending: PendingProduce) -> pb.ProduceResponse:
        """`PendingProduce.finish`: the wait for acks=all, then the answer."""
        request, context, call_deadline = pending.request, pending.context, pending.call_deadline
        waiting = pending.waiting
        if waiting:
            deadline = pending.deadline
            if call_deadline is not None and call_deadline < deadline:
                left = self._await_replication(waiting, call_deadline, context)
                if left:
                    abort(
                        context,
                        KafkaError(ErrorCode.REQUEST_TIMED_OUT, DEADLINE_PASSED_REPLICATING),
                    )
            else:
                grpc_context = context if pending.grpc_deadline else None
                self._await_replication(waiting, deadline, grpc_context)
        elapsed = time.perf_counter() - pending.started
        self.metrics.request_latency.labels("produce").observe(elapsed)
        if request.acks == 0:
            return pb.ProduceResponse()
        self.produce_faults.maybe_drop(context)
        return pending.response

    def _append(
        self,
        request: pb.ProduceRequest,
        topic: str,
        index: int,
        records: Records,
        result: pb.ProducePartitionResponse,
        sequence_wait_s: float,
    ) -> list[tuple[Partition, int, int, int, Any]]:
        acks = request.acks
        if acks not in ACKS:
            raise KafkaError(
                ErrorCode.INVALID_REQUIRED_ACKS, f"acks must be 0, 1 or -1, not {acks}"
            )
        if topic in INTERNAL_TOPICS:
            raise KafkaError(
                ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"{topic} is internal: only its group coordinators write it",
            )
        partition = self.replicas.get(topic, index)
        settings = self.replicas.settings(topic)
        min_isr = settings.min_insync_replicas
        check_schema_ids(
            records, settings.log_config.key_schema_validation,
            settings.log_config.value_schema_validation, self.schema_id_known,
            self.replicas.broker_id,
        )  # fmt: skip
        verification = self._verify(request.transactional_id, partition, records)
        info, epoch = partition.append_as_leader(
            records, acks, min_isr, sequence_wait_s, verification
        )
        result.base_offset = info.first_offset
        result.log_append_time_ms = info.log_append_time_ms
        result.log_start_offset = partition.log.log_start_offset
        self.metrics.bytes_in.labels(topic).inc(info.size_bytes)
        self.metrics.messages_in.labels(topic).inc(info.record_count)
        if acks != -1:
            return []
        return [(partition, info.last_offset + 1, epoch, min_isr, result)]

    def _verify(
        self, transactional_id: str, partition: Partition, records: Records
    ) -> VerificationGuard | None:
        """KIP-890: before a transactional batch of a producer with no open transaction on
        ``partition``, ask its coordinator (``verify_transaction``, outside any lock) whether
        its transaction is ongoing and holds the partition. The guard returned goes with the
        append, which refuses it if a marker landed meanwhile. None: nothing to verify."""
        verify = self.verify_transaction
        if verify is None or not _is_transactional(records):
            return None
        header = read_header(records)
        guard = partition.start_verification(header.producer_id, header.producer_epoch)
        if guard is SENTINEL:
            return guard
        error = verify(transactional_id, header.producer_id, header.producer_epoch,
                       partition.topic, partition.partition)  # fmt: skip
        if error is ErrorCode.NONE:
            return guard
        if error in VERIFICATION_RETRIABLE:
            raise KafkaError(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                f"{partition.name}: could not verify that the partition is in the transaction: "
                f"{error.name}",
            )
        raise KafkaError(
            error, f"{partition.name}: the transaction coordinator refused: {error.name}"
        )

    def _await_replication(
        self,
        waiting: list[tuple[Partition, int, int, int, Any]],
        deadline: float,
        context: Any = None,
    ) -> int:
        """Wait for acks=all; the number of partitions still waiting at the deadline (or when
        the gRPC call of ``context`` ended), each answered REQUEST_TIMED_OUT."""

        def settled(index: int) -> bool:
            partition, required, epoch, min_isr, result = waiting[index]
            try:
                outcome = partition.acks_all_outcome(required, epoch, min_isr)
            except KafkaError as error:
                fill_error(result, error)
                if "base_offset" in result.DESCRIPTOR.fields_by_name:
                    result.base_offset = -1
                outcome = error.error
            if outcome is None:
                return False
            if outcome is not ErrorCode.NONE and not result.error_code:
                result.error_code = outcome.code
                result.error_message = f"{partition.name}: ISR {list(partition.isr)}"
            return True

        partitions = [entry[0] for entry in waiting]
        pending = wait_for_each(
            partitions, deadline, settled, [entry[1] for entry in waiting], context
        )
        for index in pending:
            result = waiting[index][4]
            result.error_code = ErrorCode.REQUEST_TIMED_OUT.code
            result.error_message = "the ISR did not replicate the batch within timeout_ms"
        return len(pending)

    # -- Fetch ---------------------------------------------------------------------------------
    def Fetch(self, request: pb.FetchRequest, context: Any) -> pb.FetchResponse:
        """The response with its records inside (in-process callers; the Kafka listener
        calls `fetch` and sends the records as they are)."""
        return self.fetch(request).message()

    def fetch(
        self, request: pb.FetchRequest, listener: str = BROKER_LISTENER, context: Any = None
    ) -> FetchAnswer:
        """``listener``: the one the client came through (a preferred read replica must have
        an endpoint there, KIP-392); ``context``: the gRPC call's, whose end (a cancel, a
        passed deadline) ends the long poll at once (`wait_until`)."""
        started = time.perf_counter()
        if (
            request.replica_id >= 0
            and request.HasField("session_epoch")
            and not self._fetch_denied(request)
        ):
            max_wait_ms = min(max(request.max_wait_ms, 0), MAX_WAIT_MS_MAX)
            deadline = time.monotonic() + max_wait_ms / 1000
            answer = self.follower_sessions.fetch(request, deadline, context)
        else:
            answer = self.read_request(request, context, listener)
        kind = "fetch_follower" if request.replica_id >= 0 else "fetch_consumer"
        self.metrics.request_latency.labels(kind).observe(time.perf_counter() - started)
        return answer

    def read_request(
        self, request: pb.FetchRequest, context: Any, listener: str = BROKER_LISTENER
    ) -> FetchAnswer:
        """Every partition the request names, read, and read again as they change until
        ``min_bytes`` are ready or ``max_wait_ms`` passed."""
        max_wait_ms = min(max(request.max_wait_ms, 0), MAX_WAIT_MS_MAX)
        deadline = time.monotonic() + max_wait_ms / 1000
        denied = self._fetch_denied(request)
        answer, size_bytes, hosted = self._read_all(request, denied, listener)
        if (
            size_bytes < max(request.min_bytes, 1)
            and max_wait_ms > 0
            and not _answer_now(answer.response)
        ):

            def done() -> bool:
                nonlocal answer, size_bytes
                answer, size_bytes, _ = self._read_all(request, denied, listener)
                return size_bytes >= max(request.min_bytes, 1) or _answer_now(answer.response)

            # a follower waits for appends; the high watermark it learns on its next fetch
            marks = [ON_APPEND] * len(hosted) if request.replica_id >= 0 else None
            if request.replica_id >= 0:
                deadline = min(deadline, self.quota_deadline(request.replica_id, hosted))
            wait_until(hosted, deadline, done, marks, context)
        return answer

    # the follower sessions' reader (dataplane.broker.follower_sessions.SessionReader)
    def lookup(self, topic: str, partition: int) -> Partition:
        return self.replicas.get(topic, partition)

    def read_partition(
        self, request: pb.FetchRequest, partition: Partition, item: pb.FetchPartition,
        max_bytes: int, first: bool, result: pb.FetchPartitionResponse,
    ) -> Records:  # fmt: skip
        return self._read(request, partition, item, max_bytes, first, result, BROKER_LISTENER)

    # -- FetchStream ---------------------------------------------------------------------------
    def FetchStream(
        self, request: pb.FetchStreamRequest, context: Any
    ) -> Iterator[pb.FetchStreamResponse]:
        """The messages with their records inside (in-process callers)."""
        for answer in self.fetch_stream(request, context):
            yield answer.message()

    def fetch_stream(
        self, request: pb.FetchStreamRequest, context: Any
    ) -> Iterator[wire.FetchStreamAnswer]:
        """A consumer's subscription (dataplane.broker.fetch_stream): each read is this
        servicer's consumer Fetch, refused per topic as Fetch refuses (READ), checked once."""
        try:
            fetch_stream.start_offsets(request)  # a request that cannot be served: no slot
            denied = self._fetch_denied(fetch_stream.fetch_request(request, _zeros(request)))
            messages = fetch_stream.stream(
                request, context, lambda fetch: self._read_all(fetch, denied, BROKER_LISTENER),
                self.fetch_streams,
            )  # fmt: skip
            yield from messages
        except KafkaError as error:
            self.metrics.request_errors.labels("fetch_stream", error.error.name).inc()
            exhausted = isinstance(error, fetch_stream.TooManyStreams)
            abort(context, error, grpc.StatusCode.RESOURCE_EXHAUSTED if exhausted else None)

    def _preferred_read_replica(
        self, request: pb.FetchRequest, partition: Partition, item: pb.FetchPartition,
        listener: str,
    ) -> tuple[LeaderView, int] | None:  # fmt: skip
        """Kafka's ``findPreferredReadReplica``: as this partition's leader, the follower the
        consumer should read from (dataplane.broker.replica_selector), with the offsets to
        answer beside it; None to serve it here. Candidates: followers in the ISR that hold
        the fetch offset and are registered, unfenced and reachable on ``listener``."""
        view = partition.leader_view(item.current_leader_epoch)
        if view is None:
            return None
        brokers = self.replicas.image.brokers
        now_ms = partition.clock_ms()
        offset = item.fetch_offset
        candidates = []
        for follower in view.followers:
            broker = brokers.get(follower.broker_id)
            if (
                follower.broker_id in view.isr
                and follower.log_start_offset <= offset <= follower.log_end_offset
                and broker is not None
                and not broker.fenced
                and broker.endpoint(listener) is not None
            ):
                candidates.append(ReplicaView(
                    follower.broker_id, broker.rack, follower.log_end_offset,
                    now_ms - follower.last_caught_up_ms,
                ))  # fmt: skip
        me = brokers.get(self.broker_id)
        leader = ReplicaView(self.broker_id, me.rack if me else None, view.log_end_offset, 0)
        chosen = preferred_read_replica(self.replica_selector, request.rack_id, leader, candidates)
        return None if chosen is None else (view, chosen)

    def quota_deadline(self, replica_id: int, hosted: list[Partition]) -> float:
        """A fetch that holds back throttled replicas is answered (empty) once the leader's
        quota is out of debt, not at ``max_wait_ms``: the follower asks again at once."""
        if any(p.leader_throttles(replica_id) for p in hosted):
            delay_ms = self.replicas.leader_quota.delay_ms()
            if delay_ms > 0:
                return time.monotonic() + delay_ms / 1000
        return math.inf

    def _fetch_denied(self, request: pb.FetchRequest) -> dict[str, KafkaError]:
        """The topics this fetch may not read, with their refusal: a follower's fetch needs
        CLUSTER_ACTION (else every partition is refused, as Kafka does), a consumer's READ on
        each topic."""
        names = [t.name for t in request.topics]
        if request.replica_id >= 0:
            refused = authz.cluster_action_denied(self.access, "a replica's Fetch")
            if refused is None:
                return {}
            return {
                name: KafkaError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, refused.message)
                for name in names
            }
        denied = authz.denied_topics(self.access, AclOperation.READ, names)
        return {name: authz.topic_denied(AclOperation.READ, name) for name in denied}

    def _read_all(
        self, request: pb.FetchRequest, denied: dict[str, KafkaError], listener: str
    ) -> tuple[FetchAnswer, int, list[Partition]]:
        response = pb.FetchResponse()
        records: list[Records] = []  # beside the response, one per partition (protos.wire)
        remaining = request.max_bytes if request.max_bytes > 0 else MAX_MESSAGE_BYTES
        remaining = min(remaining, MAX_MESSAGE_BYTES)
        hosted: list[Partition] = []
        total = 0
        for topic in request.topics:
            out = response.topics.add(name=topic.name)
            for item in topic.partitions:
                result = out.partitions.add(
                    partition=item.partition, high_watermark=-1, log_start_offset=-1,
                    log_end_offset=-1, leader_id=-1, leader_epoch=-1, last_stable_offset=-1,
                )  # fmt: skip
                records.append(b"")
                try:
                    if topic.name in denied:
                        raise denied[topic.name]
                    _check_isolation_level(request.isolation_level)
                    partition = self.replicas.get(topic.name, item.partition)
                    hosted.append(partition)
                    limit = min(item.partition_max_bytes or remaining, remaining)
                    records[-1] = self._read(
                        request, partition, item, limit, total == 0, result, listener
                    )
                    size = len(records[-1])
                except OffsetOutOfRangeError as error:
                    fill_error(result, error)
                    result.log_start_offset = partition.log.log_start_offset
                    result.log_end_offset = partition.log.log_end_offset
                    continue
                except KafkaError as error:
                    fill_error(result, error)
                    continue
                total += size
                remaining = max(0, remaining - size)
        return FetchAnswer(response, records), total, hosted

    def _read(
        self,
        request: pb.FetchRequest,
        partition: Partition,
        item: pb.FetchPartition,
        max_bytes: int,
        first: bool,
        result: pb.FetchPartitionResponse,
        listener: str,
    ) -> Records:
        """Fill ``result`` in but for its records, and return those."""
        replica_id = request.replica_id
        if replica_id >= 0:
            quota = self.replicas.leader_quota
            throttles = partition.leader_throttles(replica_id)
            read, change = partition.read_for_follower(
                replica_id, item.fetch_offset, item.last_fetched_epoch,
                item.current_leader_epoch, max_bytes, throttled=throttles and quota.exceeded(),
                log_start_offset=item.log_start_offset,
            )  # fmt: skip
            if throttles and read.records:
                quota.record(len(read.records))
            if change is not None:
                log.info(
                    "%s: broker %d caught up; ISR -> %s", partition.name, replica_id, change.new_isr
                )
                self.alter_partition(change)
        else:
            # KIP-392: a consumer that sent its rack may be sent to another replica, and may
            # be served by a follower
            client_metadata = request.HasField("rack_id")
            if client_metadata and self.replica_selector is not None:
                preferred = self._preferred_read_replica(request, partition, item, listener)
                if preferred is not None:
                    _fill_preferred(result, partition, *preferred)
                    return b""
            read = partition.read_for_consumer(
                item.fetch_offset, max_bytes, item.current_leader_epoch, first,
                request.isolation_level, leader_only=not client_metadata,
            )  # fmt: skip
            if read.records and partition.role is Role.FOLLOWER:
                self.metrics.follower_bytes_out.labels(partition.topic).inc(len(read.records))
            for aborted in read.aborted:
                result.aborted_transactions.add(
                    producer_id=aborted.producer_id, first_offset=aborted.first_offset
                )
        result.high_watermark = read.high_watermark
        result.last_stable_offset = read.last_stable_offset
        result.log_start_offset = read.log_start_offset
        result.log_end_offset = read.log_end_offset
        result.leader_id = partition.leader_id
        result.leader_epoch = partition.leader_epoch
        if read.diverging is not None:
            result.diverging_epoch.epoch, result.diverging_epoch.end_offset = read.diverging
        if read.records:
            self.metrics.bytes_out.labels(partition.topic).inc(len(read.records))
        return read.records

    # -- ListOffsets ---------------------------------------------------------------------------
    def ListOffsets(self, request: pb.ListOffsetsRequest, context: Any) -> pb.ListOffsetsResponse:
        names = (t.name for t in request.topics)
        denied = authz.denied_topics(self.access, AclOperation.DESCRIBE, names)
        response = pb.ListOffsetsResponse()
        for topic in request.topics:
            out = response.topics.add(name=topic.name)
            for item in topic.partitions:
                result = out.partitions.add(
                    partition=item.partition, timestamp=-1, offset=-1, leader_epoch=-1,
                    leader_id=-1,
                )  # fmt: skip
                try:
                    if topic.name in denied:
                        raise authz.topic_denied(AclOperation.DESCRIBE, topic.name)
                    _check_isolation_level(request.isolation_level)
                    self._list_offset(
                        topic.name, item, result, request.replica_id, request.isolation_level
                    )
                except KafkaError as error:
                    fill_error(result, error)
        return response

    def _list_offset(
        self,
        topic: str,
        item: pb.ListOffsetsPartition,
        result: pb.ListOffsetsPartitionResponse,
        replica_id: int,
        isolation_level: int = READ_UNCOMMITTED,
    ) -> None:
        partition = self.replicas.get(topic, item.partition)
        # Kafka's debugging replica (-2, used by the group coordinator to check commits) gets
        # the log end offset; a consumer's end is the high watermark, a read_committed one's
        # the last stable offset (what it can fetch).
        debugging = replica_id == DEBUGGING_REPLICA_ID
        leader_epoch, hw = partition.leader_state(
            item.current_leader_epoch,
            committed=not debugging
            and item.timestamp not in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP),
        )
        if isolation_level == READ_COMMITTED and not debugging:
            hw = min(hw, partition.last_stable_offset)
        result.leader_epoch = leader_epoch
        result.leader_id = self.broker_id
        if item.timestamp == LATEST_TIMESTAMP:
            result.offset = partition.log.log_end_offset if debugging else hw
            return
        if item.timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
            result.offset = partition.log.log_start_offset  # nothing is tiered: all is local
            return
        if item.timestamp == LATEST_TIERED_TIMESTAMP:
            result.leader_epoch = -1  # no offset in remote storage: Kafka's (-1, epoch -1)
            return
        if item.timestamp < 0 and item.timestamp != MAX_TIMESTAMP:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"timestamp {item.timestamp} is not valid")
        found = partition.log.offsets_for_time(item.timestamp)
        if found is not None and found[0] < hw:
            result.offset, result.timestamp = found

    # -- DeleteRecords -------------------------------------------------------------------------
    def DeleteRecords(
        self, request: pb.DeleteRecordsRequest, context: Any
    ) -> pb.DeleteRecordsResponse:
        """Move the log start offsets this broker leads (see dataplane.broker.delete_records);
        answered once every live replica followed, or the request's timeout passed."""
        response, pending = delete_records.start(
            request, self.replicas, self.access, self._alive_brokers()
        )
        if pending and not all(entry.done for entry in pending):
            deadline = time.monotonic() + delete_records.timeout_ms(request) / 1000
            wait_until(
                [entry.partition for entry in pending], deadline,
                lambda: delete_records.complete(pending, self._alive_brokers()),
            )  # fmt: skip
        return response

    def _alive_brokers(self) -> frozenset[int]:
        return frozenset(b.broker_id for b in self.replicas.image.unfenced_brokers())

    # -- WriteTxnMarkers ----------------------------------------------------------------------
    def WriteTxnMarkers(
        self, request: pb.WriteTxnMarkersRequest, context: Any
    ) -> pb.WriteTxnMarkersResponse:
        """The transaction coordinator's markers, each on the partitions it names: through the
        internal topic's ``marker_writers`` entry, else appended here as the partition's leader
        and answered once replicated (as acks=all). Errors per partition, Kafka's codes."""
        response = pb.WriteTxnMarkersResponse()
        refused = authz.cluster_action_denied(self.access, "WriteTxnMarkers")
        waiting: list[tuple[Partition, int, int, int, Any]] = []
        for marker in request.markers:
            out = response.markers.add(producer_id=marker.producer_id)
            for topic in marker.topics:
                topic_out = out.topics.add(name=topic.name)
                for index in topic.partitions:
                    result = topic_out.partitions.add(partition=index)
                    try:
                        if refused is not None:
                            raise refused
                        waiting += self._write_marker(marker, topic.name, index, result)
                    except KafkaError as error:
                        fill_error(result, error)
                        self.metrics.request_errors.labels(
                            "write_txn_markers", error.error.name
                        ).inc()
        if waiting:
            self._await_replication(waiting, time.monotonic() + MARKER_TIMEOUT_MS / 1000)
        return response

    def _write_marker(
        self, marker: pb.TxnMarker, topic: str, index: int, result: pb.TxnMarkerPartitionResult
    ) -> list[tuple[Partition, int, int, int, Any]]:
        """Write one marker; what its answer waits for (replication), if anything."""
        writer = self.marker_writers.get(topic)
        if writer is not None:
            writer(index, marker.producer_id, marker.producer_epoch, marker.committed,
                   marker.coordinator_epoch)  # fmt: skip
            return []
        partition = self.replicas.get(topic, index)
        min_isr = self.replicas.settings(topic).min_insync_replicas
        info, epoch = partition.append_marker(
            marker.producer_id, marker.producer_epoch, commit=marker.committed,
            coordinator_epoch=marker.coordinator_epoch, min_insync_replicas=min_isr,
        )  # fmt: skip
        log.debug("%s: %s marker of producer %d at %d", partition.name,
                  "commit" if marker.committed else "abort", marker.producer_id,
                  info.first_offset)  # fmt: skip
        return [(partition, info.last_offset + 1, epoch, min_isr, result)]

    # -- OffsetForLeaderEpoch (KIP-320) --------------------------------------------------------
    def OffsetForLeaderEpoch(
        self, request: pb.OffsetForLeaderEpochRequest, context: Any
    ) -> pb.OffsetForLeaderEpochResponse:
        """A consumer validating its position after a leader change (see
        dataplane.broker.offset_for_leader_epoch)."""
        return offset_for_leader_epoch.answer(request, self.replicas, self.access)

    # -- ShareFetch / ShareAcknowledge (KIP-932) -----------------------------------------------
    def ShareFetch(self, request: pb.ShareFetchRequest, context: Any) -> pb.ShareFetchResponse:
        if self.share_fetch is None:
            return pb.ShareFetchResponse(
                error_code=ErrorCode.UNSUPPORTED_VERSION.code,
                error_message="this broker serves no share groups",
            )
        return self.share_fetch(request)

    def ShareAcknowledge(
        self, request: pb.ShareAcknowledgeRequest, context: Any
    ) -> pb.ShareAcknowledgeResponse:
        if self.share_acknowledge is None:
            return pb.ShareAcknowledgeResponse(
                error_code=ErrorCode.UNSUPPORTED_VERSION.code,
                error_message="this broker serves no share groups",
            )
        return self.share_acknowledge(request)

    # -- DescribeProducers (KIP-664) -----------------------------------------------------------
    def DescribeLogDirs(
        self, request: pb.DescribeLogDirsRequest, context: Any
    ) -> pb.DescribeLogDirsResponse:
        """This broker's log directory (Kafka's DescribeLogDirs): the filesystem's total and
        usable bytes and each hosted replica of ``topics`` (none named: all) with its size.
        DESCRIBE on the cluster, as Kafka's KafkaApis asks."""
        try:
            check_cluster(self.access, "DescribeLogDirs")
        except KafkaError as error:
            return pb.DescribeLogDirsResponse(error_code=error.error.code)
        wanted = set(request.topics)
        total, usable = disk_usage(self.replicas.log_dir)
        response = pb.DescribeLogDirsResponse(
            log_dir=log_dir_path(self.replicas.log_dir), total_bytes=total, usable_bytes=usable
        )
        for replica in replica_logs(self.replicas.partitions()):
            if not wanted or replica.topic in wanted:
                response.replicas.add(
                    topic=replica.topic, partition=replica.partition,
                    size_bytes=replica.size_bytes, offset_lag=replica.offset_lag,
                )  # fmt: skip
        return response

    def DescribeProducers(
        self, request: pb.DescribeProducersRequest, context: Any
    ) -> pb.DescribeProducersResponse:
        """The producers of each named partition this broker leads: id, epoch, last sequence
        and timestamp, the coordinator epoch of their last marker and their open
        transaction's first offset (-1: none)."""
        response = pb.DescribeProducersResponse()
        names = (t.name for t in request.topics)
        denied = authz.denied_topics(self.access, AclOperation.READ, names)
        for topic in request.topics:
            out = response.topics.add(name=topic.name)
            for index in topic.partitions:
                result = out.partitions.add(partition=index)
                try:
                    if topic.name in denied:
                        raise authz.topic_denied(AclOperation.READ, topic.name)
                    producers = self.replicas.get(topic.name, index).active_producers()
                except KafkaError as error:
                    fill_error(result, error)
                    continue
                for producer_id, entry in producers:
                    result.active_producers.add(
                        producer_id=producer_id, producer_epoch=entry.producer_epoch,
                        last_sequence=entry.last_sequence, last_timestamp=entry.last_timestamp,
                        coordinator_epoch=entry.coordinator_epoch,
                        current_txn_start_offset=entry.current_txn_first_offset,
                    )  # fmt: skip
        return response

    # -- Metadata ------------------------------------------------------------------------------
    def Metadata(self, request: pb.MetadataRequest, context: Any) -> pb.MetadataResponse:
        image = self.replicas.image
        response = pb.MetadataResponse(
            cluster_id=self.cluster_id,
            controller_id=image.controller_id,
            metadata_offset=image.offset,
            # the quorum's voters as the metadata names them (KIP-853), else the configured ones
            controller_addresses=[v.address for v in image.voters] or self.controller_addresses,
        )
        for broker in image.unfenced_brokers():
            endpoint = broker.endpoint("BROKER")
            if endpoint is not None:
                response.brokers.add(
                    node_id=broker.broker_id, host=endpoint.host, port=endpoint.port,
                    rack=broker.rack or "",
                )  # fmt: skip
        names = sorted(image.topic_ids) if request.all_topics else list(request.topics)
        names, denied = authz.metadata_topics(self.access, names, request.all_topics)
        for name in names:
            out = response.topics.add(name=name)
            if name in denied:  # whether it exists is not told
                fill_error(out, authz.topic_denied(AclOperation.DESCRIBE, name))
                continue
            _describe_topic(image, name, out)
        return response

    # -- InitProducerId ----------------------------------------------------------------------
    def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: Any
    ) -> pb.InitProducerIdResponse:
        """A new idempotent producer id (epoch 0) from this broker's block of ids; with a
        transactional id, the transaction coordinator's answer (``init_transactional_producer``,
        set by the broker server: this broker must coordinate the id). Kafka's authorization:
        WRITE on the transactional id, else IDEMPOTENT_WRITE on the cluster or WRITE on a topic."""
        refused = (
            authz.transactional_id_denied(self.access, request.transactional_id)
            if request.transactional_id
            else authz.idempotent_write_denied(self.access)
        )
        if refused is not None:
            return pb.InitProducerIdResponse(
                error_code=refused.error.code, error_message=refused.message, producer_id=-1,
                producer_epoch=-1,
            )  # fmt: skip
        if request.transactional_id:
            init_transactional = self.init_transactional_producer
            if init_transactional is None:
                return pb.InitProducerIdResponse(
                    error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE.code,
                    error_message="this broker runs no transaction coordinator",
                    producer_id=-1,
                    producer_epoch=-1,
                )
            return init_transactional(request)
        try:
            producer_id = self.allocate_producer_id()
        except KafkaError as error:
            return pb.InitProducerIdResponse(
                error_code=error.error.code, error_message=error.message, producer_id=-1,
                producer_epoch=-1,
            )  # fmt: skip
        return pb.InitProducerIdResponse(producer_id=producer_id, producer_epoch=0)


def _describe_topic(image: MetadataImage, name: str, out: pb.TopicMetadata) -> None:
    try:
        validate_topic_name(name)
    except KafkaError as error:
        fill_error(out, error)
        return
    topic = image.topic(name)
    if topic is None:
        out.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code
        out.error_message = f"no topic {name!r}"
        return
    out.topic_id = topic.topic_id.bytes
    if not topic.partitions:  # its partitions are still to come: it exists, with no leaders yet
        out.error_code = ErrorCode.LEADER_NOT_AVAILABLE.code
        out.error_message = f"topic {name!r} has no partitions with leaders yet"
        return
    live = {b for b, r in image.brokers.items() if not r.fenced}
    for partition_id, reg in sorted(topic.partitions.items()):
        out.partitions.add(
            partition=partition_id,
            error_code=0 if reg.leader >= 0 else ErrorCode.LEADER_NOT_AVAILABLE.code,
            leader_id=reg.leader,
            leader_epoch=reg.leader_epoch,
            replicas=reg.replicas,
            isr=reg.isr,
            offline_replicas=[b for b in reg.replicas if b not in live],
            eligible_leader_replicas=reg.elr,
            last_known_elr=reg.last_known_elr,
        )


def _is_transactional(records: Records) -> bool:
    """Does a partition's produce carry a transactional batch (its first: a producer's
    batches of one produce are one batch)?"""
    if len(records) < HEADER_SIZE:
        return False
    header = read_header(records)
    return header.is_transactional and header.producer_id != NO_PRODUCER_ID


def _refuse_all(request: pb.ProduceRequest, error: ErrorCode, message: str) -> pb.ProduceResponse:
    """Every partition of the request answered ``error`` (Kafka refuses the whole request)."""
    response = pb.ProduceResponse()
    if request.acks == 0:
        return response
    for topic in request.topics:
        out = response.topics.add(name=topic.name)
        for item in topic.partitions:
            out.partitions.add(
                partition=item.partition, base_offset=-1, log_append_time_ms=-1,
                log_start_offset=-1, leader_id=-1, leader_epoch=-1, error_code=error.code,
                error_message=message,
            )  # fmt: skip
    return response


def _check_isolation_level(isolation_level: int) -> None:
    if isolation_level not in (READ_UNCOMMITTED, READ_COMMITTED):
        raise KafkaError(
            ErrorCode.INVALID_REQUEST,
            f"isolation_level {isolation_level}: 0 read_uncommitted or 1 read_committed",
        )


def _zeros(request: pb.FetchStreamRequest) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition): 0 for t in request.topics for p in t.partitions}


def _answer_now(response: pb.FetchResponse) -> bool:
    """A fetch with an error or a preferred read replica (KIP-392) waits for nothing."""
    return any(
        p.error_code or p.HasField("preferred_read_replica")
        for t in response.topics
        for p in t.partitions
    )


def _fill_preferred(
    result: pb.FetchPartitionResponse, partition: Partition, view: LeaderView, preferred: int
) -> None:
    """A leader's answer that names a preferred read replica: no records, its offsets."""
    result.preferred_read_replica = preferred
    result.high_watermark = view.high_watermark
    result.last_stable_offset = view.last_stable_offset
    result.log_start_offset = view.log_start_offset
    result.log_end_offset = view.log_end_offset
    result.leader_id = partition.leader_id
    result.leader_epoch = partition.leader_epoch


class ServeWhenReady(grpc.ServerInterceptor):  # type: ignore[misc]
    """Kafka enables a broker's request processing only once it has caught up with the
    metadata log: a restarted broker's empty image would otherwise tell clients that topics do
    not exist and that it leads nothing. Until ``ready`` is set every call is UNAVAILABLE,
    which clients treat as a broker that is down (retriable: they ask another one)."""

    def __init__(self, ready: threading.Event, broker_id: int) -> None:
        self.ready = ready
        self.message = f"broker {broker_id} is starting: catching up with the cluster metadata"

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if (
            handler is None
            or self.ready.is_set()
            or is_standard_method(details.method)  # health tells NOT_SERVING meanwhile
        ):
            return handler
        if handler.unary_stream is not None:  # FetchStream
            return grpc.unary_stream_rpc_method_handler(
                self._refuse_stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_unary is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            self._refuse,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _refuse(self, request: Any, context: Any) -> None:
        # NETWORK_EXCEPTION: what a Kafka client meets at a broker not yet accepting
        # connections; retriable, and UNAVAILABLE as before
        abort(context, KafkaError(ErrorCode.NETWORK_EXCEPTION, self.message))

    def _refuse_stream(self, request: Any, context: Any) -> Iterator[Any]:
        self._refuse(request, context)
        yield  # a generator, as gRPC calls a streaming handler; never reached


class _Handlers:
    """Stands in for a server to collect the generated code's method handlers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same handlers come through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service = service
        self.handlers.update(handlers)


def _add_broker_service(servicer: BrokerServicer, server: grpc.Server) -> None:
    """The generated BrokerService handlers, but Produce's records read and Fetch's written
    around the records (``protos.wire``): the copies of the plain way were 12% of a produce
    leader's CPU."""
    collected = _Handlers()
    pb_grpc.add_BrokerServiceServicer_to_server(servicer, collected)
    handlers = collected.handlers

    def produce(arrived: tuple[pb.ProduceRequest, list[memoryview]], context: Any) -> Any:
        return servicer.produce(arrived[0], arrived[1], context, grpc_deadline=True)

    def fetch(request: pb.FetchRequest, context: Any) -> FetchAnswer:
        return servicer.fetch(request, context=context)

    def stream(request: pb.FetchStreamRequest, context: Any) -> Iterator[Any]:
        return servicer.fetch_stream(request, context)

    handlers["Produce"] = grpc.unary_unary_rpc_method_handler(
        produce,
        request_deserializer=_decode_produce_request,
        response_serializer=pb.ProduceResponse.SerializeToString,
    )
    handlers["Fetch"] = grpc.unary_unary_rpc_method_handler(
        fetch,
        request_deserializer=pb.FetchRequest.FromString,
        response_serializer=FetchAnswer.encode,
    )
    handlers["FetchStream"] = grpc.unary_stream_rpc_method_handler(
        stream,
        request_deserializer=pb.FetchStreamRequest.FromString,
        response_serializer=wire.FetchStreamAnswer.encode,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(collected.service, handlers),)
    )
    server.add_registered_method_handlers(collected.service, handlers)


def _decode_produce_request(data: bytes) -> tuple[pb.ProduceRequest, list[memoryview]]:
    return wire.decode(pb.ProduceRequest, data)


def serve(
    servicer: BrokerServicer,
    address: str,
    groups: gpb_grpc.GroupCoordinatorServiceServicer | None = None,
    max_workers: int = 64,
    ready: threading.Event | None = None,
    transactions: tpb_grpc.TransactionCoordinatorServiceServicer | None = None,
    security: ServerSecurity | None = None,
    shares: spb_grpc.ShareCoordinatorServiceServicer | None = None,
    limit_options: Sequence[tuple[str, int]] = (),
    health: NodeHealth | None = None,
    keepalive: Keepalive = DEFAULT_KEEPALIVE,
    keep_alive_s: float = KEEP_ALIVE_S,
) -> grpc.Server:
    """The broker's gRPC server; with ``ready``, calls are refused until it is set; with
    `security`, the BROKER listener's TLS and authentication (None: plaintext, as the node);
    `limit_options`: gRPC options that replace the defaults below (Kafka's limits, set by
    dataplane.server.broker_server.grpc_limits). It serves reflection and ``health`` (the
    broker's: None, one that says SERVING from the start) over every service it serves. Calls
    run on a RequestHandlerPool: a thread idle for ``keep_alive_s`` ends, so the bursts that
    come with faults do not leave their threads behind."""
    interceptors: list[grpc.ServerInterceptor] = [RichErrors()]
    if security is not None:
        interceptors += security.interceptors()
    if ready is not None:
        interceptors.append(ServeWhenReady(ready, servicer.broker_id))
    server = grpc.server(
        RequestHandlerPool(max_workers, keep_alive_s=keep_alive_s, thread_name_prefix="broker-rpc"),
        interceptors=interceptors,
        options=list(
            {
                "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
                "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
                "grpc.so_reuseport": 0,
                **dict(keepalive.options()),
                **dict(limit_options),
            }.items()
        ),
    )
    servicer.fetch_streams = fetch_stream.StreamSlots(max_workers // 2)
    _add_broker_service(servicer, server)
    services = [pb.DESCRIPTOR.services_by_name["BrokerService"].full_name]
    if groups is not None:
        gpb_grpc.add_GroupCoordinatorServiceServicer_to_server(groups, server)
        services.append(gpb.DESCRIPTOR.services_by_name["GroupCoordinatorService"].full_name)
    if transactions is not None:
        tpb_grpc.add_TransactionCoordinatorServiceServicer_to_server(transactions, server)
        services.append(tpb.DESCRIPTOR.services_by_name["TransactionCoordinatorService"].full_name)
    if shares is not None:
        spb_grpc.add_ShareCoordinatorServiceServicer_to_server(shares, server)
        services.append(spb.DESCRIPTOR.services_by_name["ShareCoordinatorService"].full_name)
    if health is None:
        health = NodeHealth()
        health.set_serving(True)
    if security is None:
        port = server.add_insecure_port(address)
    else:
        port = security.add_port(server, address)
        services.append(AUTHENTICATION_SERVICE)
    add_standard_services(server, services, health)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    return server
