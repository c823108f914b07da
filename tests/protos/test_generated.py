"""The committed generated modules are exactly what ``make protos`` produces from the sources."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_regenerating_the_protos_changes_nothing(tmp_path: Path) -> None:
    sources = sorted(p.relative_to(ROOT) for p in (ROOT / "protos").glob("*.proto"))
    assert sources, "no .proto sources found"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", "-I.",
            f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}",
            f"--mypy_out={tmp_path}", f"--mypy_grpc_out={tmp_path}",
            *map(str, sources),
        ],
        cwd=ROOT, env=env, check=True, capture_output=True, timeout=100,
    )  # fmt: skip
    generated = sorted(p.relative_to(tmp_path) for p in (tmp_path / "protos").iterdir())
    assert generated
    for relative in generated:
        committed = ROOT / relative
        assert committed.exists(), f"{relative} is generated but not committed: run make protos"
        assert committed.read_bytes() == (tmp_path / relative).read_bytes(), (
            f"{relative} differs from what make protos generates: run make protos"
        )
