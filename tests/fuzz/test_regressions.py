"""Every input a fuzz target crashed on (tests/fuzz/regressions/<target>/<name>), replayed
through the same target: each must now pass without a crash.

The inputs of one target are replayed in one child process (``python -m tests.fuzz.runner replay``),
not in pytest's: some crashes are aborts, not exceptions (kio's native reader asking for 264 GB,
issue 30), and one that came back would kill the whole test run. The child prints a line per
case; a case without its ``ok`` line failed, or killed the child (the exit status says how).
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.runner import REGRESSIONS_DIR, REPO

CASES = sorted(p for p in REGRESSIONS_DIR.glob("*/*") if p.is_file())
REPLAY_TIMEOUT_S = 600  # the child imports the broker and kio's schemas: slow on a busy machine


@functools.cache
def replayed(target: str) -> tuple[int, str]:
    """The child's exit status and output after replaying every input of ``target``."""
    cases = sorted(str(p) for p in (REGRESSIONS_DIR / target).iterdir() if p.is_file())
    done = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.runner", "replay", target, *cases],
        cwd=REPO, capture_output=True, text=True, errors="replace", check=False,
        timeout=REPLAY_TIMEOUT_S,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("case", CASES, ids=[f"{p.parent.name}/{p.name}" for p in CASES])
def test_fuzz_regression_replays(case: Path) -> None:
    returncode, output = replayed(case.parent.name)
    lines = output.splitlines()
    if f"ok {case.name}" in lines:
        return
    if f"start {case.name}" in lines and not any(
        line.startswith(f"FAIL {case.name}") for line in lines
    ):
        pytest.fail(f"{case} killed the replaying process (exit status {returncode}):\n{output}")
    pytest.fail(f"{case} crashed the target:\n{output}")
