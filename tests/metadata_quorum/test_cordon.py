"""Cordoned brokers (``raftlog cluster cordon``) in the controller's pure core: the cordon record
and its refusals, placement that gives a cordoned broker no new replica (CreateTopics,
CreatePartitions, the ``--generate`` and drain plans), explicit assignments and reassignments
onto one refused with INVALID_REPLICA_ASSIGNMENT naming the cordon, and the leaderships and
replicas a cordoned broker has left alone."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata_quorum.cluster import generate_cordon_broker
from metadata_quorum.image import (
    BrokerRegistration,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
    apply,
)
from metadata_quorum.reassignment import ReassignRequest, generate_alter_reassignments
from metadata_quorum.rebalance import plan_drain, plan_reassignment
from metadata_quorum.records import CordonBroker, Endpoint
from metadata_quorum.replication import (
    NewTopic,
    generate_create_partitions,
    generate_create_topics,
    generate_elect_leaders,
)
from raftlog.errors import ErrorCode, KafkaError

TOPIC_ID = uuid.UUID(int=21)
ENDPOINT = (Endpoint("BROKER", "127.0.0.1", 9092),)


def image_of(
    cordoned: tuple[int, ...], brokers: tuple[int, ...] = (1, 2, 3, 4), fenced: tuple[int, ...] = ()
) -> MetadataImage:
    """Brokers unfenced unless ``fenced``; topic ``t`` with one partition on 1, 2, 3 led by 1."""
    partition = PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 1, 1)
    return MetadataImage(
        offset=100,
        brokers={
            b: BrokerRegistration(
                b, f"i{b}", 10 + b, ENDPOINT, None, fenced=b in fenced, cordoned=b in cordoned
            )
            for b in brokers
        },
        topics={TOPIC_ID: TopicImage("t", TOPIC_ID, {0: partition})},
        topic_ids={"t": TOPIC_ID},
        preferred_leaders={1: 1},
    )


def test_cordon_and_uncordon_records() -> None:
    image = image_of(cordoned=())
    assert generate_cordon_broker(image, 4, True) == [CordonBroker(4, True)]
    cordoned, rejected = apply(image, generate_cordon_broker(image, 4, True))
    assert rejected == [] and cordoned.cordoned_broker_ids() == {4}
    assert generate_cordon_broker(cordoned, 4, True) == [], "already cordoned: nothing to do"
    assert generate_cordon_broker(cordoned, 4, False) == [CordonBroker(4, False)]
    fenced = image_of(cordoned=(), fenced=(3,))
    assert generate_cordon_broker(fenced, 3, True) == [CordonBroker(3, True)]
    with pytest.raises(KafkaError) as refused:
        generate_cordon_broker(image, 9, True)
    assert refused.value.error is ErrorCode.BROKER_ID_NOT_REGISTERED


@pytest.mark.parametrize("seed", range(20))
def test_new_topics_and_partitions_skip_cordoned_brokers(seed: int) -> None:
    image = image_of(cordoned=(2,))
    rng = random.Random(seed)
    created = generate_create_topics(image, [NewTopic("n", 6, 3)], False, rng)
    assert [r.error for r in created.results] == [ErrorCode.NONE]
    after, rejected = apply(image, created.records)
    assert rejected == []
    topic = after.topic("n")
    assert topic is not None
    assert all(2 not in p.replicas for p in topic.partitions.values())
    grown = generate_create_partitions(after, [("t", 5, None)], False, rng)
    assert [r.error for r in grown.results] == [ErrorCode.NONE]
    more, _ = apply(after, grown.records)
    added = [p for n, p in more.topics[TOPIC_ID].partitions.items() if n >= 1]
    assert len(added) == 4 and all(2 not in p.replicas for p in added)


def test_too_few_uncordoned_brokers_for_the_replication_factor() -> None:
    image = image_of(cordoned=(2, 3))
    created = generate_create_topics(image, [NewTopic("n", 1, 3)], False, random.Random(1))
    assert [r.error for r in created.results] == [ErrorCode.INVALID_REPLICATION_FACTOR]
    assert created.records == []


def test_an_explicit_assignment_onto_a_cordoned_broker_is_refused() -> None:
    image = image_of(cordoned=(4,))
    topic = NewTopic("n", assignments={0: (1, 2), 1: (4, 1)})
    created = generate_create_topics(image, [topic], False, random.Random(1))
    [result] = created.results
    assert result.error is ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert "cordoned brokers [4]" in result.message and created.records == []
    grown = generate_create_partitions(image, [("t", 2, {1: (2, 3, 4)})], False)
    assert [r.error for r in grown.results] == [ErrorCode.INVALID_REPLICA_ASSIGNMENT]


def test_a_reassignment_onto_a_cordoned_broker_is_refused_one_it_holds_may_stay() -> None:
    image = image_of(cordoned=(3, 4))
    onto = generate_alter_reassignments(image, [ReassignRequest("t", 0, (1, 2, 4))], False)
    [result] = onto.results
    assert result.error is ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert "cordoned" in result.message and onto.records == []
    # 3 is cordoned but holds the partition: a target keeping it (reordered) is fine
    kept = generate_alter_reassignments(image, [ReassignRequest("t", 0, (3, 2, 1))], False)
    assert [r.error for r in kept.results] == [ErrorCode.NONE] and len(kept.records) == 1
    off = generate_alter_reassignments(
        image_of(cordoned=(3,)), [ReassignRequest("t", 0, (1, 2, 4))], False
    )
    assert [r.error for r in off.results] == [ErrorCode.NONE], "moving off a cordoned broker"


def test_a_cordoned_broker_keeps_leading_and_can_be_elected() -> None:
    # preferred leader 1 is cordoned and out of leadership: a preferred election gives it back
    moved = PartitionRegistration((1, 2, 3), (1, 2, 3), 2, 2, 2)
    image = replace(
        image_of(cordoned=(1,)), topics={TOPIC_ID: TopicImage("t", TOPIC_ID, {0: moved})}
    )
    elected = generate_elect_leaders(image, False, None)
    after, rejected = apply(image, elected.records)
    assert rejected == []
    partition = after.partition(TOPIC_ID, 0)
    assert partition is not None and partition.leader == 1


def test_the_drain_plan_sends_nothing_to_a_cordoned_broker() -> None:
    current = {("t", 0): (4, 1, 2), ("t", 1): (1, 4, 3), ("t", 2): (4, 2, 5)}
    plan = plan_drain(current, 4, [1, 2, 3, 4, 5], cordoned=[3, 4])
    # 3 is cordoned: it keeps its replica of t-1 and gains none; 4's go to 1, 2 and 5
    assert plan == {("t", 0): (2, 1, 5), ("t", 1): (1, 2, 3), ("t", 2): (5, 2, 1)}
    with pytest.raises(KafkaError) as refused:
        plan_drain({("t", 0): (4, 1, 2)}, 4, [1, 2, 3, 4], cordoned=[3])
    assert refused.value.error is ErrorCode.INVALID_REPLICATION_FACTOR


@st.composite
def assignments(
    draw: st.DrawFn,
) -> tuple[dict[tuple[str, int], tuple[int, ...]], list[int], list[int]]:
    rf = draw(st.integers(1, 3))
    current = {
        ("t", p): tuple(draw(st.permutations(range(1, 6)))[:rf])
        for p in range(draw(st.integers(1, 20)))
    }
    brokers = draw(st.lists(st.integers(1, 7), min_size=rf + 2, max_size=7, unique=True))
    cordoned = draw(st.lists(st.sampled_from(brokers), max_size=2, unique=True))
    return current, brokers, cordoned


@settings(max_examples=300, deadline=None)
@given(assignments())
def test_a_generated_plan_gives_cordoned_brokers_no_new_replica(
    case: tuple[dict[tuple[str, int], tuple[int, ...]], list[int], list[int]],
) -> None:
    current, brokers, cordoned = case
    plan = plan_reassignment(current, brokers, cordoned)
    assert plan.keys() == current.keys()
    for tp, target in plan.items():
        assert len(target) == len(set(target)) == len(current[tp])
        assert set(target) <= set(brokers)
        gained = set(target) - set(current[tp])
        assert not gained & set(cordoned), (tp, current[tp], target)
    open_brokers = [b for b in brokers if b not in cordoned]
    counts = Counter(b for r in plan.values() for b in r)
    assert max(counts[b] for b in open_brokers) - min(counts[b] for b in open_brokers) <= 1
