"""Log compaction for ``cleanup.policy=compact``: keep the latest record of every key.

One pass, as Kafka's ``LogCleaner``:
1. the dirty section runs from the cleaner checkpoint to the first uncleanable offset: the active
   segment's base, an earlier segment still inside ``min.compaction.lag.ms``, or the first segment
   that reaches the first unstable offset (Kafka's ``cleanableOffsets``): the caller's
   ``max_offset`` (the broker passes the partition's last stable offset, which is also at most
   the high watermark) and the first offset of the earliest transaction the log shows open (no
   marker yet). Nothing of an undecided transaction is cleaned: whether it commits is not known;
2. an offset map (key → latest offset) is built over the dirty section, bounded by ``max_keys``,
   from committed data only: records of aborted transactions (the ``.txnindex`` files) and
   control batches never count as the latest of a key (Kafka's ``buildOffsetMap``), so an aborted
   write never shadows the committed value before it;
3. every segment from the log start to the end of the mapped section is rewritten, in groups that
   fit one segment, keeping a record unless the map holds a later offset for its key;
4. tombstones (null values) get a delete horizon (KIP-534: batch attribute bit 6, baseTimestamp =
   now + ``delete.retention.ms``) the first time they are cleaned, and are dropped by the first pass
   after that horizon, so a consumer that reads the log within ``delete.retention.ms`` sees them.

Transactions, as Kafka's ``CleanedTransactionMetadata`` (:class:`CleanedTransactions`): records of
aborted transactions are removed; a commit or abort marker stays while any batch of its
transaction remains, then gets a delete horizon like a tombstone and goes after it, so a reader
sees a marker for ``delete.retention.ms`` after the last of its data; the cleaned segment's
``.txnindex`` holds only the aborted transactions some of whose batches remain (Kafka's
``cleanedIndex``). Producer state must survive cleaning (a restarted broker rebuilds it from the
log): the last data batch of every producer not yet expired (``producer.id.expiration.ms``) is
kept, emptied of its records if none is left (Kafka's ``RETAIN_EMPTY``: its header holds the
producer's epoch and last sequence), and so is its last marker. Kafka keeps a marker only for a
producer with no data batch, and as an empty control batch; here the producer's last marker
stays whole, so a rebuilt producer state also has the coordinator epoch of its last marker (what
``TRANSACTION_COORDINATOR_FENCED`` compares) and the epoch a fencing marker bumped. A pass falls due
when such a producer expires, and removes what was kept for it.

Crash safety: a group is written to ``.cleaned`` files and fsynced, renamed to ``.swap`` (the log
last: its rename is the commit point), the replaced segments are renamed ``.deleted`` (their
files removed after ``file.delete.delay.ms``), and the ``.swap`` files
renamed into place (the log first). :func:`complete_interrupted_swaps` finishes or discards this on
start; a ``.txnindex.swap`` without its ``.log.swap`` is committed if the ``.log.cleaned`` is gone
(the log was renamed into place first), discarded if not (the swap was never committed).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import crc32c

from raftlog.batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_MASK,
    CRC_OFFSET,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_PRODUCER_ID,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
)
from raftlog.checkpoint import fsync_path, read_checkpoint, write_checkpoint
from raftlog.config import INT64_MAX
from raftlog.errors import InvalidRecordError
from raftlog.records import Record, decode_batch, encode_batch
from raftlog.segment import LOG_SUFFIX, AppendedBatch, LogSegment, segment_name
from raftlog.txn import TXN_INDEX_SUFFIX, AbortedTxn, TransactionIndex, read_marker

if TYPE_CHECKING:
    from raftlog.log import Log

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"
MAX_KEYS_DEFAULT = 4_000_000


@dataclass(frozen=True)
class CleanResult:
    first_dirty_offset: int
    end_offset: int  # the new first dirty offset
    dirty_ratio: float
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    records_removed: int
    tombstones_removed: int
    aborted_records_removed: int  # records of aborted transactions
    markers_removed: int  # commit/abort markers past their delete horizon


@dataclass
class _Counts:
    records_removed: int = 0
    tombstones_removed: int = 0
    aborted_records_removed: int = 0
    markers_removed: int = 0
    # when a later pass first has something to remove that this one kept: a tombstone's or a
    # marker's delete horizon, or the expiry of a producer whose last batch was kept empty
    earliest_horizon_ms: int | None = None

    def keep_horizon(self, horizon_ms: int) -> None:
        if self.earliest_horizon_ms is None or horizon_ms < self.earliest_horizon_ms:
            self.earliest_horizon_ms = horizon_ms


def read_cleaner_checkpoint(log: Log) -> tuple[int, int | None]:
    """(first dirty offset, earliest delete horizon of a kept tombstone or None)."""
    checkpoint = read_checkpoint(log.directory / CLEANER_CHECKPOINT, fields=2)
    if not checkpoint:
        return log.log_start_offset, None
    offset, horizon = checkpoint[0]
    if not log.log_start_offset <= offset <= log.log_end_offset:
        offset = log.log_start_offset  # stale (Kafka resets it too): treat the whole log as dirty
    return offset, (horizon if horizon >= 0 else None)


def truncate_checkpoint(log: Log, end_offset: int) -> None:
    """The log was truncated to ``end_offset``: what is written there next is dirty again."""
    checkpoint = read_checkpoint(log.directory / CLEANER_CHECKPOINT, fields=2)
    if checkpoint and checkpoint[0][0] > end_offset:
        write_checkpoint(log.directory / CLEANER_CHECKPOINT, [(end_offset, checkpoint[0][1])])


def _first_uncleanable_offset(
    segments: Sequence[LogSegment], now_ms: int, lag_ms: int, max_offset: int | None
) -> int:
    """The active segment's base, or that of the first segment with records newer than the lag
    or offsets at or above ``max_offset`` (the first unstable offset)."""
    for segment in segments[:-1]:
        if max_offset is not None and segment.next_offset > max_offset:
            return segment.base_offset
        if lag_ms > 0 and segment.max_timestamp > now_ms - lag_ms:
            return segment.base_offset
    return segments[-1].base_offset


def dirty_ratio(log: Log, max_offset: int | None = None) -> tuple[float, int, int]:
    """(dirty bytes / cleanable bytes, first dirty offset, first uncleanable offset)."""
    segments = log.segments()
    start, _ = read_cleaner_checkpoint(log)
    lag_ms = log.config.min_compaction_lag_ms
    end = _first_uncleanable_offset(segments, log.clock(), lag_ms, max_offset)
    cleanable = [s for s in segments if s.next_offset <= end]
    total = sum(s.size_bytes for s in cleanable)
    dirty = sum(s.size_bytes for s in cleanable if s.next_offset > start)
    return (dirty / total if total else 0.0), start, end


def compaction_overdue(log: Log, first_dirty_offset: int, now_ms: int) -> bool:
    """KIP-354's ``max.compaction.lag.ms``: a record may stay uncompacted that long at most, so
    a log whose dirty, non-active segments hold a batch older than that is cleaned whatever its
    dirty ratio (Kafka's ``maxCompactionDelay``: the segments' first-batch timestamps)."""
    lag_ms = log.config.max_compaction_lag_ms
    if lag_ms >= INT64_MAX:
        return False
    first = [
        s.rolling_timestamp
        for s in log.segments()[:-1]
        if s.next_offset > first_dirty_offset and s.rolling_timestamp is not None
    ]
    earliest = min((t for t in first if t >= 0), default=None)
    return earliest is not None and earliest < now_ms - lag_ms


def clean(
    log: Log,
    *,
    force: bool,
    max_keys: int = MAX_KEYS_DEFAULT,
    max_offset: int | None = None,
) -> CleanResult | None:
    """One pass, if there is dirty data past the ratio (or ``force``), or a kept tombstone's or
    marker's delete horizon has passed (KIP-534: expired tombstones alone make a log
    cleanable). Nothing at or above ``max_offset`` (the last stable offset) is cleaned."""
    ratio, start, end = dirty_ratio(log, max_offset)
    now_ms = log.clock()
    _, horizon = read_cleaner_checkpoint(log)
    horizon_due = horizon is not None and now_ms >= horizon
    dirty_due = start < end and (
        force
        or ratio >= log.config.min_cleanable_dirty_ratio
        or compaction_overdue(log, start, now_ms)
    )
    if not (dirty_due or horizon_due) or not any(s.next_offset <= end for s in log.segments()[:-1]):
        return None  # (the scan below reads every batch header: only for a pass to come)
    producers = scan_producers(log.batch_headers(), now_ms, log.config.producer_id_expiration_ms)
    if producers.first_open_txn_offset is not None:
        end = min(end, _first_uncleanable_offset(
            log.segments(), now_ms, log.config.min_compaction_lag_ms,
            producers.first_open_txn_offset,
        ))  # fmt: skip
    segments = [s for s in log.segments() if s.next_offset <= end]
    dirty = [s for s in segments if s.next_offset > start]
    offset_map, mapped_end = build_offset_map(
        dirty, start, max_keys, log.aborted_transactions(start, end)
    )
    to_clean = [s for s in segments if s.base_offset < mapped_end]
    if not to_clean:
        return None
    cleaning = _Pass(
        offset_map=offset_map,
        now_ms=now_ms,
        delete_retention_ms=log.config.delete_retention_ms,
        producers=producers,
        txns=CleanedTransactions(log.aborted_transactions(to_clean[0].base_offset, mapped_end)),
    )
    bytes_before = sum(s.size_bytes for s in to_clean)
    cleaned: list[LogSegment] = []
    config = log.config
    for group in group_segments(to_clean, config.segment_bytes, config.segment_index_bytes):
        new = _clean_group(log, group, cleaning)
        log.replace_segments(group, new)
        cleaned.append(new)
    counts = cleaning.counts
    next_horizon = -1 if counts.earliest_horizon_ms is None else counts.earliest_horizon_ms
    write_checkpoint(log.directory / CLEANER_CHECKPOINT, [(mapped_end, next_horizon)])
    return CleanResult(
        first_dirty_offset=start,
        end_offset=mapped_end,
        dirty_ratio=ratio,
        segments_before=len(to_clean),
        segments_after=len(cleaned),
        bytes_before=bytes_before,
        bytes_after=sum(s.size_bytes for s in cleaned),
        records_removed=counts.records_removed,
        tombstones_removed=counts.tombstones_removed,
        aborted_records_removed=counts.aborted_records_removed,
        markers_removed=counts.markers_removed,
    )


# -- producers and transactions ------------------------------------------------------------------
@dataclass
class _ProducerTail:
    last_data_offset: int = -1  # the last offset of its last data batch
    last_marker_offset: int = -1  # the offset of its last marker
    last_timestamp_ms: int = -1  # of its last batch or marker: what expiry measures
    txn_first_offset: int = -1  # its open transaction's first offset, -1 if none


@dataclass(frozen=True)
class ProducerTails:
    """What producer state needs kept (Kafka's ``lastRecordsOfActiveProducers``): the last
    offsets of the batches to keep → when their producer expires (INT64_MAX: never, its
    transaction is open); and the first offset of the earliest open transaction."""

    retained: dict[int, int]
    first_open_txn_offset: int | None


def scan_producers(
    headers: Iterable[BatchHeader], now_ms: int, expiration_ms: int
) -> ProducerTails:
    """From every batch header of the log, oldest first: each producer's last data batch and
    last marker, unless the producer has expired as the broker's producer state expires it
    (no open transaction and a last batch ``producer.id.expiration.ms`` old); and the open
    transactions (a transactional data batch with no marker of its producer after it)."""
    tails: dict[int, _ProducerTail] = {}
    for header in headers:
        if header.producer_id == NO_PRODUCER_ID:
            continue
        tail = tails.get(header.producer_id)
        if tail is None:
            tail = tails[header.producer_id] = _ProducerTail()
        tail.last_timestamp_ms = header.max_timestamp
        if header.is_control:
            tail.last_marker_offset = header.last_offset
            tail.txn_first_offset = -1
        else:
            tail.last_data_offset = header.last_offset
            if header.is_transactional and tail.txn_first_offset < 0:
                tail.txn_first_offset = header.base_offset
    retained: dict[int, int] = {}
    open_txns: list[int] = []
    for tail in tails.values():
        expires_ms = INT64_MAX
        if tail.txn_first_offset >= 0:
            open_txns.append(tail.txn_first_offset)
        else:
            expires_ms = min(INT64_MAX, tail.last_timestamp_ms + expiration_ms)
            if now_ms >= expires_ms:
                continue
        for offset in (tail.last_data_offset, tail.last_marker_offset):
            if offset >= 0:
                retained[offset] = expires_ms
    return ProducerTails(retained, min(open_txns, default=None))


@dataclass
class _TxnSeen:
    """A transaction met by the cleaner before its marker: its aborted entry (None if it is
    not aborted), and whether this pass keeps any batch of it."""

    aborted: AbortedTxn | None
    kept: bool = False


class CleanedTransactions:
    """The transactions a pass is inside of as it walks the log in offset order (Kafka's
    ``CleanedTransactionMetadata``). ``aborted`` are the index entries meeting the range walked
    (from every segment's ``.txnindex``); an entry becomes current at its first offset, and a
    producer's transactional batches are then aborted until its marker. At most one transaction
    of a producer is open at a time, so the state is keyed by producer id."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        self._pending = deque(sorted(set(aborted), key=lambda e: (e.first_offset, e.last_offset)))
        self._open: dict[int, _TxnSeen] = {}

    def _consume_up_to(self, offset: int) -> None:
        while self._pending and self._pending[0].first_offset <= offset:
            entry = self._pending.popleft()
            seen = self._open.get(entry.producer_id)
            if seen is None or seen.aborted is None:
                self._open[entry.producer_id] = _TxnSeen(entry, kept=seen.kept if seen else False)

    def on_batch(self, header: BatchHeader) -> bool:
        """A data batch: whether it belongs to an aborted transaction."""
        self._consume_up_to(header.last_offset)
        if not header.is_transactional:
            return False
        seen = self._open.get(header.producer_id)
        if seen is None:
            seen = self._open[header.producer_id] = _TxnSeen(None)
        return seen.aborted is not None

    def kept(self, header: BatchHeader) -> None:
        """This pass keeps the transactional data batch ``header`` (with records or empty)."""
        seen = self._open.get(header.producer_id)
        if seen is not None:
            seen.kept = True

    def on_marker(self, header: BatchHeader) -> tuple[bool, AbortedTxn | None]:
        """A marker ends its producer's transaction: whether a batch of it is kept (then so is
        the marker), and the aborted entry the cleaned ``.txnindex`` keeps, if a batch of that
        aborted transaction is kept."""
        self._consume_up_to(header.last_offset)
        seen = self._open.pop(header.producer_id, None)
        if seen is None or not seen.kept:
            return False, None
        return True, seen.aborted


# -- the offset map ------------------------------------------------------------------------------
def build_offset_map(
    segments: Sequence[LogSegment],
    start_offset: int,
    max_keys: int,
    aborted: Iterable[AbortedTxn] = (),
) -> tuple[dict[bytes, int], int]:
    """key → latest offset over whole segments from ``start_offset``, of committed data only:
    the batches of the ``aborted`` transactions and control batches are skipped. Stops before a
    segment that could overflow ``max_keys``. Returns the map and the offset it covers up to."""
    txns = CleanedTransactions(aborted)
    offset_map: dict[bytes, int] = {}
    mapped_end = start_offset
    for segment in segments:
        segment_map: dict[bytes, int] = {}
        for position, header in segment.iter_headers(0):
            if header.is_control:
                if header.producer_id != NO_PRODUCER_ID:
                    txns.on_marker(header)
                continue
            if txns.on_batch(header) or header.last_offset < start_offset:
                continue
            _, records = decode_batch(segment.read_raw(position, header.size_bytes))
            for record in records:
                if record.key is not None and record.offset >= start_offset:
                    segment_map[record.key] = record.offset
        if offset_map and len(offset_map) + len(segment_map) > max_keys:
            break
        offset_map.update(segment_map)
        mapped_end = segment.next_offset
    return offset_map, mapped_end


def group_segments(
    segments: Sequence[LogSegment], segment_bytes: int, max_index_bytes: int
) -> list[list[LogSegment]]:
    """Consecutive runs whose bytes fit one segment, whose offset and time index entries fit
    one index of ``segment.index.bytes``, and whose offsets fit relative offsets (Kafka's
    ``groupSegmentsBySize``). Sizes before cleaning: what a group cleans to is no bigger. Each
    pass regroups the whole cleaned section, so the segments it left small are merged by the
    next: under steady key churn a compacted log keeps about its live bytes / ``segment.bytes``
    segments, plus those dirty since the last pass."""
    groups: list[list[LogSegment]] = []
    for segment in segments:
        if groups:
            group = groups[-1]
            size = sum(s.size_bytes for s in group) + segment.size_bytes
            offset_index = sum(s.offset_index.size_bytes for s in (*group, segment))
            time_index = sum(s.time_index.size_bytes for s in (*group, segment))
            span = segment.next_offset - group[0].base_offset
            if (
                size <= segment_bytes
                and offset_index <= max_index_bytes
                and time_index <= max_index_bytes
                and span <= 2**31 - 1
            ):
                group.append(segment)
                continue
        groups.append([segment])
    return groups


# -- rewriting -----------------------------------------------------------------------------------
@dataclass
class _Pass:
    """What one cleaning pass carries from batch to batch and group to group."""

    offset_map: dict[bytes, int]
    now_ms: int
    delete_retention_ms: int
    producers: ProducerTails
    txns: CleanedTransactions
    counts: _Counts = field(default_factory=_Counts)


def _clean_group(log: Log, group: list[LogSegment], cleaning: _Pass) -> LogSegment:
    config = log.config
    base_offset = group[0].base_offset
    for stale in log.directory.glob(f"{segment_name(base_offset, '')}.*{CLEANED_SUFFIX}"):
        stale.unlink()  # of an earlier pass that failed part-way: never appended to
    dest = LogSegment(
        log.directory,
        base_offset,
        suffix=CLEANED_SUFFIX,
        index_interval_bytes=config.index_interval_bytes,
        max_index_bytes=config.segment_index_bytes,
        created_ms=cleaning.now_ms,
    )
    try:
        for segment in group:
            for position, header in segment.iter_headers(0):
                raw = segment.read_raw(position, header.size_bytes)
                kept = clean_batch(raw, header, cleaning, dest.txn_index)
                if kept is not None:
                    batch: AppendedBatch = (header.last_offset, header.max_timestamp, len(kept))
                    dest.append([kept], [batch])
        dest.on_roll()
        dest.flush()
        dest.close()
    except BaseException:
        dest.delete()  # Kafka's deleteIfExists on an aborted cleaning: the old segments stay
        raise
    _swap_in(log.directory, dest, group)
    for replaced in log.delete_later(group):
        replaced.delete()
    new = log.new_segment(base_offset)
    new.load()
    return new


def clean_batch(
    raw: bytes, header: BatchHeader, cleaning: _Pass, txn_index: TransactionIndex
) -> bytes | None:
    """The batch as the cleaned segment keeps it, or None. An aborted transaction's batch goes
    whole; what is left of a producer's last data batch stays, empty if nothing is."""
    if header.is_control:
        return _clean_control(raw, header, cleaning, txn_index)
    counts = cleaning.counts
    kept: bytes | None = None
    if cleaning.txns.on_batch(header):
        counts.aborted_records_removed += header.record_count
    else:
        kept = filter_batch(
            raw,
            header=header,
            offset_map=cleaning.offset_map,
            now_ms=cleaning.now_ms,
            delete_retention_ms=cleaning.delete_retention_ms,
            counts=counts,
        )
    expires_ms = cleaning.producers.retained.get(header.last_offset)
    if kept is None and expires_ms is not None:  # a producer's last batch: its header stays
        kept = empty_batch(header)
        if expires_ms < INT64_MAX:
            counts.keep_horizon(expires_ms)  # a pass then removes it
    if kept is not None and header.is_transactional:
        cleaning.txns.kept(header)
    return kept


def _clean_control(
    raw: bytes, header: BatchHeader, cleaning: _Pass, txn_index: TransactionIndex
) -> bytes | None:
    """A marker stays while a batch of its transaction does; then it gets a delete horizon
    (``delete.retention.ms`` from now) and goes with the first pass after it, unless it is the
    last marker of a producer not yet expired. Other control batches stay."""
    if header.producer_id == NO_PRODUCER_ID or not header.is_transactional:
        return raw
    counts = cleaning.counts
    data_kept, aborted = cleaning.txns.on_marker(header)
    if header.record_count == 0:  # Kafka's emptied marker: its transaction is long gone
        counts.markers_removed += 1
        return None
    if not _is_marker(raw):
        return raw
    if aborted is not None:
        txn_index.append(aborted)
    if data_kept:
        return raw
    expires_ms = cleaning.producers.retained.get(header.last_offset)
    if header.has_delete_horizon:
        horizon_ms = header.base_timestamp
        if cleaning.now_ms >= horizon_ms and expires_ms is None:
            counts.markers_removed += 1
            return None
    else:
        horizon_ms = cleaning.now_ms + cleaning.delete_retention_ms
        raw = _with_delete_horizon(raw, header, horizon_ms)
    due_ms = horizon_ms if expires_ms is None else max(horizon_ms, expires_ms)
    if due_ms < INT64_MAX:
        counts.keep_horizon(due_ms)
    return raw


def _is_marker(raw: bytes) -> bool:
    try:
        read_marker(raw)
    except InvalidRecordError:
        return False
    return True


def _with_delete_horizon(raw: bytes, header: BatchHeader, horizon_ms: int) -> bytes:
    _, records = decode_batch(raw)
    return _reencode(records, header, horizon_ms)


def _reencode(records: list[Record], header: BatchHeader, horizon_ms: int | None) -> bytes:
    return encode_batch(
        records,
        base_offset=header.base_offset,
        compression=header.compression,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        partition_leader_epoch=header.partition_leader_epoch,
        timestamp_type=header.timestamp_type,
        is_transactional=header.is_transactional,
        is_control=header.is_control,
        delete_horizon_ms=horizon_ms,
        last_offset_delta=header.last_offset_delta,
    )


def empty_batch(header: BatchHeader) -> bytes:
    """The batch's header with no records (Kafka's ``DefaultRecordBatch.writeEmptyHeader``): its
    offsets, producer id, epoch and base sequence (so the last sequence) and max timestamp stay,
    uncompressed, both timestamps the max timestamp, no delete horizon."""
    attributes = header.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK | CONTROL_MASK)
    packed = HEADER.pack(
        header.base_offset, HEADER_SIZE - LOG_OVERHEAD, header.partition_leader_epoch,
        header.magic, 0, attributes, header.last_offset_delta, header.max_timestamp,
        header.max_timestamp, header.producer_id, header.producer_epoch, header.base_sequence, 0,
    )  # fmt: skip
    crc = crc32c.crc32c(packed[ATTRIBUTES_OFFSET:])
    return packed[:CRC_OFFSET] + crc.to_bytes(4, "big") + packed[ATTRIBUTES_OFFSET:]


def filter_batch(
    raw: bytes,
    *,
    header: BatchHeader,
    offset_map: dict[bytes, int],
    now_ms: int,
    delete_retention_ms: int,
    counts: _Counts,
) -> bytes | None:
    """The data batch with superseded records (and expired tombstones) removed; the raw bytes if
    nothing changes, None if nothing is left."""
    _, records = decode_batch(raw)
    horizon_passed = header.has_delete_horizon and now_ms >= header.base_timestamp
    kept: list[Record] = []
    for record in records:
        if record.key is not None and offset_map.get(record.key, -1) > record.offset:
            counts.records_removed += 1
        elif record.value is None and horizon_passed:
            counts.tombstones_removed += 1
        else:
            kept.append(record)
    if not kept:
        return None
    has_tombstones = any(r.value is None for r in kept)
    horizon = header.base_timestamp if header.has_delete_horizon else None
    needs_horizon = horizon is None and has_tombstones
    if needs_horizon:
        horizon = now_ms + delete_retention_ms
    if has_tombstones and horizon is not None:
        counts.keep_horizon(horizon)
    if len(kept) == len(records) and not needs_horizon:
        return raw
    return _reencode(kept, header, horizon)


# -- the swap ------------------------------------------------------------------------------------
def _swap_in(directory: Path, cleaned: LogSegment, replaced: list[LogSegment]) -> None:
    """.cleaned → .swap (log file last: its rename commits), delete the old, .swap → final
    (log file first)."""
    paths = cleaned.paths()  # before the renames: the transaction index is listed if it exists
    for path in reversed(paths):
        os.replace(path, _with_suffix(path, CLEANED_SUFFIX, SWAP_SUFFIX))
    fsync_path(directory)
    for segment in replaced:
        segment.mark_deleted()  # out of the way; its files go after file.delete.delay.ms
    fsync_path(directory)
    for path in paths:
        os.replace(
            _with_suffix(path, CLEANED_SUFFIX, SWAP_SUFFIX), _with_suffix(path, CLEANED_SUFFIX, "")
        )
    fsync_path(directory)


def _with_suffix(path: Path, old: str, new: str) -> Path:
    assert path.name.endswith(old), f"{path} does not end with {old}"
    return path.with_name(path.name[: len(path.name) - len(old)] + new)


def complete_interrupted_swaps(directory: Path) -> None:
    """On start: drop half-written ``.cleaned`` and ``.deleted`` files; finish every ``.swap``
    by deleting the segments it replaces (bases inside its offset range) and renaming it. A
    ``.txnindex.swap`` whose ``.log.cleaned`` is still there was renamed before the commit (its
    old segments and their index are intact): dropped."""
    uncommitted = {
        path.name.split(".")[0] for path in directory.glob(f"*{LOG_SUFFIX}{CLEANED_SUFFIX}")
    }
    for suffix in (CLEANED_SUFFIX, DELETED_SUFFIX):
        for path in directory.glob(f"*{suffix}"):
            path.unlink()
    swaps = sorted(directory.glob(f"*{LOG_SUFFIX}{SWAP_SUFFIX}"))
    for swap_log in swaps:
        base_offset = int(swap_log.name.split(".")[0])
        # Its offset and time indexes are rebuilt by the loader; its transaction index is not.
        for index in directory.glob(f"{swap_log.name.split('.')[0]}.*index{SWAP_SUFFIX}"):
            if not index.name.endswith(TXN_INDEX_SUFFIX + SWAP_SUFFIX):
                index.unlink()
        end_offset = _next_offset_of(directory, base_offset)
        for old_log in directory.glob(f"*{LOG_SUFFIX}"):
            old_base = int(old_log.name.split(".")[0])
            if base_offset <= old_base < end_offset:
                for path in directory.glob(f"{old_log.name.split('.')[0]}.*"):
                    if not path.name.endswith(SWAP_SUFFIX):
                        path.unlink()
        os.replace(swap_log, _with_suffix(swap_log, SWAP_SUFFIX, ""))
    txn_swaps = list(directory.glob(f"*{TXN_INDEX_SUFFIX}{SWAP_SUFFIX}"))
    for txn_index in txn_swaps:
        if txn_index.name.split(".")[0] in uncommitted:
            txn_index.unlink()
        else:
            os.replace(txn_index, _with_suffix(txn_index, SWAP_SUFFIX, ""))  # not rebuilt: kept
    for stray in directory.glob(f"*index{SWAP_SUFFIX}"):
        stray.unlink()
    if swaps or txn_swaps:
        fsync_path(directory)


def _next_offset_of(directory: Path, base_offset: int) -> int:
    swap = LogSegment(
        directory,
        base_offset,
        suffix=SWAP_SUFFIX,
        index_interval_bytes=4096,
        max_index_bytes=4096,
        created_ms=0,
    )
    try:
        swap.recover()
        return swap.next_offset
    finally:
        swap.delete_indexes_and_close()
