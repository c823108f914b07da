"""Share groups (KIP-932): membership of the groups whose members consume partitions
cooperatively. Pure state, records in, records out, beside the consumer and classic groups of
a ``__consumer_offsets`` shard (:class:`~dataplane.coordinator.group_state.GroupShard` owns a
:class:`ShareGroups` and routes the share records to it).

What a share group coordinator does is only membership: which members there are, what they
subscribe to, and which partitions each may fetch from. The records themselves are handed out,
locked and acknowledged by the partition leaders (ShareFetch / ShareAcknowledge, see
:mod:`dataplane.coordinator.share_manager`); the coordinator does not tell them when a member
leaves: the member's share sessions close (or its record locks expire), as in Kafka.

Membership follows Kafka's ``GroupMetadataManager.shareGroupHeartbeat``:

* The client names itself (ShareGroupHeartbeat v1, Kafka 4.1: a UUID kept for the consumer's
  lifetime) and joins with epoch 0 and its subscribed topic names; a member coming back with
  epoch 0 under its id (its answer was lost, or it was fenced) is let back in and told its
  current assignment, where Kafka would answer FENCED_MEMBER_EPOCH to a client that can only
  rejoin the same way.
* The group epoch moves when a member joins or leaves, a subscription changes, or a subscribed
  topic's partition count changes; the target assignment (:mod:`share_assignor`, "simple") is
  recomputed when the group epoch passes the assignment epoch.
* There is no revocation protocol: a member whose epoch is behind the assignment epoch moves
  straight to it with its target partitions (Kafka's ``ShareGroupAssignmentBuilder``). A stale
  epoch is FENCED_MEMBER_EPOCH, except the member's previous epoch (its last answer was lost).
* States are Kafka's ``ShareGroupState``: Empty or Stable (Dead for a group that is not there).
* Session timeouts (``group.share.session.timeout.ms``) are runtime state, not records: after a
  load every member gets a fresh session, as the consumer groups do.

Each change is a record of ``__consumer_offsets`` (Kafka's ShareGroup* records), replayed at
once through the owner's ``emit`` so the state is always the replay of the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from dataplane.coordinator import share_assignor
from dataplane.coordinator.topic_partitions import (
    TopicPartition,
    from_topic_partitions,
    to_topic_partitions,
)
from protos import group_pb2 as gpb
from raftlog.errors import ErrorCode, KafkaError

RT = gpb.GroupRecordType
LEAVE_EPOCH = -1
RECORD_TYPES = frozenset(
    {
        RT.SHARE_GROUP_METADATA,
        RT.SHARE_GROUP_SUBSCRIPTION_METADATA,
        RT.SHARE_MEMBER_METADATA,
        RT.SHARE_TARGET_ASSIGNMENT_METADATA,
        RT.SHARE_TARGET_ASSIGNMENT_MEMBER,
        RT.SHARE_CURRENT_MEMBER_ASSIGNMENT,
        RT.SHARE_GROUP_STATE_PARTITION_METADATA,
    }
)


@dataclass(frozen=True)
class ShareLimits:
    session_timeout_ms: int = 45_000  # group.share.session.timeout.ms
    max_size: int = 200  # group.share.max.size


@dataclass(frozen=True)
class ShareMember:
    member_id: str
    client_id: str = ""
    client_host: str = ""
    rack_id: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    member_epoch: int = 0
    previous_member_epoch: int = -1
    assigned: frozenset[TopicPartition] = frozenset()


@dataclass
class ShareGroup:
    group_id: str
    epoch: int = 0
    partition_counts: dict[str, int] = field(default_factory=dict)  # what the target used
    assignment_epoch: int = 0
    target: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)
    members: dict[str, ShareMember] = field(default_factory=dict)
    # every partition ever assigned to a member: where the group may have share state in
    # __share_group_state (Kafka's ShareGroupStatePartitionMetadata), deleted with the group
    state_partitions: frozenset[TopicPartition] = frozenset()
    empty_since_ms: int = -1  # when its last member left (-1: it has members, or never had)

    @property
    def state(self) -> str:
        """Kafka's ShareGroupState names."""
        return "Stable" if self.members else "Empty"


@dataclass(frozen=True)
class ShareHeartbeatResult:
    member_id: str
    member_epoch: int
    assignment: frozenset[TopicPartition] | None  # None: unchanged, not sent (Kafka's null)


def record_key(kind: int, group_id: str, member_id: str = "") -> bytes:
    return gpb.GroupRecordKey(
        type=kind,  # type: ignore[arg-type]
        group_id=group_id,
        member_id=member_id,
    ).SerializeToString(deterministic=True)


def _validate(request: gpb.ShareGroupHeartbeatRequest) -> None:
    """Kafka's ``throwIfShareGroupHeartbeatRequestIsInvalid``."""
    if not request.member_id.strip():
        raise KafkaError(ErrorCode.INVALID_REQUEST, "MemberId can't be empty.")
    if not request.group_id.strip():
        raise KafkaError(ErrorCode.INVALID_GROUP_ID, "GroupId can't be empty.")
    if request.HasField("rack_id") and not request.rack_id.strip():
        raise KafkaError(ErrorCode.INVALID_REQUEST, "RackId can't be empty.")
    if request.member_epoch == 0:
        if not request.subscribed_topic_names.names:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST, "SubscribedTopicNames must be set in first request."
            )
    elif request.member_epoch < LEAVE_EPOCH:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "MemberEpoch is invalid.")


def _check_member_epoch(member: ShareMember, epoch: int) -> None:
    """Kafka's ``throwIfShareGroupMemberEpochIsInvalid``."""
    if epoch > member.member_epoch or (
        epoch < member.member_epoch and epoch != member.previous_member_epoch
    ):
        raise KafkaError(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"member epoch {epoch} is not the coordinator's {member.member_epoch}: rejoin",
        )


class ShareGroups:
    """The share groups of one ``__consumer_offsets`` shard."""

    def __init__(self, limits: ShareLimits, emit: Callable[[bytes, bytes | None], None]) -> None:
        self.limits = limits
        # a group's session timeout: its share.session.timeout.ms group config, if it has one
        # (set by the coordinator from the metadata image), else the broker's
        self.session_timeout_of: Callable[[str], int] = lambda _: limits.session_timeout_ms
        self._emit = emit
        self.groups: dict[str, ShareGroup] = {}
        self.session_deadlines: dict[tuple[str, str], int] = {}  # runtime only

    # -- records ---------------------------------------------------------------------------------
    def replay(self, key: gpb.GroupRecordKey, value: bytes | None) -> None:
        gid, mid = key.group_id, key.member_id
        if key.type == RT.SHARE_GROUP_METADATA and value is None:
            self.groups.pop(gid, None)
            return
        group = self.groups.get(gid)
        if group is None:
            if value is None:
                return  # a tombstone of something already gone
            group = self.groups[gid] = ShareGroup(gid)
        if key.type == RT.SHARE_GROUP_METADATA:
            assert value is not None
            stored = gpb.GroupMetadataValue.FromString(value)
            group.epoch, group.empty_since_ms = stored.epoch, stored.empty_since_ms
        elif key.type == RT.SHARE_GROUP_SUBSCRIPTION_METADATA:
            counts = gpb.SubscriptionMetadataValue.FromString(value or b"").partition_counts
            group.partition_counts = dict(counts)
        elif key.type == RT.SHARE_TARGET_ASSIGNMENT_METADATA:
            meta = gpb.TargetAssignmentMetadataValue.FromString(value or b"")
            group.assignment_epoch = meta.assignment_epoch
        elif key.type == RT.SHARE_TARGET_ASSIGNMENT_MEMBER:
            if value is None:
                group.target.pop(mid, None)
            else:
                parts = gpb.TargetAssignmentMemberValue.FromString(value).partitions
                group.target[mid] = from_topic_partitions(parts)
        elif key.type == RT.SHARE_MEMBER_METADATA:
            self._replay_member(group, mid, value)
        elif key.type == RT.SHARE_CURRENT_MEMBER_ASSIGNMENT:
            self._replay_assignment(group, mid, value)
        elif key.type == RT.SHARE_GROUP_STATE_PARTITION_METADATA:
            known = gpb.ShareGroupStatePartitionMetadataValue.FromString(value or b"")
            group.state_partitions = from_topic_partitions(known.initialized)
        else:
            raise AssertionError(f"not a share group record type: {key.type}")

    def _replay_member(self, group: ShareGroup, mid: str, value: bytes | None) -> None:
        if value is None:
            group.members.pop(mid, None)
            return
        meta = gpb.ShareMemberMetadataValue.FromString(value)
        group.members[mid] = replace(
            group.members.get(mid) or ShareMember(mid),
            client_id=meta.client_id,
            client_host=meta.client_host,
            rack_id=meta.rack_id,
            subscribed_topic_names=tuple(meta.subscribed_topic_names),
        )

    def _replay_assignment(self, group: ShareGroup, mid: str, value: bytes | None) -> None:
        current = group.members.get(mid)
        if value is None:
            if current is not None:
                group.members[mid] = replace(
                    current, member_epoch=0, previous_member_epoch=-1, assigned=frozenset()
                )
            return
        a = gpb.CurrentMemberAssignmentValue.FromString(value)
        group.members[mid] = replace(
            current or ShareMember(mid),
            member_epoch=a.member_epoch,
            previous_member_epoch=a.previous_member_epoch,
            assigned=from_topic_partitions(a.assigned),
        )

    def _emit_group_epoch(self, group: ShareGroup, epoch: int, empty_since_ms: int = -1) -> None:
        value = gpb.GroupMetadataValue(
            epoch=epoch, empty_since_ms=empty_since_ms
        ).SerializeToString()
        self._emit(record_key(RT.SHARE_GROUP_METADATA, group.group_id), value)

    def _emit_member(self, group: ShareGroup, member: ShareMember) -> None:
        value = gpb.ShareMemberMetadataValue(
            client_id=member.client_id,
            client_host=member.client_host,
            rack_id=member.rack_id,
            subscribed_topic_names=member.subscribed_topic_names,
        )
        key = record_key(RT.SHARE_MEMBER_METADATA, group.group_id, member.member_id)
        self._emit(key, value.SerializeToString())

    def _emit_assignment(self, group: ShareGroup, member: ShareMember) -> None:
        value = gpb.CurrentMemberAssignmentValue(
            member_epoch=member.member_epoch,
            previous_member_epoch=member.previous_member_epoch,
            assigned=to_topic_partitions(member.assigned),
        )
        key = record_key(RT.SHARE_CURRENT_MEMBER_ASSIGNMENT, group.group_id, member.member_id)
        self._emit(key, value.SerializeToString())

    def _emit_counts(self, group: ShareGroup, partition_counts: Mapping[str, int]) -> bool:
        """Record the subscribed topics' partition counts if they changed (then True)."""
        counts = _subscribed_counts(group.members.values(), partition_counts)
        if counts == group.partition_counts:
            return False
        value = gpb.SubscriptionMetadataValue(partition_counts=counts).SerializeToString()
        self._emit(record_key(RT.SHARE_GROUP_SUBSCRIPTION_METADATA, group.group_id), value)
        return True

    # -- heartbeat --------------------------------------------------------------------------------
    def heartbeat(
        self,
        request: gpb.ShareGroupHeartbeatRequest,
        partition_counts: Mapping[str, int],
        now_ms: int,
    ) -> ShareHeartbeatResult:
        """ShareGroupHeartbeat: join (epoch 0), heartbeat, or leave (epoch -1). The caller
        has checked that the group id names no consumer or classic group."""
        _validate(request)
        gid, mid, epoch = request.group_id, request.member_id, request.member_epoch
        group = self.groups.get(gid)
        if epoch == LEAVE_EPOCH:
            if group is None:
                raise KafkaError(ErrorCode.GROUP_ID_NOT_FOUND, f"no share group {gid!r}")
            if mid not in group.members:
                raise KafkaError(ErrorCode.UNKNOWN_MEMBER_ID, f"{mid!r} is not in {gid!r}")
            self._fence(group, mid, partition_counts, now_ms)
            return ShareHeartbeatResult(mid, LEAVE_EPOCH, None)
        member = self._member(group, request)
        if group is None:
            group = ShareGroup(gid)  # recorded by the records below
        updated = replace(member, client_id=request.client_id, client_host=request.client_host)
        if request.HasField("rack_id"):
            updated = replace(updated, rack_id=request.rack_id)
        if request.HasField("subscribed_topic_names"):
            names = tuple(sorted(set(request.subscribed_topic_names.names)))
            updated = replace(updated, subscribed_topic_names=names)
        joined = mid not in group.members
        if joined or updated != member:
            self._emit_member(group, updated)
            group = self.groups[gid]
        bump = updated.subscribed_topic_names != member.subscribed_topic_names
        bump = self._emit_counts(group, partition_counts) or bump
        if bump:
            self._emit_group_epoch(group, group.epoch + 1)
        if group.epoch > group.assignment_epoch:
            self._compute_target(group)
        before = group.members[mid]
        after = before
        if before.member_epoch != group.assignment_epoch:
            after = replace(
                before,
                member_epoch=group.assignment_epoch,
                previous_member_epoch=before.member_epoch,
                assigned=group.target.get(mid, frozenset()),
            )
            self._emit_assignment(group, after)
        self.session_deadlines[(gid, mid)] = now_ms + self.session_timeout_of(gid)
        changed = epoch == 0 or after.assigned != member.assigned
        return ShareHeartbeatResult(mid, after.member_epoch, after.assigned if changed else None)

    def _member(
        self, group: ShareGroup | None, request: gpb.ShareGroupHeartbeatRequest
    ) -> ShareMember:
        """The member as the coordinator knows it (a new one when joining)."""
        gid, mid, epoch = request.group_id, request.member_id, request.member_epoch
        known = None if group is None else group.members.get(mid)
        if epoch != 0:
            if known is None:
                raise KafkaError(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"member {mid!r} is not in share group {gid!r}: rejoin with epoch 0",
                )
            _check_member_epoch(known, epoch)
            return known
        if known is not None:
            # Back with epoch 0 under its id (its answer was lost, or it was fenced and
            # rejoins, as Kafka 4.1's clients do): it gets its current assignment again.
            return known
        size = 0 if group is None else len(group.members)
        if size >= self.limits.max_size:
            raise KafkaError(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"share group {gid!r} has reached its maximum capacity of "
                f"{self.limits.max_size} members (group.share.max.size)",
            )
        return ShareMember(mid)

    def _compute_target(self, group: ShareGroup) -> None:
        subscriptions = {m.member_id: set(m.subscribed_topic_names) for m in group.members.values()}
        target = share_assignor.assign(subscriptions, group.partition_counts, group.target)
        gid = group.group_id
        for member_id in sorted(set(group.target) - set(target)):
            self._emit(record_key(RT.SHARE_TARGET_ASSIGNMENT_MEMBER, gid, member_id), None)
        for member_id, partitions in sorted(target.items()):
            if group.target.get(member_id) != partitions:
                value = gpb.TargetAssignmentMemberValue(partitions=to_topic_partitions(partitions))
                key = record_key(RT.SHARE_TARGET_ASSIGNMENT_MEMBER, gid, member_id)
                self._emit(key, value.SerializeToString())
        meta = gpb.TargetAssignmentMetadataValue(assignment_epoch=group.epoch)
        self._emit(record_key(RT.SHARE_TARGET_ASSIGNMENT_METADATA, gid), meta.SerializeToString())
        assigned = frozenset(tp for partitions in target.values() for tp in partitions)
        if not assigned <= group.state_partitions:
            # recorded before any member is told (so before any leader initializes the state)
            known = gpb.ShareGroupStatePartitionMetadataValue(
                initialized=to_topic_partitions(group.state_partitions | assigned)
            )
            key = record_key(RT.SHARE_GROUP_STATE_PARTITION_METADATA, gid)
            self._emit(key, known.SerializeToString())

    def _fence(
        self, group: ShareGroup, member_id: str, partition_counts: Mapping[str, int], now_ms: int
    ) -> None:
        """Kafka's ``shareGroupFenceMember``: the member's records go, the group epoch moves
        (the others get their new assignment on their next heartbeat); the last member gone,
        the group records since when it is empty (see :meth:`expire_empty`)."""
        gid = group.group_id
        self._emit(record_key(RT.SHARE_CURRENT_MEMBER_ASSIGNMENT, gid, member_id), None)
        if member_id in group.target:
            self._emit(record_key(RT.SHARE_TARGET_ASSIGNMENT_MEMBER, gid, member_id), None)
        self._emit(record_key(RT.SHARE_MEMBER_METADATA, gid, member_id), None)
        self._emit_counts(group, partition_counts)
        self._emit_group_epoch(group, group.epoch + 1, -1 if group.members else now_ms)
        self.session_deadlines.pop((gid, member_id), None)

    # -- timers -----------------------------------------------------------------------------------
    def expire(self, now_ms: int, partition_counts: Mapping[str, int]) -> list[tuple[str, str]]:
        """Fence the members whose session ran out: (group, member) of each."""
        removed: list[tuple[str, str]] = []
        for (gid, mid), deadline in sorted(self.session_deadlines.items()):
            group = self.groups.get(gid)
            if deadline > now_ms:
                continue
            if group is None or mid not in group.members:
                self.session_deadlines.pop((gid, mid), None)
                continue
            self._fence(group, mid, partition_counts, now_ms)
            removed.append((gid, mid))
        return removed

    def start_sessions(self, now_ms: int) -> None:
        """After a load: every member gets a full session to find the new coordinator."""
        self.session_deadlines = {
            (g.group_id, m): now_ms + self.session_timeout_of(g.group_id)
            for g in self.groups.values()
            for m in g.members
        }

    def expire_empty(self, now_ms: int, retention_ms: int) -> list[str]:
        """Kafka's cleanup of empty groups (``offsets.retention.minutes`` after the last member
        left): an empty share group whose members were never assigned a partition (so it has no
        share state) is deleted. One with share state stays until DeleteGroups, which deletes
        that state at the share coordinators first. The ids of the groups deleted."""
        gone = [
            g.group_id
            for g in self.groups.values()
            if not g.members
            and not g.state_partitions
            and g.empty_since_ms >= 0
            and now_ms - g.empty_since_ms >= retention_ms
        ]
        for group_id in sorted(gone):
            self.delete(group_id)
        return gone

    # -- deletion ---------------------------------------------------------------------------------
    def deletable(self, group_id: str) -> frozenset[TopicPartition]:
        """DeleteGroups of a share group, first step: the partitions whose share state goes
        (DeleteShareGroupState, before the group's records); only an empty group
        (NON_EMPTY_GROUP)."""
        group = self.groups[group_id]
        if group.members:
            raise KafkaError(
                ErrorCode.NON_EMPTY_GROUP,
                f"share group {group_id!r} has {len(group.members)} members; stop them first",
            )
        return group.state_partitions

    def delete(self, group_id: str) -> None:
        """DeleteGroups of a share group: only an empty one (NON_EMPTY_GROUP)."""
        group = self.groups[group_id]
        self.deletable(group_id)
        if group.state_partitions:
            self._emit(record_key(RT.SHARE_GROUP_STATE_PARTITION_METADATA, group_id), None)
        for member_id in sorted(group.target):
            self._emit(record_key(RT.SHARE_TARGET_ASSIGNMENT_MEMBER, group_id, member_id), None)
        self._emit(record_key(RT.SHARE_TARGET_ASSIGNMENT_METADATA, group_id), None)
        self._emit(record_key(RT.SHARE_GROUP_SUBSCRIPTION_METADATA, group_id), None)
        self._emit(record_key(RT.SHARE_GROUP_METADATA, group_id), None)


def _subscribed_counts(
    members: Iterable[ShareMember], partition_counts: Mapping[str, int]
) -> dict[str, int]:
    counts: dict[str, int] = {}
    for member in members:
        for topic in member.subscribed_topic_names:
            count = partition_counts.get(topic)
            if count is not None:
                counts[topic] = count
    return counts
