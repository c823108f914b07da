"""In-process fakes of the SERVER side a transactional client talks to: the transaction
coordinator (TransactionCoordinatorService + InitProducerId with a transactional id) and the
group coordinator's FindCoordinator and TxnOffsetCommit, beside the fake brokers of
``tests.dataplane.fake_broker``.

The model is Kafka's coordinator in a few lines: per transactional id a producer id, an epoch
and a state; InitProducerId bumps the epoch (fencing older producers, aborting an open
transaction; KIP-360: the current id and epoch may be presented to bump it), every other call
checks the epoch (an older one is PRODUCER_FENCED), EndTxn needs an open transaction
(INVALID_TXN_STATE otherwise; a repeat of the end that completed it succeeds, as Kafka's).
Tests inject one-shot errors per method and read what was asked.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc

from protos import broker_pb2 as pb
from protos import broker_pb2_grpc as pb_grpc
from protos import group_pb2 as gpb
from protos import group_pb2_grpc as gpb_grpc
from protos import transaction_pb2 as tpb
from protos import transaction_pb2_grpc as tpb_grpc
from raftlog.errors import ErrorCode
from tests.dataplane.fake_broker import FakeBroker, FakeCluster


@dataclass
class FakeTxn:
    producer_id: int
    producer_epoch: int = 0
    state: str = "Empty"
    partitions: set[tuple[str, int]] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)


@dataclass
class Ended:
    transactional_id: str
    committed: bool
    partitions: frozenset[tuple[str, int]]
    groups: frozenset[str]


class FakeCoordinator:
    """The transaction and group coordinator of every key, on broker 1."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.lock = threading.Lock()
        self.txns: dict[str, FakeTxn] = {}
        self.next_producer_id = 5000
        self.injected: dict[str, list[ErrorCode]] = {}  # method -> next answers
        self.calls: list[tuple[str, object]] = []  # (method, request) in arrival order
        self.ended: list[Ended] = []
        self.offset_commits: list[gpb.TxnOffsetCommitRequest] = []

    def inject(self, method: str, *codes: ErrorCode) -> None:
        with self.lock:
            self.injected.setdefault(method, []).extend(codes)

    def methods(self) -> list[str]:
        with self.lock:
            return [method for method, _ in self.calls]

    def _enter(self, method: str, request: object) -> ErrorCode:
        """Record the call; the injected error to answer, if any (the lock is held)."""
        self.calls.append((method, request))
        queued = self.injected.get(method)
        return queued.pop(0) if queued else ErrorCode.NONE

    def _fenced(self, transactional_id: str, producer_id: int, epoch: int) -> ErrorCode:
        txn = self.txns.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if epoch < txn.producer_epoch:
            return ErrorCode.PRODUCER_FENCED
        return ErrorCode.NONE

    def init(self, request: pb.InitProducerIdRequest) -> pb.InitProducerIdResponse:
        with self.lock:
            error = self._enter("InitProducerId", request)
            if error is not ErrorCode.NONE:
                return pb.InitProducerIdResponse(error_code=error.code, error_message="injected")
            txn = self.txns.get(request.transactional_id)
            if txn is None:
                txn = self.txns[request.transactional_id] = FakeTxn(self.next_producer_id)
                self.next_producer_id += 1
            else:
                if request.HasField("producer_epoch") and (
                    request.producer_id != txn.producer_id
                    or request.producer_epoch != txn.producer_epoch
                ):
                    return pb.InitProducerIdResponse(error_code=ErrorCode.PRODUCER_FENCED.code)
                if txn.state == "Ongoing":
                    self._end(request.transactional_id, txn, committed=False)
                txn.producer_epoch += 1
            txn.state = "Empty"
            return pb.InitProducerIdResponse(
                producer_id=txn.producer_id, producer_epoch=txn.producer_epoch
            )

    def _end(self, transactional_id: str, txn: FakeTxn, committed: bool) -> None:
        self.ended.append(
            Ended(transactional_id, committed, frozenset(txn.partitions), frozenset(txn.groups))
        )
        txn.partitions.clear()
        txn.groups.clear()
        txn.state = "CompleteCommit" if committed else "CompleteAbort"


class FakeTxnBroker(FakeBroker):
    """A fake broker whose InitProducerId with a transactional id goes to the coordinator."""

    def __init__(self, cluster: FakeCluster, node_id: int, coordinator: FakeCoordinator) -> None:
        super().__init__(cluster, node_id)
        self.coordinator = coordinator

    def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: grpc.ServicerContext
    ) -> pb.InitProducerIdResponse:
        if not request.transactional_id:
            return super().InitProducerId(request, context)
        if self.node_id != 1:
            return pb.InitProducerIdResponse(error_code=ErrorCode.NOT_COORDINATOR.code)
        return self.coordinator.init(request)


class FakeTransactionService(tpb_grpc.TransactionCoordinatorServiceServicer):
    def __init__(self, coordinator: FakeCoordinator) -> None:
        self.c = coordinator

    def AddPartitionsToTxn(
        self, request: tpb.AddPartitionsToTxnRequest, context: grpc.ServicerContext
    ) -> tpb.AddPartitionsToTxnResponse:
        c = self.c
        with c.lock:
            error = c._enter("AddPartitionsToTxn", request)
            if error is ErrorCode.NONE:
                error = c._fenced(
                    request.transactional_id, request.producer_id, request.producer_epoch
                )
            wanted = [(t.topic, p) for t in request.topics for p in t.partitions]
            if error is ErrorCode.NONE:
                txn = c.txns[request.transactional_id]
                txn.partitions.update(wanted)
                txn.state = "Ongoing"
            return tpb.AddPartitionsToTxnResponse(
                error_code=error.code,
                results=[
                    tpb.PartitionResult(topic=t, partition=p, error_code=error.code)
                    for t, p in wanted
                ],
            )

    def AddOffsetsToTxn(
        self, request: tpb.AddOffsetsToTxnRequest, context: grpc.ServicerContext
    ) -> tpb.AddOffsetsToTxnResponse:
        c = self.c
        with c.lock:
            error = c._enter("AddOffsetsToTxn", request)
            if error is ErrorCode.NONE:
                error = c._fenced(
                    request.transactional_id, request.producer_id, request.producer_epoch
                )
            if error is ErrorCode.NONE:
                txn = c.txns[request.transactional_id]
                txn.groups.add(request.group_id)
                txn.state = "Ongoing"
            return tpb.AddOffsetsToTxnResponse(error_code=error.code)

    def EndTxn(
        self, request: tpb.EndTxnRequest, context: grpc.ServicerContext
    ) -> tpb.EndTxnResponse:
        c = self.c
        with c.lock:
            error = c._enter("EndTxn", request)
            if error is ErrorCode.NONE:
                error = c._fenced(
                    request.transactional_id, request.producer_id, request.producer_epoch
                )
            txn = c.txns.get(request.transactional_id)
            repeat = "CompleteCommit" if request.committed else "CompleteAbort"
            if error is ErrorCode.NONE and txn is not None and txn.state == repeat:
                return tpb.EndTxnResponse()  # Kafka: a retry of an end that completed succeeds
            if error is ErrorCode.NONE and (txn is None or txn.state != "Ongoing"):
                error = ErrorCode.INVALID_TXN_STATE
            if error is ErrorCode.NONE and txn is not None:
                c._end(request.transactional_id, txn, request.committed)
            return tpb.EndTxnResponse(error_code=error.code)

    def DescribeTransactions(
        self, request: tpb.DescribeTransactionsRequest, context: grpc.ServicerContext
    ) -> tpb.DescribeTransactionsResponse:
        with self.c.lock:
            found = []
            for tid in request.transactional_ids:
                txn = self.c.txns.get(tid)
                if txn is None:
                    found.append(tpb.TransactionDescription(
                        transactional_id=tid,
                        error_code=ErrorCode.TRANSACTIONAL_ID_NOT_FOUND.code,
                    ))  # fmt: skip
                    continue
                by_topic: dict[str, list[int]] = {}
                for topic, partition in sorted(txn.partitions):
                    by_topic.setdefault(topic, []).append(partition)
                found.append(tpb.TransactionDescription(
                    transactional_id=tid, state=txn.state, transaction_timeout_ms=60_000,
                    transaction_start_ms=1000 if txn.state == "Ongoing" else -1,
                    producer_id=txn.producer_id, producer_epoch=txn.producer_epoch,
                    topics=[tpb.TopicPartitions(topic=t, partitions=ps)
                            for t, ps in by_topic.items()],
                ))  # fmt: skip
            return tpb.DescribeTransactionsResponse(transactions=found)

    def ListTransactions(
        self, request: tpb.ListTransactionsRequest, context: grpc.ServicerContext
    ) -> tpb.ListTransactionsResponse:
        with self.c.lock:
            listed = [
                tpb.ListedTransaction(
                    transactional_id=tid, producer_id=txn.producer_id, state=txn.state
                )
                for tid, txn in sorted(self.c.txns.items())
                if not request.state_filters or txn.state in request.state_filters
            ]
        return tpb.ListTransactionsResponse(transactions=listed)


class FakeGroupService(gpb_grpc.GroupCoordinatorServiceServicer):
    def __init__(self, coordinator: FakeCoordinator) -> None:
        self.c = coordinator

    def FindCoordinator(
        self, request: gpb.FindCoordinatorRequest, context: grpc.ServicerContext
    ) -> gpb.FindCoordinatorResponse:
        with self.c.lock:
            self.c.calls.append(("FindCoordinator", request))
        host, port = self.c.cluster.brokers[1].rsplit(":", 1)
        return gpb.FindCoordinatorResponse(
            coordinators=[
                gpb.Coordinator(group_id=key, node_id=1, host=host, port=int(port))
                for key in request.group_ids
            ]
        )

    def TxnOffsetCommit(
        self, request: gpb.TxnOffsetCommitRequest, context: grpc.ServicerContext
    ) -> gpb.OffsetCommitResponse:
        c = self.c
        with c.lock:
            error = c._enter("TxnOffsetCommit", request)
            if error is ErrorCode.NONE:
                c.offset_commits.append(request)
            return gpb.OffsetCommitResponse(
                error_code=error.code,
                topics=[
                    gpb.OffsetCommitTopicResponse(
                        name=t.name,
                        partitions=[
                            gpb.OffsetCommitPartitionResponse(
                                partition=p.partition, error_code=error.code
                            )
                            for p in t.partitions
                        ],
                    )
                    for t in request.topics
                ],
            )


@contextmanager
def fake_txn_brokers(count: int) -> Iterator[tuple[FakeCluster, FakeCoordinator]]:
    """``count`` fake brokers (node ids 1..count); broker 1 is every key's coordinator."""
    cluster = FakeCluster()
    coordinator = FakeCoordinator(cluster)
    servers = []
    try:
        for node_id in range(1, count + 1):
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
            # The fakes serve what a transactional producer asks; the servicers' other methods
            # answer UNIMPLEMENTED (their generated base classes declare them abstract).
            broker = FakeTxnBroker(cluster, node_id, coordinator)
            pb_grpc.add_BrokerServiceServicer_to_server(broker, server)
            tpb_grpc.add_TransactionCoordinatorServiceServicer_to_server(
                FakeTransactionService(coordinator),
                server,
            )
            gpb_grpc.add_GroupCoordinatorServiceServicer_to_server(
                FakeGroupService(coordinator),  # type: ignore[abstract]
                server,
            )
            port = server.add_insecure_port("127.0.0.1:0")
            server.start()
            servers.append(server)
            cluster.brokers[node_id] = f"127.0.0.1:{port}"
        yield cluster, coordinator
    finally:
        for server in servers:
            server.stop(grace=None)
