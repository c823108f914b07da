"""raftlog's client library: Producer, Consumer and AdminClient over the BrokerService and
ControllerService gRPC APIs. Names and settings follow Kafka's clients."""

from dataplane.client._closing import Closing
from dataplane.client._membership import GroupAssignment, GroupMembership, JoinedMember
from dataplane.client._types import (
    ConsumerRebalanceListener,
    ConsumerRecord,
    OffsetAndMetadata,
    RecordMetadata,
    TopicPartition,
)
from dataplane.client.admin import AdminClient, NewTopic
from dataplane.client.consumer import Consumer
from dataplane.client.producer import Producer, RecordFuture

__all__ = [
    "AdminClient",
    "Closing",
    "Consumer",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "GroupAssignment",
    "GroupMembership",
    "JoinedMember",
    "NewTopic",
    "OffsetAndMetadata",
    "Producer",
    "RecordFuture",
    "RecordMetadata",
    "TopicPartition",
]
