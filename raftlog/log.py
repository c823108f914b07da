"""The log of one partition: a directory ``<topic>-<partition>/`` of segments, as Kafka's
``UnifiedLog`` over ``LocalLog``.

A leader's :meth:`Log.append` validates each batch by its header and CRC, assigns offsets by
rewriting only ``baseOffset`` and ``partitionLeaderEpoch`` (both outside the CRC), and writes the
batches with one ``writev``; a follower's :meth:`Log.append_as_follower` keeps the leader's offsets.
:meth:`Log.read` returns whole stored batches. Nothing on either path decodes a record, except for
the Kafka rules that need it (compacted topics reject null keys, ``LogAppendTime`` re-stamps).

Thread safety: one lock per log serialises every call; callers may share a Log between threads.

IO errors: an ``OSError`` from a write path (a full disk, EIO) becomes :class:`LogDirIOError`
(KAFKA_STORAGE_ERROR), after the log's ``io_failure_listener`` heard of it: Kafka's
``LogDirFailureChannel``, where the broker takes the directory offline. An append that fails
leaves no torn bytes behind (the segment cuts them), so the files stay a valid log to recover.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Concatenate, NamedTuple, ParamSpec, TypeVar

from raftlog import cleaner
from raftlog.batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CONTROL_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_PRODUCER_ID,
    OFFSET_LENGTH_EPOCH,
    OFFSET_LENGTH_EPOCH_SIZE,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    iter_batches,
    verify_batch,
)
from raftlog.checkpoint import fsync_path, read_checkpoint, write_atomically, write_checkpoint
from raftlog.config import INT64_MAX, LogConfig
from raftlog.epoch import LeaderEpochCache
from raftlog.errors import (
    ErrorCode,
    InvalidRecordError,
    KafkaError,
    LogDirIOError,
    OffsetOutOfRangeError,
    StorageError,
)
from raftlog.index import CorruptIndexError
from raftlog.records import decode_batch, recompress_batch, set_log_append_time
from raftlog.retention import SegmentSummary, plan_retention
from raftlog.segment import (
    DELETED_SUFFIX,
    LOG_SUFFIX,
    MAX_RELATIVE_OFFSET,
    AppendedBatch,
    CachedRange,
    LogSegment,
    ReadPlan,
    RecoveryResult,
    read_planned,
    release_cached,
)
from raftlog.txn import TXN_INDEX_SUFFIX, AbortedTxn, aborted_in

CLEAN_SHUTDOWN_MARKER = ".clean-shutdown"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_CHECKPOINT = "log-start-offset-checkpoint"
PARTITION_METADATA = "partition.metadata"
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3
# KIP-405's local log start and KIP-1005's last tiered offset: nothing here is tiered, so the local
# log starts where the log does and no offset is in remote storage (ListOffsets answers -1)
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5
# One read takes a descriptor per segment it reads from (``LogSegment.plan_read``): a read with
# a large max_bytes over tiny segments stops here, and the reader asks again (Kafka reads from
# one segment a time)
READ_SEGMENTS_MAX = 16
# Segments waiting out file.delete.delay.ms, per log: past this many the oldest is deleted at
# once (a tiny segment.bytes under heavy retention must not pile up files without bound)
PENDING_DELETES_MAX = 1024


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _io_failures(method: Callable[Concatenate[Log, _P], _R]) -> Callable[Concatenate[Log, _P], _R]:
    """Turn an OSError of a write path into LogDirIOError, telling the listener first."""

    @functools.wraps(method)
    def wrapper(self: Log, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        except OSError as error:
            raise self._io_failed(error) from error

    return wrapper


log = logging.getLogger(__name__)
CACHE_RELEASE_RETRY_MS = 3_000  # how long a range is advised again after its first advice
_new_tuple = tuple.__new__


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir_name(name: str) -> tuple[str, int]:
    topic, _, partition = name.rpartition("-")
    if not topic or not partition.isdigit():
        raise StorageError(f"{name!r} is not a <topic>-<partition> directory name")
    return topic, int(partition)


class AppendInfo(NamedTuple):
    """What an append stored. A NamedTuple rather than a frozen dataclass: one is built per
    append, and a frozen dataclass's ``__init__`` (object.__setattr__ per field) cost ~1 µs."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    log_append_time_ms: int  # -1 unless the topic stamps LogAppendTime
    record_count: int
    size_bytes: int


@dataclass(frozen=True)
class RecoveryReport:
    clean_shutdown: bool
    recovered: tuple[RecoveryResult, ...]
    deleted_segments: tuple[int, ...]  # base offsets of segments after a truncated one
    notes: tuple[str, ...]  # damaged checkpoints and metadata that were ignored or rebuilt
    duration_ms: float

    @property
    def dropped_bytes(self) -> int:
        return sum(result.dropped_bytes for result in self.recovered)


@dataclass(frozen=True, slots=True)
class _AppendPolicy:
    """The configs every append reads, copied out of the LogConfig when it is set: a pydantic
    model's attribute costs several times a plain slot's (about 2 µs of a 16 KiB append)."""

    max_message_bytes: int
    keys_required: bool  # cleanup.policy has compact: a produced record needs a key
    log_append_time: bool  # message.timestamp.type=LogAppendTime
    recompress_to: int | None  # compression.type's codec id; None: producer (keep each batch's)
    compression_level: int | None  # compression.<codec>.level of that codec
    segment_bytes: int
    segment_ms: int  # segment.ms less this log's segment.jitter.ms share
    flush_on_ack: bool
    flush_messages: int
    flush_ms: int
    flush_by_time: bool  # flush.ms below its maximum (Kafka's "never"): only then read the clock
    timestamp_before_max_ms: int
    timestamp_after_max_ms: int
    checks_create_time: bool  # either bound above is set: only then read the clock per batch

    @classmethod
    def of(cls, config: LogConfig, name: str) -> _AppendPolicy:
        """``name``: the log's directory name, which picks its share of segment.jitter.ms."""
        return cls(
            max_message_bytes=config.max_message_bytes,
            keys_required=config.compact,
            log_append_time=config.message_timestamp_type == "LogAppendTime",
            recompress_to=COMPRESSION_IDS.get(config.compression_type),
            compression_level=config.compression_level,
            segment_bytes=config.segment_bytes,
            segment_ms=max_segment_ms(config) - segment_jitter_ms(config, name),
            flush_on_ack=config.flush_on_ack,
            flush_messages=config.flush_messages,
            flush_ms=config.flush_ms,
            flush_by_time=config.flush_ms < INT64_MAX,
            timestamp_before_max_ms=config.message_timestamp_before_max_ms,
            timestamp_after_max_ms=config.message_timestamp_after_max_ms,
            checks_create_time=(
                config.message_timestamp_before_max_ms < INT64_MAX
                or config.message_timestamp_after_max_ms < INT64_MAX
            ),
        )


_BATCH_LENGTH = struct.Struct(">i")  # at byte 8 of a batch, after baseOffset
COMPRESSION_IDS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def max_segment_ms(config: LogConfig) -> int:
    """How long a segment stays active: segment.ms, and for a compacted log no longer than
    max.compaction.lag.ms (KIP-354: the active segment is never cleaned, so a record older than
    the lag must leave it; Kafka's ``LogConfig.maxSegmentMs``)."""
    if config.compact:
        return min(config.segment_ms, config.max_compaction_lag_ms)
    return config.segment_ms


def segment_jitter_ms(config: LogConfig, name: str) -> int:
    """This log's share of ``segment.jitter.ms``: Kafka draws it at random below
    min(segment.jitter.ms, segment.ms); here it is drawn from the log's name, so it is the same
    after a restart and still spreads the partitions' rolls."""
    bound = min(config.segment_jitter_ms, max_segment_ms(config))
    return zlib.crc32(name.encode()) % bound if bound > 0 else 0


_Prepared = tuple[list[bytes | memoryview], list[AppendedBatch], list[tuple[int, int]], AppendInfo]
"""What _prepare plans for one append: the chunks for one writev (header rewrites included), what
the segment keeps of each batch, the (epoch, start offset) of epochs the batches begin, and the
AppendInfo the append returns. A plain tuple: one is built per append."""


class Log:
    def __init__(
        self,
        directory: Path,
        config: LogConfig | None = None,
        *,
        topic_id: uuid.UUID | None = None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.directory = Path(directory)
        self._lock = threading.RLock()
        self.work_listener: Callable[[], None] | None = None  # the owner's: see below
        self.config = config or LogConfig()
        self.clock = clock
        self._cache_release_failures = 0  # release_page_cache warns of the first one only
        # the _cache_key at which release_page_cache last found nothing left to advise
        self._cache_idle_at: tuple[object, ...] | None = None
        self._segments: list[LogSegment] = []
        self._base_offsets: list[int] = []
        # (due ms, segment) of segments removed from the log, renamed *.deleted and closed,
        # whose files go after file.delete.delay.ms (delete_due_segment_files)
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        # made here: nothing of an earlier life can be in it, so opening skips the recovery's
        # directory scans (a broker opening 10,000 new partitions spent ~40% of it in them)
        self.created = not self.directory.exists()
        if self.created:
            # A new partition: its name is durable before anything in it can be flushed (a
            # power cut would otherwise take the directory, and every fsynced byte under it)
            self.directory.mkdir(parents=True)
            fsync_path(self.directory.parent)
        self._notes: list[str] = []
        self._rebuild_epochs = False
        self._metadata_unsynced = False  # partition.metadata written, its fsync left to flush()
        self.topic_id = self._load_topic_id(topic_id)
        self.epochs = self._load_epochs()
        self._unflushed_records = 0
        self._last_flush_ms = clock()
        # The owner's hook, called under the log's lock with the new log start offset each time
        # retention or a full truncation moves it: the broker drops the producer-state snapshots
        # of the deleted segments there (files only; it must not take the owner's locks).
        self.log_start_listener: Callable[[int], None] | None = None
        # The owner's hook, called under the log's lock after the cleaner replaced the segments
        # in [base, end) by one segment at base (``end``: the next segment's base offset): the
        # broker drops the producer-state snapshots strictly inside that range there, those of
        # the segments that are gone (Kafka's ``deleteProducerSnapshots`` in
        # ``replaceSegments``). Files only, as ``log_start_listener``.
        self.segments_replaced_listener: Callable[[int, int], None] | None = None
        # The owner's hook for an OSError on a write path, called before LogDirIOError is raised
        # (Kafka's LogDirFailureChannel): the broker takes its log directory offline there.
        self.io_failure_listener: Callable[[Path, OSError], None] | None = None
        # The owner's hook, called after whatever may leave work for its timers (an append, a
        # roll, a truncation, segments replaced or set aside for deletion, a new config): the
        # broker's maintenance and page-cache threads then visit this log until
        # ``has_timed_work`` and ``cache_release_pending`` say it is idle, instead of visiting
        # every log each tick (1,000 idle partitions cost a broker 7% of a core that way, and it
        # grew with the count). May be called under the log's lock: it must not take it, nor
        # any lock held around an append. (Set to None above: the config setter calls it.)
        self.recovery = self._load()

    # -- opening -----------------------------------------------------------------------------
    def _read_checkpoint_or_note(self, name: str) -> int | None:
        """A one-offset checkpoint; a malformed one is noted and ignored (it only saves work)."""
        try:
            entries = read_checkpoint(self.directory / name, fields=1)
        except StorageError as error:
            self._notes.append(f"{error.message}: ignored")
            return None
        return entries[0][0] if entries else None

    def _load_epochs(self) -> LeaderEpochCache:
        try:
            return LeaderEpochCache(self.directory)
        except StorageError as error:
            self._notes.append(f"{error.message}: rebuilt from the batches")
            self._rebuild_epochs = True
            return LeaderEpochCache(self.directory, load=False)

    def _load_topic_id(self, expected: uuid.UUID | None) -> uuid.UUID | None:
        path = self.directory / PARTITION_METADATA
        try:
            stored = read_partition_metadata(path)
        except StorageError as error:
            self._notes.append(f"{error.message}: rewritten")
            path.unlink()
            stored = None
        if stored is not None and expected is not None and stored != expected:
            raise KafkaError(
                ErrorCode.INCONSISTENT_TOPIC_ID,
                f"{self.directory} belongs to topic id {stored}, not {expected}",
            )
        if stored is None and expected is not None:
            # Not fsynced here (two fsyncs of the few a new partition costs the broker opening
            # it): the first flush() makes it durable, so before the recovery point passes any
            # record (Kafka flushes it asynchronously too). Until then a power cut may lose or
            # tear it; the broker opens the directory from its image and writes it again.
            write_atomically(path, f"version: 0\ntopic_id: {expected}\n".encode(), durable=False)
            self._metadata_unsynced = True
        return stored or expected

    def _load(self) -> RecoveryReport:
        started = time.perf_counter()
        marker = self.directory / CLEAN_SHUTDOWN_MARKER
        clean = marker.exists()
        # the directory's names, read once: each scan was a directory read and a pattern match
        # per name, and an open made a dozen (a restart of 10,000 partitions spent a quarter
        # of its opening in them)
        names = [] if self.created else os.listdir(self.directory)
        if any(name.endswith(_LEFTOVER_SUFFIXES) for name in names):
            for leftover in self.directory.glob(f"*{DELETED_SUFFIX}"):
                leftover.unlink()  # retention took it; a crash came before its delete
            cleaner.complete_interrupted_swaps(self.directory)
            names = os.listdir(self.directory)
        self.recovery_point = self._read_checkpoint_or_note(RECOVERY_POINT_CHECKPOINT) or 0
        checkpointed_start = self._read_checkpoint_or_note(LOG_START_CHECKPOINT) or 0
        recovered, deleted = self._open_segments(clean, names)
        if not self._segments:
            self._add_segment(checkpointed_start)
        self._log_start_offset = max(self._segments[0].base_offset, checkpointed_start)
        self.active.on_become_active(self._preallocate_bytes)
        if self._rebuild_epochs:
            self.epochs.rebuild(
                (header.partition_leader_epoch, header.base_offset)
                for segment in self._segments
                for _, header in segment.iter_headers(0)
            )
        else:
            self._rebuild_recovered_epochs(recovered)
        self.epochs.truncate_from_end(self.log_end_offset)
        self.epochs.truncate_from_start(self._log_start_offset)
        cleaner.truncate_checkpoint(self, self.log_end_offset)
        if deleted or self.recovery_point != self.log_end_offset or _found_bytes(recovered):
            # the recovered records, then the epochs rebuilt from them, then the point passes
            for segment in self._segments:
                segment.flush()
            self.epochs.sync_file()
            self._set_recovery_point(self.log_end_offset)
        # else: only empty segments were recovered (every partition of a killed broker that
        # had no record beyond its recovery point): nothing to make durable, no fsync
        marker.unlink(missing_ok=True)
        duration_ms = (time.perf_counter() - started) * 1000
        return RecoveryReport(
            clean, tuple(recovered), tuple(deleted), tuple(self._notes), duration_ms
        )

    def _rebuild_recovered_epochs(self, recovered: list[RecoveryResult]) -> None:
        """The epochs of the recovered segments at the log's end come from their batches, not
        from the checkpoint (Kafka's LogLoader likewise cuts the cache to the recovered log and
        takes the epochs from its batches). The checkpoint is fsynced on every change while a
        truncation lowers the recovery point durably, so a truncation a power cut undid lies in
        a recovered segment; a segment recovered for a missing index alone, below segments
        that were not, keeps its entries (it was flushed: its batches are the checkpoint's)."""
        by_base = {result.base_offset: result for result in recovered}
        tail: list[RecoveryResult] = []
        for segment in reversed(self._segments):
            result = by_base.get(segment.base_offset)
            if result is None:
                break
            tail.append(result)
        if tail:
            tail.reverse()
            self.epochs.rebuild_from(
                tail[0].base_offset, (start for result in tail for start in result.epoch_starts)
            )

    def _open_segments(
        self, clean: bool, names: list[str]
    ) -> tuple[list[RecoveryResult], list[int]]:
        if self.created:
            return [], []
        base_offsets = sorted(
            int(name[: -len(LOG_SUFFIX)])
            for name in names
            if name.endswith(LOG_SUFFIX) and name[: -len(LOG_SUFFIX)].isdigit()
        )
        _remove_orphan_indexes(self.directory, set(base_offsets), names)
        recovered: list[RecoveryResult] = []
        deleted: list[int] = []
        for n, base_offset in enumerate(base_offsets):
            segment = self._add_segment(base_offset)
            next_base = base_offsets[n + 1] if n + 1 < len(base_offsets) else None
            unflushed = next_base is None or next_base > self.recovery_point
            result = self._load_segment(segment, recover=unflushed and not clean)
            if result is not None:
                recovered.append(result)
            if result is not None and result.dropped_bytes and next_base is not None:
                # Whatever followed a torn batch was written after it: it cannot be trusted.
                for later in self._segments_from_disk(base_offsets[n + 1 :]):
                    later.delete()
                    deleted.append(later.base_offset)
                break
        return recovered, deleted

    def _segments_from_disk(self, base_offsets: list[int]) -> list[LogSegment]:
        return [self.new_segment(base_offset) for base_offset in base_offsets]

    def _load_segment(self, segment: LogSegment, *, recover: bool) -> RecoveryResult | None:
        preallocated = self._config.preallocate
        if not recover and not segment.indexes_were_missing:
            try:
                segment.load(preallocated=preallocated)
                return None
            except CorruptIndexError:
                pass  # an index is only a cache of the log: rebuild it by recovery
        return segment.recover(preallocated=preallocated)

    def new_segment(self, base_offset: int) -> LogSegment:
        return LogSegment(
            self.directory,
            base_offset,
            index_interval_bytes=self.config.index_interval_bytes,
            max_index_bytes=self.config.segment_index_bytes,
            created_ms=self.clock(),
        )

    def _add_segment(self, base_offset: int) -> LogSegment:
        assert not self._base_offsets or base_offset > self._base_offsets[-1], (
            "segments must be added in increasing base offset order"
        )
        segment = self.new_segment(base_offset)
        segment.next_offset = base_offset
        self._segments.append(segment)
        self._base_offsets.append(base_offset)
        return segment

    # -- state -----------------------------------------------------------------------------
    @property
    def config(self) -> LogConfig:
        return self._config

    @config.setter
    def config(self, config: LogConfig) -> None:
        with self._lock:
            self._config = config
            self._policy = _AppendPolicy.of(config, self.directory.name)
        self.notify_work()  # flush.ms may now apply to records already appended

    def notify_work(self) -> None:
        """Tell the owner's timers this log may have work (``work_listener``); also for the
        owner's files kept beside the log, such as producer-state snapshots awaiting an fsync."""
        listener = self.work_listener
        if listener is not None:
            listener()

    def has_timed_work(self) -> bool:
        """Whether :meth:`maybe_flush` or :meth:`delete_due_segment_files` may still have
        something to do: records a time-based flush (``flush.ms``) waits for, or segment files
        whose ``file.delete.delay.ms`` runs. Read without the lock: a change after it notifies."""
        return bool(self._pending_deletes) or (
            self._policy.flush_by_time and self._unflushed_records > 0
        )

    @property
    def active(self) -> LogSegment:
        return self._segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def size_bytes(self) -> int:
        return sum(segment.size_bytes for segment in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def segment_summaries(self) -> list[SegmentSummary]:
        with self._lock:
            return [
                SegmentSummary(s.base_offset, s.next_offset, s.size_bytes, s.largest_timestamp_ms())
                for s in self._segments
            ]

    # -- appending ---------------------------------------------------------------------------
    def append(
        self,
        records: bytes | bytearray | memoryview,
        *,
        leader_epoch: int,
        from_client: bool = False,
    ) -> AppendInfo:
        """Append as the leader: validate, assign offsets from the log end, stamp the epoch.
        ``from_client``: a producer's batches (Kafka's ``AppendOrigin.CLIENT``), which may be
        neither control batches (markers come from transaction coordinators) nor transactional
        without a producer id."""
        try:  # _io_failures, inlined: its wrapper's call costs a few % of a 16 KiB append
            with self._lock:
                if self._policy.recompress_to is not None:
                    records = self._recompressed(records, self._policy.recompress_to)
                if self._policy.log_append_time:
                    records = self._stamp_log_append_time(records)
                    prepared = self._prepare(records, leader_epoch=leader_epoch,
                                             from_client=from_client)  # fmt: skip
                    info = self._write(prepared)
                    return info._replace(log_append_time_ms=info.max_timestamp)
                return self._write(
                    self._prepare(records, leader_epoch=leader_epoch, from_client=from_client)
                )
        except OSError as error:
            raise self._io_failed(error) from error

    def append_as_follower(self, records: bytes | bytearray | memoryview) -> AppendInfo:
        """Append a leader's batches as they are: offsets and epochs are kept."""
        try:  # _io_failures, inlined as in append
            with self._lock:
                return self._write(self._prepare(records, leader_epoch=None))
        except OSError as error:
            raise self._io_failed(error) from error

    def _io_failed(self, error: OSError) -> LogDirIOError:
        """An OSError of a write path as the LogDirIOError to raise, the listener told first."""
        listener = self.io_failure_listener
        if listener is not None:
            listener(self.directory, error)
        return LogDirIOError(f"{self.directory}: {error}")

    def _recompressed(
        self, records: bytes | bytearray | memoryview, codec: int
    ) -> bytes | bytearray | memoryview:
        """``records`` with each batch in another codec than ``compression.type``'s recompressed
        (Kafka's LogValidator); the very same buffer, untouched, when every batch is in that codec
        already (the common case costs one read of each header's attributes). Control batches
        keep their codec, as Kafka's do. A malformed tail is left for ``_prepare`` to refuse."""
        view = memoryview(records)
        end = len(view)
        position = 0
        parts: list[bytes | memoryview] = []
        kept_from = 0
        while position + HEADER_SIZE <= end:
            size_bytes = _BATCH_LENGTH.unpack_from(view, position + 8)[0] + LOG_OVERHEAD
            attributes = view[position + ATTRIBUTES_OFFSET + 1]  # the low byte of the i16
            if size_bytes < HEADER_SIZE or position + size_bytes > end:
                break
            if attributes & COMPRESSION_MASK != codec and not attributes & CONTROL_MASK:
                parts.append(view[kept_from:position])
                batch = view[position : position + size_bytes]
                parts.append(recompress_batch(batch, codec, self._policy.compression_level))
                kept_from = position + size_bytes
            position += size_bytes
        if not parts:
            return records
        parts.append(view[kept_from:])
        return b"".join(parts)

    def _stamp_log_append_time(self, records: bytes | bytearray | memoryview) -> bytes:
        now = self.clock()
        return b"".join(
            set_log_append_time(bytes(memoryview(records)[pos : pos + h.size_bytes]), now)
            for pos, h in iter_batches(records)
        )

    def _prepare(
        self,
        records: bytes | bytearray | memoryview,
        *,
        leader_epoch: int | None,
        from_client: bool = False,
    ) -> _Prepared:
        """Check every batch (header, CRC, size) and plan its write. As the leader
        (``leader_epoch`` given) offsets continue from the log end and the batch's first 16 bytes
        are rewritten; as a follower the batch is kept whole and must not go below the log end.
        One pass over the headers, nothing per record; most appends carry a single batch."""
        view = memoryview(records)
        end = len(view)
        max_message_bytes = self._policy.max_message_bytes
        keys_required = leader_epoch is not None and self._policy.keys_required
        checks_create_time = leader_epoch is not None and self._policy.checks_create_time
        chunks: list[bytes | memoryview] = []
        batches: list[AppendedBatch] = []
        new_epochs: list[tuple[int, int]] = []
        latest_epoch = self.epochs.latest_epoch
        first_offset = next_offset = self.log_end_offset
        position = record_count = 0
        max_timestamp = -1
        while position < end:
            header = verify_batch(view, position)
            (
                base_offset, batch_length, epoch, _, _, attributes, last_offset_delta, _,
                batch_max_timestamp, _, _, _, batch_records,
            ) = header  # fmt: skip
            size_bytes = batch_length + LOG_OVERHEAD
            if size_bytes > max_message_bytes:
                raise _message_too_large(size_bytes, max_message_bytes)
            if leader_epoch is not None:
                # check_header saw lastOffsetDelta >= 0: this also means recordCount >= 1.
                if batch_records != last_offset_delta + 1:
                    raise _gaps_in_produced_batch(batch_records, last_offset_delta)
                if keys_required:
                    _check_keys_present(view, position)
                if checks_create_time and not attributes & TIMESTAMP_TYPE_MASK:
                    self._check_create_time(header)
                if from_client and attributes & (TRANSACTIONAL_MASK | CONTROL_MASK):
                    _check_client_transactional(attributes, header.producer_id)
                base_offset, epoch = next_offset, leader_epoch
                chunks.append(OFFSET_LENGTH_EPOCH.pack(base_offset, batch_length, epoch))
                chunks.append(view[position + OFFSET_LENGTH_EPOCH_SIZE : position + size_bytes])
            else:
                if base_offset < next_offset:
                    raise _below_log_end(base_offset, next_offset)
                chunks.append(view[position : position + size_bytes])
            if position == 0:
                first_offset = base_offset
            if epoch > latest_epoch:
                new_epochs.append((epoch, base_offset))
                latest_epoch = epoch
            last_offset = base_offset + last_offset_delta
            batches.append((last_offset, batch_max_timestamp, size_bytes))
            record_count += batch_records
            max_timestamp = max(max_timestamp, batch_max_timestamp)
            next_offset = last_offset + 1
            position += size_bytes
        if not batches:
            raise InvalidRecordError("an append must carry at least one record batch")
        assert position == end, "verify_batch framed the batches to the end of the buffer"
        info = _new_tuple(  # AppendInfo(...) without its __new__'s Python frame: per append
            AppendInfo,
            (first_offset, next_offset - 1, max_timestamp, -1, record_count, end),
        )
        return chunks, batches, new_epochs, info

    def _check_create_time(self, header: BatchHeader) -> None:
        """message.timestamp.before/after.max.ms, on the batch's first and largest timestamps
        (the header's, so no record is decoded; a producer's first record is its earliest)."""
        policy = self._policy
        now = self.clock()
        if header.max_timestamp - now > policy.timestamp_after_max_ms:
            raise KafkaError(
                ErrorCode.INVALID_TIMESTAMP,
                f"timestamp {header.max_timestamp} is more than message.timestamp.after.max.ms "
                f"{policy.timestamp_after_max_ms} ahead of the broker's clock {now}",
            )
        if (
            header.base_timestamp >= 0
            and now - header.base_timestamp > policy.timestamp_before_max_ms
        ):
            raise KafkaError(
                ErrorCode.INVALID_TIMESTAMP,
                f"timestamp {header.base_timestamp} is more than message.timestamp.before.max.ms "
                f"{policy.timestamp_before_max_ms} behind the broker's clock {now}",
            )

    def _write(self, prepared: _Prepared) -> AppendInfo:
        """Store prepared batches at the log end (rolling first if due), then record the epochs
        they start and apply the flush policy."""
        chunks, batches, new_epochs, info = prepared
        segment = self._segments[-1]
        if self._should_roll(segment, info):
            segment = self.roll(max(info.first_offset, self.log_end_offset))
        segment.append(chunks, batches)
        for epoch, start_offset in new_epochs:
            self.epochs.assign(epoch, start_offset)
        self._unflushed_records += info.record_count
        policy = self._policy  # the flush policy, inlined: this runs on every append
        if (
            policy.flush_on_ack
            or self._unflushed_records >= policy.flush_messages
            or (policy.flush_by_time and self.clock() - self._last_flush_ms >= policy.flush_ms)
        ):
            self.flush()
        self.notify_work()  # the page cache to release, a flush.ms to wait for
        return info

    def _should_roll(self, segment: LogSegment, info: AppendInfo) -> bool:
        """Kafka's rules: roll when an offset would not fit the segment's relative (i32) index;
        never roll an empty segment otherwise; then segment.bytes, a full index, and segment.ms
        counted from the first batch's timestamp (or, without one, the segment's creation)."""
        if info.last_offset - segment.base_offset > MAX_RELATIVE_OFFSET:
            return True
        if segment.size_bytes == 0:
            return False
        policy = self._policy
        if (
            segment.size_bytes + info.size_bytes > policy.segment_bytes
            or not segment.can_index_more()
        ):
            return True
        rolling_timestamp = segment.rolling_timestamp
        if rolling_timestamp is not None and rolling_timestamp >= 0:
            waited_ms = info.max_timestamp - rolling_timestamp
        else:
            waited_ms = self.clock() - segment.created_ms
        return waited_ms > policy.segment_ms

    @property
    def _preallocate_bytes(self) -> int:
        """What a new active segment's file is preallocated to: segment.bytes with
        ``preallocate``, else nothing."""
        return self._policy.segment_bytes if self._config.preallocate else 0

    @_io_failures
    def roll(self, base_offset: int | None = None) -> LogSegment:
        """Start a new active segment (at the log end offset unless told otherwise)."""
        with self._lock:
            base_offset = self.log_end_offset if base_offset is None else base_offset
            if self.active.size_bytes == 0:
                if base_offset == self.active.base_offset:
                    return self.active
                self._delete_segments(len(self._segments) - 1, len(self._segments))
            else:
                self.active.on_roll()
            segment = self._add_segment(base_offset)
            segment.on_become_active(self._preallocate_bytes)
            self.notify_work()
            return segment

    # -- flushing ----------------------------------------------------------------------------
    @_io_failures
    def maybe_flush(self) -> bool:
        """For the owner's timer: flush if ``flush.ms`` has passed since the last flush. A log
        with nothing unflushed answers without its lock (a record appended meanwhile waits a
        tick); the timer visits only logs that notified (``work_listener``)."""
        if not self._unflushed_records:
            return False
        with self._lock:
            if self._unflushed_records and (
                self.clock() - self._last_flush_ms >= self._policy.flush_ms
            ):
                self.flush()
                return True
            return False

    @_io_failures
    def flush(self) -> None:
        """fsync every segment holding data beyond the recovery point; move the point to the end.
        A segment created since the last flush has a name that only an fsync of the directory
        makes durable (Kafka's ``LocalLog.flush``): without it a power cut loses the whole file,
        fsynced records and all, and every segment after it with them."""
        with self._lock:
            first = max(0, bisect.bisect_right(self._base_offsets, self.recovery_point) - 1)
            for segment in self._segments[first:]:
                segment.flush()
            # The epochs and the topic id of the records made durable, before the recovery
            # point can pass them; after the records: a directory fsync before them would make
            # a new segment's name durable while its records are not (a gap at recovery).
            renamed = self.epochs.sync_file()
            if self._metadata_unsynced:
                fsync_path(self.directory / PARTITION_METADATA)
                renamed = True
            if renamed or self._base_offsets[-1] >= self.recovery_point:
                fsync_path(self.directory)
            self._metadata_unsynced = False
            self.recovery_point = self.log_end_offset
            self._unflushed_records = 0
            self._last_flush_ms = self.clock()

    @_io_failures
    def checkpoint(self) -> None:
        """Persist the recovery point (the owner calls this periodically and on roll)."""
        with self._lock:
            self._set_recovery_point(self.recovery_point)

    def _set_recovery_point(self, offset: int) -> None:
        self.recovery_point = offset
        write_checkpoint(self.directory / RECOVERY_POINT_CHECKPOINT, [(offset,)])

    # -- the page cache ----------------------------------------------------------------------
    def release_page_cache(self, keep_bytes: int, now_ms: int | None = None) -> int:
        """Write back, and drop from the page cache, what this process appended to the log
        before its last ``keep_bytes`` (:func:`raftlog.segment.release_cached`, advice to the
        kernel). The owner calls this every tick: each range is advised again for
        ``CACHE_RELEASE_RETRY_MS`` after its first advice, which starts the writeback of its
        dirty pages, so it is dropped once written back. The tail stays cached for followers
        and consumers; a reader further behind reads from the disk. Returns the bytes advised
        for the first time (released); ``keep_bytes`` <= 0: nothing (the kernel decides, as for
        Kafka's logs).

        Why: the kernel otherwise keeps every byte written until memory runs short, writes it
        back in bursts once ``vm.dirty_background_ratio`` of memory is dirty (appends and reads
        then stall behind the writeback), and takes a fresh page for every byte written.
        Measured here (docs/operations.md, **The page cache**): dirty data stayed at ~200 MB
        instead of climbing to ~2.3 GB, and on this VM, where a page that sat free is handed back
        to the host and costs a fault to write again, reused pages made produce ~2x faster."""
        if not self.cache_release_pending(keep_bytes):
            return 0
        now_ms = self.clock() if now_ms is None else now_ms
        ranges: list[CachedRange] = []  # each holds a descriptor: closed here whatever happens
        released = 0
        try:
            with self._lock:
                behind = 0  # bytes of the log after the segment at hand
                for segment in reversed(self._segments):
                    limit = segment.size_bytes - max(0, keep_bytes - behind)
                    behind += segment.size_bytes
                    if limit <= 0:
                        continue
                    if segment.cache_released:
                        break  # and so were the ones before it
                    cached = segment.plan_cache_release(limit, now_ms, CACHE_RELEASE_RETRY_MS)
                    if cached is not None:
                        ranges.append(cached)
            for cached in ranges:
                release_cached(cached)
                released += cached.first_bytes
            if not ranges:
                self._cache_idle_at = self._cache_key(keep_bytes)
        except OSError as error:  # advice: a failure changes nothing stored
            self._cache_release_failures += 1
            log.log(
                logging.WARNING if self._cache_release_failures == 1 else logging.DEBUG,
                "%s: page cache release failed (%d times): %s",
                self.directory.name, self._cache_release_failures, error,
            )  # fmt: skip
        finally:
            for cached in ranges:
                os.close(cached.fd)
        return released

    def cache_release_pending(self, keep_bytes: int) -> bool:
        """Whether :meth:`release_page_cache` may still advise something. False once it found
        nothing left to advise at this size (retries done): nothing is until the log changes,
        which notifies (``work_listener``). Read without the lock."""
        if keep_bytes <= 0 or not hasattr(os, "posix_fadvise"):
            return False
        return self._cache_idle_at != self._cache_key(keep_bytes)

    def _cache_key(self, keep_bytes: int) -> tuple[object, ...]:
        """What ``release_page_cache``'s plan depends on besides the clock: which segments
        (a roll, retention, a truncation or the cleaner replaces them) and the active one's
        size. Advice only: a truncation refilled to the same size between two ticks is
        released after the next append."""
        segments = self._segments
        size = segments[-1].size_bytes if segments else -1
        return (*map(id, segments), size, keep_bytes)

    # -- reading -----------------------------------------------------------------------------
    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> bytes:
        """Whole batches from the one containing ``offset``, up to ``max_bytes`` (at least one
        batch if ``min_one_batch``), only batches that end below ``max_offset`` (the high
        watermark for consumers). OFFSET_OUT_OF_RANGE outside [log start, log end]."""
        plans: list[ReadPlan] = []  # each holds a descriptor: closed here whatever happens
        try:
            with self._lock:
                end = self.log_end_offset
                if not self._log_start_offset <= offset <= end:
                    raise OffsetOutOfRangeError(
                        f"offset {offset} is outside [{self._log_start_offset}, {end}] "
                        f"of {self.directory.name}"
                    )
                bound = end if max_offset is None else min(max_offset, end)
                if offset >= bound:  # a long poll at the end asks again and again: no read
                    return b""
                first = max(0, bisect.bisect_right(self._base_offsets, offset) - 1)
                self._plan_reads(
                    self._segments[first:], offset, max_bytes, bound, min_one_batch, plans
                )
            # The reads themselves without the lock (Kafka reads a snapshot of its segments
            # the same way): a read blocked on a page under writeback held up every append.
            parts: list[bytes] = []
            while plans:
                data, reached_end = read_planned(plans.pop(0), bound)
                if data:
                    parts.append(data)
                if not reached_end:
                    break
            return parts[0] if len(parts) == 1 else b"".join(parts)
        finally:
            for plan in plans:
                os.close(plan.fd)

    @staticmethod
    def _plan_reads(
        segments: list[LogSegment],
        offset: int,
        max_bytes: int,
        bound: int,
        min_one_batch: bool,
        plans: list[ReadPlan],
    ) -> None:
        """Append to ``plans`` the ranges of ``segments`` a read from ``offset`` takes (under
        the log's lock; ``plans`` is the caller's, so it can close what a failure left)."""
        remaining = max_bytes
        for segment in segments:
            plan = segment.plan_read(
                max(offset, segment.base_offset),
                remaining,
                bound,
                min_one_batch=min_one_batch and not plans,
            )
            if isinstance(plan, bool):
                if plan and remaining > 0:
                    continue  # nothing of it here: the next segment
                return
            plans.append(plan)
            remaining -= plan.length
            if not plan.ends_segment or remaining <= 0 or len(plans) == READ_SEGMENTS_MAX:
                return

    def offsets_for_time(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record whose timestamp is >= ``timestamp``, as Kafka's
        ListOffsets; -2 earliest, -1 latest, -3 the record with the largest timestamp."""
        with self._lock:
            if timestamp == EARLIEST_TIMESTAMP:
                return self._log_start_offset, -1
            if timestamp == LATEST_TIMESTAMP:
                return self.log_end_offset, -1
            if timestamp == MAX_TIMESTAMP:
                best = max(self._segments, key=lambda s: s.max_timestamp)
                if best.max_timestamp < 0:
                    return None
                return best.offset_of_max_timestamp, best.max_timestamp
            for segment in self._segments:
                if segment.max_timestamp < timestamp:
                    continue
                found = segment.find_offset_by_timestamp(timestamp)
                if found is None:
                    continue
                position, header = found
                _, records = decode_batch(segment.read_raw(position, header.size_bytes))
                for record in records:
                    if record.timestamp >= timestamp and record.offset >= self._log_start_offset:
                        return record.offset, record.timestamp
            return None

    def assign_leader_epoch(self, epoch: int) -> None:
        """A new leader records that ``epoch`` starts at its log end (Kafka's
        ``maybeAssignEpochStartOffset``), so a follower that asks for the end of an older epoch
        learns where it ended even before this leader appends anything."""
        with self._lock:
            if epoch > self.epochs.latest_epoch:
                self.epochs.assign(epoch, self.log_end_offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        with self._lock:
            return self.epochs.end_offset_for_epoch(epoch, self.log_end_offset)

    # -- truncation ------------------------------------------------------------------------
    @_io_failures
    def truncate_to(self, offset: int) -> int:
        """Remove every batch holding offsets >= ``offset`` (a follower's divergence repair);
        return the new log end offset. Below the log start this empties the log.

        The truncation is durable before anything else is written: the leader-epoch checkpoint
        is rewritten durably at once, and the epochs appended next reach the disk (by a flush,
        or rebuilt from their batches by recovery); a power cut that brought the cut batches
        back under them would hand their offsets to the wrong epoch (issue 30 §1). One fsync
        of the directory if whole segments went (before the cut segment's: never a gap between
        them), and of the segment: divergence is rare."""
        with self._lock:
            if offset < self._log_start_offset:
                self.truncate_fully_and_start_at(offset)
                return offset
            if offset >= self.log_end_offset:
                return self.log_end_offset
            keep = bisect.bisect_right(self._base_offsets, offset)
            if keep == 0:
                self.truncate_fully_and_start_at(offset)
                return offset
            removed = keep < len(self._segments)
            self._delete_segments(keep, len(self._segments))
            if removed:  # gone first: a power cut must not keep them after a truncated one
                fsync_path(self.directory)  # (a gap between the two the recovery kept)
            self.active.truncate_to(offset)
            self.active.flush()
            cleaner.truncate_checkpoint(self, self.log_end_offset)
            self.active.on_become_active(self._preallocate_bytes)
            self.epochs.truncate_from_end(self.log_end_offset)
            self.recovery_point = min(self.recovery_point, self.log_end_offset)
            self._set_recovery_point(self.recovery_point)
            self.notify_work()
            return self.log_end_offset

    @_io_failures
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop everything; the log restarts empty at ``offset`` (log start = log end)."""
        with self._lock:
            self._delete_segments(0, len(self._segments))
            self._add_segment(offset).on_become_active(self._preallocate_bytes)
            fsync_path(self.directory)  # the old names gone, the new one there: see truncate_to
            self.epochs.clear()
            cleaner.truncate_checkpoint(self, offset)
            self._set_log_start_offset(offset)
            self._set_recovery_point(offset)
            self.notify_work()

    def _delete_segments(self, start: int, stop: int) -> None:
        for segment in self.delete_later(self._detach_segments(start, stop)):
            segment.delete()

    def delete_later(self, segments: list[LogSegment]) -> list[LogSegment]:
        """Segments taken out of the log, their files renamed ``*.deleted``: kept, closed, for
        ``file.delete.delay.ms`` (Kafka's asynchronous segment deletion), then deleted by
        :meth:`delete_due_segment_files`. A fetch already reading one keeps its own descriptor
        either way. Returns the segments to delete now: all of them without a delay, else any
        pushed out by ``PENDING_DELETES_MAX``. Under the log's lock."""
        delay_ms = self._config.file_delete_delay_ms
        if delay_ms <= 0:
            return segments
        due_ms = self.clock() + delay_ms
        for segment in segments:
            segment.close()  # cheap: the file is still linked, its blocks stay
            self._pending_deletes.append((due_ms, segment))
        self.notify_work()
        overflow = len(self._pending_deletes) - PENDING_DELETES_MAX
        if overflow <= 0:
            return []
        now = [segment for _, segment in self._pending_deletes[:overflow]]
        del self._pending_deletes[:overflow]
        return now

    def delete_due_segment_files(self, now_ms: int | None = None) -> int:
        """Delete the files of segments whose ``file.delete.delay.ms`` has passed (the owner
        calls this every tick); returns how many segments. The unlinks, which free the blocks,
        run outside the log's lock."""
        if not self._pending_deletes:  # read without the lock: a tick later is soon enough
            return 0
        with self._lock:
            now_ms = self.clock() if now_ms is None else now_ms
            due = [segment for at_ms, segment in self._pending_deletes if at_ms <= now_ms]
            self._pending_deletes = [e for e in self._pending_deletes if e[0] > now_ms]
        for segment in due:
            segment.delete()
        return len(due)

    @property
    def pending_deletes(self) -> int:
        """Segments renamed ``*.deleted`` whose files wait for ``file.delete.delay.ms``."""
        return len(self._pending_deletes)

    def _detach_segments(self, start: int, stop: int) -> list[LogSegment]:
        """Take segments out of the log, their files renamed to ``*.deleted``; the caller
        deletes them (retention after releasing the lock: see ``delete_old_segments``)."""
        detached = self._segments[start:stop]
        for segment in detached:
            segment.mark_deleted()
        del self._segments[start:stop]
        del self._base_offsets[start:stop]
        return detached

    def _set_log_start_offset(self, offset: int) -> None:
        self._log_start_offset = offset
        write_checkpoint(self.directory / LOG_START_CHECKPOINT, [(offset,)])
        self.epochs.truncate_from_start(offset)
        if self.log_start_listener is not None:
            self.log_start_listener(offset)

    # -- retention and compaction ------------------------------------------------------------
    @_io_failures
    def maybe_increment_log_start_offset(self, offset: int, high_watermark: int) -> bool:
        """Move the log start offset up to ``offset`` (DeleteRecords on the leader, the
        leader's log start offset on a follower: Kafka's ``maybeIncrementLogStartOffset``);
        never back, never past ``high_watermark`` (OFFSET_OUT_OF_RANGE). Written to the
        log-start-offset checkpoint at once, so a restart keeps it; the segments wholly below
        go with the next ``delete_old_segments``. True if it moved."""
        with self._lock:
            if offset > high_watermark:
                raise OffsetOutOfRangeError(
                    f"log start offset {offset} is beyond the high watermark {high_watermark} "
                    f"of {self.directory.name}"
                )
            if offset <= self._log_start_offset:
                return False
            self._set_log_start_offset(offset)
            return True

    @_io_failures
    def delete_old_segments(
        self, high_watermark: int | None = None, *, retention: bool = True
    ) -> int:
        """Apply retention.ms / retention.bytes / the log start offset; return segments deleted.
        Without ``retention`` only the segments wholly below the log start offset go."""
        with self._lock:
            plan = plan_retention(
                self.segment_summaries(),
                now_ms=self.clock(),
                retention_ms=self.config.retention_ms,
                retention_bytes=self.config.retention_bytes,
                delete_policy=self.config.delete and retention,
                log_start_offset=self._log_start_offset,
                high_watermark=self.log_end_offset if high_watermark is None else high_watermark,
            )
            if plan.delete_count == 0:
                return 0
            if plan.roll_first:
                self.roll()
            doomed = self.delete_later(self._detach_segments(0, plan.delete_count))
            self._set_log_start_offset(max(self._log_start_offset, self._segments[0].base_offset))
        # Closing a deleted file frees its blocks, which on a discard-mounted disk took ~0.3 s
        # for 512 MiB here: not under the lock, where every append of the partition waits
        # (Kafka deletes them later, on its scheduler). Readers have descriptors of their own.
        for segment in doomed:
            segment.delete()
        return plan.delete_count

    @_io_failures
    def compact(
        self, *, force: bool = False, max_offset: int | None = None
    ) -> cleaner.CleanResult | None:
        """Run one cleaning pass if ``cleanup.policy`` has compact and the dirty ratio is reached
        (or ``force``); the active segment is never touched, nor anything at or above
        ``max_offset`` (the owner passes the last stable offset: an undecided transaction, or
        records not yet replicated, are not cleaned) or the first open transaction in the log."""
        with self._lock:
            if not self.config.compact:
                return None
            return cleaner.clean(self, force=force, max_offset=max_offset)

    def replace_segments(self, old: list[LogSegment], new: LogSegment) -> None:
        """For the cleaner, after the swap committed: a run of consecutive segments becomes
        their cleaned replacement; ``segments_replaced_listener`` hears which offsets it spans."""
        with self._lock:
            start = self._segments.index(old[0])
            assert self._segments[start : start + len(old)] == old, "segments must be consecutive"
            assert new.base_offset == old[0].base_offset, "a cleaned segment keeps its first base"
            self._segments[start : start + len(old)] = [new]
            self._base_offsets[start : start + len(old)] = [new.base_offset]
            # never the active segment: a segment follows, and its base bounds the range
            assert start + 1 < len(self._segments), "the cleaner replaced the active segment"
            if self.segments_replaced_listener is not None:
                self.segments_replaced_listener(new.base_offset, self._base_offsets[start + 1])
            self.notify_work()

    # -- transactions (raftlog/txn.py) ---------------------------------------------------------
    @_io_failures
    def append_aborted(self, aborted: AbortedTxn) -> None:
        """Record a transaction that an abort marker at ``aborted.last_offset`` ended, in the
        transaction index of the segment that holds the marker (the owner of producer state
        calls this once the marker is appended, and again for markers it replays on recovery:
        an entry for that marker already there is not added twice, even if it differs: after
        compaction removed the first batches of the transaction, a replay finds a later first
        offset than the entry kept). Nor is one below the index's last entry: the index is whole
        up to that (a torn tail or a truncation cuts only its end), so compaction dropped this
        one with the last of its records."""
        with self._lock:
            index = bisect.bisect_right(self._base_offsets, aborted.last_offset) - 1
            if index < 0 or aborted.last_offset >= self._segments[-1].next_offset:
                raise StorageError(
                    f"{self.directory.name}: no marker at offset {aborted.last_offset} in the log"
                )
            entries = self._segments[index].txn_index.entries
            if entries and entries[-1].last_offset >= aborted.last_offset:
                return
            self._segments[index].txn_index.append(aborted)

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """The aborted transactions that meet ``[start_offset, end_offset)`` (what a
        read_committed fetch of that range returns beside its records), by first offset."""
        with self._lock:
            indexes = [s.txn_index for s in self._segments if s.next_offset > start_offset]
        return aborted_in(indexes, start_offset, end_offset)

    def batch_headers(self, start_offset: int = 0) -> Iterator[BatchHeader]:
        """The header of every batch from the log start, oldest first (what producer state is
        rebuilt from); with ``start_offset``, only those of the batches that begin at or after
        it (the rescan after a producer-state snapshot of that offset), found through the
        offset index. The segments are those of the moment of the call."""
        with self._lock:
            first = max(0, bisect.bisect_right(self._base_offsets, start_offset) - 1)
            segments = self._segments[first:]
            log_start_offset = self._log_start_offset
        for segment in segments:
            position = 0
            if segment.base_offset < start_offset:
                found = segment.translate_offset(start_offset)
                if found is None:
                    continue  # every batch of this segment ends below start_offset
                position = found[0]
            for _, header in segment.iter_headers(position):
                if header.base_offset >= start_offset and header.last_offset >= log_start_offset:
                    yield header

    def segments(self) -> list[LogSegment]:
        with self._lock:
            return list(self._segments)

    # -- closing -----------------------------------------------------------------------------
    @_io_failures
    def close(self) -> None:
        """Clean shutdown: flush, checkpoint, close the files, then write the marker."""
        with self._lock:
            if not self._segments:
                return
            self.flush()
            self._set_recovery_point(self.log_end_offset)
            for segment in self._segments:
                segment.close()
            self._segments = []
            self._base_offsets = []
            # no fetch outlives the log: the deleted segments' files go now, not at next load
            for _, deleted in self._pending_deletes:
                deleted.delete()
            self._pending_deletes = []
            write_atomically(self.directory / CLEAN_SHUTDOWN_MARKER, b"")

    def abandon(self) -> None:
        """Close the files without flushing or marking a clean shutdown: what a crash leaves
        (preallocated files untrimmed, ``*.deleted`` files left for the next load)."""
        with self._lock:
            for segment in self._segments:
                segment.close(trim_log=False)
            self._segments = []
            self._base_offsets = []
            self._pending_deletes = []


def _check_client_transactional(attributes: int, producer_id: int) -> None:
    """What Kafka's ``LogValidator`` refuses of a client's transactional or control batch."""
    if attributes & CONTROL_MASK:
        raise InvalidRecordError("clients may not write control batches")
    if producer_id == NO_PRODUCER_ID:
        raise InvalidRecordError("a transactional batch must carry a producer id")


def _message_too_large(size_bytes: int, max_message_bytes: int) -> KafkaError:
    return KafkaError(
        ErrorCode.MESSAGE_TOO_LARGE,
        f"batch of {size_bytes} bytes exceeds max.message.bytes {max_message_bytes}",
    )


def _below_log_end(base_offset: int, log_end_offset: int) -> InvalidRecordError:
    return InvalidRecordError(
        f"follower append at offset {base_offset} is below the log end offset {log_end_offset}"
    )


def _gaps_in_produced_batch(record_count: int, last_offset_delta: int) -> InvalidRecordError:
    return InvalidRecordError(
        f"a produced batch must hold records 0..lastOffsetDelta without gaps "
        f"(recordCount {record_count}, lastOffsetDelta {last_offset_delta})"
    )


def _check_keys_present(view: memoryview, position: int) -> None:
    _, records = decode_batch(view, position)
    if any(record.key is None for record in records):
        raise InvalidRecordError("a compacted topic cannot accept a record without a key")


# names an interrupted deletion or compaction leaves (cleaner.complete_interrupted_swaps)
_LEFTOVER_SUFFIXES = (DELETED_SUFFIX, cleaner.SWAP_SUFFIX, cleaner.CLEANED_SUFFIX)
_INDEX_SUFFIXES = (".index", ".timeindex", TXN_INDEX_SUFFIX)


def _found_bytes(recovered: list[RecoveryResult]) -> bool:
    """A recovery read or cut bytes (not only empty segments)."""
    return any(result.valid_bytes or result.dropped_bytes for result in recovered)


def _remove_orphan_indexes(directory: Path, base_offsets: set[int], names: list[str]) -> None:
    """Remove indexes without a segment and leftover temporaries (of ``names``, the
    directory's); fsync the directory only when a name went (every partition opens through
    here: at 10,000 partitions an fsync each for nothing was a tenth of a broker's start)."""
    removed = False
    for name in names:
        stem = name.split(".")[0]
        orphan = name.endswith(_INDEX_SUFFIXES) and stem.isdigit() and int(stem) not in base_offsets
        if orphan or name.endswith(".tmp"):
            (directory / name).unlink()
            removed = True
    if removed:
        fsync_path(directory)


def read_partition_metadata(path: Path) -> uuid.UUID | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    try:
        return uuid.UUID(fields["topic_id"])
    except (KeyError, ValueError) as error:
        raise StorageError(f"{path} is malformed: {text!r}") from error
