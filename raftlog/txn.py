"""Transactions in the log, in Kafka's bytes: commit/abort markers and the transaction index.

**Markers.** A transaction ends with a control batch on every partition it wrote: the batch has
the transactional and control attribute bits, the producer's id and epoch, and one record whose
key is ``version (int16) = 0, type (int16)`` (0 abort, 1 commit) and whose value is
``version (int16) = 0, coordinator epoch (int32)`` (Kafka's ``EndTransactionMarker``).

**The transaction index** (``<base offset>.txnindex`` beside a segment, Kafka's
``TransactionIndex``): one 34-byte entry per transaction *aborted* by a marker in that segment,
``version (int16) = 0, producer id (int64), first offset (int64), last offset (int64), last
stable offset (int64)``, in the order of their markers. A read_committed fetch of ``[start,
end)`` returns the aborted transactions whose range meets it, so the consumer drops their records.
The file is created with the first entry, kept in memory (it is small: aborted transactions only)
and appended to; a torn tail entry (a crash mid-write) is cut at load.
"""

from __future__ import annotations

import enum
import heapq
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from raftlog.batch import HEADER_SIZE, BatchHeader, read_header
from raftlog.checkpoint import write_atomically
from raftlog.errors import CorruptRecordError, InvalidRecordError
from raftlog.records import Buffer, Record, decode_batch, encode_batch

TXN_INDEX_SUFFIX = ".txnindex"
CONTROL_KEY = struct.Struct(">hh")  # version, type
CONTROL_VALUE = struct.Struct(">hi")  # version, coordinator epoch
CONTROL_VERSION = 0
ENTRY = struct.Struct(">hqqqq")  # version, producer id, first, last, last stable offset
ENTRY_VERSION = 0


class ControlType(enum.IntEnum):
    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True)
class Marker:
    """A parsed commit or abort marker."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int


def encode_marker(
    producer_id: int,
    producer_epoch: int,
    *,
    commit: bool,
    coordinator_epoch: int,
    timestamp_ms: int,
) -> bytes:
    """The control batch that ends the producer's transaction on one partition."""
    kind = ControlType.COMMIT if commit else ControlType.ABORT
    record = Record(
        offset=-1,
        timestamp=timestamp_ms,
        key=CONTROL_KEY.pack(CONTROL_VERSION, kind),
        value=CONTROL_VALUE.pack(CONTROL_VERSION, coordinator_epoch),
    )
    return encode_batch(
        [record], producer_id=producer_id, producer_epoch=producer_epoch,
        is_transactional=True, is_control=True,
    )  # fmt: skip


def read_marker(buf: Buffer, position: int = 0) -> Marker:
    """The marker of the control batch at ``position`` (CRC checked). INVALID_RECORD if the
    batch is not a transaction marker."""
    header = read_header(buf, position)
    if not (header.is_control and header.is_transactional):
        raise InvalidRecordError(f"the batch at offset {header.base_offset} is not a marker")
    _, records = decode_batch(buf, position)
    if len(records) != 1 or records[0].key is None or len(records[0].key) < CONTROL_KEY.size:
        raise InvalidRecordError("a marker holds one control record with a key")
    _, kind = CONTROL_KEY.unpack_from(records[0].key)
    if kind not in (ControlType.ABORT, ControlType.COMMIT):
        raise InvalidRecordError(f"unknown control record type {kind}")
    value = records[0].value or b""
    epoch = CONTROL_VALUE.unpack_from(value)[1] if len(value) >= CONTROL_VALUE.size else -1
    return Marker(header.producer_id, header.producer_epoch, kind == ControlType.COMMIT, epoch)


@dataclass(frozen=True, order=True)
class AbortedTxn:
    """One aborted transaction: its producer, the offsets of its first batch and of its abort
    marker, and the partition's last stable offset once it ended."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def __post_init__(self) -> None:
        if not 0 <= self.first_offset <= self.last_offset:
            raise ValueError(
                f"an aborted transaction spans {self.first_offset}..{self.last_offset}"
            )


class TransactionIndex:
    """The ``.txnindex`` file of one segment (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[AbortedTxn] = []
        self.torn_bytes = 0  # cut from the tail at load
        if path.exists():
            self._load()

    def _load(self) -> None:
        data = self.path.read_bytes()
        whole = len(data) - len(data) % ENTRY.size
        for position in range(0, whole, ENTRY.size):
            version, producer_id, first, last, lso = ENTRY.unpack_from(data, position)
            if version != ENTRY_VERSION or not 0 <= first <= last:
                raise CorruptRecordError(
                    f"{self.path}: entry {position // ENTRY.size} is not an aborted transaction"
                )
            self.entries.append(AbortedTxn(producer_id, first, last, lso))
        if whole != len(data):  # a torn tail: an entry that was never acknowledged
            self.torn_bytes = len(data) - whole
            os.truncate(self.path, whole)

    def append(self, entry: AbortedTxn) -> None:
        """Add the transaction an abort marker ended; markers come in offset order."""
        if self.entries and entry.last_offset <= self.entries[-1].last_offset:
            raise ValueError(
                f"{self.path}: an abort at {entry.last_offset} after one at "
                f"{self.entries[-1].last_offset}"
            )
        packed = ENTRY.pack(ENTRY_VERSION, entry.producer_id, entry.first_offset,
                            entry.last_offset, entry.last_stable_offset)  # fmt: skip
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, packed)
        finally:
            os.close(fd)
        self.entries.append(entry)

    def collect(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """The aborted transactions that meet ``[start_offset, end_offset)``."""
        return [
            e for e in self.entries if e.last_offset >= start_offset and e.first_offset < end_offset
        ]

    def truncate_to(self, offset: int) -> None:
        """Forget the aborts whose marker is at ``offset`` or later (the log is cut there)."""
        kept = [e for e in self.entries if e.last_offset < offset]
        if len(kept) == len(self.entries):
            return
        self.entries = kept
        self._rewrite()

    def _rewrite(self) -> None:
        data = b"".join(
            ENTRY.pack(ENTRY_VERSION, e.producer_id, e.first_offset, e.last_offset,
                       e.last_stable_offset)
            for e in self.entries
        )  # fmt: skip
        write_atomically(self.path, data, durable=False)  # a full disk leaves the old index

    def flush(self) -> None:
        if self.path.exists():
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def aborted_in(indexes: Iterable[TransactionIndex], start: int, end: int) -> list[AbortedTxn]:
    """The aborted transactions of several segments' indexes that meet ``[start, end)``, by
    first offset (what a read_committed fetch returns)."""
    found = {e for index in indexes for e in index.collect(start, end)}
    return sorted(found, key=lambda e: (e.first_offset, e.last_offset))


def aborted_data_batches(
    records: Buffer, aborted: Iterable[tuple[int, int]]
) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each data batch of ``records`` (whole batches in offset order, as a
    read returns them) that belongs to an aborted transaction; ``aborted``: (first offset,
    producer id) of each, as a read_committed fetch lists them. Kafka's consumer rule
    (``CompletedFetch``), shared by raftlog's read_committed consumer and share groups: walking
    in offset order, a producer enters the *aborting* set when its aborted transaction's first
    offset is reached, its transactional data batches are aborted while it is in the set, and
    its abort marker takes it out again, so its later transactions are read. Headers only, no
    CRC check: the batches were checked when they were stored."""
    pending = sorted(aborted)  # a sorted list is a heap already
    if not pending:
        return
    aborting: set[int] = set()
    position = 0
    while len(records) - position >= HEADER_SIZE:
        header = read_header(records, position)
        if header.producer_id >= 0:
            while pending and pending[0][0] <= header.last_offset:
                aborting.add(heapq.heappop(pending)[1])
            if header.is_control:
                if _is_abort_marker(records, position):
                    aborting.discard(header.producer_id)
            elif header.is_transactional and header.producer_id in aborting:
                yield position, header
        position += header.size_bytes


def _is_abort_marker(records: Buffer, position: int) -> bool:
    """Whether the control batch at ``position`` is an abort marker (a control record of
    another type is no marker: Kafka ignores unknown control types)."""
    try:
        return not read_marker(records, position).commit
    except InvalidRecordError:
        return False
