"""Idempotent producer state of one partition: per producer id, its epoch and the sequence
ranges and offsets of its last five batches (Kafka's ``ProducerStateManager``).

:class:`ProducerStates` is pure: it sees batch headers, never records or files. A leader calls
:meth:`~ProducerStates.check` before it appends a batch that carries a producer id, and
:meth:`~ProducerStates.update` after; a follower only updates. Producers silent for
``producer.id.expiration.ms`` are dropped (:meth:`~ProducerStates.remove_expired`).

Snapshots, as Kafka's: ``<offset, 20 digits>.snapshot`` in the partition directory holds the
state as of that offset (every batch below it counted, none at or above it), so opening a replica
reads the newest snapshot at or below its log end and rescans only the batch headers after it.
:func:`encode_snapshot` / :func:`decode_snapshot` are the pure codec (version, CRC-32C, offset,
then the entries); :class:`SnapshotFiles` is the IO edge: it lists, writes (atomically), loads
(the newest valid one; a corrupt or torn file is deleted and the next older one tried) and
deletes the files. When they are written and dropped is the partition's business
(:mod:`dataplane.broker.partition`).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import deque
from collections.abc import ItemsView, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from raftlog.batch import (
    BATCHES_KEPT,
    NO_PRODUCER_ID,
    SEQUENCE_MAX,
    BatchHeader,
    next_sequence,
)
from raftlog.checkpoint import fsync_path, write_atomically
from raftlog.errors import ErrorCode, KafkaError, StorageError
from raftlog.segment import segment_name

log = logging.getLogger(__name__)
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 1
_VERSION_CRC = struct.Struct(">hI")  # version, CRC-32C of every byte after these two fields
_OFFSET_COUNT = struct.Struct(">qi")  # the snapshot's offset, the number of producers
_ENTRY = struct.Struct(">qhb")  # producer id, producer epoch, batches that follow (1..5)
_BATCH = struct.Struct(">iiqqq")  # first and last sequence, first and last offset, max timestamp
SNAPSHOT_PRODUCERS_MAX = 10_000_000  # bounds a count read from disk before it is trusted


@dataclass(frozen=True, slots=True)
class BatchRange:
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    producer_epoch: int
    batches: deque[BatchRange] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))

    @property
    def last_timestamp(self) -> int:
        """The max timestamp of the producer's last batch (Kafka's ``lastTimestamp``)."""
        return self.batches[-1].max_timestamp if self.batches else -1


def _range(header: BatchHeader) -> BatchRange:
    return BatchRange(
        header.base_sequence,
        next_sequence(header.base_sequence, header.last_offset_delta),
        header.base_offset,
        header.base_offset + header.last_offset_delta,
        header.max_timestamp,
    )


class OutOfOrderSequenceError(KafkaError):
    """OUT_OF_ORDER_SEQUENCE_NUMBER. ``ahead``: the batch starts past the expected sequence
    (within half the sequence space), so the batches in between may still come: a concurrent
    request it overtook. Behind it, it overlaps what is stored and no wait can mend it."""

    def __init__(self, header: BatchHeader, expected: int) -> None:
        super().__init__(
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            f"producer {header.producer_id} epoch {header.producer_epoch}: sequence "
            f"{header.base_sequence}, expected {expected}",
        )
        gap = (header.base_sequence - expected) % (SEQUENCE_MAX + 1)
        self.ahead = 0 < gap <= SEQUENCE_MAX // 2


class ProducerStates:
    def __init__(self, producers: dict[int, ProducerEntry] | None = None) -> None:
        self._producers: dict[int, ProducerEntry] = producers if producers is not None else {}

    def __len__(self) -> int:
        return len(self._producers)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def items(self) -> ItemsView[int, ProducerEntry]:
        return self._producers.items()

    def check(self, header: BatchHeader) -> BatchRange | None:
        """Validate a batch the leader is about to append. Returns the stored range when the
        batch is a retry of one of the last five (answer with its original offsets, append
        nothing); None when it is the next in sequence; raises INVALID_PRODUCER_EPOCH for a
        fenced epoch, :class:`OutOfOrderSequenceError` for a gap."""
        if header.producer_id == NO_PRODUCER_ID:
            return None
        entry = self._producers.get(header.producer_id)
        if entry is None:
            # The producer's first batch here must start its sequence: a later batch that
            # overtook it (concurrent requests arrive in any order) waits for it.
            if header.base_sequence != 0:
                raise OutOfOrderSequenceError(header, expected=0)
            return None
        if header.producer_epoch < entry.producer_epoch:
            raise KafkaError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {header.producer_id} epoch {header.producer_epoch} is older than "
                f"{entry.producer_epoch}",
            )
        if header.producer_epoch > entry.producer_epoch:
            if header.base_sequence != 0:
                raise OutOfOrderSequenceError(header, expected=0)
            return None
        last = _range(header)
        for stored in entry.batches:
            if (stored.first_sequence, stored.last_sequence) == (
                last.first_sequence,
                last.last_sequence,
            ):
                return stored
        expected = next_sequence(entry.batches[-1].last_sequence) if entry.batches else None
        if expected is not None and header.base_sequence != expected:
            raise OutOfOrderSequenceError(header, expected)
        return None

    def update(self, header: BatchHeader) -> None:
        """Record a batch now in the log (its header carries its offsets)."""
        if header.producer_id == NO_PRODUCER_ID:
            return
        entry = self._producers.get(header.producer_id)
        if entry is None or header.producer_epoch != entry.producer_epoch:
            entry = ProducerEntry(header.producer_epoch)
            self._producers[header.producer_id] = entry
        entry.batches.append(_range(header))

    def update_all(self, headers: Iterable[BatchHeader]) -> None:
        """Record batches in log order (a rescan of the log after a snapshot)."""
        for header in headers:
            self.update(header)

    def remove_expired(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers whose last batch is ``producer.id.expiration.ms`` old (Kafka's
        ``removeExpiredProducers``); return how many."""
        expired = [
            producer_id
            for producer_id, entry in self._producers.items()
            if now_ms - entry.last_timestamp >= expiration_ms
        ]
        for producer_id in expired:
            del self._producers[producer_id]
        return len(expired)


# -- snapshots ------------------------------------------------------------------------------
class CorruptSnapshotError(StorageError):
    """A snapshot file that does not decode: torn, damaged, or not the offset its name says."""


def encode_snapshot(offset: int, states: ProducerStates) -> bytes:
    """The state as of ``offset``: version i16, CRC-32C u32, offset i64, producer count i32,
    then per producer its id i64, epoch i16, batch count i8 and each batch's sequences and
    offsets (i32, i32, i64, i64) and max timestamp i64, oldest first. Big-endian, as Kafka's."""
    parts = [_OFFSET_COUNT.pack(offset, len(states))]
    for producer_id, entry in states.items():
        parts.append(_ENTRY.pack(producer_id, entry.producer_epoch, len(entry.batches)))
        parts += [
            _BATCH.pack(b.first_sequence, b.last_sequence, b.first_offset, b.last_offset,
                        b.max_timestamp)
            for b in entry.batches
        ]  # fmt: skip
    body = b"".join(parts)
    return _VERSION_CRC.pack(SNAPSHOT_VERSION, crc32c.crc32c(body)) + body


def decode_snapshot(data: bytes, offset: int) -> ProducerStates:
    """The state a snapshot file of ``offset`` holds; CorruptSnapshotError unless every byte
    checks out (version, CRC, offset, counts within bounds, batches below the offset)."""
    if len(data) < _VERSION_CRC.size + _OFFSET_COUNT.size:
        raise CorruptSnapshotError(f"{len(data)} bytes is shorter than a snapshot header")
    version, crc = _VERSION_CRC.unpack_from(data)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"version {version}, expected {SNAPSHOT_VERSION}")
    body = memoryview(data)[_VERSION_CRC.size :]
    if crc32c.crc32c(body) != crc:
        raise CorruptSnapshotError("CRC mismatch")
    stored_offset, count = _OFFSET_COUNT.unpack_from(body)
    if stored_offset != offset or not 0 <= count <= SNAPSHOT_PRODUCERS_MAX:
        raise CorruptSnapshotError(f"offset {stored_offset} (named {offset}), {count} producers")
    producers: dict[int, ProducerEntry] = {}
    position = _OFFSET_COUNT.size
    try:
        for _ in range(count):
            producer_id, epoch, batch_count = _ENTRY.unpack_from(body, position)
            position += _ENTRY.size
            if not 1 <= batch_count <= BATCHES_KEPT or producer_id in producers:
                raise CorruptSnapshotError(f"producer {producer_id}: {batch_count} batches")
            entry = ProducerEntry(epoch)
            for _ in range(batch_count):
                entry.batches.append(BatchRange(*_BATCH.unpack_from(body, position)))
                position += _BATCH.size
            if entry.batches[-1].last_offset >= offset:
                raise CorruptSnapshotError(
                    f"producer {producer_id} has a batch at {offset} or above"
                )
            producers[producer_id] = entry
    except struct.error as error:
        raise CorruptSnapshotError(f"torn at byte {position}: {error}") from error
    if position != len(body):
        raise CorruptSnapshotError(f"{len(body) - position} bytes after the last producer")
    return ProducerStates(producers)


class SnapshotFiles:
    """The ``<offset>.snapshot`` files of one partition directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._unsynced: set[Path] = set()  # written with durable=False, not yet fsynced

    def path(self, offset: int) -> Path:
        return self.directory / segment_name(offset, SNAPSHOT_SUFFIX)

    def offsets(self) -> list[int]:
        """The offsets of the snapshots on disk, oldest first."""
        stems = (
            p.name[: -len(SNAPSHOT_SUFFIX)] for p in self.directory.glob(f"*{SNAPSHOT_SUFFIX}")
        )
        return sorted(int(stem) for stem in stems if stem.isdigit())

    def write(self, offset: int, states: ProducerStates, *, durable: bool = True) -> None:
        """``durable=False``: no fsync now (the append path on a roll, under the partition's
        lock); :meth:`sync` does it later, off that path."""
        path = self.path(offset)
        write_atomically(path, encode_snapshot(offset, states), durable=durable)
        if not durable:
            with self._lock:
                self._unsynced.add(path)

    def sync(self) -> None:
        """fsync the snapshots written without it, then the directory. One deleted meanwhile
        is skipped: only what exists needs to be durable."""
        with self._lock:
            pending, self._unsynced = self._unsynced, set()
        for path in sorted(pending):
            try:
                fsync_path(path)
            except FileNotFoundError:
                continue
        if pending:
            fsync_path(self.directory)

    def load_latest(self, max_offset: int) -> tuple[int, ProducerStates] | None:
        """The newest valid snapshot at or below ``max_offset``: (its offset, its state). A
        corrupt one is deleted (as Kafka does) and the next older one tried."""
        for offset in reversed(self.offsets()):
            if offset > max_offset:
                continue
            path = self.path(offset)
            try:
                return offset, decode_snapshot(path.read_bytes(), offset)
            except FileNotFoundError:
                continue  # dropped by retention meanwhile
            except CorruptSnapshotError as error:
                log.warning("%s: %s; deleted, using an older one or the log", path, error.message)
                path.unlink(missing_ok=True)
        return None

    def delete_above(self, offset: int) -> None:
        """After a truncation to ``offset``: the snapshots of the removed history go, durably
        (a snapshot that came back after a crash would describe batches no longer there)."""
        doomed = [o for o in self.offsets() if o > offset]
        for stale in doomed:
            self.path(stale).unlink(missing_ok=True)
        if doomed:
            fsync_path(self.directory)

    def delete_below(self, log_start_offset: int) -> None:
        """The log start moved (retention deleted segments): their snapshots go with them, but
        the newest snapshot always stays, so producers whose batches are all gone are still
        known (Kafka keeps it for the same reason)."""
        for offset in self.offsets()[:-1]:
            if offset < log_start_offset:
                self.path(offset).unlink(missing_ok=True)

    def delete_all(self) -> None:
        for offset in self.offsets():
            self.path(offset).unlink(missing_ok=True)
        fsync_path(self.directory)
