"""The storage engine under power loss: a scripted workload on a Log (appends, rolls, flushes and
recovery-point checkpoints, aborted transactions in ``.txnindex``, producer-state snapshots,
DeleteRecords and retention deletes, compaction swaps) runs on the forgetful filesystem
(chaos.lazyfs); the power is cut after its k-th durability point (ALICE-style: every fsync,
fdatasync, msync and directory fsync the filesystem saw in a reference run is a crash point),
both ways (everything unsynced dropped; a torn prefix of each file's last write kept), and the
Log reopened on what survived must hold:

- recovery never raises;
- the log is a valid prefix: every batch's CRC is good, offsets increase without gaps (the
  compacted log: without overlaps), every record is the one the workload wrote at its offset;
- everything the engine had promised durable is there: the records below the recovery point of
  the last ``flush()`` that returned, the log start offset of the last DeleteRecords, the aborts
  recorded before that flush, the producer-state snapshots written durably;
- the indexes agree with their segments, the checkpoint files parse, every aborted transaction
  in ``.txnindex`` ends at an abort marker that is in the log.

``make test`` runs a seeded sample of the crash points (``POWER_LOSS_SAMPLE``, 6 per workload
and mode); ``RAFTLOG_POWER_LOSS_ALL=1`` runs every one (docs/storage.md, "Power loss").
"""

from __future__ import annotations

import contextlib
import os
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chaos.lazyfs import CutMode, CutReport, ForgetfulFS, FsyncEvent, available
from dataplane.broker.producer_state import ProducerStates, SnapshotFiles, decode_snapshot
from raftlog.batch import BatchHeader, iter_batches, verify_batch
from raftlog.checkpoint import read_checkpoint
from raftlog.config import LogConfig
from raftlog.epoch import LeaderEpochCache
from raftlog.errors import KafkaError
from raftlog.log import LOG_START_CHECKPOINT, RECOVERY_POINT_CHECKPOINT, Log
from raftlog.records import Record, decode_batch, encode_batch
from raftlog.txn import AbortedTxn, Marker, encode_marker, read_marker
from tests.raftlog.batches import BASE_TIMESTAMP_MS, ManualClock

pytestmark = pytest.mark.skipif(available() is not None, reason=f"no FUSE: {available()}")

POWER_LOSS_SAMPLE = 6
EVERY_POINT = os.environ.get("RAFTLOG_POWER_LOSS_ALL") == "1"
TOPIC_ID = uuid.UUID(int=30)
PID = 7
MODES: tuple[CutMode, ...] = ("all", "torn")


@dataclass
class Model:
    """What the workload wrote, and what the engine promised durable when the power went."""

    records: dict[int, tuple[bytes | None, bytes]] = field(default_factory=dict)  # offset->k,v
    aborts: list[AbortedTxn] = field(default_factory=list)
    flushed_offset: int = 0  # the recovery point of the last flush() that returned
    flushed_aborts: int = 0  # how many of ``aborts`` that flush covered
    log_start_offset: int = 0  # of the last DeleteRecords that returned
    snapshots: set[int] = field(default_factory=set)  # offsets of durable snapshots written

    def promise(self, log: Log) -> None:
        self.flushed_offset = log.recovery_point
        self.flushed_aborts = len(self.aborts)


Workload = Callable[[Path, Model], None]


def _config(**overrides: object) -> LogConfig:
    return LogConfig.parse({"segment.bytes": 2048, "index.interval.bytes": 256, **overrides})


def _append(log: Log, model: Model, count: int, *, keys: list[bytes] | None = None) -> None:
    base = log.log_end_offset
    records = [
        Record(-1, BASE_TIMESTAMP_MS + base + n, keys[n] if keys else None,
               f"value-{base + n}".encode().ljust(120, b"."))
        for n in range(count)
    ]  # fmt: skip
    info = log.append(encode_batch(records), leader_epoch=1 + base // 40)
    for n, record in enumerate(records):
        assert record.value is not None
        model.records[info.first_offset + n] = (record.key, record.value)


def _transaction(log: Log, model: Model, *, commit: bool) -> None:
    records = [Record(-1, BASE_TIMESTAMP_MS, None, f"txn-{log.log_end_offset}".encode())]
    batch = encode_batch(records, producer_id=PID, producer_epoch=0, base_sequence=0,
                         is_transactional=True)  # fmt: skip
    epoch = max(1, log.epochs.latest_epoch)  # a leader's epoch never goes back
    first = log.append(batch, leader_epoch=epoch).first_offset
    model.records[first] = (None, records[0].value or b"")
    marker = encode_marker(PID, 0, commit=commit, coordinator_epoch=1, timestamp_ms=0)
    end = log.append(marker, leader_epoch=epoch).last_offset
    if not commit:
        aborted = AbortedTxn(PID, first, end, end + 1)
        log.append_aborted(aborted)
        model.aborts.append(aborted)


def _snapshot(log: Log, model: Model, *, durable: bool) -> None:
    """A producer-state snapshot at the log end, as the broker writes one on a roll."""
    states = ProducerStates()

    def marker_of(header: BatchHeader) -> Marker:
        return read_marker(log.read(header.base_offset, header.size_bytes))

    states.update_all(log.batch_headers(), marker_of)
    files = SnapshotFiles(log.directory)
    files.write(log.log_end_offset, states, durable=durable)
    if not durable:
        files.sync()
    model.snapshots.add(log.log_end_offset)


def delete_policy_workload(directory: Path, model: Model) -> None:
    """Appends over many small segments, flushes with checkpoints, aborted and committed
    transactions, producer-state snapshots (durable and synced later), DeleteRecords and the
    deletion of the segments below it, a clean close at the end."""
    log = Log(directory, _config(), topic_id=TOPIC_ID, clock=ManualClock())
    for round_ in range(6):
        _append(log, model, 4)
        _append(log, model, 2)
        if round_ % 2:
            _transaction(log, model, commit=False)
        else:
            _transaction(log, model, commit=True)
        log.flush()
        model.promise(log)
        log.checkpoint()
        if round_ in (1, 4):
            _snapshot(log, model, durable=round_ == 1)
        if round_ == 3:
            start = log.segments()[2].base_offset + 1
            log.maybe_increment_log_start_offset(start, log.log_end_offset)
            model.log_start_offset = start
            log.delete_old_segments(retention=False)
            SnapshotFiles(directory).delete_below(start)
    log.close()


def compact_workload(directory: Path, model: Model) -> None:
    """Keyed appends over small segments of a compacted log, flushed, then cleaning passes
    (their .cleaned/.swap renames) between more appends."""
    config = _config(**{"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.01})
    log = Log(directory, config, topic_id=TOPIC_ID, clock=ManualClock())
    for round_ in range(4):
        for _ in range(3):
            _append(log, model, 3, keys=[f"k{n % 5}".encode() for n in range(round_, round_ + 3)])
        log.flush()
        model.promise(log)
        log.checkpoint()
        if round_ % 2:
            log.roll()
            log.compact(force=True)
    log.close()


def _append_as_follower(log: Log, model: Model, count: int, epoch: int) -> None:
    """A leader's batch of ``count`` records at the log end in ``epoch``, copied as is."""
    base = log.log_end_offset
    records = [
        Record(
            -1, BASE_TIMESTAMP_MS + base + n, None, f"e{epoch}-{base + n}".encode().ljust(120, b".")
        )
        for n in range(count)
    ]
    log.append_as_follower(encode_batch(records, base_offset=base, partition_leader_epoch=epoch))
    for n, record in enumerate(records):
        assert record.value is not None
        model.records[base + n] = (record.key, record.value)


def follower_truncation_workload(directory: Path, model: Model) -> None:
    """Issue 30 §1: a follower appends epoch-6 batches over a few segments and flushes; the
    leader of epoch 7 tells it it diverged, it truncates (whole segments and part of one) and
    appends epoch-7 batches, whose epoch is checkpointed at once; more appends, a flush, a
    clean close. Once ``truncate_to`` returned, the cut epoch-6 records must never come back."""
    log = Log(directory, _config(), topic_id=TOPIC_ID, clock=ManualClock())
    for _ in range(12):
        _append_as_follower(log, model, 3, epoch=6)
    log.flush()
    model.promise(log)
    assert len(log.segments()) > 2, "the truncation removes whole segments"
    truncate_at = log.segments()[1].base_offset + 3
    # the leader said they diverged: the flush's promise for them ends as the truncation starts
    model.flushed_offset = min(model.flushed_offset, truncate_at)
    log.truncate_to(truncate_at)
    for offset in [offset for offset in model.records if offset >= truncate_at]:
        del model.records[offset]  # durable now: they must not come back
    for _ in range(3):
        _append_as_follower(log, model, 2, epoch=7)
    log.flush()
    model.promise(log)
    log.close()


# -- the checks ------------------------------------------------------------------------------
def check_recovered(directory: Path, model: Model, *, compacted: bool) -> None:
    """Reopen the log on what survived and hold it to the module's invariants."""
    config = _config(**({"cleanup.policy": "compact"} if compacted else {}))
    for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_CHECKPOINT):
        read_checkpoint(directory / name, fields=1)  # parses (or is absent)
    LeaderEpochCache(directory)  # the leader-epoch checkpoint parses
    log = Log(directory, config, topic_id=TOPIC_ID, clock=ManualClock())
    try:
        assert log.log_end_offset >= model.flushed_offset, "flushed records were lost"
        assert log.log_start_offset >= model.log_start_offset, "DeleteRecords was undone"
        seen = _check_batches(log, model, compacted=compacted)
        for offset in range(max(log.log_start_offset, _first_kept(log)), model.flushed_offset):
            if not compacted:
                assert offset in seen, f"flushed offset {offset} is missing"
        if compacted:
            _check_latest_per_key(seen, model)
        _check_indexes(log)
        _check_aborts(log, model)
        _check_epochs(log)
    finally:
        log.close()
    _check_snapshots(directory, model)


def _first_kept(log: Log) -> int:
    return log.segments()[0].base_offset


def _check_batches(log: Log, model: Model, *, compacted: bool) -> set[int]:
    """Every batch from the first segment on: CRC good, offsets in order (contiguous unless
    compacted), each record the workload's. The offsets seen."""
    seen: set[int] = set()
    expected = _first_kept(log)
    offset = expected
    while offset < log.log_end_offset:
        data = log.read(max(offset, log.log_start_offset), 1 << 20)
        assert data, f"nothing read at {offset} below the log end {log.log_end_offset}"
        for position, header in iter_batches(data):
            verify_batch(data, position)
            if header.last_offset < offset:
                continue
            if compacted:
                assert header.base_offset >= expected, f"batch at {header.base_offset} overlaps"
            else:
                assert header.base_offset <= max(expected, log.log_start_offset), (
                    f"gap before {header.base_offset}: expected {expected}"
                )
            if not header.is_control:
                _, records = decode_batch(data, position)
                for record in records:
                    assert model.records.get(record.offset) == (record.key, record.value), (
                        f"offset {record.offset} holds what the workload never wrote there"
                    )
                    seen.add(record.offset)
            else:
                seen.add(header.base_offset)
            expected = offset = header.next_offset
    return seen


def _check_epochs(log: Log) -> None:
    """The leader-epoch cache agrees with the batches: each batch's partition leader epoch is
    the epoch the cache gives its offsets (a follower fetching with a wrong last epoch would
    keep batches the leader never had: issue 30 §1)."""
    first = log.epochs.entries[0].start_offset if log.epochs.entries else None
    for segment in log.segments():
        for _, header in segment.iter_headers(0):
            if first is None or header.last_offset < first:
                continue
            assert log.epochs.epoch_for_offset(header.last_offset) == (
                header.partition_leader_epoch
            ), (
                f"batch {header.base_offset}..{header.last_offset} has epoch "
                f"{header.partition_leader_epoch}, the checkpoint says "
                f"{log.epochs.epoch_for_offset(header.last_offset)} ({log.epochs.entries})"
            )


def _check_latest_per_key(seen: set[int], model: Model) -> None:
    """Compaction: the newest flushed record of each key, or a newer one of it, is there."""
    latest: dict[bytes | None, int] = {}
    for offset, (key, _) in sorted(model.records.items()):
        if offset < model.flushed_offset:
            latest[key] = offset
    kept = {model.records[offset][0]: offset for offset in sorted(seen)}
    for key, offset in latest.items():
        assert kept.get(key, -1) >= offset, f"key {key!r}: flushed offset {offset} was lost"


def _check_indexes(log: Log) -> None:
    """Each index agrees with its segment, and a lookup of each batch finds it."""
    for segment in log.segments():
        segment.offset_index.check(segment.size_bytes)
        segment.time_index.check(segment.next_offset)
        for position, header in segment.iter_headers(0, verify_crc=True):
            found = segment.translate_offset(header.base_offset)
            assert found is not None and found[0] == position, (
                f"index lookup of {header.base_offset} in {segment.log_path.name} is wrong"
            )


def _check_aborts(log: Log, model: Model) -> None:
    """Every aborted transaction indexed ends at an abort marker in the log; those recorded
    before the last flush are there (unless retention took their segment)."""
    indexed = log.aborted_transactions(0, log.log_end_offset)
    for aborted in indexed:
        assert aborted in model.aborts, f"{aborted} was never aborted"
        if aborted.last_offset < log.log_start_offset:
            continue  # DeleteRecords took the marker: a read there is out of range
        marker = read_marker(log.read(aborted.last_offset, 1 << 16))
        assert not marker.commit, f"{aborted}: no abort marker at its end"
    for aborted in model.aborts[: model.flushed_aborts]:
        if aborted.last_offset >= _first_kept(log):
            assert aborted in indexed, f"flushed {aborted} is missing from .txnindex"


def _check_snapshots(directory: Path, model: Model) -> None:
    files = SnapshotFiles(directory)
    for offset in files.offsets():
        decode_snapshot(files.path(offset).read_bytes(), offset)
    for offset in model.snapshots:
        if offset >= model.log_start_offset:
            assert offset in files.offsets(), f"durable snapshot {offset} is missing"


# -- the crash points ------------------------------------------------------------------------
WORKLOADS: dict[str, tuple[Workload, bool]] = {
    "delete": (delete_policy_workload, False),
    "compact": (compact_workload, True),
    "follower-truncation": (follower_truncation_workload, False),
}


def _reference_trace(tmp_path: Path, workload: Workload) -> list[FsyncEvent]:
    """The durability points of a reference run with the power on."""
    with ForgetfulFS(tmp_path / "reference-backing", tmp_path / "reference") as fs:
        workload(fs.mountpoint / "events-0", Model())
        return fs.fsync_trace()


def _points(trace: list[FsyncEvent], seed: int, name: str) -> list[int]:
    """Every crash point (``RAFTLOG_POWER_LOSS_ALL=1``), or a seeded sample: the first and the
    last, some just before a segment's fsync (appends in flight: what a torn cut tears), some
    anywhere. Crash point k: the power goes at the (k+1)-th durability point, ``trace[k]``."""
    if EVERY_POINT:
        return list(range(len(trace) + 1))
    rng = random.Random(seed)
    before_segment_fsync = [k for k, event in enumerate(trace) if event.path.endswith(".log")]
    share = (POWER_LOSS_SAMPLE - 2) // 2
    sample = {0, len(trace), *rng.sample(before_segment_fsync, share)}
    sample.update(rng.sample(range(1, len(trace)), POWER_LOSS_SAMPLE - len(sample)))
    if name == "follower-truncation":
        sample.update(_truncation_points(trace))
    return sorted(sample)


def _truncation_points(trace: list[FsyncEvent]) -> set[int]:
    """The follower truncation's own crash points: as it makes the removal of whole segments
    and the cut segment durable (before it checkpoints the lowered recovery point: a power cut
    between the two once left a gap), as the last flush syncs the epoch-7 batches (written,
    not synced: the torn cut has something to tear), and as it makes the epoch-7 checkpoint
    durable after them, before the directory naming it (issue 30 §1: the truncation undone
    under that checkpoint)."""
    lowered = min(
        k for k, e in enumerate(trace) if e.path.endswith("recovery-point-offset-checkpoint.tmp")
    )
    truncation = range(lowered - 6, lowered)
    synced = max(k for k, e in enumerate(trace) if e.path.endswith("leader-epoch-checkpoint"))
    last_flush = [k for k in range(synced - 4, synced) if trace[k].path.endswith(".log")]
    return {synced, synced + 1, *last_flush, *truncation}


def crash_at(
    tmp_path: Path, workload: Workload, point: int, mode: CutMode, compacted: bool
) -> tuple[CutReport, str | None]:
    """Run the workload with the power going after durability point ``point``, cut, reopen,
    check: what the cut did, and what failed (None: nothing)."""
    model = Model()
    run = tmp_path / f"{mode}-{point}"
    with ForgetfulFS(run / "backing", run / "mount") as fs:
        fs.power_off_after(point)
        directory = fs.mountpoint / "events-0"
        # the power goes: EIO at the fsync after the crash point, or at a change after it
        with contextlib.suppress(OSError, KafkaError):
            workload(directory, model)
        cut = fs.cut_power(seed=point, mode=mode)
        try:
            check_recovered(directory, model, compacted=compacted)
        except (AssertionError, OSError, KafkaError) as error:
            return cut, f"after durability point {point} ({mode}, torn {cut.torn}): {error!r}"
    return cut, None


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_crash_point_recovers(tmp_path: Path, name: str) -> None:
    workload, compacted = WORKLOADS[name]
    trace = _reference_trace(tmp_path, workload)
    total = len(trace)
    assert total > 10, f"the {name} workload made only {total} durability points"
    failures: list[str] = []
    torn_files = 0
    for mode in MODES:
        for point in _points(trace, seed=len(name), name=name):
            cut, failure = crash_at(tmp_path, workload, point, mode, compacted)
            torn_files += len(cut.torn)
            if failure is not None:
                failures.append(failure)
    assert not failures, f"{len(failures)} crash points of {total} failed:\n" + "\n".join(failures)
    assert torn_files > 0, "no torn cut kept part of a write: the torn mode was not exercised"
