"""Followers' fetch sessions (KIP-227) on the leader's BROKER listener.

A follower's fetcher fetches every partition it follows from one leader in one request, again
and again. Without a session each request names all of them and each answer answers all of
them, so an acks=all round to one partition cost a pass over every partition the two brokers
share, on both sides: at 10,000 partitions, a produce to 1,000 of them reached ~14% of the rate
to one (docs/performance.md, metadata scale). With a session, as Kafka's followers fetch:

- the follower sends a full fetch (``session_epoch`` 0) and gets a session id; its next fetches
  are incremental (epoch 1, 2, ...): they name only the partitions added or whose fetch
  position changed, and in ``forgotten_topics`` those it stopped fetching (a partition it backs
  off from, one it no longer follows). The cache and its rules (eviction, epochs, what an
  answer includes) are Kafka's, shared with the KAFKA listener: `fetch_sessions`.
- the answer names only the partitions with something to say: records, a new high watermark,
  last stable or log start offset, an error, a diverging epoch.

Kafka's leader still reads every partition of the session on each fetch. Here the leader also
skips what cannot have changed: a partition whose read left nothing to tell (no records, no
error, the follower at the leader's log end and in the ISR) is not read again until the
partition's change count moves (``Partition.changes``: every append, high watermark move, role,
epoch or ISR change, truncation and log start move counts). So an incremental fetch costs a
glance at each partition of the session and a read of those that changed. The follower's
caught-up time (which ``replica.lag.time.max.ms`` judges; reading a partition is what renews it)
is covered by a sweep: a fetch reads every partition of its session when the last such read is
older than a quarter of ``replica.lag.time.max.ms`` (at most `SWEEP_MS_MAX`).

A consumer's fetch over gRPC has no session (it is answered in full, session id 0): consumers
use sessions on the KAFKA listener (`dataplane.kafka.fetch`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import Counter

from dataplane.broker.answer_errors import fill_error
from dataplane.broker.fetch_sessions import (
    CACHE_SLOTS_DEFAULT,
    NO_PREFERRED_REPLICA,
    FetchSessionCache,
    FullContext,
    IncrementalContext,
    PartitionKey,
    PartitionOutcome,
    PartitionRequest,
    SessionErrorContext,
)
from dataplane.broker.metrics import FetchSessionGauge
from dataplane.broker.partition import ON_APPEND, Partition
from protos import broker_pb2 as pb
from protos.wire import FetchAnswer, Records, each_partition
from raftlog.errors import ErrorCode, KafkaError, OffsetOutOfRangeError

CONTEXTS = ("full", "incremental", "sessionless", "error")
SWEEP_MS_MAX = 5_000
SWEEP_MS_MIN = 100


class SessionReader(Protocol):
    """What the sessions need of the broker's servicer."""

    def read_request(
        self, request: pb.FetchRequest, context: Any
    ) -> FetchAnswer: ...  # a whole request, long poll included

    def lookup(self, topic: str, partition: int) -> Partition: ...

    def read_partition(
        self, request: pb.FetchRequest, partition: Partition, item: pb.FetchPartition,
        max_bytes: int, first: bool, result: pb.FetchPartitionResponse,
    ) -> Records: ...  # fmt: skip

    def wait(
        self, partitions: list[Partition], deadline: float, done: Callable[[], bool],
        marks: list[int], context: Any, replica_id: int,
    ) -> None: ...  # fmt: skip


def outcome_of(p: pb.FetchPartitionResponse, records: Records) -> PartitionOutcome:
    """What a partition's answer says, as the session cache compares it."""
    preferred = p.preferred_read_replica if p.HasField("preferred_read_replica") else -1
    return PartitionOutcome(
        len(records), p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset,
        preferred if preferred >= 0 else NO_PREFERRED_REPLICA, p.HasField("diverging_epoch"),
    )  # fmt: skip


def wanted_of(request: pb.FetchRequest) -> list[tuple[PartitionKey, PartitionRequest]]:
    wanted = []
    for topic in request.topics:
        for p in topic.partitions:
            asked = PartitionRequest(
                p.fetch_offset, p.current_leader_epoch, p.log_start_offset,
                p.partition_max_bytes, p.last_fetched_epoch,
            )  # fmt: skip
            wanted.append(((topic.name, p.partition), asked))
    return wanted


def forgotten_of(request: pb.FetchRequest) -> list[PartitionKey]:
    return [(t.name, index) for t in request.forgotten_topics for index in t.partitions]


class FollowerSessions:
    """The followers' session cache of one broker and the reads of their fetches."""

    def __init__(
        self,
        reader: SessionReader,
        clock_ms: Callable[[], int],
        lag_max_ms: Callable[[], int],
        counter: Counter,
        cache_slots: int = CACHE_SLOTS_DEFAULT,
    ) -> None:
        self.reader = reader
        self.clock_ms = clock_ms
        self.lag_max_ms = lag_max_ms
        self.cache = FetchSessionCache(cache_slots)
        self.counted = {kind: counter.labels(kind) for kind in CONTEXTS}

    def gauge(self) -> FetchSessionGauge:
        cache = self.cache
        return FetchSessionGauge(len(cache), cache.total_partitions, cache.evictions)

    def sweep_ms(self) -> int:
        return max(SWEEP_MS_MIN, min(SWEEP_MS_MAX, self.lag_max_ms() // 4))

    def fetch(self, request: pb.FetchRequest, deadline: float, context: Any) -> FetchAnswer:
        """A follower's fetch that carries ``session_epoch``."""
        now_ms = self.clock_ms()
        session_context = self.cache.new_context(
            request.session_id, request.session_epoch, wanted_of(request),
            forgotten_of(request), now_ms, privileged=True,
        )  # fmt: skip
        self.counted[session_context.kind].inc()
        if isinstance(session_context, SessionErrorContext):
            return FetchAnswer(pb.FetchResponse(error_code=session_context.error.code), [])
        if isinstance(session_context, IncrementalContext):
            return _IncrementalFetch(self, session_context, request, now_ms).run(deadline, context)
        answer = self.reader.read_request(request, context)  # it names every partition
        if isinstance(session_context, FullContext) and self.cache.max_entries > 0:
            self.cache.drop_stale(now_ms)
            outcomes = [
                outcome_of(p, r) for _, p, r in each_partition(answer.response, answer.records)
            ]
            answer.response.session_id = session_context.respond(outcomes, now_ms).session_id
        return answer


class _IncrementalFetch:
    """One incremental fetch: the session's partitions that may have changed are read (all of
    them when the sweep is due), then, if that found less than ``min_bytes``, read again as
    they change until it does or the wait is over; the answer names what has something to
    say."""

    def __init__(
        self, sessions: FollowerSessions, context: IncrementalContext, request: pb.FetchRequest,
        now_ms: int,
    ) -> None:  # fmt: skip
        self.reader = sessions.reader
        self.cache = sessions.cache
        self.context = context
        self.request = request
        session = context.session
        self.sweep = now_ms - session.swept_ms >= sessions.sweep_ms()
        if self.sweep:
            session.swept_ms = now_ms
        self.reads: dict[PartitionKey, tuple[pb.FetchPartitionResponse, Records]] = {}
        self.hosted: dict[PartitionKey, Partition] = {}
        self.total = 0
        self.limit = request.max_bytes if request.max_bytes > 0 else 2**31 - 1
        self.urgent = False  # an error or a diverging epoch: answer without waiting

    def run(self, deadline: float, context: Any) -> FetchAnswer:
        self.scan(everything=self.sweep)
        if not self.enough() and self.request.max_wait_ms > 0:

            def done() -> bool:
                self.scan(everything=False)
                return self.enough()

            partitions = list(self.hosted.values())
            marks = [ON_APPEND] * len(partitions)
            self.reader.wait(partitions, deadline, done, marks, context, self.request.replica_id)
        return self.answer()

    def enough(self) -> bool:
        return self.urgent or self.total >= max(self.request.min_bytes, 1)

    def scan(self, everything: bool) -> None:
        session = self.context.session
        for key, cached in list(session.partitions.items()):
            seen_of = cached.seen_of
            if not everything and seen_of is not None and cached.seen == seen_of.changes:
                # unchanged since a read left nothing to tell (a replica replaced since was
                # stopped, which counts as a change): not even looked up
                self.hosted[key] = seen_of
                continue
            try:
                partition = self.reader.lookup(*key)
            except KafkaError as gone:  # not hosted here any more
                self._store(key, self._result(key), b"", gone)
                continue
            self.hosted[key] = partition
            changes = partition.changes
            wanted = cached.request
            result, records, error = self._read(key, partition, wanted)
            self._store(key, result, records, error)
            settled = (
                error is None
                and not records
                and not result.HasField("diverging_epoch")
                and wanted.fetch_offset >= result.log_end_offset
                # out of the ISR, each fetch may be the one that lets it back in (a refused
                # expansion is proposed again after a backoff, at a read): read every time
                and self.request.replica_id in partition.isr
            )
            cached.seen, cached.seen_of = (changes, partition) if settled else (-1, None)

    def _result(self, key: PartitionKey) -> pb.FetchPartitionResponse:
        return pb.FetchPartitionResponse(
            partition=key[1], high_watermark=-1, log_start_offset=-1, log_end_offset=-1,
            leader_id=-1, leader_epoch=-1, last_stable_offset=-1,
        )  # fmt: skip

    def _read(
        self, key: PartitionKey, partition: Partition, wanted: PartitionRequest
    ) -> tuple[pb.FetchPartitionResponse, Records, KafkaError | None]:
        result = self._result(key)
        previous = self.reads.get(key)
        total = self.total - (0 if previous is None else len(previous[1]))  # it replaces that
        remaining = max(0, self.limit - total)
        item = pb.FetchPartition(
            partition=key[1], fetch_offset=wanted.fetch_offset,
            current_leader_epoch=wanted.current_leader_epoch,
            last_fetched_epoch=wanted.last_fetched_epoch,
            partition_max_bytes=wanted.max_bytes, log_start_offset=wanted.log_start_offset,
        )  # fmt: skip
        try:
            limit = min(wanted.max_bytes or remaining, remaining)
            records = self.reader.read_partition(
                self.request, partition, item, limit, total == 0, result
            )
        except OffsetOutOfRangeError as out_of_range:
            result.log_start_offset = partition.log.log_start_offset
            result.log_end_offset = partition.log.log_end_offset
            return result, b"", out_of_range
        except KafkaError as refused:
            return result, b"", refused
        return result, records, None

    def _store(
        self, key: PartitionKey, result: pb.FetchPartitionResponse, records: Records,
        error: KafkaError | None,
    ) -> None:  # fmt: skip
        if error is not None:
            fill_error(result, error)
            self.urgent = True
        elif result.HasField("diverging_epoch"):
            self.urgent = True
        previous = self.reads.get(key)
        if previous is not None:
            self.total -= len(previous[1])
        self.reads[key] = (result, records)
        self.total += len(records)

    def answer(self) -> FetchAnswer:
        outcomes = {
            key: outcome_of(result, records) for key, (result, records) in self.reads.items()
        }
        error, included = self.cache.answer_read(self.context, outcomes)
        response = pb.FetchResponse(error_code=error.code, session_id=self.context.session.id)
        records: list[Records] = []
        if error is not ErrorCode.NONE:
            return FetchAnswer(response, records)
        by_topic: dict[str, list[PartitionKey]] = {}
        for key in self.reads:
            if key in included:
                by_topic.setdefault(key[0], []).append(key)
        for name, keys in by_topic.items():  # records go in message order (protos.wire)
            topic = response.topics.add(name=name)
            for key in keys:
                result, data = self.reads[key]
                topic.partitions.append(result)
                records.append(data)
        return FetchAnswer(response, records)
