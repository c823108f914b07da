"""BrokerService.FetchStream: a consumer's Fetch as a server stream (issue 31).

A subscription names partitions this broker leads, each with a start offset, and the broker
pushes a message each time one of them has new records. Each read *is* a consumer Fetch: the
stream's state (the next offset of each partition) is turned into a ``FetchRequest`` and read by
the servicer's own fetch path, so the read rules are Fetch's by construction: up to the high
watermark, or with read_committed up to the last stable offset with the aborted transactions of
what was read; the leader epoch check (KIP-320); READ on each topic (the check is made once, at
the start: a subscription is one request); the byte limits, at least one whole batch.

Waiting. One event is registered with every partition of the stream for its whole life (the
partitions' waiters, as a long poll's: set on appends, high watermark moves, role and epoch
changes, a stop), and with the call's end (a cancel, a passed deadline, a lost connection).
The loop clears it, reads, and sends or waits on it: a wake between the read and the wait is
kept by the event, so nothing is missed and nothing polls. The waiter leaves its partitions
when the call ends, also while the stream is blocked sending (gRPC then stops asking the
generator for more, and closing it runs ``finally``).

Flow control. gRPC Python's sync server takes the next message from the generator only once
the previous one's send has completed (``grpc._server._send_response`` waits for the send
operation), and a send completes when the transport has taken the bytes within the stream's
HTTP/2 window. A client that stops reading stops the window, then the send, then the reads: the
broker holds at most one message (``max_bytes``) per stream beyond what the transport buffers
(the client's flow-control window and the sockets' buffers). tests/dataplane/broker/
test_fetch_stream.py measures it.

The stream runs until the client cancels it or its deadline passes (then it ends
DEADLINE_EXCEEDED, REQUEST_TIMED_OUT in its ErrorInfo). Errors end the stream (one rule for
every error: a gRPC stream either carries data or has ended with a status). Records read
before the error are sent first. The status is the rich one
of ``metadata_quorum.grpc_errors``: NOT_LEADER_OR_FOLLOWER is UNAVAILABLE with Kafka's code 6
in its ErrorInfo; the client asks for the new leader and subscribes there from its next offset.

Limits: a stream holds one of the server's worker threads for its life, so at most
``streams_max`` run at once (the rest of the pool stays for unary calls); one more is refused
RESOURCE_EXHAUSTED (Kafka's NETWORK_EXCEPTION, retriable: a broker that takes no more
connections).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from dataplane.broker.partition import READ_COMMITTED, READ_UNCOMMITTED, Partition
from protos import broker_pb2 as pb
from protos.wire import FetchAnswer, FetchStreamAnswer, Records, each_partition
from raftlog.batch import HEADER_SIZE, read_header
from raftlog.errors import ErrorCode, KafkaError

__all__ = [
    "StreamSlots",
    "TooManyStreams",
    "fetch_request",
    "next_offset",
    "start_offsets",
    "stream",
]

CONSUMER_REPLICA_ID = -1
# (the stream's fetch request) -> the answer, its bytes of records, the partitions it read
Read = Callable[[pb.FetchRequest], tuple[FetchAnswer, int, list[Partition]]]


class TooManyStreams(KafkaError):
    """Every stream slot is taken: the call ends RESOURCE_EXHAUSTED (Kafka's NETWORK_EXCEPTION
    in its ErrorInfo, retriable)."""

    def __init__(self, streams_max: int) -> None:
        super().__init__(
            ErrorCode.NETWORK_EXCEPTION,
            f"this broker serves {streams_max} FetchStream calls already: retry later or use Fetch",
        )


class StreamSlots:
    """How many streams may run at once (each holds a server thread for its life)."""

    def __init__(self, streams_max: int) -> None:
        if streams_max < 0:
            raise AssertionError(f"streams_max {streams_max} < 0")
        self.streams_max = streams_max
        self._lock = threading.Lock()
        self.running = 0

    def take(self) -> bool:
        with self._lock:
            if self.running >= self.streams_max:
                return False
            self.running += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            if self.running <= 0:
                raise AssertionError("a stream slot given back that was not taken")
            self.running -= 1


def fetch_request(
    request: pb.FetchStreamRequest, offsets: dict[tuple[str, int], int]
) -> pb.FetchRequest:
    """The consumer Fetch that reads the stream's partitions at ``offsets`` now: no wait
    (the stream waits itself), at least one byte."""
    return pb.FetchRequest(
        replica_id=CONSUMER_REPLICA_ID, broker_epoch=-1, max_wait_ms=0, min_bytes=1,
        max_bytes=request.max_bytes, isolation_level=request.isolation_level,
        topics=[
            pb.FetchTopic(name=topic.name, partitions=[
                pb.FetchPartition(
                    partition=item.partition, fetch_offset=offsets[topic.name, item.partition],
                    current_leader_epoch=item.current_leader_epoch, last_fetched_epoch=-1,
                    partition_max_bytes=item.partition_max_bytes, log_start_offset=-1,
                )
                for item in topic.partitions
            ])
            for topic in request.topics
        ],
    )  # fmt: skip


def start_offsets(request: pb.FetchStreamRequest) -> dict[tuple[str, int], int]:
    """Each partition's start offset; INVALID_REQUEST for a request that cannot be served."""
    if request.isolation_level not in (READ_UNCOMMITTED, READ_COMMITTED):
        raise KafkaError(
            ErrorCode.INVALID_REQUEST,
            f"isolation_level {request.isolation_level}: 0 read_uncommitted or 1 read_committed",
        )
    offsets: dict[tuple[str, int], int] = {}
    for topic in request.topics:
        for item in topic.partitions:
            key = (topic.name, item.partition)
            if key in offsets:
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST, f"{topic.name}-{item.partition} named twice"
                )
            offsets[key] = item.fetch_offset
    if not offsets:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "FetchStream names no partition")
    return offsets


def next_offset(records: Records, fetch_offset: int) -> int:
    """Where the stream reads a partition next: after the last whole batch it sent."""
    position, end = 0, fetch_offset
    while len(records) - position >= HEADER_SIZE:
        header = read_header(records, position)
        if header.size_bytes <= 0 or header.size_bytes > len(records) - position:
            raise AssertionError(f"a read ended in a torn batch at {header.base_offset}")
        end = max(end, header.next_offset)
        position += header.size_bytes
    return end


def _first_error(answer: FetchAnswer) -> KafkaError | None:
    for topic in answer.response.topics:
        for partition in topic.partitions:
            if partition.error_code:
                code = ErrorCode.from_code(partition.error_code)
                return KafkaError(code, f"{topic.name}-{partition.partition}: "
                                  f"{partition.error_message or code.name}")  # fmt: skip
    return None


def _news(answer: FetchAnswer, offsets: dict[tuple[str, int], int]) -> FetchStreamAnswer | None:
    """The partitions of a read that have records, as a stream message; ``offsets`` moved past
    them. None: nothing new."""
    out = pb.FetchStreamResponse()
    records: list[Records] = []
    topic_out: Any = None
    for topic, partition, data in each_partition(answer.response, answer.records):
        if not data:
            continue
        if topic_out is None or topic_out.name != topic.name:
            topic_out = out.topics.add(name=topic.name)
        topic_out.partitions.add().CopyFrom(partition)
        records.append(data)
        key = (topic.name, partition.partition)
        offsets[key] = next_offset(data, offsets[key])
    return FetchStreamAnswer(out, records) if records else None


def stream(
    request: pb.FetchStreamRequest, context: Any, read: Read, slots: StreamSlots
) -> Iterator[FetchStreamAnswer]:
    """The messages of one subscription (see the module docstring); raises KafkaError to end
    it with that error (the server's RichErrors interceptor makes it the call's status)."""
    offsets = start_offsets(request)
    if not slots.take():
        raise TooManyStreams(slots.streams_max)
    event = threading.Event()
    watched: list[Partition] = []
    try:
        remaining_s = context.time_remaining()
        deadline = math.inf if remaining_s is None else time.monotonic() + remaining_s
        context.add_callback(event.set)  # False: it has ended already, is_active says so
        while context.is_active():
            event.clear()
            answer, _, hosted = read(fetch_request(request, offsets))
            if [id(p) for p in hosted] != [id(p) for p in watched]:  # the first read, a new
                _watch(event, watched, hosted)  # replica object: re-read once registered
                continue
            news = _news(answer, offsets)
            if news is not None:
                yield news
            error = _first_error(answer)
            if error is not None:
                raise error
            if news is None:
                left_s = deadline - time.monotonic()
                if left_s <= 0:  # DEADLINE_EXCEEDED, as gRPC ends a call at its deadline
                    raise KafkaError(ErrorCode.REQUEST_TIMED_OUT, "the stream's deadline passed")
                event.wait(None if left_s == math.inf else left_s)
    finally:
        _watch(event, watched, [])
        slots.give_back()


def _watch(event: threading.Event, watched: list[Partition], partitions: list[Partition]) -> None:
    """Move ``event``'s registration from the ``watched`` partitions to ``partitions``."""
    for partition in watched:
        partition.remove_waiter(event)
    watched[:] = partitions
    for partition in partitions:
        partition.add_waiter(event)
