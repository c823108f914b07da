"""Partitions as the group records and RPCs carry them: topic name and partition number pairs,
on the wire grouped by topic (``TopicPartitions``). Shared by consumer and share groups."""

from __future__ import annotations

from collections.abc import Iterable

from protos import group_pb2 as gpb

TopicPartition = tuple[str, int]


def to_topic_partitions(partitions: Iterable[TopicPartition]) -> list[gpb.TopicPartitions]:
    """The wire form of a set of partitions, grouped by topic, sorted."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return [gpb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]


def from_topic_partitions(items: Iterable[gpb.TopicPartitions]) -> frozenset[TopicPartition]:
    return frozenset((item.topic, p) for item in items for p in item.partitions)
