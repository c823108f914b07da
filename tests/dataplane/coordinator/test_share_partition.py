"""The share-partition state machine (KIP-932): acquisition under locks, acknowledgements,
redelivery up to the delivery limit, the in-flight window, and what a snapshot keeps."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dataplane.coordinator.share_partition import (
    SETTLING,
    AckBatch,
    AckType,
    AcquiredRange,
    RecordState,
    SharePartition,
    StateBatch,
)
from raftlog.errors import ErrorCode, KafkaError

LOCK_MS = 30_000


def partition(start: int = 0, limit: int = 5, window: int = 200) -> SharePartition:
    return SharePartition(
        start, lock_duration_ms=LOCK_MS, delivery_count_limit=limit, max_in_flight=window
    )


def ack(first: int, last: int, *types: AckType) -> AckBatch:
    return AckBatch(first, last, types)


def test_members_acquire_different_records_and_accepted_ones_move_the_start() -> None:
    share = partition()
    assert share.acquire("a", range(0, 10), 0, max_records=4) == [AcquiredRange(0, 3, 1)]
    assert share.fetch_offset() == 4
    assert share.acquire("b", range(4, 10), 0, max_records=100) == [AcquiredRange(4, 9, 1)]
    share.acknowledge("b", [ack(4, 9, AckType.ACCEPT)])
    assert share.start_offset == 0  # 0-3 still held by a
    share.acknowledge("a", [ack(0, 3, AckType.ACCEPT)])
    assert (share.start_offset, share.end_offset, share.in_flight()) == (10, 10, 0)


def test_a_released_record_goes_to_the_next_fetch_with_its_delivery_counted() -> None:
    share = partition()
    share.acquire("a", range(0, 3), 0, max_records=10)
    share.acknowledge("a", [ack(0, 2, AckType.ACCEPT, AckType.RELEASE, AckType.ACCEPT)])
    assert share.fetch_offset() == 1
    assert share.acquire("b", range(1, 3), 0, max_records=10) == [AcquiredRange(1, 1, 2)]


def test_a_rejected_record_is_never_delivered_again() -> None:
    share = partition()
    share.acquire("a", range(0, 2), 0, max_records=10)
    share.acknowledge("a", [ack(0, 1, AckType.REJECT)])
    assert share.acquire("b", range(0, 2), 0, max_records=10) == []
    assert share.start_offset == 2


def test_an_expired_lock_or_a_departed_member_releases_its_records() -> None:
    share = partition()
    share.acquire("a", range(0, 2), 0, max_records=10)
    share.acquire("b", range(2, 4), 1_000, max_records=10)
    assert share.next_lock_deadline_ms() == LOCK_MS
    assert share.expire_locks(LOCK_MS) == 2  # a's
    assert share.state_of(0) == (RecordState.AVAILABLE, 1)
    assert share.release_member("b") == 2
    assert share.acquire("c", range(0, 4), 2_000, max_records=10) == [AcquiredRange(0, 3, 2)]
    with pytest.raises(KafkaError) as late:  # a's lock expired: its acknowledgement is refused
        share.acknowledge("a", [ack(0, 0, AckType.ACCEPT)])
    assert late.value.error is ErrorCode.INVALID_RECORD_STATE


def test_the_delivery_limit_archives_a_poison_record() -> None:
    share = partition(limit=2)
    for member in ("a", "b"):
        assert share.acquire(member, [0], 0, max_records=1)
        share.acknowledge(member, [ack(0, 0, AckType.RELEASE)])
    assert share.acquire("c", [0, 1], 0, max_records=5) == [AcquiredRange(1, 1, 1)]
    assert share.start_offset == 1


def test_acknowledgements_are_all_or_nothing() -> None:
    share = partition()
    share.acquire("a", range(0, 3), 0, max_records=10)
    share.acquire("b", range(3, 5), 0, max_records=10)
    for bad in (
        [ack(0, 2, AckType.ACCEPT), ack(3, 3, AckType.ACCEPT)],  # 3 is b's
        [ack(0, 5, AckType.ACCEPT)],  # 5 was never acquired
        [ack(0, 2, AckType.ACCEPT, AckType.ACCEPT)],  # 2 types for 3 offsets
    ):
        with pytest.raises(KafkaError):
            share.acknowledge("a", bad)
        assert [share.state_of(o) for o in range(3)] == [(RecordState.ACQUIRED, 1)] * 3


def test_offsets_without_records_are_archived_and_gap_acknowledgements_accepted() -> None:
    share = partition(start=10)
    assert share.acquire("a", [10, 13], 0, max_records=10) == [
        AcquiredRange(10, 10, 1),
        AcquiredRange(13, 13, 1),
    ]
    assert share.state_of(11) == (RecordState.ARCHIVED, 0)
    share.acknowledge("a", [ack(10, 13, AckType.ACCEPT, AckType.GAP, AckType.GAP, AckType.ACCEPT)])
    assert share.start_offset == 14


def test_the_window_bounds_what_is_in_flight() -> None:
    share = partition(window=3)
    assert share.acquire("a", range(0, 10), 0, max_records=10) == [AcquiredRange(0, 2, 1)]
    assert share.window_full()
    assert share.acquire("b", range(3, 10), 0, max_records=10) == []
    share.acknowledge("a", [ack(0, 0, AckType.ACCEPT)])
    assert not share.window_full()
    assert share.acquire("b", range(3, 10), 0, max_records=10) == [AcquiredRange(3, 3, 1)]


def test_the_log_start_moving_past_the_window_archives_it() -> None:
    share = partition()
    share.acquire("a", range(0, 5), 0, max_records=10)
    share.log_start_moved(3)
    assert (share.start_offset, share.state_of(3)) == (3, (RecordState.ACQUIRED, 1))
    share.log_start_moved(50)
    assert (share.start_offset, share.end_offset, share.fetch_offset()) == (50, 50, 50)


def test_a_snapshot_keeps_states_and_deliveries_but_not_locks() -> None:
    share = partition()
    share.acquire("a", range(0, 6), 0, max_records=10)
    share.acknowledge("a", [ack(1, 1, AckType.ACCEPT), ack(2, 2, AckType.RELEASE)])
    start, batches = share.snapshot()
    assert start == 0
    assert batches == [
        StateBatch(0, 0, RecordState.AVAILABLE, 1),
        StateBatch(1, 1, RecordState.ACKNOWLEDGED, 1),
        StateBatch(2, 5, RecordState.AVAILABLE, 1),
    ]
    successor = partition()
    successor.restore(start, batches)
    assert successor.fetch_offset() == 0
    got = successor.acquire("b", range(0, 8), 0, max_records=10)
    assert got == [AcquiredRange(0, 0, 2), AcquiredRange(2, 5, 2), AcquiredRange(6, 7, 1)]


def test_renew_restarts_the_lock_of_a_held_record_and_counts_no_delivery() -> None:
    share = partition()
    share.acquire("a", range(0, 3), 0, max_records=10)
    share.delta_written()
    share.acknowledge("a", [ack(0, 1, AckType.RENEW)], now_ms=20_000)
    assert share.state_of(0) == share.state_of(1) == (RecordState.ACQUIRED, 1)
    assert share.delta() == (0, [])  # locks are not stored: nothing to write
    assert share.expire_locks(LOCK_MS) == 1  # offset 2: its first lock
    assert share.state_of(2) == (RecordState.AVAILABLE, 1)
    assert share.next_lock_deadline_ms() == 20_000 + LOCK_MS
    assert share.expire_locks(20_000 + LOCK_MS - 1) == 0
    share.acknowledge("a", [ack(0, 0, AckType.RENEW)], now_ms=40_000)  # again
    assert share.expire_locks(20_000 + LOCK_MS) == 1  # offset 1 only
    assert share.state_of(0) == (RecordState.ACQUIRED, 1)
    share.acknowledge("a", [ack(0, 0, AckType.ACCEPT)])
    assert share.start_offset == 1  # accepted at last
    assert share.acquire("b", range(1, 3), 50_000, max_records=10) == [AcquiredRange(1, 2, 2)]


def test_renew_is_refused_for_records_the_member_does_not_hold() -> None:
    share = partition()
    share.acquire("a", range(0, 2), 0, max_records=10)
    share.acknowledge("a", [ack(1, 1, AckType.ACCEPT)])
    for member, offset in (("b", 0), ("a", 1), ("a", 5)):  # another's, acknowledged, never had
        with pytest.raises(KafkaError) as refused:
            share.acknowledge(member, [ack(offset, offset, AckType.RENEW)], now_ms=1)
        assert refused.value.error is ErrorCode.INVALID_RECORD_STATE
    share.expire_locks(LOCK_MS)  # a's lock on 0 passed: too late to renew
    with pytest.raises(KafkaError) as refused:
        share.acknowledge("a", [ack(0, 0, AckType.RENEW)], now_ms=LOCK_MS + 1)
    assert refused.value.error is ErrorCode.INVALID_RECORD_STATE


def test_renew_mixes_with_other_types_all_or_nothing_and_undoes() -> None:
    share = partition()
    share.acquire("a", range(0, 3), 0, max_records=10)
    with pytest.raises(KafkaError):  # offset 5 is not held: nothing applies, 0 not renewed
        share.acknowledge(
            "a", [ack(0, 1, AckType.RENEW, AckType.ACCEPT), ack(5, 5, AckType.RENEW)], 9
        )
    assert share.next_lock_deadline_ms() == LOCK_MS
    undo = share.acknowledge("a", [ack(0, 2, AckType.RENEW, AckType.ACCEPT, AckType.RELEASE)], 9)
    assert [share.state_of(o) for o in range(3)] == [
        (RecordState.ACQUIRED, 1),
        (RecordState.ACKNOWLEDGED, 1),
        (RecordState.AVAILABLE, 1),
    ]
    assert share.next_lock_deadline_ms() == 9 + LOCK_MS
    share.undo(undo)  # the write failed: the old lock, and the others held again
    assert share.next_lock_deadline_ms() == LOCK_MS
    assert [share.state_of(o) for o in range(3)] == [(RecordState.ACQUIRED, 1)] * 3


class Members(RuleBasedStateMachine):
    """Members fetch, acknowledge, renew, die and time out at random; a record is acknowledged
    (ACCEPT) at most once, a rejected or archived one is never delivered again, no record is
    delivered more than the limit (a renewal counts none), a renewed lock expires a lock
    duration after the renewal, a renewal of a record the member does not hold is refused and
    changes nothing, and the start never moves back."""

    LOG_END = 40
    LIMIT = 3

    def __init__(self) -> None:
        super().__init__()
        self.share = partition(limit=self.LIMIT, window=16)
        self.now = 0
        self.held: dict[str, dict[int, int]] = {m: {} for m in "abc"}  # offset: lock deadline
        self.accepted: set[int] = set()
        self.finished: set[int] = set()  # accepted, rejected or archived: never again
        self.deliveries: dict[int, int] = {}
        self.last_start = 0

    @rule(member=st.sampled_from("abc"), count=st.integers(1, 8))
    def fetch(self, member: str, count: int) -> None:
        start = self.share.fetch_offset()
        for got in self.share.acquire(member, range(start, self.LOG_END), self.now, count):
            for offset in range(got.first_offset, got.last_offset + 1):
                assert offset not in self.finished
                assert not any(offset in held for held in self.held.values())
                self.deliveries[offset] = self.deliveries.get(offset, 0) + 1
                assert got.delivery_count == self.deliveries[offset] <= self.LIMIT
                self.held[member][offset] = self.now + LOCK_MS

    @rule(member=st.sampled_from("abc"), kind=st.sampled_from(sorted(SETTLING)))
    def acknowledge(self, member: str, kind: AckType) -> None:
        if not self.held[member]:
            return
        offset = min(self.held[member])
        self.share.acknowledge(member, [ack(offset, offset, kind)])
        del self.held[member][offset]
        if kind is AckType.ACCEPT:
            assert offset not in self.accepted
            self.accepted.add(offset)
        if kind is not AckType.RELEASE:
            self.finished.add(offset)
        self._released([offset] if kind is AckType.RELEASE else [])

    @rule(member=st.sampled_from("abc"), newest=st.booleans())
    def renew(self, member: str, newest: bool) -> None:
        if not self.held[member]:
            return
        offset = (max if newest else min)(self.held[member])
        self.share.acknowledge(member, [ack(offset, offset, AckType.RENEW)], self.now)
        self.held[member][offset] = self.now + LOCK_MS
        assert self.share.state_of(offset) == (RecordState.ACQUIRED, self.deliveries[offset])

    @rule(member=st.sampled_from("abc"), offset=st.integers(0, LOG_END - 1))
    def renew_what_it_does_not_hold(self, member: str, offset: int) -> None:
        if offset in self.held[member]:
            return
        before = self.share.state_of(offset)
        with pytest.raises(KafkaError) as refused:
            self.share.acknowledge(member, [ack(offset, offset, AckType.RENEW)], self.now)
        assert refused.value.error is ErrorCode.INVALID_RECORD_STATE
        assert self.share.state_of(offset) == before

    @rule(member=st.sampled_from("abc"))
    def leave(self, member: str) -> None:
        assert self.share.release_member(member) == len(self.held[member])
        self._released(list(self.held[member]))
        self.held[member].clear()

    @rule(ms=st.integers(1, LOCK_MS * 2))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        expired = [
            (m, o) for m, held in self.held.items() for o, d in held.items() if d <= self.now
        ]
        assert self.share.expire_locks(self.now) == len(expired)
        for member, offset in expired:
            del self.held[member][offset]
        self._released([o for _, o in expired])

    def _released(self, offsets: list[int]) -> None:
        self.finished |= {o for o in offsets if self.deliveries[o] >= self.LIMIT}

    @invariant()
    def the_indexes_answer_as_a_scan_would(self) -> None:
        share = self.share
        window = range(share.start_offset, share.end_offset)
        available = [
            o for o in window if (share.state_of(o) or (None,))[0] is RecordState.AVAILABLE
        ]
        assert share.fetch_offset() == min(available, default=share.end_offset)
        deadlines = [d for held in self.held.values() for d in held.values()]
        assert share.next_lock_deadline_ms() == min(deadlines, default=None)
        full = len(window) >= 16 and not available
        assert share.window_full() == full

    @invariant()
    def start_only_moves_forward(self) -> None:
        assert self.share.start_offset >= self.last_start
        assert self.share.in_flight() <= 16
        self.last_start = self.share.start_offset


TestMembers = Members.TestCase
TestMembers.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_offsets_without_records_at_the_logs_tail_are_archived() -> None:
    """Control batches (transaction markers) after the last record: reads move past them."""
    share = partition()
    share.acquire("a", [0, 1], 0, max_records=10)
    share.archive_gaps(4)  # 2-3 are a marker's offsets
    assert (share.end_offset, share.fetch_offset()) == (4, 4)
    share.acknowledge("a", [ack(0, 1, AckType.ACCEPT)])
    assert share.start_offset == 4
    share.archive_gaps(3)  # behind the window's end: nothing to do
    assert share.end_offset == 4


def test_the_indexes_stay_bounded_by_the_window_however_often_records_cycle() -> None:
    """fetch_offset and lock expiry read heaps, not the window: a record released and acquired
    again many times leaves stale entries, and those are dropped or rebuilt, never hoarded."""
    share = partition(limit=10**6, window=100)
    share.acquire("a", range(0, 100), 0, max_records=100)
    for cycle in range(1, 50):
        share.release_member("a")
        assert share.fetch_offset() == 0
        share.acquire("a", range(0, 100), cycle, max_records=100)
        assert share.next_lock_deadline_ms() == cycle + LOCK_MS
    assert len(share._available) <= 2 * 100 + 64 and len(share._locks) <= 2 * 100 + 64
    assert share.expire_locks(10**9) == 100 and share.fetch_offset() == 0


def test_archive_available_skips_records_for_good() -> None:
    """A read_committed group's aborted records in the window are archived, never acquired."""
    share = partition()
    share.acquire("a", range(0, 4), 0, max_records=10)
    share.acknowledge("a", [ack(0, 3, AckType.RELEASE)])
    assert share.archive_available([1, 2, 9]) == 2
    assert share.fetch_offset() == 0
    got = share.acquire("b", range(0, 4), 0, max_records=10)
    assert got == [AcquiredRange(0, 0, 2), AcquiredRange(3, 3, 2)]
    share.acknowledge("b", [ack(0, 0, AckType.ACCEPT), ack(3, 3, AckType.ACCEPT)])
    assert share.start_offset == 4
