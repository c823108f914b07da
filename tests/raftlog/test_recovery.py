"""Damage on disk: recovery keeps every batch before the damage, reports what it dropped, and
never raises on start."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from raftlog.batch import HEADER_SIZE, read_header
from raftlog.config import LogConfig
from raftlog.log import Log
from raftlog.records import Record, encode_batch, iter_records
from tests.raftlog.batches import make_batch, values_of
from tests.raftlog.test_page_cache import resident_pages

CONFIG = LogConfig.parse({"segment.bytes": 8192, "index.interval.bytes": 1024})
BATCHES = 40
PER_BATCH = 5


def write_log(directory: Path, *, clean: bool) -> Log:
    log = Log(directory, CONFIG)
    for n in range(BATCHES):
        log.append(make_batch(values_of(PER_BATCH, size=150, tag=f"b{n}-")), leader_epoch=n // 10)
    if clean:
        log.close()
    else:
        log.abandon()  # a crash: no flush, no clean-shutdown marker
    return log


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def batch_positions(path: Path) -> list[tuple[int, int, int]]:
    """(position, base offset, size) of each batch in a segment file."""
    data, out, position = path.read_bytes(), [], 0
    while position + HEADER_SIZE <= len(data):
        header = read_header(data, position)
        out.append((position, header.base_offset, header.size_bytes))
        position += header.size_bytes
    return out


def offsets(log: Log) -> list[int]:
    return [r.offset for r in iter_records(log.read(log.log_start_offset, 1 << 24))]


def test_flipped_byte_in_a_middle_segment(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    write_log(directory, clean=False)
    files = segment_files(directory)
    assert len(files) >= 4
    middle = files[len(files) // 2]
    position, base_offset, size = batch_positions(middle)[2]
    data = bytearray(middle.read_bytes())
    data[position + size - 3] ^= 0xFF  # inside the records: only the CRC can tell
    middle.write_bytes(bytes(data))
    log = Log(directory, CONFIG)
    assert offsets(log) == list(range(base_offset)), "everything before the damage, nothing after"
    assert log.log_end_offset == base_offset
    damaged = [r for r in log.recovery.recovered if r.dropped_bytes]
    assert len(damaged) == 1 and "CRC" in (damaged[0].reason or "")
    assert damaged[0].valid_bytes == position
    assert log.recovery.deleted_segments, "segments after the damage were deleted"
    assert log.append(make_batch([b"new"]), leader_epoch=9).first_offset == base_offset
    log.close()


@pytest.mark.parametrize("cut", [1, HEADER_SIZE - 1, HEADER_SIZE + 7, -1])
def test_file_truncated_mid_batch(tmp_path: Path, cut: int) -> None:
    directory = tmp_path / "t-0"
    write_log(directory, clean=False)
    last = segment_files(directory)[-1]
    position, base_offset, size = batch_positions(last)[-1]
    with last.open("r+b") as file:
        file.truncate(position + (cut if cut > 0 else size - 1))
    log = Log(directory, CONFIG)
    assert offsets(log) == list(range(base_offset))
    assert log.recovery.dropped_bytes == (cut if cut > 0 else size - 1)
    assert last.stat().st_size == position, "the log ends at a batch boundary"
    log.close()


def test_garbage_after_the_last_batch(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    write_log(directory, clean=False)
    last = segment_files(directory)[-1]
    with last.open("ab") as file:
        file.write(b"\x00" * 5000)
    log = Log(directory, CONFIG)
    assert offsets(log) == list(range(BATCHES * PER_BATCH))
    assert log.recovery.dropped_bytes == 5000
    log.close()


@pytest.mark.parametrize("clean", [True, False])
def test_deleted_index_is_rebuilt(tmp_path: Path, clean: bool) -> None:
    directory = tmp_path / "t-0"
    write_log(directory, clean=clean)
    victim = segment_files(directory)[1]
    entries_before = victim.with_suffix(".index").stat().st_size // 8
    assert entries_before > 0
    victim.with_suffix(".index").unlink()
    victim.with_suffix(".timeindex").unlink()
    log = Log(directory, CONFIG)
    assert offsets(log) == list(range(BATCHES * PER_BATCH))
    rebuilt = next(s for s in log.segments() if s.log_path == victim)
    assert rebuilt.offset_index.entries == entries_before
    assert rebuilt.time_index.entries > 0
    assert [tuple(e) for e in log.epochs.entries] == [(0, 0), (1, 50), (2, 100), (3, 150)]
    log.close()


@pytest.mark.parametrize(
    "garbage", [b"\xff" * 16, b"\x00\x00\x00\x05\x00\x00\x00\x01" * 3, b"\x01\x02\x03"]
)
def test_corrupt_index_is_never_trusted(tmp_path: Path, garbage: bytes) -> None:
    directory = tmp_path / "t-0"
    write_log(directory, clean=True)
    victim = segment_files(directory)[0]
    victim.with_suffix(".index").write_bytes(garbage)
    log = Log(directory, CONFIG)
    assert offsets(log) == list(range(BATCHES * PER_BATCH))
    for offset in range(0, BATCHES * PER_BATCH, 3):
        assert read_header(log.read(offset, 1)).base_offset == offset - offset % PER_BATCH
    log.close()


def test_damaged_checkpoints_are_noted_not_fatal(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    write_log(directory, clean=True)
    (directory / "leader-epoch-checkpoint").write_text("0\nmany\n")
    (directory / "recovery-point-offset-checkpoint").write_text("garbage")
    log = Log(directory, CONFIG)
    assert len(log.recovery.notes) == 2
    assert [tuple(e) for e in log.epochs.entries] == [(0, 0), (1, 50), (2, 100), (3, 150)]
    assert offsets(log) == list(range(BATCHES * PER_BATCH))
    log.close()


def test_recovery_of_an_untouched_crash_keeps_everything(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    write_log(directory, clean=False)
    log = Log(directory, CONFIG)
    assert not log.recovery.clean_shutdown
    assert len(log.recovery.recovered) == len(segment_files(directory))
    assert log.recovery.dropped_bytes == 0
    assert offsets(log) == list(range(BATCHES * PER_BATCH))
    assert log.recovery_point == log.log_end_offset
    log.close()


def follower_batch(base_offset: int, epoch: int, tag: str) -> bytes:
    """A leader's batch as a follower copies it: its offsets and epoch set."""
    records = [Record(-1, 1_000 + n, None, f"{tag}-{n}".encode()) for n in range(PER_BATCH)]
    return encode_batch(records, base_offset=base_offset, partition_leader_epoch=epoch)


def test_an_unclean_start_takes_the_epochs_from_the_batches_not_the_checkpoint(
    tmp_path: Path,
) -> None:
    """Issue 30 §1: a follower's truncation that a power cut undid brings epoch-6 batches back
    at offsets the (durable) checkpoint gives to epoch 7. The batches win: the follower then
    fetches with last epoch 6 and the leader tells it where it diverged."""
    directory = tmp_path / "t-0"
    log = Log(directory, CONFIG)
    for n in range(12):
        log.append(make_batch(values_of(PER_BATCH, size=150, tag=f"e5-{n}-")), leader_epoch=5)
    log.flush()  # below the truncation, flushed: these segments are not recovered
    assert len(log.segments()) > 1
    for n in range(4):
        log.append(make_batch(values_of(PER_BATCH, tag=f"e6-{n}-")), leader_epoch=6)
    log.flush()
    active = log.active.log_path
    flushed = active.read_bytes()  # what a power cut brings back of the active segment
    truncate_at = log.log_end_offset - 2 * PER_BATCH
    log.truncate_to(truncate_at)
    for n in range(3):
        log.append_as_follower(follower_batch(log.log_end_offset, 7, f"e7-{n}"))
    assert log.epochs.epoch_for_offset(truncate_at) == 7
    log.abandon()
    active.write_bytes(flushed)  # the truncation and the epoch-7 appends are lost; not the
    # checkpoint, which says epoch 7 starts at truncate_at

    reopened = Log(directory, CONFIG)
    assert not reopened.recovery.clean_shutdown
    assert reopened.log_end_offset == truncate_at + 2 * PER_BATCH
    assert reopened.epochs.epoch_for_offset(truncate_at) == 6
    assert [tuple(e) for e in reopened.epochs.entries] == [(5, 0), (6, 12 * PER_BATCH)]
    assert len(reopened.recovery.recovered) < len(reopened.segments())
    # the follower's next fetch: last epoch 6 at its log end, which the leader knows ends at
    # truncate_at (its epoch 7 starts there): the follower truncates there again
    assert reopened.epochs.latest_epoch == 6
    reopened.close()
    again = Log(directory, CONFIG)
    assert [tuple(e) for e in again.epochs.entries] == [(5, 0), (6, 12 * PER_BATCH)], "durable"
    again.close()


def test_an_unclean_start_of_a_log_without_records_makes_nothing_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every partition of a killed broker that had no record beyond its recovery point: its
    open costs no fsync. The epoch a new leader assigned at the empty log's end starts no
    batch, so the rebuild drops it; the file is written, and made durable by the next flush."""
    directory = tmp_path / "t-0"
    log = Log(directory, CONFIG)
    log.assign_leader_epoch(3)
    log.flush()
    log.abandon()
    synced: list[int] = []

    def counted(real: Callable[[int], None]) -> Callable[[int], None]:
        def call(fd: int) -> None:
            synced.append(fd)
            real(fd)

        return call

    monkeypatch.setattr(os, "fsync", counted(os.fsync))
    monkeypatch.setattr(os, "fdatasync", counted(os.fdatasync))
    reopened = Log(directory, CONFIG)
    assert not reopened.recovery.clean_shutdown
    assert [r.valid_bytes for r in reopened.recovery.recovered] == [0]
    assert reopened.epochs.entries == ()
    assert synced == [], "a reopen that found nothing made something durable"
    reopened.flush()
    assert synced, "the flush makes the rebuilt epochs durable"
    reopened.close()
    again = Log(directory, CONFIG)
    assert again.recovery.clean_shutdown and again.epochs.entries == ()
    again.close()


def test_an_unclean_start_does_not_read_the_preallocated_indexes_it_rebuilds(
    tmp_path: Path,
) -> None:
    """A crash leaves the active segment's indexes at their preallocated length, a hole after
    their entries. Opening one read its last entry, faulting in the hole's last page (and 4 MiB
    of zeros around it), before recovery threw the index away to rebuild it: 1.7 ms on ext4 for
    each of two files per partition, 19.5 s of the 29 s a broker with 3,000 partitions took to
    open them after a SIGKILL. The last page stays out of the page cache now (mincore: the
    kernel's own answer)."""
    directory = tmp_path / "t-0"
    log = Log(directory, LogConfig.parse({"index.interval.bytes": 1024}))
    for n in range(5):
        log.append(make_batch(values_of(PER_BATCH, size=300, tag=f"b{n}-")), leader_epoch=0)
    indexes = sorted(directory.glob("*.index")) + sorted(directory.glob("*.timeindex"))
    preallocated = [path.stat().st_size for path in indexes]
    assert len(indexes) == 2 and min(preallocated) > 1 << 20
    log.abandon()  # trims the indexes, as a close does: a SIGKILL leaves them preallocated
    for path, size in zip(indexes, preallocated, strict=True):
        os.truncate(path, size)
    assert not any(resident_pages(path)[-1] for path in indexes), "untouched before the reopen"
    reopened = Log(directory, LogConfig.parse({"index.interval.bytes": 1024}))
    assert not reopened.recovery.clean_shutdown
    assert reopened.log_end_offset == 5 * PER_BATCH
    assert [not resident_pages(path)[-1] for path in indexes] == [True, True]
    assert reopened.active.offset_index.lookup(2**62)[0] > 0, "the entries were rebuilt"
    reopened.close()
