"""Transactions on real replicas (issue 27): the last stable offset, read_committed reads and
their aborted transactions, markers applied by followers (a new leader has the same LSO and
.txnindex), the state after a reopen (snapshot v2 or a rescan) and a truncation, and what a
leader refuses (markers of an old epoch, markers where it does not lead, client control
batches, a batch whose verification a marker voided)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from dataplane.broker.partition import READ_COMMITTED, Partition
from dataplane.broker.producer_state import SENTINEL
from metadata_quorum.image import PartitionRegistration
from raftlog.batch import iter_batches
from raftlog.errors import ErrorCode, KafkaError
from raftlog.log import CLEAN_SHUTDOWN_MARKER, Log
from raftlog.records import decode_batch, encode_batch, iter_records
from raftlog.txn import TXN_INDEX_SUFFIX, AbortedTxn, encode_marker
from tests.dataplane.broker.test_replication_core import Clock, fetch_round

TOPIC_ID = uuid.UUID(int=27)


def txn_batch(producer_id: int, sequence: int, *values: bytes, epoch: int = 0) -> bytes:
    return encode_batch(
        [(None, v, 1_000_000, ()) for v in values],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        is_transactional=True,
    )


def replica(
    root: Path, broker_id: int, clock: Clock, high_watermark: int | None = None
) -> Partition:
    log = Log(root / f"broker-{broker_id}" / "t-0", topic_id=TOPIC_ID, clock=clock)
    return Partition("t", 0, TOPIC_ID, log, broker_id, clock, high_watermark)


def lead(partition: Partition, epoch: int = 0, isr: tuple[int, ...] = (1, 2)) -> None:
    partition.make_leader(PartitionRegistration((1, 2), isr, partition.broker_id, epoch, epoch))


def follow(partition: Partition, leader: int, epoch: int = 0) -> None:
    partition.make_follower(PartitionRegistration((1, 2), (1, 2), leader, epoch, epoch))


def committed_values(partition: Partition, offset: int = 0) -> tuple[list[bytes | None], int]:
    """The data records (not markers) of a read_committed read, and how many aborts came."""
    read = partition.read_for_consumer(offset, 1 << 20, -1, True, READ_COMMITTED)
    values = [
        record.value
        for position, header in iter_batches(read.records)
        if not header.is_control
        for record in decode_batch(read.records, position)[1]
    ]
    return values, len(read.aborted)


def refused(error: ErrorCode) -> pytest.RaisesExc[KafkaError]:
    return pytest.raises(KafkaError, check=lambda e: e.error is error)


def test_read_committed_stops_at_the_lso_and_returns_the_aborts(tmp_path: Path) -> None:
    clock = Clock()
    a, b = replica(tmp_path, 1, clock), replica(tmp_path, 2, clock)
    lead(a)
    follow(b, 1)
    a.append_as_leader(encode_batch([(None, b"plain", 1_000_000, ())]), -1, 1)  # 0
    a.append_as_leader(txn_batch(7, 0, b"t7-a", b"t7-b"), -1, 1)  # 1-2
    a.append_as_leader(txn_batch(8, 0, b"t8-a"), -1, 1)  # 3
    fetch_round(b, a)
    fetch_round(b, a)  # the follower reports its end: the high watermark is 4
    assert (a.high_watermark, a.last_stable_offset) == (4, 1)
    assert committed_values(a) == ([b"plain"], 0)
    uncommitted = a.read_for_consumer(0, 1 << 20, -1, True)
    assert len(list(iter_records(uncommitted.records))) == 4 and uncommitted.aborted == ()
    info, _ = a.append_marker(7, 0, commit=False, coordinator_epoch=3)  # 4
    assert info.first_offset == 4
    assert a.last_stable_offset == 1, "decided, but the follower does not have the marker yet"
    fetch_round(b, a)
    fetch_round(b, a)
    assert a.high_watermark == 5 and a.last_stable_offset == 3, "producer 8 is still open"
    assert a.log.aborted_transactions(0, 5) == [AbortedTxn(7, 1, 4, 3)]
    a.append_marker(8, 0, commit=True, coordinator_epoch=3)  # 5
    fetch_round(b, a)
    fetch_round(b, a)
    assert a.last_stable_offset == a.high_watermark == 6
    read = a.read_for_consumer(0, 1 << 20, -1, True, READ_COMMITTED)
    assert read.last_stable_offset == 6 and read.aborted == (AbortedTxn(7, 1, 4, 3),)
    # a read past the aborted range gets no aborts
    assert a.read_for_consumer(5, 1 << 20, -1, True, READ_COMMITTED).aborted == ()
    # the follower applied both markers: the same producer state, LSO and index
    assert b.log.aborted_transactions(0, 6) == a.log.aborted_transactions(0, 6)
    assert b.last_stable_offset == 6
    for partition in (a, b):
        partition.log.close()


def test_a_new_leader_has_the_open_transaction_and_the_aborted_index(tmp_path: Path) -> None:
    clock = Clock()
    a, b = replica(tmp_path, 1, clock), replica(tmp_path, 2, clock)
    lead(a)
    follow(b, 1)
    a.append_as_leader(txn_batch(7, 0, b"aborted"), -1, 1)  # 0
    a.append_marker(7, 0, commit=False, coordinator_epoch=1)  # 1
    a.append_as_leader(txn_batch(8, 0, b"open"), -1, 1)  # 2
    fetch_round(b, a)
    fetch_round(b, a)
    assert a.last_stable_offset == 2
    # a dies; b leads with what it replicated
    lead(b, epoch=1, isr=(2,))
    assert b.last_stable_offset == 2
    assert b.log.aborted_transactions(0, 3) == [AbortedTxn(7, 0, 1, 2)]
    assert committed_values(b) == ([b"aborted"], 1)  # the consumer drops it by the abort
    assert b.active_producers()[1][1].current_txn_first_offset == 2
    b.append_marker(8, 0, commit=True, coordinator_epoch=2)
    assert b.last_stable_offset == 4
    assert committed_values(b, 2) == ([b"open"], 0)
    for partition in (a, b):
        partition.log.close()


def test_the_state_survives_a_reopen_by_snapshot_and_by_rescan(tmp_path: Path) -> None:
    clock = Clock()
    a = replica(tmp_path, 1, clock)
    lead(a, isr=(1,))
    a.append_as_leader(txn_batch(7, 0, b"x"), -1, 1)  # 0
    a.append_marker(7, 0, commit=False, coordinator_epoch=1)  # 1
    a.append_as_leader(txn_batch(8, 0, b"y"), -1, 1)  # 2, open
    high_watermark = a.high_watermark  # the broker's replication-offset-checkpoint keeps it
    a.stop()  # a clean stop snapshots at the log end (version 2, with the open transaction)
    a.log.close()
    directory = tmp_path / "broker-1" / "t-0"
    reopened = replica(tmp_path, 1, clock, high_watermark)
    assert reopened.snapshots.offsets() == [3]
    assert reopened.producers.open_transactions() == [(2, 8)]
    assert reopened.last_stable_offset == 2
    reopened.log.close()
    # without snapshots or the .txnindex the rescan finds both again, markers read from the log
    for path in [*directory.glob("*.snapshot"), *directory.glob(f"*{TXN_INDEX_SUFFIX}")]:
        path.unlink()
    rescanned = replica(tmp_path, 1, clock, high_watermark)
    assert rescanned.producers.open_transactions() == [(2, 8)]
    assert rescanned.last_stable_offset == 2
    assert rescanned.log.aborted_transactions(0, 3) == [AbortedTxn(7, 0, 1, 2)]
    rescanned.log.close()


def test_a_truncation_reopens_a_transaction_whose_marker_it_cut(tmp_path: Path) -> None:
    clock = Clock()
    a, b = replica(tmp_path, 1, clock), replica(tmp_path, 2, clock)
    lead(a)
    follow(b, 1)
    a.append_as_leader(txn_batch(7, 0, b"x"), -1, 1)  # 0
    a.append_marker(7, 0, commit=False, coordinator_epoch=1)  # 1
    fetch_round(b, a)
    assert b.log.aborted_transactions(0, 2) == [AbortedTxn(7, 0, 1, 2)]
    follow(b, 1, epoch=1)
    b.truncate_to(1, leader_epoch=1)  # the marker goes: the transaction is open again
    assert b.log.aborted_transactions(0, 2) == []
    assert b.producers.open_transactions() == [(0, 7)]
    for partition in (a, b):
        partition.log.close()


def test_what_a_leader_refuses(tmp_path: Path) -> None:
    clock = Clock()
    a, b = replica(tmp_path, 1, clock), replica(tmp_path, 2, clock)
    lead(a, isr=(1,))
    follow(b, 1)
    a.append_as_leader(txn_batch(7, 0, b"x", epoch=2), -1, 1)
    with refused(ErrorCode.INVALID_PRODUCER_EPOCH):
        a.append_marker(7, 1, commit=True, coordinator_epoch=0)
    with refused(ErrorCode.NOT_LEADER_OR_FOLLOWER):
        b.append_marker(7, 2, commit=True, coordinator_epoch=0)
    with refused(ErrorCode.NOT_ENOUGH_REPLICAS):
        a.append_marker(7, 2, commit=True, coordinator_epoch=0, min_insync_replicas=2)
    forged = encode_marker(9, 0, commit=True, coordinator_epoch=0, timestamp_ms=1)
    with refused(ErrorCode.INVALID_RECORD):
        a.append_as_leader(forged, -1, 1)
    plain_then_forged = encode_batch([(None, b"p", 1, ())]) + forged
    with refused(ErrorCode.INVALID_RECORD):
        a.append_as_leader(plain_then_forged, -1, 1)
    no_producer = encode_batch([(None, b"p", 1, ())], is_transactional=True)
    with refused(ErrorCode.INVALID_RECORD):
        a.append_as_leader(no_producer, -1, 1)
    # KIP-890: a verification the abort voided refuses the late batch; nothing is stored
    guard = a.start_verification(5, 0)
    a.append_marker(5, 0, commit=False, coordinator_epoch=0)
    end = a.log.log_end_offset
    with refused(ErrorCode.INVALID_TXN_STATE):
        a.append_as_leader(txn_batch(5, 0, b"late"), -1, 1, verification=guard)
    assert a.log.log_end_offset == end
    assert a.start_verification(7, 2) is SENTINEL  # open here: nothing to ask
    a.append_as_leader(txn_batch(7, 1, b"y", epoch=2), -1, 1, verification=SENTINEL)
    for partition in (a, b):
        partition.log.close()


def test_a_recovery_that_cuts_a_marker_drops_its_abort_and_reopens_it(tmp_path: Path) -> None:
    clock = Clock()
    a = replica(tmp_path, 1, clock)
    lead(a, isr=(1,))
    a.append_as_leader(txn_batch(7, 0, b"x"), -1, 1)  # 0
    a.append_marker(7, 0, commit=False, coordinator_epoch=1)  # 1
    assert a.log.aborted_transactions(0, 2) == [AbortedTxn(7, 0, 1, 2)]
    a.log.close()
    directory = tmp_path / "broker-1" / "t-0"
    (directory / CLEAN_SHUTDOWN_MARKER).unlink()  # a crash
    (segment,) = directory.glob("*.log")
    os.truncate(segment, segment.stat().st_size - 5)  # the marker is torn
    reopened = replica(tmp_path, 1, clock)
    assert reopened.log.log_end_offset == 1
    assert reopened.log.aborted_transactions(0, 2) == []
    assert reopened.producers.open_transactions() == [(0, 7)]
    reopened.log.close()
