"""Classic consumer groups: Kafka's group protocol before KIP-848 (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup), where the coordinator only gathers the members and one of them, the
leader, computes the assignment on the client side.

A rebalance has two phases. **Join** (PreparingRebalance): every member sends JoinGroup and its
request waits until all known members have joined or the rebalance timeout ran out (members that
did not rejoin are removed); the generation then moves on, a protocol (assignor) every member
supports is chosen by vote, and each waiting JoinGroup is answered — the leader's with every
member's subscription metadata. **Sync** (CompletingRebalance): the leader's SyncGroup carries
everyone's assignment; once it is stored in ``__consumer_offsets`` each member's waiting SyncGroup
gets its own and the group is Stable. Heartbeats keep sessions alive and tell members of a new
rebalance (REBALANCE_IN_PROGRESS); a stale generation gets ILLEGAL_GENERATION.

This module is the pure state machine (no threads, no clock of its own, no IO). A request that
must wait gets a :class:`concurrent.futures.Future`; answers to waiting requests are *queued* as
``(future, answer)`` in :attr:`ClassicGroups.answers` and handed out by the coordinator only after
the records emitted with them are replicated, so no member is told an assignment a failover could
forget. What survives a failover is the record written when a generation's assignment is stored
(or the group empties): members, their subscriptions and assignments, the generation, protocol
and leader. A reloaded group is Stable with fresh sessions; its members carry on with their
generation, as in Kafka.

Static members (KIP-345, ``group.instance.id``) follow Kafka's
``updateStaticMemberThenRebalanceOrCompleteJoin``. A known instance joining under an unknown
member id (a restarted process) takes a new member id and replaces its old self, whose requests
are fenced from then on (FENCED_INSTANCE_ID; so is any request naming the instance under another
member id). In a Stable group whose chosen protocol the newcomer does not change there is *no*
rebalance: the group is stored again under the new member id and the newcomer is answered with
the current generation (the leader of JoinGroup v9+ with ``skip_assignment``; before v9 it is
told the previous leader id, so it syncs as a follower), then SyncGroup hands it its old
assignment. Otherwise (CompletingRebalance, or a protocol change) the group rebalances. Static
members never leave on close: one that does not rejoin a rebalance keeps its place (and its
partitions, assigned by the leader) until its session times out; LeaveGroup by instance id
removes one at once.
"""

from __future__ import annotations

import enum
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

from protos import group_pb2 as gpb
from raftlog.errors import ErrorCode, KafkaError


class ClassicState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True)
class ClassicLimits:
    min_session_timeout_ms: int = 6_000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3_000  # group.initial.rebalance.delay.ms
    max_size: int = 2**31 - 1  # group.max.size


@dataclass(frozen=True)
class JoinAnswer:
    error: ErrorCode
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # the leader's: id, instance, metadata
    message: str = ""
    skip_assignment: bool = False  # JoinGroup v9+: the leader need not assign (static rejoin)


@dataclass(frozen=True)
class SyncAnswer:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""
    message: str = ""


Answer = JoinAnswer | SyncAnswer


def fail_answers(answers: list[tuple[Future[Answer], Answer]], error: KafkaError) -> None:
    """Answer each waiting request with ``error`` instead of what it was to get."""
    for future, answer in answers:
        if future.done():
            continue
        if isinstance(answer, JoinAnswer):
            future.set_result(JoinAnswer(error.error, answer.member_id, message=error.message))
        else:
            future.set_result(SyncAnswer(error.error, message=error.message))


@dataclass(frozen=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class DescribedClassicGroup:
    group_id: str
    state: str
    generation: int
    protocol_type: str | None
    protocol_name: str | None
    members: tuple[DescribedMember, ...]


@dataclass
class ClassicMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    # runtime only
    join: Future[Answer] | None = None
    sync: Future[Answer] | None = None
    session_deadline_ms: int = 0

    def metadata(self, protocol: str) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]


@dataclass
class ClassicGroup:
    group_id: str
    state: ClassicState = ClassicState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, ClassicMember] = field(default_factory=dict)
    empty_since_ms: int = -1
    # runtime only
    pending: dict[str, int] = field(default_factory=dict)  # KIP-394 member id -> deadline (ms)
    join_deadline_ms: int = 0
    join_limit_ms: int = 0  # the initial delay may be extended up to here
    sync_deadline_ms: int = 0

    def describe(self) -> DescribedClassicGroup:
        """A snapshot for DescribeGroups (subscriptions only once a protocol is chosen)."""
        protocol = self.protocol_name or ""
        members = tuple(
            DescribedMember(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata(protocol) if protocol else b"",
                m.assignment,
            )
            for m in self.members.values()
        )
        return DescribedClassicGroup(
            self.group_id, self.state.value, self.generation, self.protocol_type,
            self.protocol_name, members,
        )  # fmt: skip

    def instance_owner(self, instance_id: str) -> ClassicMember | None:
        return next((m for m in self.members.values() if m.group_instance_id == instance_id), None)

    def all_joined(self) -> bool:
        return all(m.join is not None for m in self.members.values())

    def replace_static_member(self, old: ClassicMember, new_member_id: str) -> ClassicMember:
        """Kafka's ``replaceStaticMember``: ``old``'s place (its position, assignment and, if
        it led, the leadership) under ``new_member_id``. Fencing ``old``'s waiting requests is
        the caller's."""
        assert old.group_instance_id is not None, "only a static member is replaced"
        new = ClassicMember(
            new_member_id, old.group_instance_id, old.client_id, old.client_host,
            old.session_timeout_ms, old.rebalance_timeout_ms, old.protocols, old.assignment,
        )  # fmt: skip
        self.members = {
            (new_member_id if mid == old.member_id else mid): (new if m is old else m)
            for mid, m in self.members.items()
        }
        if self.leader == old.member_id:
            self.leader = new_member_id
        return new

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def supports(self, protocol_type: str, protocols: list[str]) -> bool:
        if not self.members:
            return True
        if protocol_type != self.protocol_type:
            return False
        common = set(protocols)
        for member in self.members.values():
            common &= set(member.protocol_names())
        return bool(common)

    def select_protocol(self) -> str:
        """Kafka's vote: among the protocols every member supports, each member votes for the
        first of its own list; the most votes wins."""
        members = list(self.members.values())
        common = set(members[0].protocol_names())
        for member in members[1:]:
            common &= set(member.protocol_names())
        votes = Counter(
            next(name for name in m.protocol_names() if name in common) for m in members
        )
        return max(sorted(votes), key=lambda name: votes[name])


@dataclass(frozen=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    require_known_member_id: bool  # JoinGroup v4+ (KIP-394)
    skip_assignment_allowed: bool = False  # JoinGroup v9+ (the leader may skip assigning)


@dataclass(frozen=True)
class SyncRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str | None  # SyncGroup v5+; None: not checked
    protocol_name: str | None
    assignments: dict[str, bytes]  # the leader's: member id -> assignment


class ClassicGroups:
    """The classic groups of one ``__consumer_offsets`` partition.

    ``emit(group)`` is called whenever a group's durable part changed and must be written (the
    shard turns it into a record); ``answers`` collects the replies to waiting requests."""

    def __init__(
        self,
        limits: ClassicLimits,
        emit: Callable[[ClassicGroup], None],
        new_member_id: Callable[[str], str] = lambda client_id: f"{client_id}-{uuid.uuid4()}",
    ) -> None:
        self.limits = limits
        self.emit = emit
        self.new_member_id = new_member_id
        self.groups: dict[str, ClassicGroup] = {}
        self.answers: list[tuple[Future[Answer], Answer]] = []

    # -- JoinGroup --------------------------------------------------------------------------------
    def join(self, request: JoinRequest, now_ms: int) -> Future[Answer]:
        """The future of this JoinGroup's answer (queued in ``answers`` when known already)."""
        future: Future[Answer] = Future()
        try:
            self._join(request, now_ms, future)
        except KafkaError as error:
            self._answer(future, JoinAnswer(error.error, request.member_id, message=error.message))
        return future

    def _join(self, request: JoinRequest, now_ms: int, future: Future[Answer]) -> None:
        limits = self.limits
        if not limits.min_session_timeout_ms <= request.session_timeout_ms:
            raise KafkaError(
                ErrorCode.INVALID_SESSION_TIMEOUT,
                f"session timeout {request.session_timeout_ms} ms is below "
                f"group.min.session.timeout.ms ({limits.min_session_timeout_ms})",
            )
        if request.session_timeout_ms > limits.max_session_timeout_ms:
            raise KafkaError(
                ErrorCode.INVALID_SESSION_TIMEOUT,
                f"session timeout {request.session_timeout_ms} ms is above "
                f"group.max.session.timeout.ms ({limits.max_session_timeout_ms})",
            )
        if not request.protocol_type or not request.protocols:
            raise KafkaError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "a member must name its protocols"
            )
        group = self.groups.get(request.group_id)
        if group is None:
            group = self.groups[request.group_id] = ClassicGroup(request.group_id)
        names = [name for name, _ in request.protocols]
        member = group.members.get(request.member_id) if request.member_id else None
        if request.member_id and request.member_id not in group.pending:
            member = _validate_member(group, request.member_id, request.group_instance_id)
        if member is None:
            if not group.supports(request.protocol_type, names):
                raise KafkaError(
                    ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                    f"group {group.group_id!r} uses {group.protocol_type!r} with protocols no "
                    f"one of {names} matches",
                )
            self._join_new(group, request, now_ms, future)
            return
        self._join_known(group, member, request, now_ms, future)

    def _join_new(
        self, group: ClassicGroup, request: JoinRequest, now_ms: int, future: Future[Answer]
    ) -> None:
        member_id = request.member_id
        if not member_id:
            if request.group_instance_id is not None:
                owner = group.instance_owner(request.group_instance_id)
                if owner is not None:
                    self._rejoin_static(group, owner, request, now_ms, future)
                    return
            # Kafka's ids: the instance id (else the client id), a dash, a UUID.
            member_id = self.new_member_id(request.group_instance_id or request.client_id)
            if request.require_known_member_id and request.group_instance_id is None:
                group.pending[member_id] = now_ms + request.session_timeout_ms
                self._answer(
                    future,
                    JoinAnswer(
                        ErrorCode.MEMBER_ID_REQUIRED, member_id,
                        message="join again with this member id",
                    ),
                )  # fmt: skip
                return
        elif member_id not in group.pending:
            raise KafkaError(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"member {member_id!r} is not in group {group.group_id!r}",
            )
        if len(group.members) >= self.limits.max_size:
            raise KafkaError(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"group {group.group_id!r} has {len(group.members)} members (group.max.size)",
            )
        group.pending.pop(member_id, None)
        member = ClassicMember(
            member_id, request.group_instance_id, request.client_id, request.client_host,
            request.session_timeout_ms, request.rebalance_timeout_ms, request.protocols,
        )  # fmt: skip
        if not group.members:
            group.protocol_type = request.protocol_type
        group.members[member_id] = member
        member.join = future
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        self._prepare_rebalance(group, now_ms, f"member {member_id} joined")
        self._maybe_complete_join(group, now_ms)

    def _rejoin_static(
        self,
        group: ClassicGroup,
        old: ClassicMember,
        request: JoinRequest,
        now_ms: int,
        future: Future[Answer],
    ) -> None:
        """Kafka's ``updateStaticMemberThenRebalanceOrCompleteJoin``: a known instance under a
        new member id takes its old self's place; a rebalance only if the group needs one."""
        previous_leader = group.leader or ""
        self._fence(old, ErrorCode.FENCED_INSTANCE_ID, "a newer member has this instance id")
        member = group.replace_static_member(old, self.new_member_id(old.group_instance_id or ""))
        member.protocols = request.protocols
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        member.join = future
        if group.state is ClassicState.STABLE:
            if group.select_protocol() == group.protocol_name:
                # KIP-345: nothing to reassign. Stored under the new member id, answered
                # once that record is replicated; SyncGroup then hands out the old assignment.
                member.join = None
                self.emit(group)
                self._answer(future, self._static_answer(group, member, request, previous_leader))
                return
            why = f"static member {member.member_id} changes the group's protocol"
            self._prepare_rebalance(group, now_ms, why)
        elif group.state is ClassicState.COMPLETING_REBALANCE:
            # The leader may be assigning to the old member id: assign again.
            self._prepare_rebalance(group, now_ms, f"static member {member.member_id} rejoined")
        self._maybe_complete_join(group, now_ms)

    def _static_answer(
        self, group: ClassicGroup, member: ClassicMember, request: JoinRequest, leader: str
    ) -> JoinAnswer:
        if request.skip_assignment_allowed:
            answer = self._join_answer(group, member)
            return replace(answer, skip_assignment=member.member_id == group.leader)
        # Before JoinGroup v9 a leader would assign again: it is told the old leader id, so
        # it syncs as a follower (Kafka does the same).
        return JoinAnswer(
            ErrorCode.NONE, member.member_id, group.generation, group.protocol_type,
            group.protocol_name, leader,
        )  # fmt: skip

    def _join_known(
        self,
        group: ClassicGroup,
        member: ClassicMember,
        request: JoinRequest,
        now_ms: int,
        future: Future[Answer],
    ) -> None:
        if request.protocol_type != group.protocol_type:
            raise KafkaError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"group {group.group_id!r} uses protocol type {group.protocol_type!r}",
            )
        changed = request.protocols != member.protocols
        member.protocols = request.protocols
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        if member.join is not None:
            # A retried JoinGroup replaces the one still waiting (Kafka answers the old one
            # with an error, the client only listens to the newest).
            self._answer(member.join, JoinAnswer(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        member.join = future
        stays = group.state is not ClassicState.PREPARING_REBALANCE
        if stays and not changed and (group.state is ClassicState.COMPLETING_REBALANCE or (
            group.state is ClassicState.STABLE and member.member_id != group.leader
        )):  # fmt: skip
            # Nothing changed: the current generation stands, answered again.
            member.join = None
            self._answer(future, self._join_answer(group, member))
            return
        self._prepare_rebalance(group, now_ms, f"member {member.member_id} rejoined")
        self._maybe_complete_join(group, now_ms)

    def _prepare_rebalance(self, group: ClassicGroup, now_ms: int, why: str) -> None:
        if group.state is ClassicState.PREPARING_REBALANCE:
            if group.join_limit_ms > group.join_deadline_ms:  # still in the initial delay
                delay = self.limits.initial_rebalance_delay_ms
                group.join_deadline_ms = min(now_ms + delay, group.join_limit_ms)
            return
        for member in group.members.values():
            if member.sync is not None:
                self._answer(member.sync, SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS, message=why))
                member.sync = None
        timeout = group.rebalance_timeout_ms()
        if group.state is ClassicState.EMPTY and self.limits.initial_rebalance_delay_ms > 0:
            # group.initial.rebalance.delay.ms: let a starting fleet join one rebalance.
            delay = min(self.limits.initial_rebalance_delay_ms, timeout)
            group.join_deadline_ms = now_ms + delay
            group.join_limit_ms = now_ms + timeout
        else:
            group.join_deadline_ms = group.join_limit_ms = now_ms + timeout
        group.state = ClassicState.PREPARING_REBALANCE

    def _maybe_complete_join(self, group: ClassicGroup, now_ms: int) -> None:
        if group.state is not ClassicState.PREPARING_REBALANCE:
            return
        delaying = group.join_limit_ms > group.join_deadline_ms and now_ms < group.join_deadline_ms
        if (group.all_joined() and not delaying) or now_ms >= group.join_deadline_ms:
            self._complete_join(group, now_ms)

    def _complete_join(self, group: ClassicGroup, now_ms: int) -> None:
        # Dynamic members that did not rejoin are out; static ones keep their place until
        # their session runs out (KIP-345), and the leader assigns to them as well.
        for member in [m for m in group.members.values() if m.join is None]:
            if member.group_instance_id is None:
                self._remove(group, member, None, now_ms, rebalance=False)
        joined = [m for m in group.members.values() if m.join is not None]
        if group.members and not joined:
            # Only absent static members: wait again (Kafka reschedules the join); their
            # sessions expire meanwhile unless they come back.
            group.join_deadline_ms = group.join_limit_ms = now_ms + group.rebalance_timeout_ms()
            return
        group.generation += 1
        if not group.members:
            self._become_empty(group, now_ms)
            return
        group.protocol_name = group.select_protocol()
        if group.leader not in group.members or group.members[group.leader].join is None:
            group.leader = joined[0].member_id
        group.state = ClassicState.COMPLETING_REBALANCE
        group.sync_deadline_ms = now_ms + group.rebalance_timeout_ms()
        for member in group.members.values():
            member.assignment = b""
            if member.join is None:
                continue  # an absent static member
            member.session_deadline_ms = now_ms + member.session_timeout_ms
            self._answer(member.join, self._join_answer(group, member))
            member.join = None

    def _join_answer(self, group: ClassicGroup, member: ClassicMember) -> JoinAnswer:
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if member.member_id == group.leader:
            protocol = group.protocol_name or ""
            members = tuple(
                (m.member_id, m.group_instance_id, m.metadata(protocol))
                for m in group.members.values()
            )
        return JoinAnswer(
            ErrorCode.NONE, member.member_id, group.generation, group.protocol_type,
            group.protocol_name, group.leader or "", members,
        )  # fmt: skip

    def _become_empty(self, group: ClassicGroup, now_ms: int) -> None:
        group.state = ClassicState.EMPTY
        group.protocol_name = None
        group.leader = None
        group.empty_since_ms = now_ms
        self.emit(group)

    # -- SyncGroup --------------------------------------------------------------------------------
    def sync(self, request: SyncRequest, now_ms: int) -> Future[Answer]:
        future: Future[Answer] = Future()
        member_id = request.member_id
        try:
            group, member = self._member(request.group_id, member_id, request.group_instance_id)
            protocol_type, protocol_name = request.protocol_type, request.protocol_name
            if (protocol_type is not None and protocol_type != group.protocol_type) or (
                protocol_name is not None
                and group.protocol_name is not None
                and protocol_name != group.protocol_name
            ):
                raise KafkaError(
                    ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                    f"the group's protocol is {group.protocol_type}/{group.protocol_name}",
                )
            if group.state is ClassicState.PREPARING_REBALANCE:
                raise KafkaError(ErrorCode.REBALANCE_IN_PROGRESS, "the group is rebalancing")
            _check_generation(group, request.generation_id)
            member.session_deadline_ms = now_ms + member.session_timeout_ms
            if group.state is ClassicState.STABLE:
                self._answer(future, self._sync_answer(group, member))
                return future
            member.sync = future
            if member_id == group.leader:
                for m in group.members.values():
                    m.assignment = request.assignments.get(m.member_id, b"")
                group.state = ClassicState.STABLE
                self.emit(group)
                for m in group.members.values():
                    if m.sync is not None:
                        self._answer(m.sync, self._sync_answer(group, m))
                        m.sync = None
        except KafkaError as error:
            self._answer(future, SyncAnswer(error.error, message=error.message))
        return future

    def _sync_answer(self, group: ClassicGroup, member: ClassicMember) -> SyncAnswer:
        return SyncAnswer(
            ErrorCode.NONE, group.protocol_type, group.protocol_name, member.assignment
        )

    # -- Heartbeat / LeaveGroup -------------------------------------------------------------------
    def heartbeat(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        now_ms: int,
    ) -> None:
        group, member = self._member(group_id, member_id, group_instance_id)
        member.session_deadline_ms = now_ms + member.session_timeout_ms
        if group.state is ClassicState.PREPARING_REBALANCE:
            raise KafkaError(ErrorCode.REBALANCE_IN_PROGRESS, "rejoin the group")
        _check_generation(group, generation_id)

    def leave(
        self, group_id: str, members: list[tuple[str, str | None]], now_ms: int
    ) -> list[KafkaError | None]:
        """Each (member id, instance id) leaves; one outcome per member."""
        outcomes: list[KafkaError | None] = []
        known = self.groups.get(group_id)
        for given_id, instance_id in members:
            member_id = given_id
            if not member_id and instance_id is not None and known is not None:
                # KIP-345: a static member may leave by its instance id alone.
                owner = known.instance_owner(instance_id)
                member_id = "" if owner is None else owner.member_id
            try:
                group, member = self._member(group_id, member_id, instance_id)
            except KafkaError as error:
                if known is not None and known.pending.pop(member_id, None) is not None:
                    outcomes.append(None)  # a KIP-394 member that never completed its join
                else:
                    outcomes.append(error)
                continue
            self._remove(group, member, ErrorCode.UNKNOWN_MEMBER_ID, now_ms)
            outcomes.append(None)
        return outcomes

    # -- commits ---------------------------------------------------------------------------------
    def validate_commit(
        self,
        group: ClassicGroup,
        member_id: str,
        generation_id: int,
        instance_id: str | None = None,
    ) -> None:
        """Kafka's rules for a classic group's OffsetCommit."""
        if generation_id < 0 and not member_id and instance_id is None:
            if group.members:
                raise KafkaError(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"group {group.group_id!r} has members: only they may commit",
                )
            return
        _validate_member(group, member_id, instance_id)
        _check_generation(group, generation_id)
        if group.state is ClassicState.COMPLETING_REBALANCE:
            raise KafkaError(ErrorCode.REBALANCE_IN_PROGRESS, "the group is being assigned")

    # -- timers ----------------------------------------------------------------------------------
    def tick(self, now_ms: int) -> list[tuple[str, str, str]]:
        """Expire what ran out; (group, member, why) of each member removed."""
        removed: list[tuple[str, str, str]] = []
        for group in list(self.groups.values()):
            for member_id, deadline in list(group.pending.items()):
                if deadline <= now_ms:
                    del group.pending[member_id]
            for member in list(group.members.values()):
                waiting_to_join = (
                    group.state is ClassicState.PREPARING_REBALANCE and member.join is not None
                )
                if member.session_deadline_ms <= now_ms and not waiting_to_join:
                    self._remove(group, member, ErrorCode.UNKNOWN_MEMBER_ID, now_ms)
                    removed.append((group.group_id, member.member_id, "session timeout"))
            if group.state is ClassicState.PREPARING_REBALANCE:
                for member in group.members.values():
                    static = member.group_instance_id is not None
                    if member.join is None and now_ms >= group.join_deadline_ms and not static:
                        why = "rebalance timeout: did not rejoin"
                        removed.append((group.group_id, member.member_id, why))
                self._maybe_complete_join(group, now_ms)
            elif (
                group.state is ClassicState.COMPLETING_REBALANCE
                and now_ms >= group.sync_deadline_ms
            ):
                # The leader never sent the assignment: whoever has not synced is out.
                for member in [m for m in group.members.values() if m.sync is None]:
                    self._remove(group, member, ErrorCode.UNKNOWN_MEMBER_ID, now_ms)
                    removed.append((group.group_id, member.member_id, "sync timeout"))
        return removed

    def start_sessions(self, now_ms: int) -> None:
        """After a load: every member gets a full session to find the new coordinator."""
        for group in self.groups.values():
            for member in group.members.values():
                member.session_deadline_ms = now_ms + member.session_timeout_ms

    def abandon(self, error: ErrorCode, message: str) -> None:
        """The shard is unloaded: every waiting request gets ``error``."""
        for group in self.groups.values():
            for member in group.members.values():
                for future in (member.join, member.sync):
                    if future is not None and not future.done():
                        answer = (
                            JoinAnswer(error, member.member_id, message=message)
                            if future is member.join
                            else SyncAnswer(error, message=message)
                        )
                        future.set_result(answer)
                member.join = member.sync = None

    # -- helpers ---------------------------------------------------------------------------------
    def _member(
        self, group_id: str, member_id: str, instance_id: str | None
    ) -> tuple[ClassicGroup, ClassicMember]:
        group = self.groups.get(group_id)
        if group is None:
            raise KafkaError(
                ErrorCode.UNKNOWN_MEMBER_ID, f"member {member_id!r} is not in group {group_id!r}"
            )
        return group, _validate_member(group, member_id, instance_id)

    def _fence(self, member: ClassicMember, code: ErrorCode, message: str) -> None:
        """Answer ``member``'s waiting JoinGroup and SyncGroup with ``code``."""
        if member.join is not None:
            self._answer(member.join, JoinAnswer(code, member.member_id, message=message))
        if member.sync is not None:
            self._answer(member.sync, SyncAnswer(code, message=message))
        member.join = member.sync = None

    def _remove(
        self,
        group: ClassicGroup,
        member: ClassicMember,
        error: ErrorCode | None,
        now_ms: int,
        rebalance: bool = True,
    ) -> None:
        del group.members[member.member_id]
        self._fence(member, error or ErrorCode.UNKNOWN_MEMBER_ID, "removed")
        if not rebalance:
            return
        if not group.members and group.state is not ClassicState.PREPARING_REBALANCE:
            group.generation += 1
            self._become_empty(group, now_ms)
        elif group.members:
            self._prepare_rebalance(group, now_ms, f"member {member.member_id} left")
            self._maybe_complete_join(group, now_ms)
        else:
            self._maybe_complete_join(group, now_ms)

    def _answer(self, future: Future[Answer], answer: Answer) -> None:
        self.answers.append((future, answer))

    def take_answers(self) -> list[tuple[Future[Answer], Answer]]:
        answers, self.answers = self.answers, []
        return answers

    def __iter__(self) -> Iterator[ClassicGroup]:
        return iter(self.groups.values())

    # -- records ---------------------------------------------------------------------------------
    def replay(self, group_id: str, value: gpb.ClassicGroupValue | None) -> None:
        """A stored generation (or a tombstone): the group as it was when written."""
        if value is None:
            self.groups.pop(group_id, None)
            return
        group = self.groups.get(group_id)
        if group is not None and to_record(group) == value:
            # Written by this coordinator just now (or the same again): the live group, with
            # its waiting requests, stands. A static member's replacement is stored under the
            # same generation with another member id, so the generation alone cannot tell.
            return
        group = self.groups[group_id] = ClassicGroup(
            group_id,
            ClassicState.STABLE if value.members else ClassicState.EMPTY,
            value.generation,
            value.protocol_type or None,
            value.protocol_name or None,
            value.leader or None,
            empty_since_ms=value.empty_since_ms,
        )
        for m in value.members:
            group.members[m.member_id] = ClassicMember(
                m.member_id, m.group_instance_id or None, m.client_id, m.client_host,
                m.session_timeout_ms, m.rebalance_timeout_ms,
                ((value.protocol_name, m.subscription),), m.assignment,
            )  # fmt: skip


def to_record(group: ClassicGroup) -> gpb.ClassicGroupValue:
    protocol = group.protocol_name or ""
    return gpb.ClassicGroupValue(
        protocol_type=group.protocol_type or "",
        generation=group.generation,
        protocol_name=protocol,
        leader=group.leader or "",
        empty_since_ms=group.empty_since_ms if not group.members else -1,
        members=[
            gpb.ClassicMemberValue(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id or "",
                client_id=m.client_id,
                client_host=m.client_host,
                session_timeout_ms=m.session_timeout_ms,
                rebalance_timeout_ms=m.rebalance_timeout_ms,
                subscription=m.metadata(protocol),
                assignment=m.assignment,
            )
            for m in group.members.values()
        ],
    )


def _validate_member(group: ClassicGroup, member_id: str, instance_id: str | None) -> ClassicMember:
    """Kafka's ``validateMember``: the instance id (if given) must belong to ``member_id``."""
    if instance_id is not None:
        owner = group.instance_owner(instance_id)
        if owner is None:
            raise KafkaError(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"no member of group {group.group_id!r} has group.instance.id {instance_id!r}",
            )
        if owner.member_id != member_id:
            raise KafkaError(
                ErrorCode.FENCED_INSTANCE_ID,
                f"instance {instance_id!r} is member {owner.member_id!r} now, not {member_id!r}",
            )
    member = group.members.get(member_id)
    if member is None:
        raise KafkaError(
            ErrorCode.UNKNOWN_MEMBER_ID, f"member {member_id!r} is not in group {group.group_id!r}"
        )
    return member


def _check_generation(group: ClassicGroup, generation_id: int) -> None:
    if generation_id != group.generation:
        raise KafkaError(
            ErrorCode.ILLEGAL_GENERATION,
            f"generation {generation_id} is not the group's ({group.generation})",
        )
