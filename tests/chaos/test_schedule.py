"""The fault schedule: drawn from the seed, one fault at a time, every kind when there is room."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chaos.history import FAULT_KINDS, FaultKind
from chaos.runner import parse_duration
from chaos.schedule import (
    LENGTH_S,
    VOTERS_MIN,
    PlannedFault,
    phases,
    plan,
    reassign_target,
    split_sides,
)

ALL = list(FAULT_KINDS)


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert plan(42, 600, ALL, 5, 6) == plan(42, 600, ALL, 5, 6)
    assert plan(42, 600, ALL, 5, 6) != plan(43, 600, ALL, 5, 6)


@given(
    seed=st.integers(0, 2**32),
    duration=st.floats(30, 1200),
    kinds=st.lists(st.sampled_from(ALL), min_size=1, unique=True),
    nodes=st.integers(3, 9),
)
def test_faults_come_one_at_a_time_between_warm_up_and_cool_down(
    seed: int, duration: float, kinds: list[FaultKind], nodes: int
) -> None:
    faults = plan(seed, duration, kinds, nodes, 6)
    warm_up, cool_down = phases(duration)
    previous_end = warm_up
    for fault in faults:
        assert fault.kind in kinds
        assert fault.at_s >= previous_end
        low, high = LENGTH_S[fault.kind]
        assert low <= fault.length_s <= high
        assert fault.node != fault.peer and 0 <= fault.node < nodes and 0 <= fault.partition < 6
        previous_end = fault.end_s
    assert previous_end <= duration - cool_down
    assert [f.id for f in faults] == list(range(1, len(faults) + 1))


def test_a_ninety_second_run_injects_every_kind() -> None:
    for seed in range(200):
        assert {f.kind for f in plan(seed, 90, ALL, 3, 6)} == set(ALL), seed


def test_a_split_keeps_a_majority_on_one_side() -> None:
    fault = plan(1, 600, ["partition"], 5, 6)[0]
    minority, majority = split_sides([1, 2, 3, 4, 5], fault)
    assert len(minority) == 2 and len(majority) == 3 and not set(minority) & set(majority)
    # with 3 nodes a split is an isolation: the planner never asks for one
    assert all(f.shape != "split" for f in plan(1, 1200, ["partition"], 3, 6))


def test_durations_read_like_people_write_them() -> None:
    assert parse_duration("90") == 90
    assert parse_duration("90s") == 90
    assert parse_duration("10m") == 600
    assert parse_duration("1.5h") == 5400


def test_a_reassign_brings_in_an_outsider_or_shrinks() -> None:
    fault = PlannedFault(id=1, kind="reassign", at_s=0, length_s=5, node=1, peer=0, partition=2)
    # five nodes: replica 2 (position 1) leaves, the first node without a replica comes in first
    assert reassign_target((1, 2, 3), [1, 2, 3, 4, 5], fault) == (4, 1, 3)
    # three nodes hold every replica: the partition shrinks by one (the heal moves it back)
    assert reassign_target((3, 1, 2), [1, 2, 3], fault) == (3, 2)


def test_the_ci_seed_plans_a_membership_fault_within_ninety_seconds() -> None:
    faults = plan(20261123, 90, ALL, 3, 6)  # tests/chaos/test_chaos_run.py's run
    assert {f.kind for f in faults} == set(ALL)
    assert faults[-1].end_s <= 90 - phases(90)[1]


def test_a_run_too_short_for_every_kind_still_gets_faults() -> None:
    # 30 s has room for two or three faults, not eight: no room is kept for the rest
    assert len(plan(1, 30, ALL, 3, 6)) >= 2


def test_a_membership_fault_removes_a_voter_only_where_enough_are_left() -> None:
    for nodes in range(3, 10):
        changes = {f.change for f in plan(7, 1200, ["membership"], nodes, 6)}
        assert changes == ({"add"} if nodes - 1 < VOTERS_MIN else {"add", "remove"}), nodes
    assert {f.change for f in plan(7, 1200, ["kill"], 5, 6)} == {"add"}  # not drawn


def test_a_power_loss_fault_draws_its_cut_and_other_kinds_draw_none() -> None:
    faults = plan(11, 1200, ["power-loss", "power-loss-all", "kill"], 3, 6)
    power = [f for f in faults if f.kind in ("power-loss", "power-loss-all")]
    assert {f.cut_mode for f in power} == {"all", "torn"}
    assert len({f.cut_seed for f in power}) == len(power)
    assert {(f.cut_mode, f.cut_seed) for f in faults if f.kind == "kill"} == {("all", 0)}
    assert plan(11, 1200, ["power-loss", "kill"], 3, 6) == plan(
        11, 1200, ["power-loss", "kill"], 3, 6
    )


def test_a_run_without_power_loss_keeps_the_schedule_it_had() -> None:
    # the cut is drawn only for power-loss kinds: seeds of other runs replay as before
    assert [(f.kind, f.at_s, f.node) for f in plan(5, 120, ["kill", "pause"], 3, 6)][:3] == [
        ("kill", 9.6, 2), ("pause", 21.254, 0), ("kill", 30.999, 0),
    ]  # fmt: skip
