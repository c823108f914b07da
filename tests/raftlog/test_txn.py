"""Transaction markers in Kafka's bytes (read back by kafka-python, an independent reader) and the
per-segment transaction index of aborted transactions: append, collect, truncate, a torn tail."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatch

from raftlog.batch import read_header
from raftlog.errors import CorruptRecordError, InvalidRecordError
from raftlog.records import Record, encode_batch
from raftlog.txn import (
    ENTRY,
    AbortedTxn,
    Marker,
    TransactionIndex,
    aborted_in,
    encode_marker,
    read_marker,
)


@pytest.mark.parametrize("commit", [True, False])
def test_a_marker_is_kafkas_control_batch(commit: bool) -> None:
    data = encode_marker(4242, 7, commit=commit, coordinator_epoch=3, timestamp_ms=1_700_000)
    header = read_header(data)
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.record_count) == (4242, 7, 1)
    assert read_marker(data) == Marker(4242, 7, commit, 3)
    theirs = DefaultRecordBatch(bytearray(data))
    assert theirs.is_control_batch and theirs.is_transactional
    [control] = list(theirs)
    assert (control.version, control.commit, control.abort) == (0, commit, not commit)
    assert control.value == b"\x00\x00\x00\x00\x00\x03"  # version 0, coordinator epoch 3


def test_a_data_batch_is_not_a_marker() -> None:
    data = encode_batch(
        [Record(-1, 1_700_000, None, b"v")], producer_id=1, producer_epoch=0, is_transactional=True
    )
    with pytest.raises(InvalidRecordError, match="not a marker"):
        read_marker(data)


def test_the_index_appends_collects_and_truncates(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.txnindex"
    index = TransactionIndex(path)
    assert not path.exists(), "created with its first entry"
    first, second = AbortedTxn(7, 10, 20, 21), AbortedTxn(8, 15, 40, 41)
    index.append(first)
    index.append(second)
    assert path.stat().st_size == 2 * ENTRY.size == 68
    assert index.collect(0, 10) == []  # ends before the first begins
    assert index.collect(0, 11) == [first]
    assert index.collect(21, 100) == [second]
    assert index.collect(20, 21) == [first, second]
    with pytest.raises(ValueError, match="after one at 40"):
        index.append(AbortedTxn(9, 30, 35, 36))
    reopened = TransactionIndex(path)
    assert reopened.entries == [first, second]
    reopened.truncate_to(40)
    assert TransactionIndex(path).entries == [first]
    assert aborted_in([reopened, TransactionIndex(tmp_path / "none.txnindex")], 0, 99) == [first]


def test_a_torn_tail_is_cut_and_garbage_refused(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.txnindex"
    index = TransactionIndex(path)
    index.append(AbortedTxn(7, 10, 20, 21))
    with path.open("ab") as out:
        out.write(ENTRY.pack(0, 8, 30, 40, 41)[:20])  # a crash mid-write
    reopened = TransactionIndex(path)
    assert reopened.torn_bytes == 20 and len(reopened.entries) == 1
    assert path.stat().st_size == ENTRY.size
    path.write_bytes(ENTRY.pack(3, 8, 30, 40, 41))
    with pytest.raises(CorruptRecordError, match="not an aborted transaction"):
        TransactionIndex(path)
