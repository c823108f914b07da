"""Controller membership (KIP-853) decided as plain functions: add, remove, reconcile.

The Raft log is the authority on who votes (`metadata_quorum.raft`, pysyncobj's membership
entries: a configuration counts from the moment it is in the log). The metadata image mirrors
it as a `VotersRecord` naming each voter's id and addresses, so brokers and clients find the
controllers and a restarted node learns them from its log. The active controller keeps one
invariant between the two: **the image's voters are a superset of the Raft configuration**.
An add records the new voter first, then changes Raft; a remove changes Raft first, then the
record. A failover between the two steps leaves the image one voter larger, and
`reconcile_voters` (on activation and every tick) drops it again, since every voter the Raft
configuration names is in the image.

Liveness checks use the active controller's view of its connections (``live_raft``): a change
that would leave the new configuration without a live majority is refused, since the quorum
would stop committing (its own commit included) until enough voters return.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from metadata_quorum.image import MetadataImage
from metadata_quorum.records import ControllerVoter, VotersRecord
from raftlog.errors import ErrorCode, KafkaError

VOTERS_MAX = 9  # a metadata quorum needs no more; each voter costs every commit a round trip


def current_voters(
    image: MetadataImage, static: Sequence[ControllerVoter]
) -> tuple[ControllerVoter, ...]:
    """The image's voters, or the static controller.quorum.voters before any were recorded."""
    return image.voters or tuple(sorted(static, key=lambda v: v.node_id))


def reconcile_voters(
    image: MetadataImage, static: Sequence[ControllerVoter], raft: Collection[str]
) -> VotersRecord | None:
    """The record that makes the image name exactly the Raft configuration ``raft`` (Raft
    addresses), or None if it already does. Raises AssertionError if ``raft`` names an address
    the image does not know: the superset invariant is broken."""
    known = current_voters(image, static)
    unknown = set(raft) - {v.raft_address for v in known}
    if unknown:
        raise AssertionError(
            f"the image's voters must include the Raft configuration: {sorted(unknown)} unknown"
        )
    voters = tuple(v for v in known if v.raft_address in raft)
    if image.voters == voters:
        return None
    return VotersRecord(voters)


def _live_majority(raft: Collection[str], live_raft: Collection[str]) -> bool:
    return 2 * len(set(raft) & set(live_raft)) > len(raft)


def generate_add_voter(
    voters: Sequence[ControllerVoter], new: ControllerVoter, live_raft: Collection[str]
) -> VotersRecord:
    """The VotersRecord to commit before Raft adds ``new``; raises KafkaError if refused."""
    if new.node_id < 0 or not 0 < new.port < 65536 or not 0 < new.raft_port < 65536:
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"controller {new} has no valid id or ports")
    if new.address == new.raft_address:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "the CONTROLLER and Raft ports are the same")
    for voter in voters:
        if voter.node_id == new.node_id:
            raise KafkaError(
                ErrorCode.DUPLICATE_VOTER, f"controller {new.node_id} is already a voter"
            )
        taken = {voter.address, voter.raft_address} & {new.address, new.raft_address}
        if taken:
            raise KafkaError(
                ErrorCode.DUPLICATE_VOTER,
                f"{sorted(taken)[0]} is already used by voter {voter.node_id}",
            )
    if len(voters) >= VOTERS_MAX:
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"a quorum has at most {VOTERS_MAX} voters")
    raft = [v.raft_address for v in voters] + [new.raft_address]
    if not _live_majority(raft, [*live_raft, new.raft_address]):
        raise KafkaError(
            ErrorCode.INVALID_REQUEST,
            f"adding controller {new.node_id} would leave {len(raft)} voters of which fewer "
            "than a majority are live: remove a dead voter first",
        )
    return VotersRecord((*voters, new))


def generate_remove_voter(
    voters: Sequence[ControllerVoter], node_id: int, live_raft: Collection[str]
) -> tuple[ControllerVoter, VotersRecord]:
    """(the voter leaving, the VotersRecord to commit after Raft removed it); raises
    KafkaError if refused."""
    leaving = next((v for v in voters if v.node_id == node_id), None)
    if leaving is None:
        ids = sorted(v.node_id for v in voters)
        raise KafkaError(
            ErrorCode.VOTER_NOT_FOUND, f"controller {node_id} is not a voter (voters: {ids})"
        )
    if len(voters) == 1:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST, f"controller {node_id} is the last voter: a quorum needs one"
        )
    remaining = tuple(v for v in voters if v.node_id != node_id)
    if not _live_majority([v.raft_address for v in remaining], live_raft):
        live = sorted(v.node_id for v in remaining if v.raft_address in set(live_raft))
        raise KafkaError(
            ErrorCode.INVALID_REQUEST,
            f"removing controller {node_id} would leave voters {[v.node_id for v in remaining]} "
            f"of which only {live} are live: no majority",
        )
    return leaving, VotersRecord(remaining)
