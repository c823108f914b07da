"""The decisions of mirroring, MirrorMaker 2's rules as plain functions. Pure: no IO, no clocks.

- **Topic selection**: a source topic is mirrored when one of the ``topics`` patterns (names or
  regexes, comma-separated, each matched against the whole name) selects it and no
  ``topics.exclude`` pattern does; internal topics (``__*``, ``*.internal``, ``mm2-*``,
  Connect's ``connect-*``) and topics that are themselves mirrors *from the target*
  (``<target-alias>.*``, which would loop) never are. The target topic is
  ``<source-alias>.<topic>`` (MM2's ``DefaultReplicationPolicy``).
- **Topic configs** copied: the source's non-default configs minus those MM2 excludes by
  default (throttles, timestamp policy, ``min.insync.replicas``, unclean election).
- **Offset syncs** (:func:`sync_needed`): the source task records "upstream offset ``u`` was
  written at downstream offset ``d``" when MM2 does: the first record of a partition in this
  task's lifetime, a gap upstream (a compacted or truncated source), a downstream rewind, or
  when translation would otherwise fall ``offset.lag.max`` records behind.
- **Translation** (:class:`OffsetSyncStore`, :func:`translate`): a group's committed upstream
  offset ``c`` becomes the downstream offset of the latest sync ``(u, d)`` with ``u <= c``:
  ``d`` when ``u == c``, else ``d + 1``. It never passes what was mirrored (``d`` was
  acknowledged) and never skips a record (everything upstream after ``u`` is downstream after
  ``d``); with no sync at or below ``c`` there is no translation.
- **Lag**: source end offset minus the mirrored position (the next upstream offset to mirror).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

INTERNAL_TOPIC = re.compile(r"^(__.*|.*[.-]internal|mm2-.*|connect-.*)$")
DEFAULT_GROUPS_EXCLUDE = ("console-consumer-.*", "connect-.*", "__.*")
# MM2's config.properties.exclude default: settings that belong to the target cluster.
CONFIGS_EXCLUDED = frozenset(
    {
        "follower.replication.throttled.replicas",
        "leader.replication.throttled.replicas",
        "message.timestamp.difference.max.ms",
        "message.timestamp.type",
        "unclean.leader.election.enable",
        "min.insync.replicas",
    }
)
SYNCS_KEPT_MAX = 64  # per partition, in the translation store
SEPARATOR = "."


def offset_syncs_topic(target_alias: str) -> str:
    return f"mm2-offset-syncs.{target_alias}.internal"


def checkpoints_topic(source_alias: str) -> str:
    return f"{source_alias}.checkpoints.internal"


def remote_topic(source_alias: str, topic: str) -> str:
    """The name of ``topic`` of cluster ``source_alias`` on the target."""
    return f"{source_alias}{SEPARATOR}{topic}"


def compile_patterns(patterns: str) -> list[re.Pattern[str]]:
    """``topics``/``groups`` values: comma-separated names or regexes (whole-name match)."""
    return [re.compile(p.strip()) for p in patterns.split(",") if p.strip()]


def matches(name: str, patterns: Sequence[re.Pattern[str]]) -> bool:
    return any(p.fullmatch(name) for p in patterns)


def topic_selected(
    topic: str,
    include: Sequence[re.Pattern[str]],
    exclude: Sequence[re.Pattern[str]],
    target_alias: str,
) -> bool:
    if INTERNAL_TOPIC.match(topic) or topic.startswith(f"{target_alias}{SEPARATOR}"):
        return False
    return matches(topic, include) and not matches(topic, exclude)


def group_selected(
    group: str, include: Sequence[re.Pattern[str]], exclude: Sequence[re.Pattern[str]]
) -> bool:
    return matches(group, include) and not matches(group, exclude)


def group_task(group: str, task_count: int) -> int:
    """Which checkpoint task handles ``group`` (stable across processes)."""
    return zlib.crc32(group.encode()) % task_count


def configs_to_copy(configs: Mapping[str, tuple[str, bool]]) -> dict[str, str]:
    """The source topic's configs (name -> (value, is_default)) the target topic gets."""
    return {
        name: value
        for name, (value, is_default) in configs.items()
        if not is_default and name not in CONFIGS_EXCLUDED
    }


@dataclass(frozen=True)
class TopicPlan:
    """What the connector must do on the target to mirror the selected topics."""

    create: dict[str, int]  # target topic -> partitions
    grow: dict[str, int]  # target topic -> new partition count


def plan_topics(
    source: Mapping[str, int], target: Mapping[str, int], source_alias: str
) -> TopicPlan:
    """``source``: selected source topic -> partitions; ``target``: every target topic ->
    partitions. Missing target topics are created, smaller ones grown (never shrunk)."""
    create: dict[str, int] = {}
    grow: dict[str, int] = {}
    for topic, partitions in source.items():
        name = remote_topic(source_alias, topic)
        have = target.get(name)
        if have is None:
            create[name] = partitions
        elif have < partitions:
            grow[name] = partitions
    return TopicPlan(create, grow)


def split_partitions(
    partitions: Iterable[tuple[str, int]], tasks_max: int
) -> list[list[tuple[str, int]]]:
    """The partitions dealt round-robin over at most ``tasks_max`` non-empty tasks."""
    ordered = sorted(partitions)
    count = min(tasks_max, len(ordered))
    return [ordered[i::count] for i in range(count)]


# -- offset syncs ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class OffsetSync:
    topic: str  # the source topic
    partition: int
    upstream_offset: int
    downstream_offset: int


@dataclass
class PartitionSyncState:
    """What the source task remembers of one partition to decide when to emit a sync."""

    previous_upstream: int = -1
    previous_downstream: int = -1
    last_sync_downstream: int = -1


def sync_needed(
    state: PartitionSyncState, upstream: int, downstream: int, offset_lag_max: int
) -> bool:
    """Record that ``upstream`` was written at ``downstream``; True if a sync must be emitted
    (MM2's ``PartitionState.update``)."""
    first = state.previous_downstream == -1
    too_stale = downstream - (state.last_sync_downstream + 1) >= offset_lag_max
    skipped_upstream = upstream - state.previous_upstream != 1
    truncated_downstream = downstream < state.previous_downstream
    needed = first or too_stale or skipped_upstream or truncated_downstream
    if needed:
        state.last_sync_downstream = downstream
    state.previous_upstream = upstream
    state.previous_downstream = downstream
    return needed


@dataclass
class OffsetSyncStore:
    """The syncs read from the offset-syncs topic, per source partition, ascending by upstream
    offset, at most ``SYNCS_KEPT_MAX`` each (thinned where they are densest relative to their
    age, so old offsets stay translatable with coarser steps, as MM2's store does)."""

    syncs: dict[tuple[str, int], list[OffsetSync]] = field(default_factory=dict)
    kept_max: int = SYNCS_KEPT_MAX

    def add(self, sync: OffsetSync) -> None:
        kept = self.syncs.setdefault((sync.topic, sync.partition), [])
        # A sync at or below kept ones is a restart (the mirror re-sent records) or a rewound
        # target: the kept syncs at or after it describe copies it supersedes.
        kept[:] = [
            s
            for s in kept
            if s.upstream_offset < sync.upstream_offset
            and s.downstream_offset < sync.downstream_offset
        ]
        kept.append(sync)
        while len(kept) > self.kept_max:
            del kept[_densest(kept)]

    def translate(self, topic: str, partition: int, upstream_offset: int) -> int | None:
        return translate(self.syncs.get((topic, partition), []), upstream_offset)


def _densest(kept: Sequence[OffsetSync]) -> int:
    """The inner sync whose neighbours are closest together relative to its distance from
    the newest sync (never the first or last): what is left is spaced roughly geometrically,
    dense near the head, where groups commit, and sparse further back."""
    assert len(kept) >= 3, "thinning keeps the oldest and the newest sync"
    newest = kept[-1].upstream_offset

    def density(i: int) -> tuple[float, int]:
        gap = kept[i + 1].upstream_offset - kept[i - 1].upstream_offset
        return gap / (newest - kept[i].upstream_offset + 1), i

    return min(range(1, len(kept) - 1), key=density)


def translate(syncs: Sequence[OffsetSync], upstream_offset: int) -> int | None:
    """The downstream offset a consumer committed at ``upstream_offset`` resumes from, by the
    latest sync at or below it; None when no sync is (``syncs`` ascending by upstream)."""
    best: OffsetSync | None = None
    for sync in syncs:
        if sync.upstream_offset > upstream_offset:
            break
        best = sync
    if best is None:
        return None
    step = 0 if best.upstream_offset == upstream_offset else 1
    return best.downstream_offset + step


@dataclass(frozen=True)
class Checkpoint:
    """A group's committed offset of a source partition, and where it resumes on the target."""

    group: str
    topic: str  # the source topic
    partition: int
    upstream_offset: int
    downstream_offset: int
    metadata: str = ""


def checkpoints(
    group: str,
    committed: Mapping[tuple[str, int], tuple[int, str]],
    store: OffsetSyncStore,
) -> list[Checkpoint]:
    """A checkpoint per committed partition that translates (topic, partition -> (offset,
    metadata) on the source)."""
    result: list[Checkpoint] = []
    for (topic, partition), (offset, metadata) in sorted(committed.items()):
        downstream = store.translate(topic, partition, offset)
        if downstream is not None:
            result.append(Checkpoint(group, topic, partition, offset, downstream, metadata))
    return result


def offsets_to_sync(
    found: Sequence[Checkpoint], target_committed: Mapping[tuple[str, int], int], source_alias: str
) -> dict[tuple[str, int], int]:
    """The target group's offsets to commit: the translated ones ahead of what it already has
    (MM2 never moves a group back), keyed by target topic and partition."""
    result: dict[tuple[str, int], int] = {}
    for checkpoint in found:
        key = (remote_topic(source_alias, checkpoint.topic), checkpoint.partition)
        if checkpoint.downstream_offset > target_committed.get(key, -1):
            result[key] = checkpoint.downstream_offset
    return result


# -- lag -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    source_end_offset: int
    mirrored_offset: int  # the next upstream offset to mirror

    @property
    def lag_records(self) -> int:
        return max(0, self.source_end_offset - self.mirrored_offset)


def lag_report(lags: Iterable[PartitionLag], source_alias: str) -> dict[str, object]:
    """The JSON a mirror source task reports in its status."""
    rows = sorted(lags, key=lambda lag: (lag.topic, lag.partition))
    return {
        "replication_lag_records": sum(lag.lag_records for lag in rows),
        "partitions": [
            {
                "topic": lag.topic,
                "partition": lag.partition,
                "target_topic": remote_topic(source_alias, lag.topic),
                "source_end_offset": lag.source_end_offset,
                "mirrored_offset": lag.mirrored_offset,
                "lag_records": lag.lag_records,
            }
            for lag in rows
        ],
    }
