"""``Log.release_page_cache``: what was appended behind the log's last ``keep_bytes`` leaves the
page cache once written back, the tail stays, and every byte reads back the same. Residency is
the kernel's own answer (``mincore`` on a mapping of each segment), on the real filesystem."""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import time
from pathlib import Path

import pytest

import raftlog.log as log_module
from raftlog.config import LogConfig
from raftlog.log import CACHE_RELEASE_RETRY_MS, Log
from raftlog.records import iter_records
from raftlog.segment import CachedRange, release_cached
from tests.raftlog.batches import ManualClock, make_batch, values_of

MiB = 1 << 20
PAGE = mmap.PAGESIZE
WAIT_S = 30.0
FOLIO_MARGIN = 512 * 1024
libc = ctypes.CDLL(None, use_errno=True)
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]


def resident_pages(path: Path) -> list[bool]:
    """Which pages of the file are in the page cache."""
    size = path.stat().st_size
    if size == 0:
        return []
    vec = (ctypes.c_ubyte * -(-size // PAGE))()
    with path.open("rb") as file, mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        start = ctypes.c_char.from_buffer(mapped)  # a private mapping: mincore sees the cache
        try:
            if libc.mincore(ctypes.addressof(start), size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            del start  # the mapping closes only once nothing points into it
    return [bool(flag & 1) for flag in vec]


def residency(directory: Path) -> list[bool]:
    """Each page of a log's segments, oldest first, resident or not."""
    return [page for path in sorted(directory.glob("*.log")) for page in resident_pages(path)]


def filled_log(tmp_path: Path, clock: ManualClock, mib: int) -> tuple[Log, list[bytes]]:
    log = Log(tmp_path / "events-0", LogConfig.parse({"segment.bytes": MiB}), clock=clock)
    values = values_of(mib * 1024, size=1000)
    for n in range(0, len(values), 128):
        log.append(make_batch(values[n : n + 128]), leader_epoch=0)
    return log, values


def old_and_tail(directory: Path, keep_bytes: int) -> tuple[list[bool], list[bool]]:
    """The residency of the pages of a log's segments before its last ``keep_bytes``, and of
    those in them. The kernel drops only whole folios inside an advised range, and ext4 caches
    a file in folios of up to many pages (64 KiB ones straddled the boundary here): the pages
    within ``FOLIO_MARGIN`` before it are in neither list."""
    old, tail = [], []
    behind = 0  # bytes of the log after this segment
    for path in sorted(directory.glob("*.log"), reverse=True):
        pages, size = resident_pages(path), path.stat().st_size
        for n, flag in enumerate(pages):  # the page's distances from the log's end
            starts, ends = behind + size - n * PAGE, behind + max(0, size - (n + 1) * PAGE)
            if ends >= keep_bytes + FOLIO_MARGIN:
                old.append(flag)
            elif starts <= keep_bytes:
                tail.append(flag)
        behind += size
    return old, tail


def read_values(log: Log) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while offset < log.log_end_offset:
        records = list(iter_records(log.read(offset, MiB)))
        out += [record.value for record in records if record.offset >= offset]  # type: ignore[misc]
        offset = records[-1].offset + 1
    return out


def test_written_back_bytes_behind_the_tail_leave_the_cache_and_read_the_same(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    log, values = filled_log(tmp_path, clock, 6)
    log.flush()  # written back: the first advice drops them
    total = sum(path.stat().st_size for path in log.directory.glob("*.log"))
    assert all(residency(log.directory)), "freshly written pages are cached"
    assert log.release_page_cache(2 * MiB) == total - 2 * MiB
    old, tail = old_and_tail(log.directory, 2 * MiB)
    assert len(old) > 800 and not any(old)
    assert tail and all(tail)
    assert read_values(log) == values  # from the disk now, the same bytes
    log.close()


def test_dirty_bytes_leave_the_cache_on_a_later_advice_once_written_back(tmp_path: Path) -> None:
    clock = ManualClock()
    log, _ = filled_log(tmp_path, clock, 4)  # not flushed: the first advice starts writeback
    deadline = time.monotonic() + WAIT_S
    while any(old_and_tail(log.directory, MiB)[0]):
        assert time.monotonic() < deadline, "written-back pages were never dropped"
        log.release_page_cache(MiB)
        clock.advance(1)  # well inside the retry window
    assert all(old_and_tail(log.directory, MiB)[1])
    log.close()


@pytest.fixture
def advised(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(position, length) of each range the log advises the kernel to drop, as it does."""
    ranges: list[tuple[int, int]] = []

    def spy(cached: CachedRange) -> None:
        ranges.append((cached.position, cached.length))
        release_cached(cached)

    monkeypatch.setattr(log_module, "release_cached", spy)
    return ranges


def test_a_range_is_advised_for_the_retry_window_and_then_left_alone(
    tmp_path: Path, advised: list[tuple[int, int]]
) -> None:
    clock = ManualClock()
    log, _ = filled_log(tmp_path, clock, 3)
    released = log.release_page_cache(MiB)
    assert released > 0 and advised
    clock.advance(CACHE_RELEASE_RETRY_MS - 1)
    advised.clear()
    assert log.release_page_cache(MiB) == 0  # nothing released for the first time...
    assert sum(length for _, length in advised) >= released  # ...but advised again
    clock.advance(1)
    advised.clear()
    assert log.release_page_cache(MiB) == 0
    assert not advised  # retried long enough
    assert log.release_page_cache(0) == 0
    log.close()


def test_an_idle_log_is_answered_without_its_lock_until_it_changes(
    tmp_path: Path, advised: list[tuple[int, int]]
) -> None:
    """The broker visits every log each tick: at 10,000 partitions, taking each idle log's lock
    and walking its segments was most of an idle broker's CPU. Once nothing is left to advise,
    the next call returns before the lock, until an append, a roll or a truncation."""
    clock = ManualClock()
    log, _ = filled_log(tmp_path, clock, 3)
    log.flush()
    log.release_page_cache(MiB)
    clock.advance(CACHE_RELEASE_RETRY_MS)
    assert log.release_page_cache(MiB) == 0  # retries done: idle from here
    lock, log._lock = log._lock, None  # type: ignore[assignment]
    assert log.release_page_cache(MiB) == 0  # answered without the lock
    assert log.maybe_flush() is False  # nothing unflushed: no lock either
    log._lock = lock
    advised.clear()
    log.append(make_batch(values_of(1024, size=1000)), leader_epoch=0)  # 1 MiB more
    assert log.release_page_cache(MiB) > 0 and advised  # the log changed: looked at again
    log.close()


def test_what_a_segment_held_when_opened_and_a_zero_keep_are_the_kernels(tmp_path: Path) -> None:
    clock = ManualClock()
    log, values = filled_log(tmp_path, clock, 3)
    assert log.release_page_cache(0) == 0
    assert all(residency(log.directory)), "keep 0: nothing released"
    log.close()
    reopened = Log(log.directory, LogConfig.parse({"segment.bytes": MiB}), clock=clock)
    assert reopened.release_page_cache(MiB) == 0  # appended by an earlier process
    reopened.append(make_batch(values[:128]), leader_epoch=0)
    assert reopened.release_page_cache(1) > 0  # what this one appends is released
    reopened.close()


def test_what_is_appended_after_a_truncation_is_released_too(tmp_path: Path) -> None:
    clock = ManualClock()
    log, values = filled_log(tmp_path, clock, 3)
    log.flush()
    log.release_page_cache(MiB)
    clock.advance(CACHE_RELEASE_RETRY_MS)
    log.release_page_cache(MiB)  # retries over: everything before the tail counts as released
    log.truncate_to(512)  # a diverged follower cuts back into the first segment
    for n in range(0, 3 * 1024, 128):
        log.append(make_batch(values[n : n + 128]), leader_epoch=0)
    log.flush()
    assert log.release_page_cache(MiB) > 0
    old, tail = old_and_tail(log.directory, MiB)
    assert len(old) > 400 and not any(old)
    assert tail and all(tail)
    assert read_values(log) == values[:512] + values[: 3 * 1024]
    log.close()


def test_a_failed_advice_is_warned_of_once_and_stores_nothing_differently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(cached: CachedRange) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(log_module, "release_cached", refuse)
    clock = ManualClock()
    log, values = filled_log(tmp_path, clock, 3)
    fds = len(os.listdir("/proc/self/fd"))
    with caplog.at_level(logging.DEBUG, logger="raftlog.log"):
        for _ in range(3):
            assert log.release_page_cache(MiB) == 0
            clock.advance(1)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "page cache release failed" in warnings[0].getMessage()
    assert len(os.listdir("/proc/self/fd")) == fds  # no duplicate descriptor left open
    assert read_values(log) == values
    log.close()


def test_a_log_tells_its_owner_of_work_and_says_when_it_is_idle(tmp_path: Path) -> None:
    """The broker's timers visit only the logs that told of work (``work_listener``) until
    they are idle again: an append leaves page cache to release; a deletion set aside waits
    for file.delete.delay.ms; a time-based flush waits for flush.ms."""
    clock = ManualClock()
    config = LogConfig(segment_bytes=MiB, file_delete_delay_ms=1000, flush_ms=5000)
    log = Log(tmp_path / "t-0", config, clock=clock)
    told: list[int] = []
    log.work_listener = lambda: told.append(1)
    assert not log.has_timed_work()
    assert log.cache_release_pending(MiB)  # never looked at
    assert log.release_page_cache(MiB) == 0 and not log.cache_release_pending(MiB)
    for _ in range(3):
        log.append(make_batch(values_of(1024, size=1000)), leader_epoch=0)
    assert told and log.cache_release_pending(MiB)
    assert log.has_timed_work()  # unflushed records, and flush.ms applies
    clock.advance(5000)
    assert log.maybe_flush() and not log.has_timed_work()
    log.release_page_cache(MiB)
    clock.advance(CACHE_RELEASE_RETRY_MS)
    log.release_page_cache(MiB)
    assert not log.cache_release_pending(MiB)  # idle: visited again only once told
    told.clear()
    log.truncate_to(1)  # the truncated segments wait for file.delete.delay.ms
    assert told and log.has_timed_work() and log.cache_release_pending(MiB)
    clock.advance(1000)
    assert log.delete_due_segment_files() > 0 and not log.has_timed_work()
    told.clear()
    log.config = LogConfig(segment_bytes=MiB, flush_ms=10)  # a new policy for what is stored
    assert told
    log.close()
