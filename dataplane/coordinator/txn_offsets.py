"""Offsets committed inside transactions (KIP-98, KIP-447): pure state, pending until the marker.

A TxnOffsetCommit writes its offsets to the group's ``__consumer_offsets`` partition as a
*transactional batch* of the producer (its id and epoch in the batch header), as Kafka does. Until
the transaction's marker reaches that partition the offsets are *pending*: OffsetFetch does not
show them (with ``require_stable`` a partition that has any answers UNSTABLE_OFFSET_COMMIT), they
do not expire, and the group is not deleted by expiry. A commit marker makes each pending offset
the committed one unless a plain commit was written *later in the log* (Kafka keeps the most
recent record, comparing record offsets; here the position of the record in the replay, which
orders the same way); an abort marker drops them. A tombstone of a partition's offset (DeleteGroups,
a deleted topic) removes the pending offsets of that partition too, and the group's transactions
stay open until their markers, as in Kafka's ``OffsetMetadataManager``.

:class:`PendingOffsets` is Kafka's ``pendingTransactionalOffsets`` with
``openTransactionsByGroup``; :func:`validate_txn_commit` is the group check of a TxnOffsetCommit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

from dataplane.coordinator import classic_group as cg
from raftlog.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from dataplane.coordinator.group_state import Group

TopicPartition = tuple[str, int]
V = TypeVar("V")


class PendingOffsets(Generic[V]):
    """The offsets of each producer's open transaction, by group and partition."""

    def __init__(self) -> None:
        self.by_producer: dict[int, dict[str, dict[TopicPartition, V]]] = {}
        # A group's transactions stay open until their markers, even when a tombstone took
        # their offsets: the producers that wrote offsets of each group, and the reverse.
        self.open_by_group: dict[str, set[int]] = {}
        self._groups_by_producer: dict[int, set[str]] = {}

    def put(self, producer_id: int, group_id: str, tp: TopicPartition, value: V) -> None:
        self.by_producer.setdefault(producer_id, {}).setdefault(group_id, {})[tp] = value
        self.open_by_group.setdefault(group_id, set()).add(producer_id)
        self._groups_by_producer.setdefault(producer_id, set()).add(group_id)

    def drop_partition(self, group_id: str, tp: TopicPartition) -> None:
        """A tombstone of the group's offset of ``tp``: no open transaction commits it."""
        for producer_id in self.open_by_group.get(group_id, ()):
            offsets = self.by_producer.get(producer_id, {}).get(group_id)
            if offsets is not None:
                offsets.pop(tp, None)

    def end(self, producer_id: int) -> dict[str, dict[TopicPartition, V]]:
        """The producer's marker: its transaction's offsets, now no longer pending."""
        for group_id in self._groups_by_producer.pop(producer_id, set()):
            producers = self.open_by_group.get(group_id)
            if producers is not None:
                producers.discard(producer_id)
                if not producers:
                    del self.open_by_group[group_id]
        return self.by_producer.pop(producer_id, {})

    def has_open(self, group_id: str) -> bool:
        """Does a transaction that wrote offsets of the group wait for its marker?"""
        return group_id in self.open_by_group

    def partitions(self, group_id: str) -> set[TopicPartition]:
        """The partitions of the group with a pending offset."""
        found: set[TopicPartition] = set()
        for producer_id in self.open_by_group.get(group_id, ()):
            found.update(self.by_producer.get(producer_id, {}).get(group_id, {}))
        return found


def validate_txn_commit(
    group_id: str,
    generation_id: int,
    member_id: str,
    instance_id: str | None,
    *,
    consumer: Group | None,
    classic: cg.ClassicGroup | None,
    known: bool,
) -> None:
    """Kafka's ``validateTransactionalOffsetCommit``. ``generation_id`` < 0: the producer sent
    no group metadata (KIP-447), and a group without members (or none at all: a "simple"
    group, created by the commit) takes it. Otherwise the member must be in the group at that
    generation (member epoch): UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID, ILLEGAL_GENERATION.
    ``known``: the group exists only through its offsets (an empty group without a protocol)."""
    if not group_id:
        raise KafkaError(ErrorCode.INVALID_GROUP_ID, "the group id must not be empty")
    if consumer is None and classic is None:
        if known or generation_id < 0:
            classic = cg.ClassicGroup(group_id)  # Kafka's simple group: empty, generation 0
        else:
            raise KafkaError(
                ErrorCode.ILLEGAL_GENERATION,
                f"no group {group_id!r}, but the commit names generation {generation_id}",
            )
    if consumer is not None:
        _validate_consumer(consumer, generation_id, member_id)
    elif classic is not None:
        _validate_classic(classic, generation_id, member_id, instance_id)


def _validate_consumer(group: Group, generation_id: int, member_id: str) -> None:
    if generation_id < 0 and not group.members:
        return
    member = group.members.get(member_id)
    if member is None:
        raise KafkaError(
            ErrorCode.UNKNOWN_MEMBER_ID, f"member {member_id!r} is not in group {group.group_id!r}"
        )
    if generation_id != member.member_epoch:  # Kafka's STALE_MEMBER_EPOCH, as a TxnOffsetCommit
        raise KafkaError(
            ErrorCode.ILLEGAL_GENERATION,
            f"member {member_id!r} committed at epoch {generation_id}, its epoch is "
            f"{member.member_epoch}",
        )


def _validate_classic(
    group: cg.ClassicGroup, generation_id: int, member_id: str, instance_id: str | None
) -> None:
    if generation_id < 0 and group.state is cg.ClassicState.EMPTY:
        return
    if generation_id < 0 and not member_id and instance_id is None:
        return  # no group metadata: a transactional commit does not need the group empty
    if instance_id is not None:
        owner = group.instance_owner(instance_id)
        if owner is None:
            raise KafkaError(
                ErrorCode.UNKNOWN_MEMBER_ID, f"no static member {instance_id!r} in the group"
            )
        if owner.member_id != member_id:
            raise KafkaError(
                ErrorCode.FENCED_INSTANCE_ID,
                f"instance {instance_id!r} is member {owner.member_id!r}, not {member_id!r}",
            )
    if member_id not in group.members:
        raise KafkaError(
            ErrorCode.UNKNOWN_MEMBER_ID, f"member {member_id!r} is not in group {group.group_id!r}"
        )
    if generation_id != group.generation:
        raise KafkaError(
            ErrorCode.ILLEGAL_GENERATION,
            f"generation {generation_id}, the group is at generation {group.generation}",
        )
