"""DeleteRecords (Kafka API 21) on a partition's leader: move its log start offset.

Kafka's ``ReplicaManager.deleteRecords``, in two steps the BrokerServicer runs:

1. ``start``: each partition of the request is checked (DELETE on the topic, else
   TOPIC_AUTHORIZATION_FAILED; internal topics are refused with INVALID_TOPIC_EXCEPTION; an
   unknown partition UNKNOWN_TOPIC_OR_PARTITION, one this broker does not lead
   NOT_LEADER_OR_FOLLOWER) and its leader moves the log start offset
   (``Partition.delete_records``: -1 means the high watermark, beyond it is
   OFFSET_OUT_OF_RANGE, a compacted-only topic POLICY_VIOLATION). The log start offset is
   checkpointed at once and the segments wholly below it are deleted.
2. ``complete``: the answer waits, up to the request's timeout, until the partition's low
   watermark (the lowest log start offset over the leader and its followers on live brokers,
   which follow the leader's through their fetches) reached the offset (Kafka's
   DelayedDeleteRecords). A partition still short of it then is answered REQUEST_TIMED_OUT,
   its log start offset already moved on the leader.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from dataplane.broker import authorization as authz
from dataplane.broker.answer_errors import fill_error
from dataplane.broker.partition import Partition
from dataplane.broker.replica_manager import ReplicaManager
from metadata_quorum.security.acl import AclOperation
from metadata_quorum.security.authorization import AccessControl
from protos import broker_pb2 as pb
from raftlog.errors import ErrorCode, KafkaError

INVALID_LOW_WATERMARK = -1
DELETE_RECORDS_TIMEOUT_MS_MAX = 300_000


@dataclass
class Pending:
    """A partition whose log start offset moved on the leader, waiting for its followers."""

    partition: Partition
    required_offset: int
    result: pb.DeleteRecordsPartitionResponse
    done: bool = False


def is_internal(topic: str) -> bool:
    """Kafka's ``Topic.isInternal``: the coordinators' topics, which clients never trim."""
    return topic.startswith("__")


def start(
    request: pb.DeleteRecordsRequest,
    replicas: ReplicaManager,
    access: AccessControl,
    alive: Collection[int],
) -> tuple[pb.DeleteRecordsResponse, list[Pending]]:
    """Move each partition's log start offset; the response (errors filled in) and the
    partitions whose replicas have yet to follow."""
    names = [t.name for t in request.topics]
    denied = authz.denied_topics(access, AclOperation.DELETE, names)
    response = pb.DeleteRecordsResponse()
    pending: list[Pending] = []
    for topic in request.topics:
        out = response.topics.add(name=topic.name)
        for item in topic.partitions:
            result = out.partitions.add(
                partition=item.partition, low_watermark=INVALID_LOW_WATERMARK,
                leader_id=-1, leader_epoch=-1,
            )  # fmt: skip
            try:
                if topic.name in denied:
                    raise authz.topic_denied(AclOperation.DELETE, topic.name)
                if is_internal(topic.name):
                    raise KafkaError(
                        ErrorCode.INVALID_TOPIC_EXCEPTION,
                        f"cannot delete records of internal topic {topic.name}",
                    )
                partition = replicas.get(topic.name, item.partition)
                required = partition.delete_records(item.offset)
                result.low_watermark = partition.low_watermark(alive)
                result.leader_id, result.leader_epoch = partition.leader_id, partition.leader_epoch
            except KafkaError as error:
                fill_error(result, error)
                continue
            # Until every replica follows, a timeout answers REQUEST_TIMED_OUT (Kafka's status).
            entry = Pending(partition, required, result)
            pending.append(entry)
            result.error_code = ErrorCode.REQUEST_TIMED_OUT.code
            result.error_message = "the replicas did not reach the new log start offset in time"
    complete(pending, alive)
    return response, pending


def complete(pending: list[Pending], alive: Collection[int]) -> bool:
    """Settle the partitions whose low watermark reached their offset (or that lost their
    leadership meanwhile); True when none is left waiting."""
    for entry in pending:
        if entry.done:
            continue
        result = entry.result
        try:
            low = entry.partition.low_watermark(alive)
        except KafkaError as error:
            fill_error(result, error)
            result.low_watermark = INVALID_LOW_WATERMARK
            entry.done = True
            continue
        if low >= entry.required_offset:
            result.error_code, result.error_message = ErrorCode.NONE.code, ""
            result.low_watermark = low
            entry.done = True
    return all(entry.done for entry in pending)


def timeout_ms(request: pb.DeleteRecordsRequest) -> int:
    return min(max(request.timeout_ms, 0), DELETE_RECORDS_TIMEOUT_MS_MAX)
