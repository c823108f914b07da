"""bench.e2e_latency's pure core (stamps, pacing, the summary, the consumer's tally) and how the
regression guard judges the end_to_end and netem sections."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import regressions
from bench.e2e_latency import (
    SATURATION_S,
    STAMP,
    WARMUP_RECORDS,
    WARMUP_STAMP,
    ConsumerJob,
    _Collector,
    due_in_s,
    latency_ms,
    saturation_plan,
    stamped,
    summary,
)


def test_a_value_carries_its_send_time_and_the_latency_is_receive_minus_send() -> None:
    value = stamped(1_000_000_000, b"p" * 1016)
    assert len(value) == 1024
    assert latency_ms(value, 1_002_500_000) == 2.5


def test_warm_up_and_short_values_have_no_latency() -> None:
    assert latency_ms(STAMP.pack(WARMUP_STAMP), 5) is None
    assert latency_ms(b"abc", 5) is None


def test_records_are_due_at_the_offered_rate() -> None:
    assert due_in_s(start=10.0, sent=500, rate_per_s=1000, now=10.2) == pytest.approx(0.3)
    assert due_in_s(10.0, 0, 1000, 10.2) < 0  # late: sent at once


def test_the_summary_is_nearest_rank_with_the_counts() -> None:
    found = summary([float(n) for n in range(1, 101)], expected=120)
    assert found["records"] == 120 and found["received"] == 100
    assert found["latency_ms"] == {"p50": 50.0, "p99": 99.0, "p999": 100.0, "max": 100.0}


def test_the_consumer_is_ready_after_the_warm_up_and_done_at_its_count(tmp_path: Path) -> None:
    job = ConsumerJob("grpc", ["h:1"], "t", 2, tmp_path / "ready", tmp_path / "out")
    tally = _Collector(job)
    tally.add([STAMP.pack(WARMUP_STAMP)] * (WARMUP_RECORDS - 1), 0)
    assert not job.ready_path.exists()
    tally.add([STAMP.pack(WARMUP_STAMP), stamped(1_000_000, b"")], 3_000_000)
    assert job.ready_path.exists() and not tally.done
    tally.add([stamped(2_000_000, b"")], 3_000_000)
    assert tally.done and list(tally.latencies) == [2.0, 1.0]


def test_the_saturation_run_is_bounded_by_time_only() -> None:
    plan = saturation_plan("quick")
    assert plan.disk_bytes_min == 0
    assert plan.done(SATURATION_S["quick"], acknowledged=1)
    assert not plan.done(SATURATION_S["quick"] / 2, acknowledged=10**9)


def test_the_guard_judges_latencies_and_rates_not_counts_delays_or_run_lengths() -> None:
    before = {
        "offered_s": 20.0, "offered_records_per_s": 20_000,
        "grpc": {"records": 400_000, "received": 400_000, "latency_ms": {"p99": 8.0}},
    }  # fmt: skip
    after = {
        "offered_s": 2.0, "offered_records_per_s": 20_000,
        "grpc": {"records": 4_000, "received": 3_000, "latency_ms": {"p99": 12.0}},
    }  # fmt: skip
    assert [r.path for r in regressions(before, after, "end_to_end")] == [
        "end_to_end.grpc.latency_ms.p99"
    ]
    assert [r.path for r in regressions(after, before, "end_to_end")] == []
    run_before = {"delay_ms": 2.0, "end_to_end": {"received": 10, "latency_ms": {"p50": 9.0}}}
    run_after = {"delay_ms": 20.0, "end_to_end": {"received": 99, "latency_ms": {"p50": 9.0}}}
    assert regressions({"runs": [run_before]}, {"runs": [run_after]}, "netem") == []
