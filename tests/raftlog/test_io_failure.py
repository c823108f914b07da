"""A write that fails in the operating system (a full disk, EIO) leaves a valid log behind.

Kafka takes a log directory offline on such an error; the log's part is to say so once (its
``io_failure_listener``, then LogDirIOError with KAFKA_STORAGE_ERROR) and to leave no torn bytes:
a torn batch under the next append would sit mid-log, where recovery cuts everything after it.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.batch import iter_batches
from raftlog.config import LogConfig
from raftlog.errors import ErrorCode, LogDirIOError
from raftlog.log import Log
from raftlog.records import iter_records
from tests.raftlog.batches import BASE_TIMESTAMP_MS, make_batch, values_of

# Small segments and a dense index: a few appends roll, and nearly every batch adds an entry.
LATER_MS = BASE_TIMESTAMP_MS + 60_000  # a batch that would move the segment's max timestamp
CONFIG = LogConfig.model_validate(
    {"segment.bytes": 64 * 1024, "index.interval.bytes": 512, "segment.index.bytes": 4096}
)


def stored_values(log: Log) -> list[bytes]:
    data = log.read(log.log_start_offset, 1 << 30)
    return [
        record.value or b""
        for position, header in iter_batches(data)
        for record in iter_records(data[position : position + header.size_bytes])
    ]


class Listener:
    def __init__(self) -> None:
        self.calls: list[tuple[Path, OSError]] = []

    def __call__(self, directory: Path, error: OSError) -> None:
        self.calls.append((directory, error))


def test_a_torn_write_is_cut_and_the_log_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log(tmp_path / "events-0", CONFIG)
    listener = log.io_failure_listener = Listener()
    first = values_of(20, tag="a")
    log.append(make_batch(first), leader_epoch=0)
    size_before, end_before = log.active.size_bytes, log.log_end_offset
    entries_before = log.active.offset_index.entries

    real_writev = os.writev

    def torn_writev(fd: int, chunks: list[bytes]) -> int:
        data = b"".join(chunks)
        real_writev(fd, [data[: len(data) // 2]])  # half the batch reaches the file...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full

    monkeypatch.setattr("raftlog.segment.os.writev", torn_writev)
    with pytest.raises(LogDirIOError) as raised:
        log.append(make_batch(values_of(20, tag="b")), leader_epoch=0)
    monkeypatch.undo()

    assert raised.value.error is ErrorCode.KAFKA_STORAGE_ERROR
    assert [(d, e.errno) for d, e in listener.calls] == [(log.directory, errno.ENOSPC)]
    assert (log.log_end_offset, log.active.size_bytes) == (end_before, size_before)
    assert log.active.offset_index.entries == entries_before
    assert log.active.log_path.stat().st_size == size_before  # the torn half is gone

    third = values_of(20, tag="c")
    log.append(make_batch(third), leader_epoch=0)  # space again: the log goes on where it was
    assert stored_values(log) == first + third
    log.abandon()  # a crash: reopening recovers the unflushed tail and must drop nothing
    reopened = Log(tmp_path / "events-0", CONFIG)
    assert reopened.recovery.dropped_bytes == 0
    assert stored_values(reopened) == first + third
    reopened.close()


def test_a_failed_index_write_is_undone_with_the_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log(tmp_path / "events-0", CONFIG)
    log.append(make_batch(values_of(20, tag="a")), leader_epoch=0)
    state = (log.log_end_offset, log.active.size_bytes, log.active.max_timestamp)

    def no_space(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("raftlog.index.os.pwrite", no_space)
    with pytest.raises(LogDirIOError):
        log.append(make_batch(values_of(20, tag="b"), timestamp_ms=LATER_MS), leader_epoch=0)
    monkeypatch.undo()
    assert (log.log_end_offset, log.active.size_bytes, log.active.max_timestamp) == state
    log.append(make_batch(values_of(5, tag="c")), leader_epoch=0)
    log.close()
    assert Log(tmp_path / "events-0", CONFIG).recovery.dropped_bytes == 0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs: a real disk that fills (root only; CI runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "raftlog-test-disk", str(mount_point)],
        check=True,
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)
        if os.path.ismount(mount_point):
            subprocess.run(["umount", "-l", str(mount_point)], check=True)


def test_a_real_full_disk_keeps_every_acknowledged_batch(small_disk: Path) -> None:
    log = Log(small_disk / "events-0", CONFIG)
    listener = log.io_failure_listener = Listener()
    acknowledged: list[bytes] = []
    for n in range(1_000):
        values = values_of(10, size=200, tag=f"{n:04d}-")
        try:
            log.append(make_batch(values), leader_epoch=0)
        except LogDirIOError:
            break
        acknowledged += values
    else:
        pytest.fail("a 256 KiB disk took 2 MB of batches")
    assert acknowledged
    assert listener.calls and listener.calls[0][1].errno == errno.ENOSPC
    assert stored_values(log) == acknowledged
    log.abandon()
    # Reopening writes checkpoints, so (as Kafka) it needs space: the operator grows the disk.
    subprocess.run(["mount", "-o", "remount,size=1m", str(small_disk)], check=True)
    reopened = Log(small_disk / "events-0", CONFIG)
    assert reopened.recovery.dropped_bytes == 0
    assert stored_values(reopened) == acknowledged
    reopened.abandon()
