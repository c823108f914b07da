"""Fetch sessions (KIP-227): the broker remembers what a fetcher asks, so it asks only changes.

A full fetch (session id 0, epoch 0) names every partition; the broker answers all of them and,
if its cache has room, a new session id. The fetcher's next fetches are incremental (that id,
epoch 1, 2, ...): they name only the partitions added or whose fetch position changed, and
``forgotten_topics_data`` the ones dropped; the broker reads every partition of the session and
answers only those with something to say (records, a new high watermark, last stable offset or
log start offset, an error, a preferred read replica, a diverging epoch). Epoch -1 (FINAL_EPOCH)
is a full fetch without a session (and closes the one named), which is what librdkafka always
sends: it never opens a session.

This module is Kafka's ``FetchSession.scala`` without IO. It has two shells, each with its own
cache: dataplane/kafka/fetch.py (consumers on the KAFKA listener) and
dataplane/broker/follower_sessions.py (followers over gRPC, which reads only what changed:
``FetchSession.on_removed``, `FetchSessionCache.answer_read`).
:meth:`FetchSessionCache.new_context` is ``FetchManager.newContext`` and gives one of Kafka's
four contexts, whose ``respond`` is ``updateAndGenerateResponseData``.
The clock is passed in (``now_ms``) and so is the random generator of session ids.

The cache holds at most ``max.incremental.fetch.session.cache.slots`` sessions (Kafka's one
shard: Kafka 3.8 splits its cache in shards for lock contention, moot here). A new session
when the cache is full may evict, by Kafka's rules: the least recently used session if unused
for ``SESSION_EVICTION_MS``; otherwise the least valuable evictable one, ordered by (privileged,
partitions, id), if the new session is worth more: privileged (a follower's) beats not, more
partitions beat fewer. A session younger than ``SESSION_EVICTION_MS`` is evictable only by a
privileged one, and a privileged one only once it is that old. The evictable set is taken as
of each session's last use (as Kafka's ``touch`` files it). A session's lookup and update is
O(partitions in the request + partitions in the session); eviction scans the cache (only when
a full fetch finds it full).

Sessions here name topics (Fetch up to v12, what the listener serves, and BrokerService's
FetchRequest); ids come with v13.
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from raftlog.errors import ErrorCode

INVALID_SESSION_ID = 0  # "no session"
INITIAL_EPOCH = 0  # a full fetch that asks for a session (and closes the one it names)
FINAL_EPOCH = -1  # a full fetch without a session (closes the one it names)
SESSION_EVICTION_MS = 120_000  # Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS
CACHE_SLOTS_DEFAULT = 1000  # max.incremental.fetch.session.cache.slots
SESSION_ID_MAX = 2**31 - 1
NO_PREFERRED_REPLICA = -1

PartitionKey = tuple[str, int]  # (topic, partition)


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch`` (Kafka's ``FetchMetadata.nextEpoch``): FINAL_EPOCH stays,
    the largest int32 wraps to 1 (0 means a new session)."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == SESSION_ID_MAX else epoch + 1


class PartitionRequest(NamedTuple):
    """What a fetch asks of one partition (Kafka's ``FetchRequest.PartitionData``)."""

    fetch_offset: int
    current_leader_epoch: int
    log_start_offset: int  # the fetcher's (followers); -1 from consumers
    max_bytes: int
    last_fetched_epoch: int = -1  # the epoch of the follower's last batch (KIP-320); -1 consumers


class PartitionOutcome(NamedTuple):
    """What the answer says of one partition: what decides whether an incremental answer
    includes it."""

    records_bytes: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    preferred_read_replica: int = NO_PREFERRED_REPLICA
    diverging: bool = False


class Answer(NamedTuple):
    """A context's response header and which partitions go in it (None: all)."""

    error: ErrorCode
    session_id: int
    included: list[bool] | None


class CachedPartition:
    """A partition of a session: the fetcher's last request and what it was last told."""

    __slots__ = ("high_watermark", "last_stable_offset", "log_start_offset", "request")

    def __init__(self, request: PartitionRequest, outcome: PartitionOutcome | None = None) -> None:
        self.request = request
        self.high_watermark = -1 if outcome is None else outcome.high_watermark
        self.last_stable_offset = -1 if outcome is None else outcome.last_stable_offset
        self.log_start_offset = -1 if outcome is None else outcome.log_start_offset

    def must_respond(self, outcome: PartitionOutcome) -> bool:
        """Kafka's ``maybeUpdateResponseData``, updating what the fetcher was told: records, a
        changed high watermark, last stable offset or log start offset, an error (which also
        forgets the high watermark, so the partition is sent again once it clears), a preferred
        read replica or a diverging epoch."""
        respond = outcome.records_bytes > 0
        if self.high_watermark != outcome.high_watermark:
            self.high_watermark = outcome.high_watermark
            respond = True
        if self.last_stable_offset != outcome.last_stable_offset:
            self.last_stable_offset = outcome.last_stable_offset
            respond = True
        if self.log_start_offset != outcome.log_start_offset:
            self.log_start_offset = outcome.log_start_offset
            respond = True
        if outcome.error_code:
            self.high_watermark = -1
            respond = True
        return respond or outcome.preferred_read_replica >= 0 or outcome.diverging


@dataclass(eq=False)
class FetchSession:
    """One session: its partitions in the order they are read (those that returned records
    move to the end, so the next fetch's ``max_bytes`` favours the others), and the epoch the
    next incremental fetch must carry."""

    id: int
    privileged: bool  # a follower's session (none on the Kafka listener: followers use gRPC)
    partitions: OrderedDict[PartitionKey, CachedPartition]
    creation_ms: int
    last_used_ms: int
    epoch: int
    cached_size: int = -1  # the partition count as of its last touch
    swept_ms: int = 0  # when a fetch of this session last read every partition
    # a follower's session: what watches its partitions (follower_sessions.SessionWatch), and
    # what to call once the cache let the session go (evicted, closed, replaced)
    watch: Any = None
    on_removed: Callable[[], None] | None = None
    owner: int | None = None  # a follower's broker id: it has one session here at a time
    evictable_by_all: bool = False
    evictable_by_privileged: bool = False

    def eviction_key(self) -> tuple[bool, int, int]:
        return (self.privileged, self.cached_size, self.id)

    def update(
        self,
        wanted: Iterable[tuple[PartitionKey, PartitionRequest]],
        forgotten: Iterable[PartitionKey],
    ) -> None:
        """An incremental request's partitions: new ones are added at the end, known ones take
        the new request; then the forgotten ones are dropped."""
        partitions = self.partitions
        for key, request in wanted:
            cached = partitions.get(key)
            if cached is None:
                partitions[key] = CachedPartition(request)
            else:
                cached.request = request
        for key in forgotten:
            partitions.pop(key, None)


class SessionlessContext:
    """A fetch without a session (epoch FINAL_EPOCH, or an incremental one that forgot every
    partition): answered in full, session id 0."""

    kind = "sessionless"

    def __init__(self, partitions: list[tuple[PartitionKey, PartitionRequest]]) -> None:
        self.partitions = partitions

    def respond(self, outcomes: Sequence[PartitionOutcome] | None, now_ms: int) -> Answer:
        return Answer(ErrorCode.NONE, INVALID_SESSION_ID, None)


class SessionErrorContext:
    """An incremental fetch of a session that is gone or at another epoch: nothing is read,
    the answer is the error alone (the fetcher starts over with a full fetch)."""

    kind = "error"
    partitions: list[tuple[PartitionKey, PartitionRequest]] = []

    def __init__(self, error: ErrorCode) -> None:
        self.error = error

    def respond(self, outcomes: Sequence[PartitionOutcome] | None, now_ms: int) -> Answer:
        return Answer(self.error, INVALID_SESSION_ID, [])


class FullContext:
    """A full fetch (epoch 0): answered in full; a session of its partitions is created if the
    cache has room (or can make it), and its id answered, else 0."""

    kind = "full"

    def __init__(
        self,
        cache: FetchSessionCache,
        partitions: list[tuple[PartitionKey, PartitionRequest]],
        privileged: bool,
        owner: int | None = None,
    ) -> None:
        self.cache = cache
        self.partitions = partitions
        self.privileged = privileged
        self.owner = owner

    def respond(self, outcomes: Sequence[PartitionOutcome] | None, now_ms: int) -> Answer:
        assert outcomes is not None and len(outcomes) == len(self.partitions), "one per partition"
        session_id = self.cache.maybe_create(
            self.privileged, self.partitions, outcomes, now_ms, self.owner
        )
        return Answer(ErrorCode.NONE, session_id, None)


class IncrementalContext:
    """An incremental fetch of a live session at its epoch: every partition of the session is
    read (in the session's order), and the answer names only those with something to say."""

    kind = "incremental"

    def __init__(self, cache: FetchSessionCache, session: FetchSession, listed: bool) -> None:
        self.cache = cache
        self.session = session
        self.expected_epoch = session.epoch  # the session moved to it for this fetch
        # every partition of the session, in its order, taken under the cache's lock: a
        # consumer's fetch reads them all; a follower's reads what changed, never lists them
        self.partitions: list[tuple[PartitionKey, PartitionRequest]] = (
            [(key, cached.request) for key, cached in session.partitions.items()] if listed else []
        )

    def respond(self, outcomes: Sequence[PartitionOutcome] | None, now_ms: int) -> Answer:
        assert outcomes is not None and len(outcomes) == len(self.partitions), "one per partition"
        return self.cache.incremental_answer(self, outcomes)


FetchContext = SessionlessContext | SessionErrorContext | FullContext | IncrementalContext


class FetchSessionCache:
    """The broker's sessions, at most ``max_entries`` (thread-safe: one lock, held only for
    dictionary work)."""

    def __init__(
        self,
        max_entries: int = CACHE_SLOTS_DEFAULT,
        eviction_ms: int = SESSION_EVICTION_MS,
        rng: random.Random | None = None,
    ) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries {max_entries} is negative")
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        # by last use, least recent first (Kafka's lastUsed tree)
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self.total_partitions = 0  # Kafka's NumIncrementalFetchPartitionsCached
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def new_context(
        self,
        session_id: int,
        epoch: int,
        wanted: list[tuple[PartitionKey, PartitionRequest]],
        forgotten: list[PartitionKey],
        now_ms: int,
        privileged: bool = False,
        owner: int | None = None,
    ) -> FetchContext:
        """The context of one fetch request (Kafka's ``FetchManager.newContext``). ``owner``:
        the follower whose fetch it is; its new session replaces any other it has here."""
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):  # a full fetch closes the session it names
            if session_id != INVALID_SESSION_ID:
                with self._lock:
                    self._remove(session_id)
            if epoch == FINAL_EPOCH:
                return SessionlessContext(wanted)
            return FullContext(self, wanted, privileged, owner)
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return SessionErrorContext(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
            if session.epoch != epoch:
                return SessionErrorContext(ErrorCode.INVALID_FETCH_SESSION_EPOCH)
            session.update(wanted, forgotten)
            if not session.partitions:
                self._remove(session_id)
                return SessionlessContext(wanted)
            self._touch(session, now_ms)
            session.epoch = next_epoch(session.epoch)
            return IncrementalContext(self, session, listed=not privileged)

    def answer_read(
        self, context: IncrementalContext, outcomes: Mapping[PartitionKey, PartitionOutcome]
    ) -> tuple[ErrorCode, set[PartitionKey]]:
        """As `incremental_answer`, for a fetch that read only some of the session's
        partitions (a follower's: the others had nothing to say): which of those read the
        answer names."""
        session = context.session
        with self._lock:
            if (
                session.epoch != context.expected_epoch
                or self._sessions.get(session.id) is not session
            ):
                return ErrorCode.INVALID_FETCH_SESSION_EPOCH, set()
            partitions = session.partitions
            included = set()
            for key, outcome in outcomes.items():
                cached = partitions.get(key)
                if cached is not None and cached.must_respond(outcome):
                    included.add(key)
                    if outcome.records_bytes > 0:
                        partitions.move_to_end(key)
            return ErrorCode.NONE, included

    def incremental_answer(
        self, context: IncrementalContext, outcomes: Sequence[PartitionOutcome]
    ) -> Answer:
        """Which partitions an incremental answer names, updating what the session was told;
        INVALID_FETCH_SESSION_EPOCH if another fetch of the session came in between (a
        duplicate request: the session moved on)."""
        session = context.session
        with self._lock:
            if (
                session.epoch != context.expected_epoch
                or self._sessions.get(session.id) is not session
            ):
                return Answer(ErrorCode.INVALID_FETCH_SESSION_EPOCH, session.id, [])
            partitions = session.partitions
            included = []
            for (key, _request), outcome in zip(context.partitions, outcomes, strict=True):
                cached = partitions.get(key)
                respond = cached is not None and cached.must_respond(outcome)
                if respond and outcome.records_bytes > 0:
                    partitions.move_to_end(key)
                included.append(respond)
            return Answer(ErrorCode.NONE, session.id, included)

    def maybe_create(
        self,
        privileged: bool,
        partitions: list[tuple[PartitionKey, PartitionRequest]],
        outcomes: Sequence[PartitionOutcome],
        now_ms: int,
        owner: int | None = None,
    ) -> int:
        """A new session of these partitions, as told by these outcomes: its id, or
        INVALID_SESSION_ID if the cache is full and nothing in it may be evicted for it. A
        follower's (``owner``) replaces its other sessions: it fetches from this broker in one
        thread, and a session whose answer it never got (a fetch it gave up on) stayed until
        eviction, marked by every change of its partitions (a restarted follower once left
        135 of 8,000 partitions each on its leader)."""
        with self._lock:
            if owner is not None:
                for old in [s.id for s in self._sessions.values() if s.owner == owner]:
                    self._remove(old)
            size = len(partitions)
            if len(self._sessions) >= self.max_entries and not self._try_evict(
                privileged, size, now_ms
            ):
                return INVALID_SESSION_ID
            cached: OrderedDict[PartitionKey, CachedPartition] = OrderedDict(
                (key, CachedPartition(request, outcome))
                for (key, request), outcome in zip(partitions, outcomes, strict=True)
            )
            session = FetchSession(
                self._new_session_id(), privileged, cached, now_ms, now_ms,
                next_epoch(INITIAL_EPOCH), owner=owner,
            )  # fmt: skip
            self._sessions[session.id] = session
            self._touch(session, now_ms)
            return session.id

    def drop_stale(self, now_ms: int) -> int:
        """Remove the sessions unused for longer than ``eviction_ms`` (how many). Kafka evicts
        them only when the cache is full; the followers' cache calls this on each full fetch,
        so the sessions of fetchers that are gone (a restarted broker, a leader that moved) do
        not stay for the broker's life."""
        with self._lock:
            stale = [
                s for s in self._sessions.values() if now_ms - s.last_used_ms > self.eviction_ms
            ]
            for session in stale:
                self._remove(session.id)
            return len(stale)

    def _new_session_id(self) -> int:
        while True:
            session_id = self._rng.randint(1, SESSION_ID_MAX)
            if session_id not in self._sessions:
                return session_id

    def _try_evict(self, privileged: bool, size: int, now_ms: int) -> bool:
        """Kafka's ``tryEvict``: the stalest session if unused for ``eviction_ms``; else the
        least valuable evictable one if the new session is worth more."""
        if not self._sessions:
            return False
        stalest = next(iter(self._sessions.values()))
        if now_ms - stalest.last_used_ms > self.eviction_ms:
            self._evict(stalest)
            return True
        candidates = [
            s
            for s in self._sessions.values()
            if (s.evictable_by_privileged if privileged else s.evictable_by_all)
        ]
        if not candidates:
            return False
        cheapest = min(candidates, key=FetchSession.eviction_key)
        if (privileged, size, 0) < cheapest.eviction_key():
            return False
        self._evict(cheapest)
        return True

    def _evict(self, session: FetchSession) -> None:
        self._remove(session.id)
        self.evictions += 1

    def _remove(self, session_id: int) -> FetchSession | None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self.total_partitions -= session.cached_size
            if session.on_removed is not None:
                session.on_removed()
        return session

    def _touch(self, session: FetchSession, now_ms: int) -> None:
        """Kafka's ``touch``: last used now (the end of the LRU order), size and the evictable
        sets taken again."""
        session.last_used_ms = now_ms
        self._sessions.move_to_end(session.id)
        if session.cached_size != -1:
            self.total_partitions -= session.cached_size
        session.cached_size = len(session.partitions)
        self.total_partitions += session.cached_size
        old = now_ms - session.creation_ms > self.eviction_ms
        session.evictable_by_privileged = not session.privileged or old
        session.evictable_by_all = old
