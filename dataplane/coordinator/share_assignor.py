"""The share-group assignor ("simple", KIP-932): a pure function of the members'
subscriptions, the partition counts and the current target assignment.

Unlike a consumer group's assignment, a share group's is not exclusive: records are handed out
one by one by the partition leaders, so several members may hold the same partition. Kafka's
``SimpleAssignor`` (its homogeneous and heterogeneous assignment builders) is followed:

* **Every partition is assigned**, to ``ceil(members / partitions)`` members (the *desired
  sharing*): with more members than partitions the partitions are shared (three members and one
  partition: all three hold it), with fewer each partition has one member.
* **Balance**: member ``i`` (in member-id order) wants ``ceil(s*P*(i+1)/M) - ceil(s*P*i/M)``
  partitions (``s`` the sharing, ``P`` partitions, ``M`` members), so member loads differ by at
  most one and add up to ``s*P``.
* **Stickiness**: a member keeps what it holds unless it holds more than it wants or a partition
  is shared more than desired; only then does anything move, and new assignments go to members
  below their share, round robin.

When members subscribe to different topics (heterogeneous) each topic is balanced on its own
among the members subscribing to it. Kafka walks Java hash maps; this walks member ids and
partitions in sorted order, so the result is deterministic (between equally balanced answers
the member that gets a partition may differ from Kafka's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

NAME = "simple"  # Kafka's SimpleAssignor.name(): shown by ShareGroupDescribe

TopicPartition = tuple[str, int]


def assign(
    subscriptions: Mapping[str, Set[str]],
    partition_counts: Mapping[str, int],
    current: Mapping[str, frozenset[TopicPartition]],
) -> dict[str, frozenset[TopicPartition]]:
    """The new target assignment of every member (members without partitions included).

    ``subscriptions``: member id -> the topics it subscribes to; topics missing from
    ``partition_counts`` (not created yet) are ignored. ``current``: the previous target."""
    members = sorted(subscriptions)
    result: dict[str, set[TopicPartition]] = {m: set() for m in members}
    topic_sets = {frozenset(t for t in subscriptions[m] if t in partition_counts) for m in members}
    groups: list[tuple[list[str], list[str]]]
    if len(topic_sets) == 1:
        groups = [(members, sorted(next(iter(topic_sets))))]
    else:
        by_topic: dict[str, list[str]] = {}
        for member in members:
            for topic in subscriptions[member]:
                if topic in partition_counts:
                    by_topic.setdefault(topic, []).append(member)
        groups = [(holders, [topic]) for topic, holders in sorted(by_topic.items())]
    for holders, topics in groups:
        partitions = [(t, p) for t in topics for p in range(partition_counts[t])]
        wanted = set(partitions)
        held = {m: current.get(m, frozenset()) & wanted for m in holders}
        for member, assigned in balanced(holders, partitions, held).items():
            result[member] |= assigned
    return {m: frozenset(tps) for m, tps in result.items()}


def desired_counts(members: int, partitions: int) -> tuple[int, list[int]]:
    """(desired sharing, desired partition count of each member in order)."""
    if members == 0 or partitions == 0:
        return 0, [0] * members
    sharing = -(-members // partitions)
    total = sharing * partitions
    ceil = [-(-(total * i) // members) for i in range(members + 1)]
    return sharing, [ceil[i + 1] - ceil[i] for i in range(members)]


def balanced(
    members: Sequence[str],
    partitions: Sequence[TopicPartition],
    held: Mapping[str, frozenset[TopicPartition]],
) -> dict[str, set[TopicPartition]]:
    """Kafka's ``SimpleHomogeneousAssignmentBuilder`` over one set of partitions: revoke from
    members over their share and from partitions shared too widely, then fill members below
    their share, round robin, partition by partition."""
    sharing, wanted = desired_counts(len(members), len(partitions))
    desired = dict(zip(members, wanted, strict=True))
    final: dict[str, set[TopicPartition]] = {m: set(held.get(m, ())) for m in members}
    for member in members:  # members holding more than their share give up the extra ones
        extra = len(final[member]) - desired[member]
        for tp in sorted(final[member], reverse=True)[: max(extra, 0)]:
            final[member].discard(tp)
    holders: dict[TopicPartition, list[str]] = {tp: [] for tp in partitions}
    for member in members:
        for tp in sorted(final[member]):
            holders[tp].append(member)
    for tp in partitions:  # partitions shared by more members than desired lose some
        while len(holders[tp]) > sharing:
            # the most loaded holder lets go first (ties: the last in member order)
            member = max(reversed(holders[tp]), key=lambda m: len(final[m]))
            holders[tp].remove(member)
            final[member].discard(tp)
    unfilled = [m for m in members if len(final[m]) < desired[m]]
    for tp in partitions:
        while len(holders[tp]) < sharing:
            taker = next((m for m in unfilled if m not in holders[tp]), None)
            if taker is None:
                break  # every member below its share holds it already: a slight imbalance
            final[taker].add(tp)
            holders[tp].append(taker)
            unfilled.remove(taker)
            if len(final[taker]) < desired[taker]:
                unfilled.append(taker)  # round robin: to the back of the queue
    return final
