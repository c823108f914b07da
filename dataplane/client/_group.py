"""A client's side of a consumer group: finding its coordinator, and membership (KIP-848).

:class:`GroupClient` finds the group's coordinator (FindCoordinator to any broker) and runs
group RPCs against it, looking it up again when it moved (NOT_COORDINATOR,
COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS, network errors), within a deadline.

:class:`Membership` is the consumer's background heartbeat thread. It joins with epoch 0 and the
subscription, then heartbeats every ``heartbeat_interval_ms`` the coordinator asks for (at once
when the owned partitions or the subscription change), always reporting the partitions the
application thread owns. The coordinator's answer is the member's *target*: the application
thread reconciles towards it in ``poll`` (revoking first, then assigning), which is where the
rebalance listener runs, as in Kafka. Fenced (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID) or past
``max.poll.interval.ms`` without a poll, the member loses its partitions: it waits for the
application thread to let them go, then rejoins with epoch 0. A static member (KIP-345,
``instance_id``) names its instance when joining and leaves with epoch -2 (the coordinator keeps
its partitions for its session); FENCED_INSTANCE_ID and UNRELEASED_INSTANCE_ID are fatal, as in
Kafka's client.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from dataplane.client._cluster import Cluster, rpc_error
from dataplane.client._types import OffsetAndMetadata, TopicPartition
from protos import group_pb2 as gpb
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
COORDINATOR_ERRORS = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.REQUEST_TIMED_OUT,
    }
)
FENCING_ERRORS = frozenset({ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID})
JOIN_EPOCH = 0
LEAVE_STATIC_EPOCH = -2  # KIP-345: a static member is away; the coordinator keeps its partitions
FIND_COORDINATOR_TRY_S = 2.0  # per broker asked: a dead one must not use the whole deadline
LEAVE_EPOCH = -1


def to_wire(partitions: set[TopicPartition] | frozenset[TopicPartition]) -> gpb.OwnedPartitions:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return gpb.OwnedPartitions(
        topics=[gpb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]
    )


def from_wire(items: Any) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(i.topic, p) for i in items for p in i.partitions)


def commit_request(
    group_id: str,
    member_id: str,
    member_epoch: int,
    offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
) -> gpb.OffsetCommitRequest:
    """An OffsetCommit of ``offsets``; ("", -1) as member: an administrative commit."""
    request = gpb.OffsetCommitRequest(
        group_id=group_id, member_id=member_id, member_epoch=member_epoch
    )
    by_topic: dict[str, list[gpb.OffsetCommitPartition]] = {}
    for tp, value in sorted(offsets.items()):
        resolved = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)
        item = gpb.OffsetCommitPartition(
            partition=tp.partition, committed_offset=resolved.offset,
            committed_leader_epoch=resolved.leader_epoch, metadata=resolved.metadata,
        )  # fmt: skip
        by_topic.setdefault(tp.topic, []).append(item)
    for topic, partitions in by_topic.items():
        request.topics.add(name=topic, partitions=partitions)
    return request


GROUP_KEY = 0  # FindCoordinator key types, as Kafka's: a group id
TRANSACTION_KEY = 1  # a transactional id (the coordinator over `__transaction_state`)


class GroupClient:
    """Group RPCs to the coordinator of ``group_id``, following it when it moves. With
    ``key_type=TRANSACTION_KEY`` the key is a transactional id and the calls go to its
    transaction coordinator (``call(..., stub_of=...)`` picks the service)."""

    def __init__(
        self,
        cluster: Cluster,
        group_id: str,
        closed: threading.Event,
        clock: Callable[[], float],
        *,
        key_type: int = GROUP_KEY,
    ) -> None:
        self.cluster = cluster
        self.group_id = group_id
        self.key_type = key_type
        self._closed = closed
        self._clock = clock
        self._lock = threading.Lock()
        self._address: str | None = None

    def coordinator(self, timeout_s: float) -> str:
        with self._lock:
            if self._address is not None:
                return self._address
        response = self._find(timeout_s)
        found = response.coordinators[0]
        if found.error_code:
            raise KafkaError(ErrorCode.from_code(found.error_code), found.error_message)
        address = f"{found.host}:{found.port}"
        with self._lock:
            self._address = address
        return address

    def _find(self, timeout_s: float) -> gpb.FindCoordinatorResponse:
        """FindCoordinator to the known brokers in turn (any broker can answer; a dead one
        costs at most FIND_COORDINATOR_TRY_S), within ``timeout_s``."""
        request = gpb.FindCoordinatorRequest(group_ids=[self.group_id], key_type=self.key_type)
        deadline = self._clock() + timeout_s
        failures: list[str] = []
        for broker in self.cluster.candidates():
            remaining = deadline - self._clock()
            if remaining <= 0:
                break
            try:
                response: gpb.FindCoordinatorResponse = self.cluster.group_stub(
                    broker
                ).FindCoordinator(request, timeout=min(remaining, FIND_COORDINATOR_TRY_S))
                return response
            except grpc.RpcError as error:
                failures.append(str(rpc_error(error, broker)))
        self.cluster.invalidate()
        raise KafkaError(
            ErrorCode.COORDINATOR_NOT_AVAILABLE,
            "no broker answered FindCoordinator: " + ("; ".join(failures) or "out of time"),
        )

    def forget(self) -> None:
        with self._lock:
            self._address = None

    def call(
        self,
        method: str,
        request: Any,
        timeout_s: float,
        error_of: Callable[[Any], Any] = lambda response: response,
        stub_of: Callable[[str], Any] | None = None,
    ) -> Any:
        """``method`` at the coordinator; retried while the coordinator is being found or
        moves, until ``timeout_s``. ``error_of(response)`` is the message holding the
        coordinator's error (the response itself, or its one item). The response may still
        carry other (group) errors. ``stub_of(address)`` gives the service to call (default:
        the group coordinator's)."""
        deadline = self._clock() + timeout_s
        while True:
            remaining = max(0.001, deadline - self._clock())
            try:
                address = self.coordinator(remaining)
                stub = (stub_of or self.cluster.group_stub)(address)
                response = getattr(stub, method)(request, timeout=remaining)
                answer = error_of(response)
                code = ErrorCode.from_code(answer.error_code)
                if code not in COORDINATOR_ERRORS:
                    return response
                error = KafkaError(code, answer.error_message)
            except grpc.RpcError as rpc:
                error = rpc_error(rpc, f"{method} for {self.group_id!r}")
                self.cluster.invalidate()
            except KafkaError as refused:
                if refused.error not in COORDINATOR_ERRORS:
                    raise
                error = refused
            self.forget()
            if self._clock() >= deadline or self._closed.is_set():
                raise error
            self._closed.wait(min(self.cluster.backoff_s(), max(0.0, deadline - self._clock())))


class Membership:
    """The heartbeat thread of a subscribed consumer. Thread-safe; the application thread
    reads the target and reports what it owns."""

    def __init__(
        self,
        group: GroupClient,
        *,
        client_id: str,
        rebalance_timeout_ms: int,
        max_poll_interval_ms: int,
        request_timeout_s: float,
        clock: Callable[[], float],
        instance_id: str = "",
    ) -> None:
        self.group = group
        self.client_id = client_id
        self.instance_id = instance_id  # "" = a dynamic member
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.max_poll_interval_s = max_poll_interval_ms / 1000
        self.request_timeout_s = request_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.member_id = ""
        self.member_epoch = JOIN_EPOCH
        self._topics: tuple[str, ...] = ()
        self._pattern = ""
        self._subscription_sent = False
        # What the application thread owns, and the number of the target it reconciled to.
        # Owned partitions are sent only when that pair changed (each change is a new report
        # number), as Kafka's client sends its LocalAssignment (epoch and partitions): "not
        # reported" tells the coordinator nothing was released, so it never hands a partition
        # on while a target this member received but has not reconciled yet still includes
        # it. A target that grew and shrank back between two polls leaves the partitions as
        # they were, yet the coordinator waits for word that those it took back are not owned.
        self._owned: frozenset[TopicPartition] = frozenset()
        self._reconciled: int | None = None
        self._report = 0
        self._report_sent: int | None = None  # of the last answered heartbeat; None: again
        self._target: frozenset[TopicPartition] | None = None  # None until the first answer
        self._targets = 0  # the number of `_target` (see `state`)
        self._lost = False  # fenced: the application thread must give up every partition
        self._fatal: KafkaError | None = None
        self._interval_s = 1.0
        self._last_poll = clock()
        self._thread: threading.Thread | None = None

    # -- the application thread --------------------------------------------------------------
    def subscribe(self, topics: tuple[str, ...], pattern: str) -> None:
        with self._lock:
            self._topics, self._pattern = topics, pattern
            self._subscription_sent = False
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"heartbeat-{self.group.group_id}", daemon=True
            )
            self._thread.start()
        self._wake.set()

    def polled(self) -> None:
        with self._lock:
            self._last_poll = self._clock()
            fatal = self._fatal
        if fatal is not None:
            raise fatal

    def state(self) -> tuple[frozenset[TopicPartition] | None, int, bool]:
        """(target, its number, lost): what the application thread should own, which of the
        targets received that is (each one that differs from the one before is the next
        number), and whether it must give up everything first (fenced)."""
        with self._lock:
            return self._target, self._targets, self._lost

    def owned(
        self,
        partitions: frozenset[TopicPartition],
        *,
        reconciled: int | None,
        released_all: bool = False,
    ) -> None:
        """The application thread owns ``partitions`` after reconciling to target number
        ``reconciled`` (`state`; None: it gave up everything); a change is reported at once."""
        with self._lock:
            changed = (partitions, reconciled) != (self._owned, self._reconciled)
            if changed:
                self._owned, self._reconciled = partitions, reconciled
                self._report += 1
            if released_all:
                self._lost = False
        if changed or released_all:
            self._wake.set()

    def is_member(self, member_id: str) -> bool:
        """Still ``member_id`` in the group, not fenced."""
        with self._lock:
            return (
                bool(member_id)
                and member_id == self.member_id
                and not self._lost
                and (self.member_epoch > JOIN_EPOCH)
            )

    def heartbeat_now(self) -> None:
        self._wake.set()

    def epoch(self) -> tuple[str, int]:
        with self._lock:
            return self.member_id, self.member_epoch

    def leave(self) -> None:
        """Stop heartbeating and leave the group (epoch -1), best effort."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.request_timeout_s + 1)
        member_id, epoch = self.epoch()
        if not member_id or epoch <= JOIN_EPOCH:
            return
        request = self._leave_request(member_id)
        try:
            self.group.call("ConsumerGroupHeartbeat", request, min(5.0, self.request_timeout_s))
        except KafkaError as error:
            log.info("group %s: leave not acknowledged: %s", self.group.group_id, error)

    def _leave_request(self, member_id: str) -> gpb.ConsumerGroupHeartbeatRequest:
        """Epoch -1; a static member's -2 (Kafka's client: ``leaveGroupEpoch``)."""
        return gpb.ConsumerGroupHeartbeatRequest(
            group_id=self.group.group_id,
            member_id=member_id,
            member_epoch=LEAVE_STATIC_EPOCH if self.instance_id else LEAVE_EPOCH,
            instance_id=self.instance_id,
        )

    # -- the heartbeat thread ----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            wait_s = self._beat()
            self._wake.wait(wait_s)
            self._wake.clear()

    def _request(self) -> tuple[gpb.ConsumerGroupHeartbeatRequest, int | None] | None:
        """The next heartbeat, and the number of the owned report it carries (None: none)."""
        with self._lock:
            if self._lost:
                return None  # wait until the application thread released its partitions
            request = gpb.ConsumerGroupHeartbeatRequest(
                group_id=self.group.group_id,
                member_id=self.member_id,
                member_epoch=self.member_epoch,
                rebalance_timeout_ms=self.rebalance_timeout_ms,
                client_id=self.client_id,
            )
            report = None
            if self._report != self._report_sent or self.member_epoch == JOIN_EPOCH:
                request.owned.CopyFrom(to_wire(self._owned))
                report = self._report
            if self.member_epoch == JOIN_EPOCH:
                request.instance_id = self.instance_id  # sent in full requests, as Kafka's
            if not self._subscription_sent or self.member_epoch == JOIN_EPOCH:
                request.subscribed_topic_names.names.extend(self._topics)
                request.subscribed_topic_regex = self._pattern
            return request, report

    def _beat(self) -> float:
        """One heartbeat; the seconds until the next."""
        if self._clock() - self._last_poll > self.max_poll_interval_s:
            return self._poll_timeout()
        built = self._request()
        if built is None:
            return self._interval_s
        request, report = built
        try:
            response = self.group.call("ConsumerGroupHeartbeat", request, self.request_timeout_s)
        except KafkaError as error:
            log.info("group %s: heartbeat failed: %s", self.group.group_id, error)
            with self._lock:
                self._report_sent = None  # the answer may be lost: report in full again
            return self.group.cluster.backoff_s()
        code = ErrorCode.from_code(response.error_code)
        with self._lock:
            if code is ErrorCode.NONE:
                self.member_id = response.member_id
                self.member_epoch = response.member_epoch
                self._subscription_sent = True
                if report is not None:
                    self._report_sent = report
                self._set_target(from_wire(response.assignment.topics))
                self._interval_s = response.heartbeat_interval_ms / 1000
                return self._interval_s
            if code in FENCING_ERRORS:
                log.warning("group %s: member %s fenced (%s): rejoining", self.group.group_id,
                            self.member_id, response.error_message)  # fmt: skip
                self._lose()
                return 0.0
            self._fatal = KafkaError(code, response.error_message)
            self._stop.set()
            return 0.0

    def _set_target(self, target: frozenset[TopicPartition]) -> None:
        if target != self._target:
            self._target = target
            self._targets += 1

    def _lose(self) -> None:
        self.member_epoch = JOIN_EPOCH
        self._report_sent = None
        self._set_target(frozenset())
        self._lost = bool(self._owned)
        self._subscription_sent = False

    def _poll_timeout(self) -> float:
        """No poll within max.poll.interval.ms: leave, so the group moves on without us."""
        member_id, epoch = self.epoch()
        if epoch > JOIN_EPOCH:
            log.warning(
                "group %s: no poll() within max.poll.interval.ms: member %s leaves",
                self.group.group_id, member_id,
            )  # fmt: skip
            request = self._leave_request(member_id)
            try:
                self.group.call("ConsumerGroupHeartbeat", request, self.request_timeout_s)
            except KafkaError as error:
                log.info("group %s: leave failed: %s", self.group.group_id, error)
            with self._lock:
                self._lose()
        return self._interval_s
