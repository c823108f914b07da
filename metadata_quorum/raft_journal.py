"""The metadata quorum's Raft journal: pysyncobj's file format, written with ``pwrite`` into space
reserved first, so a full disk is an error the voter handles, never a SIGBUS that kills it.

Why not pysyncobj's own journal
-------------------------------
pysyncobj 0.3.17's ``FileJournal`` writes through ``mmap``: it grows the file with ``ftruncate``
(``mmap.resize``), which allocates nothing, then stores records into the mapped pages. On a full
filesystem the first store into a page with no block behind it is a SIGBUS, and the controller
process dies in the middle of a record. Here nothing is mapped: every record is written with
``pwrite``, which reports ENOSPC (or EIO) as an ``OSError``, and the file is grown beforehand with
``posix_fallocate`` (`reservation_sizes`: a chunk at a time, or just the record's pages when a
chunk no longer fits), so a full disk shows at the reservation, before any byte of the record is
written. A failed write changes nothing: the in-memory entries and the header's end offset move
only after the record is on the file, so the journal stays what it was and the error goes to
`metadata_quorum.raft`, which stops the voter serving until space returns (docs/quorum.md).

The format is pysyncobj's (its journal.py), so journals written by either read in both: name
24 bytes, version 8, format u32, end offset u32, then records ``[u32 size][u64 index][u64 term]
[command][u32 size]``; the end offset is the first byte after the last record. Its meta file
(``<journal>.meta``: term, vote, commit index) is a protocol-2 pickle of a dict, written to a
temporary and renamed (`raftlog.checkpoint.write_atomically`, which removes a temporary a full
disk left half-written). pysyncobj reads it with pickle too; the file is this node's own.

The meta file is rewritten about once a second while the commit index moves, and every rewrite
carries the term and vote too. With ``sync_meta`` (RaftOptions.fsync) the temporary is fsynced
before its rename, so whichever name a power cut leaves holds a whole file: a rename of
unsynced data could otherwise survive as an empty file and lose the term and vote. The
directory is not fsynced per rewrite: losing the rename of a commit-index update only leaves
the previous, whole file; a new term or vote is made durable (file and directory) by
`metadata_quorum.raft` before any message that relies on it leaves. Nothing is written in a
second in which nothing changed.

This module imports nothing from pysyncobj: `metadata_quorum.raft` installs `RaftJournal` as
pysyncobj's journal (its ``createJournal``).
"""

from __future__ import annotations

import errno
import logging
import os
import pickle
import struct
from pathlib import Path
from typing import Any

from raftlog.checkpoint import write_atomically

logger = logging.getLogger(__name__)

NAME = b"PYSYNCOBJ"
NAME_BYTES = 24
VERSION_BYTES = 8
FORMAT_VERSION = 1
END_POSITION = 36  # the u32 end offset in the header
HEADER_BYTES = 40
PAGE_BYTES = 4096
RESERVE_CHUNK_BYTES = 1 << 20  # the journal grows by this much at a time while it fits
_SIZE = struct.Struct("<I")
_POSITION = struct.Struct("<QQ")  # index, term
_META_PICKLE_PROTOCOL = 2  # pysyncobj's
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

Entry = tuple[bytes, int, int]  # pysyncobj's log entry: (command, index, term)


def read_meta(path: Path) -> dict[str, Any]:
    """The meta file's dict (term, vote, commit index); empty if there is none. ValueError if
    it does not unpickle to a dict (this node's own file: pickle, as pysyncobj reads it)."""
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        meta = pickle.loads(blob) if blob else {}
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as error:
        raise ValueError(f"{path} does not unpickle: {error}") from error
    if not isinstance(meta, dict):
        raise ValueError(f"{path} holds a {type(meta).__name__}, not a dict")
    return dict(meta)


class JournalWriteError(OSError):
    """A write to the journal or its meta file failed; ``errno`` is the cause's (ENOSPC: the
    disk is full). The journal is unchanged by the failed call."""


def is_disk_full(error: BaseException) -> bool:
    """ENOSPC or EDQUOT: no space for this process on the filesystem (it may come back)."""
    return isinstance(error, OSError) and error.errno in _FULL_ERRNOS


def round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def reservation_sizes(allocated_bytes: int, needed_bytes: int, chunk_bytes: int) -> tuple[int, ...]:
    """The file sizes to grow to, in the order to try, so that the file's first ``needed_bytes``
    are allocated: empty when they already are; else the next multiple of ``chunk_bytes`` (few
    allocations, little fragmentation), then, if that does not fit, just the pages needed (the
    journal keeps working until the record itself no longer fits)."""
    if chunk_bytes <= 0 or chunk_bytes % PAGE_BYTES:
        raise ValueError(f"the reservation chunk is a positive multiple of {PAGE_BYTES} bytes")
    if needed_bytes <= allocated_bytes:
        return ()
    roomy = round_up(needed_bytes, chunk_bytes)
    tight = round_up(needed_bytes, PAGE_BYTES)
    return (roomy, tight) if roomy > tight else (tight,)


def encode_record(command: bytes, index: int, term: int) -> bytes:
    body = _POSITION.pack(index, term) + command
    size = _SIZE.pack(len(body))
    return size + body + size


def encode_header(app_version: bytes) -> bytes:
    if len(app_version) >= VERSION_BYTES:
        raise ValueError(f"a journal version is under {VERSION_BYTES} bytes: {app_version!r}")
    name = NAME + b"\0" * (NAME_BYTES - len(NAME))
    version = app_version + b"\0" * (VERSION_BYTES - len(app_version))
    return name + version + struct.pack("<II", FORMAT_VERSION, HEADER_BYTES)


def decode_records(data: bytes) -> tuple[list[Entry], list[int]]:
    """The entries below the header's end offset and each one's byte offset (the file was
    repaired before: `metadata_quorum.raft._repair_journal`)."""
    (end,) = _SIZE.unpack_from(data, END_POSITION)
    end = min(end, len(data))
    entries, offsets, offset = [], [], HEADER_BYTES
    while offset + _SIZE.size <= end:
        (size,) = _SIZE.unpack_from(data, offset)
        if offset + 2 * _SIZE.size + size > end:
            break
        index, term = _POSITION.unpack_from(data, offset + _SIZE.size)
        command = data[offset + _SIZE.size + _POSITION.size : offset + _SIZE.size + size]
        entries.append((command, index, term))
        offsets.append(offset)
        offset += size + 2 * _SIZE.size
    return entries, offsets


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _command_bytes(command: Any) -> bytes:
    return command.encode() if isinstance(command, str) else bytes(command)


class RaftJournal:
    """pysyncobj's ``Journal`` interface (add, delete, meta) over one file descriptor.

    Invariants: ``_end`` is the header's end offset and the end of the last record in
    ``_entries``; ``_offsets[i]`` is where entry ``i`` starts; every byte below ``_allocated``
    was reserved by this process or existed when the file was opened (writes into holes of an
    older, sparse journal still report ENOSPC as an error, never a signal)."""

    def __init__(
        self, path: Path, app_version: bytes, chunk_bytes: int = RESERVE_CHUNK_BYTES
    ) -> None:
        reservation_sizes(0, 1, chunk_bytes)  # checks the chunk
        self.path = path
        self._chunk_bytes = chunk_bytes
        self._meta_path = path.with_name(path.name + ".meta")
        if not path.exists():
            write_atomically(path, encode_header(app_version), durable=False)
        self._fd = os.open(path, os.O_RDWR)
        try:
            data = path.read_bytes()
            if len(data) < HEADER_BYTES or not data.startswith(NAME):
                raise OSError(errno.EINVAL, f"{path} is not a pysyncobj journal")
            self._entries, self._offsets = decode_records(data)
        except BaseException:
            os.close(self._fd)
            raise
        self._end = self._record_end(len(self._entries))
        self._allocated = len(data)
        self._meta: dict[str, Any] = self._load_meta()
        self._meta_saved = True
        self.sync_meta = True  # fsync a meta file's data before its rename (see the module doc)
        self._closed = False

    # -- entries -----------------------------------------------------------------------------
    def add(self, command: Any, idx: int, term: int) -> None:
        record = encode_record(_command_bytes(command), idx, term)
        start = self._end
        self._write(start, record)
        self._set_end(start + len(record))
        self._entries.append((command, idx, term))
        self._offsets.append(start)

    def clear(self) -> None:
        self._set_end(HEADER_BYTES)
        self._entries, self._offsets = [], []

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        if entryFrom >= len(self._entries):
            return
        self._set_end(self._record_end(entryFrom))
        del self._entries[entryFrom:], self._offsets[entryFrom:]

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Keep the entries from ``entryTo`` on, rewritten from the start of the file in place
        (as pysyncobj does: no space is needed, which matters on a full disk). A write that
        fails half-way leaves the file unlike the entries held here: never "disk full", always
        an error that stops the voter (at its restart the repair cuts the torn rewrite)."""
        kept = self._entries[entryTo:]
        records = [encode_record(_command_bytes(c), i, t) for c, i, t in kept]
        offsets, offset = [], HEADER_BYTES
        for record in records:
            offsets.append(offset)
            offset += len(record)
        try:
            self._write(HEADER_BYTES, b"".join(records))
            self._set_end(offset)
        except JournalWriteError as error:
            message = f"{self.path}: rewriting the journal failed part-way ({error.strerror})"
            raise JournalWriteError(errno.EIO, message) from error
        self._entries, self._offsets = kept, offsets

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    # -- space -------------------------------------------------------------------------------
    def reserve_headroom(self) -> None:
        """Reserve one chunk past the end of the log (or raise, ENOSPC): the probe of a voter
        waiting for space, which serves again only when a chunk fits, not a single record."""
        self._reserve(self._end + self._chunk_bytes, tight=False)

    def _reserve(self, needed_bytes: int, *, tight: bool = True) -> None:
        sizes = reservation_sizes(self._allocated, needed_bytes, self._chunk_bytes)
        for size in sizes if tight else sizes[:1]:
            try:
                os.posix_fallocate(self._fd, self._allocated, size - self._allocated)
            except OSError as error:
                self._allocated = max(self._allocated, os.fstat(self._fd).st_size)
                if is_disk_full(error) and size != sizes[-1] and tight:
                    continue
                raise JournalWriteError(error.errno, f"{self.path}: {error.strerror}") from error
            self._allocated = size
            return

    def _write(self, offset: int, data: bytes) -> None:
        self._reserve(offset + len(data))
        try:
            _pwrite_all(self._fd, data, offset)
        except OSError as error:
            raise JournalWriteError(error.errno, f"{self.path}: {error.strerror}") from error

    def _set_end(self, end: int) -> None:
        try:
            _pwrite_all(self._fd, _SIZE.pack(end), END_POSITION)
        except OSError as error:
            raise JournalWriteError(error.errno, f"{self.path}: {error.strerror}") from error
        self._end = end

    def _record_end(self, count: int) -> int:
        """Where the record after the first ``count`` entries starts."""
        if count < len(self._offsets):
            return self._offsets[count]
        if not self._offsets:
            return HEADER_BYTES
        command, _, _ = self._entries[-1]
        return self._offsets[-1] + len(encode_record(_command_bytes(command), 0, 0))

    def fileno(self) -> int:
        return self._fd

    def flush(self) -> None:
        os.fdatasync(self._fd)

    @property
    def closed(self) -> bool:
        return self._closed

    def _destroy(self) -> None:
        """Close (pysyncobj's last step when a node stops); again: nothing. The sync here is a
        courtesy: what was acknowledged was synced before (with fsync on), so a failure is
        reported, not raised into pysyncobj's stopping thread."""
        if self._closed:
            return
        self._closed = True
        try:
            os.fdatasync(self._fd)
        except OSError as error:
            logger.warning("%s: the sync at close failed: %s", self.path, error)
        finally:
            os.close(self._fd)

    # -- meta (term, vote, commit index) ----------------------------------------------------
    def _load_meta(self) -> dict[str, Any]:
        try:
            return read_meta(self._meta_path)
        except ValueError as error:
            logger.warning("%s: term and vote start empty, as pysyncobj's journal does",
                           error)  # fmt: skip
            return {}

    def store_meta(self) -> None:
        """Write the meta file (a temporary, with ``sync_meta`` fsynced, then renamed; the
        directory is fsynced by the caller when the term or vote changed); raises
        JournalWriteError, the meta then stays unsaved and is written again by the next call
        or timer."""
        blob = pickle.dumps(self._meta, protocol=_META_PICKLE_PROTOCOL)
        try:
            write_atomically(self._meta_path, blob, durable=False, sync_data=self.sync_meta)
        except OSError as error:
            raise JournalWriteError(error.errno, f"{self._meta_path}: {error.strerror}") from error
        self._meta_saved = True

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self._meta["raftCommitIndex"] = raftCommitIndex
        self._meta_saved = False

    def getRaftCommitIndex(self) -> int:
        return int(self._meta.get("raftCommitIndex", 1))

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        """Raft needs the term and the vote durable before a message reflecting them leaves:
        stored now (metadata_quorum.raft fsyncs it before such a message)."""
        self._meta["currentTerm"] = term
        self._meta["votedForNodeId"] = votedForNodeId
        self._meta_saved = False
        self.store_meta()

    def getCurrentTerm(self) -> int:
        return int(self._meta.get("currentTerm", 0))

    def getVotedForNodeId(self) -> Any:
        return self._meta.get("votedForNodeId")

    def onOneSecondTimer(self) -> None:
        if not self._meta_saved:
            self.store_meta()
