"""raftlog's client library: Producer, Consumer, FetchStream, ShareConsumer and AdminClient over
the BrokerService and ControllerService gRPC APIs. Names and settings follow Kafka's clients."""

from dataplane.client._closing import Closing
from dataplane.client._membership import GroupAssignment, GroupMembership, JoinedMember
from dataplane.client._prepared import (
    PreparedTransaction,
    PreparedTransactionFencedError,
    complete_prepared_transaction,
)
from dataplane.client._record_future import BatchResult
from dataplane.client._transactions import (
    AbortableTransactionError,
    FatalTransactionError,
    ProducerFencedError,
    TransactionAbortedError,
    TransactionStateError,
)
from dataplane.client._types import (
    ConsumerGroupMetadata,
    ConsumerRebalanceListener,
    ConsumerRecord,
    OffsetAndMetadata,
    RecordMetadata,
    TopicPartition,
)
from dataplane.client.admin import AdminClient, NewTopic
from dataplane.client.consumer import Consumer, LogTruncationError
from dataplane.client.fetch_stream import FetchStream
from dataplane.client.producer import Producer, RecordFuture
from dataplane.client.share_consumer import (
    AcknowledgeType,
    IllegalStateError,
    ShareConsumer,
    ShareConsumerRecord,
)

__all__ = [
    "AbortableTransactionError",
    "AcknowledgeType",
    "AdminClient",
    "BatchResult",
    "Closing",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "FatalTransactionError",
    "FetchStream",
    "GroupAssignment",
    "GroupMembership",
    "IllegalStateError",
    "JoinedMember",
    "LogTruncationError",
    "NewTopic",
    "OffsetAndMetadata",
    "PreparedTransaction",
    "PreparedTransactionFencedError",
    "Producer",
    "ProducerFencedError",
    "RecordFuture",
    "RecordMetadata",
    "ShareConsumer",
    "ShareConsumerRecord",
    "TopicPartition",
    "TransactionAbortedError",
    "TransactionStateError",
    "complete_prepared_transaction",
]
