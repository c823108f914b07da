"""A log segment: ``<base offset, 20 digits>.log`` with its ``.index`` and ``.timeindex``, and a
``.txnindex`` of the transactions aborted in it once there is one (raftlog/txn.py).

Batches are appended back to back as bytes; the segment reads only their 61-byte headers. The
offset index gets an entry (batch last offset → position) whenever ``index.interval.bytes`` of log
have been written since the last one, the time index (largest timestamp so far → its offset)
at the same points and on roll. Recovery re-reads the whole file, checks every batch's CRC,
truncates at the first torn or corrupt batch, and rebuilds both indexes from what is left.

With ``preallocate`` (Kafka's topic config) a new active segment's file is given
``segment.bytes`` of blocks at once (``posix_fallocate``): appends then fill space the file
already has. ``size_bytes`` is always the logical size, the end of the last batch; the file is
cut back to it on roll and close (as Kafka trims), and after a crash the zeros past the last
batch are preallocated space, not a torn batch: loading and recovery cut them without
reporting data dropped (``RecoveryResult.preallocated_bytes``) while the log has
``preallocate``; without it zeros there are a torn write, cut and counted dropped.
"""

from __future__ import annotations

import errno
import os
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from raftlog.batch import HEADER_SIZE, BatchHeader, check_header, compute_crc, read_header
from raftlog.errors import CorruptRecordError, KafkaError
from raftlog.index import CorruptIndexError, OffsetIndex, TimeIndex
from raftlog.txn import TXN_INDEX_SUFFIX, TransactionIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"  # a segment retention took, its blocks not yet freed
SCAN_CHUNK_BYTES = 1024 * 1024
LOOKUP_CHUNK_BYTES = 64 * 1024
BATCH_ENDS_KEPT = 128  # a reader at the tail is a few batches behind at most
IOV_MAX = 1024
MAX_RELATIVE_OFFSET = 2**31 - 1


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


AppendedBatch = tuple[int, int, int]
"""What a segment keeps of a batch it appended: (last offset, max timestamp, size in bytes). A
plain tuple, not a NamedTuple: one is built per appended batch, and a tuple display is the
cheapest object Python builds."""


@dataclass(frozen=True)
class RecoveryResult:
    base_offset: int
    valid_bytes: int
    valid_batches: int
    dropped_bytes: int
    reason: str | None  # why the tail was dropped, None if nothing was
    preallocated_bytes: int = 0  # a zero tail cut (preallocated space a crash left untrimmed)
    # (partition leader epoch, base offset) of each batch whose epoch is above every earlier
    # one's in the segment: what the leader-epoch cache is rebuilt from (Log._load)
    epoch_starts: tuple[tuple[int, int], ...] = ()


class LogSegment:
    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_bytes: int,
        created_ms: int,
        suffix: str = "",
    ) -> None:
        """``suffix`` names a segment being built by the cleaner (``.cleaned``, ``.swap``)."""
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.suffix = suffix
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size_bytes = os.fstat(self._fd).st_size
        # Log.release_page_cache: bytes below the floor were advised out of the page cache (what
        # the file held when opened is left to the kernel); marks: (limit, first advised at ms)
        self._cache_floor = self.size_bytes
        self._cache_marks: deque[tuple[int, int]] = deque()
        os.lseek(self._fd, self.size_bytes, os.SEEK_SET)
        self.created_ms = created_ms
        self.offset_index, self.time_index = self._open_indexes(max_index_bytes)
        self.txn_index = TransactionIndex(self.path_for(TXN_INDEX_SUFFIX))
        self._max_index_bytes = max_index_bytes
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.rolling_timestamp: int | None = None  # first batch's max timestamp (segment.ms)
        self._bytes_since_index_entry = 0
        # next offset -> its position, after each of the last BATCH_ENDS_KEPT batches appended
        # here while active: a fetch that continues where the previous one ended (a follower,
        # a consumer at the tail) finds its batch without the index and the scan after it
        self._batch_ends: dict[int, int] = {}

    @property
    def log_path(self) -> Path:
        return self.path_for(LOG_SUFFIX)

    def path_for(self, file_suffix: str) -> Path:
        return self.directory / (segment_name(self.base_offset, file_suffix) + self.suffix)

    def paths(self) -> list[Path]:
        """The segment's files: the log first, then its indexes (the transaction index only
        once it exists: it is created with its first entry)."""
        paths = [self.path_for(s) for s in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)]
        return paths + ([self.txn_index.path] if self.txn_index.path.exists() else [])

    def _open_indexes(self, max_index_bytes: int) -> tuple[OffsetIndex, TimeIndex]:
        paths = [self.path_for(INDEX_SUFFIX), self.path_for(TIME_INDEX_SUFFIX)]
        self.indexes_were_missing = not all(path.exists() for path in paths)
        try:
            return OffsetIndex(paths[0], self.base_offset, max_index_bytes), TimeIndex(
                paths[1], self.base_offset, max_index_bytes
            )
        except CorruptIndexError:
            # A file of the wrong length cannot even be mapped: remove both and rebuild.
            self.indexes_were_missing = True
            for path in paths:
                path.unlink(missing_ok=True)
            return OffsetIndex(paths[0], self.base_offset, max_index_bytes), TimeIndex(
                paths[1], self.base_offset, max_index_bytes
            )

    # -- loading ---------------------------------------------------------------------------
    def load(self, *, preallocated: bool = False) -> None:
        """Take the indexes on trust after checking them (CorruptIndexError if they are bad),
        then find the segment's end by scanning headers after the last offset-index entry.
        ``preallocated`` (the log's ``preallocate``): zeros after the last batch are space a
        crash left untrimmed, cut here."""
        self.offset_index.check(self.size_bytes)
        last_offset, position = self.offset_index.lookup(2**63 - 1)
        if position == 0:
            last_offset = self.base_offset - 1
        time_entry = self.time_index.last_entry()
        if time_entry is not None:
            self.max_timestamp, self.offset_of_max_timestamp = time_entry
        end = position
        try:
            for scanned_position, header in self.iter_headers(position):
                if scanned_position == position and position and header.last_offset != last_offset:
                    raise CorruptRecordError(
                        f"index points at offset {last_offset}, "
                        f"the log has {header.last_offset} there"
                    )
                last_offset = header.last_offset
                self._observe_timestamp(header.max_timestamp, header.last_offset)
                end = scanned_position + header.size_bytes
        except CorruptRecordError as error:
            if not (preallocated and self._cut_zero_tail(end)):
                raise CorruptIndexError(f"{self.log_path}: {error.message}") from error
        self.next_offset = last_offset + 1
        self.time_index.check(self.next_offset)
        self._load_rolling_timestamp()

    def _load_rolling_timestamp(self) -> None:
        if self.size_bytes >= HEADER_SIZE:
            self.rolling_timestamp = read_header(os.pread(self._fd, HEADER_SIZE, 0)).max_timestamp

    def recover(self, *, preallocated: bool = False) -> RecoveryResult:
        """Rescan every batch (framing, CRC, offsets increasing), truncate at the first bad one,
        rebuild both indexes. Never raises for bad data: it reports what it dropped.
        ``preallocated`` (the log's ``preallocate``): a tail of zeros after the last batch is
        preallocated space, cut without counting it dropped (zeros are never a batch: a batch
        length of 0 is below the minimum). Without it zeros are a torn write, as any bytes."""
        self.offset_index.reset()
        self.time_index.reset()
        self.max_timestamp, self.offset_of_max_timestamp = -1, self.base_offset
        self._bytes_since_index_entry = 0
        next_offset, valid_bytes, valid_batches, reason = self.base_offset, 0, 0, None
        epoch_starts: list[tuple[int, int]] = []
        try:
            for position, header in self.iter_headers(0, verify_crc=True):
                if header.base_offset < next_offset or (
                    header.last_offset - self.base_offset > MAX_RELATIVE_OFFSET
                ):
                    raise CorruptRecordError(
                        f"batch at position {position} has base offset {header.base_offset}, "
                        f"expected at least {next_offset}"
                    )
                self._index_batch(
                    position, header.last_offset, header.max_timestamp, header.size_bytes
                )
                next_offset = header.next_offset
                valid_bytes = position + header.size_bytes
                valid_batches += 1
                if header.partition_leader_epoch > (epoch_starts[-1][0] if epoch_starts else -1):
                    epoch_starts.append((header.partition_leader_epoch, header.base_offset))
        except CorruptRecordError as error:
            reason = error.message
        zero_tail = self.size_bytes - valid_bytes
        if reason is not None and preallocated and self._cut_zero_tail(valid_bytes):
            reason = None  # preallocated space, not a torn batch: nothing was dropped
        else:
            zero_tail = 0
        dropped = self.size_bytes - valid_bytes
        if dropped:
            self._cut(valid_bytes)
        self.next_offset = next_offset
        self.txn_index.truncate_to(next_offset)  # aborts whose marker was cut off go with it
        self._load_rolling_timestamp()
        return RecoveryResult(
            self.base_offset, valid_bytes, valid_batches, dropped, reason, zero_tail,
            tuple(epoch_starts),
        )  # fmt: skip

    def _cut(self, size_bytes: int) -> None:
        os.ftruncate(self._fd, size_bytes)
        os.lseek(self._fd, size_bytes, os.SEEK_SET)
        self.size_bytes = size_bytes
        self._cache_floor = min(self._cache_floor, size_bytes)

    def _cut_zero_tail(self, position: int) -> bool:
        """If every byte from ``position`` to the file's end is zero (preallocated space a
        crash left: no batch starts with a zero length), cut the file there; whether it did."""
        end = self.size_bytes
        zeros = bytes(SCAN_CHUNK_BYTES)
        for start in range(position, end, SCAN_CHUNK_BYTES):
            chunk = os.pread(self._fd, min(SCAN_CHUNK_BYTES, end - start), start)
            if not chunk or chunk != zeros[: len(chunk)]:
                return False
        self._cut(position)
        return True

    # -- scanning --------------------------------------------------------------------------
    def iter_headers(
        self,
        start_position: int = 0,
        *,
        verify_crc: bool = False,
        chunk_bytes: int = SCAN_CHUNK_BYTES,
    ) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each batch from ``start_position`` to the end of the file,
        read in chunks. Raises CorruptRecordError at a torn or (with ``verify_crc``) bad batch."""
        end = self.size_bytes
        position = start_position
        buf, buf_start = b"", start_position
        while position < end:
            relative = position - buf_start
            if len(buf) - relative < HEADER_SIZE:
                buf, buf_start, relative = os.pread(self._fd, chunk_bytes, position), position, 0
            if len(buf) - relative < HEADER_SIZE:
                raise CorruptRecordError(f"torn batch header at position {position}")
            header = read_header(buf, relative)
            try:
                check_header(header, end - position)
            except CorruptRecordError:
                raise
            except KafkaError as error:  # a bad codec id or count: as corrupt as a bad length
                raise CorruptRecordError(f"{error.message} at position {position}") from error
            if verify_crc:
                if len(buf) - relative < header.size_bytes:
                    size = max(chunk_bytes, header.size_bytes)
                    buf, buf_start, relative = os.pread(self._fd, size, position), position, 0
                if compute_crc(buf, relative, header.batch_length) != header.crc:
                    raise CorruptRecordError(f"CRC mismatch in batch at position {position}")
            yield position, header
            position += header.size_bytes

    def translate_offset(self, offset: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch whose last offset is >= ``offset``."""
        start = self._batch_ends.get(offset)
        if start is not None:  # the batch after one that ended at offset - 1
            if start + HEADER_SIZE > self.size_bytes:
                return None
            header = read_header(os.pread(self._fd, HEADER_SIZE, start))
            check_header(header, self.size_bytes - start)
            return start, header
        _, start = self.offset_index.lookup(offset)
        for position, header in self.iter_headers(start, chunk_bytes=LOOKUP_CHUNK_BYTES):
            if header.last_offset >= offset:
                return position, header
        return None

    # -- appending -------------------------------------------------------------------------
    def append(
        self, chunks: Sequence[bytes | memoryview], batches: Sequence[AppendedBatch]
    ) -> None:
        """Write ``chunks`` (the batches' bytes, header rewrites included) at the end and index
        each batch. Offsets must continue the segment."""
        assert batches, "an append to a segment carries at least one batch"
        assert batches[0][0] >= self.next_offset, "offsets must continue the segment"
        start_position = position = self.size_bytes
        undo = self._append_state()
        try:
            if len(chunks) <= IOV_MAX:  # one writev: every append of up to IOV_MAX / 2 batches
                written = _write_all(self._fd, chunks)
            else:
                written = sum(
                    _write_all(self._fd, chunks[start : start + IOV_MAX])
                    for start in range(0, len(chunks), IOV_MAX)
                )
            if self.rolling_timestamp is None:
                self.rolling_timestamp = batches[0][1]
            for last_offset, max_timestamp, size_bytes in batches:
                self._index_batch(position, last_offset, max_timestamp, size_bytes)
                position += size_bytes
        except OSError:
            self._undo_append(start_position, undo)
            raise
        assert position - start_position == written, "batch sizes must add up to the bytes written"
        self.size_bytes = position
        self.next_offset = batches[-1][0] + 1

    def _append_state(self) -> tuple[int, int, int, int, int | None, int]:
        return (
            self.offset_index.entries,
            self.time_index.entries,
            self.max_timestamp,
            self.offset_of_max_timestamp,
            self.rolling_timestamp,
            self._bytes_since_index_entry,
        )

    def _undo_append(
        self, position: int, state: tuple[int, int, int, int, int | None, int]
    ) -> None:
        """Put the segment back as it was before a failed append (a full disk, an IO error):
        cut the bytes of a torn write, forget the index entries and timestamps it added. A
        torn batch left in place would sit under the next append's bytes, mid-log, where
        recovery would cut everything after it."""
        self._batch_ends.clear()
        offsets, times, self.max_timestamp, self.offset_of_max_timestamp = state[:4]
        self.rolling_timestamp, self._bytes_since_index_entry = state[4:]
        self.offset_index.truncate_entries(offsets)
        self.time_index.truncate_entries(times)
        os.ftruncate(self._fd, position)
        os.lseek(self._fd, position, os.SEEK_SET)

    def _index_batch(
        self, position: int, last_offset: int, max_timestamp: int, size_bytes: int
    ) -> None:
        if max_timestamp > self.max_timestamp:  # _observe_timestamp, inlined: once per batch
            self.max_timestamp, self.offset_of_max_timestamp = max_timestamp, last_offset
        if self._bytes_since_index_entry > self.index_interval_bytes:
            self.offset_index.append(last_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += size_bytes
        ends = self._batch_ends
        ends[last_offset + 1] = position + size_bytes
        if len(ends) > BATCH_ENDS_KEPT:
            del ends[next(iter(ends))]  # the oldest: dicts keep insertion order

    def _observe_timestamp(self, timestamp: int, offset: int) -> None:
        if timestamp > self.max_timestamp:
            self.max_timestamp, self.offset_of_max_timestamp = timestamp, offset

    def can_index_more(self) -> bool:
        """Neither index is full (checked before every append: no property calls)."""
        offset_index, time_index = self.offset_index, self.time_index
        return (
            offset_index.entries < offset_index.max_entries
            and time_index.entries < time_index.max_entries
        )

    # -- reading ---------------------------------------------------------------------------
    def plan_read(
        self, offset: int, max_bytes: int, max_offset: int, *, min_one_batch: bool
    ) -> ReadPlan | bool:
        """Where the batches from the one containing ``offset`` lie, for :func:`read_planned`
        to read without the log's lock: at most ``max_bytes`` unless ``min_one_batch`` and the
        first batch is larger. Nothing to read: whether this segment is done with (the caller
        may go on to the next), as a bool."""
        found = self.translate_offset(offset)
        if found is None:
            return True
        position, first = found
        if first.last_offset >= max_offset:
            return False
        whole_first = first.size_bytes > max_bytes
        if whole_first and not min_one_batch:
            return False
        length = first.size_bytes if whole_first else min(max_bytes, self.size_bytes - position)
        # A descriptor of its own: the segment may be deleted or closed (retention, compaction,
        # shutdown) before the read, and its number then reused by another file.
        return ReadPlan(
            os.dup(self._fd), position, length, position + length == self.size_bytes, whole_first
        )

    def plan_cache_release(self, limit: int, now_ms: int, retry_ms: int) -> CachedRange | None:
        """The range of this segment to release from the page cache, up to ``limit``: from the
        first byte not yet advised for ``retry_ms`` (a page still dirty at the first advice is
        dropped by a later one, once written back). With a descriptor of its own, as
        :meth:`plan_read`'s: :func:`release_cached` runs without the log's lock."""
        marks = self._cache_marks
        while marks and now_ms - marks[0][1] >= retry_ms:
            self._cache_floor = max(self._cache_floor, marks.popleft()[0])
        floor, limit = min(self._cache_floor, self.size_bytes), min(limit, self.size_bytes)
        if limit <= floor:
            return None
        advised_to = max(floor, marks[-1][0]) if marks else floor
        if limit > advised_to:
            marks.append((limit, now_ms))
        # The kernel drops only whole folios inside the range: starting at a boundary of the
        # largest one, the folio holding the last call's end is dropped by this call.
        start = floor - floor % CACHE_RELEASE_ALIGN
        return CachedRange(os.dup(self._fd), start, limit - start, max(0, limit - advised_to))

    @property
    def cache_released(self) -> bool:
        """Every byte of this segment was advised out of the page cache, retries done."""
        return not self._cache_marks and self._cache_floor >= self.size_bytes

    def read_raw(self, position: int, size_bytes: int) -> bytes:
        return os.pread(self._fd, size_bytes, position)

    def find_offset_by_timestamp(self, timestamp: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch whose max timestamp is >= ``timestamp``."""
        _, offset = self.time_index.lookup(timestamp)
        _, start = self.offset_index.lookup(offset)
        for position, header in self.iter_headers(start, chunk_bytes=LOOKUP_CHUNK_BYTES):
            if header.max_timestamp >= timestamp:
                return position, header
        return None

    # -- truncation, roll, flush, close ------------------------------------------------------
    def truncate_to(self, offset: int) -> int:
        """Drop every batch whose last offset is >= ``offset``; return the bytes dropped."""
        found = self.translate_offset(offset)
        if found is None:
            return 0
        position, header = found
        dropped = self.size_bytes - position
        self._batch_ends.clear()
        os.ftruncate(self._fd, position)
        os.lseek(self._fd, position, os.SEEK_SET)
        self.size_bytes = position
        # what is appended next, where the cut bytes were, is released like any other
        self._cache_floor = min(self._cache_floor, position)
        self._cache_marks = deque((min(limit, position), at) for limit, at in self._cache_marks)
        self.offset_index.truncate_to(header.base_offset)
        self.time_index.truncate_to(header.base_offset)
        self.txn_index.truncate_to(header.base_offset)
        self.max_timestamp, self.offset_of_max_timestamp = -1, self.base_offset
        self.rolling_timestamp = None
        # The end is what a reload would find (the last batch's next offset, or the base when
        # empty), never ``offset`` itself: inside a compaction gap that would not survive a restart.
        self.load()
        self._bytes_since_index_entry = 0
        return dropped

    def on_roll(self) -> None:
        """This segment stops taking appends: final time-index entry, indexes trimmed, the
        remembered batch ends dropped (only the active segment keeps them: a broker with many
        partitions and segments holds ``BATCH_ENDS_KEPT`` entries per partition)."""
        self._batch_ends.clear()
        if self.max_timestamp >= 0 and not self.time_index.is_full:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
        self.offset_index.trim()
        self.time_index.trim()
        self.trim()

    def on_become_active(self, preallocate_bytes: int = 0) -> None:
        """Appends go here next: indexes at their full length, and with ``preallocate_bytes``
        (``preallocate``: segment.bytes) an empty file given that many bytes of blocks, as
        Kafka preallocates only a new segment's file. A disk that cannot hold them fails the
        roll (ENOSPC), the file left empty."""
        self.offset_index.preallocate()
        self.time_index.preallocate()
        if preallocate_bytes > 0 and self.size_bytes == 0:
            try:
                os.posix_fallocate(self._fd, 0, preallocate_bytes)
            except OSError:
                os.ftruncate(self._fd, 0)
                raise

    def trim(self) -> None:
        """Cut preallocated space past the last batch (on roll and close)."""
        if os.fstat(self._fd).st_size > self.size_bytes:
            os.ftruncate(self._fd, self.size_bytes)

    def flush(self) -> None:
        os.fsync(self._fd)
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def close(self, *, trim_log: bool = True) -> None:
        """Trim the files to their contents and close them; again: nothing. Without
        ``trim_log`` the log file keeps its preallocated space (``Log.abandon``: a crash)."""
        if self._fd < 0:
            return
        self.offset_index.trim()
        self.time_index.trim()
        if trim_log:
            self.trim()
        self.offset_index.close()
        self.time_index.close()
        os.close(self._fd)
        self._fd = -1

    def delete(self) -> None:
        """Close and unlink the files (a reader's own descriptor keeps reading them)."""
        self.close()
        for path in self.paths():
            path.unlink(missing_ok=True)

    def mark_deleted(self) -> None:
        """Rename the files to ``*.deleted`` (Kafka's way): gone from the log's directory at once,
        their blocks freed by :meth:`delete` later (``file.delete.delay.ms``, and outside the
        log's lock). A log that opens deletes any ``*.deleted`` file a crash left."""
        for path in self.paths():
            try:
                os.rename(path, path.with_name(path.name + DELETED_SUFFIX))
            except FileNotFoundError:
                continue
        self.suffix += DELETED_SUFFIX
        self.offset_index.path = self.path_for(INDEX_SUFFIX)
        self.time_index.path = self.path_for(TIME_INDEX_SUFFIX)
        self.txn_index.path = self.path_for(TXN_INDEX_SUFFIX)

    def delete_indexes_and_close(self) -> None:
        """The offset and time indexes (rebuilt from the log); the transaction index stays."""
        self.close()
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            self.path_for(suffix).unlink(missing_ok=True)

    def last_modified_ms(self) -> int:
        return os.fstat(self._fd).st_mtime_ns // 1_000_000

    def largest_timestamp_ms(self) -> int:
        """What retention.ms compares: the largest record timestamp, or the file's mtime."""
        return self.max_timestamp if self.max_timestamp >= 0 else self.last_modified_ms()


class ReadPlan(NamedTuple):
    """A range of a segment to read: a duplicate of its descriptor, which the read closes."""

    fd: int
    position: int
    length: int
    ends_segment: bool  # the range reached the segment's end when it was planned
    whole_first: bool  # the range is the first batch alone (larger than max_bytes)


CACHE_RELEASE_ALIGN = 2 * 1024 * 1024  # the largest page-cache folio on x86-64 (a PMD)


class CachedRange(NamedTuple):
    """A range of a segment whose page-cache pages to release: a duplicate of its descriptor,
    which the releaser closes."""

    fd: int
    position: int
    length: int
    first_bytes: int  # of them, the bytes advised for the first time


def release_cached(cached: CachedRange) -> None:
    """``posix_fadvise(POSIX_FADV_DONTNEED)`` on the range: Linux starts writing back its
    dirty pages (without waiting for them) and drops those that are clean, so a range is gone
    from the cache after a later call, once written back. Advice: the data on disk, and every
    read of it, is the same either way."""
    os.posix_fadvise(cached.fd, cached.position, cached.length, os.POSIX_FADV_DONTNEED)


def read_planned(plan: ReadPlan, max_offset: int) -> tuple[bytes, bool]:
    """Read a planned range (no lock held: a read that waits for a page under writeback holds
    up no append) and keep its whole batches that end below ``max_offset``; also whether that
    reached the segment's end. Bytes a concurrent truncation took are not returned: a batch
    cut short ends the read."""
    try:
        data = os.pread(plan.fd, plan.length, plan.position)
    finally:
        os.close(plan.fd)
    if plan.whole_first:
        if len(data) < plan.length:
            return b"", False
        return data, plan.ends_segment
    end = 0
    while len(data) - end >= HEADER_SIZE:
        header = read_header(data, end)
        if end + header.size_bytes > len(data) or header.last_offset >= max_offset:
            break
        end += header.size_bytes
    reached_end = plan.ends_segment and end == plan.length
    return (data if end == len(data) else data[:end]), reached_end


def _write_all(fd: int, chunks: Sequence[bytes | memoryview]) -> int:
    """Write every chunk at the file's position; return the bytes written (all of them)."""
    total = sum(map(len, chunks))
    written = os.writev(fd, chunks)
    if written == total:
        return total
    # A short write (disk nearly full, a signal): finish it, or fail loudly with ENOSPC's error.
    remaining = memoryview(b"".join(chunks))[written:]
    for _ in range(len(remaining)):
        if not remaining:
            return total
        remaining = remaining[os.write(fd, remaining) :]
    raise OSError(errno.EIO, f"write to fd {fd} made no progress with {len(remaining)} bytes left")
