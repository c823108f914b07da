"""A log's aborted transactions: kept in the transaction index of the segment holding each abort
marker, found by range across segments, cut by truncation, gone with retention, kept by an
unclean restart and by compaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlog.config import LogConfig
from raftlog.errors import StorageError
from raftlog.log import Log
from raftlog.records import Record, encode_batch, iter_records
from raftlog.txn import TXN_INDEX_SUFFIX, AbortedTxn, encode_marker
from tests.raftlog.batches import BASE_TIMESTAMP_MS, ManualClock, make_batch

PID = 7


def txn_batch(values: int, *, key: bytes | None = None) -> bytes:
    records = [
        Record(-1, BASE_TIMESTAMP_MS + n, key, f"t{n}".encode().ljust(200, b"."))
        for n in range(values)
    ]
    return encode_batch(records, producer_id=PID, producer_epoch=0, base_sequence=0,
                        is_transactional=True)  # fmt: skip


def marker(commit: bool) -> bytes:
    return encode_marker(PID, 0, commit=commit, coordinator_epoch=1, timestamp_ms=BASE_TIMESTAMP_MS)


def open_log(path: Path, **config: object) -> Log:
    return Log(path / "events-0", LogConfig.parse(config), clock=ManualClock())


def abort_one(log: Log, values: int = 2) -> AbortedTxn:
    """A transaction of ``values`` records, then its abort marker; the entry for it."""
    first = log.append(txn_batch(values), leader_epoch=0).first_offset
    end = log.append(marker(commit=False), leader_epoch=0).last_offset
    aborted = AbortedTxn(PID, first, end, end + 1)
    log.append_aborted(aborted)
    return aborted


def txn_index_files(log: Log) -> list[str]:
    return sorted(p.name for p in log.directory.glob(f"*{TXN_INDEX_SUFFIX}"))


def test_aborts_are_found_by_range_across_segments(tmp_path: Path) -> None:
    log = open_log(tmp_path, **{"segment.bytes": 1024})
    first = abort_one(log)
    log.append(txn_batch(3), leader_epoch=0)
    log.append(marker(commit=True), leader_epoch=0)  # committed: nothing to index
    second = abort_one(log)
    assert log.segment_count > 1
    assert log.aborted_transactions(0, log.log_end_offset) == [first, second]
    assert log.aborted_transactions(first.last_offset + 1, second.first_offset) == []
    assert log.aborted_transactions(second.last_offset, second.last_offset + 1) == [second]
    log.append_aborted(second)  # replayed on recovery: not added twice
    assert log.aborted_transactions(0, log.log_end_offset) == [first, second]
    assert len(txn_index_files(log)) == 2, "one file per segment that holds an abort"
    with pytest.raises(StorageError, match="no marker at offset"):
        log.append_aborted(AbortedTxn(PID, 0, log.log_end_offset, log.log_end_offset))


def test_truncation_forgets_aborts_whose_marker_is_cut(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    first = abort_one(log)
    second = abort_one(log)
    log.truncate_to(second.last_offset)
    assert log.aborted_transactions(0, 100) == [first]
    log.close()
    assert open_log(tmp_path).aborted_transactions(0, 100) == [first]


def test_an_unclean_restart_keeps_the_index(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    aborted = abort_one(log)
    log.abandon()  # a crash: no flush, no clean-shutdown marker; the indexes are rebuilt
    reopened = open_log(tmp_path)
    assert not reopened.recovery.clean_shutdown
    assert reopened.aborted_transactions(0, 100) == [aborted]


def test_retention_removes_the_index_with_its_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path, **{"segment.bytes": 1024, "retention.bytes": 1})
    abort_one(log)
    log.roll()
    log.append(txn_batch(1), leader_epoch=0)
    assert txn_index_files(log)
    assert log.delete_old_segments(high_watermark=log.log_end_offset) > 0
    log.close()
    assert not [p for p in log.directory.iterdir() if TXN_INDEX_SUFFIX in p.name]
    assert open_log(tmp_path).aborted_transactions(0, 100) == []


def test_compaction_keeps_an_abort_while_a_batch_of_it_remains(tmp_path: Path) -> None:
    """The aborted records go; the producer's last batch stays, empty (its sequence is producer
    state), and with it the abort marker and the entry (tests/raftlog/test_compaction_txn.py
    has the rest)."""
    config = {"cleanup.policy": "compact", "segment.bytes": 1024, "min.cleanable.dirty.ratio": 0.0}
    log = open_log(tmp_path, **config)
    first = log.append(txn_batch(2, key=b"k"), leader_epoch=0).first_offset
    end = log.append(marker(commit=False), leader_epoch=0).last_offset
    aborted = AbortedTxn(PID, first, end, end + 1)
    log.append_aborted(aborted)
    for n in range(6):
        log.append(make_batch([b"v".ljust(200, b".")], keys=[f"k{n}".encode()]), leader_epoch=0)
    log.roll()
    result = log.compact(force=True)
    assert result is not None and result.aborted_records_removed == 2
    assert log.aborted_transactions(0, 100) == [aborted]
    assert [r.key for r in iter_records(log.read(0, 1 << 20))] == [b"\x00\x00\x00\x00"] + [
        f"k{n}".encode() for n in range(6)
    ], "the marker's control record, then the plain records"
    log.close()
    assert open_log(tmp_path, **config).aborted_transactions(0, 100) == [aborted]


def test_a_crash_after_a_swap_commit_keeps_the_cleaned_index(tmp_path: Path) -> None:
    """The cleaner committed its .swap files (the transaction index among them) and crashed
    before renaming them: the next open finishes the swap, the index included."""
    config = {"segment.bytes": 1024}
    log = open_log(tmp_path, **config)
    aborted = abort_one(log)
    log.roll()
    log.close()
    first = log.directory / f"{0:020d}"
    for suffix in (".log", TXN_INDEX_SUFFIX):
        Path(f"{first}{suffix}").rename(Path(f"{first}{suffix}.swap"))
    reopened = open_log(tmp_path, **config)
    assert reopened.aborted_transactions(0, 100) == [aborted]
    assert not list(reopened.directory.glob("*.swap"))
