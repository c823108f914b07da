"""``preallocate`` (segment files given segment.bytes at once, trimmed on roll and close, a zero
tail after a crash cut without loss) and ``file.delete.delay.ms`` (deleted segments renamed
``*.deleted``, their files removed after the delay; a reader keeps reading them; a restart removes
leftovers)."""

from __future__ import annotations

from pathlib import Path

from raftlog.config import LogConfig
from raftlog.log import Log
from raftlog.records import iter_records
from raftlog.segment import DELETED_SUFFIX, LOG_SUFFIX, read_planned
from tests.raftlog.batches import ManualClock, make_batch, values_of

SEGMENT_BYTES = 64 * 1024


def open_log(path: Path, clock: ManualClock | None = None, /, **config: object) -> Log:
    return Log(path / "events-0", LogConfig.parse(config), clock=clock or ManualClock())


def log_files(log: Log) -> list[Path]:
    return sorted(log.directory.glob(f"*{LOG_SUFFIX}"))


def offsets_of(log: Log) -> list[int]:
    data = log.read(log.log_start_offset, 1 << 24)
    return [record.offset for record in iter_records(data)]


def test_a_new_segment_is_preallocated_and_trimmed_on_roll_and_close(tmp_path: Path) -> None:
    log = open_log(tmp_path, preallocate="true", **{"segment.bytes": SEGMENT_BYTES})
    assert log_files(log)[0].stat().st_size == SEGMENT_BYTES, "preallocated at creation"
    log.append(make_batch(values_of(5)), leader_epoch=0)
    first_size = log.active.size_bytes
    assert log_files(log)[0].stat().st_size == SEGMENT_BYTES, "appends fill the space"
    log.roll()
    first, second = log_files(log)
    assert first.stat().st_size == first_size, "trimmed to its batches on roll"
    assert second.stat().st_size == SEGMENT_BYTES
    log.append(make_batch(values_of(3)), leader_epoch=0)
    log.close()
    assert second.stat().st_size == log_files(log)[1].stat().st_size < SEGMENT_BYTES
    reopened = open_log(tmp_path, preallocate="true", **{"segment.bytes": SEGMENT_BYTES})
    assert offsets_of(reopened) == list(range(8))
    reopened.close()


def test_without_preallocate_a_segment_grows_by_appends(tmp_path: Path) -> None:
    log = open_log(tmp_path, **{"segment.bytes": SEGMENT_BYTES})
    assert log_files(log)[0].stat().st_size == 0
    log.close()


def test_a_crash_leaves_a_zero_tail_that_recovery_cuts_without_loss(tmp_path: Path) -> None:
    config = {"preallocate": "true", "segment.bytes": SEGMENT_BYTES}
    log = open_log(tmp_path, **config)
    for _ in range(4):
        log.append(make_batch(values_of(5)), leader_epoch=0)
    log.flush()
    logical = log.active.size_bytes
    log.abandon()  # a crash: no trim, no clean-shutdown marker
    assert log_files(log)[0].stat().st_size == SEGMENT_BYTES, "the zero tail is on disk"
    reopened = open_log(tmp_path, **config)
    assert reopened.log_end_offset == 20
    assert offsets_of(reopened) == list(range(20)), "the zeros are never read"
    assert reopened.recovery.dropped_bytes == 0, "nothing reported dropped"
    assert all(result.reason is None for result in reopened.recovery.recovered)
    assert log_files(reopened)[0].stat().st_size == logical, "cut back to its batches"
    info = reopened.append(make_batch(values_of(2)), leader_epoch=0)
    assert (info.first_offset, info.last_offset) == (20, 21), "the next append lands at the end"
    reopened.close()
    again = open_log(tmp_path, **config)
    assert offsets_of(again) == list(range(22))
    again.close()


def test_a_crash_with_a_preallocated_rolled_segment_keeps_the_later_ones(tmp_path: Path) -> None:
    """A roll's trim not yet durable when the power went: the older segment comes back with its
    zero tail; it is cut and the newer segment (its records after it) stays."""
    config = {"preallocate": "true", "segment.bytes": SEGMENT_BYTES}
    log = open_log(tmp_path, **config)
    log.append(make_batch(values_of(5)), leader_epoch=0)
    log.roll()
    log.append(make_batch(values_of(5)), leader_epoch=0)
    first = log_files(log)[0]
    log.abandon()
    with first.open("r+b") as file:  # the trim undone
        file.truncate(SEGMENT_BYTES)
    reopened = open_log(tmp_path, **config)
    assert offsets_of(reopened) == list(range(10))
    assert reopened.recovery.deleted_segments == ()
    reopened.close()


def test_deleted_segments_wait_out_the_delay(tmp_path: Path) -> None:
    clock = ManualClock()
    config = {"segment.bytes": 2048, "retention.bytes": 1, "file.delete.delay.ms": 5000}
    log = open_log(tmp_path, clock, **config)
    for _ in range(6):
        log.append(make_batch(values_of(4, size=200)), leader_epoch=0)
    # a fetch in progress holds a descriptor of the first segment
    reader = log.segments()[0].plan_read(0, 1 << 20, log.log_end_offset, min_one_batch=True)
    assert not isinstance(reader, bool)
    deleted = log.delete_old_segments()
    assert deleted > 0 and log.pending_deletes == deleted
    renamed = sorted(log.directory.glob(f"*{LOG_SUFFIX}{DELETED_SUFFIX}"))
    assert len(renamed) == deleted, "renamed *.deleted, with their indexes"
    assert list(log.directory.glob(f"*.index{DELETED_SUFFIX}"))
    data, _ = read_planned(reader, log.log_end_offset)
    assert data, "the reader keeps reading the renamed file"
    assert log.delete_due_segment_files() == 0, "not before the delay"
    clock.advance(4999)
    assert log.delete_due_segment_files() == 0
    clock.advance(1)
    assert log.delete_due_segment_files() == deleted
    assert not list(log.directory.glob(f"*{DELETED_SUFFIX}")), "every file of them gone"
    log.close()


def test_truncation_and_compaction_also_delay_and_a_restart_removes_leftovers(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    config = {"segment.bytes": 2048, "file.delete.delay.ms": 60_000}
    log = open_log(tmp_path, clock, **config)
    for _ in range(6):
        log.append(make_batch(values_of(4, size=200)), leader_epoch=0)
    segments = log.segment_count
    log.truncate_to(4)
    assert log.pending_deletes == segments - 1
    assert len(list(log.directory.glob(f"*{LOG_SUFFIX}{DELETED_SUFFIX}"))) == segments - 1
    log.abandon()  # a crash before the delay passed
    reopened = open_log(tmp_path, clock, **config)
    assert not list(reopened.directory.glob(f"*{DELETED_SUFFIX}")), "removed at load"
    assert offsets_of(reopened) == list(range(4))
    reopened.close()


def test_compaction_replaces_segments_through_the_delay(tmp_path: Path) -> None:
    clock = ManualClock()
    config = {
        "segment.bytes": 2048, "cleanup.policy": "compact", "file.delete.delay.ms": 1000,
    }  # fmt: skip
    log = open_log(tmp_path, clock, **config)
    for _ in range(8):
        log.append(make_batch([b"same" * 50] * 4, keys=[b"k"] * 4), leader_epoch=0)
    assert log.compact(force=True) is not None
    assert log.pending_deletes > 0, "the replaced segments wait"
    assert list(log.directory.glob(f"*{LOG_SUFFIX}{DELETED_SUFFIX}"))
    clock.advance(1000)
    assert log.delete_due_segment_files() > 0
    assert not list(log.directory.glob(f"*{DELETED_SUFFIX}"))
    log.close()


def test_close_removes_what_waits(tmp_path: Path) -> None:
    config = {"segment.bytes": 2048, "retention.bytes": 1, "file.delete.delay.ms": 60_000}
    log = open_log(tmp_path, **config)
    for _ in range(6):
        log.append(make_batch(values_of(4, size=200)), leader_epoch=0)
    assert log.delete_old_segments() > 0
    log.close()
    assert not list(log.directory.glob(f"*{DELETED_SUFFIX}"))
