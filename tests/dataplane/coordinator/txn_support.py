"""Raw-RPC helpers for the transaction coordinator's cluster tests: what a transactional client
does (FindCoordinator with key type 1, InitProducerId, AddPartitionsToTxn, transactional
Produce, EndTxn) and reading a partition's log batch by batch to find the markers, so the
coordinator is tested without ``dataplane.client``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from dataplane.tools.local_cluster import LocalCluster, wait_for
from protos import broker_pb2 as pb
from protos import group_pb2 as gpb
from protos import group_pb2_grpc as gpb_grpc
from protos import transaction_pb2 as tpb
from protos import transaction_pb2_grpc as tpb_grpc
from raftlog.batch import iter_batches
from raftlog.errors import ErrorCode
from raftlog.records import decode_batch, encode_batch
from raftlog.txn import Marker, read_marker
from tests.dataplane.cluster_support import metadata, stub

E = ErrorCode
T = TypeVar("T")
RPC_TIMEOUT_S = 30.0
# what a client retries (after looking the coordinator up again)
RETRIABLE = frozenset({
    E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS,
    E.CONCURRENT_TRANSACTIONS,
})  # fmt: skip
_CHANNELS: dict[str, grpc.Channel] = {}


def _channel(address: str) -> grpc.Channel:
    channel = _CHANNELS.get(address)
    if channel is None:
        channel = _CHANNELS[address] = grpc.insecure_channel(address)
    return channel


def txn_stub(address: str) -> tpb_grpc.TransactionCoordinatorServiceStub:
    return tpb_grpc.TransactionCoordinatorServiceStub(_channel(address))


def live_addresses(cluster: LocalCluster) -> list[str]:
    return [
        cluster.broker_address(s.node_id)
        for s in cluster.specs
        if cluster.pid(s.node_id) is not None
    ]


def find_coordinator(cluster: LocalCluster, tid: str, timeout_s: float = 90) -> str:
    """The address of ``tid``'s transaction coordinator (FindCoordinator, key type 1)."""

    def probe() -> str | None:
        for address in live_addresses(cluster):
            try:
                answer = gpb_grpc.GroupCoordinatorServiceStub(_channel(address)).FindCoordinator(
                    gpb.FindCoordinatorRequest(group_ids=[tid], key_type=1), timeout=5
                )
            except grpc.RpcError:
                continue
            (found,) = answer.coordinators
            if found.error_code == 0:
                return f"{found.host}:{found.port}"
        return None

    result: str = wait_for(f"the coordinator of {tid}", probe, timeout_s)
    return result


def until_answered(
    cluster: LocalCluster, tid: str, call: Callable[[str], T], error_of: Callable[[T], int],
    timeout_s: float = 90,
) -> T:  # fmt: skip
    """``call(coordinator address)`` until its answer is not a retriable coordinator error
    (the coordinator is looked up again each time, as a client does)."""
    deadline = time.monotonic() + timeout_s
    while True:
        address = find_coordinator(cluster, tid, max(deadline - time.monotonic(), 1))
        try:
            answer = call(address)
            if E.from_code(error_of(answer)) not in RETRIABLE:
                return answer
            last: Any = E.from_code(error_of(answer))
        except grpc.RpcError as error:
            last = error
        if time.monotonic() > deadline:
            raise AssertionError(f"{tid}: no answer within {timeout_s} s: {last}")
        time.sleep(0.1)  # a client's retry backoff


@dataclass
class Producer:
    """A transactional producer spoken raw."""

    cluster: LocalCluster
    tid: str
    producer_id: int = -1
    epoch: int = -1

    def init(self, timeout_ms: int = 60_000) -> pb.InitProducerIdResponse:
        request = pb.InitProducerIdRequest(
            transactional_id=self.tid, transaction_timeout_ms=timeout_ms
        )
        answer: pb.InitProducerIdResponse = until_answered(
            self.cluster, self.tid,
            lambda a: stub(a).InitProducerId(request, timeout=RPC_TIMEOUT_S),
            lambda r: r.error_code,
        )  # fmt: skip
        if answer.error_code == 0:
            self.producer_id, self.epoch = answer.producer_id, answer.producer_epoch
        return answer

    def add(
        self, topic: str, *partitions: int, epoch: int | None = None
    ) -> tpb.AddPartitionsToTxnResponse:
        request = tpb.AddPartitionsToTxnRequest(
            transactional_id=self.tid, producer_id=self.producer_id,
            producer_epoch=self.epoch if epoch is None else epoch,
            topics=[tpb.TopicPartitions(topic=topic, partitions=partitions)],
        )  # fmt: skip
        answer: tpb.AddPartitionsToTxnResponse = until_answered(
            self.cluster, self.tid,
            lambda a: txn_stub(a).AddPartitionsToTxn(request, timeout=RPC_TIMEOUT_S),
            lambda r: r.error_code,
        )  # fmt: skip
        return answer

    def end(self, commit: bool, epoch: int | None = None) -> tpb.EndTxnResponse:
        request = tpb.EndTxnRequest(
            transactional_id=self.tid, producer_id=self.producer_id,
            producer_epoch=self.epoch if epoch is None else epoch, committed=commit,
        )  # fmt: skip
        answer: tpb.EndTxnResponse = until_answered(
            self.cluster, self.tid,
            lambda a: txn_stub(a).EndTxn(request, timeout=RPC_TIMEOUT_S),
            lambda r: r.error_code,
        )  # fmt: skip
        return answer

    def send(
        self,
        topic: str,
        partition: int,
        values: list[bytes],
        sequence: int,
        epoch: int | None = None,
    ) -> pb.ProducePartitionResponse:
        """A transactional batch to the partition's leader (acks=all)."""
        now_ms = int(time.time() * 1000)
        batch = encode_batch(
            [(None, v, now_ms, ()) for v in values], producer_id=self.producer_id,
            producer_epoch=self.epoch if epoch is None else epoch, base_sequence=sequence,
            is_transactional=True,
        )  # fmt: skip
        request = pb.ProduceRequest(
            acks=-1, timeout_ms=10_000, transactional_id=self.tid,
            topics=[pb.ProduceTopic(name=topic, partitions=[
                pb.ProducePartition(partition=partition, records=batch)])],
        )  # fmt: skip

        def produced() -> pb.ProducePartitionResponse | None:
            try:
                response = stub(leader_address(self.cluster, topic, partition)).Produce(
                    request, timeout=RPC_TIMEOUT_S
                )
            except grpc.RpcError:
                return None
            result: pb.ProducePartitionResponse = response.topics[0].partitions[0]
            retry = E.from_code(result.error_code) in (
                E.NOT_LEADER_OR_FOLLOWER,
                E.NOT_ENOUGH_REPLICAS,
            )
            return None if retry else result

        result: pb.ProducePartitionResponse = wait_for(
            f"a batch to {topic}-{partition}", produced, 60
        )
        return result

    def describe(self) -> tpb.TransactionDescription:
        request = tpb.DescribeTransactionsRequest(transactional_ids=[self.tid])
        answer: tpb.DescribeTransactionsResponse = until_answered(
            self.cluster, self.tid,
            lambda a: txn_stub(a).DescribeTransactions(request, timeout=RPC_TIMEOUT_S),
            lambda r: r.transactions[0].error_code,
        )  # fmt: skip
        return answer.transactions[0]

    def wait_state(self, state: str, timeout_s: float = 90) -> tpb.TransactionDescription:
        def reached() -> tpb.TransactionDescription | None:
            described = self.describe()
            return described if described.state == state else None

        result: tpb.TransactionDescription = wait_for(f"{self.tid} in {state}", reached, timeout_s)
        return result


def leader_address(cluster: LocalCluster, topic: str, partition: int) -> str:
    def probe() -> str | None:
        for spec in cluster.specs:
            if cluster.pid(spec.node_id) is None:
                continue
            described = metadata(cluster, spec.node_id, topic)
            if described is None or described.error_code:
                continue
            leader = next(p.leader_id for p in described.partitions if p.partition == partition)
            if leader >= 0 and cluster.pid(leader) is not None:
                return cluster.broker_address(leader)
        return None

    result: str = wait_for(f"the leader of {topic}-{partition}", probe, 60)
    return result


@dataclass(frozen=True)
class LogEntry:
    """A batch of a partition's log: a marker, or data records (values)."""

    offset: int
    producer_id: int
    marker: Marker | None
    values: tuple[bytes, ...]


def read_log(cluster: LocalCluster, topic: str, partition: int) -> list[LogEntry]:
    """Every batch below the high watermark, read from the leader (read_uncommitted)."""

    def read() -> list[LogEntry] | None:
        address = leader_address(cluster, topic, partition)
        entries: list[LogEntry] = []
        offset = 0
        while True:
            try:
                answer = stub(address).Fetch(
                    pb.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 24,
                                    topics=[pb.FetchTopic(name=topic, partitions=[pb.FetchPartition(
                                        partition=partition, fetch_offset=offset,
                                        current_leader_epoch=-1, partition_max_bytes=1 << 22)])]),
                    timeout=10,
                ).topics[0].partitions[0]  # fmt: skip
            except grpc.RpcError:
                return None
            if answer.error_code:
                return None
            if offset >= answer.high_watermark:
                return entries
            data, before = answer.records, offset
            for position, header in iter_batches(data):
                if header.next_offset <= offset:
                    continue
                if header.is_control:
                    marker = read_marker(data, position)
                    entries.append(LogEntry(header.base_offset, header.producer_id, marker, ()))
                else:
                    values = tuple(r.value or b"" for r in decode_batch(data, position)[1])
                    entries.append(LogEntry(header.base_offset, header.producer_id, None, values))
                offset = header.next_offset
            if offset == before:
                return None  # nothing readable yet below the high watermark: again

    result: list[LogEntry] = wait_for(f"the log of {topic}-{partition}", read, 60)
    return result
