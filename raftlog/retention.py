"""Which old segments retention deletes: a pure function of segment summaries, config and time.

Kafka's rules (``UnifiedLog.deleteOldSegments``): only whole segments go, oldest first, never one
that holds offsets at or above the high watermark; a segment is expired by time when its largest
timestamp is older than ``retention.ms``, by size while the log minus the segment is still at least
``retention.bytes``, and segments wholly below the log start offset always go. The active segment
is deleted only when every segment is deletable: the log first rolls, then deletes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SegmentSummary:
    base_offset: int
    next_offset: int  # one past the segment's last offset
    size_bytes: int
    largest_timestamp_ms: int


@dataclass(frozen=True)
class RetentionPlan:
    delete_count: int  # how many segments, from the oldest, to delete
    roll_first: bool  # the active segment is among them: roll before deleting
    reason: str


def plan_retention(
    segments: Sequence[SegmentSummary],
    *,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
    delete_policy: bool,
    log_start_offset: int,
    high_watermark: int,
) -> RetentionPlan:
    """Segments are oldest first; the last one is the active segment."""
    total_bytes = sum(segment.size_bytes for segment in segments)
    count, reasons = 0, set()
    for n, segment in enumerate(segments):
        is_active = n == len(segments) - 1
        if is_active and segment.size_bytes == 0:
            break
        if segment.next_offset > high_watermark:
            break
        next_base = segments[n + 1].base_offset if not is_active else segment.next_offset
        if next_base <= log_start_offset:
            reasons.add("log start offset")
        elif (
            delete_policy
            and retention_ms >= 0
            and (now_ms - segment.largest_timestamp_ms > retention_ms)
        ):
            reasons.add("retention.ms")
        elif (
            delete_policy
            and retention_bytes >= 0
            and (total_bytes - segment.size_bytes >= retention_bytes)
        ):
            reasons.add("retention.bytes")
        else:
            break
        total_bytes -= segment.size_bytes
        count += 1
    roll_first = bool(segments) and count == len(segments)
    return RetentionPlan(count, roll_first, ", ".join(sorted(reasons)))
