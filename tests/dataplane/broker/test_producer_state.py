"""Idempotent producer state: the rules table-driven, then on real replicas (a retry gets its
original offsets, the state moves to a new leader with the log and survives a reopen); its
snapshots (codec, taken at rolls and clean stops, loaded on open past corrupt ones, dropped by
truncation and retention) and producer id expiry."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import pytest

from dataplane.broker.partition import Partition
from dataplane.broker.producer_state import (
    SNAPSHOT_SUFFIX,
    BatchRange,
    CorruptSnapshotError,
    OutOfOrderSequenceError,
    ProducerStates,
    SnapshotFiles,
    decode_snapshot,
    encode_snapshot,
)
from metadata_quorum.image import PartitionRegistration
from raftlog.batch import SEQUENCE_MAX, next_sequence, read_header
from raftlog.config import LogConfig
from raftlog.errors import ErrorCode, KafkaError
from raftlog.log import Log
from raftlog.records import encode_batch
from tests.dataplane.broker.test_replication_core import Clock, fetch_round
from tests.metadata_quorum.quorum_support import wait_for

TOPIC_ID = uuid.UUID(int=11)


def batch(producer_id: int, epoch: int, sequence: int, count: int = 2) -> bytes:
    return encode_batch(
        [(None, b"v%d" % (sequence + n), 1_000_000, ()) for n in range(count)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
    )


def stored(states: ProducerStates, data: bytes, base_offset: int) -> None:
    states.update(read_header(data)._replace(base_offset=base_offset))


@pytest.mark.parametrize(
    ("epoch", "sequence", "outcome"),
    [
        (0, 4, None),  # the next batch
        (0, 2, "duplicate"),  # a retry of the last batch
        (0, 0, "duplicate"),  # a retry of an older one still cached
        (0, 6, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),  # a gap
        (0, 3, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),  # overlapping, not a retry
        (1, 0, None),  # a new epoch starts at 0
        (1, 4, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    ],
)
def test_check_rules(epoch: int, sequence: int, outcome: object) -> None:
    states = ProducerStates()
    stored(states, batch(7, 0, 0), 10)
    stored(states, batch(7, 0, 2), 12)
    header = read_header(batch(7, epoch, sequence))
    if isinstance(outcome, ErrorCode):
        with pytest.raises(OutOfOrderSequenceError) as raised:
            states.check(header)
        assert raised.value.error is outcome
        # ahead of the next sequence, the batches in between may still come; behind, never
        assert raised.value.ahead is (sequence != 3)
    elif outcome == "duplicate":
        found = states.check(header)
        assert found is not None and found.first_offset == 10 + sequence
    else:
        assert states.check(header) is None


def test_an_unknown_producer_starts_at_sequence_zero() -> None:
    states = ProducerStates()
    with pytest.raises(KafkaError) as raised:
        states.check(read_header(batch(9, 0, 2)))  # overtook its first batch
    assert raised.value.error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert states.check(read_header(batch(9, 0, 0))) is None


def test_an_older_epoch_is_fenced_and_sequences_wrap() -> None:
    states = ProducerStates()
    stored(states, batch(7, 3, 0), 0)
    with pytest.raises(KafkaError) as raised:
        states.check(read_header(batch(7, 2, 2)))
    assert raised.value.error is ErrorCode.INVALID_PRODUCER_EPOCH
    assert next_sequence(SEQUENCE_MAX) == 0
    assert next_sequence(SEQUENCE_MAX - 1, 3) == 1


def test_only_five_batches_are_remembered() -> None:
    states = ProducerStates()
    for n in range(6):
        stored(states, batch(7, 0, 2 * n), 2 * n)
    with pytest.raises(KafkaError):
        states.check(read_header(batch(7, 0, 0)))  # evicted: now it looks like a gap
    assert states.check(read_header(batch(7, 0, 2))) is not None


def replica(root: Path, broker_id: int, clock: Clock) -> Partition:
    log = Log(root / f"broker-{broker_id}" / "t-0", topic_id=TOPIC_ID, clock=clock)
    return Partition("t", 0, TOPIC_ID, log, broker_id, clock)


def test_a_retry_on_the_new_leader_gets_its_original_offsets(tmp_path: Path) -> None:
    clock = Clock()
    a, b = replica(tmp_path, 1, clock), replica(tmp_path, 2, clock)
    a.make_leader(PartitionRegistration((1, 2), (1, 2), 1, 0, 0))
    b.make_follower(PartitionRegistration((1, 2), (1, 2), 1, 0, 0))
    first, _ = a.append_as_leader(batch(42, 0, 0), acks=-1, min_insync_replicas=1)
    second, _ = a.append_as_leader(batch(42, 0, 2), acks=-1, min_insync_replicas=1)
    fetch_round(b, a)
    # a dies before answering the second batch; b leads; the producer retries it there.
    b.make_leader(PartitionRegistration((1, 2), (2,), 2, 1, 1))
    retried, _ = b.append_as_leader(batch(42, 0, 2), acks=-1, min_insync_replicas=1)
    assert retried.first_offset == second.first_offset == 2
    assert b.log.log_end_offset == 4, "the retry was not appended again"
    b.log.close()
    reopened = replica(tmp_path, 2, clock)
    reopened.make_leader(PartitionRegistration((1, 2), (2,), 2, 2, 2))
    again, _ = reopened.append_as_leader(batch(42, 0, 0), acks=-1, min_insync_replicas=1)
    assert again.first_offset == first.first_offset == 0, "the state is rebuilt from the log"
    with pytest.raises(KafkaError) as raised:
        reopened.append_as_leader(batch(42, 0, 9), acks=-1, min_insync_replicas=1)
    assert raised.value.error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


# -- pipelined batches that arrive reordered -----------------------------------------------------
class Overtaker(threading.Thread):
    """Appends one batch on its own thread, as a gRPC worker serving a concurrent request."""

    def __init__(self, partition: Partition, data: bytes, wait_s: float) -> None:
        super().__init__(daemon=True)
        self.partition, self.data, self.wait_s = partition, data, wait_s
        self.first_offset: int | None = None
        self.error: KafkaError | None = None

    def run(self) -> None:
        try:
            info, _ = self.partition.append_as_leader(self.data, -1, 1, self.wait_s)
            self.first_offset = info.first_offset
        except KafkaError as error:
            self.error = error


def waiting(partition: Partition, count: int) -> bool:
    return partition._sequence_waiters == count


def test_a_batch_that_overtook_its_predecessor_waits_for_it(tmp_path: Path) -> None:
    clock = Clock()
    partition = leader(tmp_path, clock)
    partition.append_as_leader(sized(5, 0, clock()), -1, 1)
    third = Overtaker(partition, sized(5, 4, clock()), wait_s=60)
    second = Overtaker(partition, sized(5, 2, clock()), wait_s=60)
    third.start()
    wait_for(lambda: waiting(partition, 1), 10, "the third batch to wait")
    second.start()
    second.join(10)
    third.join(10)
    assert (second.error, third.error) == (None, None)
    assert (second.first_offset, third.first_offset) == (2, 4), "stored in sequence order"
    assert partition.log.log_end_offset == 6
    partition.log.close()


def test_a_gap_that_is_not_filled_in_time_is_refused(tmp_path: Path) -> None:
    clock = Clock()
    partition = leader(tmp_path, clock)
    partition.append_as_leader(sized(5, 0, clock()), -1, 1)
    with pytest.raises(KafkaError) as raised:  # nothing comes in between
        partition.append_as_leader(sized(5, 4, clock()), -1, 1, sequence_wait_s=0.05)
    assert raised.value.error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    with pytest.raises(KafkaError) as raised:  # behind: refused at once, whatever the wait
        partition.append_as_leader(sized(5, 1, clock()), -1, 1, sequence_wait_s=3600)
    assert raised.value.error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert partition.log.log_end_offset == 2
    partition.log.close()


def test_a_waiting_batch_is_answered_when_leadership_moves(tmp_path: Path) -> None:
    clock = Clock()
    partition = leader(tmp_path, clock)
    early = Overtaker(partition, sized(5, 2, clock()), wait_s=3600)  # its first batch is late
    early.start()
    wait_for(lambda: waiting(partition, 1), 10, "the batch to wait")
    partition.make_follower(PartitionRegistration((1, 2), (1, 2), 2, 1, 1))
    early.join(10)
    assert not early.is_alive()
    assert early.error is not None and early.error.error is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert partition.log.log_end_offset == 0
    partition.log.close()


def test_leadership_is_checked_before_the_batch_as_in_kafka(tmp_path: Path) -> None:
    clock = Clock()
    corrupt = bytearray(sized(5, 0, clock()))
    corrupt[-1] ^= 0xFF  # a flipped bit in the last record: the CRC no longer holds
    follower = replica(tmp_path / "f", 2, clock)
    follower.make_follower(PartitionRegistration((1, 2), (1, 2), 1, 0, 0))
    with pytest.raises(KafkaError) as raised:
        follower.append_as_leader(bytes(corrupt), -1, 1, sequence_wait_s=60)
    assert raised.value.error is ErrorCode.NOT_LEADER_OR_FOLLOWER
    partition = leader(tmp_path / "l", clock)
    with pytest.raises(KafkaError) as raised:
        partition.append_as_leader(bytes(corrupt), -1, 1, sequence_wait_s=60)
    assert raised.value.error is ErrorCode.CORRUPT_MESSAGE
    follower.log.close()
    partition.log.close()


# -- snapshots and expiry ------------------------------------------------------------------------
Dump = dict[int, tuple[int, tuple[BatchRange, ...]]]


def dump(states: ProducerStates) -> Dump:
    return {pid: (entry.producer_epoch, tuple(entry.batches)) for pid, entry in states.items()}


def rebuilt(log: Log, below: int | None = None) -> Dump:
    """The state a full rescan of the log gives (of the batches below ``below``)."""
    states = ProducerStates()
    states.update_all(h for h in log.batch_headers() if below is None or h.base_offset < below)
    return dump(states)


def sized(producer_id: int, sequence: int, timestamp_ms: int, count: int = 2) -> bytes:
    """An idempotent batch of ``count`` 100-byte records stamped ``timestamp_ms``."""
    return encode_batch(
        [(None, b"%06d" % (sequence + n) * 17, timestamp_ms, ()) for n in range(count)],
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=sequence,
    )


def leader(root: Path, clock: Clock, broker_id: int = 1, **config: str) -> Partition:
    """A replica with 2 KiB segments (``config`` in Kafka's names, underscores for dots), leading
    alone at epoch 0."""
    settings = {"segment.bytes": "2048", **{k.replace("_", "."): v for k, v in config.items()}}
    log = Log(root / "t-0", LogConfig.parse(settings), topic_id=TOPIC_ID, clock=clock)
    partition = Partition("t", 0, TOPIC_ID, log, broker_id, clock)
    partition.make_leader(PartitionRegistration((broker_id,), (broker_id,), broker_id, 0, 0))
    return partition


def produce(partition: Partition, batches: int, clock: Clock, producers: int = 3) -> None:
    """``batches`` batches from ``producers`` producer ids in turn, each in sequence."""
    for n in range(batches):
        producer_id = 100 + n % producers
        entry = partition.producers.entry(producer_id)
        sequence = next_sequence(entry.batches[-1].last_sequence) if entry else 0
        partition.append_as_leader(sized(producer_id, sequence, clock()), -1, 1)


def test_a_snapshot_round_trips_and_any_damage_is_detected() -> None:
    states = ProducerStates()
    for n in range(7):  # producer 7 keeps its last five batches only
        stored(states, batch(7, 0, 2 * n), 2 * n)
    stored(states, batch(8, 3, 0), 14)
    data = encode_snapshot(16, states)
    assert dump(decode_snapshot(data, 16)) == dump(states)
    assert len(decode_snapshot(data, 16).entry(7).batches) == 5  # type: ignore[union-attr]
    assert dump(decode_snapshot(encode_snapshot(0, ProducerStates()), 0)) == {}
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    for damaged in (data[:-1], data + b"\0", bytes(flipped), data[:5], b""):
        with pytest.raises(CorruptSnapshotError):
            decode_snapshot(damaged, 16)
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(data, 17)  # renamed: its own offset says 16
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(encode_snapshot(10, states), 10)  # holds batches at or above 10


def test_producers_silent_for_the_expiration_are_forgotten() -> None:
    states = ProducerStates()
    states.update(read_header(sized(1, 0, 1_000))._replace(base_offset=0))
    states.update(read_header(sized(2, 0, 5_000))._replace(base_offset=2))
    assert states.remove_expired(now_ms=5_999, expiration_ms=5_000) == 0
    assert states.remove_expired(now_ms=6_000, expiration_ms=5_000) == 1
    assert states.entry(1) is None and states.entry(2) is not None


def test_snapshots_are_taken_at_rolls_as_of_the_new_segment_base(tmp_path: Path) -> None:
    clock = Clock()
    partition = leader(tmp_path, clock)
    produce(partition, 40, clock)
    bases = [s.base_offset for s in partition.log.segments()]
    assert len(bases) > 4
    assert partition.snapshots.offsets() == bases[1:]
    for base in bases[1:]:
        data = partition.snapshots.path(base).read_bytes()
        assert dump(decode_snapshot(data, base)) == rebuilt(partition.log, below=base)
    partition.stop()
    end = partition.log.log_end_offset
    assert partition.snapshots.offsets()[-1] == end, "a clean stop snapshots the log end"
    partition.log.close()
    reopened = leader(tmp_path, clock)
    assert dump(reopened.producers) == rebuilt(reopened.log)


def test_a_roll_snapshot_is_fsynced_off_the_append_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The appends that roll write their snapshots without an fsync (it took 100-400 ms under
    writeback, with the partition's lock held); ``sync_snapshots`` (the maintenance thread)
    fsyncs them and the directory, skipping one retention deleted meanwhile."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    clock = Clock()
    partition = leader(tmp_path, clock)
    produce(partition, 40, clock)
    rolls = partition.snapshots.offsets()
    assert len(rolls) > 3
    assert not [name for name in synced if name.endswith(SNAPSHOT_SUFFIX)], "none on the appends"
    synced.clear()
    partition.snapshots.path(rolls[0]).unlink()  # as retention would
    partition.sync_snapshots()
    assert sorted(synced) == sorted(
        [str(partition.snapshots.path(offset)) for offset in rolls[1:]] + [str(tmp_path / "t-0")]
    )
    synced.clear()
    partition.sync_snapshots()
    assert synced == [], "each once"
    partition.stop()
    partition.log.close()


def test_a_reopen_loads_the_newest_snapshot_and_falls_back_past_corrupt_ones(
    tmp_path: Path,
) -> None:
    clock = Clock()
    partition = leader(tmp_path, clock)
    produce(partition, 40, clock)
    partition.log.abandon()  # a crash: only the roll snapshots exist
    offsets = SnapshotFiles(tmp_path / "t-0").offsets()
    newest = offsets[-1]
    # Plant a producer the log never saw in the newest snapshot: seeing it proves the reopen
    # read that snapshot and took only the batches after it from the log.
    files = SnapshotFiles(tmp_path / "t-0")
    planted = decode_snapshot(files.path(newest).read_bytes(), newest)
    stored(planted, batch(999, 0, 0), 0)
    files.write(newest, planted)
    reopened = leader(tmp_path, clock)
    assert reopened.producers.entry(999) is not None
    assert {p: s for p, s in dump(reopened.producers).items() if p != 999} == rebuilt(reopened.log)
    reopened.log.abandon()
    files.path(newest).write_bytes(files.path(newest).read_bytes()[:-3])  # torn
    second = leader(tmp_path, clock)
    assert second.producers.entry(999) is None
    assert dump(second.producers) == rebuilt(second.log), "the next older snapshot, rescanned"
    assert newest not in files.offsets(), "a corrupt snapshot is deleted"
    second.log.abandon()
    for offset in files.offsets():
        files.path(offset).write_bytes(b"\0" * 40)
    third = leader(tmp_path, clock)
    assert dump(third.producers) == rebuilt(third.log), "no valid snapshot: the whole log"
    assert files.offsets() == []
    third.log.close()


def test_a_truncation_drops_the_snapshots_above_it_and_rebuilds_the_state(tmp_path: Path) -> None:
    clock = Clock()
    a = leader(tmp_path / "a", clock)
    b = leader(tmp_path / "b", clock, broker_id=2)
    b.make_follower(PartitionRegistration((1, 2), (1, 2), 1, 1, 1))
    a.make_leader(PartitionRegistration((1, 2), (1, 2), 1, 1, 1))
    for _ in range(30):  # the follower fetches batch by batch, so it rolls as the leader does
        produce(a, 1, clock, producers=1)
        produce(a, 1, clock, producers=1)  # one producer: truncation cuts into its batches
        fetch_round(b, a)
    bases = [s.base_offset for s in b.log.segments()]
    assert b.snapshots.offsets() == bases[1:] and len(bases) > 4
    cut = bases[-3] + 3
    end = b.truncate_to(cut, leader_epoch=1)
    assert end <= cut
    assert all(offset <= end for offset in b.snapshots.offsets())
    assert bases[-3] in b.snapshots.offsets()
    assert dump(b.producers) == rebuilt(b.log)
    fetch_round(b, a)  # and the follower catches up again, counting every batch once
    assert dump(b.producers) == rebuilt(b.log) == dump(a.producers)


def test_retention_deletes_the_snapshots_of_deleted_segments_but_the_newest(
    tmp_path: Path,
) -> None:
    clock = Clock()
    partition = leader(tmp_path, clock, retention_ms="10000")
    for _ in range(40):
        produce(partition, 1, clock)
        clock.now_ms += 1000
    before = partition.snapshots.offsets()
    assert partition.log.delete_old_segments(partition.high_watermark) > 0
    start = partition.log.log_start_offset
    assert partition.snapshots.offsets() == [o for o in before if o >= start]
    clock.now_ms += 10**7
    partition.log.delete_old_segments(partition.high_watermark)  # everything: rolled, deleted
    assert partition.log.log_start_offset == partition.log.log_end_offset
    assert partition.snapshots.offsets() == before[-1:], "the newest stays"
    partition.log.close()


def test_producer_ids_expire_after_producer_id_expiration_ms(tmp_path: Path) -> None:
    clock = Clock()
    partition = leader(tmp_path, clock, producer_id_expiration_ms="60000")
    partition.append_as_leader(sized(1, 0, clock()), -1, 1)
    partition.append_as_leader(sized(2, 0, clock()), -1, 1)
    clock.now_ms += 30_000
    partition.append_as_leader(sized(2, 2, clock()), -1, 1)
    clock.now_ms += 40_000  # producer 1 silent for 70 s, producer 2 for 40 s
    partition.append_as_leader(sized(3, 0, clock()), -1, 1)
    assert partition.producers.entry(1) is None
    assert partition.producers.entry(2) is not None
    with pytest.raises(KafkaError) as raised:  # forgotten: it must start again at sequence 0
        partition.append_as_leader(sized(1, 2, clock()), -1, 1)
    assert raised.value.error is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    partition.stop()
    partition.log.close()
    clock.now_ms += 50_000  # producer 2 silent for 90 s, producer 3 for 50 s
    reopened = leader(tmp_path, clock, producer_id_expiration_ms="60000")
    assert sorted(pid for pid, _ in reopened.producers.items()) == [3]
    reopened.log.close()


# -- snapshots of a compacted partition ----------------------------------------------------------
def keyed(producer_id: int, sequence: int, timestamp_ms: int, keys: list[bytes]) -> bytes:
    """An idempotent batch of one 100-byte record per key."""
    return encode_batch(
        [(key, b"%06d" % sequence * 17, timestamp_ms, ()) for key in keys],
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=sequence,
    )


def churn(partition: Partition, batches: int, clock: Clock, keys: int = 12) -> None:
    """Steady key churn: 4 producers in turn, each batch overwriting 2 of ``keys`` keys."""
    for _ in range(batches):
        producer_id = 200 + partition.log.log_end_offset % 4
        entry = partition.producers.entry(producer_id)
        sequence = next_sequence(entry.batches[-1].last_sequence) if entry else 0
        first = partition.log.log_end_offset % keys
        names = [b"key-%d" % (first % keys), b"key-%d" % ((first + 1) % keys)]
        partition.append_as_leader(keyed(producer_id, sequence, clock(), names), -1, 1)
        clock.now_ms += 10


def last_batches(states: ProducerStates) -> dict[int, tuple[int, BatchRange]]:
    """What compaction keeps of each producer: its epoch and its last batch."""
    return {pid: (entry.producer_epoch, entry.batches[-1]) for pid, entry in states.items()}


def test_cleaning_deletes_the_snapshots_of_the_segments_it_replaces(tmp_path: Path) -> None:
    """Kafka's ``deleteProducerSnapshots`` in ``replaceSegments``: under steady key churn the
    snapshots follow the segments (one per segment base at most, and the newest), pass after
    pass, instead of one per roll for ever."""
    clock = Clock()
    partition = leader(tmp_path, clock, cleanup_policy="compact")
    counts: list[tuple[int, int]] = []
    for _ in range(12):
        churn(partition, 40, clock)
        assert partition.log.compact(force=True, max_offset=partition.high_watermark)
        bases = [s.base_offset for s in partition.log.segments()]
        snapshots = partition.snapshots.offsets()
        assert set(snapshots[:-1]) <= set(bases), "only the kept segments' snapshots"
        counts.append((len(bases), len(snapshots)))
    # each pass merges what the one before cleaned: bounded by the live data and one pass's
    # dirty segments (without the deletion, one snapshot per roll: 40 after 12 passes)
    assert max(counts) <= max(counts[:3]), f"segments and snapshots grew: {counts}"
    assert all(snapshots <= segments for segments, snapshots in counts)
    assert partition.log.log_end_offset > 20 * len(partition.log.segments())
    partition.stop()
    partition.log.close()


def test_a_crash_after_cleaning_recovers_the_same_producer_state(tmp_path: Path) -> None:
    """The snapshots of replaced segments are deleted without an fsync: one a crash brings
    back is still true of the cleaned log (its rescan gives the state the partition had), and
    the next open deletes it as a stray; the reopened state is the one before the crash."""
    clock = Clock()
    partition = leader(tmp_path, clock, cleanup_policy="compact")
    churn(partition, 120, clock)
    assert partition.log.compact(force=True, max_offset=partition.high_watermark)
    churn(partition, 40, clock)  # the second pass merges what the first cleaned
    files = partition.snapshots
    kept = {offset: files.path(offset).read_bytes() for offset in files.offsets()}
    result = partition.log.compact(force=True, max_offset=partition.high_watermark)
    assert result is not None and result.segments_after < result.segments_before
    gone = sorted(set(kept) - set(files.offsets()))
    assert gone, "the cleaner deleted the replaced segments' snapshots"
    for offset in gone:  # each one, and the cleaned log after it, give today's producers
        states = decode_snapshot(kept[offset], offset)
        states.update_all(partition.log.batch_headers(offset))
        assert last_batches(states) == last_batches(partition.producers)
    before = dump(partition.producers)
    partition.log.abandon()  # a crash, which brings the deleted snapshots back
    for offset in gone:
        files.path(offset).write_bytes(kept[offset])
    reopened = leader(tmp_path, clock, cleanup_policy="compact")
    assert dump(reopened.producers) == before
    bases = {s.base_offset for s in reopened.log.segments()}
    assert set(reopened.snapshots.offsets()[:-1]) <= bases, "the strays went on open"
    assert not set(gone) & set(reopened.snapshots.offsets())
    reopened.log.close()
