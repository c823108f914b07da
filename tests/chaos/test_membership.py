"""Which voter a membership fault's removal takes out: a live one, and only while the live
voters left are a majority of the voters left (chaos/membership.py `removable`)."""

from __future__ import annotations

from chaos.membership import removable
from dataplane.client.admin import QuorumDescription, VoterDescription


def quorum(leader: int, connected: dict[int, bool]) -> QuorumDescription:
    voters = tuple(
        VoterDescription(n, f"127.0.0.{n}:9093", 10, 0, up, f"127.0.0.{n}:9094")
        for n, up in connected.items()
    )
    return QuorumDescription(leader, 3, 10, 5, True, voters, ())


def test_any_of_three_live_voters_can_leave_the_leader_included() -> None:
    # the leader's own entry is not "connected" (it is not connected to itself): still live
    three = quorum(2, {1: True, 2: False, 3: True})
    assert [removable(three, position) for position in range(4)] == [1, 2, 3, 1]


def test_no_voter_leaves_when_the_live_ones_left_would_not_be_a_majority() -> None:
    assert removable(quorum(1, {1: True, 2: True, 3: False}), 0) is None  # 1 live of 2
    assert removable(quorum(1, {1: True, 2: True, 3: True, 4: False, 5: False}), 0) is None
    five = quorum(1, {1: True, 2: True, 3: True, 4: True, 5: False})  # 3 live of 4 left
    assert removable(five, 1) == 2


def test_the_last_voter_never_leaves() -> None:
    assert removable(quorum(1, {1: True}), 0) is None
