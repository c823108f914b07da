"""The log against a plain list model, step by step, with hypothesis.

Steps: append, roll, truncate, retention, compaction, flush, clean reopen, and crashes that keep
everything, drop every unflushed byte, or tear an unflushed batch in the middle; after each crash
the log is reopened (recovery). After every step the log must read back exactly the model's records.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftlog.batch import HEADER_SIZE, read_header
from raftlog.config import LogConfig
from raftlog.log import Log, wall_clock_ms
from raftlog.records import Record, encode_batch, iter_records
from tests.raftlog.batches import ManualClock

CONFIG = LogConfig.parse(
    {
        "segment.bytes": 2048,
        "segment.index.bytes": 96,
        "index.interval.bytes": 200,
        "retention.ms": 30_000,
        "cleanup.policy": "compact,delete",
        "delete.retention.ms": 10**12,
        "min.cleanable.dirty.ratio": 0.0,
    }
)
KEYS = [f"key-{n}".encode() for n in range(6)]


@dataclass
class ModelBatch:
    base_offset: int
    last_offset: int
    max_timestamp: int
    records: list[Record] = field(default_factory=list)


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="raftlog-stateful-"))
        self.directory = self.root / "topic-0"
        self.clock = ManualClock(wall_clock_ms())
        self.log = Log(self.directory, CONFIG, clock=self.clock)
        self.batches: list[ModelBatch] = []
        self.log_end = 0
        self.log_start = 0
        self.flushed = 0  # every batch ending below this offset was fsynced

    def teardown(self) -> None:
        self.log.abandon()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- steps -------------------------------------------------------------------------------
    @rule(
        entries=st.lists(
            st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(max_size=300))),
            min_size=1,
            max_size=6,
        ),
        epoch=st.integers(0, 3),
    )
    def append(self, entries: list[tuple[bytes, bytes | None]], epoch: int) -> None:
        self.clock.advance(500)
        now = self.clock()
        records = [Record(-1, now, key, value) for key, value in entries]
        info = self.log.append(encode_batch(records), leader_epoch=epoch)
        assert info.first_offset == self.log_end
        stored = [Record(info.first_offset + n, now, k, v) for n, (k, v) in enumerate(entries)]
        self.batches.append(ModelBatch(info.first_offset, info.last_offset, now, stored))
        self.log_end = info.last_offset + 1

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def flush(self) -> None:
        self.log.flush()
        self.flushed = self.log_end

    @rule(fraction=st.floats(0, 1))
    def truncate(self, fraction: float) -> None:
        offset = self.log_start + int(fraction * (self.log_end - self.log_start))
        new_end = self.log.truncate_to(offset)
        removed = [b for b in self.batches if b.last_offset >= offset]
        kept = [b for b in self.batches if b.last_offset < offset]
        if removed:
            assert new_end <= min(offset, removed[0].base_offset)
        assert new_end >= (kept[-1].last_offset + 1 if kept else self.log_start)
        self.batches, self.log_end = kept, new_end
        self.flushed = min(self.flushed, new_end)

    @rule(advance_ms=st.integers(0, 40_000))
    def retention(self, advance_ms: int) -> None:
        self.clock.advance(advance_ms)
        self.log.delete_old_segments()
        threshold = self.clock() - CONFIG.retention_ms
        new_start = self.log.log_start_offset
        assert new_start >= self.log_start
        gone = [b for b in self.batches if b.last_offset < new_start]
        assert all(b.max_timestamp < threshold for b in gone), "deleted unexpired records"
        assert all(b.base_offset >= new_start for b in self.batches if b not in gone)
        self.batches = [b for b in self.batches if b not in gone]
        self.log_start = new_start
        self.log_end = max(self.log_end, new_start)

    @rule()
    def compact(self) -> None:
        result = self.log.compact(force=True)
        if result is None:
            return
        end = result.end_offset
        assert end <= self.log.active.base_offset, "the active segment is never cleaned"
        latest = {r.key: r.offset for b in self.batches for r in b.records if r.offset < end}
        for batch in self.batches:
            batch.records = [
                r for r in batch.records if r.offset >= end or latest[r.key] == r.offset
            ]
        self.batches = [b for b in self.batches if b.records]

    @rule()
    def reopen(self) -> None:
        self.log.close()
        self.log = Log(self.directory, CONFIG, clock=self.clock)
        assert self.log.recovery.clean_shutdown and self.log.recovery.dropped_bytes == 0

    @precondition(lambda self: self.log_end > self.flushed)
    @rule(kind=st.sampled_from(["keep-everything", "drop-unflushed", "tear"]), data=st.data())
    def crash(self, kind: str, data: st.DataObject) -> None:
        self.log.abandon()
        unflushed = [b for b in self.batches if b.last_offset >= self.flushed]
        first_lost: ModelBatch | None = None
        if kind != "keep-everything" and unflushed:
            first_lost = data.draw(st.sampled_from(unflushed)) if kind == "tear" else unflushed[0]
            self._cut_files(first_lost, tear=kind == "tear")
        self.log = Log(self.directory, CONFIG, clock=self.clock)
        report = self.log.recovery
        assert not report.clean_shutdown
        assert (report.dropped_bytes > 0) == (kind == "tear" and first_lost is not None)
        if first_lost is not None:
            self.batches = [b for b in self.batches if b.base_offset < first_lost.base_offset]
            assert self.log.log_end_offset <= first_lost.base_offset
        self.log_end = self.log.log_end_offset
        self.flushed = self.log_end

    def _cut_files(self, victim: ModelBatch, *, tear: bool) -> None:
        """Truncate the segment file holding ``victim`` at (or inside) it; later files vanish,
        as unsynced files and pages do when the machine loses power."""
        found = False
        for path in sorted(self.directory.glob("*.log")):
            if found:
                for sibling in self.directory.glob(path.name[:-4] + ".*"):
                    sibling.unlink()
                continue
            data = path.read_bytes()
            position = 0
            while position + HEADER_SIZE <= len(data):
                header = read_header(data, position)
                if header.base_offset == victim.base_offset:
                    cut = position + (header.size_bytes // 2 if tear else 0)
                    with path.open("r+b") as file:
                        file.truncate(cut)
                    found = True
                    break
                position += header.size_bytes
        assert found, f"batch {victim.base_offset} is in no segment file"

    # -- invariants --------------------------------------------------------------------------
    @invariant()
    def reads_back_the_model(self) -> None:
        log = self.log
        assert log.log_start_offset == self.log_start
        assert log.log_end_offset == self.log_end
        expected = [r for b in self.batches for r in b.records]
        assert list(iter_records(log.read(self.log_start, 1 << 24))) == expected
        for batch in self.batches[-3:]:
            assert read_header(log.read(batch.base_offset, 1)).base_offset == batch.base_offset


TestLogAgainstModel = LogMachine.TestCase
TestLogAgainstModel.settings = settings(
    max_examples=250,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
