"""The benchmarks' regression guard: which figures got more than 10% worse."""

from __future__ import annotations

import json
from pathlib import Path

from bench import regressions, write_section


def test_rates_must_not_drop_and_times_must_not_grow() -> None:
    before = {
        "produce": {"records_per_s": 1000, "records": 500, "latency_ms": {"p99": 10.0}},
        "failover_s": [2.0, 3.0],
        "append": [{"batch_bytes": 16589, "mb_per_s": 300.0, "percent_of_raw": 50.0}],
        "config": {"batch_size": 16384},
    }
    after = {
        "produce": {"records_per_s": 850, "records": 400, "latency_ms": {"p99": 10.5}},
        "failover_s": [2.1, 4.0],
        "append": [{"batch_bytes": 20000, "mb_per_s": 310.0, "percent_of_raw": 40.0}],
        "config": {"batch_size": 1000000},
    }
    found = {r.path: (r.before, r.after) for r in regressions(before, after, "s")}
    assert found == {
        "s.produce.records_per_s": (1000, 850),  # 15% fewer: worse
        "s.failover_s[1]": (3.0, 4.0),  # 33% longer: worse
        "s.append[0].percent_of_raw": (50.0, 40.0),
    }  # a count and a size are not judged; +5% latency and +5% failover are within 10%


def test_write_section_reports_and_keeps_other_sections(tmp_path: Path, capsys: object) -> None:
    out = tmp_path / "latest.json"
    write_section(out, "a", {"x_per_s": 100})
    write_section(out, "b", {"y_s": 1.0})
    write_section(out, "a", {"x_per_s": 50})
    written = json.loads(out.read_text())
    assert written["a"] == {"x_per_s": 50} and written["b"] == {"y_s": 1.0}
    assert "a.x_per_s" in capsys.readouterr().err  # type: ignore[attr-defined]


def test_records_s_is_a_rate_not_a_time() -> None:
    """The Spark section's ``records_s`` keys end in ``_s``: they are rates all the same."""
    before = {"write": {"records_s": 17_733, "seconds": 56.4}, "read": {"records_s_best": 150_000}}
    after = {"write": {"records_s": 37_274, "seconds": 26.8}, "read": {"records_s_best": 120_000}}
    assert [r.path for r in regressions(before, after)] == ["read.records_s_best"]


def test_node_ids_and_counts_under_failover_are_not_judged() -> None:
    """Which node was killed is not a figure, though it sits under ``failover``."""
    before = {"failover": {"runs": [{"killed": 1, "new_controller": 2, "seconds": 0.4}]}}
    after = {"failover": {"runs": [{"killed": 3, "new_controller": 3, "seconds": 0.8}]}}
    assert [r.path for r in regressions(before, after)] == ["failover.runs[0].seconds"]


def test_the_records_a_latency_run_acknowledged_are_a_count_not_a_latency() -> None:
    """More records acknowledged at a higher offered rate is not a slowdown."""
    before = {"latency_at_half_saturation": {"acknowledged": 392_852, "latency_ms": {"p99": 13.3}}}
    after = {"latency_at_half_saturation": {"acknowledged": 655_923, "latency_ms": {"p99": 15.7}}}
    assert [r.path for r in regressions(before, after)] == [
        "latency_at_half_saturation.latency_ms.p99"
    ]


def test_the_time_of_another_number_of_records_is_not_judged() -> None:
    """A consume of more records takes longer: its rate, not its seconds, says if it got slower."""
    before = {"consume": {"records": 125_010, "seconds": 1.84, "records_per_s": 67_979}}
    after = {"consume": {"records": 941_000, "seconds": 3.97, "records_per_s": 237_239}}
    assert regressions(before, after) == []
    slower = {"consume": {"records": 125_010, "seconds": 3.97, "records_per_s": 31_489}}
    assert [r.path for r in regressions(before, slower)] == [
        "consume.seconds",
        "consume.records_per_s",
    ]
