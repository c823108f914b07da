"""The crash-consistency checker (``raftlog check-data``): a healthy node directory passes, and
each kind of damage is found with its file and offset."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dataplane.tools.check_data import check_node_dir
from dataplane.tools.cli import app
from metadata_quorum.raft import JOURNAL_FILE, SNAPSHOT_FILE
from metadata_quorum.raft_journal import HEADER_BYTES, RaftJournal, encode_header
from raftlog.batch import CRC_OFFSET
from raftlog.checkpoint import write_checkpoint
from raftlog.config import LogConfig
from raftlog.log import LOG_START_CHECKPOINT, Log
from raftlog.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tests.raftlog.batches import ManualClock, make_batch, values_of

CONFIG = {"segment.bytes": 4096, "index.interval.bytes": 256}


def build_node_dir(root: Path) -> Path:
    """Two partitions of several segments each, closed cleanly, and a metadata directory."""
    data_dir = root / "data"
    for partition in range(2):
        log = Log(data_dir / f"events-{partition}", LogConfig.parse(CONFIG), clock=ManualClock())
        for _ in range(12):
            log.append(make_batch(values_of(3, size=120)), leader_epoch=1)
        log.close()
    metadata = data_dir / "__cluster_metadata"
    metadata.mkdir()
    journal = RaftJournal(metadata / JOURNAL_FILE, b"0.3.17")
    for index in range(1, 4):
        journal.add(b"entry", index, 1)
    journal.setCurrentTerm(1, "127.0.0.1:1")
    journal._destroy()
    return data_dir


def segments(data_dir: Path, suffix: str = LOG_SUFFIX) -> list[Path]:
    return sorted((data_dir / "events-0").glob(f"*{suffix}"))


def test_a_healthy_node_dir_passes(tmp_path: Path) -> None:
    data_dir = build_node_dir(tmp_path)
    report = check_node_dir(data_dir)
    assert report.ok, report.problems
    assert report.partitions_checked == 2
    assert report.segments_checked >= 4
    result = CliRunner().invoke(app, ["check-data", str(data_dir)])
    assert result.exit_code == 0, result.output
    assert "2 partitions" in result.output and "OK" in result.output


def test_a_flipped_byte_in_a_batch_is_found(tmp_path: Path) -> None:
    data_dir = build_node_dir(tmp_path)
    first = segments(data_dir)[0]
    data = bytearray(first.read_bytes())
    data[CRC_OFFSET + 20] ^= 0x01  # inside the first batch's CRC-covered bytes
    first.write_bytes(bytes(data))
    report = check_node_dir(data_dir)
    assert not report.ok
    assert any(str(first) in p and "position 0" in p and "CRC" in p for p in report.problems)
    result = CliRunner().invoke(app, ["check-data", str(data_dir)])
    assert result.exit_code == 1 and "CRC mismatch" in result.output


def test_an_index_entry_past_the_segment_is_found(tmp_path: Path) -> None:
    data_dir = build_node_dir(tmp_path)
    index = segments(data_dir, INDEX_SUFFIX)[0]
    entries = index.read_bytes()
    assert entries, "the segment has index entries"
    index.write_bytes(entries + struct.pack(">ii", 10_000, 1 << 20))
    report = check_node_dir(data_dir)
    assert any(str(index) in p and "position 1048576" in p for p in report.problems)


def test_a_time_index_entry_off_a_batch_is_found(tmp_path: Path) -> None:
    data_dir = build_node_dir(tmp_path)
    index = segments(data_dir, TIME_INDEX_SUFFIX)[0]
    index.write_bytes(index.read_bytes() + struct.pack(">qi", 2**62, 1))
    report = check_node_dir(data_dir)
    assert any(str(index) in p for p in report.problems)


def test_a_truncated_checkpoint_is_found(tmp_path: Path) -> None:
    data_dir = build_node_dir(tmp_path)
    checkpoint = data_dir / "events-1" / LOG_START_CHECKPOINT
    write_checkpoint(checkpoint, [(3,)])
    checkpoint.write_bytes(checkpoint.read_bytes()[:3])  # "0\n1" with its entry cut
    report = check_node_dir(data_dir)
    assert any(str(checkpoint) in p for p in report.problems)


def test_a_torn_journal_and_a_bad_snapshot_are_found(tmp_path: Path) -> None:
    data_dir = build_node_dir(tmp_path)
    metadata = data_dir / "__cluster_metadata"
    journal = metadata / JOURNAL_FILE
    data = bytearray(journal.read_bytes())
    data[HEADER_BYTES + 2] ^= 0xFF  # the first record's size
    journal.write_bytes(bytes(data))
    (metadata / SNAPSHOT_FILE).write_bytes(b"not a snapshot at all, far too short")
    report = check_node_dir(data_dir)
    assert any(str(journal) in p and "record 0" in p for p in report.problems)
    assert any("snapshot" in p for p in report.problems)
    assert encode_header(b"0.3.17")  # the journal format the checker reads


def test_what_recovery_leaves_by_design_is_a_note(tmp_path: Path) -> None:
    """A preallocated zero tail and a torn tail past the recovery point of a crashed log are
    not problems: the next start cuts them."""
    data_dir = build_node_dir(tmp_path)
    last = segments(data_dir)[-1]
    with last.open("ab") as file:
        file.write(bytes(4096))
    torn = sorted((data_dir / "events-1").glob(f"*{LOG_SUFFIX}"))[-1]
    with torn.open("ab") as file:
        file.write(b"\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x50torn")
    (data_dir / "events-1" / ".clean-shutdown").unlink()
    report = check_node_dir(data_dir)
    assert report.ok, report.problems
    assert any("preallocated" in n for n in report.notes)
    assert any("torn tail" in n for n in report.notes)


@pytest.mark.parametrize("name", ["leader-epoch-checkpoint", "partition.metadata"])
def test_an_unparsable_partition_file_is_found(tmp_path: Path, name: str) -> None:
    data_dir = build_node_dir(tmp_path)
    path = data_dir / "events-0" / name
    path.write_text("garbage\n")
    report = check_node_dir(data_dir)
    assert any(str(path) in p for p in report.problems)


@pytest.mark.parametrize("clean", [True, False])
def test_a_checkpoint_epoch_the_batches_disagree_with_is_found(tmp_path: Path, clean: bool) -> None:
    """Issue 30 §1: the checkpoint says epoch 2 starts at 30, but the batches there carry
    epoch 1 (a follower's truncation a power cut undid). A problem in a cleanly closed log; in
    a crashed one whose last segment the next start recovers, a note: the epochs are rebuilt
    from the batches then."""
    data_dir = build_node_dir(tmp_path)
    directory = data_dir / "events-0"
    checkpoint = directory / "leader-epoch-checkpoint"
    write_checkpoint(checkpoint, [(1, 0), (2, 30)])
    if not clean:
        (directory / ".clean-shutdown").unlink()
        write_checkpoint(directory / "recovery-point-offset-checkpoint", [(0,)])
    report = check_node_dir(data_dir)
    found = report.problems if clean else report.notes
    expected = f"{checkpoint}: epoch 2 starts at 30, but the batch at 30..32 has epoch 1 (2 batches"
    assert any(p.startswith(expected) for p in found), (report.problems, report.notes)
    assert report.ok is not clean
    result = CliRunner().invoke(app, ["check-data", str(data_dir)])
    assert result.exit_code == (1 if clean else 0), result.output


def test_batch_epochs_going_back_are_found(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    log = Log(data_dir / "events-0", LogConfig.parse(CONFIG), clock=ManualClock())
    log.append(make_batch(values_of(3)), leader_epoch=2)
    log.append(make_batch(values_of(3)), leader_epoch=1)  # an old leader's write, kept
    log.close()
    report = check_node_dir(data_dir)
    assert any("the batch at 3 has epoch 1, below an earlier batch's 2" in p
               for p in report.problems), report.problems  # fmt: skip
