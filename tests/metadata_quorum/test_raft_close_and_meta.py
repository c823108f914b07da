"""Two power-loss risks of the metadata quorum, closed: ``MetadataLog.close()`` returns only once
the journal is closed and the directory unlocked, also when pysyncobj's tick thread ended before
it could close the journal; and every rewrite of the Raft meta file (term, vote, commit index)
fsyncs its data before the rename, while a second with nothing changed writes nothing.

Shares the "raft" group and its address 127.0.0.141 (free ports) with test_raft.py."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from metadata_quorum.raft import JOURNAL_FILE, MetadataLog, RaftOptions
from metadata_quorum.raft_journal import RaftJournal, read_meta
from tests.metadata_quorum.raft_node import HOSTS, ListMachine, free_port

pytestmark = pytest.mark.xdist_group("raft")
LEAD_TIMEOUT_S = 20.0


def _wait(probe: object, timeout_s: float, what: str) -> None:
    done = threading.Event()
    for _ in range(int(timeout_s / 0.02)):
        if probe():  # type: ignore[operator]
            return
        done.wait(0.02)  # poll interval, bounded by the deadline
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _open(data_dir: Path, address: str) -> MetadataLog:
    log = MetadataLog(address, [address], data_dir, ListMachine(), options=RaftOptions())
    try:
        _wait(log.is_leader, LEAD_TIMEOUT_S, "leadership")
    except BaseException:
        log.close()
        raise
    return log


def _journal(log: MetadataLog) -> RaftJournal:
    journal = log._node._SyncObj__raftLog
    assert isinstance(journal, RaftJournal)
    return journal


def test_close_returns_with_the_journal_closed_and_the_directory_free(tmp_path: Path) -> None:
    address = f"{HOSTS[0]}:{free_port(HOSTS[0])}"
    log = _open(tmp_path, address)
    log.append(b"one").result(timeout=10)
    journal = _journal(log)
    closers = [threading.Thread(target=log.close) for _ in range(2)]
    for closer in closers:
        closer.start()
    log.close()  # a third caller: each returns only once the close is done
    assert journal.closed, "close returned before the journal was closed"
    assert not log._node.tick_thread.is_alive()
    for closer in closers:
        closer.join(timeout=30)
        assert not closer.is_alive()
    reopened = _open(tmp_path, address)  # the lock is free at once
    reopened.close()


def test_close_closes_the_journal_if_the_tick_thread_ended_first(tmp_path: Path) -> None:
    """pysyncobj's tick thread stops without closing the journal once the thread it watches
    ends (its transport failing to come up does the same): close() must still close it."""
    address = f"{HOSTS[0]}:{free_port(HOSTS[0])}"
    log = _open(tmp_path, address)
    journal = _journal(log)
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    log._node._SyncObj__mainThread = ended
    log._node.tick_thread.join(timeout=10)
    assert not log._node.tick_thread.is_alive() and not journal.closed
    log.close()
    assert journal.closed
    _open(tmp_path, address).close()


def test_a_meta_rewrite_is_synced_before_its_rename_and_idle_seconds_write_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = RaftJournal(tmp_path / JOURNAL_FILE, b"0.3.17")
    synced: list[str] = []
    renamed: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def replace(source: Path, target: Path) -> None:
        renamed.append(str(source))
        assert str(source) in synced, "renamed before its data was synced"
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    journal.setCurrentTerm(3, "127.0.0.141:1")
    journal.setRaftCommitIndex(7)
    journal.onOneSecondTimer()
    assert len(renamed) == 2 and all(path.endswith(".meta.tmp") for path in renamed)
    assert read_meta(journal._meta_path) == {
        "currentTerm": 3, "votedForNodeId": "127.0.0.141:1", "raftCommitIndex": 7,
    }  # fmt: skip
    synced.clear()
    journal.onOneSecondTimer()  # nothing changed: no write, no fsync
    assert synced == [] and len(renamed) == 2
    journal.sync_meta = False  # RaftOptions(fsync=False)
    journal.setRaftCommitIndex(8)
    monkeypatch.setattr(os, "replace", real_replace)
    journal.onOneSecondTimer()
    assert synced == []
    journal._destroy()
    journal._destroy()  # again: nothing
