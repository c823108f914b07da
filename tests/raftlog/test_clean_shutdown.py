"""The broker's clean-shutdown marker (raftlog/clean_shutdown.py, KIP-966): Kafka's file and
format, and every doubtful file read as no proof (-1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raftlog.clean_shutdown import (
    CLEAN_SHUTDOWN_FILE,
    read_clean_shutdown_epoch,
    take_clean_shutdown_epoch,
    write_clean_shutdown_epoch,
)


def test_the_marker_is_kafkas_file_and_is_taken_once(tmp_path: Path) -> None:
    write_clean_shutdown_epoch(tmp_path, 4242)
    marker = tmp_path / CLEAN_SHUTDOWN_FILE
    assert json.loads(marker.read_text()) == {"version": 0, "brokerEpoch": 4242}
    assert read_clean_shutdown_epoch(tmp_path) == 4242
    assert take_clean_shutdown_epoch(tmp_path) == 4242
    assert not marker.exists(), "removed before any log is written"
    assert take_clean_shutdown_epoch(tmp_path) == -1, "a second start has no proof"
    assert not (tmp_path / f"{CLEAN_SHUTDOWN_FILE}.tmp").exists()


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{",
        b"\x00\x00\x00\x00",
        b"[]",
        b'{"version": 1, "brokerEpoch": 7}',
        b'{"version": 0}',
        b'{"version": 0, "brokerEpoch": "7"}',
        b'{"version": 0, "brokerEpoch": -5}',
        b'{"version": 0, "brokerEpoch": true}',
    ],
)
def test_a_torn_or_foreign_marker_is_no_proof(tmp_path: Path, content: bytes) -> None:
    (tmp_path / CLEAN_SHUTDOWN_FILE).write_bytes(content)
    assert read_clean_shutdown_epoch(tmp_path) == -1
    assert take_clean_shutdown_epoch(tmp_path) == -1
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()


def test_an_absent_directory_or_marker_is_no_proof(tmp_path: Path) -> None:
    assert read_clean_shutdown_epoch(tmp_path) == -1
    assert take_clean_shutdown_epoch(tmp_path / "missing") == -1
    with pytest.raises(ValueError, match="proves no clean shutdown"):
        write_clean_shutdown_epoch(tmp_path, -1)
