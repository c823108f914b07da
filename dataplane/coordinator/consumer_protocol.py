"""The bytes of Kafka's "consumer" embedded protocol: what classic group members put in their
JoinGroup metadata (ConsumerProtocolSubscription) and what the leader hands out in SyncGroup
(ConsumerProtocolAssignment). The coordinator treats them as opaque except to read which topics a
member subscribes to (offset expiry) and to describe groups; every version starts with the
fields read here (int16 version, then the topics), later versions only append fields.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from raftlog.errors import ErrorCode, KafkaError

TopicPartition = tuple[str, int]
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, size: int) -> bytes:
        if size < 0 or self.at + size > len(self.data):
            raise KafkaError(ErrorCode.INVALID_REQUEST, "consumer protocol bytes are truncated")
        chunk = self.data[self.at : self.at + size]
        self.at += size
        return chunk

    def int16(self) -> int:
        value: int = _I16.unpack(self.take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _I32.unpack(self.take(4))[0]
        return value

    def string(self) -> str:
        return self.take(self.int16()).decode()


def subscribed_topics(metadata: bytes) -> list[str]:
    """The topics of a ConsumerProtocolSubscription (any version)."""
    reader = _Reader(metadata)
    reader.int16()
    return [reader.string() for _ in range(reader.int32())]


def assigned_partitions(assignment: bytes) -> list[TopicPartition]:
    """The partitions of a ConsumerProtocolAssignment (any version); none for empty bytes."""
    if not assignment:
        return []
    reader = _Reader(assignment)
    reader.int16()
    found: list[TopicPartition] = []
    for _ in range(reader.int32()):
        topic = reader.string()
        found += [(topic, reader.int32()) for _ in range(reader.int32())]
    return found


def _string(text: str) -> bytes:
    raw = text.encode()
    return _I16.pack(len(raw)) + raw


def encode_subscription(topics: Iterable[str]) -> bytes:
    """ConsumerProtocolSubscription v0 with no user data."""
    names = sorted(topics)
    return b"".join([_I16.pack(0), _I32.pack(len(names)), *map(_string, names), _I32.pack(-1)])


def encode_assignment(partitions: Iterable[TopicPartition]) -> bytes:
    """ConsumerProtocolAssignment v0 with no user data."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    parts = [_I16.pack(0), _I32.pack(len(by_topic))]
    for topic, numbers in by_topic.items():
        parts += [_string(topic), _I32.pack(len(numbers)), *map(_I32.pack, numbers)]
    parts.append(_I32.pack(-1))
    return b"".join(parts)
