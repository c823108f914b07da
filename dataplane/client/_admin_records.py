"""The AdminClient's DeleteRecords: each partition's request goes to its leader, as Kafka's
AdminClient ``deleteRecords`` sends one request per leader.

A partition whose leader moved (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, a metadata that
does not know it yet: UNKNOWN_TOPIC_OR_PARTITION) is retried against the new leader until the
deadline; any other answer is that partition's outcome (OFFSET_OUT_OF_RANGE past the high
watermark, REQUEST_TIMED_OUT when the followers did not follow in time, ...).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import NamedTuple

import grpc

from dataplane.client._admin_transactions import LEADER_ERRORS
from dataplane.client._cluster import Cluster, ClusterSnapshot, rpc_error
from dataplane.client._types import TopicPartition
from protos import broker_pb2 as pb
from raftlog.errors import ErrorCode, KafkaError

DELETE_TO_HIGH_WATERMARK = -1  # Kafka's RecordsToDelete.beforeOffset(-1): up to the high watermark


class DeletedRecords(NamedTuple):
    """A partition's outcome: its new low watermark (the lowest log start offset of its
    replicas), or the error (then ``low_watermark`` is -1)."""

    low_watermark: int
    error: KafkaError | None = None


def delete_records(
    cluster: Cluster,
    offsets: Mapping[TopicPartition, int],
    closed: threading.Event,
    timeout_s: float,
) -> dict[TopicPartition, DeletedRecords]:
    """Move each partition's log start offset to its offset (-1: the high watermark)."""
    pending = sorted(offsets)
    deadline = time.monotonic() + timeout_s
    cluster.refresh({tp.topic for tp in pending})
    result: dict[TopicPartition, DeletedRecords] = {}
    last: dict[TopicPartition, KafkaError] = {}
    while pending:
        snapshot = cluster.snapshot()
        by_leader: dict[str, list[TopicPartition]] = {}
        for tp in pending:
            if _unknown(snapshot, tp):  # Kafka's AdminClient fails it from the metadata
                missing = KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {tp}")
                result[tp] = DeletedRecords(-1, missing)
                continue
            leader = snapshot.leader(tp.topic, tp.partition)
            if leader is None:
                last[tp] = KafkaError(ErrorCode.LEADER_NOT_AVAILABLE, f"{tp}: no leader known")
                continue
            by_leader.setdefault(leader.address, []).append(tp)
        for address, tps in by_leader.items():
            remaining_s = max(0.001, deadline - time.monotonic())
            answers = _delete_at(cluster, address, {tp: offsets[tp] for tp in tps}, remaining_s)
            for tp, outcome in answers.items():
                if outcome.error is not None and outcome.error.error in LEADER_ERRORS:
                    last[tp] = outcome.error
                else:
                    result[tp] = outcome
        pending = [tp for tp in pending if tp not in result]
        if not pending or time.monotonic() >= deadline or closed.is_set():
            break
        closed.wait(min(cluster.backoff_s(), max(0.0, deadline - time.monotonic())))
        cluster.refresh()
    for tp in pending:
        failure = last.get(tp) or KafkaError(ErrorCode.REQUEST_TIMED_OUT, f"{tp}: no answer")
        result[tp] = DeletedRecords(-1, failure)
    return result


def _unknown(snapshot: ClusterSnapshot, tp: TopicPartition) -> bool:
    """The metadata says the topic does not exist, or has fewer partitions."""
    info = snapshot.topics.get(tp.topic)
    if info is None:
        return False  # not asked about yet: the next refresh tells
    if info.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return True
    return info.error is ErrorCode.NONE and not 0 <= tp.partition < len(info.partitions)


def _delete_at(
    cluster: Cluster, address: str, offsets: Mapping[TopicPartition, int], timeout_s: float
) -> dict[TopicPartition, DeletedRecords]:
    by_topic: dict[str, list[pb.DeleteRecordsPartition]] = {}
    for tp, offset in offsets.items():
        by_topic.setdefault(tp.topic, []).append(
            pb.DeleteRecordsPartition(partition=tp.partition, offset=offset)
        )
    request = pb.DeleteRecordsRequest(
        topics=[pb.DeleteRecordsTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
        timeout_ms=int(timeout_s * 1000),
    )
    try:
        # the broker waits up to timeout_ms for the followers: a little more for the answer
        response = cluster.stub(address).DeleteRecords(request, timeout=timeout_s + 5)
    except grpc.RpcError as error:
        failure = rpc_error(error, f"DeleteRecords to {address}")
        return dict.fromkeys(offsets, DeletedRecords(-1, failure))
    outcomes: dict[TopicPartition, DeletedRecords] = {}
    for topic in response.topics:
        for answer in topic.partitions:
            tp = TopicPartition(topic.name, answer.partition)
            refused = None
            if answer.error_code:
                code = ErrorCode.from_code(answer.error_code)
                refused = KafkaError(code, answer.error_message or f"{tp}: {code.name}")
            outcomes[tp] = DeletedRecords(answer.low_watermark, refused)
    return outcomes
