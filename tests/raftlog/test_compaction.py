"""cleanup.policy=compact: latest record per key, tombstone horizons, crash-safe segment swaps."""

from __future__ import annotations

from pathlib import Path

from kafka.record.default_records import DefaultRecordBatch

from raftlog.batch import iter_batches
from raftlog.cleaner import CLEANED_SUFFIX, SWAP_SUFFIX, dirty_ratio
from raftlog.config import LogConfig
from raftlog.log import Log
from raftlog.records import iter_records
from tests.raftlog.batches import ManualClock, make_batch

COMPACT = {
    "cleanup.policy": "compact",
    "segment.bytes": 2048,
    "delete.retention.ms": 60_000,
    "min.cleanable.dirty.ratio": 0.0,
}


def open_log(path: Path, clock: ManualClock, **overrides: object) -> Log:
    return Log(path / "table-0", LogConfig.parse({**COMPACT, **overrides}), clock=clock)


def fill(log: Log, rounds: int, keys: int, *, tag: str = "v") -> None:
    for n in range(rounds):
        for k in range(keys):
            value = f"{tag}{n}-{k}".encode().ljust(120, b".")
            log.append(make_batch([value], keys=[f"k{k}".encode()]), leader_epoch=0)


def latest_by_key(log: Log) -> dict[bytes | None, tuple[int, bytes | None]]:
    out: dict[bytes | None, tuple[int, bytes | None]] = {}
    for record in iter_records(log.read(log.log_start_offset, 1 << 24)):
        out[record.key] = (record.offset, record.value)
    return out


def test_keeps_the_latest_record_per_key_and_never_the_active_segment(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock)
    fill(log, rounds=10, keys=4)
    before = latest_by_key(log)
    active_before = log.read(log.active.base_offset, 1 << 20)
    size_before, end_before = log.size_bytes, log.log_end_offset
    result = log.compact()
    assert result is not None and result.records_removed > 0
    assert result.end_offset == log.active.base_offset
    assert latest_by_key(log) == before, "every key keeps its latest value"
    cleaned = [r for r in iter_records(log.read(0, 1 << 24)) if r.offset < result.end_offset]
    assert len({r.key for r in cleaned}) == len(cleaned), "one record per key in the clean part"
    assert log.read(log.active.base_offset, 1 << 20) == active_before
    assert log.size_bytes < size_before and log.log_end_offset == end_before
    for _, header in iter_batches(log.read(0, 1 << 24)):
        assert header.last_offset_delta == 0, "a batch keeps its offsets; CRCs were checked"
    log.close()
    reopened = open_log(tmp_path, clock)
    assert latest_by_key(reopened) == before
    reopened.close()


def test_tombstones_live_for_delete_retention_ms_after_cleaning(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock)
    fill(log, rounds=3, keys=3)
    log.append(make_batch([None], keys=[b"k1"]), leader_epoch=0)  # delete k1
    fill(log, rounds=6, keys=1, tag="later")  # push the tombstone out of the active segment
    log.compact()
    assert latest_by_key(log)[b"k1"][1] is None, "the tombstone is kept at first"
    horizon_batches = [h for _, h in iter_batches(log.read(0, 1 << 24)) if h.has_delete_horizon]
    assert len(horizon_batches) == 1
    assert horizon_batches[0].base_timestamp == clock.now_ms + 60_000
    clock.advance(59_999)
    log.compact()
    assert b"k1" in latest_by_key(log), "not before the horizon"
    clock.advance(1)
    result = log.compact()
    assert result is not None and result.tombstones_removed == 1
    assert b"k1" not in latest_by_key(log)
    log.close()


def test_cleaned_batches_decode_with_kafka_python(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock)
    fill(log, rounds=4, keys=2)
    log.append(make_batch([b"x", None], keys=[b"a", b"b"]), leader_epoch=0)
    log.append(make_batch([b"y", b"z"], keys=[b"a", b"c"]), leader_epoch=0)
    fill(log, rounds=8, keys=1, tag="roll")
    log.compact()
    data = log.read(0, 1 << 24)
    ours = [(r.offset, r.key, r.value, r.timestamp) for r in iter_records(data)]
    theirs = []
    for position, header in iter_batches(data):
        batch = DefaultRecordBatch(data[position : position + header.size_bytes])
        assert batch.validate_crc()
        theirs += [(r.offset, r.key, r.value, r.timestamp) for r in batch]
    assert theirs == ours
    log.close()


def test_dirty_ratio_and_compaction_lag_hold_cleaning_back(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock, **{"min.cleanable.dirty.ratio": 0.9})
    fill(log, rounds=3, keys=40)
    assert log.compact() is not None, "all dirty: ratio 1.0"
    fill(log, rounds=1, keys=20)
    ratio = dirty_ratio(log)[0]
    assert 0 < ratio < 0.9
    assert log.compact() is None, "some dirty data, below the ratio"
    lag = {**COMPACT, "min.compaction.lag.ms": 10_000}
    lagged = Log(tmp_path / "lagged-0", LogConfig.parse(lag), clock=clock)
    fill(lagged, rounds=4, keys=10)
    assert lagged.compact() is None, "every record is younger than the lag"
    clock.advance(10_001)
    assert lagged.compact() is not None
    log.close()
    lagged.close()


def test_max_compaction_lag_cleans_below_the_ratio_and_rolls_the_active_segment(
    tmp_path: Path,
) -> None:
    """KIP-354: a record stays uncompacted max.compaction.lag.ms at most, whatever the dirty
    ratio; the active segment (never cleaned) rolls by then."""
    clock = ManualClock()
    overrides = {"min.cleanable.dirty.ratio": 0.99, "max.compaction.lag.ms": 60_000}
    log = open_log(tmp_path, clock, **overrides)
    fill(log, rounds=3, keys=40)
    assert log.compact() is not None, "all dirty: ratio 1.0"
    fill(log, rounds=1, keys=20)
    assert 0 < dirty_ratio(log)[0] < 0.99
    assert log.compact() is None, "below the ratio and younger than the lag"
    clock.advance(60_001)
    result = log.compact()
    assert result is not None and result.dirty_ratio < 0.99, "overdue: cleaned below the ratio"

    rolled = open_log(tmp_path / "rolled", clock, **{"max.compaction.lag.ms": 5_000})
    rolled.append(make_batch([b"a"], keys=[b"k"], timestamp_ms=clock()), leader_epoch=0)
    clock.advance(5_001)
    rolled.append(make_batch([b"b"], keys=[b"k"], timestamp_ms=clock()), leader_epoch=0)
    assert len(rolled.segments()) == 2, "the first record left the active segment"
    plain = Log(
        tmp_path / "plain-0", LogConfig.parse({"max.compaction.lag.ms": 5_000}), clock=clock
    )
    plain.append(make_batch([b"a"], timestamp_ms=clock()), leader_epoch=0)
    clock.advance(5_001)
    plain.append(make_batch([b"b"], timestamp_ms=clock()), leader_epoch=0)
    assert len(plain.segments()) == 1, "only a compacted log rolls by the lag"
    for each in (log, rolled, plain):
        each.close()


def test_a_crash_before_the_swap_leaves_the_old_segments(tmp_path: Path) -> None:
    clock = ManualClock()
    log = open_log(tmp_path, clock)
    fill(log, rounds=6, keys=3)
    before = log.read(0, 1 << 24)
    first = log.segments()[0]
    log.close()
    for path in first.paths():  # a half-written cleaning output
        path.with_name(path.name + CLEANED_SUFFIX).write_bytes(b"partial")
    reopened = open_log(tmp_path, clock)
    assert reopened.read(0, 1 << 24) == before
    assert not list(reopened.directory.glob(f"*{CLEANED_SUFFIX}"))
    reopened.close()


def test_a_crash_after_the_swap_commit_completes_it(tmp_path: Path) -> None:
    clock = ManualClock()
    source = open_log(tmp_path / "source", clock)
    fill(source, rounds=6, keys=3)
    source.compact()
    cleaned_first = source.segments()[0]
    cleaned_bytes = cleaned_first.log_path.read_bytes()
    expected = latest_by_key(source)
    source.close()
    # The same log, uncleaned, with the cleaned segment committed as .swap but not yet renamed.
    log = open_log(tmp_path, clock)
    fill(log, rounds=6, keys=3)
    log.close()
    swap = log.directory / (cleaned_first.log_path.name + SWAP_SUFFIX)
    swap.write_bytes(cleaned_bytes)
    reopened = open_log(tmp_path, clock)
    assert latest_by_key(reopened) == expected
    assert not list(reopened.directory.glob(f"*{SWAP_SUFFIX}"))
    reopened.close()


def test_steady_key_churn_keeps_the_segment_count_bounded(tmp_path: Path) -> None:
    """As the broker runs it (the default dirty ratio, whenever it is due): each pass merges
    the small segments the one before left, so the count follows the live keys, not time."""
    clock = ManualClock()
    log = open_log(tmp_path, clock, **{"min.cleanable.dirty.ratio": 0.5})
    counts = []
    for n in range(40):
        fill(log, rounds=1, keys=40, tag=f"r{n}-")
        log.compact()
        counts.append(log.segment_count)
    live_bytes = 40 * 200  # 40 keys of a ~200-byte batch each
    bound = 2 * (live_bytes // 2048 + 1) + 1  # the clean section, as much dirty, the active
    assert max(counts[10:]) <= bound, f"segments grew: {counts}"
    log.close()


def test_groups_fit_one_index_as_well_as_one_segment(tmp_path: Path) -> None:
    """Kafka's ``groupSegmentsBySize``: a group's offset and time index entries must fit one
    ``segment.index.bytes`` index, however small its records became."""
    clock = ManualClock()
    log = open_log(
        tmp_path, clock, **{"segment.bytes": 1 << 20, "segment.index.bytes": 64,
                            "index.interval.bytes": 1}
    )  # fmt: skip
    fill(log, rounds=20, keys=2)  # 8 index entries (64 bytes) a segment: full, so it rolls
    assert log.segment_count > 4
    result = log.compact()
    assert result is not None and result.segments_before > 3
    assert result.segments_after == result.segments_before, "no two full indexes fit one"
    for segment in log.segments():
        assert segment.offset_index.entries <= segment.offset_index.max_entries
    log.close()
