"""The consumer groups of one ``__consumer_offsets`` partition: pure state, records in, records out.

A :class:`GroupShard` holds the groups whose ids hash to one partition of ``__consumer_offsets``
and their committed offsets. It changes only by **replaying records** (:meth:`GroupShard.replay`):
loading a partition replays its log, and every handler (heartbeat, commit, delete, expiry)
*emits* records, each replayed at once and collected for the coordinator to append to the log.
So the state is always exactly the replay of the log, as in Kafka's new group coordinator.

Membership follows KIP-848. The group epoch moves when membership, a subscription or the partition
count of a subscribed topic changes; the target assignment is recomputed (by
:mod:`dataplane.coordinator.assignor`) when the group epoch passes the assignment epoch; each member
is then reconciled towards its target (Kafka's ``CurrentAssignmentBuilder``): partitions to give up
are revoked first and the member stays at its epoch until its heartbeat no longer reports them;
partitions still owned by another member are held back ("unreleased") until that member lets
them go. A member's epoch fences its stale heartbeats (FENCED_MEMBER_EPOCH) and commits
(STALE_MEMBER_EPOCH). Timers (session and rebalance timeouts) are runtime state, not records:
after a load every member starts a fresh session, as in Kafka.

Offsets committed inside a transaction (TxnOffsetCommit) are pending until the transaction's
marker: see :mod:`dataplane.coordinator.txn_offsets`.
"""

from __future__ import annotations

import enum
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TypeAlias

from dataplane.coordinator import assignor, consumer_protocol, txn_offsets
from dataplane.coordinator import classic_group as cg
from dataplane.coordinator import share_group as sg
from dataplane.coordinator.topic_partitions import (
    TopicPartition,
    from_topic_partitions,
    to_topic_partitions,
)
from protos import group_pb2 as gpb
from raftlog.batch import NO_PRODUCER_ID
from raftlog.errors import ErrorCode, KafkaError

GroupRecord = tuple[bytes, bytes | None]  # (key, value); a None value is a tombstone
RT = gpb.GroupRecordType
RecordType: TypeAlias = gpb.GroupRecordType.ValueType
DEFAULT_REBALANCE_TIMEOUT_MS = 300_000
CONSUMER_PROTOCOL_TYPE = "consumer"  # Kafka's ConsumerProtocol.PROTOCOL_TYPE
LEAVE_EPOCH = -1
LEAVE_STATIC_EPOCH = -2  # KIP-345: a static member away for now (its partitions wait for it)


class MemberState(enum.IntEnum):
    STABLE = 0
    UNREVOKED_PARTITIONS = 1  # must give up `pending_revocation` before it moves on
    UNRELEASED_PARTITIONS = 2  # waits for partitions another member still owns


@dataclass(frozen=True)
class Member:
    member_id: str
    client_id: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str = ""
    rebalance_timeout_ms: int = DEFAULT_REBALANCE_TIMEOUT_MS
    server_assignor: str = ""
    instance_id: str = ""  # KIP-345 group.instance.id; "" = a dynamic member
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: frozenset[TopicPartition] = frozenset()
    pending_revocation: frozenset[TopicPartition] = frozenset()

    def subscribed(self, topic_names: Iterable[str]) -> set[str]:
        """The existing topics this member subscribes to, by name or by regex."""
        wanted = set(self.subscribed_topic_names)
        if self.subscribed_topic_regex:
            pattern = re.compile(self.subscribed_topic_regex)
            wanted |= {t for t in topic_names if not t.startswith("__") and pattern.fullmatch(t)}
        return wanted


@dataclass
class Group:
    group_id: str
    epoch: int = 0
    empty_since_ms: int = -1
    partition_counts: dict[str, int] = field(default_factory=dict)  # what the target used
    assignment_epoch: int = 0
    target: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)
    members: dict[str, Member] = field(default_factory=dict)

    @property
    def state(self) -> str:
        """Kafka's ConsumerGroupState names."""
        if not self.members:
            return "Empty"
        if self.epoch > self.assignment_epoch:
            return "Assigning"
        if any(
            m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE
            for m in self.members.values()
        ):
            return "Reconciling"
        return "Stable"

    def static_member(self, instance_id: str) -> Member | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def owners(self) -> dict[TopicPartition, str]:
        """Who holds each partition now (assigned or still to revoke)."""
        found: dict[TopicPartition, str] = {}
        for member in self.members.values():
            for tp in member.assigned | member.pending_revocation:
                found[tp] = member.member_id
        return found


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    # Where its record came in the replay (the log order): a transaction's offset commits at
    # its marker only over an older record (Kafka compares record offsets).
    record_order: int = field(default=-1, compare=False)


@dataclass(frozen=True)
class HeartbeatResult:
    member_id: str
    member_epoch: int
    assignment: frozenset[TopicPartition]


@dataclass(frozen=True)
class OffsetCommitItem:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str


class TopicsView:
    """What the shard needs of the cluster metadata: partition counts by topic name."""

    def __init__(self, partition_counts: Mapping[str, int]) -> None:
        self.partition_counts = partition_counts

    def count(self, topic: str) -> int | None:
        return self.partition_counts.get(topic)

    def names(self) -> Iterable[str]:
        return self.partition_counts.keys()


# -- record codec ---------------------------------------------------------------------------------
def record_key(
    kind: RecordType, group_id: str, member_id: str = "", topic: str = "", partition: int = 0
) -> bytes:
    return gpb.GroupRecordKey(
        type=kind, group_id=group_id, member_id=member_id, topic=topic, partition=partition
    ).SerializeToString(deterministic=True)


# -- the shard ------------------------------------------------------------------------------------
class GroupShard:
    def __init__(
        self,
        *,
        session_timeout_ms: int,
        max_group_size: int,
        offset_metadata_max_bytes: int,
        new_member_id: Callable[[], str] = lambda: uuid.uuid4().hex,
        classic_limits: cg.ClassicLimits | None = None,
        share_limits: sg.ShareLimits | None = None,
    ) -> None:
        self.session_timeout_ms = session_timeout_ms
        # a KIP-848 group's session timeout: its consumer.session.timeout.ms group config, if it
        # has one (set by the coordinator from the metadata image), else the broker's
        self.session_timeout_of: Callable[[str], int] = lambda _: session_timeout_ms
        self.max_group_size = max_group_size
        self.offset_metadata_max_bytes = offset_metadata_max_bytes
        self.new_member_id = new_member_id
        self.groups: dict[str, Group] = {}
        self.offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self.pending: txn_offsets.PendingOffsets[CommittedOffset] = txn_offsets.PendingOffsets()
        self._replayed = 0  # records replayed: the order of the next one in the log
        # runtime only: (group, member) -> deadline (ms) of its session and of its revocation
        self.session_deadlines: dict[tuple[str, str], int] = {}
        self.revocation_deadlines: dict[tuple[str, str], int] = {}
        self._emitted: list[GroupRecord] = []
        # JoinGroup/SyncGroup groups; a group id names either a classic or a consumer group
        self.classic = cg.ClassicGroups(classic_limits or cg.ClassicLimits(), self._emit_classic)
        # ShareGroupHeartbeat groups (KIP-932); a group id names one kind of group only
        self.share = sg.ShareGroups(share_limits or sg.ShareLimits(), self._emit)

    # -- records ---------------------------------------------------------------------------------
    def take_emitted(self) -> list[GroupRecord]:
        emitted, self._emitted = self._emitted, []
        return emitted

    def _emit(self, key: bytes, value: bytes | None) -> None:
        self.replay(key, value)
        self._emitted.append((key, value))

    def replay(
        self, key_bytes: bytes, value: bytes | None, producer_id: int = NO_PRODUCER_ID
    ) -> None:
        """Apply one record of ``__consumer_offsets`` (a load replays the log through this);
        ``producer_id``: of the transactional batch that holds it (pending offsets)."""
        key = gpb.GroupRecordKey.FromString(key_bytes)
        gid = key.group_id
        self._replayed += 1
        if key.type == RT.OFFSET_COMMIT:
            self._replay_offset(gid, (key.topic, key.partition), value, producer_id)
            return
        assert producer_id == NO_PRODUCER_ID, f"a transaction wrote a record of type {key.type}"
        if key.type == RT.CLASSIC_GROUP_METADATA:
            stored = None if value is None else gpb.ClassicGroupValue.FromString(value)
            self.classic.replay(gid, stored)
            return
        if key.type in sg.RECORD_TYPES:
            self.share.replay(key, value)
            return
        if key.type == RT.GROUP_METADATA and value is None:
            self.groups.pop(gid, None)
            return
        group = self.groups.get(gid)
        if group is None:
            if value is None:
                return  # a tombstone of something already gone
            group = self.groups[gid] = Group(gid)
        self._replay_group(group, key, value)

    def _replay_offset(
        self, gid: str, tp: TopicPartition, value: bytes | None, producer_id: int
    ) -> None:
        if value is None:
            self.offsets.get(gid, {}).pop(tp, None)
            if gid in self.offsets and not self.offsets[gid]:
                del self.offsets[gid]
            self.pending.drop_partition(gid, tp)
            return
        v = gpb.OffsetCommitValue.FromString(value)
        offset = CommittedOffset(
            v.offset, v.leader_epoch, v.metadata, v.commit_timestamp_ms, self._replayed
        )
        if producer_id == NO_PRODUCER_ID:
            self.offsets.setdefault(gid, {})[tp] = offset
        else:
            self.pending.put(producer_id, gid, tp, offset)

    def replay_transactional(self, key: bytes, value: bytes | None, producer_id: int) -> None:
        """A record of a producer's transactional batch: a TxnOffsetCommit's pending offset."""
        self.replay(key, value, producer_id)

    def replay_marker(self, producer_id: int, commit: bool) -> None:
        """The producer's marker: its pending offsets become the committed ones (unless a
        plain commit of the partition came later in the log), or are dropped."""
        ended = self.pending.end(producer_id)
        if not commit:
            return
        for gid, offsets in ended.items():
            stored = self.offsets.setdefault(gid, {})
            for tp, offset in offsets.items():
                existing = stored.get(tp)
                if existing is None or offset.record_order > existing.record_order:
                    stored[tp] = offset
            if not stored:
                del self.offsets[gid]

    def _replay_group(self, group: Group, key: gpb.GroupRecordKey, value: bytes | None) -> None:
        mid = key.member_id
        if key.type == RT.GROUP_METADATA:
            assert value is not None
            meta = gpb.GroupMetadataValue.FromString(value)
            group.epoch, group.empty_since_ms = meta.epoch, meta.empty_since_ms
        elif key.type == RT.GROUP_SUBSCRIPTION_METADATA:
            counts = gpb.SubscriptionMetadataValue.FromString(value or b"").partition_counts
            group.partition_counts = dict(counts)
        elif key.type == RT.TARGET_ASSIGNMENT_METADATA:
            meta_t = gpb.TargetAssignmentMetadataValue.FromString(value or b"")
            group.assignment_epoch = meta_t.assignment_epoch
        elif key.type == RT.TARGET_ASSIGNMENT_MEMBER:
            if value is None:
                group.target.pop(mid, None)
            else:
                parts = gpb.TargetAssignmentMemberValue.FromString(value).partitions
                group.target[mid] = from_topic_partitions(parts)
        elif key.type == RT.MEMBER_METADATA:
            if value is None:
                group.members.pop(mid, None)
                return
            meta_m = gpb.MemberMetadataValue.FromString(value)
            group.members[mid] = replace(
                group.members.get(mid) or Member(mid),
                client_id=meta_m.client_id,
                subscribed_topic_names=tuple(meta_m.subscribed_topic_names),
                subscribed_topic_regex=meta_m.subscribed_topic_regex,
                rebalance_timeout_ms=meta_m.rebalance_timeout_ms,
                server_assignor=meta_m.server_assignor,
                instance_id=meta_m.instance_id,
            )
        elif key.type == RT.CURRENT_MEMBER_ASSIGNMENT:
            current = group.members.get(mid)
            if value is None:
                if current is not None:
                    group.members[mid] = replace(
                        current, member_epoch=0, previous_member_epoch=-1,
                        state=MemberState.STABLE, assigned=frozenset(),
                        pending_revocation=frozenset(),
                    )  # fmt: skip
                return
            a = gpb.CurrentMemberAssignmentValue.FromString(value)
            group.members[mid] = replace(
                current or Member(mid),
                member_epoch=a.member_epoch,
                previous_member_epoch=a.previous_member_epoch,
                state=MemberState(a.state),
                assigned=from_topic_partitions(a.assigned),
                pending_revocation=from_topic_partitions(a.pending_revocation),
            )
        else:
            raise AssertionError(f"unknown group record type {key.type}")

    # -- emitting helpers ------------------------------------------------------------------------
    def _emit_classic(self, group: cg.ClassicGroup) -> None:
        key = record_key(RT.CLASSIC_GROUP_METADATA, group.group_id)
        self._emit(key, cg.to_record(group).SerializeToString())

    def _emit_group_epoch(self, group: Group, epoch: int, now_ms: int) -> None:
        if group.members:
            empty_since = -1
        else:
            empty_since = group.empty_since_ms if group.empty_since_ms >= 0 else now_ms
        value = gpb.GroupMetadataValue(epoch=epoch, empty_since_ms=empty_since)
        self._emit(record_key(RT.GROUP_METADATA, group.group_id), value.SerializeToString())

    def _emit_member_metadata(self, group: Group, member: Member) -> None:
        value = gpb.MemberMetadataValue(
            client_id=member.client_id,
            subscribed_topic_names=member.subscribed_topic_names,
            subscribed_topic_regex=member.subscribed_topic_regex,
            rebalance_timeout_ms=member.rebalance_timeout_ms,
            server_assignor=member.server_assignor,
            instance_id=member.instance_id,
        )
        key = record_key(RT.MEMBER_METADATA, group.group_id, member.member_id)
        self._emit(key, value.SerializeToString())

    def _emit_current_assignment(self, group: Group, member: Member) -> None:
        value = gpb.CurrentMemberAssignmentValue(
            member_epoch=member.member_epoch,
            previous_member_epoch=member.previous_member_epoch,
            state=int(member.state),
            assigned=to_topic_partitions(member.assigned),
            pending_revocation=to_topic_partitions(member.pending_revocation),
        )
        key = record_key(RT.CURRENT_MEMBER_ASSIGNMENT, group.group_id, member.member_id)
        self._emit(key, value.SerializeToString())

    def _remove_member(self, group: Group, member_id: str, now_ms: int) -> None:
        self._drop_member_records(group, member_id)
        self._emit_group_epoch(group, group.epoch + 1, now_ms)

    def _drop_member_records(self, group: Group, member_id: str) -> None:
        gid = group.group_id
        self._emit(record_key(RT.CURRENT_MEMBER_ASSIGNMENT, gid, member_id), None)
        if member_id in group.target:
            self._emit(record_key(RT.TARGET_ASSIGNMENT_MEMBER, gid, member_id), None)
        self._emit(record_key(RT.MEMBER_METADATA, gid, member_id), None)
        self.session_deadlines.pop((gid, member_id), None)
        self.revocation_deadlines.pop((gid, member_id), None)

    def _replace_static(self, group: Group, old: Member, member_id: str) -> Member:
        """Kafka's ``replaceMember``: a static member back under a new member id takes over
        its old self's current and target assignment, at epoch 0 and with no new group epoch,
        so no partition moves."""
        target = group.target.get(old.member_id)
        self._drop_member_records(group, old.member_id)
        new = replace(old, member_id=member_id, member_epoch=0, previous_member_epoch=0)
        self._emit_member_metadata(group, new)
        if target is not None:
            value = gpb.TargetAssignmentMemberValue(partitions=to_topic_partitions(target))
            key = record_key(RT.TARGET_ASSIGNMENT_MEMBER, group.group_id, member_id)
            self._emit(key, value.SerializeToString())
        self._emit_current_assignment(group, new)
        return group.members[member_id]

    def _leave(
        self, group: Group | None, request: gpb.ConsumerGroupHeartbeatRequest, now_ms: int
    ) -> HeartbeatResult:
        """Epoch -1 leaves; a static member's -2 (Kafka's ``consumerGroupStaticMemberGroupLeave``)
        only marks it away: it keeps its partitions until it rejoins or its session ends."""
        gid, member_id = request.group_id, request.member_id
        if request.instance_id:
            member = _static_owner(group, request.instance_id, member_id)
            assert group is not None
            if request.member_epoch == LEAVE_STATIC_EPOCH:
                away = replace(
                    member, member_epoch=LEAVE_STATIC_EPOCH, pending_revocation=frozenset()
                )
                self._emit_current_assignment(group, away)
                self.revocation_deadlines.pop((gid, member_id), None)
                return HeartbeatResult(member_id, LEAVE_STATIC_EPOCH, frozenset())
        elif group is None or member_id not in group.members:
            raise KafkaError(ErrorCode.UNKNOWN_MEMBER_ID, f"{member_id!r} is not in {gid!r}")
        self._remove_member(group, member_id, now_ms)
        return HeartbeatResult(member_id, LEAVE_EPOCH, frozenset())

    # -- heartbeat --------------------------------------------------------------------------------
    def heartbeat(
        self,
        request: gpb.ConsumerGroupHeartbeatRequest,
        topics: TopicsView,
        now_ms: int,
    ) -> HeartbeatResult:
        """KIP-848's ConsumerGroupHeartbeat: join (epoch 0), heartbeat, or leave (epoch -1)."""
        gid, epoch = request.group_id, request.member_epoch
        _validate_heartbeat(request)
        self.refuse_share(gid, "consumer")
        classic = self.classic.groups.get(gid)
        if classic is not None:
            if classic.members or classic.pending:
                raise KafkaError(
                    ErrorCode.GROUP_ID_NOT_FOUND,
                    f"group {gid!r} is a classic (JoinGroup) group with members, not a consumer "
                    "group: join it with the classic protocol",
                )
            self._emit(record_key(RT.CLASSIC_GROUP_METADATA, gid), None)  # converted
        group = self.groups.get(gid)
        if epoch in (LEAVE_EPOCH, LEAVE_STATIC_EPOCH):
            return self._leave(group, request, now_ms)
        owned = from_topic_partitions(request.owned.topics) if request.HasField("owned") else None
        if epoch == 0:
            member, joined = self._joining(group, request)
            if group is None:
                group = Group(gid)  # recorded by the records below
        else:
            if request.instance_id:
                _static_owner(group, request.instance_id, request.member_id)
            if group is None or request.member_id not in group.members:
                raise KafkaError(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"member {request.member_id!r} is not in group {gid!r}: rejoin with epoch 0",
                )
            member = group.members[request.member_id]
            _check_member_epoch(member, epoch, owned)
            joined = False
        updated = _with_subscription(member, request)
        if joined or updated != member:
            self._emit_member_metadata(group, updated)
            group = self.groups[gid]
        # Kafka's hasMemberSubscriptionChanged: a new member or a new subscription moves the
        # group epoch (a returning static member with the same subscription does not).
        bump = joined or (updated.subscribed_topic_names, updated.subscribed_topic_regex) != (
            member.subscribed_topic_names,
            member.subscribed_topic_regex,
        )
        if joined:
            # A new member starts without partitions at epoch 0.
            self._emit_current_assignment(group, updated)
        counts = _subscribed_counts(group.members.values(), topics)
        if counts != group.partition_counts:
            value = gpb.SubscriptionMetadataValue(partition_counts=counts).SerializeToString()
            self._emit(record_key(RT.GROUP_SUBSCRIPTION_METADATA, gid), value)
            bump = True
        if bump:
            self._emit_group_epoch(group, group.epoch + 1, now_ms)
        if group.epoch > group.assignment_epoch:
            self._compute_target(group, topics)
        member = group.members[updated.member_id]
        reconciled = reconcile(member, group.assignment_epoch,
                               group.target.get(member.member_id, frozenset()),
                               owned, group.owners())  # fmt: skip
        if reconciled != member:
            self._emit_current_assignment(group, reconciled)
        key = (gid, reconciled.member_id)
        self.session_deadlines[key] = now_ms + self.session_timeout_of(gid)
        if reconciled.state is MemberState.UNREVOKED_PARTITIONS:
            self.revocation_deadlines.setdefault(key, now_ms + reconciled.rebalance_timeout_ms)
        else:
            self.revocation_deadlines.pop(key, None)
        return HeartbeatResult(reconciled.member_id, reconciled.member_epoch, reconciled.assigned)

    def _joining(
        self, group: Group | None, request: gpb.ConsumerGroupHeartbeatRequest
    ) -> tuple[Member, bool]:
        """The member joining with epoch 0, and whether it is new to the group."""
        instance = request.instance_id
        away = None if group is None or not instance else group.static_member(instance)
        if away is not None:
            assert group is not None
            if away.member_epoch != LEAVE_STATIC_EPOCH:
                # Kafka's throwIfInstanceIdIsUnreleased: one live member per instance id.
                raise KafkaError(
                    ErrorCode.UNRELEASED_INSTANCE_ID,
                    f"instance id {instance!r} is still member {away.member_id!r} of group "
                    f"{group.group_id!r}: it must leave (or its session end) first",
                )
            return self._replace_static(
                group, away, request.member_id or self.new_member_id()
            ), False
        size = 0 if group is None else len(group.members)
        known = group is not None and request.member_id in group.members
        if not known and size >= self.max_group_size:
            raise KafkaError(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"group {request.group_id!r} is full: {size} members (group.consumer.max.size)",
            )
        member_id = request.member_id or self.new_member_id()
        # A member rejoining with epoch 0 starts over: it reports that it owns nothing.
        return Member(member_id, instance_id=instance), True

    def _compute_target(self, group: Group, topics: TopicsView) -> None:
        names = list(topics.names())
        subscriptions = {m.member_id: m.subscribed(names) for m in group.members.values()}
        target = assignor.assign(subscriptions, group.partition_counts, group.target)
        gid = group.group_id
        for member_id in sorted(set(group.target) - set(target)):
            self._emit(record_key(RT.TARGET_ASSIGNMENT_MEMBER, gid, member_id), None)
        for member_id, partitions in sorted(target.items()):
            if group.target.get(member_id) != partitions:
                value = gpb.TargetAssignmentMemberValue(partitions=to_topic_partitions(partitions))
                key = record_key(RT.TARGET_ASSIGNMENT_MEMBER, gid, member_id)
                self._emit(key, value.SerializeToString())
        value_meta = gpb.TargetAssignmentMetadataValue(assignment_epoch=group.epoch)
        self._emit(record_key(RT.TARGET_ASSIGNMENT_METADATA, gid), value_meta.SerializeToString())

    # -- share groups (KIP-932) ------------------------------------------------------------------
    def share_heartbeat(
        self, request: gpb.ShareGroupHeartbeatRequest, topics: TopicsView, now_ms: int
    ) -> sg.ShareHeartbeatResult:
        """ShareGroupHeartbeat (:meth:`ShareGroups.heartbeat`). A group id that names a
        consumer or classic group (or has committed offsets) is not a share group:
        GROUP_ID_NOT_FOUND, as Kafka (no conversion between the protocols)."""
        gid = request.group_id
        other = gid in self.groups or gid in self.classic.groups or gid in self.offsets
        if other or self.pending.has_open(gid):
            raise KafkaError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {gid} is not a share group.")
        return self.share.heartbeat(request, topics.partition_counts, now_ms)

    def refuse_share(self, group_id: str, kind: str = "consumer") -> None:
        """GROUP_ID_NOT_FOUND for a share group where a consumer (or classic) group is asked
        for: heartbeats, offset commits, fetches and deletes (Kafka's ShareGroup.validate*)."""
        if group_id in self.share.groups:
            raise KafkaError(
                ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a {kind} group."
            )

    # -- classic groups (JoinGroup / SyncGroup) ---------------------------------------------------
    def join_group(self, request: cg.JoinRequest, now_ms: int) -> Future[cg.Answer]:
        """A classic JoinGroup; its answer may come later (see :mod:`classic_group`)."""
        if not request.group_id:
            raise KafkaError(ErrorCode.INVALID_GROUP_ID, "the group id must not be empty")
        if request.group_id in self.share.groups:  # Kafka's answer to a group of another type
            raise KafkaError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"group {request.group_id!r} is a share group: join it with a share consumer",
            )
        group = self.groups.get(request.group_id)
        if group is not None:
            if group.members:
                raise KafkaError(
                    ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                    f"group {request.group_id!r} is a consumer group (KIP-848) with members: "
                    "join it with group.protocol=consumer",
                )
            self._delete_group_records(group)  # an empty consumer group becomes classic
        return self.classic.join(request, now_ms)

    def take_answers(self) -> list[tuple[Future[cg.Answer], cg.Answer]]:
        return self.classic.take_answers()

    # -- timers -----------------------------------------------------------------------------------
    def expire_members(self, now_ms: int) -> list[tuple[str, str, str]]:
        """Remove members whose session or revocation deadline passed: (group, member, why)."""
        removed: list[tuple[str, str, str]] = []
        for deadlines, why in (
            (self.session_deadlines, "session timeout"),
            (self.revocation_deadlines, "rebalance timeout: partitions not revoked in time"),
        ):
            for (gid, mid), deadline in sorted(deadlines.items()):
                group = self.groups.get(gid)
                if deadline > now_ms or group is None or mid not in group.members:
                    continue
                self._remove_member(group, mid, now_ms)
                removed.append((gid, mid, why))
        return removed + self.classic.tick(now_ms)

    def start_sessions(self, now_ms: int) -> None:
        """After a load: every member gets a full session to find the new coordinator."""
        self.share.start_sessions(now_ms)
        self.session_deadlines = {
            (g.group_id, m): now_ms + self.session_timeout_of(g.group_id)
            for g in self.groups.values()
            for m in g.members
        }
        self.revocation_deadlines = {}
        self.classic.start_sessions(now_ms)

    # -- the runtime's hooks (dataplane.coordinator.runtime.ShardState) ---------------------------
    def on_loaded(self, now_ms: int) -> None:
        self.start_sessions(now_ms)

    def fail_answers(
        self, answers: list[tuple[Future[cg.Answer], cg.Answer]], error: KafkaError
    ) -> None:
        cg.fail_answers(answers, error)

    def abandon(self, error: ErrorCode, message: str) -> None:
        self.classic.abandon(error, message)

    # -- offsets ----------------------------------------------------------------------------------
    def validate_commit(
        self, group_id: str, member_id: str, member_epoch: int, instance_id: str | None = None
    ) -> None:
        """Kafka's rules for a consumer group's OffsetCommit (the group-level part);
        ``instance_id``: a classic static member's, checked as Kafka does (FENCED_INSTANCE_ID)."""
        if not group_id:
            raise KafkaError(ErrorCode.INVALID_GROUP_ID, "the group id must not be empty")
        self.refuse_share(group_id)
        classic = self.classic.groups.get(group_id)
        if classic is not None:
            self.classic.validate_commit(classic, member_id, member_epoch, instance_id)
            return
        group = self.groups.get(group_id)
        if member_epoch < 0 and not member_id:
            if group is not None and group.members:
                raise KafkaError(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"group {group_id!r} has members: only they may commit (or stop them first)",
                )
            return
        if group is None:
            raise KafkaError(ErrorCode.GROUP_ID_NOT_FOUND, f"no group {group_id!r}")
        member = group.members.get(member_id)
        if member is None:
            raise KafkaError(
                ErrorCode.UNKNOWN_MEMBER_ID, f"member {member_id!r} is not in group {group_id!r}"
            )
        if member_epoch != member.member_epoch:
            raise KafkaError(
                ErrorCode.STALE_MEMBER_EPOCH,
                f"member {member_id!r} committed at epoch {member_epoch}, its epoch is "
                f"{member.member_epoch}",
            )

    def commit(
        self, group_id: str, items: Sequence[OffsetCommitItem], now_ms: int
    ) -> dict[TopicPartition, KafkaError | None]:
        """Record the offsets that pass the per-partition checks (after ``validate_commit``
        and after the caller checked them against the partitions' log end offsets)."""
        results: dict[TopicPartition, KafkaError | None] = {}
        for item in items:
            tp = (item.topic, item.partition)
            error = self._metadata_error(item.metadata)
            if error is not None:
                results[tp] = error
                continue
            value = gpb.OffsetCommitValue(
                offset=item.offset, leader_epoch=item.leader_epoch, metadata=item.metadata,
                commit_timestamp_ms=now_ms,
            )  # fmt: skip
            key = record_key(RT.OFFSET_COMMIT, group_id, topic=item.topic, partition=item.partition)
            self._emit(key, value.SerializeToString())
            results[tp] = None
        return results

    def validate_txn_commit(
        self, group_id: str, generation_id: int, member_id: str, instance_id: str | None
    ) -> None:
        """The group check of a TxnOffsetCommit (:func:`txn_offsets.validate_txn_commit`)."""
        self.refuse_share(group_id)
        txn_offsets.validate_txn_commit(
            group_id, generation_id, member_id, instance_id,
            consumer=self.groups.get(group_id), classic=self.classic.groups.get(group_id),
            known=group_id in self.offsets or self.pending.has_open(group_id),
        )  # fmt: skip

    def txn_commit_records(
        self, group_id: str, items: Sequence[OffsetCommitItem], now_ms: int
    ) -> tuple[list[GroupRecord], dict[TopicPartition, KafkaError | None]]:
        """The records of a TxnOffsetCommit's offsets, *not* applied: the runtime appends them
        as the producer's transactional batch and replays them once the partition took them."""
        records: list[GroupRecord] = []
        results: dict[TopicPartition, KafkaError | None] = {}
        for item in items:
            tp = (item.topic, item.partition)
            error = self._metadata_error(item.metadata)
            if error is None:
                value = gpb.OffsetCommitValue(
                    offset=item.offset, leader_epoch=item.leader_epoch, metadata=item.metadata,
                    commit_timestamp_ms=now_ms,
                )  # fmt: skip
                key = record_key(RT.OFFSET_COMMIT, group_id, topic=tp[0], partition=tp[1])
                records.append((key, value.SerializeToString()))
            results[tp] = error
        return records, results

    def _metadata_error(self, metadata: str) -> KafkaError | None:
        size = len(metadata.encode())
        if size <= self.offset_metadata_max_bytes:
            return None
        return KafkaError(
            ErrorCode.OFFSET_METADATA_TOO_LARGE,
            f"{size} bytes of metadata, the limit is {self.offset_metadata_max_bytes} "
            "(offset.metadata.max.bytes)",
        )

    def unstable(self, group_id: str) -> set[TopicPartition]:
        """The group's partitions whose offsets a transaction holds pending (KIP-447: an
        OffsetFetch with ``require_stable`` answers UNSTABLE_OFFSET_COMMIT for them)."""
        return self.pending.partitions(group_id)

    def committed(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> dict[TopicPartition, CommittedOffset | None]:
        stored = self.offsets.get(group_id, {})
        if partitions is None:
            return dict(stored)
        return {tp: stored.get(tp) for tp in partitions}

    def delete_group(self, group_id: str, now_ms: int) -> None:
        if group_id in self.share.groups:
            self.share.delete(group_id)
            return
        classic = self.classic.groups.get(group_id)
        if classic is not None and (classic.members or classic.pending):
            raise KafkaError(
                ErrorCode.NON_EMPTY_GROUP,
                f"group {group_id!r} has {len(classic.members)} members; stop them first",
            )
        group = self.groups.get(group_id)
        if classic is not None:
            self._emit(record_key(RT.CLASSIC_GROUP_METADATA, group_id), None)
        elif group is None and group_id not in self.offsets and not self.pending.has_open(group_id):
            raise KafkaError(ErrorCode.GROUP_ID_NOT_FOUND, f"no group {group_id!r}")
        if group is not None and group.members:
            raise KafkaError(
                ErrorCode.NON_EMPTY_GROUP,
                f"group {group_id!r} has {len(group.members)} members; stop them first",
            )
        # Kafka's deleteAllOffsets: the committed offsets and the pending ones of open
        # transactions (whose markers then find nothing to commit).
        for topic, partition in sorted(
            set(self.offsets.get(group_id, {})) | self.unstable(group_id)
        ):
            self._emit(
                record_key(RT.OFFSET_COMMIT, group_id, topic=topic, partition=partition), None
            )
        if group is not None:
            self._delete_group_records(group)

    def delete_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition], topic_names: Iterable[str]
    ) -> dict[TopicPartition, KafkaError | None]:
        """OffsetDelete (Kafka's ``OffsetMetadataManager.deleteOffsets``): a tombstone for each
        partition's committed offset (or a transaction's pending one), except the partitions
        of topics the group's members subscribe to (GROUP_SUBSCRIBED_TO_TOPIC). A group that
        does not exist is GROUP_ID_NOT_FOUND; a classic group with members of a protocol other
        than Kafka's "consumer" (whose subscriptions are unknown) is NON_EMPTY_GROUP."""
        self.refuse_share(group_id)
        classic = self.classic.groups.get(group_id)
        known = (
            classic is not None or group_id in self.groups or group_id in self.offsets
            or self.pending.has_open(group_id)
        )  # fmt: skip
        if not known:
            raise KafkaError(ErrorCode.GROUP_ID_NOT_FOUND, f"no group {group_id!r}")
        if (
            classic is not None
            and classic.state is not cg.ClassicState.EMPTY
            and classic.protocol_type != CONSUMER_PROTOCOL_TYPE
        ):
            raise KafkaError(
                ErrorCode.NON_EMPTY_GROUP,
                f"group {group_id!r} has members of protocol type {classic.protocol_type!r}",
            )
        _, _, subscribed = self._subscriptions(group_id, list(topic_names))
        stored, unstable = self.offsets.get(group_id, {}), self.unstable(group_id)
        results: dict[TopicPartition, KafkaError | None] = {}
        for tp in partitions:
            if tp[0] in subscribed:
                results[tp] = KafkaError(
                    ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
                    f"members of group {group_id!r} subscribe to {tp[0]}: its offsets stay",
                )
                continue
            if tp in stored or tp in unstable:
                self._emit(
                    record_key(RT.OFFSET_COMMIT, group_id, topic=tp[0], partition=tp[1]), None
                )
            results[tp] = None
        return results

    def _delete_group_records(self, group: Group) -> None:
        gid = group.group_id
        for member_id in sorted(group.target):
            self._emit(record_key(RT.TARGET_ASSIGNMENT_MEMBER, gid, member_id), None)
        self._emit(record_key(RT.TARGET_ASSIGNMENT_METADATA, gid), None)
        self._emit(record_key(RT.GROUP_SUBSCRIPTION_METADATA, gid), None)
        self._emit(record_key(RT.GROUP_METADATA, gid), None)

    def expire_offsets(
        self, now_ms: int, retention_ms: int, topics: TopicsView
    ) -> list[tuple[str, TopicPartition, str]]:
        """Offsets of deleted topics (pending ones too), and offsets past
        ``offsets.retention.minutes`` (for an empty group counted from when it emptied or the
        commit, whichever is later; for a group with members only offsets of topics none of
        them subscribes to expire; never one a transaction holds pending); then empty groups
        without offsets or open transactions are deleted (share groups: without share state).
        Returns (group, partition, why)."""
        expired: list[tuple[str, TopicPartition, str]] = []
        names = list(topics.names())
        for gid in sorted(self.pending.open_by_group):
            for tp in sorted(self.unstable(gid) - set(self.offsets.get(gid, {}))):
                if topics.count(tp[0]) is None:
                    self._emit(
                        record_key(RT.OFFSET_COMMIT, gid, topic=tp[0], partition=tp[1]), None
                    )
                    expired.append((gid, tp, "topic deleted"))
        for gid in sorted(self.offsets):
            empty, empty_since, subscribed = self._subscriptions(gid, names)
            unstable = self.unstable(gid)
            for tp, committed in sorted(self.offsets[gid].items()):
                if topics.count(tp[0]) is None:
                    why = "topic deleted"
                elif tp in unstable:
                    why = ""  # a transaction's offset waits for its marker
                elif empty:
                    since = max(committed.commit_timestamp_ms, empty_since)
                    why = "retention" if now_ms - since >= retention_ms else ""
                elif tp[0] not in subscribed:
                    age = now_ms - committed.commit_timestamp_ms
                    why = "retention" if age >= retention_ms else ""
                else:
                    why = ""
                if why:
                    key = record_key(RT.OFFSET_COMMIT, gid, topic=tp[0], partition=tp[1])
                    self._emit(key, None)
                    expired.append((gid, tp, why))
        for gid, group in sorted(self.groups.items()):
            idle_ms = now_ms - group.empty_since_ms
            unused = gid not in self.offsets and not self.pending.has_open(gid)
            if not group.members and unused and idle_ms >= retention_ms:
                self._delete_group_records(group)
        for gid, classic in sorted(self.classic.groups.items()):
            idle_ms = now_ms - classic.empty_since_ms
            unused = gid not in self.offsets and not self.pending.has_open(gid)
            if classic.state is cg.ClassicState.EMPTY and unused and idle_ms >= retention_ms:
                self._emit(record_key(RT.CLASSIC_GROUP_METADATA, gid), None)
        self.share.expire_empty(now_ms, retention_ms)  # empty share groups without share state
        return expired

    def _subscriptions(self, group_id: str, names: list[str]) -> tuple[bool, int, set[str]]:
        """(empty?, empty since (ms), the topics its members subscribe to) of any group."""
        classic = self.classic.groups.get(group_id)
        if classic is not None:
            subscribed: set[str] = set()
            for member in classic.members.values():
                metadata = member.metadata(classic.protocol_name or "")
                try:
                    subscribed.update(consumer_protocol.subscribed_topics(metadata))
                except KafkaError:  # not the consumer protocol's bytes: keep everything
                    subscribed.update(names)
            return not classic.members, classic.empty_since_ms, subscribed
        group = self.groups.get(group_id)
        if group is None:
            return True, -1, set()
        subscribed = set()
        for consumer in group.members.values():
            subscribed |= consumer.subscribed(names)
        return not group.members, group.empty_since_ms, subscribed

    def group_ids(self) -> Iterator[str]:
        known = set(self.groups) | set(self.offsets) | set(self.classic.groups)
        yield from sorted(known | set(self.pending.open_by_group) | set(self.share.groups))

    def group_type(self, group_id: str) -> str:
        """Kafka's group types: a group only offsets name (a consumer that assigns itself and
        commits) is a classic group, as Kafka creates one on such a commit."""
        if group_id in self.share.groups:
            return "share"
        return "consumer" if group_id in self.groups else "classic"

    def protocol_type(self, group_id: str) -> str:
        """ListGroups' protocol type: the classic group's own ("" for an offsets-only one),
        "consumer" for a KIP-848 group, "share" for a share group."""
        classic = self.classic.groups.get(group_id)
        if classic is not None:
            return classic.protocol_type or ""
        kind = self.group_type(group_id)
        return "" if kind == "classic" else kind

    def group_state(self, group_id: str) -> str:
        share = self.share.groups.get(group_id)
        if share is not None:
            return share.state
        classic = self.classic.groups.get(group_id)
        if classic is not None:
            return classic.state.value
        group = self.groups.get(group_id)
        return "Empty" if group is None else group.state


# -- the pure pieces of a heartbeat ---------------------------------------------------------------
def _validate_heartbeat(request: gpb.ConsumerGroupHeartbeatRequest) -> None:
    if not request.group_id:
        raise KafkaError(ErrorCode.INVALID_GROUP_ID, "the group id must not be empty")
    epoch = request.member_epoch
    if epoch < LEAVE_STATIC_EPOCH:
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"member epoch {epoch} is not valid")
    if epoch == LEAVE_STATIC_EPOCH and not request.instance_id:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "member epoch -2 is a static member's leave")
    if epoch != 0 and not request.member_id:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "a member id is needed unless joining")
    if epoch == 0:
        names = request.subscribed_topic_names.names
        regex = request.subscribed_topic_regex if request.HasField("subscribed_topic_regex") else ""
        if not names and not regex:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST, "joining needs subscribed topic names or a regex"
            )
        if request.rebalance_timeout_ms <= 0:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "joining needs a rebalance timeout")
    if request.server_assignor and request.server_assignor not in assignor.ASSIGNORS:
        raise KafkaError(
            ErrorCode.UNSUPPORTED_ASSIGNOR,
            f"assignor {request.server_assignor!r} is not one of {sorted(assignor.ASSIGNORS)}",
        )
    if request.HasField("subscribed_topic_regex") and request.subscribed_topic_regex:
        try:
            re.compile(request.subscribed_topic_regex)
        except re.error as error:
            raise KafkaError(
                ErrorCode.INVALID_REGULAR_EXPRESSION,
                f"{request.subscribed_topic_regex!r}: {error}",
            ) from error


def _static_owner(group: Group | None, instance_id: str, member_id: str) -> Member:
    """Kafka's throwIfStaticMemberIsUnknown and throwIfInstanceIdIsFenced."""
    owner = None if group is None else group.static_member(instance_id)
    if owner is None:
        raise KafkaError(ErrorCode.UNKNOWN_MEMBER_ID, f"instance id {instance_id!r} is unknown")
    if owner.member_id != member_id:
        raise KafkaError(
            ErrorCode.FENCED_INSTANCE_ID,
            f"member {member_id!r} with instance id {instance_id!r} was fenced by member "
            f"{owner.member_id!r}",
        )
    return owner


def _check_member_epoch(member: Member, epoch: int, owned: Set[TopicPartition] | None) -> None:
    """Kafka's ``throwIfConsumerGroupMemberEpochIsInvalid``."""
    if epoch > member.member_epoch:
        raise KafkaError(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"member epoch {epoch} is ahead of the coordinator's {member.member_epoch}: "
            "give up every partition and rejoin",
        )
    if epoch < member.member_epoch and (
        epoch != member.previous_member_epoch or owned is None or not owned <= member.assigned
    ):
        raise KafkaError(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"member epoch {epoch} is behind the coordinator's {member.member_epoch}: "
            "give up every partition and rejoin",
        )


def _with_subscription(member: Member, request: gpb.ConsumerGroupHeartbeatRequest) -> Member:
    updated = member
    if request.HasField("subscribed_topic_names"):
        names = tuple(sorted(set(request.subscribed_topic_names.names)))
        updated = replace(updated, subscribed_topic_names=names)
    if request.HasField("subscribed_topic_regex"):
        updated = replace(updated, subscribed_topic_regex=request.subscribed_topic_regex)
    if request.rebalance_timeout_ms > 0:
        updated = replace(updated, rebalance_timeout_ms=request.rebalance_timeout_ms)
    if request.client_id:
        updated = replace(updated, client_id=request.client_id)
    if request.server_assignor:
        updated = replace(updated, server_assignor=request.server_assignor)
    return updated


def _subscribed_counts(members: Iterable[Member], topics: TopicsView) -> dict[str, int]:
    names = list(topics.names())
    counts: dict[str, int] = {}
    for member in members:
        for topic in member.subscribed(names):
            count = topics.count(topic)
            if count is not None:
                counts[topic] = count
    return counts


def reconcile(
    member: Member,
    target_epoch: int,
    target: frozenset[TopicPartition],
    owned: Set[TopicPartition] | None,
    owners: Mapping[TopicPartition, str],
) -> Member:
    """Kafka's ``CurrentAssignmentBuilder``: move ``member`` one step towards ``target``.
    ``owned`` is what the member reported (None = not reported: assumed unchanged)."""

    def still_owns(partitions: frozenset[TopicPartition]) -> bool:
        return owned is None or bool(partitions & owned)

    if member.state is MemberState.STABLE:
        if member.member_epoch == target_epoch:
            return member
        return _next_assignment(
            member, member.member_epoch, target_epoch, target, owners, still_owns
        )
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        if still_owns(member.pending_revocation):
            return member
        return _next_assignment(
            member, member.member_epoch + 1, target_epoch, target, owners, still_owns
        )
    return _next_assignment(member, member.member_epoch, target_epoch, target, owners, still_owns)


def _next_assignment(
    member: Member,
    epoch: int,
    target_epoch: int,
    target: frozenset[TopicPartition],
    owners: Mapping[TopicPartition, str],
    still_owns: Callable[[frozenset[TopicPartition]], bool],
) -> Member:
    kept = member.assigned & target
    revoke = member.assigned - kept
    wanted = target - kept
    free = frozenset(tp for tp in wanted if owners.get(tp, member.member_id) == member.member_id)
    unreleased = bool(wanted - free)
    if revoke and still_owns(revoke):
        return _moved(member, epoch, MemberState.UNREVOKED_PARTITIONS, kept, revoke)
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return _moved(member, target_epoch, state, kept | free, frozenset())


def _moved(
    member: Member,
    epoch: int,
    state: MemberState,
    assigned: frozenset[TopicPartition],
    pending: frozenset[TopicPartition],
) -> Member:
    previous = member.member_epoch if epoch != member.member_epoch else member.previous_member_epoch
    return replace(
        member, member_epoch=epoch, previous_member_epoch=previous, state=state,
        assigned=assigned, pending_revocation=pending,
    )  # fmt: skip
