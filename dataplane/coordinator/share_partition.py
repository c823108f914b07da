"""One partition as a share group reads it (KIP-932): which records are in flight, who holds
them, how often each was delivered. Pure: no IO, the clock passed in.

A share group's members read the same partitions cooperatively; each record is *acquired* by
one member at a time, under a lock (``group.share.record.lock.duration.ms``), and acknowledged by
it: ACCEPT (done), RELEASE (give it back: another member gets it) or REJECT (never deliver it
again); or RENEW (KIP-1222, Kafka 4.2: still working on it, restart the lock). A record whose
lock expires, or whose member leaves, is released. Each acquisition counts
a delivery; a record released after ``group.share.delivery.count.limit`` deliveries is archived
instead (a poison record stops coming back).

The *in-flight window* runs from the share-partition start offset (SPSO, ``start_offset``: every
record below it is acknowledged or archived) to the end offset (``end_offset``: the next record
of the log never yet acquired). Inside it each offset has a state (Kafka's ``RecordState``):
AVAILABLE (released, to be acquired again), ACQUIRED, ACKNOWLEDGED, ARCHIVED. The window is at
most ``max_in_flight`` records (``group.share.partition.max.record.locks``): when full, nothing
new is acquired until its start moves. Offsets with no record (control batches, compacted
gaps) are archived as the window passes them.

What survives a failover is :meth:`SharePartition.snapshot`: the start offset and the state and
delivery count of each offset in the window that is not plain AVAILABLE-never-delivered; acquired
records are written AVAILABLE (locks do not survive their holder's broker), with their delivery
counted, as Kafka's share coordinator stores them.

**Indexes.** Every fetch asks where to read (the first AVAILABLE offset), whether the window is
full and which locks have expired. A window holds up to ``max_in_flight`` records (thousands),
so these are not scans: two heaps kept beside the records answer them, the offsets made
AVAILABLE and the (lock deadline, offset) of each acquisition. Their entries are checked
against the record when they reach the top (an entry whose record has moved on since is
dropped then), and a heap grown past twice the window is rebuilt from the records, so both stay
bounded. A fetch costs O(log window) for them, whatever is in flight.

**Writes are deltas.** Each change of a record's stored state (its state as written, its
delivery count) marks its offset dirty; :meth:`SharePartition.delta` is what to write next: the
start offset and the runs of the dirty offsets in the window, O(changed) rather than
O(window), as Kafka's leader writes only the changed state batches (WriteShareGroupState). The
share coordinator keeps them as updates over its last snapshot. An acknowledgement is applied
to the live records and answers an :class:`Undo` (each record it touched as it was, first
touch only), so a write that fails puts the records back at the cost of what it changed, not a
copy of the window.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from raftlog.errors import ErrorCode, KafkaError


class RecordState(enum.IntEnum):
    """Kafka's share-partition record states (their ids in ``__share_group_state``)."""

    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


class AckType(enum.IntEnum):
    """ShareAcknowledge / ShareFetch acknowledge types (Kafka's ``AcknowledgeType``; GAP: an
    offset with no record, e.g. a control batch)."""

    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4  # KIP-1222 (ShareFetch / ShareAcknowledge v2): the lock starts again


SETTLING = frozenset({AckType.ACCEPT, AckType.RELEASE, AckType.REJECT})


@dataclass
class _InFlight:
    state: RecordState
    delivery_count: int = 0
    member_id: str = ""
    lock_deadline_ms: int = 0


@dataclass(frozen=True)
class Undo:
    """How to take an acknowledgement back (:meth:`SharePartition.undo`): the window's bounds
    before it and each record it touched as it was (None: there was none)."""

    start_offset: int
    end_offset: int
    records: dict[int, _InFlight | None] = field(default_factory=dict)


@dataclass(frozen=True)
class AcquiredRange:
    """ShareFetch's ``AcquiredRecords``: offsets first..last, each delivered ``delivery_count``
    times (this one included)."""

    first_offset: int
    last_offset: int
    delivery_count: int


@dataclass(frozen=True)
class StateBatch:
    """A run of offsets with one state and delivery count (``__share_group_state``'s
    ``StateBatch``)."""

    first_offset: int
    last_offset: int
    state: RecordState
    delivery_count: int


@dataclass(frozen=True)
class AckBatch:
    """An acknowledgement of offsets first..last: one type for all, or one per offset."""

    first_offset: int
    last_offset: int
    types: tuple[AckType, ...]

    def type_of(self, offset: int) -> AckType:
        if len(self.types) == 1:
            return self.types[0]
        return self.types[offset - self.first_offset]


def invalid_state(message: str) -> KafkaError:
    return KafkaError(ErrorCode.INVALID_RECORD_STATE, message)


class SharePartition:
    """The in-flight records of one (share group, topic partition), on the partition's leader."""

    def __init__(
        self,
        start_offset: int,
        *,
        lock_duration_ms: int,
        delivery_count_limit: int,
        max_in_flight: int,
    ) -> None:
        self.start_offset = start_offset
        self.end_offset = start_offset
        self.lock_duration_ms = lock_duration_ms
        self.delivery_count_limit = delivery_count_limit
        self.max_in_flight = max_in_flight
        self._records: dict[int, _InFlight] = {}  # offsets start_offset <= o < end_offset
        # the indexes (see the module docstring): every AVAILABLE record's offset is in
        # _available, every ACQUIRED record's (lock deadline, offset) in _locks; stale entries
        # are dropped when they reach the top
        self._available: list[int] = []
        self._locks: list[tuple[int, int]] = []
        # offsets whose stored state (state as written, delivery count) changed since the last
        # write (see :meth:`delta`); some may have left the window since
        self._dirty: set[int] = set()
        # while an acknowledgement applies: each record it touched, as it was (first touch)
        self._journal: dict[int, _InFlight | None] | None = None

    # -- reading -------------------------------------------------------------------------------
    def fetch_offset(self) -> int:
        """Where the next read of the log should start: the first released record, else the
        end of the window."""
        available = self._available
        while available:
            record = self._records.get(available[0])
            if record is not None and record.state is RecordState.AVAILABLE:
                return available[0]
            heapq.heappop(available)
        return self.end_offset

    def window_full(self) -> bool:
        """Nothing can be acquired: the window is at its limit and holds nothing available."""
        full = self.end_offset - self.start_offset >= self.max_in_flight
        return full and self.fetch_offset() == self.end_offset

    def acquire(
        self, member_id: str, offsets: Iterable[int], now_ms: int, max_records: int
    ) -> list[AcquiredRange]:
        """Acquire for ``member_id`` the records at ``offsets`` (the data records a read of the
        log from :meth:`fetch_offset` returned, ascending): released ones in the window, and
        new ones beyond it while the window has room; at most ``max_records``. Offsets the read
        skipped on the way past the window's end (no record there) are archived."""
        deadline = now_ms + self.lock_duration_ms
        taken: list[tuple[int, int]] = []  # (offset, delivery count)
        for offset in offsets:
            if len(taken) >= max_records:
                break
            if offset < self.start_offset:
                continue
            record = self._records.get(offset)
            if offset < self.end_offset:
                if record is None or record.state is not RecordState.AVAILABLE:
                    continue
            else:
                if offset - self.start_offset >= self.max_in_flight:
                    break
                for gap in range(self.end_offset, offset):  # no record at these offsets
                    self._records[gap] = _InFlight(RecordState.ARCHIVED)
                    self._dirty.add(gap)
                record = self._records[offset] = _InFlight(RecordState.AVAILABLE)
                self.end_offset = offset + 1
            self._dirty.add(offset)
            record.state = RecordState.ACQUIRED
            record.delivery_count += 1
            record.member_id = member_id
            record.lock_deadline_ms = deadline
            self._push_lock(deadline, offset)
            taken.append((offset, record.delivery_count))
        self._advance()
        return _ranges(taken)

    def archive_available(self, offsets: Iterable[int]) -> int:
        """Records never to be delivered (a read_committed group's aborted transactions):
        those AVAILABLE in the window are archived; how many. Ones past the window are archived
        as gaps when a read passes them (they are not handed to :meth:`acquire`)."""
        archived = 0
        for offset in offsets:
            record = self._records.get(offset)
            if record is not None and record.state is RecordState.AVAILABLE:
                self._dirty.add(offset)
                record.state = RecordState.ARCHIVED
                archived += 1
        self._advance()
        return archived

    def archive_gaps(self, next_offset: int) -> None:
        """The log holds no record to deliver from the window's end up to ``next_offset``
        (control batches, e.g. transaction markers, or a read_committed group's aborted
        batches, at the tail of a read): archive those offsets, as :meth:`acquire` does with
        the gaps it passes, so reads move past them; as many as the window has room for (the
        rest when acknowledgements move its start)."""
        next_offset = min(next_offset, self.start_offset + self.max_in_flight)  # as far as fits
        if next_offset <= self.end_offset:
            return
        for gap in range(self.end_offset, next_offset):
            self._records[gap] = _InFlight(RecordState.ARCHIVED)
            self._dirty.add(gap)
        self.end_offset = next_offset
        self._advance()

    # -- acknowledging -------------------------------------------------------------------------
    def acknowledge(
        self, member_id: str, batches: Sequence[AckBatch], now_ms: int | None = None
    ) -> Undo:
        """Apply a member's acknowledgements, all or none: INVALID_RECORD_STATE when an offset
        is not acquired by this member (never fetched, acknowledged already, lock expired).
        Answers how to take them back (:meth:`undo`) should their write fail.

        RENEW (KIP-1222) keeps the record ACQUIRED by the member and restarts its lock: it
        expires ``lock_duration_ms`` (the group's ``share.record.lock.duration.ms``) after
        ``now_ms``; no delivery is counted and nothing stored changes (locks are not written),
        so a renewal alone leaves :meth:`delta` as it was. Like the other types it needs the
        record acquired by this member: a record whose lock already expired cannot be renewed
        (it may be someone else's by now)."""
        changes: dict[int, AckType] = {}
        for batch in batches:
            if batch.last_offset < batch.first_offset or not batch.types:
                raise KafkaError(ErrorCode.INVALID_REQUEST, "an empty acknowledgement batch")
            span = batch.last_offset - batch.first_offset + 1
            if len(batch.types) not in (1, span):
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST,
                    f"{len(batch.types)} acknowledge types for {span} offsets",
                )
            for offset in range(batch.first_offset, batch.last_offset + 1):
                kind = batch.type_of(offset)
                record = self._records.get(offset)
                if kind is AckType.GAP:
                    held = record is not None and record.state is RecordState.ACQUIRED
                    if held and record is not None and record.member_id != member_id:
                        raise invalid_state(f"offset {offset} is held by another member")
                    changes[offset] = kind
                    continue
                if record is None or record.state is not RecordState.ACQUIRED:
                    raise invalid_state(f"offset {offset} is not acquired")
                if record.member_id != member_id:
                    raise invalid_state(f"offset {offset} is held by another member")
                if kind is AckType.RENEW and now_ms is None:
                    raise KafkaError(ErrorCode.INVALID_REQUEST, "RENEW needs the time")
                changes[offset] = kind
        undo = Undo(self.start_offset, self.end_offset)
        self._journal = undo.records
        try:
            for offset, kind in changes.items():
                if kind is AckType.RENEW:
                    assert now_ms is not None
                    self._renew(offset, now_ms + self.lock_duration_ms)
                else:
                    self._apply(offset, kind)
            self._advance()
        finally:
            self._journal = None
        return undo

    def _renew(self, offset: int, deadline_ms: int) -> None:
        """Restart an acquired record's lock. Journaled (an undo puts the old deadline back)
        but not dirty: the stored state (AVAILABLE with its deliveries, as an acquired record is
        written) does not change."""
        journal = self._journal
        record = self._records[offset]
        if journal is not None and offset not in journal:
            journal[offset] = replace(record)
        record.lock_deadline_ms = deadline_ms
        self._push_lock(deadline_ms, offset)  # the old entry is dropped when it reaches the top

    def _apply(self, offset: int, kind: AckType) -> None:
        record = self._records.get(offset)
        if record is None:
            if self.start_offset <= offset < self.end_offset:
                self._touch(offset)
                self._records[offset] = _InFlight(RecordState.ARCHIVED)
            return
        if kind is AckType.RELEASE:
            self._release(offset, record)
            return
        self._touch(offset)
        record.member_id = ""
        record.state = RecordState.ACKNOWLEDGED if kind is AckType.ACCEPT else RecordState.ARCHIVED

    def undo(self, undo: Undo) -> None:
        """Take an acknowledgement back (its write failed): the records it touched as they
        were, the window's bounds as they were; O(records touched). The offsets stay dirty (a
        later write of their state as it is again is harmless)."""
        for offset, before in undo.records.items():
            if before is None:
                self._records.pop(offset, None)
                continue
            self._records[offset] = before
            if before.state is RecordState.AVAILABLE:
                heapq.heappush(self._available, offset)
            elif before.state is RecordState.ACQUIRED:
                self._push_lock(before.lock_deadline_ms, offset)
        self.start_offset, self.end_offset = undo.start_offset, undo.end_offset

    def release_member(self, member_id: str) -> int:
        """A member left (or its session ended): every record it holds is released; how many."""
        held = [
            (o, r)
            for o, r in self._records.items()
            if r.state is RecordState.ACQUIRED and r.member_id == member_id
        ]
        for offset, record in held:
            self._release(offset, record)
        self._advance()
        return len(held)

    def expire_locks(self, now_ms: int) -> int:
        """Release the records whose lock has passed; how many. O(log window) per lock."""
        expired = 0
        locks = self._locks
        while locks and locks[0][0] <= now_ms:
            deadline, offset = heapq.heappop(locks)
            record = self._records.get(offset)
            if self._holds_lock(record, deadline):
                assert record is not None
                self._release(offset, record)
                expired += 1
        if expired:
            self._advance()
        return expired

    def next_lock_deadline_ms(self) -> int | None:
        locks = self._locks
        while locks and not self._holds_lock(self._records.get(locks[0][1]), locks[0][0]):
            heapq.heappop(locks)
        return locks[0][0] if locks else None

    def log_start_moved(self, log_start_offset: int) -> None:
        """Records below the log's start are gone (retention, DeleteRecords): archive them."""
        if log_start_offset <= self.start_offset:
            return
        for offset in range(self.start_offset, min(log_start_offset, self.end_offset)):
            self._records.pop(offset, None)
        self.start_offset = log_start_offset
        self.end_offset = max(self.end_offset, log_start_offset)
        self._advance()

    # -- state ---------------------------------------------------------------------------------
    def state_of(self, offset: int) -> tuple[RecordState, int] | None:
        """An in-flight offset's state and delivery count (None: outside the window)."""
        record = self._records.get(offset)
        return None if record is None else (record.state, record.delivery_count)

    def in_flight(self) -> int:
        return self.end_offset - self.start_offset

    def snapshot(self) -> tuple[int, list[StateBatch]]:
        """What survives a failover: the start offset and runs of the window's states, acquired
        records as AVAILABLE with their deliveries counted."""
        runs: list[StateBatch] = []
        for offset in range(self.start_offset, self.end_offset):
            record = self._records[offset]
            state = RecordState.AVAILABLE if record.state is RecordState.ACQUIRED else record.state
            last = runs[-1] if runs else None
            if (
                last is not None
                and last.last_offset == offset - 1
                and (last.state, last.delivery_count) == (state, record.delivery_count)
            ):
                runs[-1] = StateBatch(last.first_offset, offset, state, record.delivery_count)
            else:
                runs.append(StateBatch(offset, offset, state, record.delivery_count))
        return self.start_offset, runs

    def delta(self) -> tuple[int, list[StateBatch]]:
        """What to write next (:meth:`snapshot` minus what was written): the start offset and
        the runs of the records changed since the last :meth:`delta_written`, acquired ones as
        AVAILABLE with their deliveries counted. O(changed)."""
        start, end = self.start_offset, self.end_offset
        self._dirty = {o for o in self._dirty if o >= start}  # gone below the start: dropped
        runs: list[StateBatch] = []
        for offset in sorted(o for o in self._dirty if o < end):
            state, count = _stored(self._records[offset])
            last = runs[-1] if runs else None
            if (
                last is not None
                and last.last_offset == offset - 1
                and (last.state, last.delivery_count) == (state, count)
            ):
                runs[-1] = StateBatch(last.first_offset, offset, state, count)
            else:
                runs.append(StateBatch(offset, offset, state, count))
        return start, runs

    def delta_written(self) -> None:
        """The last :meth:`delta` is durable: nothing is dirty."""
        self._dirty = set()

    def restore(self, start_offset: int, batches: Iterable[StateBatch]) -> None:
        """Load a snapshot (on becoming the partition's leader)."""
        self.start_offset = self.end_offset = start_offset
        self._records = {}
        self._dirty = set()
        for batch in batches:
            for offset in range(max(batch.first_offset, start_offset), batch.last_offset + 1):
                self._records[offset] = _InFlight(batch.state, batch.delivery_count)
                self.end_offset = max(self.end_offset, offset + 1)
        for offset in range(start_offset, self.end_offset):  # holes: never delivered
            self._records.setdefault(offset, _InFlight(RecordState.AVAILABLE))
        self._rebuild_indexes()
        self._advance()

    # -- internals -----------------------------------------------------------------------------
    def _touch(self, offset: int) -> None:
        """Before a record's change: its offset is dirty, and an acknowledgement applying
        keeps the record as it was (first touch)."""
        self._dirty.add(offset)
        journal = self._journal
        if journal is not None and offset not in journal:
            record = self._records.get(offset)
            journal[offset] = None if record is None else replace(record)

    def _release(self, offset: int, record: _InFlight) -> None:
        self._touch(offset)
        limit_reached = record.delivery_count >= self.delivery_count_limit
        record.state = RecordState.ARCHIVED if limit_reached else RecordState.AVAILABLE
        record.member_id = ""
        record.lock_deadline_ms = 0
        if not limit_reached:
            heapq.heappush(self._available, offset)
            if len(self._available) > 2 * self.max_in_flight + 64:
                self._rebuild_available()

    def _push_lock(self, deadline_ms: int, offset: int) -> None:
        heapq.heappush(self._locks, (deadline_ms, offset))
        if len(self._locks) > 2 * self.max_in_flight + 64:
            self._rebuild_locks()

    @staticmethod
    def _holds_lock(record: _InFlight | None, deadline_ms: int) -> bool:
        """Whether a lock entry still stands for its record (not acknowledged, released or
        acquired anew since)."""
        return (
            record is not None
            and record.state is RecordState.ACQUIRED
            and record.lock_deadline_ms == deadline_ms
        )

    def _rebuild_indexes(self) -> None:
        """The heaps from the records alone (after a restore; or one grown stale past twice
        the window): O(window), rare."""
        self._rebuild_available()
        self._rebuild_locks()

    def _rebuild_available(self) -> None:
        items = self._records.items()
        self._available = [o for o, r in items if r.state is RecordState.AVAILABLE]
        heapq.heapify(self._available)

    def _rebuild_locks(self) -> None:
        items = self._records.items()
        self._locks = [(r.lock_deadline_ms, o) for o, r in items if r.state is RecordState.ACQUIRED]
        heapq.heapify(self._locks)

    def _advance(self) -> None:
        """Move the start past acknowledged and archived records."""
        done = (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)
        while self.start_offset < self.end_offset:
            record = self._records.get(self.start_offset)
            if record is None or record.state not in done:
                break
            journal = self._journal
            if journal is not None and self.start_offset not in journal:
                journal[self.start_offset] = replace(record)
            del self._records[self.start_offset]
            self.start_offset += 1


def _stored(record: _InFlight) -> tuple[RecordState, int]:
    """A record's state as written: locks do not survive their holder's broker."""
    state = RecordState.AVAILABLE if record.state is RecordState.ACQUIRED else record.state
    return state, record.delivery_count


def _ranges(taken: list[tuple[int, int]]) -> list[AcquiredRange]:
    """Consecutive offsets with one delivery count, as ranges."""
    out: list[AcquiredRange] = []
    for offset, count in taken:
        last = out[-1] if out else None
        if last is not None and last.last_offset == offset - 1 and last.delivery_count == count:
            out[-1] = AcquiredRange(last.first_offset, offset, count)
        else:
            out.append(AcquiredRange(offset, offset, count))
    return out
