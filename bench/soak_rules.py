"""The pass rules of a soak run (``make soak``): pure functions of the samples and the verdict.

A soak run samples every node every 10 s (`NodeSample`, one JSON line each in
``samples.jsonl``). After it, these rules judge the samples; no IO, no clock.

- **Growth** (RSS and open descriptors). A process warms up (caches fill, pools grow), so the
  first ``warm_up_s`` (10 minutes) are not judged. Two windows of equal length ``w`` are
  compared: the *baseline*, right after the warm-up, and the *final* one, at the end of the run;
  ``w`` is 10 minutes, or half of what follows the warm-up in a shorter run (a 20-minute run
  compares minutes 10-15 with 15-20). The figure compared is each window's **median** over the
  node's samples while it was up: a median ignores the short spikes of a fault (a catch-up, a
  rebalance) and the few samples of a process that was just restarted, so only a level that
  moved for good counts. Only one process is judged per node, the one up at the end: its
  samples in both windows. A node whose process was restarted between the windows is not judged
  (a new process starts its memory over, which says nothing of a leak); the soak's schedule
  never kills node 1, so at least one process lives through the whole run, and a run in which
  no node's process did fails. Pass: ``final <= baseline * (1 + GROWTH_MAX)`` (5 %), per judged
  node and metric.
- **Disk under retention's bound.** What retention governs (the partitions of topics whose
  ``cleanup.policy`` deletes) must stay below what the topics' configs allow, at every sample
  after the warm-up. Kafka deletes whole segments, oldest first, while the log minus the oldest
  segment is still at least ``retention.bytes`` (raftlog/retention.py), so after a retention
  pass a partition's segments hold less than ``retention.bytes + segment.bytes``; between two
  passes (``log.retention.check.interval.ms``) one more segment may fill; and a deleted segment
  waits ``file.delete.delay.ms`` before its files go (one segment, as long as that delay is below
  the check interval: the soak sets 1 s against 10 s). So at most
  ``retention.bytes + 3 * segment.bytes`` of records, in at most
  ``ceil(retention.bytes / segment.bytes) + 3`` segments, each with its offset and time indexes
  (at most ``segment.index.bytes`` each, preallocated for the active one) and
  `SEGMENT_FILES_ALLOWANCE_BYTES` (its producer-state snapshot, block rounding); and the
  partition's own small files (`PARTITION_FILES_ALLOWANCE_BYTES`: checkpoints,
  partition.metadata, the leader-epoch file). A node's bound is the sum over the partitions it
  hosts (`partition_bound_bytes`). The run also needs retention to have *worked*: the workload
  topic's log start offset moved (segments were deleted).
- **The metadata log is snapshotted and compacted**, per controller: its snapshot's last index
  advanced after the warm-up, its journal was cut (shrank) after the warm-up, and the journal's
  largest size in the final window is at most ``JOURNAL_GROWTH_MAX`` times the baseline
  window's (the journal saws between cuts; a journal that is never cut grows without bound).
- **The chaos checker finds nothing**: 0 lost, 0 duplicated acknowledged records, no finding.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

WARM_UP_S = 600.0
WINDOW_S = 600.0
GROWTH_MAX = 0.05
JOURNAL_GROWTH_MAX = 2.0
JOURNAL_FLOOR_BYTES = 64 * 1024  # a baseline journal below this is compared as this
PARTITION_FILES_ALLOWANCE_BYTES = 32 * 1024  # 5 small files, a 4 KiB block each, and slack
SEGMENT_FILES_ALLOWANCE_BYTES = 8 * 1024  # a producer-state snapshot, the .log's last block
GROWTH_METRICS = ("rss_bytes", "fds")


@dataclass(frozen=True)
class NodeSample:
    """One node at one moment. ``up`` False: no process (killed, not restarted yet); its
    process figures are then 0. Bytes are allocated bytes (what ``du`` counts), except the
    journal's (the bytes of its whole records) and the snapshot's (its file size)."""

    time_s: float
    node_id: int
    up: bool
    pid: int = 0
    rss_bytes: int = 0
    fds: int = 0
    threads: int = 0
    disk_bytes: int = 0  # the whole data directory
    retained_bytes: int = 0  # partitions of delete-policy topics
    retained_bound_bytes: int = 0  # their bound from the topic configs
    compacted_bytes: int = 0  # partitions of compacted topics (not retention's)
    partitions: int = 0
    journal_bytes: int = 0  # what the metadata journal holds (whole records)
    journal_records: int = 0
    snapshot_bytes: int = 0
    snapshot_index: int = -1  # the metadata snapshot's last Raft index; -1: none yet

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeSample:
        return cls(**data)


@dataclass(frozen=True)
class TopicRetention:
    """The configs of a topic that bound its partitions' size."""

    delete: bool  # cleanup.policy includes delete
    retention_bytes: int  # -1: unbounded by size
    segment_bytes: int
    segment_index_bytes: int


def partition_bound_bytes(topic: TopicRetention) -> int | None:
    """A partition's bound (module doc), or None when its size is not bounded by retention
    (a compacted topic, or ``retention.bytes`` -1)."""
    if not topic.delete or topic.retention_bytes < 0:
        return None
    segments = math.ceil(topic.retention_bytes / topic.segment_bytes) + 3
    per_segment = 2 * topic.segment_index_bytes + SEGMENT_FILES_ALLOWANCE_BYTES
    return (
        topic.retention_bytes
        + 3 * topic.segment_bytes
        + segments * per_segment
        + PARTITION_FILES_ALLOWANCE_BYTES
    )


@dataclass(frozen=True)
class Windows:
    """The baseline and final windows of the growth rules, as [start, end) seconds."""

    baseline: tuple[float, float]
    final: tuple[float, float]


def growth_windows(
    duration_s: float, warm_up_s: float = WARM_UP_S, window_s: float = WINDOW_S
) -> Windows | None:
    """The two windows of a run of ``duration_s`` (module doc); None when nothing follows the
    warm-up (a run that short judges no growth)."""
    width = min(window_s, (duration_s - warm_up_s) / 2)
    if width <= 0:
        return None
    return Windows((warm_up_s, warm_up_s + width), (duration_s - width, duration_s))


def _in(sample: NodeSample, window: tuple[float, float]) -> bool:
    return window[0] <= sample.time_s < window[1]


@dataclass(frozen=True)
class Growth:
    node_id: int
    metric: str
    pid: int  # the process judged (the one up at the end); 0: none
    baseline: float | None  # the window's median over that process; None: it was not up then
    final: float | None

    @property
    def judged(self) -> bool:
        """Whether one process lived through both windows (a restart in between starts
        the process's memory over: not a growth of anything)."""
        return self.baseline is not None and self.final is not None

    @property
    def ok(self) -> bool:
        if self.baseline is None or self.final is None:
            return True  # not judged
        return self.final <= self.baseline * (1 + GROWTH_MAX)

    @property
    def fraction(self) -> float | None:
        if self.baseline is None or self.final is None or self.baseline == 0:
            return None
        return self.final / self.baseline - 1


def growth(samples: Iterable[NodeSample], node_id: int, metric: str, windows: Windows) -> Growth:
    """The node's process at the end of the final window, its medians in both windows."""
    mine = [s for s in samples if s.node_id == node_id and s.up]
    final_samples = [s for s in mine if _in(s, windows.final)]
    if not final_samples:
        return Growth(node_id, metric, 0, None, None)
    pid = final_samples[-1].pid

    def median(window: tuple[float, float]) -> float | None:
        values = [float(getattr(s, metric)) for s in mine if s.pid == pid and _in(s, window)]
        return statistics.median(values) if values else None

    return Growth(node_id, metric, pid, median(windows.baseline), median(windows.final))


@dataclass(frozen=True)
class DiskCheck:
    node_id: int
    peak_bytes: int  # retained bytes, the greatest after the warm-up
    peak_fraction: float  # the greatest retained / bound after the warm-up
    over: list[float]  # times of the samples over their bound
    ok: bool


def disk_check(samples: Iterable[NodeSample], node_id: int, warm_up_s: float) -> DiskCheck:
    judged = [s for s in samples if s.node_id == node_id and s.time_s >= warm_up_s]
    over = [s.time_s for s in judged if s.retained_bytes > s.retained_bound_bytes]
    fractions = [
        s.retained_bytes / s.retained_bound_bytes for s in judged if s.retained_bound_bytes
    ]
    return DiskCheck(
        node_id=node_id,
        peak_bytes=max((s.retained_bytes for s in judged), default=0),
        peak_fraction=round(max(fractions, default=0.0), 4),
        over=over,
        ok=not over,
    )


@dataclass(frozen=True)
class MetadataCheck:
    node_id: int
    snapshot_advances: int  # increases of the snapshot index after the warm-up
    journal_cuts: int  # times the journal shrank after the warm-up
    journal_max_baseline: int
    journal_max_final: int
    ok: bool


def metadata_check(
    samples: Iterable[NodeSample], node_id: int, warm_up_s: float, windows: Windows | None
) -> MetadataCheck:
    mine = sorted((s for s in samples if s.node_id == node_id), key=lambda s: s.time_s)
    advances = cuts = 0
    for before, now in itertools.pairwise(mine):
        if now.time_s < warm_up_s:
            continue
        advances += now.snapshot_index > before.snapshot_index >= 0
        cuts += 0 < now.journal_bytes < before.journal_bytes
    baseline = final = 0
    if windows is not None:
        baseline = max((s.journal_bytes for s in mine if _in(s, windows.baseline)), default=0)
        final = max((s.journal_bytes for s in mine if _in(s, windows.final)), default=0)
    bounded = final <= JOURNAL_GROWTH_MAX * max(baseline, JOURNAL_FLOOR_BYTES)
    return MetadataCheck(
        node_id=node_id,
        snapshot_advances=advances,
        journal_cuts=cuts,
        journal_max_baseline=baseline,
        journal_max_final=final,
        ok=advances >= 1 and cuts >= 1 and bounded,
    )


@dataclass(frozen=True)
class SoakVerdict:
    """Every rule's outcome; ``failures`` says, one line each, what failed."""

    growth: list[Growth]
    disk: list[DiskCheck]
    metadata: list[MetadataCheck]
    retention_deleted: bool
    checker_ok: bool
    extras_problems: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        lines = [
            f"node {g.node_id}: {g.metric} grew {_pct(g.fraction)} "
            f"(median {g.baseline:,.0f} -> {g.final:,.0f}; at most {GROWTH_MAX:.0%})"
            for g in self.growth
            if not g.ok
        ]
        lines += [
            f"{metric}: no node's process lived through both growth windows: nothing judged"
            for metric in GROWTH_METRICS
            if self.growth and not any(g.judged for g in self.growth if g.metric == metric)
        ]
        lines += [
            f"node {d.node_id}: retained bytes over the retention bound at {len(d.over)} "
            f"samples (first at {d.over[0]:.0f} s; peak {d.peak_fraction:.0%} of the bound)"
            for d in self.disk
            if not d.ok
        ]
        lines += [
            f"node {m.node_id}: metadata log not compacted as it should be "
            f"({m.snapshot_advances} snapshots, {m.journal_cuts} journal cuts after the warm-up; "
            f"journal max {m.journal_max_baseline:,} -> {m.journal_max_final:,} bytes)"
            for m in self.metadata
            if not m.ok
        ]
        if not self.retention_deleted:
            lines.append("retention deleted nothing: the workload topic's log start never moved")
        if not self.checker_ok:
            lines.append("the chaos checker found anomalies (see the chaos report)")
        return lines + self.extras_problems

    @property
    def ok(self) -> bool:
        return not self.failures


def _pct(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{fraction:+.1%}"


def judge(
    samples: Sequence[NodeSample],
    *,
    duration_s: float,
    controllers: Iterable[int],
    retention_deleted: bool,
    checker_ok: bool,
    extras_problems: Sequence[str] = (),
    warm_up_s: float = WARM_UP_S,
    window_s: float = WINDOW_S,
) -> SoakVerdict:
    """Every rule of the module doc over ``samples`` (every node's, any order)."""
    nodes = sorted({s.node_id for s in samples})
    windows = growth_windows(duration_s, warm_up_s, window_s)
    grown = (
        [growth(samples, n, metric, windows) for n in nodes for metric in GROWTH_METRICS]
        if windows is not None
        else []
    )
    return SoakVerdict(
        growth=grown,
        disk=[disk_check(samples, n, warm_up_s) for n in nodes],
        metadata=[metadata_check(samples, n, warm_up_s, windows) for n in sorted(controllers)],
        retention_deleted=retention_deleted,
        checker_ok=checker_ok,
        extras_problems=list(extras_problems),
    )
