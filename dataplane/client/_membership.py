"""Membership of a classic group (JoinGroup / SyncGroup / Heartbeat / LeaveGroup) for members
that bring their own protocol, as Kafka Connect's workers do (protocol type "connect").

:class:`GroupMembership` runs one thread: it joins (a first JoinGroup gets MEMBER_ID_REQUIRED
and the member id to join again with, KIP-394), and if the coordinator made it the leader it
computes everyone's assignment with the ``assign`` callback and hands it out in SyncGroup. Every
member gets its own assignment back and reports it through ``on_assigned``. Then it heartbeats
every ``heartbeat_interval_ms``; REBALANCE_IN_PROGRESS (another member joined, left, or its
session expired) or :meth:`GroupMembership.request_rejoin` make it join again. The protocol is
eager, as Kafka Connect's first one: ``on_revoked`` runs before every rejoin, so a member stops
all its work before the group hands it out again; meanwhile a helper thread keeps heartbeating, so
a slow revocation does not let the member's session expire.

Every RPC goes to the group's coordinator, found and followed by ``GroupClient`` (it moves with
the ``__consumer_offsets`` partition's leader), with a deadline. Errors end the thread only when
the member was closed; anything else is retried after a backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dataplane.client._cluster import Cluster, SecuritySetting
from dataplane.client._group import GroupClient
from protos import group_pb2 as gpb
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
# A JoinGroup waits until every member rejoined (at most the rebalance timeout), plus the
# coordinator's group.initial.rebalance.delay.ms and its own margin.
JOIN_MARGIN_S = 15.0
REJOIN_ERRORS = frozenset(
    {
        ErrorCode.REBALANCE_IN_PROGRESS,
        ErrorCode.ILLEGAL_GENERATION,
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.FENCED_INSTANCE_ID,
    }
)
BACKOFF_S = 0.2


@dataclass(frozen=True)
class GroupAssignment:
    """What one member got in one generation."""

    generation_id: int
    member_id: str
    leader_id: str
    protocol_name: str
    assignment: bytes


@dataclass(frozen=True)
class JoinedMember:
    """A member as the leader sees it in its JoinGroup answer."""

    member_id: str
    group_instance_id: str
    metadata: bytes


# (protocol name, members) -> member id -> assignment bytes
AssignFn = Callable[[str, Sequence[JoinedMember]], dict[str, bytes]]


class GroupMembership:
    """A member of classic group ``group_id``; call :meth:`start`, then :meth:`close`."""

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        group_id: str,
        *,
        protocol_type: str,
        protocols: Callable[[], list[tuple[str, bytes]]],
        assign: AssignFn,
        on_assigned: Callable[[GroupAssignment], None],
        on_revoked: Callable[[], None],
        client_id: str = "raftlog-member",
        session_timeout_ms: int = 10_000,
        rebalance_timeout_ms: int = 60_000,
        heartbeat_interval_ms: int = 3_000,
        request_timeout_ms: int = 30_000,
        clock: Callable[[], float] = time.monotonic,
        security: SecuritySetting = None,
    ) -> None:
        if not 0 < heartbeat_interval_ms < session_timeout_ms:
            raise ValueError("heartbeat.interval.ms must be positive and below session.timeout.ms")
        self.group_id = group_id
        self.protocol_type = protocol_type
        self._protocols = protocols
        self._assign = assign
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self.client_id = client_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.heartbeat_interval_s = heartbeat_interval_ms / 1000
        self.request_timeout_s = request_timeout_ms / 1000
        self._clock = clock
        self._closed = threading.Event()
        self._wake = threading.Event()
        self._rejoin = threading.Event()
        self._cluster = Cluster(
            bootstrap_servers, request_timeout_ms=request_timeout_ms, security=security
        )
        self._group = GroupClient(self._cluster, group_id, self._closed, clock)
        self._lock = threading.Lock()
        self.member_id = ""
        self.generation_id = -1
        self.leader_id = ""
        self._thread = threading.Thread(
            target=self._run, name=f"membership-{group_id}", daemon=True
        )

    # -- the application's side -----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def request_rejoin(self) -> None:
        """Join again (a new generation) at once, e.g. when the work to assign changed."""
        self._rejoin.set()
        self._wake.set()

    def is_leader(self) -> bool:
        with self._lock:
            return bool(self.member_id) and self.member_id == self.leader_id

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop heartbeating and leave the group (so it rebalances at once, not after the
        session timeout)."""
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout_s)
        with self._lock:
            member_id = self.member_id
        if member_id:
            self._leave(member_id, timeout_s)
        self._cluster.close()

    # -- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        joined = False
        while not self._closed.is_set():
            try:
                if not joined or self._rejoin.is_set():
                    self._rejoin.clear()
                    if joined:
                        self._revoke()
                        joined = False
                    joined = self._join_and_sync()
                    continue
                self._wake.wait(self.heartbeat_interval_s)
                self._wake.clear()
                if not self._closed.is_set() and not self._rejoin.is_set():
                    joined = self._heartbeat()
                    if not joined:
                        self._revoke()
            except KafkaError as error:
                log.warning("group %s: %s; retrying", self.group_id, error)
                self._closed.wait(BACKOFF_S)

    def _revoke(self) -> None:
        """``on_revoked``, heartbeating meanwhile: the coordinator expires a member that has
        not rejoined yet once its session runs out, and stopping work may take longer."""
        done = threading.Event()
        keepalive = threading.Thread(
            target=self._keep_alive, args=(done,), name=f"keepalive-{self.group_id}", daemon=True
        )
        keepalive.start()
        try:
            self._on_revoked()
        finally:
            done.set()
            keepalive.join(self.request_timeout_s)

    def _keep_alive(self, done: threading.Event) -> None:
        while not done.wait(self.heartbeat_interval_s):
            with self._lock:
                request = gpb.HeartbeatRequest(
                    group_id=self.group_id,
                    generation_id=self.generation_id,
                    member_id=self.member_id,
                )
            try:  # REBALANCE_IN_PROGRESS is the expected answer: the session is what counts
                self._group.call("Heartbeat", request, self.heartbeat_interval_s)
            except KafkaError as error:
                log.info("group %s: heartbeat while revoking: %s", self.group_id, error)

    def _join_and_sync(self) -> bool:
        """One JoinGroup + SyncGroup round; True with an assignment (reported)."""
        join = self._join()
        if join is None:
            return False
        assignments: dict[str, bytes] = {}
        if join.leader == join.member_id:
            members = [
                JoinedMember(m.member_id, m.group_instance_id, bytes(m.metadata))
                for m in join.members
            ]
            assignments = self._assign(join.protocol_name, members)
        sync = self._group.call(
            "SyncGroup",
            gpb.SyncGroupRequest(
                group_id=self.group_id,
                generation_id=join.generation_id,
                member_id=join.member_id,
                protocol_type=self.protocol_type,
                protocol_name=join.protocol_name,
                assignments=[
                    gpb.SyncGroupAssignment(member_id=m, assignment=a)
                    for m, a in sorted(assignments.items())
                ],
            ),
            self.rebalance_timeout_ms / 1000 + JOIN_MARGIN_S,
        )
        code = ErrorCode.from_code(sync.error_code)
        if code in REJOIN_ERRORS:
            self._forget_if_unknown(code)
            return False
        if code is not ErrorCode.NONE:
            raise KafkaError(code, f"SyncGroup: {sync.error_message}")
        with self._lock:
            self.generation_id = join.generation_id
            self.leader_id = join.leader
        log.info(
            "group %s: member %s has generation %d (leader %s)",
            self.group_id, join.member_id, join.generation_id, join.leader,
        )  # fmt: skip
        self._on_assigned(
            GroupAssignment(
                join.generation_id, join.member_id, join.leader, join.protocol_name,
                bytes(sync.assignment),
            )
        )  # fmt: skip
        return True

    def _join(self) -> gpb.JoinGroupResponse | None:
        for _attempt in range(2):  # the second attempt carries the id MEMBER_ID_REQUIRED named
            with self._lock:
                member_id = self.member_id
            join: gpb.JoinGroupResponse = self._group.call(
                "JoinGroup",
                gpb.JoinGroupRequest(
                    group_id=self.group_id,
                    member_id=member_id,
                    session_timeout_ms=self.session_timeout_ms,
                    rebalance_timeout_ms=self.rebalance_timeout_ms,
                    protocol_type=self.protocol_type,
                    protocols=[
                        gpb.JoinGroupProtocol(name=n, metadata=m) for n, m in self._protocols()
                    ],
                    client_id=self.client_id,
                ),
                self.rebalance_timeout_ms / 1000 + JOIN_MARGIN_S,
            )
            code = ErrorCode.from_code(join.error_code)
            if code is ErrorCode.MEMBER_ID_REQUIRED:
                with self._lock:
                    self.member_id = join.member_id
                continue
            if code in REJOIN_ERRORS:
                self._forget_if_unknown(code)
                return None
            if code is not ErrorCode.NONE:
                raise KafkaError(code, f"JoinGroup: {join.error_message}")
            with self._lock:
                self.member_id = join.member_id
            return join
        return None

    def _heartbeat(self) -> bool:
        """True while the generation stands."""
        with self._lock:
            request = gpb.HeartbeatRequest(
                group_id=self.group_id,
                generation_id=self.generation_id,
                member_id=self.member_id,
            )
        response = self._group.call("Heartbeat", request, self.request_timeout_s)
        code = ErrorCode.from_code(response.error_code)
        if code is ErrorCode.NONE:
            return True
        if code in REJOIN_ERRORS:
            log.info("group %s: %s: joining again", self.group_id, code.name)
            self._forget_if_unknown(code)
            return False
        raise KafkaError(code, f"Heartbeat: {response.error_message}")

    def _forget_if_unknown(self, code: ErrorCode) -> None:
        if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID):
            with self._lock:
                self.member_id = ""
                self.generation_id = -1

    def _leave(self, member_id: str, timeout_s: float) -> None:
        request = gpb.LeaveGroupRequest(
            group_id=self.group_id, members=[gpb.LeaveGroupMember(member_id=member_id)]
        )
        self._closed.clear()  # GroupClient stops retrying once closed: one bounded try
        try:
            self._group.call("LeaveGroup", request, min(timeout_s, self.request_timeout_s))
        except KafkaError as error:
            log.warning("group %s: LeaveGroup failed (%s): the session will expire", self.group_id,
                        error)  # fmt: skip
        finally:
            self._closed.set()
