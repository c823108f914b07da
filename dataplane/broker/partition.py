"""One partition replica on a broker: its log, its role, and (as leader) its followers.

The metadata thread moves a replica between roles (``make_leader``, ``make_follower``, ``stop``);
request threads append and read; the replica fetcher appends as a follower. One lock guards the
role and the replication state; the ``Log`` has its own. The arithmetic lives in
:mod:`dataplane.broker.replica_state`; this class is the shell around it.

Anything waiting on this replica (a long-polling fetch, an acks=all produce) registers a
``threading.Event`` and is woken on every append, high watermark move and role change, as far
as it waits for them (``add_waiter``: an acks=all produce for its high watermark, a follower's
fetch for appends).

Pipelined idempotent batches. A producer has up to five requests in flight, and gRPC serves
concurrent calls on a pool of threads, so a batch can reach the append before the one sent just
ahead of it. Kafka never sees this (a connection's requests are served in order); refused with
OUT_OF_ORDER_SEQUENCE_NUMBER, the client would resend it alone after ``retry.backoff.ms``, and
under load that stall was the producer's ceiling. So a batch whose sequence is *ahead* of its
producer's next one waits (``sequence_wait_s``, on a condition of this replica's lock, woken
with every other waiter) for the batches in between, and is refused only when they do not come.

Producer state (idempotence) and its snapshots. The state is loaded on open from the newest
``<offset>.snapshot`` at or below the log end plus the batch headers after it (every header
without a valid snapshot), reloaded the same way after a truncation (snapshots above the new end
deleted first), and snapshotted at every segment roll and at a clean stop (at the log end, so a
clean restart rescans nothing). The roll is noticed here, after the append, not by a callback
from the log's roll: the state is updated under this replica's lock *after* ``Log.append``
returns, so inside the log's roll it does not yet cover the last append when the retention
thread rolls (it holds no replica lock), and taking this lock there would invert the lock order
of the append path. After an append the state is exact: if the append began a new segment, the
state before its batches are counted is the state as of that segment's base offset. (A segment
rolled by retention between an append and this check gets no snapshot: the next open rescans
from the previous one.) The log's two hooks only delete snapshot files, which needs no state:
``log_start_listener`` those of segments retention removed, ``segments_replaced_listener`` those
of segments the cleaner merged into one (Kafka's ``deleteProducerSnapshots``); the newest always
stays. The open deletes the strays (not at a segment's base, but the newest) a crash kept.

Transactions. Markers are control batches: the leader appends one with :meth:`append_marker`
(WriteTxnMarkers), a follower meets them in the leader's bytes; either way the producer state
applies it and an abort goes to the ``.txnindex`` of the marker's segment, so a new leader has
the same last stable offset and aborted index. The rescan on open or after a truncation reads
the markers it meets (headers do not say commit or abort) and adds the aborts the index lacks.
The last stable offset is computed when asked, from the producer state and the high watermark.
A read_committed read stops there and returns the aborted transactions of what it read.
Transactional produce under KIP-890: :meth:`start_verification` gives the guard the produce
path holds while the coordinator is asked (outside this lock); a marker in between voids it.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from dataplane.broker import replica_state as rs
from dataplane.broker.alter_partition import Refusal, refusal
from dataplane.broker.producer_state import (
    SENTINEL,
    OutOfOrderSequenceError,
    ProducerEntry,
    ProducerStates,
    SnapshotFiles,
    VerificationGuard,
)
from metadata_quorum.image import PartitionRegistration
from raftlog.batch import (
    HEADER_SIZE,
    NO_PRODUCER_ID,
    BatchHeader,
    iter_batches,
    read_header,
    verify_batch,
)
from raftlog.checkpoint import read_checkpoint
from raftlog.epoch import UNDEFINED_EPOCH
from raftlog.errors import (
    ErrorCode,
    InvalidRecordError,
    KafkaError,
    OffsetOutOfRangeError,
    StorageError,
)
from raftlog.log import AppendInfo, Log
from raftlog.txn import AbortedTxn, Marker, encode_marker, read_marker

log = logging.getLogger(__name__)
# the high watermark, one file per partition: what versions before 2026-11-28 wrote (read once)
HIGH_WATERMARK_CHECKPOINT = "high-watermark-checkpoint"
NO_LEADER = -1
DELETE_TO_HIGH_WATERMARK = -1  # DeleteRecords' offset for "up to the high watermark"
ON_APPEND = -1  # add_waiter: wake on appends (and role, epoch, ISR), not high watermark moves
ISR_RETRY_BACKOFF_MS = 500
READ_UNCOMMITTED, READ_COMMITTED = 0, 1  # Kafka's isolation levels
# Kafka's producer.id.expiration.check.interval.ms (or producer.id.expiration.ms if shorter)
PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS = 600_000


class Waker(Protocol):
    """What a waiter registers (``add_waiter``): a ``threading.Event``, or anything set like
    one (``dataplane.broker.service.wait_for_each`` learns which partition woke it)."""

    def set(self) -> None: ...


class Watcher(Protocol):
    """What watches a replica's changes: a follower's fetch session on the leader, the
    replica fetcher on a follower."""

    def changed(self, key: tuple[str, int], wakes: bool) -> None: ...


class Role(enum.Enum):
    NONE = "none"  # opened, no role yet
    LEADER = "leader"
    FOLLOWER = "follower"
    STOPPED = "stopped"


_LEGAL = {
    Role.NONE: {Role.LEADER, Role.FOLLOWER, Role.STOPPED},
    Role.LEADER: {Role.LEADER, Role.FOLLOWER, Role.STOPPED},
    Role.FOLLOWER: {Role.LEADER, Role.FOLLOWER, Role.STOPPED},
    Role.STOPPED: set(),
}


@dataclass(frozen=True)
class IsrChange:
    """An AlterPartition proposal of the leader."""

    topic: str
    topic_id: uuid.UUID
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]


class ReadResult(NamedTuple):
    records: bytes
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    diverging: tuple[int, int] | None  # (epoch, end offset) the follower must truncate to
    last_stable_offset: int = -1
    aborted: tuple[AbortedTxn, ...] = ()  # read_committed: the aborted transactions of the range


class LeaderView(NamedTuple):
    """A leader's offsets and its followers' states at one moment (KIP-392's replica
    selection reads them; Kafka's ``fetchOffsetSnapshot`` and ``remoteReplicas``)."""

    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    log_end_offset: int
    isr: tuple[int, ...]
    followers: tuple[rs.FollowerState, ...]


class NotLeader(KafkaError):
    def __init__(self, error: ErrorCode, message: str, leader_id: int, leader_epoch: int) -> None:
        super().__init__(error, message)
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch


class Partition:
    def __init__(
        self,
        topic: str,
        partition: int,
        topic_id: uuid.UUID,
        log: Log,
        broker_id: int,
        clock_ms: Callable[[], int],
        high_watermark: int | None = None,
    ) -> None:
        """``high_watermark``: the one the broker's ``replication-offset-checkpoint`` holds for
        this partition (dataplane.broker.replica_manager); None: read the per-partition file of
        older versions, if there is one (``legacy_hw_checkpoint`` says so), else 0."""
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.log = log
        self.broker_id = broker_id
        self.clock_ms = clock_ms
        self._lock = threading.Lock()
        # a waiter's high watermark to wake at (an acks=all produce), None: every change
        self._waiters: dict[Waker, int | None] = {}
        # how many times this replica changed (appends, high watermark, role, epoch, ISR, log
        # start, truncation): the follower's fetcher takes its fetch state again only once it
        # moved (dataplane.broker.fetcher)
        self.changes = 0
        # what watches this replica, with its key in each: on a leader the followers' fetch
        # sessions holding it (dataplane.broker.follower_sessions), on a follower the fetcher
        # fetching it (dataplane.broker.fetcher). Each change marks it for their next look;
        # ``wakes``: the change would wake a follower's long poll (not a high watermark move)
        self._watchers: dict[Watcher, tuple[str, int]] = {}
        # idempotent batches that overtook a batch of their producer, waiting for it
        self._sequenced = threading.Condition(self._lock)
        self._sequence_waiters = 0
        self.role = Role.NONE
        self.leader_id = NO_LEADER
        self.leader_epoch = UNDEFINED_EPOCH
        self.partition_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()  # committed by the controller
        self.pending_isr: tuple[int, ...] | None = None  # an AlterPartition in flight
        self.followers: dict[int, rs.FollowerState] = {}
        self.epoch_start_offset = 0
        # set by the replica manager from its image: may this broker join an ISR now?
        self.isr_eligible: Callable[[int], bool] = lambda broker_id: True
        # set by the replica manager from the topic's *.replication.throttled.replicas: is this
        # replica throttled on the leader's side (its fetchers' catch-up) or the follower's?
        self.leader_throttled = False
        self.follower_throttled = False
        # set by the replica manager from the topic's min.insync.replicas: the high watermark
        # does not advance while the ISR is smaller (KIP-966)
        self.min_insync_replicas = 1
        self._isr_retry_at_ms = 0  # after a refused ISR change, wait before proposing again
        self.legacy_hw_checkpoint = (
            not log.created and (log.directory / HIGH_WATERMARK_CHECKPOINT).exists()
        )
        if high_watermark is None:
            high_watermark = self._read_legacy_hw_checkpoint()
        self.high_watermark = min(high_watermark, log.log_end_offset)
        self.snapshots = SnapshotFiles(log.directory)
        # a replica whose directory was just made has no snapshot and no batch to read
        self.producers = ProducerStates() if log.created else self._load_producer_state()
        self._active_base_offset = log.active.base_offset  # a change means the log rolled
        self._next_expiry_check_ms = 0  # the first append checks
        log.log_start_listener = self._log_start_moved
        log.segments_replaced_listener = self.snapshots.delete_inside

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def _log_start_moved(self, offset: int) -> None:
        """The log start moved (retention, DeleteRecords): a change for the fetch sessions,
        and the producer-state snapshots below it go."""
        self._changed(wakes=False)
        self.snapshots.delete_below(offset)

    def watch(self, watcher: Watcher, key: tuple[str, int]) -> None:
        """Tell ``watcher`` of every change of this replica from now on (``changed(key,
        wakes)``, on the changing thread: it must only take note)."""
        with self._lock:
            self._watchers[watcher] = key

    def unwatch(self, watcher: Watcher) -> None:
        with self._lock:
            self._watchers.pop(watcher, None)

    @property
    def watcher_count(self) -> int:
        """Followers' fetch sessions watching this replica."""
        with self._lock:
            return len(self._watchers)

    def _changed(self, wakes: bool) -> None:
        self.changes += 1
        if self._watchers:
            for watcher, key in tuple(self._watchers.items()):
                watcher.changed(key, wakes)

    # -- waiting -------------------------------------------------------------------------------
    def add_waiter(self, event: Waker, high_watermark: int | None = None) -> None:
        """Set ``event`` on changes: all of them; or with ``high_watermark`` only on those of
        role, epoch or ISR and once the high watermark reaches it; or with ``ON_APPEND`` (a
        follower's fetch) on those and on appends, not on high watermark moves."""
        with self._lock:
            self._waiters[event] = high_watermark

    def remove_waiter(self, event: Waker) -> None:
        with self._lock:
            self._waiters.pop(event, None)

    @property
    def waiter_count(self) -> int:
        """Long polls and acks=all produces waiting on this partition now."""
        with self._lock:
            return len(self._waiters)

    def _wake(self, everyone: bool = True, appended: bool = False) -> None:
        """Wake the waiters; after an append or a high watermark move (``everyone`` False) not
        the acks=all produces still short of it (with five in flight, each append and each
        follower fetch woke all five to find nothing to answer), and after a high watermark
        move not the followers' fetches (each woke the other follower's parked fetch to read
        nothing new)."""
        self._changed(wakes=everyone or appended)
        if self._sequence_waiters:
            self._sequenced.notify_all()
        hw = self.high_watermark
        for event, target in self._waiters.items():
            if everyone or target is None or (appended if target == ON_APPEND else target <= hw):
                event.set()

    # -- role changes ----------------------------------------------------------------------------
    def _transition_to(self, role: Role) -> None:
        if role not in _LEGAL[self.role]:
            raise AssertionError(f"{self.name}: illegal replica transition {self.role} -> {role}")
        self.role = role

    def _set_registration(self, reg: PartitionRegistration) -> None:
        self.leader_id = reg.leader
        self.leader_epoch = reg.leader_epoch
        self.partition_epoch = reg.partition_epoch
        self.replicas = reg.replicas
        self.isr = reg.isr
        if self.role is Role.LEADER:
            self._sync_followers()

    def _sync_followers(self) -> None:
        """A leader whose replicas changed within its epoch (a reassignment adds or drops
        replicas): new followers start with a fresh state, dropped ones are forgotten."""
        wanted = [b for b in self.replicas if b != self.broker_id]
        if wanted == list(self.followers):
            return
        now_ms = self.clock_ms()
        self.followers = {
            b: self.followers.get(b) or rs.FollowerState(b, last_caught_up_ms=now_ms)
            for b in wanted
        }

    def make_leader(self, reg: PartitionRegistration) -> bool:
        """Lead at ``reg.leader_epoch``; True if this starts a new leadership (epoch)."""
        with self._lock:
            if self.role is Role.LEADER and reg.leader_epoch == self.leader_epoch:
                if reg.partition_epoch > self.partition_epoch:
                    self._set_registration(reg)
                    self.pending_isr = None
                    self._maybe_advance_hw()
                    self._changed(wakes=False)  # the replicas may have changed: sessions look
                return False
            self._transition_to(Role.LEADER)
            self._set_registration(reg)
            self.pending_isr = None
            now_ms = self.clock_ms()
            # Every replica gets a fresh caught-up time: nobody is blamed for the election.
            self.followers = {
                b: rs.FollowerState(b, last_caught_up_ms=now_ms)
                for b in reg.replicas
                if b != self.broker_id
            }
            self.epoch_start_offset = self.log.log_end_offset
            self.log.assign_leader_epoch(reg.leader_epoch)
            self._maybe_advance_hw()
            self._wake()
            return True

    def make_follower(self, reg: PartitionRegistration) -> bool:
        """Follow ``reg.leader``; True if the leader or its epoch changed (fetch anew)."""
        with self._lock:
            changed = (
                self.role is not Role.FOLLOWER
                or reg.leader_epoch != self.leader_epoch
                or reg.leader != self.leader_id
            )
            if changed:
                self._transition_to(Role.FOLLOWER)
                self.followers = {}
                self.pending_isr = None
            self._set_registration(reg)
            self._wake()
            return changed

    def stop(self) -> None:
        """No role any more; a clean stop snapshots the producer state at the log end."""
        with self._lock:
            if self.role is not Role.STOPPED:
                self._transition_to(Role.STOPPED)
                if self.log.segment_count:  # not closed under us
                    self._write_snapshot(self.log.log_end_offset)
                    self.sync_snapshots()  # the ones written on rolls since the last tick
            self._wake()

    # -- checks --------------------------------------------------------------------------------
    def _not_leader(self, error: ErrorCode = ErrorCode.NOT_LEADER_OR_FOLLOWER) -> NotLeader:
        return NotLeader(
            error,
            f"broker {self.broker_id} does not lead {self.name}; the leader is {self.leader_id} "
            f"at epoch {self.leader_epoch}",
            self.leader_id,
            self.leader_epoch,
        )

    def _check_leader(self, current_leader_epoch: int) -> None:
        self._check_epoch(current_leader_epoch)
        if self.role is not Role.LEADER:
            raise self._not_leader()

    def _check_epoch(self, current_leader_epoch: int) -> None:
        """Kafka's ``checkCurrentLeaderEpoch``: the client's leader epoch (-1: unchecked) is
        this replica's, as leader or follower."""
        if current_leader_epoch >= 0 and current_leader_epoch != self.leader_epoch:
            error = (
                ErrorCode.FENCED_LEADER_EPOCH
                if current_leader_epoch < self.leader_epoch
                else ErrorCode.UNKNOWN_LEADER_EPOCH
            )
            raise self._not_leader(error)

    # -- replication throttles ---------------------------------------------------------------------
    def leader_throttles(self, replica_id: int) -> bool:
        """Does the leader's quota bound ``replica_id``'s fetches? Only out of the ISR: a
        caught-up follower is never slowed (Kafka's ``shouldLeaderThrottle``)."""
        return self.leader_throttled and replica_id not in self.isr

    def follower_throttles(self) -> bool:
        """Does the follower's quota bound this replica's fetches (Kafka's
        ``shouldFollowerThrottle``)? Only while it is out of the ISR."""
        return self.follower_throttled and self.broker_id not in self.isr

    # -- the leader's paths ------------------------------------------------------------------------
    def append_as_leader(
        self,
        records: bytes | memoryview,
        acks: int,
        min_insync_replicas: int,
        sequence_wait_s: float = 0.0,
        verification: VerificationGuard | None = None,
    ) -> tuple[AppendInfo, int]:
        """Append a client's records and return what was stored with the leader epoch it was
        stored under.

        ``sequence_wait_s``: an idempotent batch whose sequence is ahead of its producer's next
        one waits up to this long for the batches in between (see the module docstring) before
        it is refused with OUT_OF_ORDER_SEQUENCE_NUMBER. ``verification``: None when the
        broker verifies no transactions; else what :meth:`start_verification` gave for this
        batch's producer (a transactional batch that would open a transaction needs it)."""
        with self._lock:
            self._check_writable(acks, min_insync_replicas)  # Kafka's order: leadership first
            header = read_header(records) if len(records) >= HEADER_SIZE else None
            if header is None or header.producer_id == NO_PRODUCER_ID:
                info = self.log.append(records, leader_epoch=self.leader_epoch, from_client=True)
                self._snapshot_if_rolled(info.first_offset)
            else:
                info = self._append_idempotent(
                    records, acks, min_insync_replicas, sequence_wait_s, verification
                )
            self._maybe_advance_hw()
            self._wake(everyone=False, appended=True)  # fetches: data; produces: the watermark
            return info, self.leader_epoch

    def _check_writable(self, acks: int, min_insync_replicas: int) -> None:
        self._check_leader(-1)
        if acks == -1 and len(self.isr) < min_insync_replicas:
            raise KafkaError(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                f"{self.name}: ISR {list(self.isr)} is smaller than min.insync.replicas "
                f"{min_insync_replicas}",
            )

    def _append_idempotent(
        self,
        records: bytes | memoryview,
        acks: int,
        min_insync_replicas: int,
        sequence_wait_s: float,
        verification: VerificationGuard | None,
    ) -> AppendInfo:
        """One batch with a producer id: a retry gets its original offsets, nothing appended;
        one ahead of its producer's sequence waits for the batches in between (the lock is
        released while it waits, so leadership is checked again after)."""
        header = verify_batch(records, 0)
        if header.size_bytes != len(records):
            raise InvalidRecordError("an idempotent produce carries exactly one batch")
        deadline: float | None = None
        while True:
            self._maybe_expire_producers()
            try:
                stored = self.producers.check(header, verification)
                break
            except OutOfOrderSequenceError as error:
                now = time.monotonic()
                deadline = now + sequence_wait_s if deadline is None else deadline
                if not error.ahead or now >= deadline:
                    # behind, or what it overtook did not come within the wait
                    log.debug("%s: refused a batch at offset %d: %s", self.name,
                              self.log.log_end_offset, error.message)  # fmt: skip
                    raise
                self._sequence_waiters += 1
                try:
                    self._sequenced.wait(deadline - now)
                finally:
                    self._sequence_waiters -= 1
                self._check_writable(acks, min_insync_replicas)
        if stored is not None:
            return AppendInfo(
                stored.first_offset, stored.last_offset, stored.max_timestamp, -1,
                header.record_count, 0,
            )  # fmt: skip
        info = self.log.append(records, leader_epoch=self.leader_epoch, from_client=True)
        self._snapshot_if_rolled(info.first_offset)
        self.producers.update(header._replace(base_offset=info.first_offset))
        return info

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        *,
        commit: bool,
        coordinator_epoch: int,
        min_insync_replicas: int = 1,
    ) -> tuple[AppendInfo, int]:
        """Append the marker that ends the producer's transaction here (WriteTxnMarkers; the
        caller waits for its replication as for an acks=all produce). Refused as Kafka's
        ``appendEndTxnMarker`` refuses it: INVALID_PRODUCER_EPOCH for an older producer epoch,
        TRANSACTION_COORDINATOR_FENCED for an older coordinator epoch; NOT_ENOUGH_REPLICAS
        below ``min.insync.replicas`` (markers are written with acks=all)."""
        with self._lock:
            self._check_writable(-1, min_insync_replicas)
            self.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
            records = encode_marker(
                producer_id, producer_epoch, commit=commit, coordinator_epoch=coordinator_epoch,
                timestamp_ms=self.clock_ms(),
            )  # fmt: skip
            info = self.log.append(records, leader_epoch=self.leader_epoch)
            self._snapshot_if_rolled(info.first_offset)
            header = read_header(records)._replace(base_offset=info.first_offset)
            marker = Marker(producer_id, producer_epoch, commit, coordinator_epoch)
            self._apply(header, marker)
            self._maybe_advance_hw()
            self._wake(everyone=False, appended=True)
            return info, self.leader_epoch

    def start_verification(self, producer_id: int, producer_epoch: int) -> VerificationGuard:
        """Before a transactional batch: SENTINEL if the producer's transaction is open here
        (nothing to ask), else a new guard to hold while the coordinator is asked (KIP-890)."""
        with self._lock:
            self._check_leader(-1)
            if self.producers.has_ongoing_transaction(producer_id, producer_epoch):
                return SENTINEL
            return self.producers.start_verification(producer_id, producer_epoch, self.clock_ms())

    def active_producers(self) -> list[tuple[int, ProducerEntry]]:
        """The leader's producers (DescribeProducers, KIP-664): copies, by producer id."""
        with self._lock:
            self._check_leader(-1)
            return [
                (producer_id, dataclasses.replace(entry, batches=entry.batches.copy()))
                for producer_id, entry in sorted(self.producers.items())
            ]

    def _apply(self, header: BatchHeader, marker: Marker | None) -> None:
        """Count a stored batch in the producer state; an abort marker's transaction goes to
        the transaction index of the marker's segment."""
        aborted = self.producers.update(header, marker)
        if aborted is not None:
            self.log.append_aborted(aborted)

    def acks_all_outcome(
        self, required_offset: int, leader_epoch: int, min_insync_replicas: int
    ) -> ErrorCode | None:
        """None while an acks=all produce must wait for ``required_offset`` to be replicated."""
        with self._lock:
            if self.role is not Role.LEADER or self.leader_epoch != leader_epoch:
                raise self._not_leader()
            return rs.acks_all_outcome(
                required_offset, self.high_watermark, len(self.isr), min_insync_replicas
            )

    def leader_state(self, current_leader_epoch: int, committed: bool = False) -> tuple[int, int]:
        """(leader epoch, high watermark), if this replica leads at ``current_leader_epoch``.

        With ``committed`` (a client asks where the committed records end), a new leader whose
        high watermark has not yet reached the start of its epoch answers OFFSET_NOT_AVAILABLE
        (retriable), as Kafka does since KIP-207: it only learnt the old leader's high watermark
        one fetch late, so until its followers fetch it would report an end offset below
        records the old leader had acknowledged, and offsets would go backwards."""
        with self._lock:
            self._check_leader(current_leader_epoch)
            if committed and self.high_watermark < self.epoch_start_offset:
                raise KafkaError(
                    ErrorCode.OFFSET_NOT_AVAILABLE,
                    f"{self.name}: the high watermark {self.high_watermark} is behind the start "
                    f"of leader epoch {self.leader_epoch} at offset {self.epoch_start_offset}",
                )
            return self.leader_epoch, self.high_watermark

    def leader_view(self, current_leader_epoch: int) -> LeaderView | None:
        """This leader's offsets and followers, None if it does not lead (a follower serving
        a consumer chooses no other replica); FENCED/UNKNOWN_LEADER_EPOCH for another epoch."""
        with self._lock:
            self._check_epoch(current_leader_epoch)
            if self.role is not Role.LEADER:
                return None
            return LeaderView(
                self.high_watermark, self._last_stable_offset(), self.log.log_start_offset,
                self.log.log_end_offset, self.isr, tuple(self.followers.values()),
            )  # fmt: skip

    def _maximal_isr(self) -> tuple[int, ...]:
        """While an ISR change is in flight, the high watermark waits on both sets."""
        if self.pending_isr is None:
            return self.isr
        return tuple(sorted(set(self.isr) | set(self.pending_isr)))

    def _under_min_isr(self) -> bool:
        """Kafka's ``isUnderMinIsr``: the committed ISR is smaller than min.insync.replicas, or
        than the replica count when that is smaller (``effectiveMinIsr``)."""
        return len(self.isr) < min(self.min_insync_replicas, len(self.replicas))

    def _maybe_advance_hw(self) -> None:
        """Kafka's ``maybeIncrementLeaderHW``, which since 3.7 (KIP-966) leaves the high
        watermark where it is while the partition is under min ISR: every replica that left
        the ISR since then (the ELR) still holds every committed record, so one can be elected
        without losing any. Appends with acks=1 or 0 still go to the log; they are committed,
        and visible to consumers, once the ISR is back at min ISR."""
        if self.role is not Role.LEADER or self._under_min_isr():
            return
        new_hw = rs.high_watermark(
            self.high_watermark,
            self.broker_id,
            self.log.log_end_offset,
            self.followers,
            self._maximal_isr(),
        )
        if new_hw != self.high_watermark:
            self.high_watermark = new_hw
            self._wake(everyone=False)

    def _last_stable_offset(self) -> int:
        """The first offset of the earliest transaction not yet decided and replicated, or the
        high watermark if that is lower (Kafka's ``UnifiedLog.lastStableOffset``)."""
        hw = self.high_watermark
        unstable = self.producers.first_unstable_offset(hw)
        return hw if unstable is None else min(unstable, hw)

    @property
    def last_stable_offset(self) -> int:
        with self._lock:
            return self._last_stable_offset()

    def read_for_consumer(
        self,
        offset: int,
        max_bytes: int,
        current_leader_epoch: int,
        min_one_batch: bool,
        isolation_level: int = READ_UNCOMMITTED,
        leader_only: bool = True,
    ) -> ReadResult:
        """A consumer's read: up to the high watermark, or with READ_COMMITTED up to the last
        stable offset with the aborted transactions that meet the range read (Kafka's
        ``collectAbortedTransactions``, from the fetch offset to the end of the last batch).
        Not ``leader_only`` (a consumer that sent its rack, KIP-392) a follower serves too, up
        to its own high watermark (the leader's, one fetch late)."""
        with self._lock:
            if leader_only or self.role is not Role.FOLLOWER:
                self._check_leader(current_leader_epoch)
            else:
                self._check_epoch(current_leader_epoch)
            hw = self.high_watermark
            lso = self._last_stable_offset()
        committed = isolation_level == READ_COMMITTED
        records = self.log.read(
            offset, max_bytes, max_offset=lso if committed else hw, min_one_batch=min_one_batch
        )
        aborted: tuple[AbortedTxn, ...] = ()
        if committed and records:
            end = _end_of_batches(records)
            aborted = tuple(self.log.aborted_transactions(offset, end))
        return ReadResult(records, hw, self.log.log_start_offset, self.log.log_end_offset, None,
                          lso, aborted)  # fmt: skip

    def end_offset_for_epoch(self, current_leader_epoch: int, leader_epoch: int) -> tuple[int, int]:
        """A consumer's OffsetForLeaderEpoch (KIP-320), on the leader only: (the largest epoch
        <= ``leader_epoch``, where the next higher one starts: the log end offset for the
        latest), (-1, -1) when the log knows no such epoch (Kafka's
        ``Partition.lastOffsetForLeaderEpoch``)."""
        with self._lock:
            self._check_leader(current_leader_epoch)
            return self.log.end_offset_for_epoch(leader_epoch)

    def read_for_follower(
        self,
        replica_id: int,
        fetch_offset: int,
        last_fetched_epoch: int,
        current_leader_epoch: int,
        max_bytes: int,
        *,
        throttled: bool = False,
        log_start_offset: int = rs.UNKNOWN_OFFSET,
    ) -> tuple[ReadResult, IsrChange | None]:
        """Serve a follower's fetch; it also reports the follower's log end offset and its
        ``log_start_offset`` (a DeleteRecords waits for it). A ``throttled`` fetch (the
        leader's replication quota is exceeded) gets no records."""
        with self._lock:
            self._check_leader(current_leader_epoch)
            if replica_id not in self.followers:
                raise KafkaError(
                    ErrorCode.NOT_LEADER_OR_FOLLOWER,
                    f"broker {replica_id} is not a replica of {self.name}",
                )
            leo = self.log.log_end_offset
            if last_fetched_epoch >= 0:
                epoch, end_offset = self.log.end_offset_for_epoch(last_fetched_epoch)
                if epoch < 0:
                    end_offset = leo  # an empty log: the follower keeps nothing above it
                if epoch < last_fetched_epoch or end_offset < fetch_offset:
                    result = ReadResult(
                        b"", self.high_watermark, self.log.log_start_offset, leo,
                        (epoch, end_offset), self._last_stable_offset(),
                    )  # fmt: skip
                    return result, None
            if not self.log.log_start_offset <= fetch_offset <= leo:
                raise OffsetOutOfRangeError(
                    f"{self.name}: fetch offset {fetch_offset} is outside "
                    f"[{self.log.log_start_offset}, {leo}]"
                )
            now_ms = self.clock_ms()
            before = self.followers[replica_id]
            state = rs.after_fetch(before, fetch_offset, leo, now_ms, log_start_offset)
            self.followers[replica_id] = state
            self._maybe_advance_hw()
            if state.log_start_offset != before.log_start_offset:
                self._wake(everyone=False)  # a DeleteRecords waiting for the replicas
            change = self._isr_expansion(state)
            hw = self.high_watermark
            lso = self._last_stable_offset()
        records = b"" if throttled else self.log.read(fetch_offset, max_bytes, min_one_batch=True)
        return ReadResult(records, hw, self.log.log_start_offset, leo, None, lso), change

    # -- DeleteRecords ---------------------------------------------------------------------------
    def delete_records(self, offset: int) -> int:
        """Move the log start offset to ``offset`` (-1: the high watermark) as the leader
        (Kafka's ``deleteRecordsOnLeader``); returns the offset it asked for. Refused with
        POLICY_VIOLATION for a log without the delete cleanup policy, OFFSET_OUT_OF_RANGE for
        an offset below 0 or beyond the high watermark. The segments wholly below go at once."""
        with self._lock:
            if self.role is not Role.LEADER:
                raise self._not_leader()
            if not self.log.config.delete:
                raise KafkaError(
                    ErrorCode.POLICY_VIOLATION,
                    f"records of {self.name} cannot be deleted: its cleanup.policy has no delete",
                )
            hw = self.high_watermark
            wanted = hw if offset == DELETE_TO_HIGH_WATERMARK else offset
            if wanted < 0:
                raise OffsetOutOfRangeError(f"{self.name}: offset {offset} is not valid")
            self.log.maybe_increment_log_start_offset(wanted, hw)
        self.log.delete_old_segments(hw, retention=False)
        return wanted

    def low_watermark(self, alive: Collection[int]) -> int:
        """The lowest log start offset of the leader and its followers on ``alive`` brokers."""
        with self._lock:
            if self.role is not Role.LEADER:
                raise self._not_leader()
            return rs.low_watermark(self.log.log_start_offset, self.followers, self.replicas, alive)

    def _isr_expansion(self, follower: rs.FollowerState) -> IsrChange | None:
        if self.pending_isr is not None or self.clock_ms() < self._isr_retry_at_ms:
            return None
        if not rs.may_join_isr(follower, self.isr, self.high_watermark, self.epoch_start_offset):
            return None
        if not self.isr_eligible(follower.broker_id):
            return None
        return self._propose(tuple(sorted((*self.isr, follower.broker_id))))

    def _propose(self, new_isr: tuple[int, ...]) -> IsrChange:
        self.pending_isr = new_isr
        return IsrChange(
            self.topic, self.topic_id, self.partition, self.leader_epoch, self.partition_epoch,
            new_isr,
        )  # fmt: skip

    def isr_shrink(self, now_ms: int, lag_max_ms: int) -> IsrChange | None:
        """Drop followers that lag past ``replica.lag.time.max.ms`` (never the leader)."""
        with self._lock:
            if self.role is not Role.LEADER or self.pending_isr is not None:
                return None
            if now_ms < self._isr_retry_at_ms:
                return None
            lagging = rs.out_of_sync(self.broker_id, self.isr, self.followers, now_ms, lag_max_ms)
            if not lagging:
                return None
            return self._propose(tuple(b for b in self.isr if b not in lagging))

    def proposes(self, change: IsrChange) -> bool:
        """Is ``change`` still this leader's pending proposal? (Metadata that brought a newer
        partition epoch or another leadership reset it: it need not be sent any more.)"""
        with self._lock:
            return self._proposes(change)

    def _proposes(self, change: IsrChange) -> bool:
        return (
            self.role is Role.LEADER
            and self.pending_isr == change.new_isr
            and self.leader_epoch == change.leader_epoch
            and self.partition_epoch == change.partition_epoch
        )

    def isr_change_done(
        self,
        change: IsrChange,
        reg: PartitionRegistration | None,
        error: ErrorCode = ErrorCode.NONE,
    ) -> None:
        """The controller's answer to ``change``: the new registration, or None and the error
        it was refused with. A refusal that says this leader's view is stale (the partition
        epoch moved: INVALID_UPDATE_VERSION) keeps the change pending until the metadata brings
        the newer epoch (``make_leader`` resets it); any other resets it, and the next proposal
        waits ``ISR_RETRY_BACKOFF_MS`` (see :mod:`dataplane.broker.alter_partition`). An answer
        to an older proposal (the partition epoch moved since) is ignored."""
        with self._lock:
            if not self._proposes(change):
                return
            if reg is not None and reg.leader_epoch > self.leader_epoch:
                # The change committed with a reassignment's completion that moved the
                # leadership away. Until the metadata demotes this replica, the high watermark
                # keeps waiting on the larger set, as while the change was in flight (Kafka
                # keeps its pending ISR too): the new leader may lack what the old ISR has.
                return
            if reg is None and refusal(error) is Refusal.AWAIT_METADATA:
                return
            self.pending_isr = None
            if reg is None:
                self._isr_retry_at_ms = self.clock_ms() + ISR_RETRY_BACKOFF_MS
            elif reg.leader_epoch == self.leader_epoch and (
                reg.partition_epoch > self.partition_epoch
            ):
                self._set_registration(reg)
            self._maybe_advance_hw()
            self._wake()

    # -- the follower's paths ----------------------------------------------------------------------
    def fetch_state(self) -> tuple[int, int, int, int] | None:
        """(fetch offset, last fetched epoch, leader epoch, log start offset) for the fetcher;
        None unless this replica follows."""
        with self._lock:
            if self.role is not Role.FOLLOWER:
                return None
            return (
                self.log.log_end_offset,
                self.log.epochs.latest_epoch,
                self.leader_epoch,
                self.log.log_start_offset,
            )

    def follower_log_end(self, leader_epoch: int) -> int | None:
        """The log end offset while this replica follows at ``leader_epoch``; None once it
        does not (a fetcher's answer must not read a log the broker stopped, and maybe closed,
        while the fetch was out: a reassignment that moved the replica away)."""
        with self._lock:
            if self.role is not Role.FOLLOWER or self.leader_epoch != leader_epoch:
                return None
            return self.log.log_end_offset

    def follower_end_of_epoch(self, epoch: int, leader_epoch: int) -> int | None:
        """Where this follower's ``epoch`` ends (its log start offset when it has no such
        epoch); None unless it follows at ``leader_epoch`` (`follower_log_end`)."""
        with self._lock:
            if self.role is not Role.FOLLOWER or self.leader_epoch != leader_epoch:
                return None
            found, end = self.log.end_offset_for_epoch(epoch)
            return end if found >= 0 else self.log.log_start_offset

    def append_as_follower(
        self,
        records: bytes | memoryview,
        leader_hw: int,
        leader_epoch: int,
        leader_log_start: int = rs.UNKNOWN_OFFSET,
    ) -> None:
        """Append the leader's records; take its high watermark and its log start offset
        (moved by DeleteRecords or retention: the follower's moves up with it, as Kafka's
        fetcher does; the segments below go with the next retention pass)."""
        with self._lock:
            if self.role is not Role.FOLLOWER or self.leader_epoch != leader_epoch:
                return  # the fetch was for an older leadership: drop it
            if records:
                info = self.log.append_as_follower(records)
                self._snapshot_if_rolled(info.first_offset)
                self._maybe_expire_producers()
                for position, header in iter_batches(records):
                    # the leader's markers, applied the same way: the same LSO and .txnindex
                    marker = read_marker(records, position) if _is_marker(header) else None
                    self._apply(header, marker)
            self.high_watermark = min(leader_hw, self.log.log_end_offset)
            if leader_log_start > self.log.log_start_offset:
                start = min(leader_log_start, self.high_watermark)
                self.log.maybe_increment_log_start_offset(start, self.high_watermark)
            self._wake()

    def truncate_to(self, offset: int, leader_epoch: int) -> int:
        with self._lock:
            if self.role is not Role.FOLLOWER or self.leader_epoch != leader_epoch:
                return self.log.log_end_offset
            before = self.log.log_end_offset
            end = self.log.truncate_to(offset)
            self._changed(wakes=False)  # the fetch state moved (dataplane.broker.fetcher)
            self.high_watermark = min(self.high_watermark, end)
            if end < before:
                self.producers = self._load_producer_state()
                self._active_base_offset = self.log.active.base_offset
            return end

    def restart_at(self, offset: int, leader_epoch: int) -> None:
        """The leader's log starts above ours: drop ours and start empty at ``offset``."""
        with self._lock:
            if self.role is not Role.FOLLOWER or self.leader_epoch != leader_epoch:
                return
            self.log.truncate_fully_and_start_at(offset)
            self._changed(wakes=False)  # the fetch state moved (dataplane.broker.fetcher)
            self.high_watermark = offset
            self.snapshots.delete_all()
            self.producers = ProducerStates()
            self._active_base_offset = self.log.active.base_offset

    # -- producer state ----------------------------------------------------------------------------
    def _load_producer_state(self) -> ProducerStates:
        """The newest valid snapshot at or below the log end (those above it hold batches a
        recovery or a truncation removed: deleted first), then the headers of the batches after
        it; with none, every header from the log start. Expired producers are dropped."""
        end = self.log.log_end_offset
        self.snapshots.delete_above(end)
        self.snapshots.delete_stray([segment.base_offset for segment in self.log.segments()])
        loaded = self.snapshots.load_latest(end)
        start_offset, states = loaded if loaded is not None else (0, ProducerStates())
        for aborted in states.update_all(self.log.batch_headers(start_offset), self._marker_of):
            # the .txnindex of a recovered or truncated log may lack those after the snapshot
            if aborted not in self.log.aborted_transactions(aborted.last_offset,
                                                            aborted.last_offset + 1):  # fmt: skip
                self.log.append_aborted(aborted)
        states.remove_expired(self.clock_ms(), self.log.config.producer_id_expiration_ms)
        return states

    def _marker_of(self, header: BatchHeader) -> Marker:
        """The marker of the control batch ``header`` (a rescan reads only headers)."""
        data = self.log.read(header.base_offset, header.size_bytes, min_one_batch=True)
        return read_marker(data)

    def _snapshot_if_rolled(self, first_offset: int) -> None:
        """After an append, before its batches are counted: if the log rolled and the new
        segment begins with this append, the state is the state as of the segment's base."""
        base_offset = self.log.active.base_offset
        if base_offset == self._active_base_offset:
            return
        self._active_base_offset = base_offset
        if base_offset == first_offset:
            # Written, not fsynced: that waits for sync_snapshots, off the append path (Kafka's
            # KAFKA-15046). Under a disk's writeback an fsync here took 100-400 ms, with the
            # partition's lock held. A snapshot a crash tears is found corrupt when read and
            # an older one is used, the log rescanned from it.
            self._write_snapshot(base_offset, durable=False)
            self.log.notify_work()

    def sync_snapshots(self) -> None:
        """fsync the snapshots written on rolls (the broker's maintenance thread calls this)."""
        try:
            self.snapshots.sync()
        except OSError as error:
            log.warning("%s: producer-state snapshots not synced: %s", self.name, error)

    def has_timed_work(self) -> bool:
        """Whether the maintenance thread's next tick may find work here: the log's (a flush
        by ``flush.ms``, delayed file deletions) or snapshots awaiting their fsync."""
        return self.log.has_timed_work() or self.snapshots.unsynced

    def _write_snapshot(self, offset: int, *, durable: bool = True) -> None:
        try:
            self.snapshots.write(offset, self.producers, durable=durable)
        except OSError as error:
            # Only an optimisation of the next open (which then rescans more of the log): the
            # append it follows is stored and must still be answered.
            log.warning("%s: producer-state snapshot at %d not written: %s", self.name, offset,
                        error)  # fmt: skip

    def _maybe_expire_producers(self) -> None:
        """Kafka's periodic ``removeExpiredProducers``, run from the append paths."""
        now_ms = self.clock_ms()
        if now_ms < self._next_expiry_check_ms:
            return
        expiration_ms = self.log.config.producer_id_expiration_ms
        interval_ms = min(PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS, expiration_ms)
        self._next_expiry_check_ms = now_ms + interval_ms
        removed = self.producers.remove_expired(now_ms, expiration_ms)
        if removed:
            log.info("%s: %d producer ids expired (producer.id.expiration.ms %d)", self.name,
                     removed, expiration_ms)  # fmt: skip

    # -- durability --------------------------------------------------------------------------------
    def _read_legacy_hw_checkpoint(self) -> int:
        if not self.legacy_hw_checkpoint:
            return 0
        try:
            entries = read_checkpoint(self.log.directory / HIGH_WATERMARK_CHECKPOINT, fields=1)
        except StorageError:
            return 0
        return entries[0][0] if entries else 0

    def drop_legacy_hw_checkpoint(self) -> None:
        """Remove the per-partition high-watermark file of older versions, once the broker's
        ``replication-offset-checkpoint`` holds this partition durably."""
        if self.legacy_hw_checkpoint:
            (self.log.directory / HIGH_WATERMARK_CHECKPOINT).unlink(missing_ok=True)
            self.legacy_hw_checkpoint = False


def _is_marker(header: BatchHeader) -> bool:
    return header.is_control and header.producer_id != NO_PRODUCER_ID


def _end_of_batches(records: bytes | memoryview) -> int:
    """The offset after the last of back-to-back batches (their headers only)."""
    position, end = 0, 0
    while position + HEADER_SIZE <= len(records):
        header = read_header(records, position)
        if header.size_bytes <= 0:
            raise AssertionError(f"a stored batch at {header.base_offset} has no length")
        end = header.next_offset
        position += header.size_bytes
    return end
