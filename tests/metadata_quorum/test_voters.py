"""Controller membership decisions (metadata_quorum.voters) and the VotersRecord's replay."""

from __future__ import annotations

import pytest

from metadata_quorum.codec import decode_snapshot, encode_snapshot
from metadata_quorum.image import MetadataImage, apply, replay
from metadata_quorum.records import ControllerVoter, VotersRecord
from metadata_quorum.voters import (
    VOTERS_MAX,
    current_voters,
    generate_add_voter,
    generate_remove_voter,
    reconcile_voters,
)
from raftlog.errors import ErrorCode, KafkaError


def voter(node_id: int) -> ControllerVoter:
    return ControllerVoter(node_id, f"127.0.0.{10 + node_id}", 9093, 9094)


V1, V2, V3, V4, V5 = (voter(n) for n in range(1, 6))
THREE = (V1, V2, V3)


def raft(*voters: ControllerVoter) -> list[str]:
    return [v.raft_address for v in voters]


def test_an_add_records_the_whole_new_set() -> None:
    assert generate_add_voter(THREE, V4, raft(*THREE)) == VotersRecord((V1, V2, V3, V4))
    # one voter of three dead: the three live ones are a majority of four (the new one counted)
    assert generate_add_voter(THREE, V4, raft(V1, V2)).voters[-1] == V4


@pytest.mark.parametrize(
    ("new", "live", "code", "says"),
    [
        (ControllerVoter(2, "127.0.0.99", 9093, 9094), THREE, ErrorCode.DUPLICATE_VOTER, "already"),
        (ControllerVoter(7, V2.host, V2.port, 7000), THREE, ErrorCode.DUPLICATE_VOTER, V2.address),
        (
            ControllerVoter(7, V2.host, 7000, V2.raft_port),
            THREE,
            ErrorCode.DUPLICATE_VOTER,
            "voter 2",
        ),
        (ControllerVoter(7, "h", 9093, 9093), THREE, ErrorCode.INVALID_REQUEST, "same"),
        (ControllerVoter(-1, "h", 1, 2), THREE, ErrorCode.INVALID_REQUEST, "valid"),
        (V4, (V1,), ErrorCode.INVALID_REQUEST, "majority"),  # 2 of 3 dead
    ],
)
def test_bad_adds_are_refused(
    new: ControllerVoter,
    live: tuple[ControllerVoter, ...],
    code: ErrorCode,
    says: str,
) -> None:
    with pytest.raises(KafkaError) as refused:
        generate_add_voter(THREE, new, raft(*live))
    assert refused.value.error is code and says in refused.value.message


def test_a_quorum_has_a_bounded_size() -> None:
    many = tuple(voter(n) for n in range(1, VOTERS_MAX + 1))
    with pytest.raises(KafkaError, match="at most"):
        generate_add_voter(many, voter(VOTERS_MAX + 1), raft(*many))


def test_a_remove_names_the_voter_leaving_and_the_set_after() -> None:
    leaving, record = generate_remove_voter((*THREE, V4, V5), 1, raft(V2, V3, V4))
    assert leaving == V1 and record == VotersRecord((V2, V3, V4, V5))
    # replacing a dead voter: 3 is gone for good, 1 and 2 remain a majority of 1, 2
    assert generate_remove_voter(THREE, 3, raft(V1, V2))[1] == VotersRecord((V1, V2))


@pytest.mark.parametrize(
    ("voters", "node_id", "live", "code", "says"),
    [
        (THREE, 9, THREE, ErrorCode.VOTER_NOT_FOUND, "not a voter"),
        ((V1,), 1, (V1,), ErrorCode.INVALID_REQUEST, "last voter"),
        # 5 voters, 4 and 5 dead: removing live 1 leaves 2, 3 live of 2, 3, 4, 5
        ((*THREE, V4, V5), 1, THREE, ErrorCode.INVALID_REQUEST, "no majority"),
        (THREE, 2, (V1, V2), ErrorCode.INVALID_REQUEST, "only [1] are live"),
    ],
)
def test_bad_removes_are_refused(
    voters: tuple[ControllerVoter, ...],
    node_id: int,
    live: tuple[ControllerVoter, ...],
    code: ErrorCode,
    says: str,
) -> None:
    with pytest.raises(KafkaError) as refused:
        generate_remove_voter(voters, node_id, raft(*live))
    assert refused.value.error is code and says in refused.value.message


def test_reconcile_records_the_raft_configuration_from_the_static_set_or_the_image() -> None:
    empty = MetadataImage()
    assert current_voters(empty, (V3, V1, V2)) == THREE
    assert reconcile_voters(empty, THREE, raft(*THREE)) == VotersRecord(THREE)
    image = replay(empty, VotersRecord((*THREE, V4)))  # an add whose Raft change never came
    assert reconcile_voters(image, THREE, raft(*THREE)) == VotersRecord(THREE)
    assert reconcile_voters(image, THREE, raft(*THREE, V4)) is None
    with pytest.raises(AssertionError, match="unknown"):  # the image lost a voter: a bug
        reconcile_voters(image, THREE, raft(*THREE, V5))


def test_the_voters_record_replays_and_survives_a_snapshot() -> None:
    image, rejected = apply(MetadataImage(), [VotersRecord((V3, V1)), VotersRecord(())])
    assert image.voters == (V1, V3) and image.voter(3) == V3 and image.voter(2) is None
    assert [r.reason for r in rejected] == ["a quorum has at least one voter"]
    for bad in [(V1, V1), (V1, ControllerVoter(2, V1.host, V1.port, 1))]:
        assert apply(image, [VotersRecord(bad)])[1], bad
    assert decode_snapshot(encode_snapshot(image)).voters == (V1, V3)
