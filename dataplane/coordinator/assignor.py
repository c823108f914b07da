"""The group coordinator's server-side assignor ("uniform", KIP-848's default): balanced and sticky.

Pure: members' subscriptions, the partition counts of their topics and the previous target
assignment in, the new target assignment out. Each partition a member subscribes to goes to
exactly one subscribing member. Stickiness first: a member keeps the partitions it had that it
still subscribes to and that still exist. Then the unassigned partitions go one by one to the
eligible member with the fewest, and finally partitions move from a member to an eligible member
with at least two fewer until no such move is left. With identical subscriptions this leaves
every member within one partition of every other, having moved only partitions of members above
their share; with differing subscriptions it is as balanced as those moves can make it (every
move lowers the sum of squared counts, so the loop ends).
"""

from __future__ import annotations

from collections.abc import Mapping, Set

TopicPartition = tuple[str, int]
UNIFORM = "uniform"
ASSIGNORS = frozenset({UNIFORM})


def assign(
    subscriptions: Mapping[str, Set[str]],
    partition_counts: Mapping[str, int],
    previous: Mapping[str, Set[TopicPartition]],
) -> dict[str, frozenset[TopicPartition]]:
    """The target assignment of ``subscriptions`` (member -> topics) over ``partition_counts``
    (topic -> partitions; a subscribed topic missing here does not exist yet)."""
    members = sorted(subscriptions)
    owned: dict[str, set[TopicPartition]] = {m: set() for m in members}
    taken: set[TopicPartition] = set()
    for member in members:
        topics = subscriptions[member]
        for tp in sorted(previous.get(member, ())):
            topic, partition = tp
            if topic in topics and partition < partition_counts.get(topic, 0) and tp not in taken:
                owned[member].add(tp)
                taken.add(tp)
    eligible: dict[str, list[str]] = {}
    for member in members:
        for topic in subscriptions[member]:
            if topic in partition_counts:
                eligible.setdefault(topic, []).append(member)
    for topic in sorted(eligible):
        for partition in range(partition_counts[topic]):
            if (topic, partition) not in taken:
                member = min(eligible[topic], key=lambda m: (len(owned[m]), m))
                owned[member].add((topic, partition))
    _balance(owned, eligible)
    return {m: frozenset(tps) for m, tps in owned.items()}


def _balance(owned: dict[str, set[TopicPartition]], eligible: Mapping[str, list[str]]) -> None:
    moved = True
    while moved:
        moved = False
        for giver in sorted(owned, key=lambda m: (-len(owned[m]), m)):
            for tp in sorted(owned[giver], reverse=True):
                taker = min(eligible[tp[0]], key=lambda m: (len(owned[m]), m))
                if len(owned[giver]) - len(owned[taker]) >= 2:
                    owned[giver].remove(tp)
                    owned[taker].add(tp)
                    moved = True
            if moved:
                break
