"""A consumer group's lag per partition, as Kafka's ``kafka-consumer-groups --describe``
computes it: the committed offset, the end of the log (the high watermark, or the last stable
offset for ``read_committed``, the end a read_committed member can read up to) and their
difference, never below zero, with the member that owns the partition.

``raftlog group describe`` and the web console both read it here, so the lag one shows is the
lag the other prints. It reads only through the admin client (group description and committed
offsets) and a consumer (ends), as Kafka's tool reads through its Admin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from dataplane.client._types import TopicPartition
from dataplane.client.admin import AdminClient, GroupDescription, MemberDescription
from dataplane.client.consumer import Consumer
from metadata_quorum.security.channels import ClientSecurity

__all__ = ["GroupLag", "LagRow", "describe_group_lag", "lag_rows"]

IsolationLevel = Literal["read_uncommitted", "read_committed"]


@dataclass(frozen=True)
class LagRow:
    """One partition and one member holding it (a share group's members share partitions);
    None where there is no committed offset, no known end or no owner."""

    topic: str
    partition: int
    current_offset: int | None
    log_end_offset: int | None
    lag: int | None
    member_id: str | None
    client_id: str | None


@dataclass(frozen=True)
class GroupLag:
    description: GroupDescription
    isolation_level: IsolationLevel
    rows: tuple[LagRow, ...]


def lag_rows(
    description: GroupDescription,
    committed: dict[TopicPartition, int],
    ends: dict[TopicPartition, int],
) -> list[LagRow]:
    """The rows of a group, sorted by partition: every partition it committed an offset for
    or a member owns."""
    owners: dict[TopicPartition, list[MemberDescription]] = {}
    for m in description.members:
        for tp in m.assignment:
            owners.setdefault(tp, []).append(m)
    partitions = sorted(set(committed) | set(owners))
    rows = []
    for tp in partitions:
        members: Sequence[MemberDescription | None] = owners.get(tp) or [None]
        for member in members:
            offset, end = committed.get(tp), ends.get(tp)
            rows.append(
                LagRow(
                    tp.topic, tp.partition, offset, end,
                    None if offset is None or end is None else max(0, end - offset),
                    None if member is None else member.member_id,
                    None if member is None else member.client_id,
                )
            )  # fmt: skip
    return rows


def describe_group_lag(
    admin: AdminClient,
    bootstrap_servers: str | Sequence[str],
    group: str,
    isolation_level: IsolationLevel = "read_uncommitted",
    security: ClientSecurity | None = None,
) -> GroupLag:
    """The group's description and lag rows. Raises the admin client's KafkaError (an
    unknown group is GROUP_ID_NOT_FOUND)."""
    description = admin.describe_groups([group])[group]
    committed = (
        {}  # a share group commits no offsets: its progress is in __share_group_state
        if description.group_type == "share"
        else {tp: o.offset for tp, o in admin.list_group_offsets(group).items()}
    )
    owned = {tp for m in description.members for tp in m.assignment}
    with Consumer(
        bootstrap_servers, isolation_level=isolation_level, security=security
    ) as consumer:
        ends = consumer.end_offsets(sorted(set(committed) | owned))
    rows = lag_rows(description, committed, ends)
    return GroupLag(description, isolation_level, tuple(rows))
