"""The consumer with manual assignment: ``assign``, ``seek``, ``poll``, offset lookups.

Kafka's settings (``fetch.min.bytes``, ``fetch.max.wait.ms``, ``fetch.max.bytes``,
``max.partition.fetch.bytes``, ``max.poll.records``, ``auto.offset.reset``,
``request.timeout.ms``) with underscores. Not thread-safe, like Kafka's: one thread polls.

``poll`` sends one Fetch per leader broker covering all its assigned partitions (concurrently,
as asynchronous unary calls), decodes the returned RecordBatch v2 bytes, drops records below
the fetch position (a batch can start before it) and keeps what exceeds ``max.poll.records``
for the next poll. A partition with buffered records is not fetched again until they are
returned. The position is the offset of the next record ``poll`` returns.

Errors per partition: OFFSET_OUT_OF_RANGE applies ``auto.offset.reset`` (``"none"`` raises);
NOT_LEADER_OR_FOLLOWER, UNKNOWN_LEADER_EPOCH, FENCED_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION,
LEADER_NOT_AVAILABLE and network failures refresh metadata and fetch again (from the new
leader, with its epoch as ``current_leader_epoch``); other non-retriable errors raise
``KafkaError`` from ``poll``.

Groups, ``subscribe`` and commits come later.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import grpc

from dataplane.client._closing import Closing
from dataplane.client._cluster import Cluster, ClusterSnapshot, rpc_error
from dataplane.client._config import ConsumerConfig
from dataplane.client._types import ConsumerRecord, TopicPartition
from protos import broker_pb2 as pb
from raftlog.batch import HEADER_SIZE, read_header
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import decode_batch

__all__ = ["Consumer"]

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
CONSUMER_REPLICA_ID = -1
LEADER_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.REPLICA_NOT_AVAILABLE,
    }
)
Reset = Literal["earliest", "latest"]
PartitionLike = TopicPartition | tuple[str, int]


@dataclass
class _PartitionState:
    position: int | None  # None = to be reset with `reset`
    reset: Reset | None
    buffer: deque[ConsumerRecord] = field(default_factory=deque)
    buffer_end: int = -1  # the position once the buffer is returned
    high_watermark: int = -1


def decode_fetched(
    tp: TopicPartition, data: bytes, fetch_offset: int
) -> tuple[list[ConsumerRecord], int]:
    """Records at or after ``fetch_offset`` in whole batches of ``data``, and the offset to
    fetch next. A torn batch at the end (the fetch was cut at its byte limit) is ignored;
    a corrupt batch raises. Control batches are skipped but advance the position."""
    records: list[ConsumerRecord] = []
    next_offset = fetch_offset
    position = 0
    while len(data) - position >= HEADER_SIZE:
        header = read_header(data, position)
        if header.size_bytes > len(data) - position:
            break
        header, batch = decode_batch(data, position)
        if header.next_offset > fetch_offset and not header.is_control:
            # Per batch, not per record: the loop below runs for every record consumed.
            topic, partition, epoch = tp.topic, tp.partition, header.partition_leader_epoch
            timestamp_type = int(header.timestamp_type)
            records.extend(
                ConsumerRecord(
                    topic,
                    partition,
                    r.offset,
                    r.timestamp,
                    timestamp_type,
                    r.key,
                    r.value,
                    r.headers,
                    epoch,
                )
                for r in batch
                if r.offset >= fetch_offset
            )
        next_offset = max(next_offset, header.next_offset)
        position += header.size_bytes
    if position == 0 and data:
        raise KafkaError(
            ErrorCode.RECORD_LIST_TOO_LARGE,
            f"{tp}: no whole batch at offset {fetch_offset} in {len(data)} bytes; raise "
            "max.partition.fetch.bytes (brokers should return at least one whole batch)",
        )
    return records, next_offset


class Consumer(Closing):
    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        fetch_min_bytes: int = 1,
        fetch_max_wait_ms: int = 500,
        fetch_max_bytes: int = 50 * 1024 * 1024,
        max_partition_fetch_bytes: int = 1024 * 1024,
        max_poll_records: int = 500,
        auto_offset_reset: Literal["latest", "earliest", "none"] = "latest",
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        metadata_max_age_ms: int = 300_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = ConsumerConfig(
            fetch_min_bytes=fetch_min_bytes,
            fetch_max_wait_ms=fetch_max_wait_ms,
            fetch_max_bytes=fetch_max_bytes,
            max_partition_fetch_bytes=max_partition_fetch_bytes,
            max_poll_records=max_poll_records,
            auto_offset_reset=auto_offset_reset,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            metadata_max_age_ms=metadata_max_age_ms,
        )
        self._clock = clock
        self._cluster = Cluster(
            bootstrap_servers,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            metadata_max_age_ms=metadata_max_age_ms,
            clock=clock,
        )
        self._request_timeout_s = request_timeout_ms / 1000
        self._states: dict[TopicPartition, _PartitionState] = {}
        self._closed = threading.Event()

    # -- assignment and positions ----------------------------------------------------------
    def assign(self, partitions: Iterable[PartitionLike]) -> None:
        """Replace the assignment. Kept partitions keep their positions; new ones start at
        ``auto.offset.reset`` unless ``seek`` says otherwise."""
        wanted = [TopicPartition(str(t), int(p)) for t, p in partitions]
        reset = None if self.config.auto_offset_reset == "none" else self.config.auto_offset_reset
        self._states = {
            tp: self._states.get(tp) or _PartitionState(position=None, reset=reset) for tp in wanted
        }
        self._cluster.add_topics(tp.topic for tp in wanted)

    def assignment(self) -> set[TopicPartition]:
        return set(self._states)

    def _state(self, tp: PartitionLike) -> _PartitionState:
        state = self._states.get(TopicPartition(*tp))
        if state is None:
            raise ValueError(f"{tp} is not assigned to this consumer")
        return state

    def seek(self, tp: PartitionLike, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        state = self._state(tp)
        state.position, state.reset = offset, None
        state.buffer.clear()

    def seek_to_beginning(self, *partitions: PartitionLike) -> None:
        self._seek_to("earliest", partitions)

    def seek_to_end(self, *partitions: PartitionLike) -> None:
        self._seek_to("latest", partitions)

    def _seek_to(self, reset: Reset, partitions: Sequence[PartitionLike]) -> None:
        """Lazily: the offset is looked up at the next ``poll`` or ``position``."""
        for tp in partitions or list(self._states):
            state = self._state(tp)
            state.position, state.reset = None, reset
            state.buffer.clear()

    def position(self, tp: PartitionLike) -> int:
        """The offset of the next record ``poll`` returns for ``tp``."""
        state = self._state(tp)
        if state.position is None:
            self._reset_positions()
        assert state.position is not None, "_reset_positions sets every position or raises"
        return state.position

    def _reset_positions(self) -> None:
        pending = {tp: s for tp, s in self._states.items() if s.position is None}
        if not pending:
            return
        for tp, state in pending.items():
            if state.reset is None:
                raise KafkaError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"{tp} has no position and auto.offset.reset is none",
                )
        timestamps = {
            tp: EARLIEST_TIMESTAMP if s.reset == "earliest" else LATEST_TIMESTAMP
            for tp, s in pending.items()
        }
        for tp, (offset, _) in self._list_offsets(timestamps).items():
            pending[tp].position, pending[tp].reset = offset, None

    # -- offsets lookups -------------------------------------------------------------------
    def beginning_offsets(self, partitions: Iterable[PartitionLike]) -> dict[TopicPartition, int]:
        found = self._list_offsets({TopicPartition(*tp): EARLIEST_TIMESTAMP for tp in partitions})
        return {tp: offset for tp, (offset, _) in found.items()}

    def end_offsets(self, partitions: Iterable[PartitionLike]) -> dict[TopicPartition, int]:
        """The high watermark of each partition (the offset the next record will get)."""
        found = self._list_offsets({TopicPartition(*tp): LATEST_TIMESTAMP for tp in partitions})
        return {tp: offset for tp, (offset, _) in found.items()}

    def offsets_for_times(
        self, timestamps: Mapping[PartitionLike, int]
    ) -> dict[TopicPartition, tuple[int, int] | None]:
        """Per partition, the earliest (offset, timestamp) whose timestamp is at or after the
        given one (ms), None when there is none."""
        for ts in timestamps.values():
            if ts < 0:
                raise ValueError(f"timestamps must be >= 0, got {ts}")
        found = self._list_offsets({TopicPartition(*tp): ts for tp, ts in timestamps.items()})
        return {tp: None if offset < 0 else (offset, ts) for tp, (offset, ts) in found.items()}

    def partitions_for_topic(self, topic: str) -> set[int]:
        info = self._cluster.wait_for_topic(topic, self._request_timeout_s)
        return {p.partition for p in info.partitions}

    def _list_offsets(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets to each partition's leader, following leader changes, within
        ``request.timeout.ms``. Raises the first non-retriable error."""
        deadline = self._clock() + self._request_timeout_s
        for topic in {tp.topic for tp in timestamps}:
            self._cluster.wait_for_topic(topic, max(0.0, deadline - self._clock()))
        pending = dict(timestamps)
        found: dict[TopicPartition, tuple[int, int]] = {}
        last = KafkaError(ErrorCode.REQUEST_TIMED_OUT, "ListOffsets did not complete")
        while pending:
            for leader_tps, address in self._group_by_leader(pending).values():
                try:
                    self._list_offsets_at(address, leader_tps, pending, found)
                except KafkaError as error:
                    if not error.retriable:
                        raise
                    last = error
                    self._cluster.invalidate()
            if not pending:
                break
            if self._clock() >= deadline or self._closed.is_set():
                raise last
            self._closed.wait(min(self._cluster.backoff_s(), max(0.0, deadline - self._clock())))
            self._cluster.maybe_refresh()
        return found

    def _group_by_leader(
        self, pending: Mapping[TopicPartition, int]
    ) -> dict[int, tuple[dict[TopicPartition, int], str]]:
        snapshot = self._cluster.snapshot()
        groups: dict[int, tuple[dict[TopicPartition, int], str]] = {}
        for tp, ts in pending.items():
            leader = snapshot.leader(tp.topic, tp.partition)
            if leader is None:
                self._cluster.invalidate()
                continue
            groups.setdefault(leader.node_id, ({}, leader.address))[0][tp] = ts
        return groups

    def _list_offsets_at(
        self,
        address: str,
        timestamps: Mapping[TopicPartition, int],
        pending: dict[TopicPartition, int],
        found: dict[TopicPartition, tuple[int, int]],
    ) -> None:
        snapshot = self._cluster.snapshot()
        topics: dict[str, list[pb.ListOffsetsPartition]] = {}
        for tp, ts in timestamps.items():
            state = snapshot.partition(tp.topic, tp.partition)
            epoch = state.leader_epoch if state is not None else -1
            topics.setdefault(tp.topic, []).append(
                pb.ListOffsetsPartition(
                    partition=tp.partition, timestamp=ts, current_leader_epoch=epoch
                )
            )
        request = pb.ListOffsetsRequest(
            replica_id=CONSUMER_REPLICA_ID,
            topics=[pb.ListOffsetsTopic(name=t, partitions=ps) for t, ps in topics.items()],
        )
        try:
            response = self._cluster.stub(address).ListOffsets(
                request, timeout=self._request_timeout_s
            )
        except grpc.RpcError as error:
            raise rpc_error(error, f"ListOffsets to {address}") from error
        for topic in response.topics:
            for answer in topic.partitions:
                tp = TopicPartition(topic.name, answer.partition)
                if tp not in pending:
                    continue
                code = ErrorCode.from_code(answer.error_code)
                if code is ErrorCode.NONE:
                    found[tp] = (answer.offset, answer.timestamp)
                    del pending[tp]
                elif not code.retriable:
                    raise KafkaError(code, f"ListOffsets {tp}: {answer.error_message}")
                elif code in LEADER_ERRORS:
                    self._cluster.invalidate()

    # -- polling ---------------------------------------------------------------------------
    def poll(self, timeout_ms: int = 0) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records of the assigned partitions, at most ``max.poll.records``, waiting up to
        ``timeout_ms`` for some to arrive. Empty when none did."""
        if self._closed.is_set():
            raise RuntimeError("poll() after close()")
        deadline = self._clock() + max(0, timeout_ms) / 1000
        while True:
            records = self._drain_buffers()
            if records:
                return records
            self._reset_positions()
            remaining = deadline - self._clock()
            fetched = self._fetch(
                max_wait_s=max(0.0, min(self.config.fetch_max_wait_ms / 1000, remaining))
            )
            if any(s.buffer for s in self._states.values()):
                continue
            remaining = deadline - self._clock()
            if remaining <= 0:
                return {}
            if not fetched:  # nothing could be fetched (no leader, errors): back off
                self._closed.wait(min(self._cluster.backoff_s(), remaining))

    def _drain_buffers(self) -> dict[TopicPartition, list[ConsumerRecord]]:
        budget = self.config.max_poll_records
        result: dict[TopicPartition, list[ConsumerRecord]] = {}
        for tp, state in self._states.items():
            if budget == 0:
                break
            if not state.buffer:
                continue
            taken = [state.buffer.popleft() for _ in range(min(budget, len(state.buffer)))]
            budget -= len(taken)
            result[tp] = taken
            state.position = state.buffer[0].offset if state.buffer else state.buffer_end
        return result

    def _fetch(self, max_wait_s: float) -> bool:
        """One Fetch to each leader of fetchable partitions; False when no partition was
        answered without error (the caller backs off)."""
        self._cluster.maybe_refresh()
        snapshot = self._cluster.snapshot()
        requests = self._fetch_requests(snapshot, max_wait_s)
        calls = [
            (
                address,
                offsets,
                self._cluster.stub(address).Fetch.future(
                    request, timeout=max_wait_s + self._request_timeout_s
                ),
            )
            for address, (request, offsets) in requests.items()
        ]
        answered = False
        for address, offsets, call in calls:
            try:
                response: pb.FetchResponse = call.result()
            except grpc.RpcError as error:
                if not rpc_error(error, address).retriable:
                    raise rpc_error(error, f"Fetch from {address}") from error
                self._cluster.invalidate()
                continue
            answered = self._handle_fetch(response, offsets) or answered
        return answered

    def _fetch_requests(
        self, snapshot: ClusterSnapshot, max_wait_s: float
    ) -> dict[str, tuple[pb.FetchRequest, dict[TopicPartition, int]]]:
        by_leader: dict[str, dict[str, list[pb.FetchPartition]]] = {}
        offsets: dict[str, dict[TopicPartition, int]] = {}
        for tp, state in self._states.items():
            if state.buffer or state.position is None:
                continue
            leader = snapshot.leader(tp.topic, tp.partition)
            info = snapshot.partition(tp.topic, tp.partition)
            if leader is None or info is None:
                self._cluster.invalidate()
                continue
            by_leader.setdefault(leader.address, {}).setdefault(tp.topic, []).append(
                pb.FetchPartition(
                    partition=tp.partition,
                    fetch_offset=state.position,
                    current_leader_epoch=info.leader_epoch,
                    last_fetched_epoch=-1,
                    partition_max_bytes=self.config.max_partition_fetch_bytes,
                    log_start_offset=-1,
                )
            )
            offsets.setdefault(leader.address, {})[tp] = state.position
        return {
            address: (
                pb.FetchRequest(
                    replica_id=CONSUMER_REPLICA_ID,
                    broker_epoch=-1,
                    max_wait_ms=int(max_wait_s * 1000),
                    min_bytes=self.config.fetch_min_bytes,
                    max_bytes=self.config.fetch_max_bytes,
                    topics=[pb.FetchTopic(name=t, partitions=ps) for t, ps in topics.items()],
                ),
                offsets[address],
            )
            for address, topics in by_leader.items()
        }

    def _handle_fetch(
        self, response: pb.FetchResponse, offsets: Mapping[TopicPartition, int]
    ) -> bool:
        """Apply each partition's answer; True when any came without error."""
        if response.error_code != ErrorCode.NONE.code:
            code = ErrorCode.from_code(response.error_code)
            if not code.retriable:
                raise KafkaError(code, "Fetch refused")
            self._cluster.invalidate()
            return False
        ok = False
        for topic in response.topics:
            for answer in topic.partitions:
                tp = TopicPartition(topic.name, answer.partition)
                state = self._states.get(tp)
                if state is None or tp not in offsets or state.position != offsets[tp]:
                    continue  # unassigned or moved by seek since the request went out
                self._handle_partition(tp, state, answer)
                ok = ok or answer.error_code == ErrorCode.NONE.code
        return ok

    def _handle_partition(
        self, tp: TopicPartition, state: _PartitionState, answer: pb.FetchPartitionResponse
    ) -> None:
        code = ErrorCode.from_code(answer.error_code)
        if code is ErrorCode.NONE:
            assert state.position is not None, "only partitions with a position are fetched"
            records, next_offset = decode_fetched(tp, answer.records, state.position)
            state.high_watermark = answer.high_watermark
            state.buffer.extend(records)
            state.buffer_end = next_offset
            if not records:
                state.position = next_offset
        elif code is ErrorCode.OFFSET_OUT_OF_RANGE:
            if self.config.auto_offset_reset == "none":
                raise KafkaError(code, f"{tp}: offset {state.position} is out of range")
            state.position, state.reset = None, self.config.auto_offset_reset
        elif code in LEADER_ERRORS:
            self._cluster.invalidate()
        elif not code.retriable:
            raise KafkaError(code, f"Fetch {tp}: {answer.error_message}")

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        self._closed.set()
        self._cluster.close()
