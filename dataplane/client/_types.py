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


class OffsetAndMetadata(NamedTuple):
    """A committed offset: the next record to consume, with the user's metadata string."""

    offset: int
    metadata: str = ""
    leader_epoch: int = -1


class ConsumerGroupMetadata(NamedTuple):
    """What a transactional producer needs of a consumer's group membership to commit its
    offsets (Kafka's ``ConsumerGroupMetadata``, from ``Consumer.group_metadata()``): the
    coordinator refuses a commit from a member that has since been fenced. With KIP-848
    groups the generation is the member epoch; -1 and "" when the consumer is not a member
    (``assign`` with a ``group_id``), which the coordinator does not check."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class ConsumerRebalanceListener:
    """Called from ``Consumer.poll`` (the application thread) as the group moves partitions.
    Subclass and override; the defaults do nothing (``on_partitions_lost`` calls
    ``on_partitions_revoked``, as Kafka's does)."""

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Before ``revoked`` go to another member: their positions are committed first when
        auto-commit is on; commit your own processing state here."""

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """``assigned`` are now this consumer's, starting at their committed offsets."""

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        """The member was fenced: ``lost`` may already belong to another member (do not
        commit them)."""
        self.on_partitions_revoked(lost)
