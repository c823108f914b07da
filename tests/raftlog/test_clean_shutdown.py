"""The broker's clean-shutdown marker (raftlog/clean_shutdown.py, KIP-966): Kafka's file and
format, and every doubtful file read as no proof (-1); and raftlog's same-boot note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raftlog.clean_shutdown import (
    CLEAN_SHUTDOWN_FILE,
    SAME_BOOT_FILE,
    PreviousIncarnation,
    boot_id,
    forget_same_boot,
    note_same_boot,
    read_clean_shutdown_epoch,
    read_same_boot_epoch,
    take_clean_shutdown_epoch,
    take_previous_incarnation,
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


BOOT, OTHER_BOOT = "3f1c0e4e-0f4b-4c36-9d0e-6f2d1b0a7c11", "b9d8e7f6-0000-4000-8000-123456789abc"


def test_a_clean_shutdown_marker_comes_first_and_is_taken(tmp_path: Path) -> None:
    note_same_boot(tmp_path, 7, BOOT)
    write_clean_shutdown_epoch(tmp_path, 9)
    assert take_previous_incarnation(tmp_path, BOOT) == PreviousIncarnation(9, "clean shutdown")
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    # the marker is gone; the note of this boot still proves the last registration's epoch
    assert take_previous_incarnation(tmp_path, BOOT) == PreviousIncarnation(7, "same boot")


def test_the_same_boot_note_proves_only_under_the_boot_it_names(tmp_path: Path) -> None:
    note_same_boot(tmp_path, 12, BOOT)
    assert json.loads((tmp_path / SAME_BOOT_FILE).read_text()) == {
        "version": 0, "bootId": BOOT, "brokerEpoch": 12,
    }  # fmt: skip
    assert not (tmp_path / f"{SAME_BOOT_FILE}.tmp").exists()
    assert read_same_boot_epoch(tmp_path, BOOT) == 12
    assert take_previous_incarnation(tmp_path, OTHER_BOOT) == PreviousIncarnation(-1, "none")
    assert take_previous_incarnation(tmp_path, None) == PreviousIncarnation(-1, "none")
    note_same_boot(tmp_path, 13, BOOT)  # the next registration replaces it
    assert read_same_boot_epoch(tmp_path, BOOT) == 13
    forget_same_boot(tmp_path)  # a failed log directory
    assert take_previous_incarnation(tmp_path, BOOT) == PreviousIncarnation(-1, "none")
    forget_same_boot(tmp_path)  # absent: nothing to do


@pytest.mark.parametrize(
    "content",
    [b"", b'{"version": 0, "bootId": "3f1c', b'{"version": 1, "bootId": "%s", "brokerEpoch": 3}'],
)
def test_a_torn_or_foreign_note_is_no_proof(tmp_path: Path, content: bytes) -> None:
    (tmp_path / SAME_BOOT_FILE).write_bytes(content.replace(b"%s", BOOT.encode()))
    assert take_previous_incarnation(tmp_path, BOOT) == PreviousIncarnation(-1, "none")


def test_no_boot_id_notes_nothing_and_a_note_that_cannot_be_written_is_removed(
    tmp_path: Path,
) -> None:
    note_same_boot(tmp_path, 5, None)
    assert not (tmp_path / SAME_BOOT_FILE).exists()
    note_same_boot(tmp_path, 5, BOOT)
    (tmp_path / f"{SAME_BOOT_FILE}.tmp").mkdir()  # the next write fails
    note_same_boot(tmp_path, 6, BOOT)
    assert not (tmp_path / SAME_BOOT_FILE).exists(), "a stale note must not stay"


def test_this_machine_has_a_boot_id(tmp_path: Path) -> None:
    found = boot_id()
    assert found is not None and len(found) == 36, found
    assert boot_id(tmp_path / "absent") is None
