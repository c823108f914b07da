"""Brokers that leave, and leader balance, in the controller's pure core: UnregisterBroker's
refusals and records, the drain plan of ``raftlog cluster remove-node`` (only the replicas on the
leaving broker move, onto the least-loaded brokers) and the automatic preferred-leader
rebalance's ``leader.imbalance.per.broker.percentage`` (Kafka's per-broker share)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata_quorum.cluster import generate_unregister_broker
from metadata_quorum.image import (
    BrokerRegistration,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
    apply,
)
from metadata_quorum.rebalance import plan_drain
from metadata_quorum.records import (
    ConfigRecord,
    ConfigResourceType,
    Endpoint,
    PartitionChange,
    UnregisterBroker,
)
from metadata_quorum.replication import generate_preferred_rebalance, imbalanced_partitions
from raftlog.errors import ErrorCode, KafkaError

TOPIC_ID = uuid.UUID(int=11)


def image_of(
    partitions: Mapping[int, PartitionRegistration],
    brokers: tuple[int, ...] = (1, 2, 3, 4),
    fenced: tuple[int, ...] = (),
) -> MetadataImage:
    endpoint = (Endpoint("BROKER", "127.0.0.1", 9092),)
    return MetadataImage(
        offset=100,
        brokers={
            b: BrokerRegistration(b, f"i{b}", 10 + b, endpoint, None, fenced=b in fenced)
            for b in brokers
        },
        topics={TOPIC_ID: TopicImage("t", TOPIC_ID, dict(partitions))},
        topic_ids={"t": TOPIC_ID},
        preferred_leaders=dict(Counter(p.replicas[0] for p in partitions.values())),
    )


def led(replicas: tuple[int, ...], leader: int | None = None) -> PartitionRegistration:
    """In sync, led by ``leader`` (default: the preferred replica)."""
    return PartitionRegistration(
        replicas, replicas, replicas[0] if leader is None else leader, 1, 1
    )


# -- UnregisterBroker ------------------------------------------------------------------------
def refusal(image: MetadataImage, broker_id: int, force: bool = False) -> KafkaError:
    with pytest.raises(KafkaError) as refused:
        generate_unregister_broker(image, broker_id, force)
    return refused.value


def test_an_unknown_broker_is_not_registered_even_when_forced() -> None:
    image = image_of({0: led((1, 2, 3))})
    assert refusal(image, 9).error is ErrorCode.BROKER_ID_NOT_REGISTERED
    assert refusal(image, 9, force=True).error is ErrorCode.BROKER_ID_NOT_REGISTERED


def test_a_broker_that_hosts_replicas_is_refused_naming_them() -> None:
    partitions = {p: led((1, 2, 4) if p < 7 else (1, 2, 3)) for p in range(9)}
    image = image_of(partitions, fenced=(4,))
    refused = refusal(image, 4)
    assert refused.error is ErrorCode.INVALID_REQUEST
    assert "still hosts 7 replicas (t-0, t-1, t-2, t-3, t-4, ...)" in refused.message
    moving = PartitionRegistration((1, 2, 3, 4), (1, 2, 3, 4), 1, 1, 1, (), (4,))
    assert "t-0" in refusal(image_of({0: moving}, fenced=(4,)), 4).message  # still leaving


def test_a_running_broker_is_refused_a_fenced_empty_one_unregistered() -> None:
    image = image_of({0: led((1, 2, 3))})
    refused = refusal(image, 4)
    assert refused.error is ErrorCode.INVALID_REQUEST and "running (unfenced)" in refused.message
    fenced = image_of({0: led((1, 2, 3))}, fenced=(4,))
    records = generate_unregister_broker(fenced, 4, force=False)
    assert records == [UnregisterBroker(4, 14)]
    after, rejected = apply(fenced, records)
    assert rejected == [] and 4 not in after.brokers


def test_forced_the_broker_leaves_isr_and_leadership_first() -> None:
    image = image_of({0: led((4, 1, 2)), 1: led((1, 2, 3))})
    records = generate_unregister_broker(image, 4, force=True)
    assert records == [
        PartitionChange(TOPIC_ID, 0, 1, leader=1, isr=(1, 2)),
        UnregisterBroker(4, 14),
    ]
    after, rejected = apply(image, records)
    assert rejected == [] and 4 not in after.brokers
    moved = after.partition(TOPIC_ID, 0)
    assert moved is not None and (moved.leader, moved.isr, moved.replicas) == (1, (1, 2), (4, 1, 2))


# -- the drain plan ----------------------------------------------------------------------------
def test_the_drain_plan_moves_only_the_leaving_replicas_onto_the_least_loaded() -> None:
    current = {
        ("t", 0): (4, 1, 2),
        ("t", 1): (1, 4, 3),
        ("t", 2): (2, 3, 1),
        ("t", 3): (3, 1, 2),
        ("u", 0): (1, 2),
    }
    plan = plan_drain(current, 4, [1, 2, 3, 4])
    # replicas on 1, 2, 3 before: 5, 4, 3. t-0 needs one of {3}: 3; t-1 one of {2}: 2.
    # t-0's preferred leader was 4; 1 is the preferred leader of two partitions, 2 and 3 of
    # one each: the first of the members with the fewest, in member order, is 2.
    assert plan == {("t", 0): (2, 1, 3), ("t", 1): (1, 2, 3)}
    assert plan_drain(current, 9, [1, 2, 3]) == {}


def test_a_drain_without_room_is_refused() -> None:
    with pytest.raises(KafkaError) as refused:
        plan_drain({("t", 0): (1, 2, 3)}, 3, [1, 2, 3])
    assert refused.value.error is ErrorCode.INVALID_REPLICATION_FACTOR
    assert "t-0" in refused.value.message


def test_draining_a_balanced_broker_keeps_the_rest_balanced() -> None:
    current = {("t", p): (1 + p % 4, 1 + (p + 1) % 4, 1 + (p + 2) % 4) for p in range(12)}
    plan = plan_drain(current, 2, [1, 2, 3, 4])
    after = {tp: plan.get(tp, replicas) for tp, replicas in current.items()}
    assert Counter(b for r in after.values() for b in r) == {1: 12, 3: 12, 4: 12}
    assert Counter(r[0] for r in after.values()) == {1: 4, 3: 4, 4: 4}


@st.composite
def assignments(draw: st.DrawFn) -> tuple[dict[tuple[str, int], tuple[int, ...]], int, int]:
    brokers = draw(st.integers(2, 6))
    rf = draw(st.integers(1, brokers - 1))
    current = {
        ("t", p): tuple(draw(st.permutations(range(1, brokers + 1)))[:rf])
        for p in range(draw(st.integers(1, 25)))
    }
    return current, draw(st.integers(1, brokers)), brokers


@settings(max_examples=300, deadline=None)
@given(assignments())
def test_a_drain_plan_takes_the_broker_out_and_nothing_else(
    case: tuple[dict[tuple[str, int], tuple[int, ...]], int, int],
) -> None:
    current, leaving, count = case
    brokers = list(range(1, count + 1))
    plan = plan_drain(current, leaving, brokers)
    assert set(plan) == {tp for tp, r in current.items() if leaving in r}
    for tp, target in plan.items():
        assert leaving not in target and len(set(target)) == len(target) == len(current[tp])
        assert set(current[tp]) - {leaving} < set(target), "the other replicas stay"
        assert set(target) <= set(brokers)


# -- leader.imbalance.per.broker.percentage ---------------------------------------------------
def test_only_brokers_over_the_share_get_their_leadership_back() -> None:
    # broker 1 prefers 10 partitions and leads 9 of them (10 % not led: not over 10 %);
    # broker 2 prefers 5 and leads 4 (20 %: over).
    partitions = {p: led((1, 2, 3), leader=2 if p == 0 else None) for p in range(10)}
    partitions |= {10 + p: led((2, 3, 1), leader=3 if p == 0 else None) for p in range(5)}
    image = image_of(partitions)
    assert imbalanced_partitions(image, 10) == [("t", 10)]
    assert imbalanced_partitions(image, 9) == [("t", 0), ("t", 10)]
    assert imbalanced_partitions(image, 20) == []
    assert imbalanced_partitions(image, 0) == [("t", 0), ("t", 10)]
    assert generate_preferred_rebalance(image) == [
        PartitionChange(TOPIC_ID, 10, 1, leader=2, isr=(2, 3, 1))
    ]


def test_the_percentage_is_a_cluster_config() -> None:
    partitions = {p: led((1, 2, 3), leader=2 if p == 0 else None) for p in range(10)}
    image = image_of(partitions)
    assert generate_preferred_rebalance(image) == []
    config = ConfigRecord(
        ConfigResourceType.BROKER, "", "leader.imbalance.per.broker.percentage", "5"
    )
    image, rejected = apply(image, [config])
    assert rejected == []
    assert generate_preferred_rebalance(image) == [
        PartitionChange(TOPIC_ID, 0, 1, leader=1, isr=(1, 2, 3))
    ]


def test_a_preferred_replica_out_of_the_isr_is_left_alone() -> None:
    out_of_sync = PartitionRegistration((1, 2, 3), (2, 3), 2, 1, 1)
    image = image_of({0: out_of_sync, 1: led((2, 3, 1))})
    assert imbalanced_partitions(image, 10) == [("t", 0)]
    assert generate_preferred_rebalance(image) == []
