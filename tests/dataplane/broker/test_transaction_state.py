"""Producer state that knows transactions (issue 27), pure: open transactions and the first
unstable offset, markers checked as Kafka's ``appendEndTxnMarker`` checks them, the aborted
transactions an abort yields (with the LSO of that moment), the KIP-890 verification guard,
expiry that spares open transactions, and snapshots v2 (v1 files still read). A hypothesis
model checks the transaction bookkeeping and that a snapshot taken anywhere resumes it."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.broker.producer_state import (
    NO_TXN,
    SENTINEL,
    CorruptSnapshotError,
    ProducerStates,
    decode_snapshot,
    encode_snapshot,
)
from raftlog.batch import BatchHeader, read_header
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import encode_batch
from raftlog.txn import AbortedTxn, Marker, encode_marker


def data(
    producer_id: int,
    sequence: int,
    *,
    epoch: int = 0,
    count: int = 2,
    transactional: bool = True,
    timestamp_ms: int = 1_000,
) -> BatchHeader:
    raw = encode_batch(
        [(None, b"v", timestamp_ms, ()) for _ in range(count)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        is_transactional=transactional,
    )
    return read_header(raw)


def marker(
    producer_id: int, *, commit: bool, epoch: int = 0, coordinator_epoch: int = 0
) -> tuple[BatchHeader, Marker]:
    raw = encode_marker(producer_id, epoch, commit=commit, coordinator_epoch=coordinator_epoch,
                        timestamp_ms=2_000)  # fmt: skip
    return read_header(raw), Marker(producer_id, epoch, commit, coordinator_epoch)


class Partition:
    """A partition's log end and producer state, as the leader drives them."""

    def __init__(self, states: ProducerStates | None = None, end: int = 0) -> None:
        self.states = states if states is not None else ProducerStates()
        self.end = end

    def write(self, header: BatchHeader, verification: object = None) -> int:
        self.states.check(header, verification)  # type: ignore[arg-type]
        return self.stored(header)

    def stored(self, header: BatchHeader) -> int:
        offset = self.end
        self.states.update(header._replace(base_offset=offset))
        self.end = offset + header.last_offset_delta + 1
        return offset

    def end_txn(
        self, producer_id: int, *, commit: bool, epoch: int = 0, coordinator_epoch: int = 0
    ) -> tuple[int, AbortedTxn | None]:
        self.states.check_marker(producer_id, epoch, coordinator_epoch)
        header, parsed = marker(producer_id, commit=commit, epoch=epoch,
                                coordinator_epoch=coordinator_epoch)  # fmt: skip
        offset = self.end
        aborted = self.states.update(header._replace(base_offset=offset), parsed)
        self.end = offset + 1
        return offset, aborted


def refused(error: ErrorCode) -> pytest.RaisesExc[KafkaError]:
    return pytest.raises(KafkaError, check=lambda e: e.error is error)


def test_a_transaction_is_unstable_until_its_marker_is_replicated() -> None:
    p = Partition()
    p.write(data(1, 0, transactional=False))  # 0-1: idempotent, never unstable
    assert p.states.first_unstable_offset(high_watermark=2) is None
    first = p.write(data(7, 0))  # 2-3 opens producer 7's transaction
    p.write(data(7, 2))  # 4-5 joins it
    assert p.states.entry(7).current_txn_first_offset == first == 2  # type: ignore[union-attr]
    assert p.states.first_unstable_offset(high_watermark=6) == 2
    at, aborted = p.end_txn(7, commit=True)
    assert (at, aborted) == (6, None)
    assert p.states.entry(7).current_txn_first_offset == NO_TXN  # type: ignore[union-attr]
    # decided, but a new leader without the marker would reopen it: unstable until replicated
    assert p.states.first_unstable_offset(high_watermark=6) == 2
    assert p.states.first_unstable_offset(high_watermark=7) is None
    assert p.states.open_transactions() == []


def test_an_abort_yields_its_range_and_the_lso_of_that_moment() -> None:
    p = Partition()
    p.write(data(7, 0))  # 0-1
    p.write(data(8, 0))  # 2-3
    p.write(data(7, 2))  # 4-5
    assert p.states.open_transactions() == [(0, 7), (2, 8)]
    at, aborted = p.end_txn(7, commit=False)
    # producer 8's transaction still holds the LSO at 2
    assert aborted == AbortedTxn(7, 0, at, last_stable_offset=2)
    at, aborted = p.end_txn(8, commit=False)
    assert aborted == AbortedTxn(8, 2, at, last_stable_offset=at + 1)
    assert p.states.first_unstable_offset(high_watermark=at - 1) == 0  # 7's marker at at-1
    assert p.states.first_unstable_offset(high_watermark=at) == 2
    assert p.states.first_unstable_offset(high_watermark=at + 1) is None


def test_a_marker_without_a_transaction_changes_no_offsets() -> None:
    p = Partition()
    assert p.end_txn(5, commit=False) == (0, None)  # a producer never seen: its entry is made
    entry = p.states.entry(5)
    assert entry is not None and not entry.batches and entry.last_timestamp == 2_000
    assert p.states.first_unstable_offset(high_watermark=0) is None


def test_markers_are_checked_as_kafka_checks_them() -> None:
    p = Partition()
    p.write(data(7, 0, epoch=3))
    p.end_txn(7, commit=True, epoch=3, coordinator_epoch=5)
    with refused(ErrorCode.INVALID_PRODUCER_EPOCH):
        p.end_txn(7, commit=False, epoch=2, coordinator_epoch=5)
    with refused(ErrorCode.TRANSACTION_COORDINATOR_FENCED):
        p.end_txn(7, commit=False, epoch=3, coordinator_epoch=4)
    # a coordinator that fenced the producer writes its abort at the bumped epoch: the
    # sequence restarts there, the old epoch is fenced
    p.end_txn(7, commit=False, epoch=4, coordinator_epoch=6)
    entry = p.states.entry(7)
    assert entry is not None and entry.producer_epoch == 4 and not entry.batches
    assert entry.coordinator_epoch == 6
    with refused(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER):
        p.write(data(7, 2, epoch=4))
    with refused(ErrorCode.INVALID_PRODUCER_EPOCH):
        p.write(data(7, 2, epoch=3))
    p.write(data(7, 0, epoch=4))


def test_transactional_batches_check_sequences_and_plain_ones_wait_for_the_marker() -> None:
    p = Partition()
    p.write(data(7, 0))
    with refused(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER):
        p.write(data(7, 5))
    assert p.states.check(data(7, 0)) is not None, "a retry gets its original offsets"
    with refused(ErrorCode.INVALID_TXN_STATE):
        p.write(data(7, 2, transactional=False))
    p.end_txn(7, commit=True)
    p.write(data(7, 2, transactional=False))


def test_a_verification_is_voided_by_a_marker() -> None:
    p = Partition()
    guard = p.states.start_verification(7, 0, now_ms=1_000)
    p.write(data(7, 0), guard)  # verified: opens the transaction
    p.write(data(7, 2), SENTINEL)  # open here: nothing to ask
    p.end_txn(7, commit=True)
    with refused(ErrorCode.INVALID_TXN_STATE):
        p.write(data(7, 4), SENTINEL)  # looked open when asked; its transaction ended since
    late = p.states.start_verification(7, 0, now_ms=1_000)
    p.end_txn(7, commit=False)  # the abort lands while the coordinator is asked
    with refused(ErrorCode.INVALID_TXN_STATE):
        p.write(data(7, 4), late)
    again = p.states.start_verification(7, 0, now_ms=1_000)
    concurrent = p.states.start_verification(7, 0, now_ms=1_001)
    assert concurrent is again  # first batches in flight together share one guard (Kafka's)
    bumped = p.states.start_verification(7, 1, now_ms=1_002)
    with refused(ErrorCode.INVALID_TXN_STATE):
        p.write(data(7, 4), again)  # replaced by a verification of a newer epoch
    p.write(data(7, 0, epoch=1), bumped)
    p.write(data(8, 0))  # no verification asked for (no coordinator hook): not checked


def test_expiry_never_drops_a_producer_with_an_open_transaction() -> None:
    p = Partition()
    p.write(data(1, 0, timestamp_ms=1_000))
    p.write(data(2, 0, timestamp_ms=1_000, transactional=False))
    stale = p.states.start_verification(3, 0, now_ms=1_000)
    assert p.states.remove_expired(now_ms=100_000, expiration_ms=5_000) == 1
    assert p.states.entry(1) is not None and p.states.entry(2) is None
    with refused(ErrorCode.INVALID_TXN_STATE):  # the stale verification went too
        p.write(data(3, 0), stale)
    p.end_txn(1, commit=True)  # marker stamped 2_000
    assert p.states.remove_expired(now_ms=7_000, expiration_ms=5_000) == 1


# -- snapshots ---------------------------------------------------------------------------------
def test_a_v2_snapshot_keeps_open_transactions_and_producers_without_batches() -> None:
    p = Partition()
    p.write(data(7, 0))  # 0-1, open
    p.write(data(8, 0))  # 2-3
    p.end_txn(8, commit=True, coordinator_epoch=9)  # 4
    p.end_txn(9, commit=False, epoch=2)  # 5: a producer only a marker made
    data_v2 = encode_snapshot(p.end, p.states)
    assert struct.unpack_from(">h", data_v2)[0] == 2
    loaded = decode_snapshot(data_v2, p.end)
    assert loaded.open_transactions() == [(0, 7)]
    assert loaded.first_unstable_offset(high_watermark=p.end) == 0
    for producer_id in (7, 8, 9):
        assert loaded.entry(producer_id) == p.states.entry(producer_id)
    assert loaded.entry(8).coordinator_epoch == 9  # type: ignore[union-attr]
    # the abort of a transaction opened before the snapshot is found after it
    resumed = Partition(loaded, p.end)
    _, aborted = resumed.end_txn(7, commit=False)
    assert aborted == AbortedTxn(7, 0, 6, 7)
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(encode_snapshot(0, p.states), 0)  # an open transaction at/above it


def v1_snapshot(offset: int, producers: list[tuple[int, int, list[tuple[int, ...]]]]) -> bytes:
    """A snapshot file as version 1 wrote it (before transactions)."""
    body = struct.pack(">qi", offset, len(producers))
    for producer_id, epoch, batches in producers:
        body += struct.pack(">qhb", producer_id, epoch, len(batches))
        body += b"".join(struct.pack(">iiqqq", *b) for b in batches)
    return struct.pack(">hI", 1, crc32c.crc32c(body)) + body


def test_version_1_snapshots_still_load() -> None:
    old = v1_snapshot(
        10, [(4, 1, [(0, 1, 0, 1, 500), (2, 3, 2, 3, 700)]), (5, 0, [(0, 0, 9, 9, 9)])]
    )
    states = decode_snapshot(old, 10)
    entry = states.entry(4)
    assert entry is not None and entry.producer_epoch == 1 and entry.last_sequence == 3
    assert entry.last_timestamp == 700 and entry.current_txn_first_offset == NO_TXN
    assert entry.coordinator_epoch == -1
    assert states.check(data(4, 4, epoch=1, transactional=False)) is None
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(v1_snapshot(10, [(4, 1, [])]), 10)  # v1 had no producer without batches


# -- a model -----------------------------------------------------------------------------------
Action = tuple[str, int]  # ("data" | "plain" | "commit" | "abort", producer id)
actions = st.lists(
    st.tuples(st.sampled_from(["data", "data", "plain", "commit", "abort"]), st.integers(1, 4)),
    max_size=40,
)


def run(actions_: list[Action], p: Partition, seqs: dict[int, int]) -> list[AbortedTxn]:
    """Apply the actions a leader would accept; the aborts they yield."""
    aborted: list[AbortedTxn] = []
    for kind, producer_id in actions_:
        entry = p.states.entry(producer_id)
        in_txn = entry is not None and entry.current_txn_first_offset != NO_TXN
        if kind in ("data", "plain"):
            if kind == "plain" and in_txn:
                continue
            p.write(data(producer_id, seqs.get(producer_id, 0), transactional=kind == "data"))
            seqs[producer_id] = seqs.get(producer_id, 0) + 2
        else:
            _, found = p.end_txn(producer_id, commit=kind == "commit")
            if found is not None:
                aborted.append(found)
    return aborted


def model(actions_: list[Action]) -> tuple[dict[int, int], list[tuple[int, int, int, int]]]:
    """Open transactions (producer -> first offset) and aborts, by a plain walk."""
    open_: dict[int, int] = {}
    aborts: list[tuple[int, int, int, int]] = []
    end = 0
    for kind, producer_id in actions_:
        if kind == "plain" and producer_id in open_:
            continue
        if kind in ("data", "plain"):
            if kind == "data":
                open_.setdefault(producer_id, end)
            end += 2
            continue
        first = open_.pop(producer_id, None)
        if first is not None and kind == "abort":
            lso = min(open_.values(), default=end + 1)
            aborts.append((producer_id, first, end, lso))
        end += 1
    return open_, aborts


@settings(max_examples=200, deadline=None)
@given(actions, st.integers(0, 40))
def test_the_bookkeeping_matches_a_model_and_snapshots_resume_it(
    actions_: list[Action], cut: int
) -> None:
    whole = Partition()
    aborted = run(actions_, whole, {})
    open_, aborts = model(actions_)
    assert [tuple(a.__dict__.values()) for a in aborted] == aborts
    assert whole.states.open_transactions() == sorted((f, p) for p, f in open_.items())
    expected_unstable = min(open_.values(), default=None)
    assert whole.states.first_unstable_offset(high_watermark=whole.end) == expected_unstable
    # cut anywhere, snapshot, load, go on: the same aborts and the same open transactions
    first = Partition()
    seqs: dict[int, int] = {}
    before = run(actions_[:cut], first, seqs)
    loaded = Partition(decode_snapshot(encode_snapshot(first.end, first.states), first.end),
                       first.end)  # fmt: skip
    after = run(actions_[cut:], loaded, seqs)
    assert before + after == aborted
    assert loaded.states.open_transactions() == whole.states.open_transactions()
