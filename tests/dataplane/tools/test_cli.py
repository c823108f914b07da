"""The `raftlog` CLI as users run it: a real process, real files."""

from __future__ import annotations

import os
import subprocess
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from dataplane.tools import cli
from dataplane.tools.entry import COMMAND as RAFTLOG
from raftlog.log import Log
from raftlog.records import Record, encode_batch
from raftlog.txn import encode_marker
from tests.raftlog.batches import make_batch, values_of


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [*RAFTLOG, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_storage_demo_end_to_end(tmp_path: Path) -> None:
    """The demo, small: the writer child is SIGKILLed mid-way and everything flushed survives."""
    repo = Path(__file__).resolve().parents[3]
    result = subprocess.run(
        [*RAFTLOG, "demo", "storage", "--records", "40000", "--partitions", "2"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin", "COLUMNS": "160"},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "sending SIGKILL" in result.stdout
    assert "records verified after recovery" in result.stdout
    assert "compaction of demo-table" in result.stdout
    assert not (tmp_path / ".raftlog" / "demo").exists(), "the demo cleans up after itself"


def test_log_dump_prints_batches_and_records(tmp_path: Path) -> None:
    log = Log(tmp_path / "t-0")
    log.append(make_batch(values_of(3, tag="dumped")), leader_epoch=7)
    log.close()
    result = run("log", "dump", str(tmp_path / "t-0" / "00000000000000000000.log"), "--records")
    assert result.returncode == 0, result.stderr
    assert "dumped00000002" in result.stdout
    assert result.stdout.count("\n") > 4


def test_log_dump_shows_transactional_batches_and_their_markers(tmp_path: Path) -> None:
    log = Log(tmp_path / "t-0")
    records = [Record(offset=-1, timestamp=1_000, key=None, value=b"in-txn")]
    log.append(encode_batch(records, producer_id=7, producer_epoch=2, is_transactional=True),
               leader_epoch=1)  # fmt: skip
    marker = encode_marker(7, 2, commit=True, coordinator_epoch=5, timestamp_ms=2_000)
    log.append(marker, leader_epoch=1)
    log.append(encode_marker(7, 2, commit=False, coordinator_epoch=5, timestamp_ms=3_000),
               leader_epoch=1)  # fmt: skip
    log.close()
    result = run("log", "dump", str(tmp_path / "t-0" / "00000000000000000000.log"), "--records")
    assert result.returncode == 0, result.stderr
    assert "transactional" in result.stdout and "in-txn" in result.stdout
    assert "COMMIT marker (coordinator epoch 5)" in result.stdout
    assert "ABORT marker (coordinator epoch 5)" in result.stdout


def test_log_dump_of_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    result = run("log", "dump", str(tmp_path / "nope.log"))
    assert result.returncode != 0
    assert "does not exist" in result.stderr


def test_a_plugin_that_fails_to_load_is_reported_and_left_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broken plugin (here: a module that does not exist) must not stop `raftlog node`."""
    broken = EntryPoint(name="broken", value="no_such_module.cli:app", group=cli.PLUGIN_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [broken])
    cli.add_plugin_commands()
    assert "'broken' commands (no_such_module.cli:app) did not load" in capsys.readouterr().err
    assert "broken" not in {group.name for group in cli.app.registered_groups}
