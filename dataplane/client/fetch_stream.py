"""``FetchStream``: read partitions from given offsets through BrokerService.FetchStream, the
server-streaming Fetch (issue 31, docs/api.md "Streaming Fetch").

A small reader beside :class:`~dataplane.client.Consumer`, not a mode of it: no group, no
commits, no ``auto.offset.reset``; the caller gives each partition's start offset (e.g. from
``Consumer.committed``, ``beginning_offsets`` or ``end_offsets``) and keeps its positions.
``poll`` returns the records that arrived, per partition, in offset order, each once.

One stream per leader broker covers the partitions it leads, read by a thread of its own into
one queue of at most ``buffered_messages_max`` messages (each at most ``fetch_max_bytes``). A
full queue blocks the thread, the thread stops reading its stream, and HTTP/2 flow control
stops the broker (see dataplane.broker.fetch_stream): memory is bounded end to end.

A stream ends with an error when its broker cannot serve it any more. A leader change
(NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH, a broker gone: UNAVAILABLE) and any other
retriable error: the metadata is refreshed and the partitions are subscribed at their new
leader, from the offset after the last record ``poll`` has taken in (never twice, never
skipped). A stream's deadline (``stream_timeout_ms``, DEADLINE_EXCEEDED) ends it too, and it is
opened again after the retry backoff: every call has a deadline, and a silent broker is left
for another after it. Other
errors (TOPIC_AUTHORIZATION_FAILED, OFFSET_OUT_OF_RANGE, ...) raise ``KafkaError`` from
``poll``. With ``isolation_level="read_committed"`` the records of aborted transactions are
dropped (``_read_committed``), as the Consumer drops them. Not thread-safe: one thread polls.
Unlike the Consumer it does not validate positions after a leader change (KIP-320).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import grpc

from dataplane.client._closing import Closing
from dataplane.client._cluster import Cluster, SecuritySetting, rpc_error
from dataplane.client._read_committed import drop_aborted
from dataplane.client._types import ConsumerRecord, TopicPartition
from dataplane.client.consumer import FetchedBatches, decode_fetched, whole_batches
from protos import broker_pb2 as pb
from protos.wire import FetchStreamAnswer, each_partition
from raftlog.errors import KafkaError

__all__ = ["FetchStream"]
log = logging.getLogger(__name__)

ISOLATION_LEVELS = {"read_uncommitted": 0, "read_committed": 1}
JOIN_TIMEOUT_S = 5.0  # close(): how long a reader thread may take to see its cancelled call


@dataclass(frozen=True, slots=True)
class _Ended:
    """A reader's last item: its stream ended (``error`` None: its deadline, a clean end)."""

    error: KafkaError | None


class _Reader:
    """One stream at one broker, read by its own thread into the shared queue."""

    def __init__(
        self,
        call: grpc.Call,
        partitions: dict[TopicPartition, int],
        out: queue.Queue[tuple[_Reader, list[FetchedBatches] | _Ended]],
        read_committed: bool,
    ) -> None:
        self.call = call
        self.partitions = partitions  # where this stream started each of its partitions
        self._offsets = dict(partitions)  # where it continues (its thread's)
        self._out = out
        self._read_committed = read_committed
        self.closing = False
        self.thread = threading.Thread(target=self._run, name="fetch-stream", daemon=True)

    def _run(self) -> None:
        ended = _Ended(None)
        try:
            for answer in self.call:
                self._out.put((self, self._batches(answer)))
        except grpc.RpcError as error:
            if not self.closing:
                ended = _Ended(rpc_error(error, "FetchStream"))
        except KafkaError as error:  # a batch that breaks the framing rules
            ended = _Ended(error)
        self._out.put((self, ended))

    def _batches(self, answer: FetchStreamAnswer) -> list[FetchedBatches]:
        fetched = []
        for topic, partition, data in each_partition(answer.response, answer.records):
            tp = TopicPartition(topic.name, partition.partition)
            batches = whole_batches(tp, bytes(data), self._offsets[tp])
            self._offsets[tp] = batches.next_offset
            if self._read_committed and partition.aborted_transactions and batches.data:
                aborted = ((a.producer_id, a.first_offset) for a in partition.aborted_transactions)
                batches = batches._replace(data=drop_aborted(batches.data, aborted))
            fetched.append(batches)
        return fetched


class FetchStream(Closing):
    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        positions: Mapping[TopicPartition | tuple[str, int], int],
        *,
        isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted",
        fetch_max_bytes: int = 50 * 1024 * 1024,
        max_partition_fetch_bytes: int = 1024 * 1024,
        buffered_messages_max: int = 4,
        stream_timeout_ms: int = 300_000,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        security: SecuritySetting = None,
    ) -> None:
        """``positions``: each partition's first offset to read. ``buffered_messages_max``:
        stream messages held unread (1-1024); ``stream_timeout_ms``: each stream's deadline,
        after which it is opened again (1 s-1 day)."""
        if isolation_level not in ISOLATION_LEVELS:
            raise ValueError(f"isolation_level {isolation_level!r}: {sorted(ISOLATION_LEVELS)}")
        if not 1 <= buffered_messages_max <= 1024:
            raise ValueError(f"buffered_messages_max {buffered_messages_max}: 1-1024")
        if not 1_000 <= stream_timeout_ms <= 86_400_000:
            raise ValueError(f"stream_timeout_ms {stream_timeout_ms}: 1,000-86,400,000")
        self._positions = {TopicPartition(*tp): offset for tp, offset in positions.items()}
        if not self._positions or any(offset < 0 for offset in self._positions.values()):
            raise ValueError(f"positions {positions}: at least one, each >= 0")
        self._isolation = ISOLATION_LEVELS[isolation_level]
        self._max_bytes = fetch_max_bytes
        self._partition_max_bytes = max_partition_fetch_bytes
        self._stream_timeout_s = stream_timeout_ms / 1000
        self._cluster = Cluster(
            bootstrap_servers, request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
            security=security,
        )  # fmt: skip
        self._cluster.add_topics({tp.topic for tp in self._positions})
        self._queue: queue.Queue[tuple[_Reader, list[FetchedBatches] | _Ended]] = queue.Queue(
            buffered_messages_max
        )
        self._readers: list[_Reader] = []
        self._resubscribe_at = 0.0  # after a failed stream: not before (the backoff)
        self._closed = False

    def position(self, tp: TopicPartition | tuple[str, int]) -> int:
        """The offset of the next record ``poll`` returns for ``tp``."""
        return self._positions[TopicPartition(*tp)]

    def poll(self, timeout_ms: int = 0) -> dict[TopicPartition, list[ConsumerRecord]]:
        """The records that arrived, waiting up to ``timeout_ms`` for some; empty if none."""
        if self._closed:
            raise RuntimeError("poll() after close()")
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        while True:
            self._subscribe()
            left_s = deadline - time.monotonic()
            if self._uncovered():  # waiting for a leader or the backoff
                left_s = min(left_s, max(0.0, self._resubscribe_at - time.monotonic()), 0.1)
            try:
                reader, item = self._queue.get(timeout=max(0.0, left_s))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    return {}
                continue
            records = self._take(reader, item)
            if records:
                return records

    def _take(
        self, reader: _Reader, item: list[FetchedBatches] | _Ended
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        if isinstance(item, _Ended):
            self._readers.remove(reader)
            if item.error is None:
                return {}
            if not item.error.retriable:
                raise item.error
            log.info("FetchStream ended: %s; subscribing at the leaders again", item.error)
            self._cluster.invalidate()
            self._resubscribe_at = time.monotonic() + self._cluster.backoff_s()
            return {}
        records: dict[TopicPartition, list[ConsumerRecord]] = {}
        for fetched in item:
            if fetched.fetch_offset != self._positions[fetched.tp]:
                raise AssertionError(f"{fetched.tp}: a stream message at {fetched.fetch_offset}, "
                                     f"the position is {self._positions[fetched.tp]}")  # fmt: skip
            self._positions[fetched.tp] = fetched.next_offset
            decoded = decode_fetched(fetched)
            if decoded:
                records[fetched.tp] = decoded
        return records

    def _uncovered(self) -> list[TopicPartition]:
        covered = {tp for reader in self._readers for tp in reader.partitions}
        return [tp for tp in self._positions if tp not in covered]

    def _subscribe(self) -> None:
        """A stream at each leader of the partitions no stream covers."""
        uncovered = self._uncovered()
        if not uncovered or time.monotonic() < self._resubscribe_at:
            return
        self._cluster.maybe_refresh()
        snapshot = self._cluster.snapshot()
        by_leader: dict[str, dict[TopicPartition, int]] = {}
        epochs: dict[TopicPartition, int] = {}
        for tp in uncovered:
            leader, info = snapshot.leader(*tp), snapshot.partition(*tp)
            if leader is None or info is None:
                self._cluster.invalidate()
                continue
            by_leader.setdefault(leader.address, {})[tp] = self._positions[tp]
            epochs[tp] = info.leader_epoch
        for address, partitions in by_leader.items():
            request = self._request(partitions, epochs)
            call = self._cluster.fetch_stream_method(address)(
                request, timeout=self._stream_timeout_s
            )
            reader = _Reader(call, partitions, self._queue, self._isolation == 1)
            self._readers.append(reader)
            reader.thread.start()

    def _request(
        self, partitions: dict[TopicPartition, int], epochs: dict[TopicPartition, int]
    ) -> pb.FetchStreamRequest:
        topics: dict[str, list[pb.FetchStreamPartition]] = {}
        for tp, offset in partitions.items():
            topics.setdefault(tp.topic, []).append(pb.FetchStreamPartition(
                partition=tp.partition, fetch_offset=offset, current_leader_epoch=epochs[tp],
                partition_max_bytes=self._partition_max_bytes,
            ))  # fmt: skip
        return pb.FetchStreamRequest(
            topics=[pb.FetchStreamTopic(name=t, partitions=ps) for t, ps in topics.items()],
            max_bytes=self._max_bytes, isolation_level=self._isolation,
        )  # fmt: skip

    def close(self) -> None:
        """Cancel the streams (the brokers drop their waiters at once) and close."""
        if self._closed:
            return
        self._closed = True
        for reader in self._readers:
            reader.closing = True
            reader.call.cancel()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for reader in self._readers:  # a reader blocked on the full queue: make room
            while reader.thread.is_alive() and time.monotonic() < deadline:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    reader.thread.join(0.05)
        self._readers.clear()
        self._cluster.close()
