"""An in-process fake of the SERVER side of BrokerService, for client tests.

It implements the proto honestly over a tiny model: each partition is a list of stored
batches (offsets assigned on append by rewriting baseOffset, as a leader does), each
partition has a leader node and a leader epoch, and several "brokers" (one gRPC server each on
127.0.0.1 port 0) share one :class:`FakeCluster`. A broker that does not lead a partition
answers NOT_LEADER_OR_FOLLOWER. Tests inject one-shot errors per partition and move leaders.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc

from dataplane.broker.producer_state import ProducerStates
from protos import broker_pb2 as pb
from protos import broker_pb2_grpc as pb_grpc
from raftlog.batch import OFFSET_LENGTH_EPOCH, iter_batches
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import iter_records


@dataclass
class FakePartition:
    leader: int
    leader_epoch: int = 0
    batches: list[bytes] = field(default_factory=list)  # with offsets assigned
    log_end_offset: int = 0
    injected: list[ErrorCode] = field(default_factory=list)  # next produce answers, in order
    max_message_bytes: int | None = None  # a larger batch is refused with MESSAGE_TOO_LARGE
    producers: ProducerStates = field(default_factory=ProducerStates)


class FakeCluster:
    def __init__(self, controller_addresses: tuple[str, ...] = ()) -> None:
        self.lock = threading.Condition()
        self.topics: dict[str, list[FakePartition]] = {}
        self.brokers: dict[int, str] = {}  # node id -> host:port
        self.controller_addresses = controller_addresses
        self.produce_requests: list[pb.ProduceRequest] = []  # every request received
        self.fetch_offsets: list[tuple[str, int, int]] = []  # (topic, partition, fetch offset)
        self.next_producer_id = 1000
        self.init_producer_id_errors: list[ErrorCode] = []  # answered first, one per request

    def create_topic(self, name: str, partitions: int, leaders: list[int] | None = None) -> None:
        with self.lock:
            nodes = sorted(self.brokers)
            self.topics[name] = [
                FakePartition(leader=(leaders[p] if leaders else nodes[p % len(nodes)]))
                for p in range(partitions)
            ]

    def move_leader(self, topic: str, partition: int, leader: int) -> None:
        with self.lock:
            state = self.topics[topic][partition]
            state.leader = leader
            state.leader_epoch += 1

    def truncate(self, topic: str, partition: int, batches_kept: int) -> None:
        """An unclean leader election: the log loses its batches after the first
        ``batches_kept`` (a new leader's appends then reuse their offsets)."""
        with self.lock:
            state = self.topics[topic][partition]
            del state.batches[batches_kept:]
            state.log_end_offset = (
                next(iter_batches(state.batches[-1]))[1].next_offset if state.batches else 0
            )
            state.producers = ProducerStates()

    def inject(self, topic: str, partition: int, *errors: ErrorCode) -> None:
        with self.lock:
            self.topics[topic][partition].injected.extend(errors)

    def values(self, topic: str, partition: int) -> list[bytes | None]:
        with self.lock:
            data = b"".join(self.topics[topic][partition].batches)
        return [r.value for r in iter_records(data)]

    def append(self, topic: str, partition: int, batch: bytes) -> int:
        """Append as a leader would: CRC-check, check an idempotent producer's sequence (the
        broker's own ProducerStates: a retry gets its first offsets back, a gap is
        OUT_OF_ORDER_SEQUENCE_NUMBER, raised), assign offsets. Returns the base offset."""
        with self.lock:
            state = self.topics[topic][partition]
            headers = [header for _, header in iter_batches(batch)]
            stored = state.producers.check(headers[0])
            if stored is not None:
                return stored.first_offset
            base = state.log_end_offset
            for header in headers:
                state.log_end_offset = base + header.last_offset_delta + 1
            rewritten = OFFSET_LENGTH_EPOCH.pack(base, len(batch) - 12, state.leader_epoch)
            state.batches.append(rewritten + batch[OFFSET_LENGTH_EPOCH.size :])
            state.producers.update(headers[0]._replace(base_offset=base))
            self.lock.notify_all()
            return base


class FakeBroker(pb_grpc.BrokerServiceServicer):
    def __init__(self, cluster: FakeCluster, node_id: int) -> None:
        self.cluster = cluster
        self.node_id = node_id

    def _partition(self, topic: str, partition: int) -> tuple[FakePartition | None, ErrorCode]:
        partitions = self.cluster.topics.get(topic)
        if partitions is None or not 0 <= partition < len(partitions):
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        state = partitions[partition]
        if state.leader != self.node_id:
            return state, ErrorCode.NOT_LEADER_OR_FOLLOWER
        return state, ErrorCode.NONE

    def Produce(
        self, request: pb.ProduceRequest, context: grpc.ServicerContext
    ) -> pb.ProduceResponse:
        with self.cluster.lock:
            self.cluster.produce_requests.append(request)
        topics = []
        for topic in request.topics:
            answers = [self._produce_one(topic.name, p) for p in topic.partitions]
            topics.append(pb.ProduceTopicResponse(name=topic.name, partitions=answers))
        if request.acks == 0:
            return pb.ProduceResponse()
        return pb.ProduceResponse(topics=topics)

    def _produce_one(self, topic: str, part: pb.ProducePartition) -> pb.ProducePartitionResponse:
        with self.cluster.lock:
            state, error = self._partition(topic, part.partition)
            if error is ErrorCode.NONE and state is not None and state.injected:
                error = state.injected.pop(0)
            limit = None if state is None else state.max_message_bytes
            if error is ErrorCode.NONE and limit is not None and len(part.records) > limit:
                error = ErrorCode.MESSAGE_TOO_LARGE
        if error is not ErrorCode.NONE:
            return pb.ProducePartitionResponse(
                partition=part.partition,
                error_code=error.code,
                base_offset=-1,
                log_append_time_ms=-1,
            )
        try:
            base = self.cluster.append(topic, part.partition, part.records)
        except KafkaError as failure:
            return pb.ProducePartitionResponse(
                partition=part.partition, error_code=failure.error.code, base_offset=-1
            )
        return pb.ProducePartitionResponse(
            partition=part.partition, base_offset=base, log_append_time_ms=-1
        )

    def Fetch(self, request: pb.FetchRequest, context: grpc.ServicerContext) -> pb.FetchResponse:
        deadline = time.monotonic() + request.max_wait_ms / 1000
        with self.cluster.lock:
            self.cluster.fetch_offsets.extend(
                (t.name, p.partition, p.fetch_offset) for t in request.topics for p in t.partitions
            )
            while True:
                response = self._fetch_once(request)
                size = sum(len(p.records) for t in response.topics for p in t.partitions)
                remaining = deadline - time.monotonic()
                errors = any(p.error_code for t in response.topics for p in t.partitions)
                if size >= max(request.min_bytes, 1) or errors or remaining <= 0:
                    return response
                self.cluster.lock.wait(remaining)

    def _fetch_once(self, request: pb.FetchRequest) -> pb.FetchResponse:
        topics = []
        for topic in request.topics:
            answers = [self._fetch_one(topic.name, p) for p in topic.partitions]
            topics.append(pb.FetchTopicResponse(name=topic.name, partitions=answers))
        return pb.FetchResponse(topics=topics)

    def _fetch_one(self, topic: str, part: pb.FetchPartition) -> pb.FetchPartitionResponse:
        state, error = self._partition(topic, part.partition)
        if state is not None and error is ErrorCode.NONE and part.current_leader_epoch >= 0:
            if part.current_leader_epoch < state.leader_epoch:
                error = ErrorCode.FENCED_LEADER_EPOCH
            elif part.current_leader_epoch > state.leader_epoch:
                error = ErrorCode.UNKNOWN_LEADER_EPOCH
        if state is None or error is not ErrorCode.NONE:
            return pb.FetchPartitionResponse(partition=part.partition, error_code=error.code)
        if not 0 <= part.fetch_offset <= state.log_end_offset:
            return pb.FetchPartitionResponse(
                partition=part.partition, error_code=ErrorCode.OFFSET_OUT_OF_RANGE.code
            )
        chosen: list[bytes] = []
        for batch in state.batches:
            _, header = next(iter_batches(batch))
            if header.next_offset <= part.fetch_offset:
                continue
            if chosen and sum(map(len, chosen)) + len(batch) > part.partition_max_bytes:
                break
            chosen.append(batch)
        return pb.FetchPartitionResponse(
            partition=part.partition,
            high_watermark=state.log_end_offset,
            log_end_offset=state.log_end_offset,
            records=b"".join(chosen),
            leader_id=state.leader,
            leader_epoch=state.leader_epoch,
        )

    def OffsetForLeaderEpoch(
        self, request: pb.OffsetForLeaderEpochRequest, context: grpc.ServicerContext
    ) -> pb.OffsetForLeaderEpochResponse:
        """As a leader's epoch cache answers (raftlog.epoch): the largest stored epoch <= the
        one asked for, and where the next higher starts (the log end offset for the last)."""
        response = pb.OffsetForLeaderEpochResponse()
        with self.cluster.lock:
            for topic in request.topics:
                out = response.topics.add(name=topic.name)
                for item in topic.partitions:
                    result = out.partitions.add(
                        partition=item.partition, leader_epoch=-1, end_offset=-1
                    )
                    state, error = self._partition(topic.name, item.partition)
                    stale = state is not None and item.current_leader_epoch not in (
                        -1, state.leader_epoch,
                    )  # fmt: skip
                    if error is ErrorCode.NONE and stale:
                        error = ErrorCode.FENCED_LEADER_EPOCH
                    if state is None or error is not ErrorCode.NONE:
                        result.error_code = error.code
                        continue
                    starts: dict[int, int] = {}  # epoch -> its first offset
                    for batch in state.batches:
                        _, header = next(iter_batches(batch))
                        starts.setdefault(header.partition_leader_epoch, header.base_offset)
                    lower = [e for e in starts if e <= item.leader_epoch]
                    higher = [starts[e] for e in starts if e > item.leader_epoch]
                    if lower or higher:
                        result.leader_epoch = max(lower) if lower else item.leader_epoch
                        result.end_offset = min(higher) if higher else state.log_end_offset
        return response

    def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.ServicerContext
    ) -> pb.ListOffsetsResponse:
        topics = []
        with self.cluster.lock:
            for topic in request.topics:
                answers = [self._list_one(topic.name, p) for p in topic.partitions]
                topics.append(pb.ListOffsetsTopicResponse(name=topic.name, partitions=answers))
        return pb.ListOffsetsResponse(topics=topics)

    def _list_one(
        self, topic: str, part: pb.ListOffsetsPartition
    ) -> pb.ListOffsetsPartitionResponse:
        state, error = self._partition(topic, part.partition)
        if state is None or error is not ErrorCode.NONE:
            return pb.ListOffsetsPartitionResponse(partition=part.partition, error_code=error.code)
        offset, timestamp = -1, -1
        if part.timestamp == -2:
            offset = 0
        elif part.timestamp == -1:
            offset = state.log_end_offset
        else:
            for record in iter_records(b"".join(state.batches)):
                if record.timestamp >= part.timestamp:
                    offset, timestamp = record.offset, record.timestamp
                    break
        return pb.ListOffsetsPartitionResponse(
            partition=part.partition,
            offset=offset,
            timestamp=timestamp,
            leader_epoch=state.leader_epoch,
            leader_id=state.leader,
        )

    def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: grpc.ServicerContext
    ) -> pb.InitProducerIdResponse:
        with self.cluster.lock:
            if self.cluster.init_producer_id_errors:
                error = self.cluster.init_producer_id_errors.pop(0)
                return pb.InitProducerIdResponse(error_code=error.code, error_message=error.name)
            producer_id = self.cluster.next_producer_id
            self.cluster.next_producer_id += 1
        return pb.InitProducerIdResponse(producer_id=producer_id, producer_epoch=0)

    def WriteTxnMarkers(
        self, request: pb.WriteTxnMarkersRequest, context: grpc.ServicerContext
    ) -> pb.WriteTxnMarkersResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the fake broker keeps no transactions")
        raise AssertionError("unreachable: abort raises")

    def DescribeProducers(
        self, request: pb.DescribeProducersRequest, context: grpc.ServicerContext
    ) -> pb.DescribeProducersResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the fake broker keeps no producer state")
        raise AssertionError("unreachable: abort raises")

    def DeleteRecords(
        self, request: pb.DeleteRecordsRequest, context: grpc.ServicerContext
    ) -> pb.DeleteRecordsResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the fake broker keeps its log starts")
        raise AssertionError("unreachable: abort raises")

    def ShareFetch(
        self, request: pb.ShareFetchRequest, context: grpc.ServicerContext
    ) -> pb.ShareFetchResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the fake broker serves no share groups")
        raise AssertionError("unreachable: abort raises")

    def DescribeLogDirs(
        self, request: pb.DescribeLogDirsRequest, context: grpc.ServicerContext
    ) -> pb.DescribeLogDirsResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the fake broker keeps no log directory")
        raise AssertionError("unreachable: abort raises")

    def ShareAcknowledge(
        self, request: pb.ShareAcknowledgeRequest, context: grpc.ServicerContext
    ) -> pb.ShareAcknowledgeResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the fake broker serves no share groups")
        raise AssertionError("unreachable: abort raises")

    def FetchStream(
        self, request: pb.FetchStreamRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.FetchStreamResponse]:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the fake broker serves Fetch only")
        raise AssertionError("unreachable: abort raises")

    def Metadata(
        self, request: pb.MetadataRequest, context: grpc.ServicerContext
    ) -> pb.MetadataResponse:
        with self.cluster.lock:
            names = sorted(self.cluster.topics) if request.all_topics else list(request.topics)
            topics = [self._topic_metadata(name) for name in names]
            brokers = [
                pb.BrokerNode(node_id=n, host=a.rsplit(":", 1)[0], port=int(a.rsplit(":", 1)[1]))
                for n, a in sorted(self.cluster.brokers.items())
            ]
        return pb.MetadataResponse(
            brokers=brokers,
            cluster_id="fake-cluster",
            controller_id=-1,
            topics=topics,
            controller_addresses=list(self.cluster.controller_addresses),
        )

    def _topic_metadata(self, name: str) -> pb.TopicMetadata:
        partitions = self.cluster.topics.get(name)
        if partitions is None:
            return pb.TopicMetadata(name=name, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code)
        return pb.TopicMetadata(
            name=name,
            topic_id=name.encode().ljust(16, b"\0")[:16],
            partitions=[
                pb.PartitionMetadata(
                    partition=i,
                    leader_id=p.leader,
                    leader_epoch=p.leader_epoch,
                    replicas=[p.leader],
                    isr=[p.leader],
                )
                for i, p in enumerate(partitions)
            ],
        )


@contextmanager
def fake_brokers(count: int, controller_addresses: tuple[str, ...] = ()) -> Iterator[FakeCluster]:
    """``count`` fake brokers (node ids 1..count) sharing one FakeCluster, on loopback."""
    cluster = FakeCluster(controller_addresses)
    servers = []
    try:
        for node_id in range(1, count + 1):
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
            pb_grpc.add_BrokerServiceServicer_to_server(FakeBroker(cluster, node_id), server)
            port = server.add_insecure_port("127.0.0.1:0")
            server.start()
            servers.append(server)
            cluster.brokers[node_id] = f"127.0.0.1:{port}"
        yield cluster
    finally:
        for server in servers:
            server.stop(grace=None)


def bootstrap(cluster: FakeCluster) -> list[str]:
    return list(cluster.brokers.values())
