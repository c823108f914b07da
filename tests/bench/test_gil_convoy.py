"""bench.gil_convoy at a tiny size: a figure for every interval and busy-thread count, and the
interpreter's switch interval given back."""

from __future__ import annotations

import sys

from bench.gil_convoy import BUSY_THREADS, INTERVALS_US, run


def test_a_tiny_run_measures_every_pair_and_restores_the_interval() -> None:
    before = sys.getswitchinterval()
    figures = run(rounds=3)
    assert [(f.interval_us, f.busy_threads) for f in figures] == [
        (us, busy) for us in INTERVALS_US for busy in BUSY_THREADS
    ]
    assert all(0 < f.median_ms <= f.p99_ms <= f.max_ms for f in figures)
    assert sys.getswitchinterval() == before
