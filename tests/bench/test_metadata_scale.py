"""The metadata-at-scale benchmark in miniature (300 partitions at RF 3, on its own
127.0.0.14-16): the same code path as ``python -m bench.metadata_scale --partitions 10000``,
checked for what it must show whatever the machine's speed (no timing targets here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from bench import performance_page as page
from bench.metadata_scale import run_benchmark, sizes_for
from tests.dataplane.cluster_support import RANGES

PARTITIONS = 300  # three topics of 100


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.xdist_group("metadata_scale")
def test_a_small_run_creates_fails_over_restarts_and_measures(tmp_path: Path) -> None:
    figures = run_benchmark(
        tmp_path, sizes_for(PARTITIONS, produce_records=600), Console(quiet=True),
        first_host=RANGES["metadata_scale"],
    )  # fmt: skip
    created = figures["create"]
    assert (created["topics"], created["partitions"]) == (3, PARTITIONS)
    # a TopicRecord and a PartitionRecord each, at least (the brokers' ISR changes may add)
    assert created["metadata_records"] >= PARTITIONS + 3
    assert 0 < created["create_seconds"] <= created["ready_seconds"]
    memory = figures["memory"]
    assert memory["hosted_per_broker"] == PARTITIONS  # RF 3 on 3 brokers: each hosts all
    assert set(memory["rss_bytes_per_partition"]) == {"1", "2", "3"}
    snapshot = figures["snapshot"]
    assert snapshot["snapshot_bytes"] > PARTITIONS * 10  # every partition is in it
    produce = figures["produce"]
    assert produce["partitions"] == PARTITIONS
    assert produce["one_partition_records_per_s"] > 0 and produce["many_to_one_ratio"] > 0
    failover = figures["controller_failover"]
    assert failover["new_controller"] != failover["killed"]
    assert failover["seconds"] > 0
    restart = figures["broker_restart"]
    # the killed node came back: unfenced, then every replica of it in the ISR again (the
    # benchmark waited for each broker's gauges: all partitions hosted, none under-replicated)
    assert restart["node"] == failover["killed"]
    assert 0 < restart["unfenced_s"] <= restart["all_in_isr_s"]


SECTION = {
    "metadata_scale": {
        "nodes": 3, "partitions": 10_000, "topic_partitions": 100,
        "create": {"create_seconds": 41.5, "ready_seconds": 300.25,
                   "metadata_records_per_s": 250.0, "create_topic_first_tenth_ms": 12.0,
                   "create_topic_last_tenth_ms": 30.0},
        "memory": {"rss_bytes_per_partition_median": 17_500},
        "snapshot": {"snapshot_bytes": 400_000, "snapshot_bytes_per_partition": 40.0},
        "produce": {"one_partition_records_per_s": 20_000.0, "partitions": 1000,
                    "many_partitions_records_per_s": 9_000.0, "many_to_one_ratio": 0.45,
                    "target_ratio": 0.5, "meets_target": False},
        "controller_failover": {"seconds": 1.234, "target_s": 3.0, "meets_target": True},
        "broker_restart": {"unfenced_s": 20.0, "all_in_isr_s": 45.5, "target_s": 60.0,
                           "meets_target": True,
                           "isr_refusals": {"INVALID_UPDATE_VERSION": 1200,
                                            "OPERATION_NOT_ATTEMPTED": 3}},
    }
}  # fmt: skip


def test_the_performance_page_renders_the_section() -> None:
    rendered = page.render_metadata_scale(SECTION)
    assert "| partitions (RF 3, topics of 100) | 10,000 |" in rendered
    assert "| produce to 1,000 partitions, records/s (share of 1) | 9,000 (0.45) |" in rendered
    assert "| controller failover after SIGKILL, s | 1.23 |" in rendered
    assert "| broker restart: every replica back in the ISR, s | 45.5 |" in rendered
    assert (
        "| broker restart: ISR changes the controller refused | "
        "1,200 INVALID_UPDATE_VERSION, 3 OPERATION_NOT_ATTEMPTED |"
    ) in rendered
    assert "No `metadata_scale` section" in page.render_page({}, "<!-- table: metadata_scale -->")
