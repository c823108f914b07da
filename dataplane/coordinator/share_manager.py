"""The share partitions a broker leads (KIP-932; Kafka's ``SharePartitionManager``): the IO
shell around :class:`~dataplane.coordinator.share_partition.SharePartition`.

**Loading.** A share partition (share group, topic partition) is loaded on its first use here,
as the partition's leader: its state is read from the share coordinator
(:mod:`dataplane.coordinator.share_coordinator`, which bumps its state epoch). A share
partition no leader served before starts at the group's ``share.auto.offset.reset`` (its group
config, else the broker's setting): the high watermark (``latest``, the default), the log start
(``earliest``) or the first record at most the duration old (``by_duration:PT1H``; the high
watermark if there is none), written at once, so a failover later does not move it. This is
Kafka 4.1's rule: its group coordinator initializes an assigned share partition at start offset
-1 and the leader resolves the reset when it first loads it (``SharePartition``'s
``startOffsetDuringInitialization``), so a change of the group's config applies to share
partitions not loaded yet and never moves a loaded one. Each
acquisition locks records for the group's ``share.record.lock.duration.ms``, read anew at
every fetch, so a changed group config applies to the next records acquired. Loads are one at
a time per share partition; they happen outside the manager's lock.

**Leadership.** After each metadata image the share partitions of partitions this broker no
longer leads, or leads at a new leader epoch, are dropped: the locks die with them (their
holders' acknowledgements then get INVALID_RECORD_STATE), and the next leader loads the state
that was last written, where acquired records are available again with their delivery counted.

**Reading.** A fetch reads the log from :meth:`SharePartition.fetch_offset` through the
partition's consumer read at the group's ``share.isolation.level`` (read anew at every fetch):
``read_uncommitted`` (the default) up to the high watermark, records of open and aborted
transactions delivered too; ``read_committed`` up to the last stable offset, the data batches
of aborted transactions archived, never acquired (:mod:`share_isolation`). It skips control
batches, acquires the records of the data batches and answers the whole batches that hold an
acquired record, with the acquired ranges. A fetch with nothing to acquire waits
(``max_wait_ms``) for appends to the partitions (past the last stable offset, read_committed),
a lock expiry or a release, and answers as soon as any record is acquired.

**Writing.** Acknowledgements (and the releases of a closing share session) are applied and
then written to the share coordinator, one write per share partition per request, before they
are answered; a write that fails undoes them in memory (the records they touched, as they
were) and the partition answers the error. A write carries only what changed since the last
one that succeeded (:meth:`SharePartition.delta`): an acknowledgement costs what it
acknowledges, not the window. A fetch writes only when it moved the start offset (the
deliveries it counted go with the next write). Lock expiry runs on a timer thread and writes
what it released.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import grpc

from dataplane.broker.partition import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    NotLeader,
    Partition,
    Role,
)
from dataplane.broker.replica_manager import ReplicaManager
from dataplane.coordinator.share_coordinator import (
    NO_START_OFFSET,
    ShareCoordinator,
    ShareKey,
    ShareState,
    batches_from_proto,
    batches_to_proto,
    share_key,
)
from dataplane.coordinator.share_isolation import aborted_batches
from dataplane.coordinator.share_partition import (
    AckBatch,
    AckType,
    AcquiredRange,
    SharePartition,
)
from dataplane.coordinator.share_sessions import ShareSessionCache
from dataplane.coordinator.transaction_markers import Channels
from metadata_quorum.group_configs import READ_COMMITTED as READ_COMMITTED_NAME
from metadata_quorum.group_configs import GroupConfigs, reset_duration_ms
from metadata_quorum.records import ConfigResourceType
from protos import share_pb2 as spb
from protos import share_pb2_grpc as spb_grpc
from raftlog.batch import iter_batches
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
T = TypeVar("T")
EARLIEST, LATEST = "earliest", "latest"
PERSIST_TIMEOUT_S = 10.0  # a read or write of the share coordinator, retries included
PERSIST_RPC_TIMEOUT_S = 5.0
PERSIST_BACKOFF_S = 0.1
TIMER_MAX_S = 1.0
READ_BYTES_MAX = 8 * 1024 * 1024  # one partition's read per fetch
RETRIABLE = frozenset({
    ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.NETWORK_EXCEPTION,
})  # fmt: skip


@dataclass(frozen=True)
class ShareSettings:
    """The broker's share-group settings (Kafka's names in the comments)."""

    record_lock_duration_ms: int = 30_000  # group.share.record.lock.duration.ms
    delivery_count_limit: int = 5  # group.share.delivery.count.limit
    partition_max_record_locks: int = 2_000  # group.share.partition.max.record.locks
    max_share_sessions: int = 2_000  # group.share.max.share.sessions
    auto_offset_reset: str = LATEST  # share.auto.offset.reset (a group config in Kafka)


class SharePersister(Protocol):
    """Where share-partition state lives (the share coordinator of its key)."""

    def read(self, share: ShareKey, leader_epoch: int) -> ShareState: ...

    def write(self, share: ShareKey, state: ShareState) -> None: ...


class CoordinatorPersister:
    """Reads and writes through the share coordinator of each key: this broker's own, called in
    process, or another broker's over ShareCoordinatorService; retried (bounded) while the
    coordinator moves or loads."""

    def __init__(self, coordinator: ShareCoordinator, channels: Channels) -> None:
        self.coordinator = coordinator
        self.channels = channels

    def read(self, share: ShareKey, leader_epoch: int) -> ShareState:
        def local() -> ShareState:
            return self.coordinator.read(share, leader_epoch)

        def remote(stub: spb_grpc.ShareCoordinatorServiceStub) -> ShareState:
            answer = stub.ReadShareGroupState(
                spb.ReadShareGroupStateRequest(
                    group_id=share[0], topic_id=share[1], partition=share[2],
                    leader_epoch=leader_epoch,
                ),
                timeout=PERSIST_RPC_TIMEOUT_S,
            )  # fmt: skip
            _raise(answer.error_code, answer.error_message)
            return ShareState(
                answer.state_epoch, leader_epoch, answer.start_offset,
                batches_from_proto(answer.state_batches),
            )  # fmt: skip

        return self._call(share, local, remote)

    def write(self, share: ShareKey, state: ShareState) -> None:
        def local() -> None:
            self.coordinator.write(share, state)

        def remote(stub: spb_grpc.ShareCoordinatorServiceStub) -> None:
            answer = stub.WriteShareGroupState(
                spb.WriteShareGroupStateRequest(
                    group_id=share[0], topic_id=share[1], partition=share[2],
                    state_epoch=state.state_epoch, leader_epoch=state.leader_epoch,
                    start_offset=state.start_offset,
                    state_batches=batches_to_proto(state.batches),
                ),
                timeout=PERSIST_RPC_TIMEOUT_S,
            )  # fmt: skip
            _raise(answer.error_code, answer.error_message)

        self._call(share, local, remote)

    def delete(self, group_id: str, keys: list[tuple[bytes, int]]) -> list[KafkaError | None]:
        """A deleted share group: each share partition's state deleted at its coordinator (a
        tombstone); an error per key (None: deleted, or there was none)."""
        out: list[KafkaError | None] = []
        for topic_id, partition in keys:
            share: ShareKey = (group_id, topic_id, partition)

            def local(share: ShareKey = share) -> None:
                (code,) = self.coordinator.delete(share[0], [(share[1], share[2])])
                _raise(code.code, f"share state of {share_key(*share)} not deleted")

            def remote(stub: spb_grpc.ShareCoordinatorServiceStub, share: ShareKey = share) -> None:
                answer = stub.DeleteShareGroupState(
                    spb.DeleteShareGroupStateRequest(
                        group_id=share[0],
                        partitions=[spb.SharePartitionKey(topic_id=share[1], partition=share[2])],
                    ),
                    timeout=PERSIST_RPC_TIMEOUT_S,
                )
                (result,) = answer.results
                _raise(result.error_code, result.error_message or f"{share_key(*share)}")

            try:
                self._call(share, local, remote)
                out.append(None)
            except KafkaError as error:
                out.append(error)
        return out

    def _call(
        self,
        share: ShareKey,
        local: Callable[[], T],
        remote: Callable[[spb_grpc.ShareCoordinatorServiceStub], T],
    ) -> T:
        key = share_key(*share)
        deadline = time.monotonic() + PERSIST_TIMEOUT_S
        while True:
            try:
                node, host, port = self.coordinator.find_coordinator(key)
                if node == self.coordinator.broker_id:
                    return local()
                channel = self.channels.get(f"{host}:{port}")
                return remote(spb_grpc.ShareCoordinatorServiceStub(channel))
            except grpc.RpcError as error:
                failure = KafkaError(ErrorCode.NETWORK_EXCEPTION, f"share coordinator: {error}")
            except KafkaError as error:
                failure = error
            if failure.error not in RETRIABLE or time.monotonic() + PERSIST_BACKOFF_S > deadline:
                raise failure
            time.sleep(PERSIST_BACKOFF_S)  # a bounded retry backoff, not a synchronisation


def _raise(code: int, message: str) -> None:
    if code:
        raise KafkaError(ErrorCode.from_code(code), message)


@dataclass
class _Entry:
    """A loaded share partition (its fields under ``lock``)."""

    share: SharePartition
    partition: Partition
    leader_epoch: int
    state_epoch: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    written_start: int = -1  # the start offset last written
    read_committed: bool = False  # the group's share.isolation.level at the last fetch


@dataclass(frozen=True)
class ShareTarget:
    """A partition a share fetch or acknowledgement names."""

    topic: str
    topic_id: bytes
    partition: int


@dataclass
class Fetched:
    """One partition's answer to a share fetch."""

    records: bytes = b""
    acquired: list[AcquiredRange] = field(default_factory=list)
    error: KafkaError | None = None
    leader_id: int = -1
    leader_epoch: int = -1


class SharePartitionManager:
    """The share partitions this broker leads (see the module docstring)."""

    def __init__(
        self,
        replicas: ReplicaManager,
        persister: SharePersister,
        settings: ShareSettings,
        clock_ms: Callable[[], int],
    ) -> None:
        self.replicas = replicas
        self.persister = persister
        self.settings = settings
        self.clock_ms = clock_ms
        self.wall_clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000
        self._group_defaults = GroupConfigs(
            share_record_lock_duration_ms=settings.record_lock_duration_ms,
            share_auto_offset_reset=settings.auto_offset_reset,
        )
        self._lock = threading.Lock()
        self._entries: dict[ShareKey, _Entry] = {}
        self._loaders: dict[ShareKey, threading.Lock] = {}
        self._waiters: set[threading.Event] = set()
        self._stop = threading.Event()
        self._timer = threading.Thread(target=self._timer_loop, name="share-locks", daemon=True)
        # The broker's share sessions (both doors: the Kafka listener and BrokerService), under
        # ``sessions_lock``; an idle session is evicted for a new one after twice the lock time.
        lock_ms = settings.record_lock_duration_ms
        self.sessions = ShareSessionCache(
            settings.max_share_sessions, evict_idle_ms=max(2 * lock_ms, 60_000)
        )
        self.sessions_lock = threading.Lock()

    def start(self) -> None:
        self._timer.start()

    def close(self) -> None:
        self._stop.set()
        if self._timer.is_alive():
            self._timer.join(timeout=5)

    # -- leadership ----------------------------------------------------------------------------
    def on_image(self) -> None:
        """Drop the share partitions of partitions no longer led here at their epoch."""
        with self._lock:
            for key, entry in list(self._entries.items()):
                partition = entry.partition
                if (
                    partition.role is not Role.LEADER
                    or partition.leader_epoch != entry.leader_epoch
                ):
                    del self._entries[key]
                    log.info("share partition %s unloaded (leadership moved)", share_key(*key))

    def _entry(self, group_id: str, target: ShareTarget) -> _Entry:
        partition = self.replicas.get(target.topic, target.partition)
        if partition.role is not Role.LEADER:
            raise KafkaError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{partition.name} is not led by this broker"
            )
        key = (group_id, target.topic_id, target.partition)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.leader_epoch == partition.leader_epoch:
                return entry
            loader = self._loaders.setdefault(key, threading.Lock())
        with loader:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and entry.leader_epoch == partition.leader_epoch:
                    return entry
            entry = self._load(key, partition)
            with self._lock:
                self._entries[key] = entry
                self._loaders.pop(key, None)
        return entry

    def _load(self, key: ShareKey, partition: Partition) -> _Entry:
        leader_epoch = partition.leader_epoch
        stored = self.persister.read(key, leader_epoch)
        settings = self.settings
        configs = self.group_configs(key[0])
        share = SharePartition(
            0, lock_duration_ms=configs.share_record_lock_duration_ms,
            delivery_count_limit=settings.delivery_count_limit,
            max_in_flight=settings.partition_max_record_locks,
        )  # fmt: skip
        entry = _Entry(share, partition, leader_epoch, stored.state_epoch)
        if stored.start_offset == NO_START_OFFSET:
            start = self._reset_offset(partition, configs.share_auto_offset_reset)
            share.restore(start, ())
        else:
            share.restore(stored.start_offset, stored.batches)
        share.log_start_moved(partition.log.log_start_offset)
        with entry.lock:
            self._persist(key, entry)
        log.info(
            "share partition %s loaded at state epoch %d: start offset %d, %d in flight",
            share_key(*key), stored.state_epoch, share.start_offset, share.in_flight(),
        )  # fmt: skip
        return entry

    def group_configs(self, group_id: str) -> GroupConfigs:
        """A group's configs (share.record.lock.duration.ms, share.auto.offset.reset): its
        overrides in this broker's metadata image over this broker's settings."""
        overrides = self.replicas.image.configs.get((ConfigResourceType.GROUP, group_id))
        defaults = self._group_defaults
        return defaults.with_overrides(overrides) if overrides else defaults

    def _reset_offset(self, partition: Partition, reset: str) -> int:
        """Where a new share partition starts (share.auto.offset.reset)."""
        if reset == EARLIEST:
            return partition.log.log_start_offset
        look_back_ms = reset_duration_ms(reset)
        if look_back_ms is not None:
            found = partition.log.offsets_for_time(self.wall_clock_ms() - look_back_ms)
            if found is not None and found[0] < partition.high_watermark:
                return max(found[0], partition.log.log_start_offset)
        return partition.high_watermark

    def _persist(self, key: ShareKey, entry: _Entry) -> None:
        """Under the entry's lock: write what changed since its last write, the start offset
        and the changed records' states (raises what the write raised, and the changes stay
        to be written; a fenced write drops the share partition)."""
        start, batches = entry.share.delta()
        state = ShareState(entry.state_epoch, entry.leader_epoch, start, tuple(batches))
        try:
            self.persister.write(key, state)
        except KafkaError as error:
            if error.error in (ErrorCode.FENCED_STATE_EPOCH, ErrorCode.FENCED_LEADER_EPOCH):
                with self._lock:
                    if self._entries.get(key) is entry:
                        del self._entries[key]
            raise
        entry.share.delta_written()
        entry.written_start = start

    # -- fetching ------------------------------------------------------------------------------
    def fetch(
        self,
        group_id: str,
        member_id: str,
        targets: Sequence[ShareTarget],
        max_records: int,
        max_bytes: int,
        max_wait_ms: int,
    ) -> list[Fetched]:
        """Acquire records for the member from each target; waits up to ``max_wait_ms`` while
        nothing can be acquired. One answer per target, in order."""
        deadline = time.monotonic() + max(max_wait_ms, 0) / 1000
        while True:
            answers = self._fetch_once(group_id, member_id, targets, max_records, max_bytes)
            if any(a.records or a.error for a in answers) or max_records <= 0:
                return answers
            entries = self._waitable(group_id, targets)
            if not entries or not self._wait(entries, deadline):
                return answers

    def _fetch_once(
        self,
        group_id: str,
        member_id: str,
        targets: Sequence[ShareTarget],
        max_records: int,
        max_bytes: int,
    ) -> list[Fetched]:
        answers = []
        remaining = max(max_bytes, 1)
        for target in targets:
            answer = Fetched()
            answers.append(answer)
            try:
                entry = self._entry(group_id, target)
                answer.leader_id, answer.leader_epoch = self.replicas.broker_id, entry.leader_epoch
                configs = self.group_configs(group_id)
                entry.share.lock_duration_ms = configs.share_record_lock_duration_ms
                entry.read_committed = configs.share_isolation_level == READ_COMMITTED_NAME
                if max_records <= 0 or remaining <= 0:
                    continue
                key = (group_id, target.topic_id, target.partition)
                with entry.lock:
                    self._acquire(key, entry, member_id, max_records, remaining, answer)
                remaining -= len(answer.records)
            except KafkaError as error:
                answer.error = error
                if isinstance(error, NotLeader):
                    answer.leader_id, answer.leader_epoch = error.leader_id, error.leader_epoch
        return answers

    def _acquire(
        self,
        key: ShareKey,
        entry: _Entry,
        member_id: str,
        max_records: int,
        max_bytes: int,
        answer: Fetched,
    ) -> None:
        share, partition = entry.share, entry.partition
        share.expire_locks(self.clock_ms())
        share.log_start_moved(partition.log.log_start_offset)
        if not share.window_full():
            isolation = READ_COMMITTED if entry.read_committed else READ_UNCOMMITTED
            read = partition.read_for_consumer(
                share.fetch_offset(), min(max_bytes, READ_BYTES_MAX), entry.leader_epoch, True,
                isolation,
            )  # fmt: skip
            # aborted transactions' batches (read_committed only): archived in the window, and
            # not handed to acquire, which archives the ones past it as the gaps they are
            skipped = set(aborted_batches(read.records, read.aborted))
            share.archive_available(
                o for first, last in skipped for o in range(first, min(last + 1, share.end_offset))
            )
            batches = [
                (position, header.size_bytes, header.base_offset, header.last_offset)
                for position, header in iter_batches(read.records)
                if not header.is_control and (header.base_offset, header.last_offset) not in skipped
            ]
            offsets = (o for _, _, first, last in batches for o in range(first, last + 1))
            answer.acquired = share.acquire(member_id, offsets, self.clock_ms(), max_records)
            answer.records = _batches_holding(read.records, batches, answer.acquired)
            read_end = _read_end(read.records)
            if not batches or share.end_offset > batches[-1][3]:
                share.archive_gaps(read_end)  # control batches past the last record acquired
        if share.start_offset != entry.written_start:
            self._persist(key, entry)

    def _waitable(self, group_id: str, targets: Sequence[ShareTarget]) -> list[_Entry]:
        with self._lock:
            found = (self._entries.get((group_id, t.topic_id, t.partition)) for t in targets)
            return [e for e in found if e is not None]

    def _wait(self, entries: list[_Entry], deadline: float) -> bool:
        """Until one of the share partitions may have records to acquire (an append, a high
        watermark move, a release) or the deadline; False at the deadline."""
        event = threading.Event()
        partitions = [e.partition for e in entries]
        for partition in partitions:
            partition.add_waiter(event, None)
        with self._lock:
            self._waiters.add(event)
        try:
            while not any(self._acquirable(e) for e in entries):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set():
                    return False
                event.wait(min(remaining, TIMER_MAX_S))
                event.clear()
            return True
        finally:
            with self._lock:
                self._waiters.discard(event)
            for partition in partitions:
                partition.remove_waiter(event)

    def _acquirable(self, entry: _Entry) -> bool:
        with entry.lock:
            share = entry.share
            if share.window_full():
                return False
            partition = entry.partition
            if entry.read_committed:  # records up to the last stable offset only
                return share.fetch_offset() < partition.last_stable_offset
            return share.fetch_offset() < partition.high_watermark

    def _released(self) -> None:
        """Records became available: wake the fetches waiting for some."""
        with self._lock:
            waiters = list(self._waiters)
        for event in waiters:
            event.set()

    # -- acknowledging -------------------------------------------------------------------------
    def acknowledge(
        self, group_id: str, member_id: str, acks: Sequence[tuple[ShareTarget, list[AckBatch]]]
    ) -> list[KafkaError | None]:
        """Apply and write each partition's acknowledgements, all or none per partition; the
        error of each (None: done). A RENEW restarts the lock for the group's
        ``share.record.lock.duration.ms`` as it is now (read anew, as a fetch does); renewals
        alone change nothing stored, so they are not written."""
        out: list[KafkaError | None] = []
        released = False
        lock_ms = self.group_configs(group_id).share_record_lock_duration_ms
        for target, batches in acks:
            try:
                entry = self._entry(group_id, target)
                key = (group_id, target.topic_id, target.partition)
                kinds = {kind for b in batches for kind in b.types}
                with entry.lock:
                    entry.share.lock_duration_ms = lock_ms
                    undo = entry.share.acknowledge(member_id, batches, self.clock_ms())
                    try:
                        if kinds != {AckType.RENEW}:
                            self._persist(key, entry)
                    except KafkaError:
                        entry.share.undo(undo)
                        raise
                released = released or bool(kinds - {AckType.ACCEPT, AckType.RENEW})
                out.append(None)
            except KafkaError as error:
                out.append(error)
        if released:
            self._released()
        return out

    def release_member(self, group_id: str, member_id: str, targets: Iterable[ShareTarget]) -> None:
        """A share session closed: its member's records on these partitions are released."""
        for target in targets:
            key = (group_id, target.topic_id, target.partition)
            with self._lock:
                entry = self._entries.get(key)
            if entry is None:
                continue
            with entry.lock:
                if entry.share.release_member(member_id):
                    self._persist_quietly(key, entry)
        self._released()

    def unload(self, group_id: str, targets: Iterable[ShareTarget]) -> None:
        """No share session fetches these share partitions any more: drop them (their state is
        written; the next fetch loads it again). A deleted share group's state is thus not
        carried on by a leader's memory into a new group of the same name."""
        with self._lock:
            for target in targets:
                key = (group_id, target.topic_id, target.partition)
                if self._entries.pop(key, None) is not None:
                    log.info("share partition %s unloaded (no share session)", share_key(*key))

    def _persist_quietly(self, key: ShareKey, entry: _Entry) -> None:
        """A write nobody waits for (a release, a lock expiry): a failure is logged, and the
        next write of the share partition carries the change."""
        try:
            self._persist(key, entry)
        except KafkaError as error:
            log.warning("share partition %s: state not written: %s", share_key(*key), error)

    # -- lock expiry ---------------------------------------------------------------------------
    def _timer_loop(self) -> None:
        while not self._stop.is_set():
            now_ms = self.clock_ms()
            with self._lock:
                entries = list(self._entries.items())
            due_ms = now_ms + int(TIMER_MAX_S * 1000)
            expired = False
            for key, entry in entries:
                with entry.lock:
                    if entry.share.expire_locks(now_ms):
                        expired = True
                        self._persist_quietly(key, entry)
                    deadline = entry.share.next_lock_deadline_ms()
                if deadline is not None:
                    due_ms = min(due_ms, deadline)
            if expired:
                self._released()
            self._stop.wait(max(due_ms - self.clock_ms(), 10) / 1000)

    # -- observation ---------------------------------------------------------------------------
    def loaded(self) -> list[ShareKey]:
        with self._lock:
            return list(self._entries)


def _read_end(records: bytes | memoryview) -> int:
    """The offset after the last batch read (-1: nothing read)."""
    end = -1
    for _, header in iter_batches(records):
        end = header.next_offset
    return end


def _batches_holding(
    records: bytes | memoryview,
    batches: list[tuple[int, int, int, int]],
    acquired: list[AcquiredRange],
) -> bytes:
    """The whole batches (position, size, first, last offset) that hold an acquired offset."""
    parts = []
    for position, size, first, last in batches:
        if any(r.first_offset <= last and first <= r.last_offset for r in acquired):
            parts.append(bytes(records[position : position + size]))
    return b"".join(parts)
