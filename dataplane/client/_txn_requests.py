"""The transactional producer's requests to its coordinators (the IO beside
:mod:`dataplane.client._transactions`).

InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn go to the transaction
coordinator of the transactional id (FindCoordinator with key_type 1), TxnOffsetCommit to the
group's coordinator. Each call follows its coordinator when it moves (``GroupClient``) and
retries retriable answers (CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS, ...) with
backoff until its deadline, then raises :class:`ProducerTimeoutError` and leaves the state as
it was, so the application may call again. A fatal or abortable answer moves the
:class:`TransactionManager` to its error state and raises the error it keeps.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from dataplane.client._accumulator import ProducerTimeoutError
from dataplane.client._cluster import Cluster
from dataplane.client._group import TRANSACTION_KEY, GroupClient, commit_request
from dataplane.client._transactions import TransactionManager, classify
from dataplane.client._types import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition
from protos import broker_pb2 as pb
from protos import group_pb2 as gpb
from protos import transaction_pb2 as tpb
from raftlog.errors import ErrorCode, KafkaError

__all__ = ["TransactionalRequests"]
log = logging.getLogger(__name__)
# CONCURRENT_TRANSACTIONS means the previous transaction's markers are still being written:
# Kafka's client retries AddPartitionsToTxn after 20 ms rather than its full backoff
CONCURRENT_RETRY_S = 0.02


class TransactionalRequests:
    def __init__(
        self,
        cluster: Cluster,
        manager: TransactionManager,
        closed: threading.Event,
        clock: Callable[[], float],
    ) -> None:
        self._cluster = cluster
        self._manager = manager
        self._closed = closed
        self._clock = clock
        self._coordinator = GroupClient(
            cluster, manager.transactional_id, closed, clock, key_type=TRANSACTION_KEY
        )

    # -- the retry loop ----------------------------------------------------------------------
    def _call(
        self,
        client: GroupClient,
        method: str,
        request: Any,
        deadline: float,
        stub_of: Callable[[str], Any],
        errors_of: Callable[[Any], list[tuple[ErrorCode, str]]],
    ) -> Any:
        """``method`` until it succeeds or ``deadline``. ``errors_of(response)``: the codes it
        carries (top level and per item); the worst decides."""
        while True:
            remaining = deadline - self._clock()
            try:
                response = client.call(
                    method, request, max(0.001, remaining), lambda r: r, stub_of=stub_of
                )
            except KafkaError as error:
                if not error.retriable:
                    raise self._manager.fail(error, classify(error.error)) from error
                last = error
            else:
                failures = [(code, message) for code, message in errors_of(response) if code.code]
                if not failures:
                    return response
                severities = [classify(code) for code, _ in failures]
                for severity in ("fatal", "abortable"):
                    if severity in severities:
                        code, message = failures[severities.index(severity)]
                        raise self._manager.fail(KafkaError(code, f"{method}: {message}"), severity)
                code, message = failures[0]
                last = KafkaError(code, f"{method}: {message}")
            left = deadline - self._clock()
            if left <= 0 or self._closed.is_set():
                raise ProducerTimeoutError(f"{method} did not succeed in time; last error {last}")
            pause = (
                CONCURRENT_RETRY_S
                if last.error is ErrorCode.CONCURRENT_TRANSACTIONS
                else self._cluster.backoff_s()
            )
            self._closed.wait(min(pause, left))

    def _transactional(self, method: str, request: Any, deadline: float) -> Any:
        return self._call(
            self._coordinator,
            method,
            request,
            deadline,
            self._cluster.transaction_stub,
            lambda r: [(ErrorCode.from_code(r.error_code), r.error_message)],
        )

    # -- the requests ------------------------------------------------------------------------
    def init_producer_id(self, deadline: float, *, bump: bool = False) -> tuple[int, int]:
        """A producer id and epoch for the transactional id: a new epoch fences every older
        producer of the id and aborts its open transaction. ``bump``: KIP-360, present the
        current id and epoch (after an abort whose batches failed)."""
        manager = self._manager
        request = pb.InitProducerIdRequest(
            transactional_id=manager.transactional_id,
            transaction_timeout_ms=manager.transaction_timeout_ms,
        )
        if bump:
            request.producer_id, request.producer_epoch = manager.producer_id_and_epoch()
        response = self._call(
            self._coordinator,
            "InitProducerId",
            request,
            deadline,
            self._cluster.stub,
            lambda r: [(ErrorCode.from_code(r.error_code), r.error_message)],
        )
        return response.producer_id, response.producer_epoch

    def add_partitions(self, partitions: list[TopicPartition], deadline: float) -> None:
        """AddPartitionsToTxn for ``partitions`` (the sender thread, before their first
        batches)."""
        producer_id, producer_epoch = self._manager.producer_id_and_epoch()
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = tpb.AddPartitionsToTxnRequest(
            transactional_id=self._manager.transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            topics=[tpb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()],
        )
        self._call(
            self._coordinator,
            "AddPartitionsToTxn",
            request,
            deadline,
            self._cluster.transaction_stub,
            lambda r: (
                [(ErrorCode.from_code(r.error_code), r.error_message)]
                + [
                    (ErrorCode.from_code(p.error_code), f"{p.topic}-{p.partition}")
                    for p in r.results
                ]
            ),
        )

    def add_offsets(self, group_id: str, deadline: float) -> None:
        producer_id, producer_epoch = self._manager.producer_id_and_epoch()
        request = tpb.AddOffsetsToTxnRequest(
            transactional_id=self._manager.transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            group_id=group_id,
        )
        self._transactional("AddOffsetsToTxn", request, deadline)

    def txn_offset_commit(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
        group: ConsumerGroupMetadata,
        deadline: float,
    ) -> None:
        """The offsets to the group's coordinator, pending until the transaction's marker."""
        producer_id, producer_epoch = self._manager.producer_id_and_epoch()
        topics = commit_request(group.group_id, group.member_id, -1, offsets).topics
        request = gpb.TxnOffsetCommitRequest(
            transactional_id=self._manager.transactional_id,
            group_id=group.group_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            generation_id=group.generation_id,
            member_id=group.member_id,
            group_instance_id=group.group_instance_id or "",
            topics=topics,
        )
        client = GroupClient(self._cluster, group.group_id, self._closed, self._clock)
        self._call(
            client,
            "TxnOffsetCommit",
            request,
            deadline,
            self._cluster.group_stub,
            lambda r: (
                [(ErrorCode.from_code(r.error_code), r.error_message)]
                + [
                    (
                        ErrorCode.from_code(p.error_code),
                        f"{t.name}-{p.partition}: {p.error_message}",
                    )
                    for t in r.topics
                    for p in t.partitions
                ]
            ),
        )

    def end_txn(self, committed: bool, deadline: float) -> None:
        producer_id, producer_epoch = self._manager.producer_id_and_epoch()
        request = tpb.EndTxnRequest(
            transactional_id=self._manager.transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            committed=committed,
        )
        self._transactional("EndTxn", request, deadline)
