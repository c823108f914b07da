"""Partition reassignment (KIP-455), as pure functions over the image.

A reassignment gives a partition a target replica list. The controller records it at once
(``adding_replicas`` / ``removing_replicas`` on the partition, ``replicas`` = the target followed
by the replicas leaving), so it survives a controller failover: it is in the log. The brokers
named in ``adding_replicas`` start following the leader; the leader adds each to the ISR once it
has caught up (AlterPartition). When every target replica is in the ISR the reassignment
completes in one record: ``replicas`` becomes the target, the leaving replicas drop out of the
ISR, leadership moves to the first target replica in the ISR if the leader is leaving, and the
brokers that no longer host the partition delete their logs. Cancelling reverts to the original
replicas.

As in Kafka's ``PartitionReassignmentReplicas`` and ``PartitionChangeBuilder``:
- a new target for a partition already being moved replaces the old target, computed against the
  original replicas (never against a half-finished move);
- a target equal to the current replicas of a partition that is not moving is a no-op;
- the leader is kept while it stays in the target; elections prefer target replicas in order.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from metadata_quorum.image import MetadataImage, PartitionRegistration
from metadata_quorum.placement import check_assignment, elect
from metadata_quorum.records import NO_LEADER, PartitionChange
from metadata_quorum.replication import (
    Generated,
    ItemResult,
    check_not_cordoned,
    complete_reassignment,
    eligible_within,
    partition_change,
)
from raftlog.errors import ErrorCode, KafkaError


@dataclass(frozen=True)
class ReassignRequest:
    """One partition's new target replicas; ``None`` cancels its reassignment."""

    topic: str
    partition: int
    target: tuple[int, ...] | None


@dataclass(frozen=True)
class OngoingReassignment:
    """A partition being moved, as ListPartitionReassignments reports it."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]


def generate_alter_reassignments(
    image: MetadataImage, items: Sequence[ReassignRequest], allow_replication_factor_change: bool
) -> Generated:
    """AlterPartitionReassignments: the records that start, replace or cancel each move, and one
    result per item. Invalid items change nothing and answer with Kafka's error code."""
    out = Generated()
    usable = image.usable_broker_ids()
    seen: set[tuple[str, int]] = set()
    for item in items:
        key = (item.topic, item.partition)
        topic = image.topic(item.topic)
        try:
            if key in seen:
                raise KafkaError(ErrorCode.INVALID_REQUEST, "the partition is listed twice")
            seen.add(key)
            current = None if topic is None else topic.partitions.get(item.partition)
            if topic is None or current is None:
                raise KafkaError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"no partition {item.partition} of topic {item.topic!r}",
                )
            change: PartitionChange | None
            if item.target is None:
                change = cancel(topic.topic_id, item.partition, current, usable)
            else:
                target = _check_target(image, item, current, allow_replication_factor_change)
                change = reassign(topic.topic_id, item.partition, current, target, usable)
        except KafkaError as error:
            out.results.append(
                ItemResult(item.topic, error.error, error.message, partition=item.partition)
            )
            continue
        if change is not None:
            out.records.append(change)
        out.results.append(
            ItemResult(item.topic, topic_id=topic.topic_id, partition=item.partition)
        )
    return out


def _check_target(
    image: MetadataImage,
    item: ReassignRequest,
    current: PartitionRegistration,
    allow_replication_factor_change: bool,
) -> tuple[int, ...]:
    assert item.target is not None
    target = check_assignment(item.target, image.brokers.keys(), item.partition)
    # A fenced broker cannot take a new replica; one that holds the partition already may stay
    # in the target (a broker restarting, still catching up with the metadata, must not block
    # a move of the other replicas).
    fenced = [b for b in target if image.brokers[b].fenced and b not in current.replicas]
    if fenced:
        raise KafkaError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"partition {item.partition} would add fenced brokers {fenced}",
        )
    check_not_cordoned(image, [b for b in target if b not in current.replicas], item.partition)
    original = current.original_replicas
    if not allow_replication_factor_change and len(target) != len(original):
        raise KafkaError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"partition {item.partition} has {len(original)} replicas, the target "
            f"{list(target)} has {len(target)}",
        )
    return target


def reassign(
    topic_id: uuid.UUID,
    partition_id: int,
    current: PartitionRegistration,
    target: tuple[int, ...],
    usable: Collection[int],
) -> PartitionChange | None:
    """The record that moves ``current`` towards ``target`` (None: nothing to do)."""
    original = current.original_replicas
    if not current.reassigning and target == current.replicas:
        return None
    adding = tuple(b for b in target if b not in original)
    removing = tuple(b for b in original if b not in target)
    replicas = target + removing
    isr = tuple(b for b in current.isr if b in replicas)
    if current.isr and not isr:
        raise KafkaError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"partition {partition_id}: the target {list(target)} drops every in-sync replica "
            f"{list(current.isr)}",
        )
    leader = current.leader
    if leader not in isr:  # it was being added and the new target drops it
        leader = elect(replicas, isr, NO_LEADER, usable, unclean_allowed=False).leader
    moving = PartitionRegistration(
        replicas, isr, leader, current.leader_epoch, current.partition_epoch, adding, removing,
        *eligible_within(current, replicas),
    )  # fmt: skip
    finished = complete_reassignment(moving, usable)
    if finished is not None:
        moving = finished
    return partition_change(topic_id, partition_id, current, moving)


def cancel(
    topic_id: uuid.UUID,
    partition_id: int,
    current: PartitionRegistration,
    usable: Collection[int],
) -> PartitionChange:
    """Back to the original replicas: the added ones leave, the ISR keeps its original members
    (or, if none is left, the last one, as an election keeps it), and a leader that was one of
    the added replicas gives way to the first original replica in the ISR."""
    if not current.reassigning:
        raise KafkaError(
            ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
            f"partition {partition_id} is not being reassigned",
        )
    replicas = current.original_replicas
    isr = tuple(b for b in current.isr if b in replicas)
    leader = current.leader if current.leader in isr else NO_LEADER
    if leader == NO_LEADER:
        election = elect(replicas, isr, NO_LEADER, usable, unclean_allowed=False)
        leader, isr = election.leader, election.isr or isr
    reverted = PartitionRegistration(
        replicas, isr, leader, current.leader_epoch, current.partition_epoch, (), (),
        *eligible_within(current, replicas),
    )  # fmt: skip
    return partition_change(topic_id, partition_id, current, reverted)


def list_reassignments(
    image: MetadataImage, wanted: Sequence[tuple[str, int]] | None
) -> list[OngoingReassignment]:
    """ListPartitionReassignments: every partition being moved, or those of ``wanted`` that are
    (partitions that are not moving, or do not exist, are left out, as Kafka does)."""
    found: list[OngoingReassignment] = []
    if wanted is None:
        keys = [
            (topic.name, p)
            for topic in sorted(image.topics.values(), key=lambda t: t.name)
            for p in sorted(topic.partitions)
        ]
    else:
        keys = list(wanted)
    for name, p in keys:
        topic = image.topic(name)
        current = None if topic is None else topic.partitions.get(p)
        if current is not None and current.reassigning:
            found.append(
                OngoingReassignment(
                    name, p, current.replicas, current.adding_replicas, current.removing_replicas
                )
            )
    return found
