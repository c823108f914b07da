"""One partition as a share group reads it (KIP-932): which records are in flight, who holds
them, how often each was delivered. Pure: no IO, the clock passed in.

A share group's members read the same partitions cooperatively; each record is *acquired* by
one member at a time, under a lock (``group.share.record.lock.duration.ms``), and acknowledged by
it: ACCEPT (done), RELEASE (give it back: another member gets it) or REJECT (never deliver it
again). A record whose lock expires, or whose member leaves, is released. Each acquisition counts
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
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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


@dataclass
class _InFlight:
    state: RecordState
    delivery_count: int = 0
    member_id: str = ""
    lock_deadline_ms: int = 0


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

    # -- reading -------------------------------------------------------------------------------
    def fetch_offset(self) -> int:
        """Where the next read of the log should start: the first released record, else the
        end of the window."""
        available = [o for o, r in self._records.items() if r.state is RecordState.AVAILABLE]
        return min(available, default=self.end_offset)

    def window_full(self) -> bool:
        return self.end_offset - self.start_offset >= self.max_in_flight and not any(
            r.state is RecordState.AVAILABLE for r in self._records.values()
        )

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
                record = self._records[offset] = _InFlight(RecordState.AVAILABLE)
                self.end_offset = offset + 1
            record.state = RecordState.ACQUIRED
            record.delivery_count += 1
            record.member_id = member_id
            record.lock_deadline_ms = deadline
            taken.append((offset, record.delivery_count))
        self._advance()
        return _ranges(taken)

    def archive_gaps(self, next_offset: int) -> None:
        """The log holds no record from the window's end up to ``next_offset`` (control
        batches, e.g. transaction markers, at the log's tail): archive those offsets, as
        :meth:`acquire` does with the gaps it passes, so reads move past them."""
        if next_offset <= self.end_offset or next_offset - self.start_offset > self.max_in_flight:
            return
        for gap in range(self.end_offset, next_offset):
            self._records[gap] = _InFlight(RecordState.ARCHIVED)
        self.end_offset = next_offset
        self._advance()

    # -- acknowledging -------------------------------------------------------------------------
    def acknowledge(self, member_id: str, batches: Sequence[AckBatch]) -> None:
        """Apply a member's acknowledgements, all or none: INVALID_RECORD_STATE when an offset
        is not acquired by this member (never fetched, acknowledged already, lock expired)."""
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
                changes[offset] = kind
        for offset, kind in changes.items():
            record = self._records.get(offset)
            if record is None:
                if self.start_offset <= offset < self.end_offset:
                    self._records[offset] = _InFlight(RecordState.ARCHIVED)
                continue
            if kind is AckType.ACCEPT:
                record.state, record.member_id = RecordState.ACKNOWLEDGED, ""
            elif kind is AckType.RELEASE:
                self._release(record)
            else:  # REJECT, GAP
                record.state, record.member_id = RecordState.ARCHIVED, ""
        self._advance()

    def release_member(self, member_id: str) -> int:
        """A member left (or its session ended): every record it holds is released; how many."""
        held = [
            r
            for r in self._records.values()
            if r.state is RecordState.ACQUIRED and r.member_id == member_id
        ]
        for record in held:
            self._release(record)
        self._advance()
        return len(held)

    def expire_locks(self, now_ms: int) -> int:
        """Release the records whose lock has passed; how many."""
        expired = [
            r
            for r in self._records.values()
            if r.state is RecordState.ACQUIRED and r.lock_deadline_ms <= now_ms
        ]
        for record in expired:
            self._release(record)
        self._advance()
        return len(expired)

    def next_lock_deadline_ms(self) -> int | None:
        deadlines = [
            r.lock_deadline_ms for r in self._records.values() if r.state is RecordState.ACQUIRED
        ]
        return min(deadlines, default=None)

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

    def restore(self, start_offset: int, batches: Iterable[StateBatch]) -> None:
        """Load a snapshot (on becoming the partition's leader)."""
        self.start_offset = self.end_offset = start_offset
        self._records = {}
        for batch in batches:
            for offset in range(max(batch.first_offset, start_offset), batch.last_offset + 1):
                self._records[offset] = _InFlight(batch.state, batch.delivery_count)
                self.end_offset = max(self.end_offset, offset + 1)
        for offset in range(start_offset, self.end_offset):  # holes: never delivered
            self._records.setdefault(offset, _InFlight(RecordState.AVAILABLE))
        self._advance()

    # -- internals -----------------------------------------------------------------------------
    def _release(self, record: _InFlight) -> None:
        limit_reached = record.delivery_count >= self.delivery_count_limit
        record.state = RecordState.ARCHIVED if limit_reached else RecordState.AVAILABLE
        record.member_id = ""
        record.lock_deadline_ms = 0

    def _advance(self) -> None:
        """Move the start past acknowledged and archived records."""
        done = (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)
        while self.start_offset < self.end_offset:
            record = self._records.get(self.start_offset)
            if record is None or record.state not in done:
                break
            del self._records[self.start_offset]
            self.start_offset += 1


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
