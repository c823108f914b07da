"""The reassignment planner: balanced replicas and preferred leaders (within one of even), the
replication factor kept, and as few replicas moved as balance allows."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata_quorum.rebalance import plan_reassignment
from raftlog.errors import ErrorCode, KafkaError

Assignment = dict[tuple[str, int], tuple[int, ...]]


@st.composite
def assignments(draw: st.DrawFn) -> tuple[Assignment, list[int]]:
    old_brokers = draw(st.integers(3, 5))
    rf = draw(st.integers(1, 3))
    partitions = draw(st.integers(1, 30))
    current: Assignment = {}
    for p in range(partitions):
        replicas = draw(st.permutations(range(1, old_brokers + 1)))
        current[("t" if p % 2 else "u", p)] = tuple(replicas[:rf])
    targets = draw(st.lists(st.integers(1, 7), min_size=rf, max_size=7, unique=True))
    return current, targets


def spread(counts: Counter[int], brokers: list[int]) -> int:
    return max(counts[b] for b in brokers) - min(counts[b] for b in brokers)


@settings(max_examples=400, deadline=None)
@given(assignments())
def test_the_plan_is_balanced_and_keeps_each_replication_factor(
    case: tuple[Assignment, list[int]],
) -> None:
    current, brokers = case
    plan = plan_reassignment(current, brokers)
    assert plan.keys() == current.keys()
    for tp, replicas in plan.items():
        assert len(replicas) == len(current[tp]) == len(set(replicas))
        assert set(replicas) <= set(brokers)
    assert spread(Counter(b for r in plan.values() for b in r), brokers) <= 1
    assert spread(Counter(r[0] for r in plan.values()), brokers) <= 1
    again = plan_reassignment(plan, brokers)
    assert again == plan, "a balanced assignment is left as it is"


@settings(max_examples=300, deadline=None)
@given(assignments())
def test_moves_stay_near_the_least_balance_needs(case: tuple[Assignment, list[int]]) -> None:
    """Replicas on removed brokers must move, and so must whatever a broker holds beyond its
    share (the ceiling): the plan moves at most one more replica than that per partition it
    could not fill without pushing a broker over (and none when nothing needs to move)."""
    current, brokers = case
    total = sum(len(r) for r in current.values())
    ceiling = -(-total // len(brokers))
    held = Counter(b for r in current.values() for b in r)
    must = sum(held[b] for b in held if b not in brokers)
    must += sum(max(0, held[b] - ceiling) for b in brokers)
    plan = plan_reassignment(current, brokers)
    moved = sum(len(set(current[tp]) - set(plan[tp])) for tp in current)
    floor = total // len(brokers)
    under = sum(max(0, floor - held[b]) for b in brokers)
    assert moved <= max(must, under) * 2
    if must == 0 and under == 0:
        assert moved == 0


def test_growing_three_brokers_to_five_moves_two_fifths() -> None:
    current = {("t", p): ((p % 3) + 1, ((p + 1) % 3) + 1, ((p + 2) % 3) + 1) for p in range(10)}
    plan = plan_reassignment(current, [1, 2, 3, 4, 5])
    moved = sum(len(set(plan[tp]) - set(current[tp])) for tp in current)
    assert moved == 12  # brokers 4 and 5 get their 6 replicas each; nothing else moves
    assert Counter(b for r in plan.values() for b in r) == Counter({b: 6 for b in range(1, 6)})


def test_draining_a_broker() -> None:
    current = {("t", p): (1 + p % 4, 1 + (p + 1) % 4) for p in range(8)}
    plan = plan_reassignment(current, [1, 2, 3])
    assert all(4 not in r for r in plan.values())


def test_bad_input() -> None:
    with pytest.raises(KafkaError) as narrow:
        plan_reassignment({("t", 0): (1, 2, 3)}, [1, 2])
    assert narrow.value.error is ErrorCode.INVALID_REPLICATION_FACTOR
    with pytest.raises(KafkaError):
        plan_reassignment({("t", 0): (1,)}, [])
