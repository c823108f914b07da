"""`raftlog demo cluster` as `make demo` runs it (fewer records): 3 real nodes on 127.0.0.11-13,
the leader of events-0 SIGKILLed under acks=all load, every acknowledged record back once."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dataplane.tools.entry import COMMAND

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-demo")]


def test_cluster_demo_end_to_end(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[3]
    result = subprocess.run(
        [*COMMAND, "demo", "cluster",
         "--records", "20000"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(repo), "COLUMNS": "160", "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SIGKILL node" in result.stdout
    assert "every acknowledged record came back exactly once, in order" in result.stdout
    assert not (tmp_path / ".raftlog" / "demo-cluster").exists(), "the demo cleans up"
