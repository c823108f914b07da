"""Partition reassignment (KIP-455) in the controller's pure core: records in, image out.

Table-driven steps of a move (start, the new replica joins the ISR through AlterPartition, the
move completes with leadership handed over, cancel), the bad inputs with Kafka's error codes and
the image unchanged, and a property: any interleaving of reassignments, cancels and ISR joins
keeps the partition's invariants and, once every target replica is in sync, lands on the target.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata_quorum.image import (
    BrokerRegistration,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
    apply,
)
from metadata_quorum.reassignment import (
    ReassignRequest,
    generate_alter_reassignments,
    list_reassignments,
)
from metadata_quorum.records import Endpoint
from metadata_quorum.replication import IsrRequest, generate_alter_partition
from raftlog.errors import ErrorCode

TOPIC_ID = uuid.UUID(int=7)
BROKERS = (1, 2, 3, 4, 5)


def cluster(partition: PartitionRegistration, fenced: tuple[int, ...] = ()) -> MetadataImage:
    endpoint = (Endpoint("BROKER", "127.0.0.1", 9092),)
    brokers = {
        b: BrokerRegistration(b, f"i{b}", 10 + b, endpoint, None, fenced=b in fenced)
        for b in BROKERS
    }
    return MetadataImage(
        offset=100,
        brokers=brokers,
        topics={TOPIC_ID: TopicImage("t", TOPIC_ID, {0: partition})},
        topic_ids={"t": TOPIC_ID},
        preferred_leaders={partition.replicas[0]: 1},
    )


def state(image: MetadataImage) -> PartitionRegistration:
    found = image.partition(TOPIC_ID, 0)
    assert found is not None
    return found


def move(
    image: MetadataImage, target: tuple[int, ...] | None, allow_rf_change: bool = True
) -> tuple[MetadataImage, ErrorCode]:
    generated = generate_alter_reassignments(
        image, [ReassignRequest("t", 0, target)], allow_rf_change
    )
    after, rejected = apply(image, generated.records)
    assert rejected == []
    [result] = generated.results
    return after, result.error


def join(image: MetadataImage, broker: int) -> MetadataImage:
    """The leader adds ``broker`` to the ISR (it caught up), as it asks with AlterPartition."""
    current = state(image)
    leader = image.brokers[current.leader]
    request = IsrRequest(
        TOPIC_ID, 0, current.leader_epoch, (*current.isr, broker), current.partition_epoch
    )
    generated = generate_alter_partition(image, current.leader, leader.broker_epoch, [request])
    after, rejected = apply(image, generated.records)
    assert rejected == [] and generated.results[0].error is ErrorCode.NONE
    assert generated.results[0].state == state(after), "AlterPartition answers the new state"
    return after


def test_a_move_adds_followers_then_completes_when_they_are_in_sync() -> None:
    image = cluster(PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 5, 9))
    image, error = move(image, (4, 5, 1))
    assert error is ErrorCode.NONE
    moving = state(image)
    assert moving.replicas == (4, 5, 1, 2, 3)  # the target, then the replicas leaving
    assert (moving.adding_replicas, moving.removing_replicas) == ((4, 5), (2, 3))
    assert (moving.leader, moving.leader_epoch, moving.isr) == (1, 5, (1, 2, 3))
    assert list_reassignments(image, None)[0].adding_replicas == (4, 5)
    image = join(image, 4)
    assert state(image).reassigning  # 5 is not in sync yet
    image = join(image, 5)
    done = state(image)
    assert (done.replicas, done.isr, done.leader) == ((4, 5, 1), (1, 4, 5), 1)
    assert not done.reassigning and list_reassignments(image, None) == []
    assert done.leader_epoch == 5  # the leader stayed: no new epoch


def test_a_leaving_leader_hands_over_to_the_first_target_replica() -> None:
    image = cluster(PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 5, 9))
    image, _ = move(image, (4, 2, 3))
    image = join(image, 4)
    done = state(image)
    assert (done.replicas, done.leader, done.leader_epoch) == ((4, 2, 3), 4, 6)
    assert done.isr == (2, 3, 4)


def test_a_move_within_the_isr_completes_at_once() -> None:
    image = cluster(PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 5, 9))
    image, error = move(image, (3, 2))  # a smaller replication factor, all in sync already
    assert error is ErrorCode.NONE
    done = state(image)
    assert (done.replicas, done.isr, done.leader, done.reassigning) == ((3, 2), (2, 3), 3, False)


def test_the_same_replicas_are_a_no_op() -> None:
    image = cluster(PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 5, 9))
    after, error = move(image, (1, 2, 3))
    assert error is ErrorCode.NONE and state(after) == state(image)


def test_a_new_target_replaces_the_old_one_against_the_original_replicas() -> None:
    image = cluster(PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 5, 9))
    image, _ = move(image, (4, 2, 3))
    image, error = move(image, (5, 2, 3))
    assert error is ErrorCode.NONE
    moving = state(image)
    assert moving.replicas == (5, 2, 3, 1)
    assert (moving.adding_replicas, moving.removing_replicas) == ((5,), (1,))


def test_cancel_reverts_to_the_original_replicas() -> None:
    image = cluster(PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 5, 9))
    image, _ = move(image, (4, 5, 3))
    image = join(image, 4)
    image, error = move(image, None)
    assert error is ErrorCode.NONE
    reverted = state(image)
    # Kafka's revert: the replicas without the added ones, in the order the move left them
    assert (reverted.replicas, reverted.isr, reverted.leader) == ((3, 1, 2), (1, 2, 3), 1)
    assert not reverted.reassigning
    _, again = move(image, None)
    assert again is ErrorCode.NO_REASSIGNMENT_IN_PROGRESS


@pytest.mark.parametrize(
    ("target", "allow_rf_change", "error"),
    [
        ((1, 9, 3), True, ErrorCode.INVALID_REPLICA_ASSIGNMENT),  # broker 9 does not exist
        ((1, 5, 3), True, ErrorCode.INVALID_REPLICA_ASSIGNMENT),  # broker 5 is fenced
        ((1, 1, 3), True, ErrorCode.INVALID_REPLICA_ASSIGNMENT),  # duplicates
        ((), True, ErrorCode.INVALID_REPLICA_ASSIGNMENT),  # empty
        ((1, 2, 3, 4), False, ErrorCode.INVALID_REPLICATION_FACTOR),
    ],
)
def test_bad_targets_are_refused_and_change_nothing(
    target: tuple[int, ...], allow_rf_change: bool, error: ErrorCode
) -> None:
    image = cluster(PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 5, 9), fenced=(5,))
    generated = generate_alter_reassignments(
        image, [ReassignRequest("t", 0, target)], allow_rf_change
    )
    assert generated.records == []
    assert [r.error for r in generated.results] == [error]


def test_a_fenced_replica_may_stay_but_not_be_added() -> None:
    image = cluster(PartitionRegistration((1, 2, 3), (1, 3), 1, 5, 9), fenced=(2, 5))
    after, error = move(image, (4, 2, 1))  # 2 is fenced but holds the partition already
    assert error is ErrorCode.NONE
    assert state(after).adding_replicas == (4,)
    _, refused = move(image, (5, 1, 3))
    assert refused is ErrorCode.INVALID_REPLICA_ASSIGNMENT


def test_unknown_partitions_and_duplicates_are_refused() -> None:
    image = cluster(PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 5, 9))
    items = [
        ReassignRequest("t", 1, (1, 2, 3)),
        ReassignRequest("nope", 0, (1, 2, 3)),
        ReassignRequest("t", 0, (4, 2, 3)),
        ReassignRequest("t", 0, (5, 2, 3)),
    ]
    generated = generate_alter_reassignments(image, items, True)
    assert [r.error for r in generated.results] == [
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NONE,
        ErrorCode.INVALID_REQUEST,
    ]
    assert len(generated.records) == 1


def test_a_target_that_drops_every_in_sync_replica_is_refused() -> None:
    # moving (1, 2, 3) to (4, 2, 3); only the added replica 4 is in sync now
    moving = PartitionRegistration((4, 2, 3, 1), (4,), 4, 7, 12, (4,), (1,))
    image = cluster(moving)
    generated = generate_alter_reassignments(image, [ReassignRequest("t", 0, (5, 1, 2))], True)
    assert [r.error for r in generated.results] == [ErrorCode.INVALID_REPLICA_ASSIGNMENT]
    assert generated.records == []


steps = st.lists(
    st.one_of(
        st.tuples(st.just("move"), st.permutations(BROKERS).map(lambda p: tuple(p[:3]))),
        st.tuples(st.just("cancel"), st.none()),
        st.tuples(st.just("join"), st.sampled_from(BROKERS)),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_any_interleaving_keeps_the_invariants_and_lands_on_the_target(
    script: list[tuple[str, object]],
) -> None:
    image = cluster(PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 0, 0))
    last_target: tuple[int, ...] = (1, 2, 3)
    for action, argument in script:
        current = state(image)
        if action == "move":
            assert isinstance(argument, tuple)
            image, error = move(image, argument)
            assert error is ErrorCode.NONE
            last_target = argument
        elif action == "cancel":
            image, error = move(image, None)
            assert error is (
                ErrorCode.NONE if current.reassigning else ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
            )
            if current.reassigning:
                last_target = current.original_replicas
        elif argument in current.replicas and argument not in current.isr:
            assert isinstance(argument, int)
            image = join(image, argument)
        after = state(image)
        assert after.leader in after.isr and set(after.isr) <= set(after.replicas)
        assert set(after.adding_replicas).isdisjoint(after.removing_replicas)
        target = after.target_replicas
        assert after.replicas[: len(target)] == target  # the target first, then those leaving
    for broker in state(image).target_replicas:
        if broker not in state(image).isr:
            image = join(image, broker)
    final = state(image)
    assert not final.reassigning
    assert final.replicas == last_target
