"""Public value types of the client library: plain, immutable, Kafka's field names."""

from __future__ import annotations

from typing import NamedTuple

from raftlog.records import Headers


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """What a completed ``Producer.send`` future holds (Kafka's ``RecordMetadata``).

    ``offset`` is -1 with acks=0 (the broker does not answer). ``timestamp`` is the record's
    CreateTime, or the broker's LogAppendTime when the topic stamps it.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    serialized_key_size: int  # -1 for a null key
    serialized_value_size: int  # -1 for a null value
    serialized_header_size: int


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime
    key: bytes | None
    value: bytes | None
    headers: Headers
    leader_epoch: int  # the batch's partitionLeaderEpoch, -1 = unknown
