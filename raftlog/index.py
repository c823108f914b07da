"""Sparse, memory-mapped, preallocated indexes of a segment, as Kafka's ``AbstractIndex``.

``.index``     entries of (relative offset i32, position i32): the last offset of a batch and the
               byte position of that batch in the ``.log`` file.
``.timeindex`` entries of (timestamp i64, relative offset i32): the largest timestamp seen so far in
               the segment and the offset of the record that carried it.

A new index file is preallocated to ``segment.index.bytes`` (rounded down to whole entries); on
roll or close it is trimmed to its entries, so a closed index's length says how many entries it has.
An index is a cache of the log: :meth:`check` finds a damaged one, and the segment rebuilds it.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from raftlog.errors import StorageError


class CorruptIndexError(Exception):
    """An index that does not agree with itself or with its log; the segment rebuilds it."""


class _IndexFile:
    """Entries of a fixed struct in a preallocated, memory-mapped file, searched by key."""

    ENTRY: ClassVar[struct.Struct]

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._entry_size = self.ENTRY.size
        self.max_entries = max_index_bytes // self._entry_size
        if self.max_entries < 1:
            raise StorageError(f"segment.index.bytes {max_index_bytes} holds no index entry")
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        length = os.fstat(self._fd).st_size
        self._mmap: mmap.mmap | None = None
        # The last entry, kept beside the file so an append checks order without reading it back
        # (_last_unread: not read from the map yet, see _last).
        self._last_entry: tuple[int, int] | None = None
        self._last_unread = False
        # The end of the page(s) the last pwrite put an entry in (within the map): they have
        # blocks now, so stores into the map below it cannot fault for space (see _append_raw).
        # 0: none since this file was opened or resized.
        self._stores_until = 0
        if length == 0:
            # Preallocated, and mapped only at the first append: an empty index (a partition
            # that never had a record) holds no descriptor and no map.
            self.entries = 0
            os.ftruncate(self._fd, self.max_entries * self._entry_size)
            os.close(self._fd)
            self._fd = -1
        else:
            if length % self._entry_size:
                self.entries = 0
                raise CorruptIndexError(f"{path}: length {length} is not whole entries")
            self.entries = length // self._entry_size
            self._map(length)
            self._last_unread = True

    @property
    def _last(self) -> tuple[int, int] | None:
        """The last entry, read from the map at its first use after opening. A crash leaves the
        active segment's indexes preallocated, a hole after their entries, and recovery rebuilds
        them without a look at it; reading the last entry at open faulted in the hole's last
        page, and the kernel's read-around zero-filled 4 MiB with it: 1.7 ms a file on ext4,
        19.5 s of the 29 s a broker with 3,000 partitions took to open its logs after a
        SIGKILL."""
        if self._last_unread:
            self._last_unread = False
            self._last_entry = self._raw(self.entries - 1) if self.entries else None
        return self._last_entry

    # -- file management -------------------------------------------------------------------
    def _map(self, length: int) -> None:
        """Map ``length`` bytes and close the descriptor (Kafka closes the file once its index
        is mapped): the map needs none, and the rare writes that do (the first entry of each
        page, a resize) open the file for the call. Python's map keeps a duplicate of its own,
        so a segment holds three descriptors (log, two maps); it held five while active, and
        with an active segment per partition a broker ran out of descriptors at ~4,000
        partitions (``ulimit -n`` 20,000 here)."""
        self._mmap = mmap.mmap(self._fd, length) if length else None
        os.close(self._fd)
        self._fd = -1

    def _resize(self, length: int, *, mapped: bool = False) -> None:
        """Set the file's length; map it if it has entries or ``mapped`` (an append is next).
        An empty index stays unmapped: a partition that never had a record holds no map and
        no descriptor for it (its active segment's preallocation comes here too)."""
        self._stores_until = 0  # past a truncation, a page may be a hole again
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        os.ftruncate(self._file(), length)
        if self.entries or mapped:
            self._map(length)
        else:
            os.close(self._fd)
            self._fd = -1

    def _file(self) -> int:
        """The descriptor, opened again if :meth:`_map` closed it."""
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDWR)
        return self._fd

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    @property
    def size_bytes(self) -> int:
        return self.entries * self._entry_size

    def preallocate(self) -> None:
        """Give an index reopened for appending its full preallocated length again."""
        self._resize(max(self.max_entries, self.entries) * self._entry_size)

    def trim(self) -> None:
        """Shrink the file to its entries (on roll and close)."""
        self._resize(self.entries * self._entry_size)

    def flush(self) -> None:
        if self._mmap is not None:
            self._mmap.flush()

    def close(self) -> None:
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def reset(self) -> None:
        """Drop every entry (before a rebuild), keeping the preallocated length."""
        self.truncate_entries(0)
        self.preallocate()

    # -- entries ---------------------------------------------------------------------------
    def _raw(self, n: int) -> tuple[int, int]:
        assert self._mmap is not None and 0 <= n < self.entries, "index entry out of range"
        key, value = self.ENTRY.unpack_from(self._mmap, n * self._entry_size)
        return key, value

    def _append_raw(self, key: int, value: int) -> None:
        entries = self.entries
        assert entries < self.max_entries, f"{self.path}: append to a full index"
        position = entries * self._entry_size
        end = position + self._entry_size
        if end <= self._stores_until:
            # A page an earlier pwrite gave a block: a store cannot need space (Kafka's way,
            # and no system call: one append of a 16 KiB batch writes an entry per index).
            assert self._mmap is not None, "_stores_until is 0 without a map"
            self.ENTRY.pack_into(self._mmap, position, key, value)
        else:
            # The first entry of a page goes by pwrite, not a store into the map: the file is
            # sparse, and on a full disk a store that needs a new block is SIGBUS, where pwrite
            # is an ENOSPC OSError. The map is MAP_SHARED over the same page cache, so lookups
            # see the entry at once.
            if self._mmap is None or len(self._mmap) < end:
                # an index trimmed on roll or close appended to again, or the first entry
                self._resize(max(self.max_entries, entries) * self._entry_size, mapped=True)
            assert self._mmap is not None, "preallocated above"
            fd = self._file()
            try:
                os.pwrite(fd, self.ENTRY.pack(key, value), position)
            finally:
                os.close(fd)
                self._fd = -1
            page_end = ((end - 1) // mmap.PAGESIZE + 1) * mmap.PAGESIZE
            self._stores_until = min(page_end, len(self._mmap))
        self.entries = entries + 1
        self._last_entry, self._last_unread = (key, value), False

    def truncate_entries(self, entries: int) -> None:
        self.entries = max(0, min(entries, self.entries))
        self._last_entry = self._raw(self.entries - 1) if self.entries else None
        self._last_unread = False

    def _search(self, key: int, column: int) -> int:
        """Index of the last entry whose ``column`` is <= key, or -1."""
        low, high = 0, self.entries - 1
        found = -1
        while low <= high:
            middle = (low + high) // 2
            if self._raw(middle)[column] <= key:
                found = middle
                low = middle + 1
            else:
                high = middle - 1
        return found

    def raw_entries(self) -> Iterator[tuple[int, int]]:
        if self._mmap is None or self.entries == 0:
            return iter(())
        view = memoryview(self._mmap)[: self.entries * self._entry_size]
        return self.ENTRY.iter_unpack(view)


class OffsetIndex(_IndexFile):
    """(relative offset → position) of batches, one entry per ``index.interval.bytes``."""

    ENTRY = struct.Struct(">ii")

    def append(self, offset: int, position: int) -> None:
        relative = offset - self.base_offset
        last = self._last
        assert last is None or (relative > last[0] and position > last[1]), (
            f"{self.path}: index entries must increase ({offset}@{position} after "
            f"{self.base_offset + last[0]}@{last[1]})"
        )
        self._append_raw(relative, position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry at or below ``offset``; (base, 0) if none."""
        n = self._search(offset - self.base_offset, 0)
        if n < 0:
            return self.base_offset, 0
        relative, position = self._raw(n)
        return self.base_offset + relative, position

    def truncate_to(self, offset: int) -> None:
        """Drop entries for offsets at or above ``offset``."""
        self.truncate_entries(self._search(offset - self.base_offset - 1, 0) + 1)

    def check(self, log_size_bytes: int) -> None:
        """Raise CorruptIndexError unless entries strictly increase and stay inside the log."""
        entries = list(self.raw_entries())
        relatives = [relative for relative, _ in entries]
        positions = [position for _, position in entries]
        _check_increasing(self.path, relatives, strict=True)
        _check_increasing(self.path, positions, strict=True)
        if entries and (relatives[0] < 0 or positions[-1] >= log_size_bytes):
            raise CorruptIndexError(
                f"{self.path}: entry {entries[-1]} is outside the log of {log_size_bytes} bytes"
            )


class TimeIndex(_IndexFile):
    """(largest timestamp so far → relative offset of the record that carried it)."""

    ENTRY = struct.Struct(">qi")

    def last_entry(self) -> tuple[int, int] | None:
        """(timestamp, offset) of the last entry."""
        last = self._last
        if last is None:
            return None
        timestamp, relative = last
        return timestamp, self.base_offset + relative

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Append unless the timestamp does not grow (Kafka keeps the time index monotonic)."""
        relative = offset - self.base_offset
        last = self._last
        if last is not None:
            if timestamp <= last[0]:
                return
            assert relative >= last[1], f"{self.path}: time index offsets must not go down"
        self._append_raw(timestamp, relative)

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) of the last entry with timestamp <= ``timestamp``; the segment's
        base offset if none: the batch holding ``timestamp`` is at or after that offset."""
        n = self._search(timestamp, 0)
        if n < 0:
            return -1, self.base_offset
        found_timestamp, relative = self._raw(n)
        return found_timestamp, self.base_offset + relative

    def truncate_to(self, offset: int) -> None:
        """Drop entries pointing at offsets at or above ``offset``."""
        keep = 0
        for n, (_, relative) in enumerate(self.raw_entries()):
            if self.base_offset + relative >= offset:
                break
            keep = n + 1
        self.truncate_entries(keep)

    def check(self, next_offset: int) -> None:
        entries = list(self.raw_entries())
        _check_increasing(self.path, [timestamp for timestamp, _ in entries], strict=True)
        relatives = [relative for _, relative in entries]
        _check_increasing(self.path, relatives, strict=False)
        if entries and (relatives[0] < 0 or self.base_offset + relatives[-1] >= next_offset):
            raise CorruptIndexError(
                f"{self.path}: entry {entries[-1]} points past the segment's end {next_offset}"
            )


def _check_increasing(path: Path, values: list[int], *, strict: bool) -> None:
    """C-speed monotonicity check of a whole index column."""
    if values != sorted(values) or (strict and len(set(values)) != len(values)):
        raise CorruptIndexError(f"{path}: entries are out of order")
