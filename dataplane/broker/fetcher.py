"""Replica fetchers: one thread per source broker, fetching all its partitions in one request.

A follower sends, per partition, its log end offset as the fetch offset, the epoch of its last
batch and the leader epoch it believes in. The leader answers with batches (appended unchanged),
its high watermark, or a diverging epoch: the follower then truncates to the leader's end offset
for that epoch (or its own, if smaller) and fetches again. A partition whose leader refuses it
(not leader, fenced epoch) is backed off until the metadata moves it.

Fetch sessions (KIP-227, the follower's side: Kafka's ``FetchSessionHandler``): the first fetch
from a leader is full (every partition, ``session_epoch`` 0) and asks for a session; once the
leader gave one, each fetch names only the partitions added or whose fetch state moved (fetch
offset, last fetched epoch, leader epoch, log start offset) and forgets those it no longer
fetches (backed off, no longer followed), and the answer names only the partitions with
something to say (dataplane.broker.follower_sessions is the leader's side). A session error,
an answer of another session or a failed call start a new session with a full fetch.

Within a session the fetcher's own work is O(partitions changed) too: it watches its partitions
(``Partition.watch``, as the leader's sessions do), and while the set it fetches stays the same
(no partition added, removed or backed off, the follower quota not exceeded) a fetch takes the
fetch state of the partitions that changed since the last one (an append, a truncation, a role
or log start change) and names those whose state moved; the others are neither looked at nor
named. Anything else builds the request from every partition, as the first fetch does.

Replication throttles, the follower's side: while the broker's follower quota is exceeded, the
partitions it throttles (named in the topic's ``follower.replication.throttled.replicas`` and out
of the ISR) are left out of the fetch request, and the bytes fetched for them are recorded against
the quota (see :mod:`dataplane.broker.replication_quota`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import grpc

from dataplane.broker.fetch_sessions import INITIAL_EPOCH, INVALID_SESSION_ID, next_epoch
from dataplane.broker.partition import Partition
from dataplane.broker.replication_quota import ReplicationQuota
from metadata_quorum.security.channels import ClientSecurity, open_channel
from protos import broker_pb2 as pb
from protos.wire import FetchAnswer, Records, each_partition, fetch_method
from raftlog.batch import OFFSET_LENGTH_EPOCH, OFFSET_LENGTH_EPOCH_SIZE
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
BACKOFF_MS = 100
BACKOFF_MAX_MS = 1000
RPC_MARGIN_S = 5.0
SESSION_ERRORS = frozenset({
    ErrorCode.FETCH_SESSION_ID_NOT_FOUND.code, ErrorCode.INVALID_FETCH_SESSION_EPOCH.code,
})  # fmt: skip


@dataclass(frozen=True)
class FetcherConfig:
    replica_fetch_max_bytes: int = 1024 * 1024
    replica_fetch_response_max_bytes: int = 10 * 1024 * 1024
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_min_bytes: int = 1
    # the fetch RPC's deadline (Kafka's replica.socket.timeout.ms); at least the long poll's
    # wait and RPC_MARGIN_S. It was that alone (5.5 s): at 10,000 partitions a restarted
    # follower's full fetch of 8,000 took the loaded leader longer, the follower gave up,
    # started a new session, and gave up again, its leader holding 135 sessions (1,086,885
    # partitions) it never used, and 1,000 partitions stayed out of the ISR for minutes
    replica_socket_timeout_ms: int = 30_000

    @property
    def fetch_timeout_s(self) -> float:
        return max(
            self.replica_socket_timeout_ms / 1000,
            self.replica_fetch_wait_max_ms / 1000 + RPC_MARGIN_S,
        )


class FetcherThread(threading.Thread):
    def __init__(
        self,
        broker_id: int,
        source_id: int,
        address_of: Callable[[int], str | None],
        broker_epoch: Callable[[], int],
        config: FetcherConfig,
        clock_ms: Callable[[], int],
        quota: ReplicationQuota | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        super().__init__(name=f"replica-fetcher-{broker_id}-from-{source_id}", daemon=True)
        self.broker_id = broker_id
        self.source_id = source_id
        self.address_of = address_of
        self.broker_epoch = broker_epoch
        self.config = config
        self.clock_ms = clock_ms
        self.quota = quota  # the broker's follower quota, shared by its fetchers
        self.security = security  # how to reach a BROKER listener that uses TLS
        self._lock = threading.Lock()
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._delayed_until_ms: dict[tuple[str, int], int] = {}
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._channel: grpc.Channel | None = None
        self._fetch: grpc.UnaryUnaryMultiCallable | None = None
        self._address: str | None = None
        self.session = FollowerSession()
        # each partition's fetch state as of its change count (``Partition.changes``: appends,
        # truncations, log start and role changes move it), so an unchanged partition's is not
        # taken again under its lock for every fetch
        self._states: dict[tuple[str, int], tuple[Partition, int, FetchState]] = {}
        # what changed since the last request (``changed``, from the partitions' watch), the
        # version of the partition set (moved by set_partitions), and the last request's every
        # state and sent entry as of that version (-1: a set held back in part, never reused)
        self._dirty: set[tuple[str, int]] = set()
        self._version = 0
        self._built: _Built | None = None

    # -- membership (metadata thread) --------------------------------------------------------------
    def set_partitions(self, partitions: list[Partition]) -> None:
        """Fetch ``partitions`` from now on. The same set again (most metadata updates change
        other partitions) keeps the request built for it: a new set is a new version, and the
        next request builds every partition's state again."""
        new = {(p.topic, p.partition): p for p in partitions}
        with self._lock:
            old = self._partitions
            if new == old:
                return
            self._partitions = new
            self._states = {k: v for k, v in self._states.items() if k in self._partitions}
            self._delayed_until_ms = {
                k: v for k, v in self._delayed_until_ms.items() if k in self._partitions
            }
            self._version += 1
        for key, partition in old.items():
            if new.get(key) is not partition:
                partition.unwatch(self)
        for key, partition in new.items():
            if old.get(key) is not partition:
                partition.watch(self, key)
        self._wake.set()

    def changed(self, key: tuple[str, int], wakes: bool) -> None:
        """A followed partition changed (``Partition.watch``; on the changing thread)."""
        self._dirty.add(key)

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        with self._lock:
            partitions, self._partitions = self._partitions, {}
        for partition in partitions.values():
            partition.unwatch(self)

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> None:
        backoff_ms = BACKOFF_MS
        while not self._stopped.is_set():
            ready, wait_ms, quota_wait_ms = self._ready_partitions()
            if not ready:
                self._wake.wait(wait_ms / 1000)
                self._wake.clear()
                continue
            fetch = self._fetch_method()
            if fetch is None:
                self._stopped.wait(backoff_ms / 1000)
                continue
            request, sent = self._request(ready)
            if quota_wait_ms is not None:  # back for the partitions held back once it allows
                request.max_wait_ms = min(request.max_wait_ms, quota_wait_ms)
            if not sent:
                self._wake.wait(BACKOFF_MS / 1000)
                self._wake.clear()
                continue
            try:
                answer = fetch(request, timeout=self.config.fetch_timeout_s)
            except grpc.RpcError as error:
                log.debug("fetch from %d failed: %s", self.source_id, error)
                self.session.failed()
                self._stopped.wait(backoff_ms / 1000)
                backoff_ms = min(backoff_ms * 2, BACKOFF_MAX_MS)
                self._drop_channel()
                continue
            backoff_ms = BACKOFF_MS
            if self._stopped.is_set():
                break  # stopped while fetching: the broker may have closed the logs already
            if not self.session.answered(request, answer.response):
                log.debug("fetch from %d: session error %d, starting a new session",
                          self.source_id, answer.response.error_code)  # fmt: skip
                continue
            self._handle(answer, sent)
        self._drop_channel()

    def _ready_partitions(self) -> tuple[list[Partition], int, int | None]:
        """The partitions to fetch now; how long to wait when there are none; and, when the
        follower quota holds throttled partitions back, how long until it lets them go.
        `Every` partition when none is backed off or held back."""
        if not self._delayed_until_ms and (self.quota is None or not self.quota.exceeded()):
            with self._lock:
                return Every(self._partitions.values(), self._version), BACKOFF_MAX_MS, None
        now_ms = self.clock_ms()
        with self._lock:
            if self._delayed_until_ms:
                ready = [
                    p
                    for key, p in self._partitions.items()
                    if self._delayed_until_ms.get(key, 0) <= now_ms
                ]
            else:
                ready = list(self._partitions.values())
            pending = [t - now_ms for t in self._delayed_until_ms.values() if t > now_ms]
            if len(pending) < len(self._delayed_until_ms):  # backoffs over: fetched again
                self._delayed_until_ms = {
                    k: t for k, t in self._delayed_until_ms.items() if t > now_ms
                }
        wait_ms = min(pending, default=BACKOFF_MAX_MS)
        if self.quota is None or not self.quota.exceeded():
            return ready, wait_ms, None
        throttled = {id(p) for p in ready if p.follower_throttles()}
        if not throttled:
            return ready, wait_ms, None
        quota_wait_ms = self.quota.delay_ms()
        ready = [p for p in ready if id(p) not in throttled]
        return ready, min(wait_ms, quota_wait_ms), quota_wait_ms

    def _fetch_method(self) -> grpc.UnaryUnaryMultiCallable | None:
        """Fetch on the source's channel, answering a ``protos.wire.FetchAnswer``: the records
        are views of the answer's bytes, appended to the log without a copy."""
        address = self.address_of(self.source_id)
        if address is None:
            return None
        if address != self._address:
            self._drop_channel()
            self._channel = open_channel(address, self.security)
            self._fetch = fetch_method(self._channel)
            self._address = address
        return self._fetch

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel, self._fetch, self._address = None, None, None

    def _request(
        self, partitions: list[Partition]
    ) -> tuple[pb.FetchRequest, dict[tuple[str, int], tuple[Partition, int, int]]]:
        """The next fetch of ``partitions`` (those of the session that moved, in a session),
        and every partition it fetches, named or not, with the fetch offset and leader epoch
        its answer is for."""
        request = pb.FetchRequest(
            replica_id=self.broker_id,
            broker_epoch=self.broker_epoch(),
            max_wait_ms=self.config.replica_fetch_wait_max_ms,
            min_bytes=self.config.replica_fetch_min_bytes,
            max_bytes=self.config.replica_fetch_response_max_bytes,
        )
        # `Every` partition of the set the last request was built from (its version; a request
        # of a set held back in part has -1), in the same session: only what changed is looked at
        version = partitions.version if isinstance(partitions, Every) else -1
        built = self._built
        if (
            built is not None
            and version >= 0
            and built.version == version
            and self.session.epoch != INITIAL_EPOCH
        ):
            changed = []
            while self._dirty:
                changed.append(self._dirty.pop())
            for key in changed:
                partition = self._partitions.get(key)
                fetched = None if partition is None else partition.fetch_state()
                if partition is None or fetched is None:
                    built.states.pop(key, None)
                    built.sent.pop(key, None)
                    continue
                state = FetchState(*fetched)
                built.states[key] = state
                built.sent[key] = (partition, state.fetch_offset, state.leader_epoch)
            self.session.build_changes(
                request, built.states, changed, self.config.replica_fetch_max_bytes
            )
            return request, built.sent
        self._dirty.clear()  # every state is taken below
        states: dict[tuple[str, int], FetchState] = {}
        sent: dict[tuple[str, int], tuple[Partition, int, int]] = {}
        known = self._states
        for partition in partitions:
            key = (partition.topic, partition.partition)
            changes = partition.changes  # before the state: a change after it counts again
            cached = known.get(key)
            if cached is not None and cached[0] is partition and cached[1] == changes:
                state = cached[2]
            else:
                fetched = partition.fetch_state()
                if fetched is None:
                    known.pop(key, None)
                    continue  # stopped or now leading: the next reconcile drops it
                state = FetchState(*fetched)
                known[key] = (partition, changes, state)
            states[key] = state
            sent[key] = (partition, state.fetch_offset, state.leader_epoch)
        self.session.build(request, states, self.config.replica_fetch_max_bytes)
        self._built = _Built(version, dict(states), dict(sent))
        return request, sent

    def _handle(
        self, answer: FetchAnswer, sent: dict[tuple[str, int], tuple[Partition, int, int]]
    ) -> None:
        for topic, item, records in each_partition(answer.response, answer.records):
            entry = sent.get((topic.name, item.partition))
            if entry is None:
                continue
            partition, fetch_offset, leader_epoch = entry
            if records and self.quota is not None and partition.follower_throttles():
                self.quota.record(len(records))
            try:
                error = apply_fetched(partition, fetch_offset, leader_epoch, item, records)
            except KafkaError as failure:
                log.warning("%s: follower append failed: %s", partition.name, failure)
                error = failure.error
            except Exception:
                # Not the thread's end: every other partition it fetches would stop with it
                # (Kafka's fetcher marks the partition failed and goes on). A chaos run found
                # one: a fetch answered for a replica that a reassignment stopped meanwhile.
                log.exception("%s: applying the leader's answer failed", partition.name)
                error = ErrorCode.UNKNOWN_SERVER_ERROR
            if error is not ErrorCode.NONE:
                log.debug("%s: leader %d answered %s", partition.name, self.source_id, error.name)
                self._delay(partition)

    def _delay(self, partition: Partition) -> None:
        with self._lock:
            self._delayed_until_ms[(partition.topic, partition.partition)] = (
                self.clock_ms() + BACKOFF_MS
            )


class Every(list[Partition]):
    """`FetcherThread._ready_partitions`: every partition of the fetcher, none held back, as
    of its partition set's ``version``."""

    def __init__(self, partitions: Iterable[Partition], version: int) -> None:
        super().__init__(partitions)
        self.version = version


@dataclass
class _Built:
    """The last request built from every partition of the fetcher's set ``version``: each
    partition's fetch state and what its answer is for, kept up to date by the requests that
    follow (only the changed partitions' entries move)."""

    version: int
    states: dict[tuple[str, int], FetchState]
    sent: dict[tuple[str, int], tuple[Partition, int, int]]


class FetchState(NamedTuple):
    """What a follower's fetch says of one partition (``Partition.fetch_state``)."""

    fetch_offset: int
    last_fetched_epoch: int
    leader_epoch: int
    log_start_offset: int


class FollowerSession:
    """The follower's side of a fetch session with one leader (Kafka's ``FetchSessionHandler``):
    what the session holds as the leader was last told it, its id and the next epoch. Used by
    one fetcher thread."""

    def __init__(self) -> None:
        self.id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH  # the next fetch's; INITIAL_EPOCH: a full fetch
        self.told: dict[tuple[str, int], FetchState] = {}
        # what the request being answered tells: every state (`build`) or the changes to
        # ``told``, None for a partition forgotten (`build_changes`)
        self._pending: dict[tuple[str, int], FetchState] = {}
        self._pending_changes: dict[tuple[str, int], FetchState | None] | None = None
        self.full_fetches = 0
        self.incremental_fetches = 0

    def build(
        self, request: pb.FetchRequest, states: dict[tuple[str, int], FetchState], max_bytes: int
    ) -> None:
        """Fill ``request``'s session fields and partitions for fetching ``states``: all of
        them in a full fetch; else those new or moved, and the others the session holds as
        forgotten."""
        request.session_id = self.id
        request.session_epoch = self.epoch
        full = self.epoch == INITIAL_EPOCH
        topics: dict[str, Any] = {}
        for key, state in states.items():
            if not full and self.told.get(key) == state:
                continue
            _name(request, topics, key, state, max_bytes)
        if not full:
            forgotten: dict[str, list[int]] = {}
            for key in self.told.keys() - states.keys():
                forgotten.setdefault(key[0], []).append(key[1])
            for name, indexes in forgotten.items():
                request.forgotten_topics.add(name=name, partitions=sorted(indexes))
        self._pending = states
        self._pending_changes = None
        if full:
            self.full_fetches += 1
        else:
            self.incremental_fetches += 1

    def build_changes(
        self,
        request: pb.FetchRequest,
        states: dict[tuple[str, int], FetchState],
        changed: list[tuple[str, int]],
        max_bytes: int,
    ) -> None:
        """`build` of an incremental fetch when only the ``changed`` keys of ``states`` can
        differ from what the leader was told (a key missing from ``states``: forgotten)."""
        assert self.epoch != INITIAL_EPOCH, "a full fetch names every partition: build"
        request.session_id = self.id
        request.session_epoch = self.epoch
        topics: dict[str, Any] = {}
        forgotten: dict[str, list[int]] = {}
        changes: dict[tuple[str, int], FetchState | None] = {}
        told = self.told
        for key in changed:
            state = states.get(key)
            if state == told.get(key):
                continue
            changes[key] = state
            if state is None:
                forgotten.setdefault(key[0], []).append(key[1])
                continue
            _name(request, topics, key, state, max_bytes)
        for name, indexes in forgotten.items():
            request.forgotten_topics.add(name=name, partitions=sorted(indexes))
        self._pending_changes = changes
        self.incremental_fetches += 1

    def answered(self, request: pb.FetchRequest, response: pb.FetchResponse) -> bool:
        """Take the leader's answer to ``request``: False if it is a session error (nothing
        was read; the next fetch is full)."""
        if response.error_code in SESSION_ERRORS:
            self.failed()
            return False
        if request.session_epoch == INITIAL_EPOCH:
            # a new session, or none (the leader's cache had no room): full fetches again
            self.id = response.session_id
            self.epoch = INITIAL_EPOCH if self.id == INVALID_SESSION_ID else next_epoch(0)
        elif response.session_id != self.id:
            self.failed()  # a leader that answered without the session: start one again
            return True  # the answer itself names every partition it read
        else:
            self.epoch = next_epoch(self.epoch)
        changes = self._pending_changes
        if changes is None:
            self.told = self._pending
            return True
        for key, state in changes.items():
            if state is None:
                self.told.pop(key, None)
            else:
                self.told[key] = state
        return True

    def failed(self) -> None:
        """The fetch failed (or the leader lost the session): the next one is full and closes
        this session on the leader."""
        self.epoch = INITIAL_EPOCH
        self.told = {}


def _name(
    request: pb.FetchRequest,
    topics: dict[str, Any],
    key: tuple[str, int],
    state: FetchState,
    max_bytes: int,
) -> None:
    """Name partition ``key`` in ``request`` at ``state`` (``topics``: the request's topics
    added so far, by name)."""
    topic = topics.get(key[0])
    if topic is None:
        topic = topics[key[0]] = request.topics.add(name=key[0])
    topic.partitions.add(
        partition=key[1], fetch_offset=state.fetch_offset,
        current_leader_epoch=state.leader_epoch, last_fetched_epoch=state.last_fetched_epoch,
        partition_max_bytes=max_bytes, log_start_offset=state.log_start_offset,
    )  # fmt: skip


def apply_fetched(
    partition: Partition,
    fetch_offset: int,
    leader_epoch: int,
    item: pb.FetchPartitionResponse,
    records: Records,
) -> ErrorCode:
    """Apply one partition of a leader's fetch response to the follower replica; the error to
    back off on (NONE when the answer was used, including a truncation)."""
    error = ErrorCode.from_code(item.error_code)
    if error is ErrorCode.NONE:
        if item.HasField("diverging_epoch"):
            truncate_diverged(partition, leader_epoch, item.diverging_epoch)
        elif not truncate_overlapped(partition, leader_epoch, records):
            partition.append_as_follower(
                records, item.high_watermark, leader_epoch, item.log_start_offset
            )
        return ErrorCode.NONE
    if error is ErrorCode.OFFSET_OUT_OF_RANGE:
        if fetch_offset < item.log_start_offset:
            log.info("%s: the leader starts at %d: restarting there", partition.name,
                     item.log_start_offset)  # fmt: skip
            partition.restart_at(item.log_start_offset, leader_epoch)
            return ErrorCode.NONE
        if fetch_offset > item.log_end_offset >= 0:
            log.warning("%s: ahead of the leader's end %d: truncating", partition.name,
                        item.log_end_offset)  # fmt: skip
            partition.truncate_to(item.log_end_offset, leader_epoch)
            return ErrorCode.NONE
    return error


def truncate_diverged(
    partition: Partition, leader_epoch: int, diverging: pb.EpochEndOffset
) -> None:
    """Truncate to the leader's end offset for the diverging epoch, or to our own end of that
    epoch if it is smaller (Kafka's ``getOffsetTruncationState``)."""
    own_end = partition.follower_end_of_epoch(diverging.epoch, leader_epoch)
    if own_end is None:
        return  # no longer following at that epoch: the answer is stale
    end = partition.truncate_to(min(diverging.end_offset, own_end), leader_epoch)
    log.info("%s: diverged from the leader at epoch %d: truncated to %d", partition.name,
             diverging.epoch, end)  # fmt: skip


def truncate_overlapped(partition: Partition, leader_epoch: int, records: Records) -> bool:
    """A leader batch that starts below our log end is a divergence the epoch check missed
    (our last epoch names batches the leader never had: issue 30 §1): the leader is right, so
    truncate to that batch's base offset. Whether the records must wait for the next fetch: the
    truncation took whole batches down below that base (ours were laid out differently), and
    appending there would leave a gap; the next fetch, from the new log end, fills it."""
    if len(records) < OFFSET_LENGTH_EPOCH_SIZE:
        return False
    base_offset = int(OFFSET_LENGTH_EPOCH.unpack_from(records, 0)[0])
    log_end = partition.follower_log_end(leader_epoch)
    if log_end is None or base_offset >= log_end:
        return False  # None: stopped under the fetch; the append below drops the records
    end = partition.truncate_to(base_offset, leader_epoch)
    log.warning("%s: the leader's batch at %d starts below our log end %d: diverged, "
                "truncated to %d", partition.name, base_offset, log_end, end)  # fmt: skip
    return end != base_offset


class FetcherManager:
    """Fetcher threads by source broker, reconciled with each metadata image."""

    def __init__(
        self,
        broker_id: int,
        address_of: Callable[[int], str | None],
        broker_epoch: Callable[[], int],
        config: FetcherConfig,
        clock_ms: Callable[[], int],
        quota: ReplicationQuota | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.address_of = address_of
        self.broker_epoch = broker_epoch
        self.config = config
        self.clock_ms = clock_ms
        self.quota = quota
        self.security = security
        self._threads: dict[int, FetcherThread] = {}

    def reconcile(self, followed: dict[int, list[Partition]]) -> None:
        for source_id in list(self._threads):
            if source_id not in followed:
                self._threads.pop(source_id).stop()
        for source_id, partitions in followed.items():
            thread = self._threads.get(source_id)
            if thread is None:
                thread = FetcherThread(
                    self.broker_id, source_id, self.address_of, self.broker_epoch,
                    self.config, self.clock_ms, self.quota, self.security,
                )  # fmt: skip
                self._threads[source_id] = thread
                thread.set_partitions(partitions)
                thread.start()
            else:
                thread.set_partitions(partitions)

    def close(self) -> None:
        threads = list(self._threads.values())
        self._threads.clear()
        for thread in threads:
            thread.stop()
        for thread in threads:
            thread.join(timeout=RPC_MARGIN_S + 2)
