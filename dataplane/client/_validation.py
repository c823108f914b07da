"""The consumer's position validation after a leader change (KIP-320), as Kafka 4's consumer.

A position remembers the leader epoch of the record before it (``offset_epoch``, Kafka's
``FetchPosition.offsetEpoch``: the epoch of the last record consumed, or of a committed
offset) and the leader epoch it was last fetched under. When the partition's leader epoch in
the metadata differs from the latter (a metadata refresh after NOT_LEADER_OR_FOLLOWER,
FENCED_LEADER_EPOCH, a lost broker...), the partition is not fetched until the new leader
answered OffsetForLeaderEpoch for ``offset_epoch``: the offset where that epoch ends in its log.
An end below the position means the log was truncated under the consumer (an unclean leader
election: records it read are gone and others will take their offsets).
:func:`validation_outcome` is Kafka's ``SubscriptionState.maybeCompleteValidation``:

* the end offset is at or above the position: the position stands;
* the end offset is below it: with ``auto.offset.reset`` earliest/latest the position moves
  back to that end offset (the first offset known to diverge, validated); with ``none``
  :class:`LogTruncationError` is raised from ``poll``, carrying that divergent offset;
* the leader knows no such epoch (-1, -1: the epoch is older than its log): with a reset
  policy the position is reset by it, with ``none`` :class:`LogTruncationError` without an
  offset.

A position set by ``seek`` or by an offset reset has no epoch and is not validated (Kafka's
too). A broker without the RPC (gRPC UNIMPLEMENTED) lets the position stand, as Kafka's
consumer skips validation with a broker too old for the API.

The consumer fetches with ``current_leader_epoch`` and no ``last_fetched_epoch``: Kafka 4's
consumer also validates with OffsetsForLeaderEpoch and does not use the Fetch diverging-epoch
answer, which is for followers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import grpc

from dataplane.client._cluster import Cluster, rpc_error
from dataplane.client._types import OffsetAndMetadata, TopicPartition
from protos import broker_pb2 as pb
from raftlog.epoch import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from raftlog.errors import ErrorCode, KafkaError

__all__ = ["LogTruncationError", "Outcome", "ValidationRequest", "validate", "validation_outcome"]
log = logging.getLogger(__name__)


class LogTruncationError(KafkaError):
    """The log was truncated below the consumer's position and ``auto.offset.reset`` is
    none (Kafka's ``LogTruncationException``, an OFFSET_OUT_OF_RANGE): ``divergent_offset`` is
    where the consumer's log and the leader's part (None when the leader cannot say). Seek to
    go on."""

    def __init__(
        self, tp: TopicPartition, position: int, divergent_offset: OffsetAndMetadata | None
    ) -> None:
        where = "" if divergent_offset is None else f" from offset {divergent_offset.offset}"
        super().__init__(
            ErrorCode.OFFSET_OUT_OF_RANGE,
            f"{tp}: the log was truncated{where} below the position {position} "
            "(an unclean leader election?) and auto.offset.reset is none",
        )
        self.tp = tp
        self.position = position
        self.divergent_offset = divergent_offset


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to do with a validated position: ``kind`` "valid" (it stands), "seek" (to
    ``offset``, whose record before is of ``offset_epoch``), "reset" (by auto.offset.reset) or
    "truncated" (raise ``error``)."""

    kind: Literal["valid", "seek", "reset", "truncated"]
    offset: int = -1
    offset_epoch: int = UNDEFINED_EPOCH
    error: LogTruncationError | None = None


def validation_outcome(
    tp: TopicPartition,
    position: int,
    end_epoch: int,
    end_offset: int,
    reset_policy: Literal["earliest", "latest", "none"],
) -> Outcome:
    """Kafka's ``SubscriptionState.maybeCompleteValidation`` for one answer."""
    if end_offset == UNDEFINED_EPOCH_OFFSET or end_epoch == UNDEFINED_EPOCH:
        if reset_policy != "none":
            return Outcome("reset")
        return Outcome("truncated", error=LogTruncationError(tp, position, None))
    if end_offset < position:
        if reset_policy != "none":
            return Outcome("seek", offset=end_offset, offset_epoch=end_epoch)
        divergent = OffsetAndMetadata(end_offset, "", end_epoch)
        return Outcome("truncated", error=LogTruncationError(tp, position, divergent))
    return Outcome("valid")


@dataclass(frozen=True, slots=True)
class ValidationRequest:
    position: int
    offset_epoch: int  # the epoch whose end offset is asked for
    current_leader_epoch: int  # the leader's epoch in the metadata


def validate(
    cluster: Cluster,
    address: str,
    requests: Mapping[TopicPartition, ValidationRequest],
    reset_policy: Literal["earliest", "latest", "none"],
    timeout_s: float,
) -> dict[TopicPartition, Outcome]:
    """Ask the leader at ``address`` and decide each partition it answered without error.
    A partition with a retriable error (the leader moved again) is left out after the
    metadata is invalidated: it is validated again after the refresh. Raises a
    non-retriable error."""
    topics: dict[str, list[pb.OffsetForLeaderEpochPartition]] = {}
    for tp, asked in requests.items():
        topics.setdefault(tp.topic, []).append(
            pb.OffsetForLeaderEpochPartition(
                partition=tp.partition,
                current_leader_epoch=asked.current_leader_epoch,
                leader_epoch=asked.offset_epoch,
            )
        )
    request = pb.OffsetForLeaderEpochRequest(
        topics=[pb.OffsetForLeaderEpochTopic(name=t, partitions=ps) for t, ps in topics.items()]
    )
    try:
        response = cluster.stub(address).OffsetForLeaderEpoch(request, timeout=timeout_s)
    except grpc.RpcError as error:
        if isinstance(error, grpc.Call) and error.code() is grpc.StatusCode.UNIMPLEMENTED:
            log.info("%s does not serve OffsetForLeaderEpoch: positions not validated", address)
            return {tp: Outcome("valid") for tp in requests}
        failure = rpc_error(error, f"OffsetForLeaderEpoch to {address}")
        if not failure.retriable:
            raise failure from error
        cluster.invalidate()
        return {}
    outcomes: dict[TopicPartition, Outcome] = {}
    for topic in response.topics:
        for answer in topic.partitions:
            tp = TopicPartition(topic.name, answer.partition)
            sent = requests.get(tp)
            if sent is None:
                continue
            code = ErrorCode.from_code(answer.error_code)
            if code is not ErrorCode.NONE:
                if not code.retriable:
                    raise KafkaError(code, f"OffsetForLeaderEpoch {tp}: {answer.error_message}")
                cluster.invalidate()  # the leader moved again, or is not yet known as leader
                continue
            outcome = validation_outcome(
                tp, sent.position, answer.leader_epoch, answer.end_offset, reset_policy
            )
            if outcome.kind != "valid":
                log.warning(
                    "%s: truncation detected at offset %d (epoch %d ends at %d on the leader): %s",
                    tp, sent.position, sent.offset_epoch, answer.end_offset, outcome.kind,
                )  # fmt: skip
            outcomes[tp] = outcome
    return outcomes
