"""The share groups' "simple" assignor: every partition assigned, shared when members outnumber
partitions, balanced, sticky."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataplane.coordinator import share_assignor as sa

TP = tuple[str, int]


def _loads(assignment: dict[str, frozenset[TP]]) -> list[int]:
    return sorted(len(tps) for tps in assignment.values())


@pytest.mark.parametrize(
    ("members", "partitions", "sharing", "counts"),
    [
        (3, 1, 3, [1, 1, 1]),  # three members, one partition: all three hold it
        (1, 3, 1, [3]),
        (2, 3, 1, [2, 1]),
        (3, 2, 2, [2, 1, 1]),  # 4 assignments for 3 members
        (4, 4, 1, [1, 1, 1, 1]),
        (5, 2, 3, [2, 1, 1, 1, 1]),
        (0, 3, 0, []),
        (2, 0, 0, [0, 0]),
    ],
)
def test_desired_counts(members: int, partitions: int, sharing: int, counts: list[int]) -> None:
    assert sa.desired_counts(members, partitions) == (sharing, counts)


def test_three_members_share_one_partition() -> None:
    subscriptions = {m: {"t"} for m in ("a", "b", "c")}
    got = sa.assign(subscriptions, {"t": 1}, {})
    assert got == {m: frozenset({("t", 0)}) for m in ("a", "b", "c")}


def test_fewer_members_than_partitions_split_them_without_sharing() -> None:
    got = sa.assign({"a": {"t"}, "b": {"t"}}, {"t": 4}, {})
    assert _loads(got) == [2, 2]
    assert got["a"] | got["b"] == {("t", p) for p in range(4)}
    assert not got["a"] & got["b"]


def test_one_leaves_the_others_take_its_partitions_and_keep_theirs() -> None:
    first = sa.assign({m: {"t"} for m in ("a", "b", "c")}, {"t": 6}, {})
    assert _loads(first) == [2, 2, 2]
    second = sa.assign({"a": {"t"}, "b": {"t"}}, {"t": 6}, first)
    assert second["a"] >= first["a"] and second["b"] >= first["b"]  # sticky
    assert second["a"] | second["b"] == {("t", p) for p in range(6)}
    assert _loads(second) == [3, 3]


def test_a_new_member_takes_some_and_no_one_loses_a_partition() -> None:
    first = sa.assign({"a": {"t"}, "b": {"t"}}, {"t": 2}, {})
    second = sa.assign({"a": {"t"}, "b": {"t"}, "c": {"t"}}, {"t": 2}, first)
    assert second["a"] >= first["a"] and second["b"] >= first["b"]
    # 3 members, 2 partitions: each partition shared by 2, loads 2, 1, 1
    assert len(second["c"]) == 1 and _loads(second) == [1, 1, 2]


def test_an_unsubscribed_topic_is_dropped_and_missing_topics_are_ignored() -> None:
    first = sa.assign({"a": {"t", "u"}}, {"t": 1, "u": 1}, {})
    assert first["a"] == {("t", 0), ("u", 0)}
    second = sa.assign({"a": {"t", "later"}}, {"t": 1, "u": 1}, first)
    assert second["a"] == {("t", 0)}


def test_heterogeneous_subscriptions_balance_each_topic_among_its_subscribers() -> None:
    got = sa.assign({"a": {"t"}, "b": {"t", "u"}, "c": {"u"}}, {"t": 2, "u": 1}, {})
    assert {tp for tps in got.values() for tp in tps} == {("t", 0), ("t", 1), ("u", 0)}
    assert got["a"] <= {("t", 0), ("t", 1)} and got["c"] <= {("u", 0)}
    assert all(tp[0] != "u" for tp in got["a"])
    holders_u = [m for m, tps in got.items() if ("u", 0) in tps]
    assert sorted(holders_u) == ["b", "c"]  # 2 subscribers, 1 partition: shared


@given(
    members=st.integers(min_value=1, max_value=9),
    partitions=st.integers(min_value=1, max_value=9),
    previous_members=st.integers(min_value=0, max_value=9),
)
def test_every_partition_assigned_and_balanced(
    members: int, partitions: int, previous_members: int
) -> None:
    """From any earlier assignment: every partition has `sharing` members, loads differ by at
    most one, no member holds a partition twice."""
    counts = {"t": partitions}
    earlier = sa.assign({f"m{i}": {"t"} for i in range(previous_members)}, counts, {})
    got = sa.assign({f"m{i}": {"t"} for i in range(members)}, counts, earlier)
    sharing, _ = sa.desired_counts(members, partitions)
    holders = Counter(tp for tps in got.values() for tp in tps)
    assert set(holders) == {("t", p) for p in range(partitions)}
    assert max(holders.values()) <= sharing
    loads = _loads(got)
    assert loads[-1] - loads[0] <= 1
