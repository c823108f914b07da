"""The short fuzzing run of `make test`: every target for its share of three minutes in all.

Each target runs in its own process under atheris (tests/fuzz/runner.py) from its seed corpus,
with libFuzzer's memory (-rss_limit_mb) and per-input time (-timeout) limits; the targets are
split over two xdist groups so the two workers share the three minutes. A crash, a hang or an
input that allocates what it claims fails the test with the input saved (and printed in base64).
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest

from tests.fuzz.runner import REGRESSIONS_DIR, TARGETS, run_target

TOTAL_SECONDS = 180  # issue 30: three minutes in all, split over the targets
# a target's share is its whole run: what its start leaves goes to fuzzing (tests/fuzz/runner.py)
SECONDS_PER_TARGET = TOTAL_SECONDS // len(TARGETS)


@pytest.mark.slow
@pytest.mark.parametrize(
    "target",
    [
        pytest.param(t, marks=pytest.mark.xdist_group(f"fuzz-{i % 2}"))
        for i, t in enumerate(TARGETS)
    ],
)
def test_fuzz_target_short_run(target: str, tmp_path: Path) -> None:
    result = run_target(target, SECONDS_PER_TARGET, tmp_path)
    if result.crash is not None or result.returncode != 0:
        detail = ""
        if result.crash is not None:
            kept = tmp_path / f"{target}-{result.crash.name}"
            shutil.copy(result.crash, kept)
            detail = (
                f"input saved as {kept} (base64 {base64.b64encode(kept.read_bytes()).decode()}); "
                f"add it under {REGRESSIONS_DIR / target}/ once fixed\n"
            )
        pytest.fail(f"{target}: libFuzzer exited {result.returncode}\n{detail}"
                    f"{result.output[-6000:]}")  # fmt: skip
    assert result.executions > 0, result.output[-2000:]
