"""The leader-epoch cache answers end_offset_for_epoch as Kafka's LeaderEpochFileCache."""

from pathlib import Path

from raftlog.epoch import UNDEFINED_EPOCH, LeaderEpochCache


def make_cache(tmp_path: Path) -> LeaderEpochCache:
    cache = LeaderEpochCache(tmp_path)
    for epoch, start in [(1, 0), (3, 100), (4, 250)]:
        cache.assign(epoch, start)
    return cache


def test_end_offset_for_epoch(tmp_path: Path) -> None:
    cache = make_cache(tmp_path)
    leo = 300
    assert cache.end_offset_for_epoch(4, leo) == (4, 300), "latest epoch ends at the log end"
    assert cache.end_offset_for_epoch(3, leo) == (3, 250)
    assert cache.end_offset_for_epoch(2, leo) == (1, 100), "an epoch never seen: the floor's end"
    assert cache.end_offset_for_epoch(0, leo) == (0, 0), "below the first epoch"
    assert cache.end_offset_for_epoch(5, leo) == (UNDEFINED_EPOCH, -1), "above the latest"
    assert cache.end_offset_for_epoch(UNDEFINED_EPOCH, leo) == (UNDEFINED_EPOCH, -1)


def test_assign_ignores_old_epochs_and_survives_reopen(tmp_path: Path) -> None:
    cache = make_cache(tmp_path)
    cache.assign(2, 400)
    assert cache.latest_epoch == 4
    reopened = LeaderEpochCache(tmp_path)
    assert reopened.entries == cache.entries
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "0\n3\n1 0\n3 100\n4 250\n"


def test_truncation_from_both_ends(tmp_path: Path) -> None:
    cache = make_cache(tmp_path)
    cache.truncate_from_end(250)
    assert [tuple(e) for e in cache.entries] == [(1, 0), (3, 100)]
    cache.truncate_from_start(120)
    assert [tuple(e) for e in cache.entries] == [(3, 120)]
    assert cache.epoch_for_offset(500) == 3 and cache.epoch_for_offset(10) == UNDEFINED_EPOCH


def test_a_rebuild_that_changes_nothing_writes_nothing(tmp_path: Path) -> None:
    """Every partition of a killed broker rebuilds its epochs from the recovered batches: one
    that agrees with the checkpoint costs no write (and no fsync); one that differs is written."""
    cache = LeaderEpochCache(tmp_path)
    cache.assign(1, 0)
    cache.assign(3, 10)
    checkpoint = tmp_path / "leader-epoch-checkpoint"
    written = checkpoint.stat().st_mtime_ns
    inode = checkpoint.stat().st_ino
    cache.rebuild_from(10, [(3, 10)])
    assert checkpoint.stat().st_ino == inode and checkpoint.stat().st_mtime_ns == written
    cache.rebuild_from(10, [(2, 10), (4, 12)])  # the recovered batches say otherwise
    assert checkpoint.stat().st_ino != inode
    assert [tuple(e) for e in LeaderEpochCache(tmp_path).entries] == [(1, 0), (2, 10), (4, 12)]
