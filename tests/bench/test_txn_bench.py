"""The transaction benchmark, in miniature on a real cluster (its own 127.0.0.47-49), and its
tables on the performance page, rendered from data."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from bench import performance_page as page
from bench.txn_bench import Sizes, run_benchmark

# a transaction of each size, 10 of 1,000 records from each filler (one aborted), one pass each
TINY = Sizes(
    burst_records=1_000, sustained_s=0.5, mixed_records=20_000, consume_s=0.1,
    consume_passes_min=1, idle_s=0.2,
)  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_tiny_run_measures_every_variant_and_reads_exactly_the_committed_records(
    tmp_path: Path,
) -> None:
    figures = run_benchmark(tmp_path, TINY, Console(quiet=True))
    produce = figures["produce"]
    for kind in ("burst", "sustained"):
        assert produce[kind]["idempotent"]["records_per_s"] > 0
        assert "commit_latency_ms" not in produce[kind]["idempotent"]
        for per in (100, 10_000):
            run = produce[kind][f"transactions_of_{per}"]
            assert run["records"] == run["transactions"] * per >= per
            latency = run["commit_latency_ms"]
            assert 0 < latency["p50"] <= latency["p99"] <= latency["max"]
            assert 1 <= run["partitions_per_transaction"] <= 6
    assert produce["burst"]["transactions_of_100"]["transactions"] == 10  # 1,000 records
    consume = figures["consume"]
    # the benchmark itself checks each pass returned exactly these: here, that it ran
    assert (consume["records_committed"], consume["records_aborted"]) == (18_000, 2_000)
    assert consume["log_offsets"] > 20_000  # the records and the 20 markers on each partition
    for level in ("read_uncommitted", "read_committed"):
        assert consume[level]["passes"] >= 1 and consume[level]["records_per_s"] > 0


RESULTS = {
    "transactions": {
        "partitions": 6, "replication_factor": 3, "record_bytes": 1024, "acks": "all",
        "max_in_flight": 1, "node_cpu_s_per_s_idle": 0.25,
        "produce": {
            "burst": {
                "idempotent": {"records": 100_000, "records_per_s": 50_000.0, "mb_per_s": 51.2,
                               "transactions_per_s": 0.0, "node_cpu_us_per_record": 20.0},
                "transactions_of_100": {
                    "records": 100_000, "records_per_s": 2_500.0, "mb_per_s": 2.6,
                    "transactions_per_s": 25.0, "partitions_per_transaction": 1.0,
                    "commit_latency_ms": {"p50": 38.5, "p99": 90.0, "max": 120.25},
                    "node_cpu_us_per_record": 150.0,
                },
            },
        },
        "consume": {
            "transactions": 300, "records_committed": 270_000, "records_aborted": 30_000,
            "read_uncommitted": {"records_per_s": 90_000.0, "offsets_per_s": 90_100.0,
                                 "mb_per_s": 92.2, "passes": 4, "seconds": 13.3},
            "read_committed": {"records_per_s": 80_000.0, "offsets_per_s": 88_900.0,
                               "mb_per_s": 81.9, "passes": 3, "seconds": 11.2},
        },
    },
}  # fmt: skip


def test_the_page_shows_the_variants_the_commit_latency_and_both_isolation_levels() -> None:
    rendered = page.render_page(
        RESULTS, "<!-- table: transactions_produce -->\n\n<!-- table: transactions_consume -->\n"
    )
    assert (
        "| idempotent, no transactions, burst (100,000 records) | 50,000 (51.2 MB/s) "
        "|  |  |  | 20 |" in rendered
    )
    assert (
        "| transactions of 100 records, burst (100,000 records) | 2,500 (2.60 MB/s) | 25.0 "
        "| 38.5 / 90.0 / 120.2 | 1.0 | 150 |" in rendered
    )
    assert "transactions of 10,000" not in rendered  # a variant that did not run: no row
    assert "At rest the three nodes used 0.25 CPU seconds a second" in rendered
    assert "270,000 records committed, 30,000 aborted" in rendered
    assert "| `read_committed` | 80,000 | 88,900 | 81.9 | 3 in 11 s |" in rendered
    assert "*No `transactions` section" in page.render_page(
        {}, "<!-- table: transactions_consume -->\n"
    )
