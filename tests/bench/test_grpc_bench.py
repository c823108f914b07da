"""The gRPC transport benchmark, in miniature: both modes run against each server kind, with
large and small messages, and report positive figures."""

from __future__ import annotations

import pytest

from bench.grpc_bench import MODES, SERVER_KINDS, measure

pytestmark = pytest.mark.timeout(120)


def test_both_modes_move_the_messages_and_report_their_cpu() -> None:
    figures = measure(messages=50, small_messages=100)
    for kind in SERVER_KINDS:
        measured = figures if kind == "sync" else figures[kind]
        for mode in MODES:
            row = measured[mode]
            assert row["messages"] == 50
            assert row["mb_per_s"] > 0 and row["client_cpu_ms_per_mb"] > 0
            small = measured["small"][mode]
            assert small["messages"] == 100
            assert small["calls_per_s"] > 0 and small["client_cpu_us_per_call"] > 0
    # (the server's CPU comes from /proc in 10 ms clock ticks: 50 MB may round to 0, so it is
    # not asserted here; the full run moves 1,000 MB and makes 4,000 small calls a mode)
