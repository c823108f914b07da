"""The offset and time indexes: preallocation, search, trim, truncation, damage detection."""

import mmap
import os
from pathlib import Path

import pytest

from raftlog.index import CorruptIndexError, OffsetIndex, TimeIndex


def test_offset_index_is_preallocated_searched_and_trimmed(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "0.index", base_offset=100, max_index_bytes=80)
    assert index.path.stat().st_size == 80, "a new index is preallocated"
    assert index.lookup(150) == (100, 0), "an empty index points at the segment start"
    for n in range(5):
        index.append(100 + n * 10, n * 1000 + 1)
    assert index.lookup(99) == (100, 0)
    assert index.lookup(100) == (100, 1)
    assert index.lookup(125) == (120, 2001)
    assert index.lookup(10**12) == (140, 4001)
    index.trim()
    assert index.path.stat().st_size == 5 * 8, "trim leaves exactly the entries"
    index.close()
    reopened = OffsetIndex(tmp_path / "0.index", base_offset=100, max_index_bytes=80)
    assert reopened.entries == 5 and reopened.lookup(131) == (130, 3001)
    reopened.check(log_size_bytes=5000)
    reopened.close()


def test_offset_index_fills_and_truncates(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "0.index", base_offset=0, max_index_bytes=24)
    for n in range(3):
        index.append(n * 2, n * 10 + 5)
    assert index.is_full
    with pytest.raises(AssertionError, match="full index"):
        index.append(100, 1000)
    index.truncate_to(2)
    assert index.entries == 1 and index.lookup(5) == (0, 5)
    index.close()


def test_offset_index_rejects_entries_that_do_not_increase(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "0.index", base_offset=0, max_index_bytes=80)
    index.append(10, 100)
    with pytest.raises(AssertionError, match="must increase"):
        index.append(5, 200)
    index.close()


@pytest.mark.parametrize(
    ("damage", "log_size"),
    [
        (b"\x00\x00\x00\x09\x00\x00\x00\x10" + b"\x00\x00\x00\x02\x00\x00\x00\x20", 1000),  # order
        (
            b"\x00\x00\x00\x01\x00\x00\x00\x10" + b"\x00\x00\x00\x02\x00\x00\x90\x00",
            1000,
        ),  # past end
    ],
)
def test_offset_index_check_finds_damage(tmp_path: Path, damage: bytes, log_size: int) -> None:
    path = tmp_path / "0.index"
    path.write_bytes(damage)
    index = OffsetIndex(path, base_offset=0, max_index_bytes=80)
    with pytest.raises(CorruptIndexError):
        index.check(log_size)
    index.close()


def test_index_of_partial_entries_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "0.index"
    path.write_bytes(b"\x00" * 13)
    with pytest.raises(CorruptIndexError, match="whole entries"):
        OffsetIndex(path, base_offset=0, max_index_bytes=80)


def test_time_index_keeps_timestamps_monotonic(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "0.timeindex", base_offset=50, max_index_bytes=120)
    index.maybe_append(1000, 50)
    index.maybe_append(900, 55)  # older timestamp: ignored
    index.maybe_append(2000, 60)
    index.maybe_append(2000, 61)  # same timestamp: ignored
    index.maybe_append(3000, 70)
    assert index.entries == 3
    assert index.lookup(500) == (-1, 50), "before the first entry: scan from the segment base"
    assert index.lookup(2500) == (2000, 60)
    assert index.last_entry() == (3000, 70)
    index.truncate_to(70)
    assert index.last_entry() == (2000, 60)
    index.check(next_offset=71)
    with pytest.raises(CorruptIndexError, match="past the segment"):
        index.check(next_offset=60)
    index.close()


def test_appends_after_truncation_and_reopen_follow_the_entries_kept(tmp_path: Path) -> None:
    """The last entry is kept in memory for the order checks: truncation and reopening must
    leave it equal to the last entry on disk, or valid appends would be refused."""
    index = OffsetIndex(tmp_path / "0.index", base_offset=0, max_index_bytes=80)
    for n in range(3):
        index.append(n * 10, n * 100 + 1)
    index.truncate_to(10)  # keeps 0@1
    index.append(5, 50)  # below the dropped 10@101 and 20@201
    with pytest.raises(AssertionError, match="must increase"):
        index.append(5, 60)
    index.trim()
    index.close()
    reopened = OffsetIndex(tmp_path / "0.index", base_offset=0, max_index_bytes=80)
    with pytest.raises(AssertionError, match="must increase"):
        reopened.append(4, 70)
    reopened.append(6, 70)
    assert list(reopened.raw_entries()) == [(0, 1), (5, 50), (6, 70)]
    reopened.truncate_to(0)
    reopened.append(0, 1)
    reopened.close()

    times = TimeIndex(tmp_path / "0.timeindex", base_offset=0, max_index_bytes=120)
    times.maybe_append(1000, 1)
    times.maybe_append(3000, 5)
    times.truncate_to(5)
    times.maybe_append(2000, 4)  # grows past what is left (1000), not past the dropped 3000
    assert times.last_entry() == (2000, 4)
    times.close()


def test_entries_across_pages_go_by_pwrite_then_into_the_map_and_survive_reopen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the first entry of each page is a pwrite (it gives the sparse page a block, so a
    full disk is an OSError, not SIGBUS); the rest of the page is stored into the map."""
    pwrites: list[int] = []
    real_pwrite = os.pwrite

    def counting_pwrite(fd: int, data: bytes, position: int) -> int:
        pwrites.append(position)
        return real_pwrite(fd, data, position)

    monkeypatch.setattr(os, "pwrite", counting_pwrite)
    per_page = mmap.PAGESIZE // 8
    index = OffsetIndex(tmp_path / "0.index", base_offset=0, max_index_bytes=3 * mmap.PAGESIZE)
    for n in range(2 * per_page + 5):
        index.append(n, n * 100)
    assert pwrites == [0, mmap.PAGESIZE, 2 * mmap.PAGESIZE]
    index.truncate_to(per_page + 2)  # entries of page 1 remain; page 1 keeps its block
    index.trim()
    index.append(per_page + 2, (per_page + 2) * 100)  # reopened for appending: pwrite first
    assert pwrites[-1] == (per_page + 2) * 8
    index.trim()  # as the segment does on close
    index.close()
    reopened = OffsetIndex(tmp_path / "0.index", base_offset=0, max_index_bytes=3 * mmap.PAGESIZE)
    assert reopened.entries == per_page + 3
    assert reopened.lookup(per_page + 1) == (per_page + 1, (per_page + 1) * 100)
    assert reopened.lookup(10**6) == (per_page + 2, (per_page + 2) * 100)
    reopened.close()


def _descriptors_of(path: Path) -> int:
    """This process's descriptors open on ``path`` (a map's duplicate included)."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            continue  # the listing's own descriptor, closed already
    return found


def test_an_index_holds_no_descriptor_of_its_own(tmp_path: Path) -> None:
    """Every partition has an active segment: with two descriptors per index (its own and its
    map's) a broker ran out of them at ~4,000 partitions. An empty index holds none, a mapped
    one only the map's, appending across pages included."""
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex(path, base_offset=0, max_index_bytes=64 * 1024)
    assert _descriptors_of(path) == 0  # empty: preallocated, not mapped yet
    assert path.stat().st_size == 64 * 1024
    index.trim()
    index.preallocate()  # what a segment becoming active does: still no map
    assert _descriptors_of(path) == 0 and path.stat().st_size == 64 * 1024
    assert index.lookup(5) == (0, 0)
    for n in range(1, 1500):  # three pages of entries: each page's first entry is a pwrite
        index.append(n, n * 100)
    assert _descriptors_of(path) == 1  # the map's own duplicate
    assert index.lookup(1000) == (1000, 100_000)
    index.trim()
    assert _descriptors_of(path) == 1
    index.close()
    assert _descriptors_of(path) == 0
    reopened = OffsetIndex(path, base_offset=0, max_index_bytes=64 * 1024)
    assert reopened.entries == 1499 and reopened.lookup(1499) == (1499, 149_900)
    reopened.append(1500, 150_000)  # appended to again: preallocated again, no descriptor kept
    assert _descriptors_of(path) == 1
    reopened.close()
