"""The whole suite's settings.

Hypothesis: no per-example deadline. A deadline is a speed check, and the suite runs on a 2-core
CI machine beside cluster tests, where a pure property's example may wait for the CPU; the
properties are about correctness (speed lives in the benchmarks)."""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("raftlog", deadline=None)
settings.load_profile("raftlog")
