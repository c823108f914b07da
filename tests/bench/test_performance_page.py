"""docs/performance.md: generated from the committed results and notes, and rendered from data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import performance_page as page


def test_committed_page_is_what_the_committed_results_give() -> None:
    results = json.loads(page.RESULTS_PATH.read_text(encoding="utf-8"))
    expected = page.render_page(results, page.NOTES_PATH.read_text(encoding="utf-8"))
    committed = page.PAGE_PATH.read_text(encoding="utf-8")
    assert committed == expected, (
        "docs/performance.md is stale: run `python -m bench.performance_page` (or `make docs`) "
        "and commit the page"
    )


SYNTHETIC = {
    "machine": {"cpu_count": 8, "git_commit": "0123456789abcdef", "git_dirty": False},
    "date": "2030-01-02T03:04:05+00:00",
    "peer": {
        "record_bytes": 1024,
        "replication_factor": 3,
        "date": "2030-01-01T10:00:00+00:00",
        "machine": {"cpu_count": 2, "mem_total_bytes": 25 << 30, "git_commit": "fedcba987654"},
        "limits": {
            "disk": {
                "buffered_mb_per_s": 3000.0,
                "fdatasync_mb_per_s": 300.0,
                "direct_write_mb_per_s": 900.0,
                "direct_read_mb_per_s": 1500.0,
            }
        },
        "sustained_plan": {
            "run_s_min": 30.0,
            "disk_bytes_min": 15_000_000_000,
            "dirty_limit": {"limit_bytes": 5_000_000_000, "source": "vm.dirty_bytes"},
        },
        "raftlog": {
            "produce": {"records_per_s": 123456, "mb_per_s": 126.4},
            "sustained": {
                "seconds": 52.0,
                "records": 5_000_000,
                "reached_disk_bytes_min": True,
                "mb_per_s": 250.0,
                "last": {"window_s": 20.0, "records_per_s": 244140, "latency_ms": {"p99": 9.5}},
                "cpu": {
                    "roles": {
                        "leader": {"us_per_record": 3.0},
                        "follower_1": {"us_per_record": 1.5},
                    }
                },
            },
            "consume": {"records_per_s": 654321, "passes_records_per_s": [1, 2, 3]},
            "latency_at_half_saturation": {"latency_ms": {"p99": 25.0}},
            "failover_s": [1.5, 2.5],
        },
        "jetstream": {
            "produce": {"records_per_s": 12345},
            "sustained": {
                "seconds": 600.0,
                "reached_disk_bytes_min": False,
                "last": {"records_per_s": 7000, "latency_ms": {"p99": 19.0}},
            },
            "consume": {"records_per_s": 54321},
            "failover_s": [5.0, 6.0],
        },
    },
}
NOTES = """# Performance

<!-- table: run -->

## Peer

<!-- table: peer -->

<!-- table: peer_targets -->

<!-- table: peer_sustained -->

<!-- table: peer_cpu_sustained -->

## Spark

<!-- table: spark -->
"""


def test_a_synthetic_run_renders_its_figures_and_verdicts() -> None:
    rendered = page.render_page(SYNTHETIC, NOTES)
    assert rendered.startswith(page.GENERATED_MARK + "\n# Performance\n")
    assert "<!--" not in rendered.replace(page.GENERATED_MARK, "")  # every placeholder replaced
    assert "| produce records/s (1 KiB, RF 3) | 123,456 | 12,345 | 10.0x |" in rendered
    assert "| consume records/s (median of 3 passes) | 654,321 | 54,321 | 12.0x |" in rendered
    assert "`0123456`" in rendered and "2030-01-02 03:04 UTC" in rendered
    # p99 25 ms misses its 20 ms target
    assert "| p99 ≤ 20 ms at half saturation | 25.0 ms | **not met** |" in rendered
    # sustained beside the burst; 250 MB/s is 0.83x of fio's direct 900 MB/s / 3: below 90%
    assert "| sustained records/s (last 20 s of 52) | 244,140 | 7,000 | 34.9x |" in rendered
    assert "| sustained p99 ms (same window) | 9.5 | 19.0 | 0.50x |" in rendered
    assert "| sustained MB/s | 250.0 | - | - | 300 (fio direct write 900 ÷ 3) | 0.83x |" in rendered
    assert "direct write rate ÷ 3 | 0.83x | **not met** |" in rendered
    assert "buffered" not in rendered.split("| target |")[1].split("\n\n")[0]  # no target
    assert "(fio buffered 3,000 ÷ 3; a figure, no target: the page cache)" in rendered
    assert "Measured 2030-01-01 10:00 UTC on 2 CPUs, 25.0 GiB" in rendered
    # the run that stopped at its time bound says so; the limit's source is named
    assert "| JetStream | 600.0 | - | - | - | - | **no**: time bound |" in rendered
    assert "from vm.dirty_bytes" in rendered
    # CPU per process, the roles the run has
    assert "| what ran | leader | follower 1 |" in rendered and "| all | 3.00 | 1.50 |" in rendered
    assert "| below in every round |" in rendered
    # a benchmark that did not run is named, not an error
    assert "*No `spark` section in this results file: `make bench` writes it.*" in rendered


def test_an_unknown_table_name_is_refused() -> None:
    with pytest.raises(ValueError, match="no table named 'storage_apend'"):
        page.render_page({}, "<!-- table: storage_apend -->\n")


def test_check_fails_on_a_stale_page_and_writing_fixes_it(tmp_path: Path) -> None:
    results, notes, out = tmp_path / "latest.json", tmp_path / "notes.md", tmp_path / "page.md"
    results.write_text(json.dumps(SYNTHETIC), encoding="utf-8")
    notes.write_text(NOTES, encoding="utf-8")
    args = ["--results", str(results), "--notes", str(notes), "--out", str(out)]
    assert page.main([*args, "--check"]) == 1  # no page yet
    assert page.main(args) == 0
    assert page.main([*args, "--check"]) == 0
    assert "123,456" in out.read_text(encoding="utf-8")
