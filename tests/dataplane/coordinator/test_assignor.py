"""The uniform assignor: complete, exclusive, balanced, sticky (property tests)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.coordinator.assignor import assign

TOPICS = ["a", "b", "c"]
Scenario = tuple[Any, Any, Any]


def _all(counts: dict[str, int], topics: set[str]) -> set[tuple[str, int]]:
    return {(t, p) for t in topics if t in counts for p in range(counts[t])}


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, set[str]], dict[str, int], dict[str, Any]]:
    counts = {t: draw(st.integers(0, 12)) for t in TOPICS if draw(st.booleans())}
    members = draw(st.lists(st.text("mnopq", min_size=1, max_size=3), min_size=1, max_size=6,
                            unique=True))  # fmt: skip
    topic_lists = st.lists(st.sampled_from(TOPICS), min_size=1, unique=True)
    subs = {m: set(draw(topic_lists)) for m in members}
    pool = sorted(_all(counts, set(TOPICS)) | {("a", 99), ("gone", 0)})
    previous = {m: set(draw(st.lists(st.sampled_from(pool), unique=True))) if pool else set()
                for m in members if draw(st.booleans())}  # fmt: skip
    return subs, counts, previous


@given(scenarios())
@settings(max_examples=300, deadline=None)
def test_every_subscribed_partition_goes_to_exactly_one_subscriber(scenario: Scenario) -> None:
    subs, counts, previous = scenario
    target = assign(subs, counts, previous)
    assert set(target) == set(subs)
    seen: list[tuple[str, int]] = [tp for tps in target.values() for tp in tps]
    assert len(seen) == len(set(seen))
    wanted = set().union(*(_all(counts, topics) for topics in subs.values()))
    assert set(seen) == wanted
    for member, tps in target.items():
        assert all(t in subs[member] for t, _ in tps)


@given(scenarios())
@settings(max_examples=300, deadline=None)
def test_identical_subscriptions_are_balanced_and_sticky(scenario: Scenario) -> None:
    subs, counts, previous = scenario
    topics = set(TOPICS)
    subs = {m: topics for m in subs}
    target = assign(subs, counts, previous)
    sizes = [len(tps) for tps in target.values()]
    assert max(sizes) - min(sizes) <= 1
    # A member that had no more than the smaller share keeps all it validly had.
    total = len(_all(counts, topics))
    share = total // len(subs)
    claimed: set[tuple[str, int]] = set()
    for member in sorted(subs):
        valid = {tp for tp in previous.get(member, ()) if tp[0] in counts and tp[1] < counts[tp[0]]}
        valid -= claimed
        claimed |= valid
        if len(valid) <= share:
            assert valid <= target[member]


def test_a_joining_member_takes_partitions_only_from_the_others() -> None:
    counts = {"a": 6}
    before = assign({"m1": {"a"}, "m2": {"a"}, "m3": {"a"}}, counts, {})
    after = assign({"m1": {"a"}, "m2": {"a"}, "m3": {"a"}, "m4": {"a"}}, counts, before)
    moved = sum(len(before[m] - after[m]) for m in before)
    assert moved == len(after["m4"]) == 1
    assert sorted(len(t) for t in after.values()) == [1, 1, 2, 2]
