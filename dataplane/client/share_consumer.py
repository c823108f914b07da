"""The share consumer (KIP-932, Kafka's ``KafkaShareConsumer``): members of a share group read
the same partitions cooperatively, each record handed to one member at a time.

``ShareConsumer(bootstrap, group_id, acknowledgement_mode="implicit" | "explicit")``;
``subscribe(topics)`` joins the share group: a background thread heartbeats
(ShareGroupHeartbeat, a member id the client generates, as Kafka 4.1's clients do) and holds the
partitions the coordinator assigns (several members may share one; there is no revocation: a
new assignment replaces the old). A fenced member rejoins under its id with epoch 0.

``poll(timeout_ms)`` sends a ShareFetch (BrokerService) to the leader of each assigned partition,
one share session per leader: the first request (epoch 0) opens it with the partitions to fetch,
later ones carry its next epoch and add or forget partitions as the assignment or the leaders
move. The leader answers the whole batches holding the records it *acquired* for this member
(under a lock, ``group.share.record.lock.duration.ms``), with each record's delivery count;
``poll`` returns those records (:class:`ShareConsumerRecord`, ``delivery_count`` included), up
to ``max_poll_records`` (the rest wait for the next poll, their locks running).

Acknowledgements (see :mod:`dataplane.client._share_acks`): implicit mode accepts everything
the previous poll returned at the next ``poll`` / ``commit_*`` / ``close``; explicit mode takes
``acknowledge(record, AcknowledgeType.ACCEPT | RELEASE | REJECT)`` for each record before the
next poll, or ``AcknowledgeType.RENEW`` (KIP-1222, as Kafka 4.2's Java consumer takes it) for a
record still being worked on: the leader restarts its lock and the record stays owed (to be
acknowledged later, across polls). They ride on the next ShareFetch to the leader the records
came from, or go at once in a ShareAcknowledge with ``commit_sync()`` (which answers each
partition's outcome) or ``commit_async()``; each outcome is also passed to
``acknowledgement_commit_callback(offsets, error)`` when one is set.

Errors: NOT_LEADER_OR_FOLLOWER and the other leader errors, network failures refresh metadata:
the partition is forgotten in the old leader's session and added to the new leader's (a new
session there). A session the broker lost (SHARE_SESSION_NOT_FOUND,
INVALID_SHARE_SESSION_EPOCH, a failed call whose outcome is unknown) is opened again with epoch
0; the acknowledgements owed to it are dropped (the broker released those records) and reported
to the callback with the error. Other errors raise ``KafkaError`` from ``poll``.

``close()`` settles the acknowledgements (implicit: accepts the last poll's records), closes each
share session with a final ShareAcknowledge (epoch -1: the leader releases every record this
member still holds, so another member gets it with its delivery counted) and leaves the group
(heartbeat epoch -1). Not thread-safe, like Kafka's: one thread polls.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import grpc
from pydantic import BaseModel, ConfigDict, Field

from dataplane.client._closing import Closing
from dataplane.client._cluster import Cluster, SecuritySetting, rpc_error
from dataplane.client._group import FENCING_ERRORS, GroupClient, from_wire
from dataplane.client._share_acks import (
    Acknowledgements,
    AcknowledgeType,
    AckRun,
    IllegalStateError,
)
from dataplane.client._types import TopicPartition
from dataplane.client.consumer import LEADER_ERRORS
from protos import broker_pb2 as pb
from protos import group_pb2 as gpb
from raftlog.batch import iter_batches
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import Headers, ParsedRecord, decode_batch_as

__all__ = [
    "AcknowledgeType",
    "IllegalStateError",
    "ShareConsumer",
    "ShareConsumerRecord",
]
log = logging.getLogger(__name__)

JOIN_EPOCH, LEAVE_EPOCH, FINAL_SESSION_EPOCH = 0, -1, -1
EPOCH_MAX = 2**31 - 1
SESSION_ERRORS = frozenset(
    {ErrorCode.SHARE_SESSION_NOT_FOUND, ErrorCode.INVALID_SHARE_SESSION_EPOCH}
)
AckCallback = Callable[[dict[TopicPartition, set[int]], KafkaError | None], None]


class ShareConsumerRecord(NamedTuple):
    """A record a share consumer received: a ConsumerRecord's fields and how many times it
    was delivered (this delivery included; Kafka's ``ConsumerRecord.deliveryCount()``)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime
    key: bytes | None
    value: bytes | None
    headers: Headers
    leader_epoch: int
    delivery_count: int


class ShareConsumerConfig(BaseModel):
    """Kafka's share consumer settings, with underscores."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group_id: str = Field(min_length=1)
    client_id: str = "raftlog-share-consumer"
    acknowledgement_mode: Literal["implicit", "explicit"] = "implicit"
    max_poll_records: int = Field(500, ge=1, le=2**31 - 1)
    fetch_max_wait_ms: int = Field(500, ge=0, le=30_000)
    fetch_max_bytes: int = Field(50 * 1024 * 1024, ge=1, le=2**31 - 1)
    request_timeout_ms: int = Field(30_000, ge=1, le=2**31 - 1)
    retry_backoff_ms: int = Field(100, ge=0, le=60_000)
    retry_backoff_max_ms: int = Field(1_000, ge=0, le=600_000)
    metadata_max_age_ms: int = Field(300_000, ge=0, le=2**31 - 1)


def new_member_id() -> str:
    """A member id as Kafka's clients make one (``Uuid.randomUuid().toString()``: 22
    base64url characters)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= EPOCH_MAX or epoch < 0 else epoch + 1


class ShareMembership:
    """The heartbeat thread of a share group member (ShareGroupHeartbeat)."""

    def __init__(
        self,
        group: GroupClient,
        client_id: str,
        request_timeout_s: float,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.group = group
        self._on_change = on_change  # the assignment changed
        self.client_id = client_id
        self.request_timeout_s = request_timeout_s
        self.member_id = new_member_id()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._epoch = JOIN_EPOCH
        self._topics: tuple[str, ...] = ()
        self._subscription_sent = False
        self._assignment: frozenset[TopicPartition] = frozenset()
        self._interval_s = 1.0
        self._fatal: KafkaError | None = None
        self._thread: threading.Thread | None = None

    def subscribe(self, topics: tuple[str, ...]) -> None:
        with self._lock:
            self._topics = topics
            self._subscription_sent = False
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name=f"share-heartbeat-{self.group.group_id}", daemon=True
            )
            self._thread.start()
        self._wake.set()

    def assignment(self) -> frozenset[TopicPartition]:
        with self._lock:
            fatal = self._fatal
            assignment = self._assignment
        if fatal is not None:
            raise fatal
        return assignment

    def epoch(self) -> int:
        with self._lock:
            return self._epoch

    def leave(self) -> None:
        """Stop heartbeating and leave the group (epoch -1), best effort."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.request_timeout_s + 1)
            self._thread = None
        with self._lock:
            epoch, self._epoch = self._epoch, JOIN_EPOCH
            self._assignment = frozenset()
            self._subscription_sent = False
        if epoch <= JOIN_EPOCH:
            return
        request = gpb.ShareGroupHeartbeatRequest(
            group_id=self.group.group_id, member_id=self.member_id, member_epoch=LEAVE_EPOCH
        )
        try:
            self.group.call("ShareGroupHeartbeat", request, min(5.0, self.request_timeout_s))
        except KafkaError as error:
            log.info("share group %s: leave not acknowledged: %s", self.group.group_id, error)

    def _run(self) -> None:
        while not self._stop.is_set():
            wait_s = self._beat()
            self._wake.wait(wait_s)
            self._wake.clear()

    def _beat(self) -> float:
        with self._lock:
            request = gpb.ShareGroupHeartbeatRequest(
                group_id=self.group.group_id, member_id=self.member_id,
                member_epoch=self._epoch, client_id=self.client_id,
            )  # fmt: skip
            if self._epoch == JOIN_EPOCH or not self._subscription_sent:
                request.subscribed_topic_names.names.extend(self._topics)
        try:
            response = self.group.call("ShareGroupHeartbeat", request, self.request_timeout_s)
        except KafkaError as error:
            log.info("share group %s: heartbeat failed: %s", self.group.group_id, error)
            with self._lock:
                self._subscription_sent = False  # the answer may be lost: send it again
            return self.group.cluster.backoff_s()
        code = ErrorCode.from_code(response.error_code)
        with self._lock:
            if self._stop.is_set():
                return 0.0  # leaving: leave() sends the last heartbeat
            if code is ErrorCode.NONE:
                self._epoch = response.member_epoch
                self._subscription_sent = True
                if response.has_assignment:
                    self._assignment = from_wire(response.assignment.topics)
                    self._on_change()
                self._interval_s = response.heartbeat_interval_ms / 1000
                return self._interval_s
            if code in FENCING_ERRORS:
                log.warning(
                    "share group %s: member %s fenced (%s): rejoining",
                    self.group.group_id, self.member_id, response.error_message,
                )  # fmt: skip
                self._epoch, self._assignment = JOIN_EPOCH, frozenset()
                return 0.0
            self._fatal = KafkaError(code, response.error_message)
            self._stop.set()
            return 0.0


@dataclass
class _Buffered:
    address: str
    records: deque[ShareConsumerRecord]


@dataclass
class _InFlight:
    """A ShareFetch or ShareAcknowledge a session waits for."""

    call: grpc.Future
    fetch: bool
    epoch: int
    added: frozenset[TopicPartition]
    forgotten: frozenset[TopicPartition]
    acks: dict[TopicPartition, list[AckRun]]


@dataclass
class _Session:
    """This member's share session on one leader, as the consumer believes the broker holds it."""

    address: str
    epoch: int = 0  # the next request's (0: open one)
    partitions: set[TopicPartition] = field(default_factory=set)
    inflight: _InFlight | None = None


class ShareConsumer(Closing):
    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        group_id: str,
        *,
        acknowledgement_mode: Literal["implicit", "explicit"] = "implicit",
        client_id: str = "raftlog-share-consumer",
        max_poll_records: int = 500,
        fetch_max_wait_ms: int = 500,
        fetch_max_bytes: int = 50 * 1024 * 1024,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        metadata_max_age_ms: int = 300_000,
        acknowledgement_commit_callback: AckCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
        security: SecuritySetting = None,
    ) -> None:
        self.config = ShareConsumerConfig(
            group_id=group_id, client_id=client_id, acknowledgement_mode=acknowledgement_mode,
            max_poll_records=max_poll_records, fetch_max_wait_ms=fetch_max_wait_ms,
            fetch_max_bytes=fetch_max_bytes, request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
            metadata_max_age_ms=metadata_max_age_ms,
        )  # fmt: skip
        self._clock = clock
        self._cluster = Cluster(
            bootstrap_servers, request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
            metadata_max_age_ms=metadata_max_age_ms, clock=clock, security=security,
        )  # fmt: skip
        self._request_timeout_s = request_timeout_ms / 1000
        self._closed = threading.Event()
        group = GroupClient(self._cluster, group_id, self._closed, clock)
        self._answered = threading.Event()  # a call completed, or the assignment changed
        self._membership = ShareMembership(
            group, client_id, self._request_timeout_s, self._answered.set
        )
        self._subscription: tuple[str, ...] = ()
        self._acks = Acknowledgements(explicit=acknowledgement_mode == "explicit")
        self._callback = acknowledgement_commit_callback
        self._sessions: dict[str, _Session] = {}  # by leader address
        self._buffer: deque[_Buffered] = deque()

    @property
    def member_id(self) -> str:
        return self._membership.member_id

    # -- subscription --------------------------------------------------------------------------
    def subscribe(self, topics: Iterable[str]) -> None:
        """Join the share group (or change the subscription) with these topics."""
        self._check_open()
        names = tuple(sorted(set(topics)))
        if not names or any(not t for t in names):
            raise ValueError("subscribe() takes one or more topic names (unsubscribe() to stop)")
        self._subscription = names
        self._cluster.add_topics(names)
        self._membership.subscribe(names)

    def subscription(self) -> set[str]:
        return set(self._subscription)

    def assignment(self) -> set[TopicPartition]:
        """The partitions the coordinator last assigned to this member."""
        return set(self._membership.assignment())

    def unsubscribe(self) -> None:
        """Close the share sessions (the leaders release what this member holds) and leave."""
        self._check_open()
        self._close_sessions()
        self._membership.leave()
        self._subscription = ()

    # -- polling -------------------------------------------------------------------------------
    def poll(self, timeout_ms: float = 0) -> list[ShareConsumerRecord]:
        """The records acquired for this member, waiting up to ``timeout_ms`` for some. Settles
        the previous poll's records first (see the module docstring)."""
        self._check_open()
        if not self._subscription:
            raise IllegalStateError("poll() needs subscribe() first")
        self._acks.before_poll()
        deadline = self._clock() + max(timeout_ms, 0) / 1000
        while True:
            self._collect()
            if self._buffer:
                return self._deliver()
            remaining = deadline - self._clock()
            self._send(int(min(self.config.fetch_max_wait_ms, max(remaining, 0) * 1000)))
            if not self._wait_answer(deadline) and not self._inflight():
                # nothing to fetch yet (no assignment, no known leader): until the assignment
                # changes, or a metadata retry is due
                self._answered.wait(min(max(remaining, 0), self._cluster.backoff_s()))
                self._answered.clear()
            self._collect()
            if self._buffer:
                return self._deliver()
            if self._clock() >= deadline:
                return []

    def acknowledge(
        self, record: ShareConsumerRecord, type: AcknowledgeType = AcknowledgeType.ACCEPT
    ) -> None:
        """Explicit mode: acknowledge a record the last poll returned (sent with the next poll
        or commit). RENEW restarts the record's lock at its leader and leaves it to be
        acknowledged later (see :mod:`dataplane.client._share_acks`)."""
        self._check_open()
        self._acks.acknowledge(TopicPartition(record.topic, record.partition), record.offset, type)

    def commit_sync(
        self, timeout_ms: float | None = None
    ) -> dict[TopicPartition, KafkaError | None]:
        """Send the acknowledgements now (ShareAcknowledge) and wait for the outcome of each
        partition's (None: done)."""
        self._check_open()
        self._acks.before_commit()
        timeout_s = self._request_timeout_s if timeout_ms is None else timeout_ms / 1000
        deadline = self._clock() + timeout_s
        outcomes: dict[TopicPartition, KafkaError | None] = {}
        addresses = self._acks.addresses()
        while addresses:
            for address in list(addresses):
                session = self._sessions.get(address)
                if session is None or session.inflight is None:
                    self._acknowledge(address)
            waiting = {
                a for a in addresses if (s := self._sessions.get(a)) and s.inflight is not None
            }
            if waiting and not self._wait_answer(deadline):
                for address in waiting:
                    session = self._sessions[address]
                    assert session.inflight is not None
                    for tp in session.inflight.acks:
                        outcomes[tp] = KafkaError(
                            ErrorCode.REQUEST_TIMED_OUT, "acknowledgement not answered in time"
                        )
                break
            done = self._collect()
            for tp, error in done.items():
                outcomes[tp] = error
            addresses = waiting | self._acks.addresses()
        return outcomes

    def commit_async(self) -> None:
        """Send the acknowledgements without waiting (outcomes to the callback)."""
        self._check_open()
        self._acks.before_commit()
        for address in self._acks.addresses():
            session = self._sessions.get(address)
            if session is None or session.inflight is None:
                self._acknowledge(address)
            # else: they ride on the next request to that leader

    # -- lifecycle -----------------------------------------------------------------------------
    def close(self) -> None:
        """Settle the acknowledgements, close the share sessions (releasing what this member
        still holds) and leave the group."""
        if self._closed.is_set():
            return
        try:
            self._acks.before_commit()
            self._close_sessions()
            self._membership.leave()
        finally:
            self._closed.set()
            self._cluster.close()

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise IllegalStateError("the share consumer is closed")

    def _close_sessions(self) -> None:
        deadline = self._clock() + min(self._request_timeout_s, 10.0)
        while self._inflight():
            if not self._wait_answer(deadline):
                break
            try:
                self._collect()
            except KafkaError as error:
                log.info("share group %s: closing: %s", self.config.group_id, error)
        for session in list(self._sessions.values()):
            if session.inflight is not None:
                session.inflight.call.cancel()
                session.inflight = None
            acks = self._acks.take(session.address)
            if session.epoch == 0:
                self._report(acks, _session_gone(session.address))
                continue
            request = _ack_request(self.config.group_id, self.member_id, FINAL_SESSION_EPOCH, acks)
            try:
                stub = self._cluster.stub(session.address)
                answer = stub.ShareAcknowledge(request, timeout=min(self._request_timeout_s, 10.0))
            except (grpc.RpcError, KafkaError) as failure:
                lost = (
                    failure
                    if isinstance(failure, KafkaError)
                    else rpc_error(failure, f"ShareAcknowledge to {session.address}")
                )
                log.info("share session on %s not closed: %s", session.address, lost)
                self._report(acks, lost)
                continue
            self._report_ack_answer(acks, answer)
        self._sessions.clear()
        self._buffer.clear()

    # -- sending -------------------------------------------------------------------------------
    def _wanted(self) -> dict[str, set[TopicPartition]]:
        """The assigned partitions by their leader's address (metadata refreshed when stale)."""
        assignment = self._membership.assignment()
        self._cluster.maybe_refresh()
        snapshot = self._cluster.snapshot()
        by_leader: dict[str, set[TopicPartition]] = {}
        for tp in assignment:
            leader = snapshot.leader(tp.topic, tp.partition)
            if leader is None:
                self._cluster.invalidate()
                continue
            by_leader.setdefault(leader.address, set()).add(tp)
        return by_leader

    def _inflight(self) -> bool:
        return any(s.inflight is not None for s in self._sessions.values())

    def _send(self, max_wait_ms: int) -> None:
        """A ShareFetch to each leader with no call in flight that has partitions to fetch, a
        session to update, or acknowledgements to carry."""
        wanted = self._wanted()
        addresses = set(wanted) | self._acks.addresses()
        addresses |= {a for a, s in self._sessions.items() if s.partitions}
        for address in sorted(addresses):
            session = self._sessions.setdefault(address, _Session(address))
            if session.inflight is not None:
                continue
            partitions = wanted.get(address, set())
            leaving = self._acks_outside(address, partitions)
            if leaving:  # acknowledgements of partitions no longer fetched here: not re-added
                self._acknowledge(address, only=leaving)
                continue  # the fetch goes once that is answered
            if session.epoch == 0:
                self._report(self._acks.take(address), _session_gone(address))
                if not partitions:
                    continue
                added, forgotten = frozenset(partitions), frozenset[TopicPartition]()
                acks: dict[TopicPartition, list[AckRun]] = {}
            else:
                acks = self._acks.take(address)
                added = frozenset(partitions - session.partitions)
                forgotten = frozenset(session.partitions - partitions)
            request = pb.ShareFetchRequest(
                group_id=self.config.group_id, member_id=self.member_id,
                share_session_epoch=session.epoch, max_wait_ms=max_wait_ms,
                max_bytes=self.config.fetch_max_bytes, max_records=self.config.max_poll_records,
            )  # fmt: skip
            _add_topics(request.topics, added | set(acks), acks)
            by_topic: dict[str, list[int]] = {}
            for tp in sorted(forgotten):
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            for topic, indexes in by_topic.items():
                request.forgotten_topics.add(name=topic, partitions=indexes)
            self._start(session, request, fetch=True, added=added, forgotten=forgotten, acks=acks)

    def _acks_outside(self, address: str, partitions: set[TopicPartition]) -> set[TopicPartition]:
        """Partitions with acknowledgements for an open session that it will not fetch."""
        session = self._sessions.get(address)
        if session is None or session.epoch == 0:
            return set()
        return self._acks.ready_partitions(address) - partitions

    def _acknowledge(self, address: str, only: set[TopicPartition] | None = None) -> None:
        """A ShareAcknowledge of what is ready for ``address`` (of ``only`` when given)."""
        session = self._sessions.get(address)
        acks = self._acks.take(address, only)
        if not acks:
            return
        if session is None or session.epoch == 0:
            self._report(acks, _session_gone(address))
            return
        request = _ack_request(self.config.group_id, self.member_id, session.epoch, acks)
        self._start(session, request, fetch=False, added=frozenset(), forgotten=frozenset(),
                    acks=acks)  # fmt: skip

    def _start(
        self,
        session: _Session,
        request: pb.ShareFetchRequest | pb.ShareAcknowledgeRequest,
        *,
        fetch: bool,
        added: frozenset[TopicPartition],
        forgotten: frozenset[TopicPartition],
        acks: dict[TopicPartition, list[AckRun]],
    ) -> None:
        stub = self._cluster.stub(session.address)
        method = stub.ShareFetch if fetch else stub.ShareAcknowledge
        wait_s = request.max_wait_ms / 1000 if isinstance(request, pb.ShareFetchRequest) else 0
        call = method.future(request, timeout=self._request_timeout_s + wait_s)
        session.inflight = _InFlight(call, fetch, session.epoch, added, forgotten, acks)
        call.add_done_callback(lambda _: self._answered.set())

    def _wait_answer(self, deadline: float) -> bool:
        """Until an in-flight call completes or the deadline; False at the deadline."""
        while not any(s.inflight and s.inflight.call.done() for s in self._sessions.values()):
            remaining = deadline - self._clock()
            if remaining <= 0 or not any(s.inflight for s in self._sessions.values()):
                return False
            self._answered.wait(remaining)
            self._answered.clear()
        return True

    # -- answers -------------------------------------------------------------------------------
    def _collect(self) -> dict[TopicPartition, KafkaError | None]:
        """Process every completed call: records buffered, sessions moved on; the outcome of
        each partition's acknowledgements."""
        outcomes: dict[TopicPartition, KafkaError | None] = {}
        for session in list(self._sessions.values()):
            inflight = session.inflight
            if inflight is None or not inflight.call.done():
                continue
            session.inflight = None
            try:
                answer = inflight.call.result()
            except grpc.RpcError as failure:
                error = rpc_error(failure, f"share request to {session.address}")
                self._cluster.invalidate()
                self._reset(session)
                outcomes.update(self._report(inflight.acks, error))
                continue
            code = ErrorCode.from_code(answer.error_code)
            if code is not ErrorCode.NONE:
                error = KafkaError(code, answer.error_message)
                outcomes.update(self._report(inflight.acks, error))
                if code in SESSION_ERRORS:
                    self._reset(session)
                    continue
                raise error
            session.epoch = next_epoch(inflight.epoch)
            session.partitions = (session.partitions | inflight.added) - inflight.forgotten
            if inflight.fetch:
                outcomes.update(self._fetched(session, inflight, answer))
            else:
                outcomes.update(self._report_ack_answer(inflight.acks, answer))
        return outcomes

    def _reset(self, session: _Session) -> None:
        """The broker's session is gone (or unknown): open a new one next time."""
        session.epoch = 0
        session.partitions = set()
        self._report(self._acks.forget(session.address), _session_gone(session.address))

    def _fetched(
        self, session: _Session, inflight: _InFlight, answer: pb.ShareFetchResponse
    ) -> dict[TopicPartition, KafkaError | None]:
        outcomes: dict[TopicPartition, KafkaError | None] = {}
        for topic in answer.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition)
                if tp in inflight.acks:
                    ack_code = ErrorCode.from_code(p.acknowledge_error_code)
                    error = (
                        None if ack_code is ErrorCode.NONE
                        else KafkaError(ack_code, p.acknowledge_error_message)
                    )  # fmt: skip
                    outcomes.update(self._report({tp: inflight.acks[tp]}, error))
                code = ErrorCode.from_code(p.error_code)
                if code in LEADER_ERRORS:
                    self._cluster.invalidate()
                    continue
                if code is not ErrorCode.NONE:
                    raise KafkaError(code, f"ShareFetch {tp}: {p.error_message}")
                records, gaps = decode_acquired(tp, p.records, p.acquired_records)
                if gaps:
                    self._acks.gaps(session.address, tp, gaps)
                if records:
                    self._buffer.append(_Buffered(session.address, deque(records)))
        for tp, runs in inflight.acks.items():  # acknowledged partitions the answer left out
            if tp not in outcomes:
                outcomes.update(self._report({tp: runs}, None))
        return outcomes

    def _report_ack_answer(
        self, acks: dict[TopicPartition, list[AckRun]], answer: pb.ShareAcknowledgeResponse
    ) -> dict[TopicPartition, KafkaError | None]:
        code = ErrorCode.from_code(answer.error_code)
        if code is not ErrorCode.NONE:
            return self._report(acks, KafkaError(code, answer.error_message))
        outcomes: dict[TopicPartition, KafkaError | None] = {}
        for topic in answer.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition)
                if tp not in acks:
                    continue
                code = ErrorCode.from_code(p.error_code)
                if code in LEADER_ERRORS:
                    self._cluster.invalidate()
                error = None if code is ErrorCode.NONE else KafkaError(code, p.error_message)
                outcomes.update(self._report({tp: acks[tp]}, error))
        for tp, runs in acks.items():
            if tp not in outcomes:
                outcomes.update(self._report({tp: runs}, None))
        return outcomes

    def _report(
        self, acks: dict[TopicPartition, list[AckRun]], error: KafkaError | None
    ) -> dict[TopicPartition, KafkaError | None]:
        """Acknowledgements done (or failed): to the callback; their outcome by partition."""
        outcomes: dict[TopicPartition, KafkaError | None] = {}
        for tp, runs in acks.items():
            offsets = {o for r in runs if r.type for o in range(r.first_offset, r.last_offset + 1)}
            outcomes[tp] = error
            if error is not None:
                log.info("share group %s: acknowledgement of %s failed: %s",
                         self.config.group_id, tp, error)  # fmt: skip
            if self._callback is not None and offsets:
                self._callback({tp: offsets}, error)
        return outcomes

    def _deliver(self) -> list[ShareConsumerRecord]:
        out: list[ShareConsumerRecord] = []
        limit = self.config.max_poll_records
        while self._buffer and len(out) < limit:
            head = self._buffer[0]
            take = min(limit - len(out), len(head.records))
            records = [head.records.popleft() for _ in range(take)]
            if not head.records:
                self._buffer.popleft()
            tp = TopicPartition(records[0].topic, records[0].partition)
            self._acks.delivered(head.address, tp, (r.offset for r in records))
            out.extend(records)
        return out


def decode_acquired(
    tp: TopicPartition, data: bytes, acquired: Iterable[pb.ShareAcquiredRecords]
) -> tuple[list[ShareConsumerRecord], list[int]]:
    """The records of the answered whole batches that were acquired (each with its delivery
    count), and the acquired offsets that hold no record (GAP)."""
    ranges = [(a.first_offset, a.last_offset, a.delivery_count) for a in acquired]
    records: list[ShareConsumerRecord] = []
    seen: set[int] = set()
    for position, header in iter_batches(data):
        if header.is_control:
            continue
        _, parsed = decode_batch_as(data, position, _builder)
        for r in parsed:
            count = next((c for first, last, c in ranges if first <= r.offset <= last), 0)
            if count:
                seen.add(r.offset)
                records.append(ShareConsumerRecord(
                    tp.topic, tp.partition, r.offset, r.timestamp, int(header.timestamp_type),
                    r.key, r.value, tuple(r.headers) if r.headers else (),
                    header.partition_leader_epoch, count,
                ))  # fmt: skip
    gaps = [o for first, last, _ in ranges for o in range(first, last + 1) if o not in seen]
    return records, gaps


def _builder(parsed: Iterable[ParsedRecord]) -> list[ParsedRecord]:
    return list(parsed)


def _add_topics(
    topics: object, partitions: Iterable[TopicPartition], acks: dict[TopicPartition, list[AckRun]]
) -> None:
    by_topic: dict[str, list[TopicPartition]] = {}
    for tp in sorted(set(partitions)):
        by_topic.setdefault(tp.topic, []).append(tp)
    for topic, tps in by_topic.items():
        out = topics.add(name=topic)  # type: ignore[attr-defined]
        for tp in tps:
            item = out.partitions.add(partition=tp.partition)
            for run in acks.get(tp, ()):
                item.acknowledgement_batches.add(
                    first_offset=run.first_offset, last_offset=run.last_offset,
                    acknowledge_types=[run.type],
                )  # fmt: skip


def _ack_request(
    group_id: str, member_id: str, epoch: int, acks: dict[TopicPartition, list[AckRun]]
) -> pb.ShareAcknowledgeRequest:
    request = pb.ShareAcknowledgeRequest(
        group_id=group_id, member_id=member_id, share_session_epoch=epoch
    )
    _add_topics(request.topics, acks, acks)
    return request


def _session_gone(address: str) -> KafkaError:
    return KafkaError(
        ErrorCode.SHARE_SESSION_NOT_FOUND,
        f"the share session on {address} was lost: its records were released",
    )
