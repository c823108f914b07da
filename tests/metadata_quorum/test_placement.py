"""Replica placement and leader election, table-driven."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from metadata_quorum.placement import (
    BrokerSlot,
    Election,
    check_assignment,
    elect,
    place_replicas,
    preferred_leader_counts,
    rack_alternated,
)
from metadata_quorum.records import NO_LEADER
from raftlog.errors import ErrorCode, KafkaError


def slots(racks: dict[int, str | None]) -> list[BrokerSlot]:
    return [BrokerSlot(broker_id, rack) for broker_id, rack in racks.items()]


NO_RACKS = {1: None, 2: None, 3: None}
THREE_RACKS_OF_TWO = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
TWO_RACKS_OF_THREE = {1: "a", 2: "a", 3: "a", 4: "b", 5: "b", 6: "b"}
UNEVEN_RACKS = {1: "a", 2: "a", 3: "a", 4: "b"}


@pytest.mark.parametrize(
    ("racks", "expected"),
    [
        ({}, []),
        (NO_RACKS, [1, 2, 3]),
        ({3: None, 1: None, 2: None}, [1, 2, 3]),
        (THREE_RACKS_OF_TWO, [1, 3, 5, 2, 4, 6]),
        (TWO_RACKS_OF_THREE, [1, 4, 2, 5, 3, 6]),
        (UNEVEN_RACKS, [1, 4, 2, 3]),
    ],
)
def test_rack_alternated(racks: dict[int, str | None], expected: list[int]) -> None:
    assert rack_alternated(slots(racks)) == expected


@pytest.mark.parametrize(
    ("racks", "rf", "racks_per_partition"),
    [
        (THREE_RACKS_OF_TWO, 3, 3),
        (THREE_RACKS_OF_TWO, 2, 2),
        (TWO_RACKS_OF_THREE, 3, 2),
        (TWO_RACKS_OF_THREE, 2, 2),
        (UNEVEN_RACKS, 2, 2),
        (UNEVEN_RACKS, 4, 2),
    ],
)
@pytest.mark.parametrize("partitions", [1, 6, 13])
def test_rack_aware(
    racks: dict[int, str | None], rf: int, racks_per_partition: int, partitions: int
) -> None:
    for replicas in place_replicas(slots(racks), partitions, rf, {}):
        assert len({racks[b] for b in replicas}) == racks_per_partition, replicas


@pytest.mark.parametrize(
    "rack_sizes", [(1, 1), (2, 1), (3, 1), (2, 2), (3, 2), (3, 3), (1, 1, 1), (2, 1, 1), (4, 2, 1)]
)
def test_every_partition_uses_as_many_racks_as_it_can(rack_sizes: tuple[int, ...]) -> None:
    racks: dict[int, str | None] = {}
    for rack, size in enumerate(rack_sizes):
        racks.update({len(racks) + n: f"rack-{rack}" for n in range(size)})
    for rf in range(1, len(racks) + 1):
        wanted = min(rf, len(rack_sizes))
        for first_partition in (0, 7):
            placed = place_replicas(slots(racks), 4 * len(racks), rf, {}, first_partition)
            for replicas in placed:
                assert len({racks[b] for b in replicas}) == wanted, (rf, replicas)


@pytest.mark.parametrize("brokers", range(1, 8))
@pytest.mark.parametrize("with_racks", [False, True])
def test_never_two_replicas_on_one_broker(brokers: int, with_racks: bool) -> None:
    racks = {b: ("ab"[b % 2] if with_racks else None) for b in range(brokers)}
    for rf in range(1, brokers + 1):
        for first_partition in (0, 5):
            placed = place_replicas(slots(racks), 3 * brokers, rf, {}, first_partition)
            assert len(placed) == 3 * brokers
            for replicas in placed:
                assert len(replicas) == rf and len(set(replicas)) == rf, replicas
                assert set(replicas) <= set(racks)


@pytest.mark.parametrize(
    ("racks", "partitions", "rf", "per_broker"),
    [
        (NO_RACKS, 6, 3, 2),
        (NO_RACKS, 3, 1, 1),
        (THREE_RACKS_OF_TWO, 6, 3, 1),
        (THREE_RACKS_OF_TWO, 12, 2, 2),
    ],
)
def test_preferred_leaders_spread_evenly(
    racks: dict[int, str | None], partitions: int, rf: int, per_broker: int
) -> None:
    placed = place_replicas(slots(racks), partitions, rf, {})
    assert preferred_leader_counts(placed) == dict.fromkeys(racks, per_broker)


@pytest.mark.parametrize(
    ("racks", "topics"),
    [
        (NO_RACKS, [2, 2, 2]),
        (NO_RACKS, [1, 1, 1, 3]),
        (NO_RACKS, [4, 5]),
        (THREE_RACKS_OF_TWO, [6, 3, 3]),
        (THREE_RACKS_OF_TWO, [4, 4, 4, 5]),
        (UNEVEN_RACKS, [3, 2, 3]),
    ],
)
def test_spread_stays_even_across_topics(racks: dict[int, str | None], topics: list[int]) -> None:
    """Each topic starts at the broker preferred by the fewest partitions so far."""
    everything: list[tuple[int, ...]] = []
    for partitions in topics:
        counts = preferred_leader_counts(everything)
        everything += place_replicas(slots(racks), partitions, 2, counts)
        spread = Counter({b: 0 for b in racks}) + preferred_leader_counts(everything)
        leaders = [spread.get(b, 0) for b in racks]
        assert max(leaders) - min(leaders) <= 1, (topics, spread)


@pytest.mark.parametrize(
    ("brokers", "rf", "message"),
    [
        (3, 4, "replication factor 4 is larger than the 3 available brokers"),
        (0, 1, "replication factor 1 is larger than the 0 available brokers"),
        (3, 0, "replication factor must be >= 1"),
        (3, -1, "replication factor must be >= 1"),
    ],
)
def test_bad_replication_factor(brokers: int, rf: int, message: str) -> None:
    with pytest.raises(KafkaError) as caught:
        place_replicas(slots({b: None for b in range(brokers)}), 1, rf, {})
    assert caught.value.error is ErrorCode.INVALID_REPLICATION_FACTOR
    assert caught.value.message == message


@pytest.mark.parametrize(
    ("replicas", "registered", "fault"),
    [
        ([1, 2], [1, 2, 3], None),
        ([], [1, 2, 3], "has no replicas"),
        ([1, 1], [1, 2, 3], "lists a broker twice"),
        ([1, 9], [1, 2, 3], "unregistered brokers [9]"),
    ],
)
def test_check_assignment(replicas: list[int], registered: list[int], fault: str | None) -> None:
    if fault is None:
        assert check_assignment(replicas, registered, 0) == tuple(replicas)
        return
    with pytest.raises(KafkaError) as caught:
        check_assignment(replicas, registered, 0)
    assert caught.value.error is ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert fault in caught.value.message


ELECTIONS: list[tuple[str, Sequence[int], Sequence[int], int, set[int], bool, bool, Election]] = [
    # name, replicas, isr, current leader, usable, unclean allowed, prefer replica order, result
    ("keep-live-leader", [1, 2, 3], [1, 2, 3], 2, {1, 2, 3}, False, False, Election(2, (1, 2, 3))),
    ("leader-fenced", [1, 2, 3], [1, 2, 3], 1, {2, 3}, False, False, Election(2, (2, 3))),
    # The next leader follows replica order, not ISR order; the ISR keeps its own order.
    ("replica-order", [1, 2, 3], [3, 2, 1], 1, {2, 3}, False, False, Election(2, (3, 2))),
    ("follower-fenced", [1, 2, 3], [1, 2, 3], 1, {1, 2}, False, False, Election(1, (1, 2))),
    ("preferred", [1, 2, 3], [2, 1, 3], 2, {1, 2, 3}, False, True, Election(1, (2, 1, 3))),
    (
        "preferred-not-in-isr",
        [1, 2, 3],
        [2, 3],
        2,
        {1, 2, 3},
        False,
        True,
        Election(2, (2, 3)),
    ),
    # No live ISR member: offline, and the ISR keeps its last member (never empty).
    ("offline", [1, 2, 3], [3], 3, {1, 2}, False, False, Election(NO_LEADER, (3,))),
    ("all-fenced", [1, 2, 3], [1, 2], 1, set(), False, False, Election(NO_LEADER, (2,))),
    ("all-fenced-unclean", [1, 2], [1], 1, set(), True, False, Election(NO_LEADER, (1,))),
    # Unclean: the first live replica in replica order, alone in a new ISR.
    ("unclean", [1, 2, 3], [1], 1, {2, 3}, True, False, Election(2, (2,), unclean=True)),
    # Unclean allowed but a live ISR member exists: a clean election wins.
    ("clean-first", [1, 2, 3], [1, 3], 1, {2, 3}, True, False, Election(3, (3,))),
    ("comes-back", [1, 2, 3], [3], NO_LEADER, {1, 2, 3}, False, False, Election(3, (3,))),
    (
        "no-leader-still",
        [1, 2, 3],
        [3],
        NO_LEADER,
        {1, 2},
        False,
        False,
        Election(NO_LEADER, (3,)),
    ),
]


@pytest.mark.parametrize(
    ("replicas", "isr", "leader", "usable", "unclean", "prefer", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in ELECTIONS],
)
def test_elect(
    replicas: Sequence[int],
    isr: Sequence[int],
    leader: int,
    usable: set[int],
    unclean: bool,
    prefer: bool,
    expected: Election,
) -> None:
    assert elect(replicas, isr, leader, usable, unclean, prefer) == expected
