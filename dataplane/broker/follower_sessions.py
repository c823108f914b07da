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

Kafka's leader still reads every partition of the session on each fetch. Here the leader reads
only what changed, and finds it without looking at the rest: each session watches its
partitions (:class:`SessionWatch`, ``Partition.watch``). Every change of a partition (append,
high watermark move, role, epoch or ISR change, truncation, log start move) marks it *dirty* in
the sessions that hold it, and those that would wake a follower's long poll (an append, a role,
epoch or ISR change; not a high watermark move alone) set the session's event, which its parked
fetch waits on. A fetch reads the dirty partitions, those the request names, and those whose
last read was *unsettled* (records or an error to tell, the follower behind the leader's log end
or out of the ISR: out of it, each fetch may be the one that lets it back in). A partition whose
read left nothing to tell is not read again until it changes. So an incremental fetch and its
long poll cost O(partitions changed), not O(partitions in the session), and no waiter is
registered per partition. The follower's caught-up time (which ``replica.lag.time.max.ms``
judges; reading a partition is what renews it) is covered by a sweep: a fetch reads every
partition of its session when the last such read is older than a quarter of
``replica.lag.time.max.ms`` (at most `SWEEP_MS_MAX`). The watches end with the session (the
cache's ``on_removed``) and with each partition the follower forgets.

A consumer's fetch over gRPC has no session (it is answered in full, session id 0): consumers
use sessions on the KAFKA listener (`dataplane.kafka.fetch`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
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
from dataplane.broker.partition import Partition
from protos import broker_pb2 as pb
from protos.wire import FetchAnswer, Records, each_partition
from raftlog.errors import ErrorCode, KafkaError, OffsetOutOfRangeError

CONTEXTS = ("full", "incremental", "sessionless", "error")
SWEEP_MS_MAX = 5_000
# a fetch that reads more than 1/ORDERED_SHARE of its session reads in the session's order
ORDERED_SHARE = 8
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

    def quota_deadline(self, replica_id: int, hosted: list[Partition]) -> float: ...


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


class SessionWatch:
    """A follower session's watch on its partitions: the keys changed since its last read
    (``dirty``), those whose last read was not settled, the replicas it watches, and the event
    its parked fetch waits on. ``changed`` runs on the changing thread (``Partition._changed``):
    it only takes note (``set.add`` and ``Event.set`` are safe without a lock of its own)."""

    __slots__ = ("_lock", "dirty", "event", "released", "unsettled", "watched")

    def __init__(self) -> None:
        self.dirty: set[PartitionKey] = set()
        self.unsettled: set[PartitionKey] = set()
        self.watched: dict[PartitionKey, Partition] = {}
        self.event = threading.Event()
        self.released = False
        self._lock = threading.Lock()  # watch, forget and release against each other

    def changed(self, key: PartitionKey, wakes: bool) -> None:
        self.dirty.add(key)
        if wakes:
            self.event.set()

    def take_dirty(self) -> list[PartitionKey]:
        """The keys marked since the last take (a change while they are read marks again)."""
        dirty, taken = self.dirty, []
        while dirty:
            taken.append(dirty.pop())  # atomic: a concurrent mark is taken now or next time
        return taken

    def watch(self, key: PartitionKey, partition: Partition) -> None:
        """Watch ``partition`` as ``key`` (a replica replaced under the key: the new one)."""
        with self._lock:
            if self.released:
                return
            old = self.watched.get(key)
            if old is partition:
                return
            if old is not None:
                old.unwatch(self)
            self.watched[key] = partition
        partition.watch(self, key)

    def forget(self, key: PartitionKey) -> None:
        with self._lock:
            old = self.watched.pop(key, None)
        if old is not None:
            old.unwatch(self)
        self.unsettled.discard(key)
        self.dirty.discard(key)

    def release(self) -> None:
        """The session is gone: no more watching, and a parked fetch of it wakes."""
        with self._lock:
            self.released = True
            watched, self.watched = self.watched, {}
        for partition in watched.values():
            partition.unwatch(self)
        self.event.set()


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
        self._parked = 0  # incremental fetches in their long poll now
        self._parked_lock = threading.Lock()

    @property
    def parked(self) -> int:
        """Incremental fetches in their long poll now."""
        return self._parked

    def _park(self, by: int) -> None:
        with self._parked_lock:
            self._parked += by

    def gauge(self) -> FetchSessionGauge:
        cache = self.cache
        return FetchSessionGauge(len(cache), cache.total_partitions, cache.evictions)

    def sweep_ms(self) -> int:
        return max(SWEEP_MS_MIN, min(SWEEP_MS_MAX, self.lag_max_ms() // 4))

    def fetch(self, request: pb.FetchRequest, deadline: float, context: Any) -> FetchAnswer:
        """A follower's fetch that carries ``session_epoch``."""
        now_ms = self.clock_ms()
        wanted, forgotten = wanted_of(request), forgotten_of(request)
        session_context = self.cache.new_context(
            request.session_id, request.session_epoch, wanted, forgotten, now_ms,
            privileged=True, owner=request.replica_id,
        )  # fmt: skip
        self.counted[session_context.kind].inc()
        if isinstance(session_context, SessionErrorContext):
            return FetchAnswer(pb.FetchResponse(error_code=session_context.error.code), [])
        if isinstance(session_context, IncrementalContext):
            watch = session_context.session.watch
            if watch is not None:  # named: added or moved; forgotten: no longer watched
                for key in forgotten:
                    watch.forget(key)
                watch.dirty.update(key for key, _ in wanted)
            fetch = _IncrementalFetch(self, session_context, request, now_ms)
            return fetch.run(deadline, context)
        answer = self.reader.read_request(request, context)  # it names every partition
        if isinstance(session_context, FullContext) and self.cache.max_entries > 0:
            self.cache.drop_stale(now_ms)
            outcomes = [
                outcome_of(p, r) for _, p, r in each_partition(answer.response, answer.records)
            ]
            answer.response.session_id = session_context.respond(outcomes, now_ms).session_id
        return answer


class _IncrementalFetch:
    """One incremental fetch: the session's partitions that changed are read (all of them the
    first time and when the sweep is due), then, if that found less than ``min_bytes``, read
    again as they change until it does or the wait is over; the answer names what has
    something to say."""

    def __init__(
        self, sessions: FollowerSessions, context: IncrementalContext, request: pb.FetchRequest,
        now_ms: int,
    ) -> None:  # fmt: skip
        self.sessions = sessions
        self.reader = sessions.reader
        self.cache = sessions.cache
        self.context = context
        self.request = request
        session = context.session
        if session.watch is None:  # its first incremental fetch: watch every partition
            session.watch = SessionWatch()
            session.on_removed = session.watch.release
            session.swept_ms = 0
        self.watch: SessionWatch = session.watch
        self.sweep = now_ms - session.swept_ms >= sessions.sweep_ms()
        if self.sweep:
            session.swept_ms = now_ms
        self.reads: dict[PartitionKey, tuple[pb.FetchPartitionResponse, Records]] = {}
        self.hosted: dict[PartitionKey, Partition] = {}  # those read by this fetch
        self.total = 0
        self.limit = request.max_bytes if request.max_bytes > 0 else 2**31 - 1
        self.urgent = False  # an error or a diverging epoch: answer without waiting

    def run(self, deadline: float, context: Any) -> FetchAnswer:
        watch = self.watch
        watch.event.clear()  # a change from here on wakes the wait below
        self.scan(everything=self.sweep)
        if not self.enough() and self.request.max_wait_ms > 0:
            self.long_poll(deadline, context)
        return self.answer()

    def long_poll(self, deadline: float, context: Any) -> None:
        """Wait on the session's event (an append to one of its partitions, a role, epoch or
        ISR change, the gRPC call's end, the session's end) and read what changed, until
        ``min_bytes`` or the deadline (sooner when throttled replicas wait for the quota)."""
        replica_id = self.request.replica_id
        deadline = min(deadline, self.reader.quota_deadline(replica_id, list(self.hosted.values())))
        event = self.watch.event
        if context is not None:
            context.add_callback(event.set)  # False: it has ended already, is_active says so
        self.sessions._park(1)
        try:
            while not self.enough() and not self.watch.released:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (context is not None and not context.is_active()):
                    return
                event.wait(remaining)
                event.clear()
                self.scan(everything=False)
        finally:
            self.sessions._park(-1)

    def enough(self) -> bool:
        return self.urgent or self.total >= max(self.request.min_bytes, 1)

    def scan(self, everything: bool) -> None:
        """Read the partitions that changed or were not settled (``everything``: all of the
        session's), and take note of which are settled now."""
        watch = self.watch
        partitions = self.context.session.partitions
        dirty = watch.take_dirty()
        keys: Iterable[PartitionKey] = partitions
        if not everything:
            chosen = watch.unsettled.union(dirty)
            # in the session's order when many are read (those that returned records last:
            # max_bytes favours the others, as Kafka's order does); a few, as they come
            if len(chosen) * ORDERED_SHARE < len(partitions):
                keys = chosen
            else:
                keys = [key for key in partitions if key in chosen]
        keys = list(keys)
        for key in keys:
            cached = partitions.get(key)
            if cached is None:  # forgotten by the follower since it was marked
                watch.forget(key)
                continue
            try:
                partition = self.reader.lookup(*key)
            except KafkaError as gone:  # not hosted here any more: its replica let go
                self._store(key, self._result(key), b"", gone)
                watch.forget(key)
                watch.unsettled.add(key)  # read (refused) until the follower forgets it
                continue
            watch.watch(key, partition)
            self.hosted[key] = partition
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
            if settled:
                watch.unsettled.discard(key)
            else:
                watch.unsettled.add(key)

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
