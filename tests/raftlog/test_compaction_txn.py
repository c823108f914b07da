"""Transaction-aware compaction (Kafka's LogCleaner with CleanedTransactionMetadata): the dirty
section ends at the first unstable offset, aborted records vanish and never shadow a committed
value, markers outlive their data by delete.retention.ms, the cleaned .txnindex keeps only the
aborts whose records remain, and producer state rebuilt from the cleaned log is unchanged."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from dataplane.broker.producer_state import ProducerStates
from raftlog import cleaner
from raftlog.batch import BatchHeader, iter_batches, read_header
from raftlog.cleaner import CLEANED_SUFFIX, SWAP_SUFFIX, CleanResult, empty_batch
from raftlog.config import LogConfig
from raftlog.log import Log
from raftlog.records import Record, decode_batch, encode_batch
from raftlog.segment import segment_name
from raftlog.txn import (
    TXN_INDEX_SUFFIX,
    AbortedTxn,
    Marker,
    TransactionIndex,
    encode_marker,
    read_marker,
)
from tests.raftlog.batches import ManualClock

RETENTION_MS = 60_000
COMPACT = {
    "cleanup.policy": "compact",
    "segment.bytes": 2048,
    "delete.retention.ms": RETENTION_MS,
    "min.cleanable.dirty.ratio": 0.0,
}
VALUE_BYTES = 150


def open_log(path: Path, clock: ManualClock, **overrides: object) -> Log:
    return Log(path / "table-0", LogConfig.parse({**COMPACT, **overrides}), clock=clock)


class Writer:
    """What the broker does around the log, in memory: producer state updated per stored batch
    (its sequences and epochs), abort markers indexed, the last stable offset."""

    def __init__(self, log: Log, clock: ManualClock) -> None:
        self.log, self.clock = log, clock
        self.states = ProducerStates()
        self.sequences: dict[tuple[int, int], int] = {}
        self.epochs: dict[int, int] = {}

    def send(self, pid: int, pairs: list[tuple[bytes, bytes | None]], *, txn: bool = False) -> int:
        """A batch of ``(key, value)``; pid -1: a plain batch. Returns its first offset."""
        epoch = self.epochs.get(pid, 0) if pid >= 0 else -1
        sequence = self.sequences.get((pid, epoch), 0) if pid >= 0 else -1
        records = [
            Record(-1, self.clock() + n, key, value and value.ljust(VALUE_BYTES, b"."))
            for n, (key, value) in enumerate(pairs)
        ]
        raw = encode_batch(records, producer_id=pid, producer_epoch=epoch,
                           base_sequence=sequence, is_transactional=txn)  # fmt: skip
        first = self.log.append(raw, leader_epoch=0).first_offset
        if pid >= 0:
            self.sequences[(pid, epoch)] = sequence + len(pairs)
        self.states.update(read_header(raw)._replace(base_offset=first))
        return first

    def end(self, pid: int, *, commit: bool, bump: bool = False, coordinator_epoch: int = 1) -> int:
        """The marker ending ``pid``'s transaction; ``bump``: of the next epoch (a coordinator
        that fenced the producer). Returns the marker's offset."""
        epoch = self.epochs.get(pid, 0) + (1 if bump else 0)
        self.epochs[pid] = epoch
        raw = encode_marker(pid, epoch, commit=commit, coordinator_epoch=coordinator_epoch,
                            timestamp_ms=self.clock())  # fmt: skip
        offset = self.log.append(raw, leader_epoch=0).first_offset
        marker = Marker(pid, epoch, commit, coordinator_epoch)
        aborted = self.states.update(read_header(raw)._replace(base_offset=offset), marker)
        if aborted is not None:
            self.log.append_aborted(aborted)
        return offset

    @property
    def lso(self) -> int:
        end = self.log.log_end_offset
        unstable = self.states.first_unstable_offset(end)
        return end if unstable is None else unstable

    def compact(self, *, force: bool = True) -> CleanResult | None:
        return self.log.compact(force=force, max_offset=self.lso)


def filler(writer: Writer, count: int, tag: str = "f") -> None:
    """Plain records of keys of their own: enough to roll segments."""
    for n in range(count):
        writer.send(-1, [(f"{tag}{n}".encode(), b"x")])


def batches(log: Log) -> Iterator[tuple[BatchHeader, list[Record]]]:
    data = log.read(log.log_start_offset, 1 << 24)
    for position, _ in iter_batches(data):
        yield decode_batch(data, position)


def read_committed(log: Log, end: int | None = None) -> list[Record]:
    """What a read_committed consumer sees up to ``end``: records of the batches below it, but
    not those of aborted transactions (by the aborted list a fetch returns) or control ones."""
    end = log.log_end_offset if end is None else end
    aborted = log.aborted_transactions(log.log_start_offset, end)
    seen: list[Record] = []
    for header, records in batches(log):
        if header.last_offset >= end or header.is_control:
            continue
        if header.is_transactional and any(
            e.producer_id == header.producer_id
            and e.first_offset <= header.base_offset <= e.last_offset
            for e in aborted
        ):
            continue
        seen.extend(records)
    return seen


def latest(records: list[Record]) -> dict[bytes | None, bytes | None]:
    return {r.key: r.value for r in records}


def markers(log: Log) -> list[BatchHeader]:
    return [h for h, _ in batches(log) if h.is_control]


def all_values(log: Log) -> set[bytes | None]:
    return {r.value for _, records in batches(log) for r in records}


def value(text: str) -> bytes:
    return text.encode().ljust(VALUE_BYTES, b".")


def test_aborted_records_vanish_and_never_shadow_a_committed_value(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock)
    writer = Writer(log, clock)
    writer.send(-1, [(b"k", b"committed")])
    writer.send(1, [(b"k", b"aborted-1"), (b"j", b"aborted-2")], txn=True)
    writer.send(1, [(b"k", b"aborted-3")], txn=True)
    writer.end(1, commit=False)
    writer.send(2, [(b"other", b"o")])  # producer 1's batches are not its last ones...
    writer.send(1, [(b"p1-last", b"v")])  # ...this one is
    filler(writer, 12)
    before = latest(read_committed(log, writer.lso))
    assert before[b"k"] == value("committed")
    result = writer.compact()
    assert result is not None and result.aborted_records_removed == 3
    assert latest(read_committed(log, writer.lso)) == before, "the committed value survives"
    assert not {value("aborted-1"), value("aborted-2"), value("aborted-3")} & all_values(log)
    assert log.aborted_transactions(0, log.log_end_offset) == [], "no aborted data is left"
    log.close()
    reopened = open_log(tmp_path, clock)
    assert latest(read_committed(reopened)) == before
    reopened.close()


def test_a_committed_transactional_record_is_the_latest_of_its_key(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock)
    writer = Writer(log, clock)
    writer.send(-1, [(b"k", b"plain")])
    writer.send(1, [(b"k", b"txn")], txn=True)
    writer.end(1, commit=True)
    filler(writer, 12)
    writer.compact()
    assert latest(read_committed(log))[b"k"] == value("txn")
    assert value("plain") not in all_values(log), "the older value was cleaned"
    commit = markers(log)
    assert len(commit) == 1 and not commit[0].has_delete_horizon, "kept while its data is"


def test_an_open_transaction_is_not_cleaned(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock)
    writer = Writer(log, clock)
    writer.send(-1, [(b"k", b"v1")])
    filler(writer, 12, tag="a")
    writer.send(1, [(b"k", b"open")], txn=True)  # undecided: may still abort
    first_unstable = writer.lso
    writer.send(-1, [(b"k", b"v2")])
    filler(writer, 12, tag="b")
    unstable_bytes = log.read(first_unstable, 1 << 24)
    for max_offset in (first_unstable, None):  # the broker's LSO, or the log's own open txns
        result = log.compact(force=True, max_offset=max_offset)
        assert result is not None and result.end_offset <= first_unstable
        assert log.read(first_unstable, 1 << 24) == unstable_bytes, "nothing past it touched"
        assert value("v1") in all_values(log), "v2 is above the first unstable offset"
    writer.end(1, commit=True)
    filler(writer, 12, tag="c")
    writer.compact()
    assert latest(read_committed(log))[b"k"] == value("v2")
    assert not {value("v1"), value("open")} & all_values(log)


def test_nothing_past_max_offset_is_cleaned(tmp_path: Path) -> None:
    """The high watermark bounds it too: what is above it might still be truncated."""
    clock = ManualClock()
    log = open_log(tmp_path, clock)
    writer = Writer(log, clock)
    filler(writer, 12, tag="a")
    writer.send(-1, [(b"k", b"v1")])
    bound = log.log_end_offset
    writer.send(-1, [(b"k", b"v2")])
    filler(writer, 12, tag="b")
    result = log.compact(force=True, max_offset=bound)
    assert result is not None and result.end_offset <= bound
    assert {value("v1"), value("v2")} <= all_values(log)


@pytest.mark.parametrize("commit", [True, False])
def test_markers_survive_delete_retention_ms_after_their_data_is_gone(
    tmp_path: Path, commit: bool
) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock)
    writer = Writer(log, clock)
    writer.send(1, [(b"k", b"txn")], txn=True)
    marker_offset = writer.end(1, commit=commit)
    writer.send(-1, [(b"k", b"newer")])  # supersedes a committed one
    writer.send(1, [(b"p1-last", b"v")], txn=True)  # producer 1's last batch and marker:
    last_marker = writer.end(1, commit=True)  # kept for its producer state
    filler(writer, 12)
    writer.compact()
    assert value("txn") not in all_values(log), "the data is gone in the first pass"
    found = [h for h in markers(log) if h.base_offset == marker_offset]
    assert len(found) == 1 and found[0].has_delete_horizon
    assert found[0].base_timestamp == clock.now_ms + RETENTION_MS
    assert log.aborted_transactions(0, log.log_end_offset) == [], "no records of it remain"
    clock.advance(RETENTION_MS - 1)
    writer.compact()
    assert [h.base_offset for h in markers(log)] == [marker_offset, last_marker], "not yet"
    clock.advance(1)
    result = writer.compact(force=False)  # the kept marker's horizon alone makes a pass due
    assert result is not None and result.markers_removed == 1
    assert [h.base_offset for h in markers(log)] == [last_marker]


def test_a_marker_stays_while_its_data_does(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock)
    writer = Writer(log, clock)
    writer.send(1, [(b"k", b"txn"), (b"j", b"txn-j")], txn=True)
    marker_offset = writer.end(1, commit=True)
    writer.send(-1, [(b"k", b"newer")])
    writer.send(1, [(b"p1-last", b"v")])
    filler(writer, 12)
    for _ in range(3):
        writer.compact()
        clock.advance(2 * RETENTION_MS)
    assert value("txn-j") in all_values(log)
    assert [h.base_offset for h in markers(log)] == [marker_offset]
    assert not markers(log)[0].has_delete_horizon


def test_the_cleaned_txnindex_keeps_only_aborts_whose_records_remain(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock)
    writer = Writer(log, clock)
    writer.send(1, [(b"a", b"gone")], txn=True)
    writer.end(1, commit=False)  # its data goes: so does its entry
    writer.send(2, [(b"b", b"x")], txn=True)
    writer.send(2, [(b"b", b"y")], txn=True)
    writer.end(2, commit=False)  # producer 2's last batch: kept empty, its entry with it
    writer.send(1, [(b"p1-last", b"v")])
    filler(writer, 12, tag="a")
    writer.send(3, [(b"c", b"z")], txn=True)
    writer.end(3, commit=False)  # in the active segment: not cleaned
    entries = log.aborted_transactions(0, log.log_end_offset)
    assert [e.producer_id for e in entries] == [1, 2, 3]
    writer.compact()
    assert log.aborted_transactions(0, log.log_end_offset) == entries[1:]
    kept_empty = [h for h, records in batches(log) if h.producer_id == 2 and not h.is_control]
    assert len(kept_empty) == 1 and kept_empty[0].record_count == 0
    assert kept_empty[0].last_offset == entries[1].last_offset - 1
    # A broker that rescans the cleaned log (no producer-state snapshot) finds producer 2's
    # abort from its kept batch on: a later first offset than the entry kept. It is the same
    # marker's abort: not indexed twice (nor refused as out of order).
    replayed = ProducerStates().update_all(log.batch_headers(), marker_of(log))
    assert [(e.producer_id, e.last_offset) for e in replayed][:2] == [
        (2, entries[1].last_offset),
        (3, entries[2].last_offset),
    ]
    assert replayed[0].first_offset > entries[1].first_offset
    for entry in replayed:
        log.append_aborted(entry)
    assert log.aborted_transactions(0, log.log_end_offset) == entries[1:]
    # A rescan from an older producer-state snapshot (producer 1's transaction open in it)
    # finds producer 1's abort, whose entry compaction dropped with its records: it stays out
    # (the index has a later abort, so it is whole up to there), and is not refused either.
    log.append_aborted(entries[0])
    assert log.aborted_transactions(0, log.log_end_offset) == entries[1:]
    log.close()
    on_disk = [
        TransactionIndex(path).entries
        for path in sorted(log.directory.glob(f"*{TXN_INDEX_SUFFIX}"))
    ]
    assert on_disk == [[entries[1]], [entries[2]]]
    assert open_log(tmp_path, clock).aborted_transactions(0, 1 << 20) == entries[1:]


@dataclass
class Cleaned:
    """A log cleaned once, and the files the cleaning wrote for its first group."""

    before: list[AbortedTxn]
    after: list[AbortedTxn]
    log_bytes: bytes
    txn_index_bytes: bytes
    replaced: list[int]  # base offsets of the segments the first group replaced


def build_and_clean(path: Path, clock: ManualClock, *, clean: bool) -> Cleaned | None:
    log = open_log(path, clock, **{"segment.bytes": 4096})
    writer = Writer(log, clock)
    writer.send(1, [(b"a", b"gone")], txn=True)
    writer.end(1, commit=False)
    writer.send(2, [(b"b", b"kept")], txn=True)
    writer.end(2, commit=False)
    writer.send(1, [(b"p1-last", b"v")])
    filler(writer, 40)
    before = log.aborted_transactions(0, log.log_end_offset)
    bases = [s.base_offset for s in log.segments()]
    if not clean:
        log.close()
        return None
    writer.compact()
    first = log.segments()[0]
    cleaned = Cleaned(
        before, log.aborted_transactions(0, log.log_end_offset), first.log_path.read_bytes(),
        first.txn_index.path.read_bytes(), [b for b in bases if b < log.segments()[1].base_offset],
    )  # fmt: skip
    log.close()
    return cleaned


def test_a_crash_before_the_commit_keeps_the_old_txnindex(tmp_path: Path) -> None:
    """The cleaner renamed the .txnindex to .swap (it goes before the log) and crashed before
    the log's rename committed the swap: the old segments stay, with their index."""
    clock = ManualClock()
    cleaned = build_and_clean(tmp_path / "source", clock, clean=True)
    assert cleaned is not None and cleaned.after != cleaned.before
    build_and_clean(tmp_path, clock, clean=False)
    directory = tmp_path / "table-0"
    base = segment_name(0, "")
    old = {p.name: p.read_bytes() for p in directory.iterdir() if p.name.startswith(base)}
    (directory / f"{base}.log{CLEANED_SUFFIX}").write_bytes(cleaned.log_bytes)
    (directory / f"{base}{TXN_INDEX_SUFFIX}{SWAP_SUFFIX}").write_bytes(cleaned.txn_index_bytes)
    reopened = open_log(tmp_path, clock)
    assert reopened.aborted_transactions(0, 1 << 20) == cleaned.before
    assert (directory / f"{base}{TXN_INDEX_SUFFIX}").read_bytes() == old[
        f"{base}{TXN_INDEX_SUFFIX}"
    ]
    assert not [p for p in directory.iterdir() if p.name.endswith((SWAP_SUFFIX, CLEANED_SUFFIX))]
    reopened.close()


def test_a_crash_after_the_log_is_in_place_finishes_the_txnindex(tmp_path: Path) -> None:
    """The swap was committed, the old segments deleted, the log renamed into place, and the
    crash came before the .txnindex's rename: the next open renames it."""
    clock = ManualClock()
    cleaned = build_and_clean(tmp_path / "source", clock, clean=True)
    assert cleaned is not None
    build_and_clean(tmp_path, clock, clean=False)
    directory = tmp_path / "table-0"
    for base_offset in cleaned.replaced:
        for path in directory.glob(f"{segment_name(base_offset, '')}.*"):
            path.unlink()
    base = segment_name(0, "")
    (directory / f"{base}.log").write_bytes(cleaned.log_bytes)
    (directory / f"{base}{TXN_INDEX_SUFFIX}{SWAP_SUFFIX}").write_bytes(cleaned.txn_index_bytes)
    reopened = open_log(tmp_path, clock)
    assert reopened.aborted_transactions(0, 1 << 20) == cleaned.after
    assert not list(directory.glob(f"*{SWAP_SUFFIX}"))
    reopened.close()


def test_a_crash_after_the_swap_commit_takes_the_cleaned_txnindex(tmp_path: Path) -> None:
    clock = ManualClock()
    cleaned = build_and_clean(tmp_path / "source", clock, clean=True)
    assert cleaned is not None
    build_and_clean(tmp_path, clock, clean=False)
    directory = tmp_path / "table-0"
    base = segment_name(0, "")
    (directory / f"{base}.log{SWAP_SUFFIX}").write_bytes(cleaned.log_bytes)
    (directory / f"{base}{TXN_INDEX_SUFFIX}{SWAP_SUFFIX}").write_bytes(cleaned.txn_index_bytes)
    reopened = open_log(tmp_path, clock)
    assert reopened.aborted_transactions(0, 1 << 20) == cleaned.after
    assert not list(directory.glob(f"*{SWAP_SUFFIX}"))
    reopened.close()


def test_a_pass_that_fails_part_way_leaves_the_log_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock)
    writer = Writer(log, clock)
    writer.send(1, [(b"a", b"gone")], txn=True)
    writer.end(1, commit=False)
    writer.send(1, [(b"p1-last", b"v")])
    filler(writer, 12)
    before = (log.read(0, 1 << 24), log.aborted_transactions(0, 1 << 20))
    real, calls = cleaner.clean_batch, [0]

    def failing(*args: object, **kwargs: object) -> bytes | None:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("injected")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cleaner, "clean_batch", failing)
    with pytest.raises(RuntimeError, match="injected"):
        writer.compact()
    assert (log.read(0, 1 << 24), log.aborted_transactions(0, 1 << 20)) == before
    assert not list(log.directory.glob(f"*{CLEANED_SUFFIX}"))
    monkeypatch.setattr(cleaner, "clean_batch", real)
    assert writer.compact() is not None
    assert value("gone") not in all_values(log)


def test_an_empty_batch_keeps_its_header_and_decodes_with_kafka_python() -> None:
    records = [Record(-1, 1_000 + n, b"k", b"v") for n in range(3)]
    raw = encode_batch(records, base_offset=40, producer_id=9, producer_epoch=4,
                       base_sequence=17, is_transactional=True)  # fmt: skip
    header = read_header(raw)
    empty = empty_batch(header)
    got, decoded = decode_batch(empty)  # CRC checked
    assert decoded == []
    assert (got.base_offset, got.last_offset, got.producer_id, got.producer_epoch) == (40, 42, 9, 4)
    assert (got.base_sequence, got.record_count, got.max_timestamp) == (17, 0, 1_002)
    assert got.is_transactional and not got.is_control and not got.has_delete_horizon
    theirs = DefaultRecordBatch(empty)
    assert theirs.validate_crc() and list(theirs) == []


# -- producer state rebuilt from the cleaned log ---------------------------------------------------
def marker_of(log: Log) -> Callable[[BatchHeader], Marker]:
    """What the broker's rescan reads a control batch's marker with."""
    return lambda header: read_marker(log.read(header.base_offset, header.size_bytes))


def rebuilt(log: Log, now_ms: int) -> dict[int, tuple[int, int, int, int, int]]:
    """Producer state as a broker rebuilds it from the log's batch headers: per producer its
    epoch, last sequence, coordinator epoch, open transaction and last timestamp."""
    states = ProducerStates()
    states.update_all(log.batch_headers(), marker_of(log))
    states.remove_expired(now_ms, log.config.producer_id_expiration_ms)
    return {
        pid: (e.producer_epoch, e.last_sequence, e.coordinator_epoch, e.current_txn_first_offset,
              e.last_timestamp)
        for pid, e in states.items()
    }  # fmt: skip


def test_producer_state_survives_cleaning_until_the_producer_expires(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock, **{"producer.id.expiration.ms": 3_600_000})
    writer = Writer(log, clock)
    writer.send(1, [(b"k", b"a"), (b"k", b"b")])  # idempotent: sequences 0-1
    writer.send(2, [(b"j", b"t")], txn=True)
    writer.end(2, commit=False, bump=True, coordinator_epoch=5)  # a fencing abort: epoch 1
    writer.send(-1, [(b"k", b"newer")])
    filler(writer, 12)
    expected = rebuilt(log, clock())
    assert expected[1][:2] == (0, 1) and expected[2][:3] == (1, -1, 5)
    writer.compact()
    assert not {value("a"), value("b"), value("t")} & all_values(log)
    assert rebuilt(log, clock()) == expected
    clock.advance(3_600_000 + 10)  # both producers expire: what kept them goes with the next pass
    writer.compact(force=False)  # their expiry alone makes the pass due
    assert rebuilt(log, clock()) == {}
    left = [h for h, _ in batches(log) if h.producer_id in (1, 2)]
    assert len(left) == 1 and left[0].is_control and left[0].has_delete_horizon
    clock.advance(RETENTION_MS)  # the abort marker's data went with the last pass: now it goes
    writer.compact(force=False)
    assert not [h for h, _ in batches(log) if h.producer_id in (1, 2)]


OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["plain", "idempotent", "txn", "txn", "commit", "abort", "abort", "fence", "fill"]
        ),
        st.integers(1, 3),  # producer id
        st.lists(st.sampled_from([b"a", b"b", b"c", b"d"]), min_size=1, max_size=3),
        st.booleans(),  # a tombstone for the first key
    ),
    min_size=1,
    max_size=60,
)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS, advance=st.sampled_from([0, RETENTION_MS]), leave_open=st.booleans())
def test_cleaning_keeps_what_read_committed_sees_and_producer_state(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, list[bytes], bool]],
    advance: int, leave_open: bool,
) -> None:  # fmt: skip
    """Random plain, idempotent and transactional writes of a few keys, transactions committed,
    aborted, fenced (an abort of a bumped epoch) or left open: cleaning changes nothing a
    read_committed reader sees (tombstones aside, once expired), nothing at or above the LSO,
    and nothing of the producer state rebuilt from the log; no aborted record is left."""
    clock = ManualClock()
    log = open_log(tmp_path_factory.mktemp("log"), clock, **{"segment.bytes": 1024})
    writer = Writer(log, clock)
    open_txns: set[int] = set()
    for n, (kind, pid, keys, tombstone) in enumerate(ops):
        pairs = [
            (k, None if tombstone and i == 0 else f"{kind}{n}".encode()) for i, k in enumerate(keys)
        ]
        if kind == "plain":
            writer.send(-1, pairs)
        elif kind == "idempotent" and pid not in open_txns:
            writer.send(pid, pairs)
        elif kind == "txn":
            writer.send(pid, pairs, txn=True)
            open_txns.add(pid)
        elif kind in ("commit", "abort", "fence") and pid in open_txns:
            writer.end(pid, commit=kind == "commit", bump=kind == "fence")
            open_txns.discard(pid)
        elif kind == "fill":
            filler(writer, 4, tag=f"f{n}-")
        clock.advance(10)
    for pid in sorted(open_txns) if not leave_open else []:
        writer.end(pid, commit=pid % 2 == 0)
    filler(writer, 8, tag="end")  # the markers leave the active segment
    lso = writer.lso
    visible = latest(read_committed(log, lso))
    unstable = log.read(lso, 1 << 24) if lso < log.log_end_offset else b""
    states = rebuilt(log, clock())
    aborted = log.aborted_transactions(0, lso)
    removed = [0, 0]
    for _ in range(2):
        first = writer.compact()
        clock.advance(advance)
        second = log.compact(max_offset=writer.lso)  # due only if a kept horizon passed
        for result in (first, second):
            if result is not None:
                removed[0] += result.aborted_records_removed
                removed[1] += result.markers_removed
    event(f"aborted records removed: {bool(removed[0])}")
    event(f"markers removed: {bool(removed[1])}")
    after = latest(read_committed(log, lso))
    # Tombstones may be gone after delete.retention.ms: a deleted key reads as absent.
    assert {k: v for k, v in after.items() if v is not None} == {
        k: v for k, v in visible.items() if v is not None
    }
    assert set(after) <= set(visible)
    assert (log.read(lso, 1 << 24) if lso < log.log_end_offset else b"") == unstable
    cleaned_end = cleaner.read_cleaner_checkpoint(log)[0]
    aborted_values = {
        r.value for h, records in batches(log) for r in records
        if not h.is_control and h.base_offset < cleaned_end and h.is_transactional
        and any(e.producer_id == h.producer_id and e.first_offset <= h.base_offset <= e.last_offset
                for e in aborted)
    }  # fmt: skip
    assert not aborted_values, "no aborted record is left in the cleaned part"
    remaining = [header for header, _ in batches(log)]
    for n, header in enumerate(remaining):
        if header.is_transactional and not header.is_control and header.last_offset < lso:
            assert any(
                later.is_control and later.producer_id == header.producer_id
                for later in remaining[n + 1 :]
            ), "a marker stays while a batch of its transaction does"
    # A batch that loses records has the largest timestamp of those left (Kafka's too): the last
    # timestamp may move back, never forward; nothing else of a producer changes.
    cleaned_states = rebuilt(log, clock())
    assert {pid: entry[:4] for pid, entry in cleaned_states.items()} == {
        pid: entry[:4] for pid, entry in states.items()
    }
    assert all(cleaned_states[pid][4] <= entry[4] for pid, entry in states.items())
    log.close()
