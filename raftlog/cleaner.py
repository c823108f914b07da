"""Log compaction for ``cleanup.policy=compact``: keep the latest record of every key.

One pass, as Kafka's ``LogCleaner``:
1. the dirty section runs from the cleaner checkpoint to the first uncleanable offset (the active
   segment's base, or an earlier segment still inside ``min.compaction.lag.ms``);
2. an offset map (key → latest offset) is built over the dirty section, bounded by ``max_keys``;
3. every segment from the log start to the end of the mapped section is rewritten, in groups that
   fit one segment, keeping a record unless the map holds a later offset for its key;
4. tombstones (null values) get a delete horizon (KIP-534: batch attribute bit 6, baseTimestamp =
   now + ``delete.retention.ms``) the first time they are cleaned, and are dropped by the first pass
   after that horizon, so a consumer that reads the log within ``delete.retention.ms`` sees them.

Crash safety: a group is written to ``.cleaned`` files and fsynced, renamed to ``.swap`` (the commit
point), the replaced segments are deleted, and the ``.swap`` files renamed into place.
:func:`complete_interrupted_swaps` finishes or discards this on start.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from raftlog.batch import BatchHeader
from raftlog.checkpoint import fsync_path, read_checkpoint, write_checkpoint
from raftlog.records import Record, decode_batch, encode_batch
from raftlog.segment import LOG_SUFFIX, AppendedBatch, LogSegment
from raftlog.txn import TXN_INDEX_SUFFIX

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


@dataclass
class _Counts:
    records_removed: int = 0
    tombstones_removed: int = 0
    earliest_horizon_ms: int | None = None  # of the tombstones this pass kept

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


def _first_uncleanable_offset(segments: Sequence[LogSegment], now_ms: int, lag_ms: int) -> int:
    """The active segment's base, or the first segment with records newer than the lag."""
    for segment in segments[:-1]:
        if lag_ms > 0 and segment.max_timestamp > now_ms - lag_ms:
            return segment.base_offset
    return segments[-1].base_offset


def dirty_ratio(log: Log) -> tuple[float, int, int]:
    """(dirty bytes / cleanable bytes, first dirty offset, first uncleanable offset)."""
    segments = log.segments()
    start, _ = read_cleaner_checkpoint(log)
    end = _first_uncleanable_offset(segments, log.clock(), log.config.min_compaction_lag_ms)
    cleanable = [s for s in segments if s.next_offset <= end]
    total = sum(s.size_bytes for s in cleanable)
    dirty = sum(s.size_bytes for s in cleanable if s.next_offset > start)
    return (dirty / total if total else 0.0), start, end


def clean(log: Log, *, force: bool, max_keys: int = MAX_KEYS_DEFAULT) -> CleanResult | None:
    """One pass, if there is dirty data past the ratio (or ``force``), or a kept tombstone's
    delete horizon has passed (KIP-534: expired tombstones alone make a log cleanable)."""
    ratio, start, end = dirty_ratio(log)
    now_ms = log.clock()
    _, horizon = read_cleaner_checkpoint(log)
    horizon_due = horizon is not None and now_ms >= horizon
    dirty_due = start < end and (force or ratio >= log.config.min_cleanable_dirty_ratio)
    if not (dirty_due or horizon_due):
        return None
    segments = [s for s in log.segments() if s.next_offset <= end]
    dirty = [s for s in segments if s.next_offset > start]
    offset_map, mapped_end = build_offset_map(dirty, start, max_keys)
    to_clean = [s for s in segments if s.base_offset < mapped_end]
    if not to_clean:
        return None
    counts = _Counts()
    bytes_before = sum(s.size_bytes for s in to_clean)
    cleaned: list[LogSegment] = []
    for group in group_segments(to_clean, log.config.segment_bytes):
        new = _clean_group(log, group, offset_map, now_ms, counts)
        log.replace_segments(group, new)
        cleaned.append(new)
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
    )


def build_offset_map(
    segments: Sequence[LogSegment], start_offset: int, max_keys: int
) -> tuple[dict[bytes, int], int]:
    """key → latest offset over whole segments from ``start_offset``; stops before a segment
    that could overflow ``max_keys``. Returns the map and the offset it covers up to."""
    offset_map: dict[bytes, int] = {}
    mapped_end = start_offset
    for segment in segments:
        segment_map: dict[bytes, int] = {}
        for record in _segment_records(segment):
            if record.key is not None and record.offset >= start_offset:
                segment_map[record.key] = record.offset
        if offset_map and len(offset_map) + len(segment_map) > max_keys:
            break
        offset_map.update(segment_map)
        mapped_end = segment.next_offset
    return offset_map, mapped_end


def _segment_records(segment: LogSegment) -> list[Record]:
    records: list[Record] = []
    for position, header in segment.iter_headers(0):
        records.extend(decode_batch(segment.read_raw(position, header.size_bytes))[1])
    return records


def group_segments(segments: Sequence[LogSegment], segment_bytes: int) -> list[list[LogSegment]]:
    """Consecutive runs whose bytes fit one segment and whose offsets fit relative offsets."""
    groups: list[list[LogSegment]] = []
    for segment in segments:
        if groups:
            group = groups[-1]
            size = sum(s.size_bytes for s in group) + segment.size_bytes
            span = segment.next_offset - group[0].base_offset
            if size <= segment_bytes and span <= 2**31 - 1:
                group.append(segment)
                continue
        groups.append([segment])
    return groups


def _clean_group(
    log: Log, group: list[LogSegment], offset_map: dict[bytes, int], now_ms: int, counts: _Counts
) -> LogSegment:
    config = log.config
    dest = LogSegment(
        log.directory,
        group[0].base_offset,
        suffix=CLEANED_SUFFIX,
        index_interval_bytes=config.index_interval_bytes,
        max_index_bytes=config.segment_index_bytes,
        created_ms=now_ms,
    )
    for segment in group:
        for position, header in segment.iter_headers(0):
            raw = segment.read_raw(position, header.size_bytes)
            kept = filter_batch(
                raw,
                header=header,
                offset_map=offset_map,
                now_ms=now_ms,
                delete_retention_ms=config.delete_retention_ms,
                counts=counts,
            )
            if kept is not None:
                batch: AppendedBatch = (header.last_offset, header.max_timestamp, len(kept))
                dest.append([kept], [batch])
        for aborted in segment.txn_index.entries:  # the replaced segments' aborts carry over
            dest.txn_index.append(aborted)
    dest.on_roll()
    dest.flush()
    dest.close()
    _swap_in(log.directory, dest, group)
    new = log.new_segment(group[0].base_offset)
    new.load()
    return new


def filter_batch(
    raw: bytes,
    *,
    header: BatchHeader,
    offset_map: dict[bytes, int],
    now_ms: int,
    delete_retention_ms: int,
    counts: _Counts,
) -> bytes | None:
    """The batch with superseded records (and expired tombstones) removed; the raw bytes if
    nothing changes, None if nothing is left."""
    if header.is_control:
        return raw
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
    return encode_batch(
        kept,
        base_offset=header.base_offset,
        compression=header.compression,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        partition_leader_epoch=header.partition_leader_epoch,
        timestamp_type=header.timestamp_type,
        is_transactional=header.is_transactional,
        delete_horizon_ms=horizon,
        last_offset_delta=header.last_offset_delta,
    )


def _swap_in(directory: Path, cleaned: LogSegment, replaced: list[LogSegment]) -> None:
    """.cleaned → .swap (log file last: its rename commits), delete the old, .swap → final."""
    paths = cleaned.paths()  # before the renames: the transaction index is listed if it exists
    for path in reversed(paths):
        os.replace(path, _with_suffix(path, CLEANED_SUFFIX, SWAP_SUFFIX))
    fsync_path(directory)
    for segment in replaced:
        segment.delete()
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
    by deleting the segments it replaces (bases inside its offset range) and renaming it."""
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
    for txn_index in directory.glob(f"*{TXN_INDEX_SUFFIX}{SWAP_SUFFIX}"):
        os.replace(txn_index, _with_suffix(txn_index, SWAP_SUFFIX, ""))  # not rebuilt: kept
    for stray in directory.glob(f"*index{SWAP_SUFFIX}"):
        stray.unlink()
    if swaps:
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
