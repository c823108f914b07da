"""Producer state of one partition: per producer id, its epoch, the sequence ranges and offsets
of its last five batches, and its open transaction (Kafka's ``ProducerStateManager``).

:class:`ProducerStates` is pure: it sees batch headers and parsed markers, never files. A leader
calls :meth:`~ProducerStates.check` before it appends a batch that carries a producer id (or
:meth:`~ProducerStates.check_marker` before a commit/abort marker), and
:meth:`~ProducerStates.update` after; a follower only updates. Producers silent for
``producer.id.expiration.ms`` are dropped (:meth:`~ProducerStates.remove_expired`), but never one
with an open transaction (Kafka's rule: its marker is still to come).

Transactions, as Kafka tracks them. A producer's first transactional data batch opens its
transaction here (``current_txn_first_offset``); its marker closes it. The open transactions are
kept by first offset; a closed one stays *unreplicated* until the high watermark passes its
marker (Kafka's ``unreplicatedTxns``), so :meth:`~ProducerStates.first_unstable_offset` is exact:
the first offset of the earliest transaction that is open, or closed by a marker a new leader
might not have. The partition's last stable offset (LSO) is that or the high watermark, whichever
is lower. An abort marker yields the :class:`~raftlog.txn.AbortedTxn` for the segment's
``.txnindex``, with the LSO of that moment (the first offset of the next open transaction of
another producer, else the marker's offset + 1).

Transaction verification (KIP-890 part 1): before the first transactional batch of a producer
with no open transaction here, the leader asks the transaction coordinator whether the
transaction is ongoing. :meth:`~ProducerStates.start_verification` hands out a
:class:`VerificationGuard` for that question; a marker of the producer voids it, so a batch whose
transaction ended while the answer was on its way is refused (Kafka's ``VerificationGuard``).

Snapshots, as Kafka's: ``<offset, 20 digits>.snapshot`` in the partition directory holds the
state as of that offset (every batch below it counted, none at or above it), so opening a replica
reads the newest snapshot at or below its log end and rescans only the batches after it.
:func:`encode_snapshot` / :func:`decode_snapshot` are the pure codec (version, CRC-32C, offset,
then the entries; version 2 adds each producer's open transaction, coordinator epoch and last
timestamp, and allows a producer with no batches; version 1 files still decode);
:class:`SnapshotFiles` is the IO edge: it lists, writes (atomically), loads (the newest valid
one; a corrupt or torn file is deleted and the next older one tried) and deletes the files. When
they are written and dropped is the partition's business (:mod:`dataplane.broker.partition`).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import deque
from collections.abc import Callable, Collection, ItemsView, Iterable
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
from raftlog.errors import ErrorCode, InvalidRecordError, KafkaError, StorageError
from raftlog.segment import segment_name
from raftlog.txn import AbortedTxn, Marker

log = logging.getLogger(__name__)
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 2
_VERSION_CRC = struct.Struct(">hI")  # version, CRC-32C of every byte after these two fields
_OFFSET_COUNT = struct.Struct(">qi")  # the snapshot's offset, the number of producers
_ENTRY_V1 = struct.Struct(">qhb")  # producer id, producer epoch, batches that follow (1..5)
# version 2: producer id, epoch, batches that follow (0..5), last timestamp, coordinator epoch,
# first offset of the open transaction (-1: none)
_ENTRY = struct.Struct(">qhbqiq")
_BATCH = struct.Struct(">iiqqq")  # first and last sequence, first and last offset, max timestamp
SNAPSHOT_PRODUCERS_MAX = 10_000_000  # bounds a count read from disk before it is trusted
NO_TXN = -1  # current_txn_first_offset of a producer with no open transaction
NO_COORDINATOR_EPOCH = -1


@dataclass(frozen=True, slots=True)
class BatchRange:
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    """One producer. ``last_timestamp``: the max timestamp of its last batch or marker (Kafka's
    ``lastTimestamp``, what expiry measures); ``coordinator_epoch``: that of its last marker;
    ``current_txn_first_offset``: the first offset of its open transaction here, or NO_TXN."""

    producer_epoch: int
    batches: deque[BatchRange] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))
    last_timestamp: int = -1
    coordinator_epoch: int = NO_COORDINATOR_EPOCH
    current_txn_first_offset: int = NO_TXN

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1

    def bump_epoch(self, producer_epoch: int) -> None:
        """A new epoch restarts the sequence: the old epoch's batches are forgotten (the open
        transaction and coordinator epoch stay, as in Kafka's ``maybeUpdateProducerEpoch``)."""
        if producer_epoch != self.producer_epoch:
            self.producer_epoch = producer_epoch
            self.batches.clear()


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


class VerificationGuard:
    """A token for one verification of one producer's transaction with its coordinator (Kafka's
    ``VerificationGuard``): compared by identity. :data:`SENTINEL` is what a produce carries
    when it asked nothing because the producer's transaction was open here when it looked."""

    __slots__ = ("producer_epoch", "started_ms")

    def __init__(self, producer_epoch: int, started_ms: int) -> None:
        self.producer_epoch = producer_epoch
        self.started_ms = started_ms


SENTINEL = VerificationGuard(-1, -1)


def _invalid_epoch(producer_id: int, epoch: int, current: int, what: str) -> KafkaError:
    return KafkaError(
        ErrorCode.INVALID_PRODUCER_EPOCH,
        f"producer {producer_id}: {what} epoch {epoch} is older than {current}",
    )


class ProducerStates:
    def __init__(self, producers: dict[int, ProducerEntry] | None = None) -> None:
        self._producers: dict[int, ProducerEntry] = producers if producers is not None else {}
        # first offset -> producer id of each open transaction, in first-offset order (appends
        # come in offset order; a loaded state is sorted once)
        self._ongoing: dict[int, int] = dict(sorted(
            (entry.current_txn_first_offset, producer_id)
            for producer_id, entry in self._producers.items()
            if entry.current_txn_first_offset != NO_TXN
        ))  # fmt: skip
        # first offset -> marker offset of each closed transaction the high watermark has not
        # passed yet (few: only the markers of the last moments)
        self._unreplicated: dict[int, int] = {}
        self._verifications: dict[int, VerificationGuard] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def items(self) -> ItemsView[int, ProducerEntry]:
        return self._producers.items()

    # -- the leader's checks ---------------------------------------------------------------------
    def check(
        self, header: BatchHeader, verification: VerificationGuard | None = None
    ) -> BatchRange | None:
        """Validate a data batch the leader is about to append. Returns the stored range when
        the batch is a retry of one of the last five (answer with its original offsets, append
        nothing); None when it is the next in sequence; raises INVALID_PRODUCER_EPOCH for a
        fenced epoch, :class:`OutOfOrderSequenceError` for a gap, INVALID_TXN_STATE for a plain
        batch of a producer inside a transaction, or a transactional one that would open a
        transaction without ``verification`` matching this producer's (None: not verified);
        INVALID_RECORD for a control batch (markers come through :meth:`update` only)."""
        if header.producer_id == NO_PRODUCER_ID:
            return None
        if header.is_control:
            raise InvalidRecordError("clients may not write control batches")
        entry = self._producers.get(header.producer_id)
        stored = self._check_sequence(header, entry)
        if stored is None:
            self._check_transaction(header, entry, verification)
        return stored

    def _check_sequence(
        self, header: BatchHeader, entry: ProducerEntry | None
    ) -> BatchRange | None:
        if entry is None:
            # The producer's first batch here must start its sequence: a later batch that
            # overtook it (concurrent requests arrive in any order) waits for it.
            if header.base_sequence != 0:
                raise OutOfOrderSequenceError(header, expected=0)
            return None
        if header.producer_epoch < entry.producer_epoch:
            raise _invalid_epoch(header.producer_id, header.producer_epoch,
                                 entry.producer_epoch, "batch")  # fmt: skip
        if header.producer_epoch > entry.producer_epoch or not entry.batches:
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
        expected = next_sequence(entry.batches[-1].last_sequence)
        if header.base_sequence != expected:
            raise OutOfOrderSequenceError(header, expected)
        return None

    def _check_transaction(
        self,
        header: BatchHeader,
        entry: ProducerEntry | None,
        verification: VerificationGuard | None,
    ) -> None:
        in_txn = entry is not None and entry.current_txn_first_offset != NO_TXN
        if not header.is_transactional:
            if in_txn:
                raise KafkaError(
                    ErrorCode.INVALID_TXN_STATE,
                    f"producer {header.producer_id} sent a non-transactional batch inside its "
                    "transaction",
                )
            return
        if verification is None or self.has_ongoing_transaction(
            header.producer_id, header.producer_epoch
        ):
            return
        stored = self._verifications.get(header.producer_id)
        if (
            verification is SENTINEL
            or stored is not verification
            or verification.producer_epoch != header.producer_epoch
        ):
            raise KafkaError(
                ErrorCode.INVALID_TXN_STATE,
                f"producer {header.producer_id} epoch {header.producer_epoch}: the batch is not "
                "part of an ongoing transaction (its transaction ended, or was never verified)",
            )

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """Validate a commit/abort marker the leader is about to append (Kafka's
        ``appendEndTxnMarker``): INVALID_PRODUCER_EPOCH for an epoch older than the producer's,
        TRANSACTION_COORDINATOR_FENCED for a coordinator epoch older than its last marker's."""
        entry = self._producers.get(producer_id)
        if entry is None:
            return
        if producer_epoch < entry.producer_epoch:
            raise _invalid_epoch(producer_id, producer_epoch, entry.producer_epoch, "marker")
        if coordinator_epoch < entry.coordinator_epoch:
            raise KafkaError(
                ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                f"producer {producer_id}: a marker of coordinator epoch {coordinator_epoch}, "
                f"older than {entry.coordinator_epoch}",
            )

    # -- transactions --------------------------------------------------------------------------
    def has_ongoing_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        entry = self._producers.get(producer_id)
        return (
            entry is not None
            and entry.current_txn_first_offset != NO_TXN
            and entry.producer_epoch == producer_epoch
        )

    def start_verification(
        self, producer_id: int, producer_epoch: int, now_ms: int
    ) -> VerificationGuard:
        """The guard for asking the coordinator about this producer's transaction. A pending
        guard of the same epoch is shared (Kafka's ``maybeCreateVerificationStateEntry``): the
        first batches of a transaction reach a partition concurrently (up to five in flight),
        and each must find the guard it was verified under. One of another epoch is replaced
        (its batch, if it comes, is refused)."""
        pending = self._verifications.get(producer_id)
        if pending is not None and pending.producer_epoch == producer_epoch:
            return pending
        guard = VerificationGuard(producer_epoch, now_ms)
        self._verifications[producer_id] = guard
        return guard

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of the earliest open transaction or of the earliest closed one whose
        marker is not yet below ``high_watermark`` (those are forgotten here); None if none."""
        if self._unreplicated:
            self._unreplicated = {
                first: marker for first, marker in self._unreplicated.items()
                if marker >= high_watermark
            }  # fmt: skip
        first = min(self._unreplicated, default=None)
        ongoing = next(iter(self._ongoing), None)
        if first is None or (ongoing is not None and ongoing < first):
            return ongoing
        return first

    def open_transactions(self) -> list[tuple[int, int]]:
        """(first offset, producer id) of each open transaction, by first offset."""
        return list(self._ongoing.items())

    # -- updates -------------------------------------------------------------------------------
    def update(self, header: BatchHeader, marker: Marker | None = None) -> AbortedTxn | None:
        """Record a batch now in the log (its header carries its offsets); a control batch comes
        with its ``marker``. Returns the aborted transaction an abort marker ended, for the
        transaction index (None otherwise, and for a marker of a producer with no open
        transaction: nothing of it is in this partition)."""
        if header.producer_id == NO_PRODUCER_ID:
            return None
        if header.is_control:
            if marker is None:
                raise AssertionError(f"the control batch at {header.base_offset} needs its marker")
            return self._end_transaction(header, marker)
        entry = self._producers.get(header.producer_id)
        if entry is None:
            entry = self._producers[header.producer_id] = ProducerEntry(header.producer_epoch)
        entry.bump_epoch(header.producer_epoch)
        entry.batches.append(_range(header))
        entry.last_timestamp = header.max_timestamp
        if header.is_transactional and entry.current_txn_first_offset == NO_TXN:
            entry.current_txn_first_offset = header.base_offset
            self._ongoing[header.base_offset] = header.producer_id
            self._verifications.pop(header.producer_id, None)  # used: the transaction is open
        return None

    def _end_transaction(self, header: BatchHeader, marker: Marker) -> AbortedTxn | None:
        producer_id, offset = header.producer_id, header.base_offset
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = self._producers[producer_id] = ProducerEntry(header.producer_epoch)
        entry.bump_epoch(max(entry.producer_epoch, header.producer_epoch))
        entry.coordinator_epoch = marker.coordinator_epoch
        entry.last_timestamp = header.max_timestamp
        self._verifications.pop(producer_id, None)  # a verification of before the marker is void
        first_offset = entry.current_txn_first_offset
        if first_offset == NO_TXN:
            return None
        entry.current_txn_first_offset = NO_TXN
        del self._ongoing[first_offset]
        self._unreplicated[first_offset] = offset
        if marker.commit:
            return None
        last_stable_offset = next(iter(self._ongoing), offset + 1)
        return AbortedTxn(producer_id, first_offset, offset, last_stable_offset)

    def update_all(
        self,
        headers: Iterable[BatchHeader],
        marker_of: Callable[[BatchHeader], Marker] | None = None,
    ) -> list[AbortedTxn]:
        """Record batches in log order (a rescan of the log after a snapshot); ``marker_of``
        reads the marker of a control batch. Returns the aborted transactions met."""
        aborted: list[AbortedTxn] = []
        for header in headers:
            marker = None
            if header.is_control and header.producer_id != NO_PRODUCER_ID:
                if marker_of is None:
                    raise AssertionError("a rescan that meets a marker needs marker_of")
                marker = marker_of(header)
            found = self.update(header, marker)
            if found is not None:
                aborted.append(found)
        return aborted

    def remove_expired(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers whose last batch or marker is ``producer.id.expiration.ms`` old,
        but none with an open transaction (Kafka's ``removeExpiredProducers``), and
        verifications as old; return how many producers."""
        expired = [
            producer_id
            for producer_id, entry in self._producers.items()
            if entry.current_txn_first_offset == NO_TXN
            and now_ms - entry.last_timestamp >= expiration_ms
        ]
        for producer_id in expired:
            del self._producers[producer_id]
        stale = [
            producer_id
            for producer_id, guard in self._verifications.items()
            if now_ms - guard.started_ms >= expiration_ms
        ]
        for producer_id in stale:
            del self._verifications[producer_id]
        return len(expired)


# -- snapshots ------------------------------------------------------------------------------
class CorruptSnapshotError(StorageError):
    """A snapshot file that does not decode: torn, damaged, or not the offset its name says."""


def encode_snapshot(offset: int, states: ProducerStates) -> bytes:
    """The state as of ``offset`` (version 2): version i16, CRC-32C u32, offset i64, producer
    count i32, then per producer its id i64, epoch i16, batch count i8, last timestamp i64,
    coordinator epoch i32, first offset of its open transaction i64 (-1: none), and each
    batch's sequences and offsets (i32, i32, i64, i64) and max timestamp i64, oldest first.
    Big-endian, as Kafka's."""
    parts = [_OFFSET_COUNT.pack(offset, len(states))]
    for producer_id, entry in states.items():
        parts.append(_ENTRY.pack(
            producer_id, entry.producer_epoch, len(entry.batches), entry.last_timestamp,
            entry.coordinator_epoch, entry.current_txn_first_offset,
        ))  # fmt: skip
        parts += [
            _BATCH.pack(b.first_sequence, b.last_sequence, b.first_offset, b.last_offset,
                        b.max_timestamp)
            for b in entry.batches
        ]  # fmt: skip
    body = b"".join(parts)
    return _VERSION_CRC.pack(SNAPSHOT_VERSION, crc32c.crc32c(body)) + body


def decode_snapshot(data: bytes, offset: int) -> ProducerStates:
    """The state a snapshot file of ``offset`` holds (version 1 or 2); CorruptSnapshotError
    unless every byte checks out (version, CRC, offset, counts within bounds, batches and open
    transactions below the offset)."""
    if len(data) < _VERSION_CRC.size + _OFFSET_COUNT.size:
        raise CorruptSnapshotError(f"{len(data)} bytes is shorter than a snapshot header")
    version, crc = _VERSION_CRC.unpack_from(data)
    if version not in (1, SNAPSHOT_VERSION):
        raise CorruptSnapshotError(f"version {version}, expected 1 or {SNAPSHOT_VERSION}")
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
            producer_id, entry, position = _decode_entry(version, body, position, offset)
            if producer_id in producers:
                raise CorruptSnapshotError(f"producer {producer_id} twice")
            producers[producer_id] = entry
    except struct.error as error:
        raise CorruptSnapshotError(f"torn at byte {position}: {error}") from error
    if position != len(body):
        raise CorruptSnapshotError(f"{len(body) - position} bytes after the last producer")
    return ProducerStates(producers)


def _decode_entry(
    version: int, body: memoryview, position: int, offset: int
) -> tuple[int, ProducerEntry, int]:
    """One producer of a snapshot at ``position``: (its id, its entry, the position after)."""
    if version == 1:
        producer_id, epoch, batch_count = _ENTRY_V1.unpack_from(body, position)
        position += _ENTRY_V1.size
        entry = ProducerEntry(epoch)
        least = 1
    else:
        producer_id, epoch, batch_count, last_timestamp, coordinator_epoch, txn_first = (
            _ENTRY.unpack_from(body, position)
        )
        position += _ENTRY.size
        entry = ProducerEntry(epoch, last_timestamp=last_timestamp,
                              coordinator_epoch=coordinator_epoch,
                              current_txn_first_offset=txn_first)  # fmt: skip
        least = 0
        if not (txn_first == NO_TXN or 0 <= txn_first < offset):
            raise CorruptSnapshotError(f"producer {producer_id}: a transaction at {txn_first}")
    if not least <= batch_count <= BATCHES_KEPT:
        raise CorruptSnapshotError(f"producer {producer_id}: {batch_count} batches")
    for _ in range(batch_count):
        entry.batches.append(BatchRange(*_BATCH.unpack_from(body, position)))
        position += _BATCH.size
    if entry.batches and entry.batches[-1].last_offset >= offset:
        raise CorruptSnapshotError(f"producer {producer_id} has a batch at {offset} or above")
    if version == 1:
        entry.last_timestamp = entry.batches[-1].max_timestamp
    return producer_id, entry, position


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
        is skipped: only what exists needs to be durable. Nothing written: no lock taken."""
        if not self._unsynced:
            return
        with self._lock:
            pending, self._unsynced = self._unsynced, set()
        for path in sorted(pending):
            try:
                fsync_path(path)
            except FileNotFoundError:
                continue
        if pending:
            fsync_path(self.directory)

    @property
    def unsynced(self) -> bool:
        """Snapshots written without an fsync wait for :meth:`sync`."""
        return bool(self._unsynced)

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

    def delete_inside(self, base_offset: int, end_offset: int) -> None:
        """The cleaner replaced the segments in [``base_offset``, ``end_offset``) by one at
        ``base_offset``: the snapshots strictly inside go, those of the replaced segments' bases
        and any between (a clean stop's, at a log end then). The newest always stays, as in
        :meth:`delete_below`. Kafka deletes a replaced segment's snapshot with it.

        Not fsynced: a snapshot a crash brings back is still true. Cleaning keeps every batch
        it keeps at its offsets, and the last batch of every producer not expired, so the
        state as of that offset and the rescan after it give what they gave before; and the
        next open deletes it as a stray (:meth:`delete_stray`)."""
        for offset in self.offsets()[:-1]:
            if base_offset < offset < end_offset:
                self.path(offset).unlink(missing_ok=True)

    def delete_stray(self, segment_base_offsets: Collection[int]) -> None:
        """On open: every snapshot not at a segment's base goes, but the newest (Kafka's
        ``removeStraySnapshots``): those of segments the cleaner or retention removed that a
        crash brought back, or that an older version never deleted."""
        bases = set(segment_base_offsets)
        for offset in self.offsets()[:-1]:
            if offset not in bases:
                self.path(offset).unlink(missing_ok=True)

    def delete_all(self) -> None:
        for offset in self.offsets():
            self.path(offset).unlink(missing_ok=True)
        fsync_path(self.directory)
