"""DescribeQuorum's lag column: the leader's last log index minus each voter's match index,
known on the ready leader only (a standby forwards the request there)."""

from __future__ import annotations

import pytest

from metadata_quorum.raft import QuorumStatus, VoterStatus
from metadata_quorum.service import voter_lags

A, B, C = "127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1"


def status(self_address: str, *matches: tuple[str, int | None]) -> QuorumStatus:
    voters = tuple(VoterStatus(address, match, True) for address, match in matches)
    return QuorumStatus(self_address, A, 3, 40, 40, True, voters)


@pytest.mark.parametrize(
    ("quorum", "lags"),
    [
        # the leader (A) is at index 42; B matches 40, C matches all of it
        (status(A, (A, 42), (B, 40), (C, 42)), [0, 2, 0]),
        # the leader's own entry need not come first
        (status(A, (B, 7), (C, 0), (A, 9)), [2, 9, 0]),
        # a voter the leader has no match index for yet
        (status(A, (A, 5), (B, None), (C, 5)), [0, None, 0]),
        # a follower (B) knows no match index, its own included: every lag unknown
        (status(B, (A, None), (B, None), (C, None)), [None, None, None]),
        # a match index read a tick after the leader's last index: never a negative lag
        (status(A, (A, 10), (B, 11), (C, 10)), [0, 0, 0]),
    ],
)
def test_lag_is_the_leaders_last_index_minus_the_voters_match_index(
    quorum: QuorumStatus, lags: list[int | None]
) -> None:
    assert voter_lags(quorum) == lags
