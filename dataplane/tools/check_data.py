"""The crash-consistency checker: read every file of a stopped node's data directory and report
what a recovered node must never hold (Kafka's ``kafka-dump-log --verify``, for a whole node).

``raftlog check-data DIR`` (``check_node_dir``) walks ``DIR`` (the node's ``log.dirs``):

- each partition directory ``<topic>-<partition>/``: every batch of every segment below the log
  end decodes with a valid CRC, offsets increase within and across segments; each ``.index``
  entry points at a batch boundary inside its segment, at that batch, in increasing order; each
  ``.timeindex`` entry names the last offset of a batch of its segment that carries its
  timestamp, both increasing; ``.txnindex`` entries parse; the checkpoints (recovery point, log
  start, high watermark, cleaner, leader epochs), ``partition.metadata`` and the producer-state
  snapshots parse, and the leader epochs increase and start at or below the log end;
- ``__cluster_metadata/``: the Raft journal's records are whole and in sequence up to its
  declared end, the snapshot decodes (CRC), the meta file unpickles, the bootstrap file lists
  voters.

What recovery legitimately leaves is not a problem: a zero tail of a preallocated segment
(``preallocate``), ``.deleted`` files awaiting ``file.delete.delay.ms``, and, in a directory
without the clean-shutdown marker, a torn tail of the last segment after its recovery point
(a crash after the last flush: the next start cuts it); these are ``notes``. Run it on a
stopped node only: a running node writes these files while they are read.
"""

from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from dataplane.broker.partition import HIGH_WATERMARK_CHECKPOINT
from dataplane.broker.producer_state import SNAPSHOT_SUFFIX, decode_snapshot
from metadata_quorum.raft import (
    BOOTSTRAP_FILE,
    JOURNAL_FILE,
    SNAPSHOT_FILE,
    RaftStorageError,
    scan_journal,
    snapshot_last_index,
)
from metadata_quorum.raft_journal import read_meta
from raftlog.batch import HEADER_SIZE, BatchHeader, check_header, compute_crc, read_header
from raftlog.checkpoint import read_checkpoint
from raftlog.cleaner import CLEANER_CHECKPOINT
from raftlog.epoch import CHECKPOINT_NAME as LEADER_EPOCH_CHECKPOINT
from raftlog.errors import CorruptRecordError, KafkaError, StorageError
from raftlog.log import (
    CLEAN_SHUTDOWN_MARKER,
    LOG_START_CHECKPOINT,
    PARTITION_METADATA,
    RECOVERY_POINT_CHECKPOINT,
    parse_partition_dir_name,
    read_partition_metadata,
)
from raftlog.segment import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    MAX_RELATIVE_OFFSET,
    TIME_INDEX_SUFFIX,
)
from raftlog.txn import ENTRY as TXN_ENTRY
from raftlog.txn import ENTRY_VERSION as TXN_ENTRY_VERSION
from raftlog.txn import TXN_INDEX_SUFFIX

METADATA_DIR = "__cluster_metadata"
OFFSET_ENTRY = struct.Struct(">ii")  # relative offset, position
TIME_ENTRY = struct.Struct(">qi")  # timestamp, relative offset
SCAN_CHUNK_BYTES = 1024 * 1024


@dataclass
class DataCheckReport:
    """What ``check_node_dir`` found: each problem names its file and offset or position."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the next start repairs, by design
    partitions_checked: int = 0
    segments_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class _Batch:
    position: int
    header: BatchHeader


@dataclass
class _Segment:
    base_offset: int
    path: Path
    batches: list[_Batch]
    end_position: int  # after the last whole batch
    next_offset: int
    torn: bool = False  # the scan stopped at a bad batch: index entries past it are skipped


def check_node_dir(data_dir: Path) -> DataCheckReport:
    """Check every partition directory and the metadata quorum's directory under ``data_dir``
    (a stopped node's ``log.dirs``)."""
    report = DataCheckReport()
    if not data_dir.is_dir():
        report.problems.append(f"{data_dir}: not a directory")
        return report
    for directory in sorted(data_dir.iterdir()):
        if not directory.is_dir():
            continue
        if directory.name == METADATA_DIR:
            _check_metadata_dir(directory, report)
            continue
        try:
            parse_partition_dir_name(directory.name)
        except StorageError:
            continue  # not a partition directory
        _check_partition(directory, report)
        report.partitions_checked += 1
    return report


# -- partitions ------------------------------------------------------------------------------
def _check_partition(directory: Path, report: DataCheckReport) -> None:
    clean = (directory / CLEAN_SHUTDOWN_MARKER).exists()
    recovery_point = _checkpoint_offset(directory / RECOVERY_POINT_CHECKPOINT, report)
    bases = sorted(
        int(path.name[: -len(LOG_SUFFIX)])
        for path in directory.glob(f"*{LOG_SUFFIX}")
        if path.name[: -len(LOG_SUFFIX)].isdigit()
    )
    # Without the clean-shutdown marker, what lies past the recovery point was never flushed:
    # a crash may have torn it, and the next start cuts it (Log._load)
    tears_from = None if clean else (recovery_point or 0)
    next_offset = None
    batches: list[tuple[BatchHeader, bool]] = []  # (header, whether the next start recovers it)
    for n, base in enumerate(bases):
        segment = _scan_segment(directory, base, next_offset, tears_from, report)
        report.segments_checked += 1
        _check_offset_index(directory, segment, report)
        _check_time_index(directory, segment, report)
        _check_txn_index(directory, base, report)
        if segment.batches:
            next_offset = segment.next_offset
        # Log._open_segments: a segment not wholly below the recovery point is recovered
        recovered = tears_from is not None and (n + 1 == len(bases) or bases[n + 1] > tears_from)
        batches += [(batch.header, recovered) for batch in segment.batches]
    log_end = max(next_offset or 0, bases[-1] if bases else 0)
    for name in (LOG_START_CHECKPOINT, HIGH_WATERMARK_CHECKPOINT):
        _checkpoint_offset(directory / name, report)
    _parse_checkpoint(directory / CLEANER_CHECKPOINT, 2, report)
    _check_leader_epochs(directory, log_end, batches, report)
    _check_producer_snapshots(directory, report)
    try:
        read_partition_metadata(directory / PARTITION_METADATA)
    except StorageError as error:
        report.problems.append(error.message)
    for leftover in sorted(directory.glob(f"*{DELETED_SUFFIX}")):
        report.notes.append(f"{leftover}: awaiting deletion (file.delete.delay.ms)")


def _max_offset(base_offset: int) -> int:
    return base_offset + MAX_RELATIVE_OFFSET


def _scan_segment(
    directory: Path,
    base_offset: int,
    previous_next: int | None,
    tears_from: int | None,
    report: DataCheckReport,
) -> _Segment:
    """Every batch of the segment, CRC checked, offsets increasing from the segment's base and
    from the previous segment's end."""
    path = directory / f"{base_offset:020d}{LOG_SUFFIX}"
    segment = _Segment(base_offset, path, [], 0, base_offset)
    expected = max(base_offset, previous_next or base_offset)
    with path.open("rb") as file:
        fd = file.fileno()
        size = os.fstat(fd).st_size
        position = 0
        while position < size:
            may_tear = tears_from is not None and expected >= tears_from
            try:
                header, raw = _read_batch(fd, position, size)
            except KafkaError as error:
                segment.torn = True  # entries past it are not checked again
                _bad_tail(fd, path, position, size, error.message, may_tear, report)
                break
            if header.base_offset < expected or header.last_offset > _max_offset(base_offset):
                report.problems.append(
                    f"{path}: batch at position {position} has offsets {header.base_offset}.."
                    f"{header.last_offset}, expected from {expected} within the segment"
                )
            if compute_crc(raw, 0, header.batch_length) != header.crc:
                segment.torn = True  # entries past it are not checked again
                _bad_tail(fd, path, position, size, "CRC mismatch", may_tear, report)
                break
            segment.batches.append(_Batch(position, header))
            expected = segment.next_offset = header.last_offset + 1
            position += header.size_bytes
        segment.end_position = position
    return segment


def _read_batch(fd: int, position: int, size: int) -> tuple[BatchHeader, bytes]:
    head = os.pread(fd, HEADER_SIZE, position)
    if len(head) < HEADER_SIZE:
        raise CorruptRecordError(f"torn batch header ({len(head)} bytes)")
    header = read_header(head)
    check_header(header, size - position)
    raw = os.pread(fd, header.size_bytes, position)
    if len(raw) < header.size_bytes:
        raise CorruptRecordError("torn batch")
    return header, raw


def _bad_tail(
    fd: int,
    path: Path,
    position: int,
    size: int,
    why: str,
    may_tear: bool,
    report: DataCheckReport,
) -> bool:
    """A batch that does not decode at ``position``: preallocated space if only zeros follow,
    a torn tail the next start cuts if the data there was never flushed, else a problem.
    Whether it is a tail that recovery cuts (noted, not a problem)."""
    if _zeros_from(fd, position, size):
        report.notes.append(f"{path}: {size - position} zero bytes after position {position} "
                            "(preallocated)")  # fmt: skip
        return True
    if may_tear:
        report.notes.append(f"{path}: torn tail at position {position} ({why}) after the "
                            "recovery point; the next start cuts it")  # fmt: skip
        return True
    report.problems.append(f"{path}: bad batch at position {position}: {why}")
    return False


def _zeros_from(fd: int, position: int, size: int) -> bool:
    while position < size:
        chunk = os.pread(fd, min(SCAN_CHUNK_BYTES, size - position), position)
        if not chunk or chunk.count(0) != len(chunk):
            return False
        position += len(chunk)
    return True


def _index_entries(
    path: Path, entry: struct.Struct, report: DataCheckReport
) -> list[tuple[int, int]]:
    """The entries of an index file, its preallocated zero tail left out (an entry at relative
    offset 0, position 0 is never written: the first entry comes after index.interval.bytes)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    if len(data) % entry.size:
        report.problems.append(f"{path}: length {len(data)} is not whole entries")
        data = data[: len(data) - len(data) % entry.size]
    entries = [(int(key), int(value)) for key, value in entry.iter_unpack(data)]
    while entries and entries[-1] == (0, 0):
        entries.pop()
    return entries


def _check_offset_index(directory: Path, segment: _Segment, report: DataCheckReport) -> None:
    path = directory / f"{segment.base_offset:020d}{INDEX_SUFFIX}"
    by_position = {batch.position: batch.header for batch in segment.batches}
    previous = (-1, -1)
    for n, (relative, position) in enumerate(_index_entries(path, OFFSET_ENTRY, report)):
        offset = segment.base_offset + relative
        header = by_position.get(position)
        if segment.torn and position >= segment.end_position:
            continue  # past the bad batch, reported once
        where = f"{path}: entry {n} (offset {offset}, position {position})"
        if relative <= previous[0] or position <= previous[1]:
            report.problems.append(f"{where} does not increase")
        if header is None:
            report.problems.append(
                f"{where} is not at a batch boundary of the segment "
                f"({segment.end_position} bytes of batches)"
            )
        elif header.last_offset != offset:
            report.problems.append(f"{where}: the batch there ends at {header.last_offset}")
        previous = (relative, position)


def _check_time_index(directory: Path, segment: _Segment, report: DataCheckReport) -> None:
    path = directory / f"{segment.base_offset:020d}{TIME_INDEX_SUFFIX}"
    ends = {batch.header.last_offset: batch.header.max_timestamp for batch in segment.batches}
    previous = (-(2**63), -1)
    for n, (timestamp, relative) in enumerate(_index_entries(path, TIME_ENTRY, report)):
        offset = segment.base_offset + relative
        where = f"{path}: entry {n} (timestamp {timestamp}, offset {offset})"
        if timestamp <= previous[0] or relative < previous[1]:
            report.problems.append(f"{where} does not increase")
        if segment.torn and offset >= segment.next_offset:
            continue  # past the bad batch, reported once
        if timestamp < 0:  # batches without timestamps: the entry names the segment's base
            if (
                not segment.base_offset
                <= offset
                < max(segment.next_offset, segment.base_offset + 1)
            ):
                report.problems.append(f"{where} is outside the segment")
        elif offset not in ends:
            report.problems.append(f"{where} is not the last offset of a batch of the segment")
        elif ends[offset] != timestamp:
            report.problems.append(f"{where}: that batch's max timestamp is {ends[offset]}")
        previous = (timestamp, relative)


def _check_txn_index(directory: Path, base_offset: int, report: DataCheckReport) -> None:
    path = directory / f"{base_offset:020d}{TXN_INDEX_SUFFIX}"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    if len(data) % TXN_ENTRY.size:
        report.notes.append(f"{path}: torn tail entry (the next start cuts it)")
    whole = len(data) - len(data) % TXN_ENTRY.size
    for n, (version, _, first, last, _) in enumerate(TXN_ENTRY.iter_unpack(data[:whole])):
        if version != TXN_ENTRY_VERSION or not 0 <= first <= last:
            report.problems.append(f"{path}: entry {n} (offsets {first}..{last}) does not parse")


# -- checkpoints -------------------------------------------------------------------------------
def _parse_checkpoint(
    path: Path, fields: int, report: DataCheckReport
) -> list[tuple[int, ...]] | None:
    try:
        return read_checkpoint(path, fields=fields)
    except StorageError as error:
        report.problems.append(error.message)
        return None


def _checkpoint_offset(path: Path, report: DataCheckReport) -> int | None:
    entries = _parse_checkpoint(path, 1, report)
    return entries[0][0] if entries else None


def _check_leader_epochs(
    directory: Path,
    log_end: int,
    batches: list[tuple[BatchHeader, bool]],
    report: DataCheckReport,
) -> None:
    path = directory / LEADER_EPOCH_CHECKPOINT
    entries = _parse_checkpoint(path, 2, report) or []
    previous = (-1, -1)
    for epoch, start_offset in entries:
        if epoch <= previous[0] or start_offset < previous[1]:
            report.problems.append(f"{path}: epoch {epoch} at {start_offset} does not increase")
        if start_offset > log_end:
            report.problems.append(
                f"{path}: epoch {epoch} starts at {start_offset}, past the log end {log_end}"
            )
        previous = (epoch, start_offset)
    _check_batch_epochs(path, [(e[0], e[1]) for e in entries], batches, report)


def _check_batch_epochs(
    path: Path,
    entries: list[tuple[int, int]],
    batches: list[tuple[BatchHeader, bool]],
    report: DataCheckReport,
) -> None:
    """The batches' partition leader epochs never decrease and are the ones the checkpoint
    gives their offsets: a follower fetches with the epoch of its log end from the checkpoint,
    and a wrong one hides a divergence from the leader (issue 30 §1). In a segment the next
    start recovers (no clean-shutdown marker) the epochs are rebuilt from the batches: a note.
    The first disagreement is reported, with how many batches disagree."""
    starts = [start for _, start in entries]
    previous_epoch, wrong, first = -1, 0, None
    for header, recovered in batches:
        epoch = header.partition_leader_epoch
        if epoch < 0:
            continue  # written without an epoch: nothing to compare
        if epoch < previous_epoch:
            report.problems.append(
                f"{path.parent}: the batch at {header.base_offset} has epoch {epoch}, below "
                f"an earlier batch's {previous_epoch}"
            )
        previous_epoch = max(previous_epoch, epoch)
        n = bisect.bisect_right(starts, header.last_offset) - 1
        if n < 0 or entries[n][0] == epoch:
            continue  # below the first entry (its start moved up inside a batch) or agreeing
        wrong += 1
        if first is None:
            first = (
                (
                    f"{path}: epoch {entries[n][0]} starts at {entries[n][1]}, but the batch at "
                    f"{header.base_offset}..{header.last_offset} has epoch {epoch}"
                ),
                recovered,
            )
    if first is None:
        return
    message, recovered = first
    message += f" ({wrong} batch{'es' if wrong != 1 else ''} disagree)"
    if recovered:
        report.notes.append(f"{message}; the next start rebuilds the epochs from the batches")
    else:
        report.problems.append(message)


def _check_producer_snapshots(directory: Path, report: DataCheckReport) -> None:
    for path in sorted(directory.glob(f"*{SNAPSHOT_SUFFIX}")):
        stem = path.name[: -len(SNAPSHOT_SUFFIX)]
        if not stem.isdigit():
            continue
        try:
            decode_snapshot(path.read_bytes(), int(stem))
        except StorageError as error:
            report.problems.append(f"{path}: producer snapshot: {error.message}")


# -- the metadata quorum -----------------------------------------------------------------------
def _check_metadata_dir(directory: Path, report: DataCheckReport) -> None:
    journal = directory / JOURNAL_FILE
    if journal.exists():
        try:
            records, end, declared_end = scan_journal(journal.read_bytes(), str(journal))
        except RaftStorageError as error:
            report.problems.append(str(error))
        else:
            if end != declared_end:
                report.problems.append(
                    f"{journal}: record {records} at byte {end} is torn or out of sequence "
                    f"below the declared end {declared_end}"
                )
    snapshot = directory / SNAPSHOT_FILE
    if snapshot.exists():
        try:
            snapshot_last_index(snapshot.read_bytes(), str(snapshot))
        except RaftStorageError as error:
            report.problems.append(str(error))
    meta = directory / (JOURNAL_FILE + ".meta")
    try:
        values = read_meta(meta)
    except ValueError as error:
        report.problems.append(str(error))
    else:
        if values and not isinstance(values.get("currentTerm", 0), int):
            report.problems.append(f"{meta}: currentTerm {values['currentTerm']!r} is no number")
    bootstrap = directory / BOOTSTRAP_FILE
    if bootstrap.exists() and not any(bootstrap.read_text().split()):
        report.problems.append(f"{bootstrap}: lists no voter")


def format_report(report: DataCheckReport, data_dir: Path) -> str:
    """What ``raftlog check-data`` prints."""
    lines = [*(f"problem: {p}" for p in report.problems), *(f"note: {n}" for n in report.notes)]
    count = len(report.problems)
    verdict = "OK" if report.ok else f"{count} problem{'s' if count != 1 else ''}"
    lines.append(
        f"{data_dir}: {report.partitions_checked} partitions, {report.segments_checked} "
        f"segments checked: {verdict}"
    )
    return "\n".join(lines)
