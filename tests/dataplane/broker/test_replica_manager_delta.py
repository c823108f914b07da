"""``ReplicaManager.apply_image`` looks only at the topics an image changed (Kafka's
``applyDelta``): with N partitions hosted, each metadata update cost a pass over all N, so N
partitions' worth of updates cost N squared. The result must be what a full pass gives."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from dataplane.broker.partition import IsrChange, Partition
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from metadata_quorum.image import MetadataImage, PartitionRegistration, TopicImage
from metadata_quorum.records import ConfigResourceType

ME = 1


def manager(tmp_path: Path) -> ReplicaManager:
    def alter(change: IsrChange) -> None:
        return None  # no ISR change is sent anywhere here

    def failed(directory: Path, error: OSError) -> None:
        raise AssertionError(f"no IO failure expected: {directory} {error}")

    return ReplicaManager(ME, tmp_path, ReplicaManagerConfig(), lambda: 0, alter, failed)


def topic(name: str, partitions: int, leader: int, epoch: int = 0) -> TopicImage:
    reg = PartitionRegistration((1, 2, 3), (1, 2, 3), leader, epoch, epoch)
    return TopicImage(name, uuid.uuid4(), {p: reg for p in range(partitions)})


def with_topics(image: MetadataImage, *topics: TopicImage) -> MetadataImage:
    """The next image, as a MetadataDelta builds it: untouched topics keep their objects."""
    merged = {**image.topics, **{t.topic_id: t for t in topics}}
    return replace(
        image, offset=image.offset + 1, topics=merged,
        topic_ids={t.name: tid for tid, t in merged.items()},
    )  # fmt: skip


def without(image: MetadataImage, gone: TopicImage) -> MetadataImage:
    topics = {tid: t for tid, t in image.topics.items() if tid != gone.topic_id}
    return replace(
        image, offset=image.offset + 1, topics=topics,
        topic_ids={t.name: tid for tid, t in topics.items()},
    )  # fmt: skip


@pytest.fixture
def replicas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ReplicaManager]:
    found = manager(tmp_path)
    found.visited = []  # type: ignore[attr-defined]
    set_role = found._set_role

    def counting(partition: Partition, reg: PartitionRegistration, may_lead: bool) -> int | None:
        found.visited.append(partition.name)  # type: ignore[attr-defined]
        return set_role(partition, reg, may_lead)

    monkeypatch.setattr(found, "_set_role", counting)
    yield found
    found.close()


def followed_names(followed: dict[int, list[Partition]]) -> dict[int, list[str]]:
    return {leader: sorted(p.name for p in ps) for leader, ps in followed.items()}


def test_an_update_visits_only_the_topics_it_changed(replicas: ReplicaManager) -> None:
    visited: list[str] = replicas.visited  # type: ignore[attr-defined]
    led, followed = topic("led", 3, leader=ME), topic("followed", 2, leader=2)
    first = with_topics(MetadataImage(), led, followed)
    assert followed_names(replicas.apply_image(first, caught_up=True)) == {
        2: ["followed-0", "followed-1"]
    }
    assert len(visited) == 5  # the first image: every partition

    visited.clear()
    added = topic("added", 2, leader=3)
    second = with_topics(first, added)
    assert followed_names(replicas.apply_image(second, caught_up=True)) == {
        2: ["followed-0", "followed-1"], 3: ["added-0", "added-1"],
    }  # fmt: skip
    assert sorted(visited) == ["added-0", "added-1"]

    visited.clear()
    to_3 = PartitionRegistration((1, 2, 3), (1, 3), 3, 1, 1)
    moved = replace(followed, partitions={0: to_3, 1: followed.partitions[1]})
    third = with_topics(second, moved)
    assert followed_names(replicas.apply_image(third, caught_up=True)) == {
        2: ["followed-1"], 3: ["added-0", "added-1", "followed-0"],
    }  # fmt: skip
    assert sorted(visited) == ["followed-0", "followed-1"]
    assert replicas.get("followed", 0).leader_epoch == 1
    assert len(replicas.partitions()) == 7


def test_a_removed_topic_is_removed_and_no_longer_followed(replicas: ReplicaManager) -> None:
    kept, gone = topic("kept", 1, leader=2), topic("gone", 2, leader=2)
    first = with_topics(MetadataImage(), kept, gone)
    replicas.apply_image(first, caught_up=True)
    directory = replicas.get("gone", 0).log.directory
    followed = replicas.apply_image(without(first, gone), caught_up=True)
    assert followed_names(followed) == {2: ["kept-0"]}
    assert sorted(p.name for p in replicas.partitions()) == ["kept-0"]
    assert not directory.exists()


def test_a_topic_recreated_under_its_name_gets_a_new_log(replicas: ReplicaManager) -> None:
    old = topic("events", 1, leader=ME)
    first = with_topics(MetadataImage(), old)
    replicas.apply_image(first, caught_up=True)
    new = topic("events", 1, leader=ME)
    replicas.apply_image(with_topics(without(first, old), new), caught_up=True)
    assert replicas.get("events", 0).topic_id == new.topic_id
    assert len(replicas.partitions()) == 1


def test_a_config_change_or_may_lead_looks_at_every_partition(replicas: ReplicaManager) -> None:
    visited: list[str] = replicas.visited  # type: ignore[attr-defined]
    first = with_topics(MetadataImage(), topic("a", 2, leader=ME), topic("b", 2, leader=2))
    replicas.apply_image(first, caught_up=True)
    visited.clear()
    configured = replace(
        first, offset=first.offset + 1,
        configs={(ConfigResourceType.TOPIC, "a"): {"retention.ms": "1000"}},
    )  # fmt: skip
    replicas.apply_image(configured, caught_up=True)
    assert len(visited) == 4
    assert replicas.settings("a").log_config.retention_ms == 1000
    visited.clear()
    replicas.apply_image(configured, caught_up=True, may_lead=False)
    assert len(visited) == 4


def test_a_topics_partitions_and_the_hosted_topics_after_a_removal_need_no_full_pass(
    replicas: ReplicaManager,
) -> None:
    """What the broker asks after each metadata update: a coordinator the partitions of its
    topic, the metrics the topics still hosted once a partition went. Each was a pass over
    every hosted partition, 4 coordinators and the metrics for every ISR change at 10,000."""
    orders, audit = topic("orders", 3, leader=ME), topic("audit", 2, leader=2)
    first = with_topics(MetadataImage(), orders, audit)
    replicas.apply_image(first, caught_up=True)
    assert sorted(p.name for p in replicas.partitions_of("orders")) == [
        "orders-0",
        "orders-1",
        "orders-2",
    ]
    assert replicas.partitions_of("nothing") == []
    assert replicas.topics_after_removals() is None  # nothing removed yet
    moved = {p: PartitionRegistration((1, 2, 3), (1, 2, 3), 2, 1, 1) for p in range(3)}
    replicas.apply_image(with_topics(first, replace(orders, partitions=moved)), caught_up=True)
    assert replicas.topics_after_removals() is None  # a new leader removes nothing
    replicas.apply_image(without(first, audit), caught_up=True)
    assert replicas.topics_after_removals() == {"orders"}
    assert replicas.topics_after_removals() is None  # told once
    assert replicas.partitions_of("audit") == []
