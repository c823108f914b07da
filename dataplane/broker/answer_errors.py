"""How a Kafka error goes into an answer's per-partition message (gRPC door, Kafka listener and
the followers' fetch sessions alike): its code and message, and for NOT_LEADER_OR_FOLLOWER the
leader and epoch the broker knows, where the message has those fields (KIP-951)."""

from __future__ import annotations

from typing import Any

from dataplane.broker.partition import NotLeader
from raftlog.errors import KafkaError


def fill_error(message: Any, error: KafkaError) -> None:
    """Set ``error`` on ``message`` (a protobuf message with ``error_code``/``error_message``)."""
    message.error_code = error.error.code
    message.error_message = error.message
    if isinstance(error, NotLeader) and "leader_id" in message.DESCRIPTOR.fields_by_name:
        message.leader_id = error.leader_id
        message.leader_epoch = error.leader_epoch
