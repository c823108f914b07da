"""The metadata quorum's journal (raft_journal.py): reservations planned before any byte is
written, pysyncobj's format both ways, and a full disk that fails a write cleanly (a real tmpfs,
root only) leaving the journal, its meta file and checkpoint-style files as they were."""

from __future__ import annotations

import errno
import os
import pickle
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal

from chaos.disk import fill_filesystem
from metadata_quorum.raft_journal import (
    HEADER_BYTES,
    PAGE_BYTES,
    JournalWriteError,
    RaftJournal,
    encode_record,
    is_disk_full,
    reservation_sizes,
)
from raftlog.checkpoint import read_checkpoint, write_checkpoint

VERSION = b"0.3.17"
MIB = 1 << 20


@pytest.mark.parametrize(
    ("allocated", "needed", "chunk", "sizes"),
    [
        (MIB, MIB, MIB, ()),  # already allocated: nothing to do
        (MIB, 100, MIB, ()),
        (0, 40, MIB, (MIB, PAGE_BYTES)),  # a new file: a chunk, else one page
        (MIB, MIB + 1, MIB, (2 * MIB, MIB + PAGE_BYTES)),
        (1024, 5000, MIB, (MIB, 2 * PAGE_BYTES)),  # an old pysyncobj size, not page-aligned
        (0, PAGE_BYTES, PAGE_BYTES, (PAGE_BYTES,)),  # chunk == pages needed: one try
        (0, 3 * MIB + 7, MIB, (4 * MIB, 3 * MIB + PAGE_BYTES)),  # a record bigger than a chunk
    ],
)
def test_reservation_sizes(allocated: int, needed: int, chunk: int, sizes: tuple[int, ...]) -> None:
    assert reservation_sizes(allocated, needed, chunk) == sizes


@pytest.mark.parametrize("chunk", [0, -PAGE_BYTES, PAGE_BYTES + 1])
def test_a_chunk_is_a_positive_number_of_pages(chunk: int) -> None:
    with pytest.raises(ValueError, match="multiple of 4096"):
        reservation_sizes(0, 1, chunk)


def test_is_disk_full() -> None:
    assert is_disk_full(OSError(errno.ENOSPC, "full"))
    assert is_disk_full(JournalWriteError(errno.EDQUOT, "quota"))
    assert not is_disk_full(OSError(errno.EIO, "io"))
    assert not is_disk_full(ValueError("no errno"))


def entries_of(journal: object) -> list[tuple[bytes, int, int]]:
    return [(bytes(c), i, t) for c, i, t in journal[:]]  # type: ignore[index]


def test_pysyncobj_and_this_journal_read_each_other(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    journal = RaftJournal(path, VERSION, chunk_bytes=PAGE_BYTES)
    for index in range(1, 201):
        journal.add(f"entry-{index}".encode() * (index % 7 + 1), index, 1 + index // 50)
    journal.deleteEntriesFrom(150)  # a follower's truncation
    journal.deleteEntriesTo(20)  # a compaction: entries 21..150 rewritten from the start
    journal.add(b"after", 151, 9)
    journal.setCurrentTerm(9, "127.0.0.1:1")
    journal.setRaftCommitIndex(140)
    journal.onOneSecondTimer()
    expected = entries_of(journal)
    assert [e[1] for e in expected] == list(range(21, 152))
    journal._destroy()

    theirs = FileJournal(str(path))
    assert entries_of(theirs) == expected
    assert (theirs.getCurrentTerm(), theirs.getVotedForNodeId()) == (9, "127.0.0.1:1")
    assert theirs.getRaftCommitIndex() == 140
    theirs.add(b"by-pysyncobj", 152, 9)
    theirs._destroy()

    ours = RaftJournal(path, VERSION)
    assert entries_of(ours) == [*expected, (b"by-pysyncobj", 152, 9)]
    assert ours.getCurrentTerm() == 9
    ours.clear()  # an installed snapshot replaces the log
    ours.add(b"snap-prev", 300, 10)
    ours.add(b"snap-last", 301, 10)
    ours._destroy()
    assert entries_of(RaftJournal(path, VERSION)) == [
        (b"snap-prev", 300, 10),
        (b"snap-last", 301, 10),
    ]


def test_the_file_grows_by_chunks_and_records_sit_where_the_header_says(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    journal = RaftJournal(path, VERSION, chunk_bytes=16 * PAGE_BYTES)
    assert path.stat().st_size == HEADER_BYTES  # a new journal: the header only
    journal.add(b"x" * 100, 1, 1)
    assert path.stat().st_size == 16 * PAGE_BYTES  # reserved for real (posix_fallocate)
    assert path.stat().st_blocks * 512 >= 16 * PAGE_BYTES  # allocated, not a sparse hole
    data = path.read_bytes()
    assert data[HEADER_BYTES : HEADER_BYTES + 124] == encode_record(b"x" * 100, 1, 1)
    assert int.from_bytes(data[36:40], "little") == HEADER_BYTES + 124
    journal._destroy()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs that a test fills with `fill_filesystem` (root only; CI runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "raftlog-test-journal", str(mount_point)],
        check=True,
        timeout=15,
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False, timeout=15)
        if os.path.ismount(mount_point):
            subprocess.run(["umount", "-l", str(mount_point)], check=True, timeout=15)


def test_a_full_disk_fails_the_append_and_changes_nothing(small_disk: Path) -> None:
    path = small_disk / "raft.journal"
    journal = RaftJournal(path, VERSION, chunk_bytes=64 * PAGE_BYTES)
    for index in range(1, 11):
        journal.add(b"a" * 500, index, 1)
    journal.setCurrentTerm(1, "me")
    filler = small_disk / "filler"
    fill_filesystem(filler)

    # Records still fit in the chunk reserved before the disk filled; then the reservation
    # (chunk, then the record's pages) fails, before any byte of the record is written.
    index = 10
    with pytest.raises(JournalWriteError) as caught:
        while index < 10_000:
            journal.add(b"b" * 2000, index + 1, 1)
            index += 1
    assert caught.value.errno == errno.ENOSPC
    assert len(journal) == index and journal[-1][1] == index  # the failed one is not in
    with pytest.raises(JournalWriteError):
        journal.reserve_headroom()  # the probe of a voter waiting for space: still full

    # A vote that cannot be stored raises, leaves the old meta file and no temporary.
    with pytest.raises(JournalWriteError) as vote:
        journal.setCurrentTerm(2, "other")
    assert vote.value.errno == errno.ENOSPC
    assert pickle.loads(path.with_name("raft.journal.meta").read_bytes())["currentTerm"] == 1
    assert sorted(p.name for p in small_disk.iterdir()) == [
        "filler",
        "raft.journal",
        "raft.journal.meta",
    ]

    expected = entries_of(journal)
    journal._destroy()
    reopened = RaftJournal(
        path, VERSION, chunk_bytes=64 * PAGE_BYTES
    )  # no torn record below the end: the same log
    assert entries_of(reopened) == expected

    filler.unlink()  # space returns: the probe passes, appends and the unsaved vote go through
    reopened.reserve_headroom()
    reopened.add(b"c", index + 1, 2)
    reopened.setCurrentTerm(2, "other")
    reopened._destroy()
    assert entries_of(FileJournal(str(path)))[-1] == (b"c", index + 1, 2)


def test_a_checkpoint_on_a_full_disk_keeps_the_old_one_and_no_temporary(small_disk: Path) -> None:
    path = small_disk / "recovery-point-offset-checkpoint"
    write_checkpoint(path, [(7,)])
    fill_filesystem(small_disk / "filler")
    with pytest.raises(OSError) as caught:
        write_checkpoint(path, [(n,) for n in range(100_000)])  # far more than a page
    assert caught.value.errno == errno.ENOSPC
    assert read_checkpoint(path, 1) == [(7,)]
    assert not path.with_name(path.name + ".tmp").exists()
