"""The retention planner, table-driven: which old segments go, and why."""

import pytest

from raftlog.retention import SegmentSummary, plan_retention

DAY = 86_400_000
SEGMENTS = [
    SegmentSummary(0, 100, 1000, largest_timestamp_ms=1 * DAY),
    SegmentSummary(100, 200, 1000, largest_timestamp_ms=2 * DAY),
    SegmentSummary(200, 300, 1000, largest_timestamp_ms=3 * DAY),
    SegmentSummary(300, 350, 500, largest_timestamp_ms=4 * DAY),  # active
]


@pytest.mark.parametrize(
    ("now", "retention_ms", "retention_bytes", "delete", "start", "hw", "count", "roll"),
    [
        (4 * DAY, 7 * DAY, -1, True, 0, 350, 0, False),  # nothing old enough
        (4 * DAY, DAY // 2, -1, True, 0, 350, 3, False),  # three segments past retention.ms
        (10 * DAY, DAY, -1, True, 0, 350, 4, True),  # everything expired: roll, then delete
        (10 * DAY, DAY, -1, True, 0, 250, 2, False),  # never at or past the high watermark
        (4 * DAY, -1, 1500, True, 0, 350, 2, False),  # 3500 bytes, keep >= 1500
        (4 * DAY, -1, 3500, True, 0, 350, 0, False),
        (4 * DAY, -1, -1, True, 200, 350, 2, False),  # wholly below the log start offset
        (10 * DAY, DAY, 1, False, 150, 350, 1, False),  # compact only: just the log start rule
    ],
)
def test_plan(
    now: int,
    retention_ms: int,
    retention_bytes: int,
    delete: bool,
    start: int,
    hw: int,
    count: int,
    roll: bool,
) -> None:
    plan = plan_retention(
        SEGMENTS,
        now_ms=now,
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
        delete_policy=delete,
        log_start_offset=start,
        high_watermark=hw,
    )
    assert (plan.delete_count, plan.roll_first) == (count, roll), plan.reason


def test_an_empty_active_segment_is_never_deleted() -> None:
    segments = [*SEGMENTS[:3], SegmentSummary(300, 300, 0, largest_timestamp_ms=0)]
    plan = plan_retention(
        segments,
        now_ms=10 * DAY,
        retention_ms=DAY,
        retention_bytes=-1,
        delete_policy=True,
        log_start_offset=0,
        high_watermark=300,
    )
    assert (plan.delete_count, plan.roll_first) == (3, False)
