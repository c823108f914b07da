"""The pure rules behind what test_newcomer_clients.py drives: which ListOffsets versions know
which sentinel timestamps, and DescribeTopicPartitions' topic choice and paging."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest

from dataplane.kafka import codec as kc
from dataplane.kafka.describe_topic_partitions import (
    NO_AUTHORIZED_OPERATIONS,
    Cursor,
    KafkaDescribeTopicPartitions,
    page,
    topics_to_describe,
)
from dataplane.kafka.listener import list_offsets_timestamp_supported
from protos import broker_pb2 as pb
from raftlog.errors import ErrorCode, KafkaError


@pytest.mark.parametrize(
    ("timestamp", "version", "supported"),
    [
        (0, 1, True), (1_700_000_000_000, 1, True), (-1, 1, True), (-2, 1, True),
        (-3, 6, False), (-3, 7, True), (-4, 7, False), (-4, 8, True), (-5, 8, False),
        (-5, 9, True), (-5, 10, True), (-6, 10, False), (-7, 10, False),
    ],
)  # fmt: skip
def test_list_offsets_sentinels_by_version(timestamp: int, version: int, supported: bool) -> None:
    assert list_offsets_timestamp_supported(timestamp, version) is supported


def topic(name: str, count: int, error: ErrorCode = ErrorCode.NONE) -> pb.TopicMetadata:
    return pb.TopicMetadata(
        name=name,
        error_code=error.code,
        partitions=[pb.PartitionMetadata(partition=n, leader_id=1) for n in range(count)],
    )


def shown(answer: list[tuple[pb.TopicMetadata, list[pb.PartitionMetadata]]]) -> list[str]:
    return [f"{t.name}:{','.join(str(p.partition) for p in ps)}" for t, ps in answer]


def test_topics_in_name_order_from_the_cursor() -> None:
    assert topics_to_describe(["b", "a", "b"], ["x"], None) == ["a", "b"]
    assert topics_to_describe([], ["c", "a", "b"], Cursor("b", 3)) == ["b", "c"]
    with pytest.raises(KafkaError) as outside:
        topics_to_describe(["a"], [], Cursor("b", 0))
    assert outside.value.error is ErrorCode.INVALID_REQUEST
    with pytest.raises(KafkaError) as negative:
        topics_to_describe(["a"], [], Cursor("a", -1))
    assert negative.value.error is ErrorCode.INVALID_REQUEST


def test_a_page_stops_at_the_limit_and_names_where_to_go_on() -> None:
    described = [topic("a", 3), topic("b", 2), topic("c", 1)]
    first = page(described, None, 2, all_topics=True)
    assert shown(first.topics) == ["a:0,1"] and first.next_cursor == Cursor("a", 2)
    second = page(described, first.next_cursor, 2, all_topics=True)
    assert shown(second.topics) == ["a:2", "b:0"] and second.next_cursor == Cursor("b", 1)
    # the limit met at a topic's end: the next page starts at the next topic's first partition
    exact = page(described, None, 3, all_topics=True)
    assert shown(exact.topics) == ["a:0,1,2"] and exact.next_cursor == Cursor("b", 0)
    assert page(described, None, 6, all_topics=True).next_cursor is None


def test_topics_in_error_cost_nothing_and_are_left_out_of_all_topics() -> None:
    denied = pb.TopicMetadata(name="0-denied", error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED.code)
    missing = pb.TopicMetadata(name="b", error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code)
    described = [denied, topic("a", 2), missing, topic("c", 2)]
    named = page(described, None, 3, all_topics=False)
    # the unauthorized one comes last (Kafka appends them after its loop), even past the page
    assert shown(named.topics) == ["a:0,1", "b:", "c:0", "0-denied:"]
    assert named.next_cursor == Cursor("c", 1)
    every = page(described, None, 10, all_topics=True)
    assert shown(every.topics) == ["a:0,1", "c:0,1"]


def test_describe_topic_partitions_fills_authorized_operations_when_asked() -> None:
    refused = ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
    metadata = pb.MetadataResponse(topics=[
        pb.TopicMetadata(name="mine", topic_id=bytes(range(16)),
                         partitions=[pb.PartitionMetadata(partition=0, leader_id=1)]),
        pb.TopicMetadata(name="theirs", error_code=refused),
    ])  # fmt: skip
    handler = KafkaDescribeTopicPartitions(
        lambda _: metadata, lambda _: False, lambda: ["mine", "theirs"], lambda raw: raw,
        lambda name: {"mine": 0b1000}[name],
    )  # fmt: skip

    def described(asked: bool) -> dict[str, int]:
        body = SimpleNamespace(
            topics=[SimpleNamespace(name="mine"), SimpleNamespace(name="theirs")], cursor=None,
            response_partition_limit=2000, include_topic_authorized_operations=asked,
        )  # fmt: skip
        answer = handler.describe(kc.Request(75, 0, 1, "test", body))
        return {t["name"]: t["topic_authorized_operations"] for t in answer["topics"]}

    assert described(True) == {"mine": 0b1000, "theirs": NO_AUTHORIZED_OPERATIONS}
    assert described(False) == {
        "mine": NO_AUTHORIZED_OPERATIONS,
        "theirs": NO_AUTHORIZED_OPERATIONS,
    }


def test_describe_topic_partitions_reports_the_eligible_leader_replicas() -> None:
    """KIP-966's fields come from the image (through the broker core's Metadata) and encode."""
    metadata = pb.MetadataResponse(topics=[
        pb.TopicMetadata(name="events", topic_id=bytes(range(16)), partitions=[
            pb.PartitionMetadata(partition=0, leader_id=-1, replicas=[1, 2, 3],
                                 eligible_leader_replicas=[2], last_known_elr=[1, 3]),
        ]),
    ])  # fmt: skip
    handler = KafkaDescribeTopicPartitions(
        lambda _: metadata, lambda _: False, lambda: ["events"],
        lambda raw: uuid.UUID(bytes=raw), lambda _: 0,
    )  # fmt: skip
    body = SimpleNamespace(
        topics=[SimpleNamespace(name="events")], cursor=None, response_partition_limit=10,
        include_topic_authorized_operations=False,
    )  # fmt: skip
    answer = handler.describe(kc.Request(75, 0, 1, "test", body))
    (partition,) = answer["topics"][0]["partitions"]
    assert (partition["eligible_leader_replicas"], partition["last_known_elr"]) == ([2], [1, 3])
    kc.encode_response(75, 0, 1, answer)
