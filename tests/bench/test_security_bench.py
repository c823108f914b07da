"""The security benchmark in miniature, on its real clusters (127.0.0.189-190, and the Raft
quorum on 127.0.0.251-253: the same xdist group as the tests that use those addresses)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from bench.security_bench import ACLS, MATCHING_ACLS, Sizes, bench_acls, print_report, run_benchmark

# the Raft runs' one-at-a-time commits and the per-message timings' loops cut to what shows
# each figure is measured (most of the run's time otherwise: 3 x 200 fsynced commits, 12 x 1.4 s)
TINY = Sizes(
    records=500, handshakes=3, latency_records=20, raft_commits=200,
    raft_latency_samples=20, transport_loop_s=0.01,
)  # fmt: skip


def test_the_acls_are_ten_thousand_and_some_name_the_producer() -> None:
    acls = bench_acls("bench-latency")
    assert len(acls) == len(set(acls)) == ACLS
    assert sum(a.principal == "User:ANONYMOUS" for a in acls) == MATCHING_ACLS
    for binding in acls:
        binding.validate()


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.xdist_group("secure_cluster")
def test_a_tiny_run_measures_every_figure(tmp_path: Path) -> None:
    figures = run_benchmark(tmp_path, TINY, Console(quiet=True))
    for run in ("plaintext", "tls_scram"):
        assert figures[run]["produce_records_per_s"] > 0
        assert figures[run]["consume_records_per_s"] > 0
    assert isinstance(figures["tls_produce_cost_pct"], float)
    for name in ("grpc_tls_channel_ms", "grpc_scram_exchange_ms", "kafka_tls_ms", "kafka_scram_ms",
                 "grpc_plaintext_channel_ms"):  # fmt: skip
        summary = figures["handshakes"][name]
        assert 0 < summary["p50"] <= summary["p99"], name
    auth = figures["authorizer"]
    assert auth["acls"] == ACLS
    for run in ("no_authorizer_ms", "authorizer_ms"):
        assert 0 < auth[run]["p50"] <= auth[run]["p99"]
    raft = figures["raft"]
    for run in ("plaintext", "encrypted", "tls"):
        assert raft[run]["commits_per_s"] > 0 and raft[run]["commit_latency_p50_ms"] > 0
    for row in raft["per_message_us"].values():
        assert row["framing_us"] > 0 and row["secret_us"] > 0 and row["tls_us"] > 0
    print_report(Console(quiet=True), figures)
