"""What ``raftlog partitions reassign --execute --throttle`` throttles, as Kafka's tool: the
current replicas of each moving partition on the leader side, its new replicas on the follower
side, the rates on every broker of a move; a move already under way counts from its original
replicas; a partition that gains no replica is not throttled."""

from __future__ import annotations

from dataplane.client.admin import PartitionDescription, TopicDescription
from dataplane.tools.partition_commands import ThrottlePlan, plan_throttles
from metadata_quorum.configs import ThrottledReplicas


def topic(name: str, *partitions: PartitionDescription) -> TopicDescription:
    return TopicDescription(name, b"\0" * 16, partitions, {})


def partition(
    index: int,
    replicas: tuple[int, ...],
    adding: tuple[int, ...] = (),
    removing: tuple[int, ...] = (),
) -> PartitionDescription:
    return PartitionDescription(index, replicas[0], 0, replicas, replicas, adding, removing)


def test_current_replicas_send_and_new_ones_fetch() -> None:
    described = {
        "events": topic(
            "events",
            partition(0, (1, 2, 3)),  # -> 4, 2, 3
            partition(1, (2, 3, 1)),  # -> 2, 3, 1: stays
            partition(2, (3, 1, 2)),  # not in the plan
        ),
        "clicks": topic("clicks", partition(0, (1, 2)), partition(1, (2, 3))),
    }
    plan = {
        ("events", 0): (4, 2, 3),
        ("events", 1): (2, 3, 1),
        ("clicks", 0): (1, 2),
        ("clicks", 1): (5, 4),
    }
    assert plan_throttles(described, plan) == ThrottlePlan(
        brokers=(1, 2, 3, 4, 5),
        leader={"events": "0:1,0:2,0:3", "clicks": "1:2,1:3"},
        follower={"events": "0:4", "clicks": "1:5,1:4"},
    )
    for value in ("0:1,0:2,0:3", "1:5,1:4"):
        ThrottledReplicas.parse(value)  # the topic configs take them


def test_a_move_under_way_counts_from_its_original_replicas() -> None:
    # events-0 moves from (1, 2, 3) to (4, 2, 3): replicas (4, 2, 3, 1), adding 4, removing 1
    moving = partition(0, (4, 2, 3, 1), adding=(4,), removing=(1,))
    described = {"events": topic("events", moving, partition(1, (1, 2, 3)))}
    again = plan_throttles(described, {("events", 0): (4, 2, 3)})  # the same plan, run again
    assert again == ThrottlePlan((1, 2, 3, 4), {"events": "0:2,0:3,0:1"}, {"events": "0:4"})
    # another partition of the topic in the plan: the move under way stays throttled too
    other = plan_throttles(described, {("events", 1): (1, 2, 5)})
    assert other == ThrottlePlan(
        (1, 2, 3, 4, 5), {"events": "0:2,0:3,0:1,1:1,1:2,1:3"}, {"events": "0:4,1:5"}
    )


def test_a_plan_that_moves_nothing_throttles_nothing() -> None:
    described = {"events": topic("events", partition(0, (1, 2, 3)))}
    assert plan_throttles(described, {("events", 0): (3, 2, 1)}) == ThrottlePlan((), {}, {})
