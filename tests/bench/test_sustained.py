"""The sustained runs' pure core: the dirty-page limit, the plan, the last window's figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import regressions
from bench.limits import derived_limits, fio_rate
from bench.sustained import (
    DIRTY_LIMIT_TIMES,
    RETAINED_DIRTY_TIMES,
    SEGMENT_BYTES,
    TailWindow,
    check_free_space,
    dirty_limit,
    mem_available_bytes,
    nearest_rank,
    plan_for,
    read_dirty_limit,
)

GB = 10**9
MEMINFO = "MemTotal:       24684084 kB\nMemFree:         1000000 kB\nMemAvailable:   23606264 kB\n"


def test_the_dirty_limit_is_the_ratio_of_available_memory_unless_dirty_bytes_is_set() -> None:
    by_ratio = dirty_limit(dirty_bytes=0, dirty_ratio=20, mem_available_bytes=10 * GB)
    assert by_ratio.limit_bytes == 2 * GB
    assert by_ratio.source == "vm.dirty_ratio (20%) of MemAvailable"
    # the kernel ignores the ratio once vm.dirty_bytes is set
    by_bytes = dirty_limit(dirty_bytes=500_000_000, dirty_ratio=20, mem_available_bytes=10 * GB)
    assert (by_bytes.limit_bytes, by_bytes.source) == (500_000_000, "vm.dirty_bytes")
    with pytest.raises(ValueError):
        dirty_limit(dirty_bytes=0, dirty_ratio=120, mem_available_bytes=GB)


def test_mem_available_is_read_in_bytes_from_meminfo() -> None:
    assert mem_available_bytes(MEMINFO) == 23606264 * 1024
    with pytest.raises(ValueError, match="no MemAvailable"):
        mem_available_bytes("MemTotal: 1 kB\n")


def test_the_limit_is_read_from_a_proc_tree(tmp_path: Path) -> None:
    vm = tmp_path / "sys" / "vm"
    vm.mkdir(parents=True)
    (vm / "dirty_bytes").write_text("0\n")
    (vm / "dirty_ratio").write_text("20\n")
    (tmp_path / "meminfo").write_text(MEMINFO)
    assert read_dirty_limit(tmp_path).limit_bytes == 23606264 * 1024 * 20 // 100


def test_a_full_run_writes_three_dirty_limits_and_keeps_two_across_the_replicas() -> None:
    dirty = dirty_limit(0, 20, 24 * GB)  # 4.8 GB
    plan = plan_for("full", dirty, copies=3, record_bytes=1024)
    assert plan.disk_bytes_min == DIRTY_LIMIT_TIMES * dirty.limit_bytes
    segment = SEGMENT_BYTES["full"]
    assert plan.retention_bytes % segment == 0  # whole segments
    assert 0 <= plan.retention_bytes * 3 - RETAINED_DIRTY_TIMES * dirty.limit_bytes < 3 * segment
    assert plan.space_needed_bytes() == 3 * (plan.retention_bytes + 2 * segment)
    # at 100,000 records/s (300 MB/s written by the replicas): 30 s is not enough, 48 s is
    records_at = 100_000
    assert not plan.done(30.0, 30 * records_at)
    assert plan.done(48.0, 48 * records_at)
    # fast enough to write the bytes early: still at least 30 s
    assert not plan.done(29.9, 10**9)
    # too slow: stopped at the time bound, and says so
    assert plan.done(plan.run_s_max, 1000)
    assert not plan.reached(plan.run_s_max, 1000)
    assert plan.reached(48.0, 48 * records_at)


def test_a_quick_run_is_seconds_long() -> None:
    plan = plan_for("quick", dirty_limit(0, 20, 24 * GB), copies=3, record_bytes=1024)
    assert plan.run_s_min <= 5 and plan.window_s < plan.run_s_min
    assert plan.space_needed_bytes() < GB


def test_a_run_the_disk_cannot_hold_is_refused_saying_why(tmp_path: Path) -> None:
    check_free_space(free_bytes=20 * GB, needed_bytes=10 * GB, where=tmp_path)
    with pytest.raises(RuntimeError, match=r"need 10\.0 GB free .* 5\.0 GB are"):
        check_free_space(free_bytes=5 * GB, needed_bytes=10 * GB, where=tmp_path)


def test_the_window_counts_the_last_seconds_only() -> None:
    window = TailWindow(window_s=20.0, started_at=100.0)
    for second in range(60):  # 1,000 records a second, acknowledged in batches of 250
        for quarter in range(1, 5):  # at exact binary fractions: .25, .5, .75, 1
            latency = 50.0 if second < 40 else 2.0  # slow at first, fast in the last 20 s
            window.add(100.0 + second + quarter / 4, [latency] * 250)
    tail = window.summary()
    assert tail["window_s"] == 20.0
    assert tail["records"] == 20_000 and tail["records_per_s"] == 1_000
    assert tail["latency_ms"]["p99"] == 2.0  # the slow start is outside
    assert len(window._batches) <= 20 * 4 + 1  # bounded: a window's worth


def test_the_window_of_a_run_shorter_than_it_is_the_whole_run() -> None:
    window = TailWindow(window_s=20.0, started_at=0.0)
    window.add(1.0, [1.0] * 500)
    window.add(2.0, [3.0] * 500)
    tail = window.summary(ended_at=5.0)
    assert tail["window_s"] == 5.0 and tail["records_per_s"] == 200
    assert TailWindow(20.0, 0.0).summary()["records"] == 0  # nothing acknowledged: no error


def test_batches_a_little_out_of_order_are_counted_by_their_time() -> None:
    window = TailWindow(window_s=10.0, started_at=0.0)
    window.add(30.0, [1.0])
    window.add(19.5, [9.0])  # completed before the window's start: not in it
    window.add(25.0, [2.0])
    assert window.summary()["records"] == 2


def test_p99_is_the_nearest_rank() -> None:
    samples = [float(n) for n in range(1, 101)]  # 1..100
    assert nearest_rank(samples, 0.99) == 99.0
    assert nearest_rank(samples, 0.50) == 50.0
    assert nearest_rank(samples, 1.0) == 100.0
    assert nearest_rank([], 0.99) == 0.0
    window = TailWindow(window_s=10.0, started_at=0.0)
    window.add(5.0, [float(n) for n in range(1000, 0, -1)])  # unsorted
    assert window.summary()["latency_ms"]["p99"] == 990.0


FIO_JSON = {
    "jobs": [
        {
            "jobname": "direct-write",
            "error": 0,
            "write": {"io_bytes": 4 << 30, "bw_bytes": 400_000_000},
            "read": {"io_bytes": 0, "bw_bytes": 0},
        }
    ]
}


def test_fio_rates_are_read_and_a_job_that_moved_nothing_is_an_error() -> None:
    assert fio_rate(json.dumps(FIO_JSON), "write") == (400_000_000.0, 4 << 30)
    with pytest.raises(RuntimeError, match="moved no data"):
        fio_rate(json.dumps(FIO_JSON), "read")


def test_the_disk_limits_the_produce_rate_by_the_replication_factor() -> None:
    derived = derived_limits({"direct_write_mb_per_s": 900.0, "direct_read_mb_per_s": 1200.0}, 3)
    assert derived["produce_limit_mb_per_s"] == 300.0
    assert derived["catch_up_consume_limit_mb_per_s"] == 1200.0


def test_the_regression_guard_judges_the_sustained_figures_not_their_window() -> None:
    before = {"sustained": {"records": 5_000_000, "seconds": 50.0, "mb_per_s": 250.0,
                            "last": {"window_s": 20.0, "records_per_s": 250_000,
                                     "latency_ms": {"p99": 10.0}}}}  # fmt: skip
    after = {"sustained": {"records": 4_000_000, "seconds": 60.0, "mb_per_s": 200.0,
                           "last": {"window_s": 3.0, "records_per_s": 200_000,
                                    "latency_ms": {"p99": 20.0}}}}  # fmt: skip
    worse = {r.path for r in regressions(before, after, "peer")}
    assert worse == {
        "peer.sustained.mb_per_s",
        "peer.sustained.last.records_per_s",
        "peer.sustained.last.latency_ms.p99",
    }  # a run of other records took other seconds; the window's length is a setting
