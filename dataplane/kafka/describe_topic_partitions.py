"""DescribeTopicPartitions (key 75, KIP-966): topics' partitions a page at a time.

Kafka 4's Java AdminClient describes topics with it (falling back to Metadata only against older
brokers) and kafka-python 3's ``describe_topic_partitions`` sends it. It answers what Metadata
does for each partition (leader, leader epoch, replicas, ISR, offline replicas) plus KIP-966's
eligible leader replicas and last known ELR from the metadata image (both empty while the ISR
is at min ISR, and always with ``eligible.leader.replicas.version`` 0), paged by a partition
limit and a cursor, as Kafka's ``DescribeTopicPartitionsRequestHandler`` and
``KRaftMetadataCache.getTopicMetadataForDescribeTopicResponse``:

- no topics named: every topic the caller may DESCRIBE (others are left out, unknown ones never
  arise); topics named: each one, unauthorized TOPIC_AUTHORIZATION_FAILED (with no topic id, so
  its existence is not disclosed), unknown UNKNOWN_TOPIC_OR_PARTITION, an invalid name
  INVALID_TOPIC_EXCEPTION;
- topics in name order from the cursor's topic (from its partition), at most
  ``min(response_partition_limit, max.request.partition.size.limit)`` partitions in all (at
  least 1); where the limit stops the answer, ``next_cursor`` names the next topic and partition;
- a cursor whose topic is not among the named ones, or whose partition is negative, is
  INVALID_REQUEST for every named topic.

The topics' partitions come from the broker core's Metadata (`BrokerServicer.Metadata`), which
also authorizes DESCRIBE on each topic. With ``include_topic_authorized_operations`` each topic
described carries what the caller may do on it (``topic_authorized_operations``, Kafka's bit
field, as Metadata v8+ fills it); a topic refused TOPIC_AUTHORIZATION_FAILED, and every topic of
a request that does not ask, carries Kafka's "not computed" value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dataplane.kafka import codec as kc
from protos import broker_pb2 as pb
from raftlog.errors import ErrorCode, KafkaError

PARTITION_LIMIT_MAX = 2000  # Kafka's max.request.partition.size.limit (its default)
NO_AUTHORIZED_OPERATIONS = -(2**31)  # Kafka's "not computed" for authorized operations
ZERO_UUID = bytes(16)


@dataclass(frozen=True)
class Cursor:
    """Where a page starts: a topic (by name) and its first partition."""

    topic_name: str
    partition_index: int


@dataclass(frozen=True)
class Page:
    """The topics of one answer (found ones with their partitions, in name order, then the
    ones in error) and where the next page starts (None: nothing is left)."""

    topics: list[tuple[pb.TopicMetadata, list[pb.PartitionMetadata]]]
    next_cursor: Cursor | None


def topics_to_describe(
    requested: Sequence[str], all_topics: Sequence[str], cursor: Cursor | None
) -> list[str]:
    """The topic names to look at, in name order from the cursor's (Kafka's rule: a name
    before the cursor's is skipped); INVALID_REQUEST for a cursor outside the named topics or
    with a negative partition."""
    after = cursor.topic_name if cursor is not None else ""
    names = sorted({name for name in (requested or all_topics) if name >= after})
    if cursor is not None and requested and cursor.topic_name not in names:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST,
            f"the topic list should contain the cursor topic {cursor.topic_name!r}",
        )
    if cursor is not None and cursor.partition_index < 0:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST, f"cursor partition {cursor.partition_index} is not valid"
        )
    return names


def page(
    described: Sequence[pb.TopicMetadata],
    cursor: Cursor | None,
    limit: int,
    all_topics: bool,
) -> Page:
    """One page of ``described`` (Metadata's answer for the names, in name order): at most
    ``limit`` partitions of the topics found, from the cursor. Named topics in error are
    answered without counting against the limit (the unauthorized ones all, after the page,
    as Kafka appends them after its loop); with all topics asked for, they are left out."""
    remaining = limit
    out: list[tuple[pb.TopicMetadata, list[pb.PartitionMetadata]]] = []
    refused = ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
    denied = [] if all_topics else [t for t in described if t.error_code == refused]
    for topic in described:
        if topic.error_code == refused:
            continue
        if remaining == 0:
            return Page(out + [(t, []) for t in denied], Cursor(topic.name, 0))
        if not topic.partitions and topic.error_code != ErrorCode.NONE.code:
            if not all_topics:
                out.append((topic, []))
            continue
        start = cursor.partition_index if cursor and cursor.topic_name == topic.name else 0
        ordered = sorted(topic.partitions, key=lambda p: p.partition)
        chosen = [p for p in ordered if start <= p.partition < start + remaining]
        out.append((topic, chosen))
        if start + remaining < len(ordered):
            return Page(out + [(t, []) for t in denied], Cursor(topic.name, start + remaining))
        remaining -= len(chosen)
    return Page(out + [(t, []) for t in denied], None)


class KafkaDescribeTopicPartitions:
    """DescribeTopicPartitions over the broker core's Metadata."""

    def __init__(
        self,
        metadata: Callable[[pb.MetadataRequest], pb.MetadataResponse],
        internal: Callable[[str], bool],
        topic_names: Callable[[], Sequence[str]],
        uuid_of: Callable[[bytes], Any],
        operations: Callable[[str], int] | None = None,
    ) -> None:
        self._metadata = metadata
        # a topic name -> the caller's authorized operations on it (None: not computed)
        self._operations = operations
        self._internal = internal
        self._topic_names = topic_names
        self._uuid_of = uuid_of

    def handlers(self) -> Mapping[int, Callable[[kc.Request], kc.Data]]:
        return {kc.API_DESCRIBE_TOPIC_PARTITIONS: self.describe}

    def describe(self, request: kc.Request) -> kc.Data:
        body = request.body
        requested = [t.name for t in body.topics]
        with_operations = bool(kc.field(body, "include_topic_authorized_operations", False))
        raw = body.cursor
        cursor = None if raw is None else Cursor(raw.topic_name, int(raw.partition_index))
        try:
            names = topics_to_describe(requested, self._topic_names(), cursor)
        except KafkaError as error:
            refused = [self._topic(pb.TopicMetadata(name=n, error_code=error.error.code), [])
                       for n in requested]  # fmt: skip
            return {"throttle_time": 0, "topics": refused, "next_cursor": None}
        described = self._metadata(pb.MetadataRequest(topics=names)).topics if names else []
        limit = max(min(PARTITION_LIMIT_MAX, int(body.response_partition_limit)), 1)
        answer = page(sorted(described, key=lambda t: t.name), cursor, limit, not requested)
        next_cursor = answer.next_cursor
        return {
            "throttle_time": 0,
            "topics": [
                self._topic(topic, partitions, with_operations)
                for topic, partitions in answer.topics
            ],
            "next_cursor": None if next_cursor is None else {
                "topic_name": next_cursor.topic_name,
                "partition_index": next_cursor.partition_index,
            },
        }  # fmt: skip

    def _topic(
        self,
        topic: pb.TopicMetadata,
        partitions: list[pb.PartitionMetadata],
        with_operations: bool = False,
    ) -> kc.Data:
        found = bool(partitions) or topic.error_code in (
            ErrorCode.NONE.code, ErrorCode.LEADER_NOT_AVAILABLE.code,
        )  # fmt: skip
        denied = topic.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
        operations = NO_AUTHORIZED_OPERATIONS
        if with_operations and not denied and self._operations is not None:
            operations = self._operations(topic.name)
        return {
            # a topic without leaders yet is described (its partitions say so), as Kafka does
            "error_code": ErrorCode.NONE.code if found else topic.error_code,
            "name": topic.name,
            "topic_id": self._uuid_of(ZERO_UUID if denied else topic.topic_id),
            "is_internal": self._internal(topic.name),
            "partitions": [
                {
                    "error_code": ErrorCode.NONE.code,
                    "partition_index": p.partition,
                    "leader_id": p.leader_id,
                    "leader_epoch": p.leader_epoch,
                    "replica_nodes": list(p.replicas),
                    "isr_nodes": list(p.isr),
                    "eligible_leader_replicas": list(p.eligible_leader_replicas),
                    "last_known_elr": list(p.last_known_elr),
                    "offline_replicas": list(p.offline_replicas),
                }
                for p in partitions
            ],
            "topic_authorized_operations": operations,
        }
