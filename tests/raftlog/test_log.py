"""The partition log: append, read, roll, index, truncate, time lookup, epochs, retention, flush."""

from __future__ import annotations

import os
import struct
import threading
import uuid
from pathlib import Path

import pytest

import raftlog.epoch as epoch_module
import raftlog.log as log_module
from raftlog import checkpoint
from raftlog.batch import HEADER_SIZE, compute_crc, read_header, verify_batch
from raftlog.config import LogConfig
from raftlog.errors import CorruptRecordError, ErrorCode, KafkaError
from raftlog.log import CLEAN_SHUTDOWN_MARKER, EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, Log
from raftlog.records import decode_batch, iter_records
from raftlog.segment import (
    BATCH_ENDS_KEPT,
    DELETED_SUFFIX,
    LogSegment,
    ReadPlan,
    read_planned,
)
from tests.raftlog.batches import BASE_TIMESTAMP_MS, ManualClock, make_batch, values_of

WAIT_S = 10.0


def open_log(path: Path, clock: ManualClock | None = None, /, **config: object) -> Log:
    return Log(path / "events-0", LogConfig.parse(config), clock=clock or ManualClock())


def test_append_rewrites_only_base_offset_and_epoch(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    first, second = make_batch(values_of(3)), make_batch(values_of(2))
    assert log.append(first, leader_epoch=5).first_offset == 0
    info = log.append(second, leader_epoch=5)
    assert (info.first_offset, info.last_offset, info.record_count) == (3, 4, 2)
    stored = log.read(0, 1 << 20)
    assert len(stored) == len(first) + len(second)
    stored_second = stored[len(first) :]
    assert stored_second[16:] == second[16:], "everything after the first 16 bytes is unchanged"
    header = verify_batch(stored_second)  # the CRC still holds
    assert (header.base_offset, header.partition_leader_epoch) == (3, 5)
    assert [r.offset for r in iter_records(stored)] == [0, 1, 2, 3, 4]
    log.close()


def test_one_append_may_carry_several_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    info = log.append(make_batch(values_of(2)) + make_batch(values_of(3)), leader_epoch=0)
    assert (info.first_offset, info.last_offset, info.record_count) == (0, 4, 5)
    assert [r.offset for r in iter_records(log.read(0, 1 << 20))] == list(range(5))
    log.close()


def test_read_returns_whole_batches_within_bounds(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    batches = [make_batch(values_of(10, size=100)) for _ in range(5)]
    for batch in batches:
        log.append(batch, leader_epoch=0)
    size = len(batches[0])
    assert read_header(log.read(25, 1 << 20)).base_offset == 20, "from the batch holding 25"
    assert len(log.read(0, size * 2 + 10)) == size * 2, "only whole batches fit"
    assert len(log.read(0, 10)) == size, "at least one batch even if larger than max_bytes"
    assert log.read(0, 10, min_one_batch=False) == b""
    assert len(log.read(0, 1 << 20, max_offset=30)) == size * 3, "nothing at or past max_offset"
    assert log.read(50, 1 << 20) == b"", "the log end offset reads empty"
    for bad in (-1, 51):
        with pytest.raises(KafkaError) as caught:
            log.read(bad, 100)
        assert caught.value.error is ErrorCode.OFFSET_OUT_OF_RANGE
    log.close()


def test_segments_roll_on_size_and_reads_cross_them(tmp_path: Path) -> None:
    log = open_log(tmp_path, **{"segment.bytes": 4096, "index.interval.bytes": 1500})
    for _ in range(20):
        log.append(make_batch(values_of(5, size=200)), leader_epoch=0)
    assert log.segment_count > 5
    names = sorted(p.name for p in log.directory.glob("*.log"))
    assert names[0] == "00000000000000000000.log" and len(names[1]) == 24
    assert all(s.size_bytes <= 4096 for s in log.segment_summaries())
    everything = log.read(0, 1 << 20)
    assert [r.offset for r in iter_records(everything)] == list(range(100))
    assert next(iter_records(log.read(37, 1 << 20))).offset == 35
    log.close()


def test_segment_rolls_on_segment_ms_by_record_time(tmp_path: Path) -> None:
    log = open_log(tmp_path, **{"segment.ms": 1000})
    log.append(make_batch([b"a"], timestamp_ms=BASE_TIMESTAMP_MS), leader_epoch=0)
    log.append(make_batch([b"b"], timestamp_ms=BASE_TIMESTAMP_MS + 500), leader_epoch=0)
    assert log.segment_count == 1
    log.append(make_batch([b"c"], timestamp_ms=BASE_TIMESTAMP_MS + 1001), leader_epoch=0)
    assert log.segment_count == 2 and log.active.base_offset == 2
    log.close()


def test_segment_rolls_when_its_index_is_full(tmp_path: Path) -> None:
    log = open_log(tmp_path, **{"segment.index.bytes": 24, "index.interval.bytes": 0})
    for _ in range(10):
        log.append(make_batch([b"x" * 50]), leader_epoch=0)
    assert log.segment_count >= 3
    assert [r.offset for r in iter_records(log.read(0, 1 << 20))] == list(range(10))
    log.close()


def test_sparse_index_gets_an_entry_per_interval(tmp_path: Path) -> None:
    log = open_log(tmp_path, **{"index.interval.bytes": 4096})
    batch = make_batch(values_of(10, size=100))  # ~1.2 KiB
    for _ in range(40):
        log.append(batch, leader_epoch=0)
    entries = log.active.offset_index.entries
    expected = log.size_bytes // (4096 + len(batch))
    assert expected - 2 <= entries <= expected + 2
    for offset in range(0, 400, 7):
        assert read_header(log.read(offset, 1)).base_offset == offset - offset % 10
    log.close()


def test_truncate_to_drops_whole_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path, **{"segment.bytes": 4096})
    for _ in range(20):
        log.append(make_batch(values_of(5, size=200)), leader_epoch=0)
    assert log.truncate_to(42) == 40, "the batch holding 42 goes, so the log ends at 40"
    assert [r.offset for r in iter_records(log.read(0, 1 << 20))] == list(range(40))
    assert log.append(make_batch([b"after"]), leader_epoch=1).first_offset == 40
    assert log.truncate_to(1000) == 41, "truncating past the end changes nothing"
    log.truncate_fully_and_start_at(500)
    assert (log.log_start_offset, log.log_end_offset) == (500, 500)
    assert log.append(make_batch([b"x"]), leader_epoch=2).first_offset == 500
    log.close()
    reopened = open_log(tmp_path)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (500, 501)
    reopened.close()


class _HeldRead:
    """Replaces ``raftlog.log.read_planned``: the first planned read waits until released, so a
    test can act while a read is between its plan (under the log's lock) and its bytes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self._real = read_planned
        monkeypatch.setattr(log_module, "read_planned", self)

    def __call__(self, plan: ReadPlan, max_offset: int) -> tuple[bytes, bool]:
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(WAIT_S), "the test never released the read"
        return self._real(plan, max_offset)

    def start(self, log: Log, offset: int) -> tuple[threading.Thread, list[bytes]]:
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(log.read(offset, 1 << 20)))
        reader.start()
        assert self.entered.wait(WAIT_S), "the read did not reach its planned read"
        return reader, got


def _open_fds(under: Path) -> int:
    """This process's descriptors of files under ``under``: only the test's own, so a descriptor
    another test's leftovers close meanwhile (a collected object, a thread) does not count."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # closed since the listing (listdir's own, say)
            continue
        count += target.startswith(f"{under}/")
    return count


def test_a_read_holds_no_lock_while_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes are read without the log's lock: an append goes on while a read waits (a read
    of a page under writeback blocked in the kernel for hundreds of ms, appends behind it)."""
    log = open_log(tmp_path)
    log.append(make_batch(values_of(5)), leader_epoch=0)
    held = _HeldRead(monkeypatch)
    reader, got = held.start(log, 0)
    appender = threading.Thread(target=lambda: log.append(make_batch(values_of(3)), leader_epoch=0))
    appender.start()
    appender.join(WAIT_S)
    assert not appender.is_alive(), "the append waited for the read"
    assert log.log_end_offset == 8
    held.release.set()
    reader.join(WAIT_S)
    assert [r.offset for r in iter_records(got[0])] == list(range(5)), "what was planned"
    log.close()


@pytest.mark.parametrize("change", ["retention", "close"])
def test_a_read_survives_its_segment_going_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A planned read has a descriptor of its own: retention deleting the segment or the log
    closing meanwhile neither fails the read nor points it at another file; and no descriptor
    is left open after it."""
    log = open_log(tmp_path, **{"segment.bytes": 2048, "retention.bytes": 1})
    for _ in range(6):
        log.append(make_batch(values_of(4, size=200)), leader_epoch=0)
    assert log.segment_count > 2
    held = _HeldRead(monkeypatch)
    reader, got = held.start(log, 0)
    if change == "retention":
        assert log.delete_old_segments() > 0
        assert log.log_start_offset > 0
    else:
        log.close()
    reopened = [os.open(tmp_path / f"other-{n}", os.O_RDWR | os.O_CREAT) for n in range(8)]
    try:  # descriptor numbers the segments freed, now other files
        held.release.set()
        reader.join(WAIT_S)
    finally:
        for fd in reopened:
            os.close(fd)
    assert [r.offset for r in iter_records(got[0])][:4] == [0, 1, 2, 3]
    if change == "retention":
        log.close()
    assert _open_fds(tmp_path) == 0, "the read's descriptors are closed, the segments' too"


def test_a_read_that_fails_planning_leaves_no_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure planning a later segment (a corrupt header, say) closes the descriptors the
    earlier plans took."""
    log = open_log(tmp_path, **{"segment.bytes": 2048})
    for _ in range(6):
        log.append(make_batch(values_of(4, size=200)), leader_epoch=0)
    planned = _open_fds(tmp_path)
    real = LogSegment.plan_read
    calls: list[int] = []

    def plan_read(segment: LogSegment, *args: object, **kwargs: object) -> ReadPlan | bool:
        calls.append(segment.base_offset)
        if len(calls) == 2:
            raise CorruptRecordError("a corrupt header in the second segment")
        return real(segment, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LogSegment, "plan_read", plan_read)
    with pytest.raises(CorruptRecordError):
        log.read(0, 1 << 20)
    assert _open_fds(tmp_path) == planned, "the first segment's duplicate is closed"
    log.close()
    assert _open_fds(tmp_path) == 0


def test_reads_that_continue_where_a_batch_ended_agree_with_the_index(tmp_path: Path) -> None:
    """The segment remembers where each batch it appended ends (a follower's or a tail
    consumer's next fetch starts there); what it reads from there is what the index finds in
    the same files reopened, also after a truncation rewrote the tail with other sizes."""
    log = open_log(tmp_path, **{"segment.bytes": 8192, "index.interval.bytes": 1024})
    for n in range(30):
        log.append(make_batch(values_of(1 + n % 4, size=150)), leader_epoch=0)
    log.truncate_to(55)
    for n in range(12):
        log.append(make_batch(values_of(1 + n % 3, size=90, tag="w")), leader_epoch=1)
    end = log.log_end_offset
    remembered = [log.read(offset, 700) for offset in range(end + 1)]
    segments = log._segments
    assert len(segments) > 1 and not any(s._batch_ends for s in segments[:-1]), "rolled: dropped"
    assert 0 < len(segments[-1]._batch_ends) <= BATCH_ENDS_KEPT
    log.close()
    reopened = open_log(tmp_path, **{"segment.bytes": 8192, "index.interval.bytes": 1024})
    assert [reopened.read(offset, 700) for offset in range(end + 1)] == remembered
    assert remembered[-1] == b"" and all(remembered[:-1])
    reopened.close()


def test_offsets_for_time(tmp_path: Path) -> None:
    log = open_log(tmp_path, **{"segment.bytes": 2048, "index.interval.bytes": 300})
    for n in range(30):
        log.append(make_batch(values_of(3), timestamp_ms=1000 * n), leader_epoch=0)
    # batch n holds offsets 3n..3n+2 with timestamps 1000n, 1000n+1, 1000n+2
    assert log.offsets_for_time(5001) == (16, 5001)
    assert log.offsets_for_time(5003) == (18, 6000)
    assert log.offsets_for_time(0) == (0, 0)
    assert log.offsets_for_time(10**9) is None
    assert log.offsets_for_time(EARLIEST_TIMESTAMP) == (0, -1)
    assert log.offsets_for_time(LATEST_TIMESTAMP) == (90, -1)
    log.close()


def test_leader_epochs_are_checkpointed_and_answer_divergence(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for epoch, count in [(1, 3), (1, 2), (3, 4), (4, 1)]:
        log.append(make_batch(values_of(count)), leader_epoch=epoch)
    assert log.end_offset_for_epoch(1) == (1, 5)
    assert log.end_offset_for_epoch(2) == (1, 5)
    assert log.end_offset_for_epoch(4) == (4, 10)
    log.truncate_to(9)
    assert log.epochs.latest_epoch == 3, "truncation drops epochs that started past the end"
    log.truncate_to(7)
    assert log.epochs.latest_epoch == 1, "the batch holding 7 started epoch 3: it went too"
    log.append(make_batch(values_of(4)), leader_epoch=3)
    log.close()
    assert (tmp_path / "events-0" / "leader-epoch-checkpoint").read_text() == "0\n2\n1 0\n3 5\n"


def test_follower_append_keeps_offsets_and_epochs(tmp_path: Path) -> None:
    leader, follower = open_log(tmp_path), Log(tmp_path / "replica" / "events-0", LogConfig())
    leader.append(make_batch(values_of(3)), leader_epoch=2)
    leader.append(make_batch(values_of(3)), leader_epoch=3)
    follower.append_as_follower(leader.read(0, 1 << 20))
    assert follower.read(0, 1 << 20) == leader.read(0, 1 << 20)
    assert follower.end_offset_for_epoch(2) == (2, 3)
    with pytest.raises(KafkaError, match="below the log end"):
        follower.append_as_follower(leader.read(3, 1 << 20))
    leader.close()
    follower.close()


def test_topic_id_mismatch_is_refused(tmp_path: Path) -> None:
    topic_id = uuid.uuid4()
    Log(tmp_path / "t-0", topic_id=topic_id).close()
    assert "topic_id" in (tmp_path / "t-0" / "partition.metadata").read_text()
    Log(tmp_path / "t-0", topic_id=topic_id).close()
    with pytest.raises(KafkaError) as caught:
        Log(tmp_path / "t-0", topic_id=uuid.uuid4())
    assert caught.value.error is ErrorCode.INCONSISTENT_TOPIC_ID


@pytest.mark.parametrize(
    ("mangle", "error"),
    [
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), ErrorCode.CORRUPT_MESSAGE),
        (lambda b: b[:16] + b"\x01" + b[17:], ErrorCode.CORRUPT_MESSAGE),  # magic 1
        (lambda b: b[:-5], ErrorCode.CORRUPT_MESSAGE),  # torn
        (lambda b: with_record_count(b, 7), ErrorCode.INVALID_RECORD),
    ],
)
def test_bad_appends_are_refused_and_store_nothing(tmp_path: Path, mangle, error) -> None:  # type: ignore[no-untyped-def]
    log = open_log(tmp_path)
    log.append(make_batch([b"kept"]), leader_epoch=0)
    good, bad = make_batch([b"x"]), mangle(make_batch(values_of(3)))
    with pytest.raises(KafkaError) as caught:
        log.append(good + bad, leader_epoch=0)
    assert caught.value.error is error
    assert log.log_end_offset == 1 and len(log.read(0, 1 << 20)) == len(make_batch([b"kept"]))
    log.close()


def with_record_count(batch: bytes, count: int) -> bytes:
    """The batch claiming ``count`` records, with a CRC that matches the lie."""
    out = bytearray(batch)
    struct.pack_into(">i", out, 57, count)
    struct.pack_into(">I", out, 17, compute_crc(out, 0, len(out) - 12))
    return bytes(out)


def test_an_append_without_a_batch_is_invalid(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    with pytest.raises(KafkaError) as caught:
        log.append(b"", leader_epoch=0)
    assert caught.value.error is ErrorCode.INVALID_RECORD
    log.close()


def test_limits_and_kafka_rules_on_append(tmp_path: Path) -> None:
    log = open_log(tmp_path, **{"max.message.bytes": 500})
    with pytest.raises(KafkaError) as caught:
        log.append(make_batch([b"x" * 600]), leader_epoch=0)
    assert caught.value.error is ErrorCode.MESSAGE_TOO_LARGE
    compacted = Log(tmp_path / "c-0", LogConfig.parse({"cleanup.policy": "compact"}))
    with pytest.raises(KafkaError, match="without a key") as caught:
        compacted.append(make_batch([b"v"], keys=[None]), leader_epoch=0)
    assert caught.value.error is ErrorCode.INVALID_RECORD
    compacted.append(make_batch([b"v"], keys=[b"k"]), leader_epoch=0)
    log.close()
    compacted.close()


def test_log_append_time_restamps_batches(tmp_path: Path) -> None:
    clock = ManualClock(42_000)
    log = open_log(tmp_path, clock, **{"message.timestamp.type": "LogAppendTime"})
    info = log.append(make_batch(values_of(3), timestamp_ms=5), leader_epoch=0)
    assert info.log_append_time_ms == 42_000
    header, records = decode_batch(log.read(0, 1 << 20))
    assert header.timestamp_type == 1 and header.max_timestamp == 42_000
    assert {r.timestamp for r in records} == {42_000}
    log.close()


def test_retention_deletes_old_segments_and_moves_the_log_start(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock, **{"segment.bytes": 2048, "retention.ms": 10_000})
    for n in range(20):
        log.append(
            make_batch(values_of(5, size=100), timestamp_ms=clock.now_ms + n * 1000), leader_epoch=0
        )
    segments = log.segment_count
    clock.advance(15_000)  # records stamped < now - 10 s expire: batches 0..4
    deleted = log.delete_old_segments()
    assert 0 < deleted < segments
    assert log.log_start_offset == log.segment_summaries()[0].base_offset > 0
    assert all(s.largest_timestamp_ms >= clock.now_ms - 10_000 for s in log.segment_summaries()[:1])
    with pytest.raises(KafkaError):
        log.read(0, 100)
    clock.advance(10**9)
    log.delete_old_segments(high_watermark=log.log_end_offset)
    assert log.log_start_offset == log.log_end_offset == 100, "all expired: rolled, then deleted"
    log.close()


def test_retention_bytes(tmp_path: Path) -> None:
    log = open_log(tmp_path, **{"segment.bytes": 2048, "retention.bytes": 5000})
    for _ in range(30):
        log.append(make_batch(values_of(5, size=100)), leader_epoch=0)
    log.delete_old_segments()
    assert 5000 <= log.size_bytes < 5000 + 2048
    log.close()


def test_retention_frees_the_blocks_outside_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention renames the segments to ``*.deleted`` under the lock and deletes them after
    it: closing a deleted file frees its blocks, ~0.3 s for 512 MiB on this discard-mounted
    disk, and an append must not wait for that (file.delete.delay.ms=0: at once)."""
    config = {"segment.bytes": 2048, "retention.bytes": 1, "file.delete.delay.ms": 0}
    log = open_log(tmp_path, **config)
    for _ in range(6):
        log.append(make_batch(values_of(4, size=200)), leader_epoch=0)
    real_delete = LogSegment.delete
    appended: list[bool] = []

    def delete(segment: LogSegment) -> None:
        assert segment.log_path.name.endswith(DELETED_SUFFIX), "renamed first"
        assert not (tmp_path / "events-0" / segment.log_path.name[: -len(DELETED_SUFFIX)]).exists()
        appender = threading.Thread(
            target=lambda: appended.append(
                bool(log.append(make_batch(values_of(1)), leader_epoch=0))
            )
        )
        appender.start()
        appender.join(WAIT_S)
        assert not appender.is_alive(), "the append waited for the delete"
        real_delete(segment)

    monkeypatch.setattr(LogSegment, "delete", delete)
    deleted = log.delete_old_segments()
    assert deleted > 0 and len(appended) == deleted
    assert not list(log.directory.glob(f"*{DELETED_SUFFIX}"))
    log.close()


def test_segments_a_crash_left_deleted_are_removed_on_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(tmp_path, **{"segment.bytes": 2048, "retention.bytes": 1})
    for _ in range(6):
        log.append(make_batch(values_of(4, size=200)), leader_epoch=0)
    monkeypatch.setattr(LogSegment, "delete", lambda segment: None)  # the crash comes first
    log.delete_old_segments()
    start, end = log.log_start_offset, log.log_end_offset
    log.abandon()
    assert list(log.directory.glob(f"*{DELETED_SUFFIX}"))
    monkeypatch.undo()
    reopened = open_log(tmp_path)
    assert not list(reopened.directory.glob(f"*{DELETED_SUFFIX}"))
    assert (reopened.log_start_offset, reopened.log_end_offset) == (start, end)
    assert [r.offset for r in iter_records(reopened.read(start, 1 << 20))] == list(
        range(start, end)
    )
    reopened.close()


def test_flush_policies_move_the_recovery_point(tmp_path: Path) -> None:
    by_count = open_log(tmp_path, **{"flush.messages": 10})
    by_count.append(make_batch(values_of(6)), leader_epoch=0)
    assert by_count.recovery_point == 0
    by_count.append(make_batch(values_of(6)), leader_epoch=0)
    assert by_count.recovery_point == 12
    on_ack = Log(tmp_path / "acked-0", LogConfig.parse({"flush.on.ack": True}))
    on_ack.append(make_batch(values_of(2)), leader_epoch=0)
    assert on_ack.recovery_point == 2
    clock = ManualClock()
    by_time = Log(tmp_path / "timed-0", LogConfig.parse({"flush.ms": 1000}), clock=clock)
    by_time.append(make_batch(values_of(2)), leader_epoch=0)
    assert not by_time.maybe_flush() and by_time.recovery_point == 0
    clock.advance(1000)
    assert by_time.maybe_flush() and by_time.recovery_point == 2
    for log in (by_count, on_ack, by_time):
        log.close()


def test_clean_close_writes_a_marker_and_reopens_without_recovery(tmp_path: Path) -> None:
    log = open_log(tmp_path, **{"segment.bytes": 4096})
    for _ in range(10):
        log.append(make_batch(values_of(5, size=200)), leader_epoch=0)
    content = log.read(0, 1 << 20)
    log.close()
    assert (tmp_path / "events-0" / CLEAN_SHUTDOWN_MARKER).exists()
    reopened = open_log(tmp_path, **{"segment.bytes": 4096})
    assert reopened.recovery.clean_shutdown and not reopened.recovery.recovered
    assert not (tmp_path / "events-0" / CLEAN_SHUTDOWN_MARKER).exists(), "a crash now is unclean"
    assert reopened.read(0, 1 << 20) == content
    assert len(content) > HEADER_SIZE
    reopened.close()


def test_a_new_config_applies_to_the_next_append(tmp_path: Path) -> None:
    """Log keeps the configs every append reads out of the pydantic model (for speed): setting
    ``config`` must refresh them."""
    log = open_log(tmp_path)
    log.append(make_batch([b"x" * 600]), leader_epoch=0)
    log.config = log.config.with_overrides({"max.message.bytes": 500, "flush.on.ack": True})
    with pytest.raises(KafkaError) as caught:
        log.append(make_batch([b"x" * 600]), leader_epoch=0)
    assert caught.value.error is ErrorCode.MESSAGE_TOO_LARGE
    log.append(make_batch([b"y"]), leader_epoch=0)
    assert log.recovery_point == 2, "flush.on.ack now flushes"
    log.config = log.config.with_overrides({"cleanup.policy": "compact"})
    with pytest.raises(KafkaError, match="without a key"):
        log.append(make_batch([b"z"]), leader_epoch=0)
    log.close()


def test_flush_ms_at_its_maximum_never_flushes_by_time(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock)  # flush.ms defaults to 2**63 - 1: never
    log.append(make_batch([b"a"]), leader_epoch=0)
    clock.advance(10**15)
    log.append(make_batch([b"b"]), leader_epoch=0)
    assert log.recovery_point == 0
    log.close()


def test_batch_headers_from_an_offset_start_at_the_batch_that_begins_there(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path, **{"segment.bytes": 4096, "index.interval.bytes": 1000})
    for _ in range(30):
        log.append(make_batch(values_of(5, size=100)), leader_epoch=0)
    assert log.segment_count > 3
    every = [h.base_offset for h in log.batch_headers()]
    assert every == list(range(0, 150, 5))
    for start in (0, 45, 50, log.segment_summaries()[2].base_offset, 145, 150):
        assert [h.base_offset for h in log.batch_headers(start)] == [
            b for b in every if b >= start
        ], f"from {start}"
    log.close()


def test_the_log_start_listener_hears_retention_and_full_truncation(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock, **{"segment.bytes": 2048, "retention.ms": 10_000})
    heard: list[int] = []
    log.log_start_listener = heard.append
    for n in range(20):
        log.append(
            make_batch(values_of(5, size=100), timestamp_ms=clock.now_ms + n * 1000), leader_epoch=0
        )
    clock.advance(15_000)
    log.delete_old_segments()
    assert heard == [log.log_start_offset] and heard[0] > 0
    assert next(h.base_offset for h in log.batch_headers()) == log.log_start_offset
    log.truncate_fully_and_start_at(500)
    assert heard[-1] == 500
    log.close()


def test_a_log_in_a_directory_it_made_opens_without_scanning_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new partition's directory holds nothing of an earlier life: opening it skips the
    recovery's directory scans (``created``); opened again, the log reads its directory's
    names once (not a scan per pattern) and recovers."""
    scanned: list[str] = []
    glob, listdir = Path.glob, os.listdir

    def counted_glob(self: Path, pattern: str) -> object:
        scanned.append(f"glob {pattern}")
        return glob(self, pattern)

    def counted_listdir(path: str | Path) -> list[str]:
        if Path(path).is_relative_to(tmp_path):
            scanned.append(f"listdir {Path(path).name}")
        return listdir(path)

    monkeypatch.setattr(Path, "glob", counted_glob)
    monkeypatch.setattr(os, "listdir", counted_listdir)
    log = open_log(tmp_path)
    assert log.created and scanned == []
    log.append(make_batch(values_of(2)), leader_epoch=0)
    log.close()
    again = open_log(tmp_path)
    assert not again.created and scanned == [f"listdir {again.directory.name}"]
    assert again.log_end_offset == 2
    again.close()


def test_a_new_logs_topic_id_and_epochs_are_fsynced_by_its_flush_and_a_torn_id_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """partition.metadata and a new epoch cost no fsync when written (a broker opening 10,000
    new partitions paid two each for each file; Kafka's KAFKA-15046 for the epochs); the next
    flush syncs them after its records, then the directory naming them all. A truncation is
    durable at once. A topic id a power cut tore is written again from the one given."""
    synced: list[str] = []

    fsync_path = checkpoint.fsync_path

    def recorded(path: Path) -> None:
        synced.append(path.name)
        fsync_path(path)

    monkeypatch.setattr(log_module, "fsync_path", recorded)
    monkeypatch.setattr(epoch_module, "fsync_path", recorded)
    monkeypatch.setattr(checkpoint, "fsync_path", recorded)  # a durable write's directory
    topic_id = uuid.uuid4()
    log = Log(tmp_path / "t-0", topic_id=topic_id)
    log.assign_leader_epoch(3)  # a new leader's epoch: written, not fsynced either
    assert "partition.metadata" not in synced and "leader-epoch-checkpoint" not in synced
    log.append(make_batch(values_of(2)), leader_epoch=3)
    log.flush()
    last = max(synced.index("partition.metadata"), synced.index("leader-epoch-checkpoint"))
    assert "t-0" in synced[last:]  # then the directory: the files' names with the segment's
    synced.clear()
    log.assign_leader_epoch(4)
    log.append(make_batch(values_of(2)), leader_epoch=4)
    log.truncate_to(2)  # a truncation's rewrite of the epochs is durable at once
    assert not log.epochs.unsynced and "t-0" in synced  # written durably: file, then dir
    log.close()
    (tmp_path / "t-0" / "partition.metadata").write_text("version: 0\ntopic_id: 3f")  # torn
    again = Log(tmp_path / "t-0", topic_id=topic_id)
    assert again.topic_id == topic_id and again.log_end_offset == 2
    assert f"topic_id: {topic_id}" in (tmp_path / "t-0" / "partition.metadata").read_text()
    again.close()
