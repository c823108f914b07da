"""The transaction APIs of the KAFKA listener: Kafka's requests turned into the gRPC services'.

A transactional Kafka client (librdkafka, kafka-python, aiokafka, the Java client) finds its
transaction coordinator with FindCoordinator key_type 1 (dataplane/kafka/groups.py passes the key
type on), then sends it InitProducerId with its transactional id (the listener's InitProducerId),
AddPartitionsToTxn, AddOffsetsToTxn and EndTxn; TxnOffsetCommit goes to the group's coordinator.
Each is served by the same servicer gRPC clients reach (`TransactionCoordinatorService`,
`GroupCoordinatorService.TxnOffsetCommit`, `BrokerService.DescribeProducers` and
`WriteTxnMarkers`), so the two front doors cannot disagree. What is translated here is only the
shape: Kafka's versions (AddPartitionsToTxn v4 batches transactions, KIP-890's verify_only),
its field names, and where it puts an error that concerns a whole request (in every partition for
the versions that have no top-level error).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any, Protocol

from dataplane.broker.service import BrokerServicer
from dataplane.coordinator.group_coordinator import GroupServicer
from dataplane.kafka import codec as kc
from protos import broker_pb2 as pb
from protos import group_pb2 as gpb
from protos import transaction_pb2 as tpb

ADD_PARTITIONS_BATCHED_VERSION = 4  # AddPartitionsToTxn v4+: many transactions, verify_only
NO_START = datetime.datetime.fromtimestamp(-0.001, datetime.UTC)  # Kafka's -1: none open


class TransactionServices(Protocol):
    """What the transaction coordinator's gRPC servicer answers (TransactionCoordinatorService)."""

    def AddPartitionsToTxn(
        self, request: tpb.AddPartitionsToTxnRequest, context: Any
    ) -> tpb.AddPartitionsToTxnResponse: ...

    def AddOffsetsToTxn(
        self, request: tpb.AddOffsetsToTxnRequest, context: Any
    ) -> tpb.AddOffsetsToTxnResponse: ...

    def EndTxn(self, request: tpb.EndTxnRequest, context: Any) -> tpb.EndTxnResponse: ...

    def DescribeTransactions(
        self, request: tpb.DescribeTransactionsRequest, context: Any
    ) -> tpb.DescribeTransactionsResponse: ...

    def ListTransactions(
        self, request: tpb.ListTransactionsRequest, context: Any
    ) -> tpb.ListTransactionsResponse: ...


class KafkaTransactions:
    """Transaction requests of the KAFKA listener."""

    def __init__(
        self,
        transactions: TransactionServices,
        groups: GroupServicer,
        broker: BrokerServicer,
        call: Callable[[], Any],
    ) -> None:
        self.transactions = transactions
        self.groups = groups
        self.broker = broker
        self.call = call

    def handlers(self) -> dict[int, Callable[[kc.Request], kc.Data]]:
        return {
            kc.API_ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            kc.API_ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn,
            kc.API_END_TXN: self.end_txn,
            kc.API_WRITE_TXN_MARKERS: self.write_txn_markers,
            kc.API_TXN_OFFSET_COMMIT: self.txn_offset_commit,
            kc.API_DESCRIBE_PRODUCERS: self.describe_producers,
            kc.API_DESCRIBE_TRANSACTIONS: self.describe_transactions,
            kc.API_LIST_TRANSACTIONS: self.list_transactions,
        }

    # -- AddPartitionsToTxn -----------------------------------------------------------------------
    def add_partitions_to_txn(self, request: kc.Request) -> kc.Data:
        body = request.body
        if request.api_version >= ADD_PARTITIONS_BATCHED_VERSION:
            results = [
                {
                    "transactional_id": txn.transactional_id,
                    "topic_results": self._add_partitions(
                        txn.transactional_id,
                        txn.producer_id,
                        txn.producer_epoch,
                        txn.topics,
                        verify_only=txn.verify_only,
                    ),
                }
                for txn in body.transactions
            ]
            return {"throttle_time": 0, "error_code": 0, "results_by_transaction": results}
        topics = self._add_partitions(
            body.v3_and_below_transactional_id,
            body.v3_and_below_producer_id,
            body.v3_and_below_producer_epoch,
            body.v3_and_below_topics,
            verify_only=False,
        )
        return {"throttle_time": 0, "results_by_topic_v3_and_below": topics}

    def _add_partitions(
        self, transactional_id: str, producer_id: int, epoch: int, topics: Any, *, verify_only: bool
    ) -> list[kc.Data]:
        answer = self.transactions.AddPartitionsToTxn(
            tpb.AddPartitionsToTxnRequest(
                transactional_id=transactional_id,
                producer_id=producer_id,
                producer_epoch=epoch,
                topics=[tpb.TopicPartitions(topic=t.name, partitions=t.partitions) for t in topics],
                verify_only=verify_only,
            ),
            self.call(),
        )
        codes = {(r.topic, r.partition): r.error_code for r in answer.results}
        return [
            {
                "name": t.name,
                "results_by_partition": [
                    {
                        "partition_index": p,
                        "partition_error_code": codes.get((t.name, p), answer.error_code),
                    }
                    for p in t.partitions
                ],
            }
            for t in topics
        ]

    # -- AddOffsetsToTxn / EndTxn ------------------------------------------------------------------
    def add_offsets_to_txn(self, request: kc.Request) -> kc.Data:
        body = request.body
        answer = self.transactions.AddOffsetsToTxn(
            tpb.AddOffsetsToTxnRequest(
                transactional_id=body.transactional_id, producer_id=body.producer_id,
                producer_epoch=body.producer_epoch, group_id=body.group_id,
            ),
            self.call(),
        )  # fmt: skip
        return {"throttle_time": 0, "error_code": answer.error_code}

    def end_txn(self, request: kc.Request) -> kc.Data:
        body = request.body
        answer = self.transactions.EndTxn(
            tpb.EndTxnRequest(
                transactional_id=body.transactional_id, producer_id=body.producer_id,
                producer_epoch=body.producer_epoch, committed=body.committed,
            ),
            self.call(),
        )  # fmt: skip
        return {"throttle_time": 0, "error_code": answer.error_code}

    # -- WriteTxnMarkers (what a coordinator sends partition leaders) ---------------------------
    def write_txn_markers(self, request: kc.Request) -> kc.Data:
        answer = self.broker.WriteTxnMarkers(
            pb.WriteTxnMarkersRequest(
                markers=[
                    pb.TxnMarker(
                        producer_id=m.producer_id,
                        producer_epoch=m.producer_epoch,
                        committed=m.transaction_result,
                        coordinator_epoch=m.coordinator_epoch,
                        topics=[
                            pb.TxnMarkerTopic(name=t.name, partitions=t.partition_indexes)
                            for t in m.topics
                        ],
                    )
                    for m in request.body.markers
                ]
            ),
            self.call(),
        )
        return {
            "markers": [
                {
                    "producer_id": m.producer_id,
                    "topics": [
                        {
                            "name": t.name,
                            "partitions": [
                                {"partition_index": p.partition, "error_code": p.error_code}
                                for p in t.partitions
                            ],
                        }
                        for t in m.topics
                    ],
                }
                for m in answer.markers
            ]
        }

    # -- TxnOffsetCommit ------------------------------------------------------------------------
    def txn_offset_commit(self, request: kc.Request) -> kc.Data:
        body = request.body
        answer = self.groups.TxnOffsetCommit(
            gpb.TxnOffsetCommitRequest(
                transactional_id=body.transactional_id,
                group_id=body.group_id,
                producer_id=body.producer_id,
                producer_epoch=body.producer_epoch,
                generation_id=kc.field(body, "generation_id", -1),
                member_id=kc.field(body, "member_id", ""),
                group_instance_id=kc.field(body, "group_instance_id") or "",
                topics=[
                    gpb.OffsetCommitTopic(
                        name=topic.name,
                        partitions=[
                            gpb.OffsetCommitPartition(
                                partition=p.partition_index,
                                committed_offset=p.committed_offset,
                                committed_leader_epoch=kc.field(p, "committed_leader_epoch", -1),
                                metadata=p.committed_metadata or "",
                            )
                            for p in topic.partitions
                        ],
                    )
                    for topic in body.topics
                ],
            ),
            self.call(),
        )
        return {
            "throttle_time": 0,
            "topics": [
                {
                    "name": topic.name,
                    "partitions": [
                        {
                            "partition_index": p.partition,
                            "error_code": p.error_code or answer.error_code,
                        }
                        for p in topic.partitions
                    ],
                }
                for topic in answer.topics
            ],
        }

    # -- DescribeProducers / DescribeTransactions / ListTransactions -------------------------------
    def describe_producers(self, request: kc.Request) -> kc.Data:
        answer = self.broker.DescribeProducers(
            pb.DescribeProducersRequest(
                topics=[
                    pb.DescribeProducersTopic(name=t.name, partitions=t.partition_indexes)
                    for t in request.body.topics
                ]
            ),
            self.call(),
        )
        return {
            "throttle_time": 0,
            "topics": [
                {
                    "name": t.name,
                    "partitions": [
                        {
                            "partition_index": p.partition,
                            "error_code": p.error_code,
                            "error_message": p.error_message or None,
                            "active_producers": [
                                {
                                    "producer_id": s.producer_id,
                                    "producer_epoch": s.producer_epoch,
                                    "last_sequence": s.last_sequence,
                                    "last_timestamp": s.last_timestamp,
                                    "coordinator_epoch": s.coordinator_epoch,
                                    "current_txn_start_offset": s.current_txn_start_offset,
                                }
                                for s in p.active_producers
                            ],
                        }
                        for p in t.partitions
                    ],
                }
                for t in answer.topics
            ],
        }

    def describe_transactions(self, request: kc.Request) -> kc.Data:
        answer = self.transactions.DescribeTransactions(
            tpb.DescribeTransactionsRequest(transactional_ids=list(request.body.transactional_ids)),
            self.call(),
        )
        return {
            "throttle_time": 0,
            "transaction_states": [
                {
                    "error_code": t.error_code,
                    "transactional_id": t.transactional_id,
                    "transaction_state": t.state,
                    "transaction_timeout": t.transaction_timeout_ms,
                    "transaction_start_time": _start_time(t.transaction_start_ms),
                    "producer_id": t.producer_id,
                    "producer_epoch": t.producer_epoch,
                    "topics": [
                        {"topic": tp.topic, "partitions": list(tp.partitions)} for tp in t.topics
                    ],
                }
                for t in answer.transactions
            ],
        }

    def list_transactions(self, request: kc.Request) -> kc.Data:
        body = request.body
        answer = self.transactions.ListTransactions(
            tpb.ListTransactionsRequest(
                state_filters=list(body.state_filters),
                producer_id_filters=list(body.producer_id_filters),
                duration_filter_ms=max(kc.field(body, "duration_filter", -1), 0),
            ),
            self.call(),
        )
        return {
            "throttle_time": 0,
            "error_code": answer.error_code,
            "unknown_state_filters": list(answer.unknown_state_filters),
            "transaction_states": [
                {
                    "transactional_id": t.transactional_id,
                    "producer_id": t.producer_id,
                    "transaction_state": t.state,
                }
                for t in answer.transactions
            ],
        }


def _start_time(millis: int) -> datetime.datetime:
    """DescribeTransactions' start time: not nullable in Kafka's schema, -1 while none is open."""
    if millis < 0:
        return NO_START
    return datetime.datetime.fromtimestamp(millis / 1000, datetime.UTC)
