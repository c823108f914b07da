"""Which IO errors take the broker's log directory offline: every one, a full disk included even
while a partition is being removed, except ENOENT from a thread that still held a partition whose
topic was deleted (its directory is gone)."""

from __future__ import annotations

import errno
import uuid
from pathlib import Path

import pytest

from dataplane.broker.partition import HIGH_WATERMARK_CHECKPOINT, IsrChange, Role
from dataplane.broker.replica_manager import (
    REPLICATION_OFFSET_CHECKPOINT,
    ReplicaManager,
    ReplicaManagerConfig,
)
from dataplane.tools.local_cluster import wait_for
from raftlog.checkpoint import read_offset_checkpoint, write_checkpoint
from raftlog.config import LogConfig
from raftlog.errors import LogDirIOError
from tests.dataplane.cluster_support import values_batch


def manager(tmp_path: Path, failures: list[tuple[Path, OSError]]) -> ReplicaManager:
    def alter(change: IsrChange) -> None:
        raise AssertionError("no ISR change expected")

    return ReplicaManager(
        1, tmp_path, ReplicaManagerConfig(), lambda: 0, alter,
        lambda directory, error: failures.append((directory, error)),
    )  # fmt: skip


def test_an_io_error_of_a_hosted_partition_is_a_log_dir_failure(tmp_path: Path) -> None:
    failures: list[tuple[Path, OSError]] = []
    replicas = manager(tmp_path, failures)
    partition = replicas._open("events", 0, uuid.uuid4(), LogConfig())
    replicas._partitions[("events", 0)] = partition
    assert partition.log.io_failure_listener is not None
    partition.log.io_failure_listener(partition.log.directory, OSError(errno.EIO, "I/O error"))
    assert [d for d, _ in failures] == [partition.log.directory]


def test_a_checkpoint_racing_a_topic_deletion_is_not_a_log_dir_failure(tmp_path: Path) -> None:
    """The maintenance thread took its list of partitions, the metadata thread then removed one
    (directory deleted), and the high-watermark checkpoint ran with it: seen in a chaos run (seed
    20261123, CI) as a broker halting for no disk fault at all, when each partition's directory
    held its own file. The log directory's one file holds it; nothing is written into the
    directory removed."""
    failures: list[tuple[Path, OSError]] = []
    replicas = manager(tmp_path, failures)
    partition = replicas._open("deleted", 0, uuid.uuid4(), LogConfig())
    replicas._partitions[("deleted", 0)] = partition
    partition.high_watermark = 5  # a checkpoint is due
    replicas._remove(partition)
    assert not partition.log.directory.exists()
    partition.role = Role.LEADER  # what the maintenance thread's stale view still says
    replicas.checkpoint([partition])
    assert failures == []
    assert not partition.log.directory.exists()
    assert read_offset_checkpoint(tmp_path / REPLICATION_OFFSET_CHECKPOINT) == {("deleted", 0): 5}


def test_a_failed_checkpoint_write_is_a_log_dir_failure(tmp_path: Path) -> None:
    failures: list[tuple[Path, OSError]] = []
    replicas = manager(tmp_path, failures)
    partition = replicas._open("events", 0, uuid.uuid4(), LogConfig())
    replicas._partitions[("events", 0)] = partition
    partition.high_watermark = 3
    (tmp_path / f"{REPLICATION_OFFSET_CHECKPOINT}.tmp").mkdir()  # the temporary cannot be opened
    with pytest.raises(LogDirIOError):
        replicas.checkpoint([partition])
    assert [d for d, _ in failures] == [tmp_path]


def test_a_full_disk_while_removing_a_partition_is_a_log_dir_failure(tmp_path: Path) -> None:
    failures: list[tuple[Path, OSError]] = []
    replicas = manager(tmp_path, failures)
    partition = replicas._open("deleted", 0, uuid.uuid4(), LogConfig())
    replicas._partitions[("deleted", 0)] = partition
    del replicas._partitions[("deleted", 0)]  # as _remove does before closing the log
    assert partition.log.io_failure_listener is not None
    full = OSError(errno.ENOSPC, "No space left on device")
    partition.log.io_failure_listener(partition.log.directory, full)
    assert failures == [(partition.log.directory, full)]


def _with_records(replicas: ReplicaManager, topic: str, topic_id: uuid.UUID, count: int) -> None:
    partition = replicas._open(topic, 0, topic_id, LogConfig())
    partition.log.append(values_batch([b"v"] * count), leader_epoch=0)
    replicas._partitions[(topic, 0)] = partition


def test_the_high_watermarks_survive_a_restart_in_one_file_of_the_log_directory(
    tmp_path: Path,
) -> None:
    """One replication-offset-checkpoint for every partition (Kafka's), written only when a
    high watermark moved; a partition's own directory holds no high-watermark file."""
    ids = {"a": uuid.uuid4(), "b": uuid.uuid4()}
    replicas = manager(tmp_path, [])
    for topic, topic_id in ids.items():
        _with_records(replicas, topic, topic_id, 4)
    replicas.get("a", 0).high_watermark, replicas.get("b", 0).high_watermark = 3, 4
    path = tmp_path / REPLICATION_OFFSET_CHECKPOINT
    replicas.checkpoint(replicas.partitions())
    written = path.stat().st_ino  # a rewrite renames a new file over it: another inode
    replicas.checkpoint(replicas.partitions())  # nothing moved: not written again
    assert path.stat().st_ino == written
    replicas.get("a", 0).high_watermark = 4
    replicas.checkpoint(replicas.partitions())
    assert path.stat().st_ino != written
    assert read_offset_checkpoint(path) == {("a", 0): 4, ("b", 0): 4}
    assert not any((tmp_path / f"{t}-0" / HIGH_WATERMARK_CHECKPOINT).exists() for t in ids)
    for partition in replicas.partitions():
        partition.log.close()
    again = manager(tmp_path, [])
    opened = {t: again._open(t, 0, topic_id, LogConfig()) for t, topic_id in ids.items()}
    assert {t: p.high_watermark for t, p in opened.items()} == {"a": 4, "b": 4}
    for partition in opened.values():
        partition.log.close()


def test_the_high_watermark_file_of_an_older_version_is_read_then_replaced(
    tmp_path: Path,
) -> None:
    """A log directory written before replication-offset-checkpoint: each partition's own
    high-watermark-checkpoint is read at open, and removed once the log directory's file
    holds the partition."""
    topic_id = uuid.uuid4()
    replicas = manager(tmp_path, [])
    _with_records(replicas, "old", topic_id, 5)
    replicas.get("old", 0).log.close()
    legacy = tmp_path / "old-0" / HIGH_WATERMARK_CHECKPOINT
    write_checkpoint(legacy, [(4,)])
    upgraded = manager(tmp_path, [])
    partition = upgraded._open("old", 0, topic_id, LogConfig())
    upgraded._partitions[("old", 0)] = partition
    assert partition.high_watermark == 4
    upgraded.checkpoint([partition])
    assert not legacy.exists()
    assert read_offset_checkpoint(tmp_path / REPLICATION_OFFSET_CHECKPOINT) == {("old", 0): 4}
    partition.log.close()


def test_the_timers_visit_the_partitions_that_told_of_work_until_they_are_idle(
    tmp_path: Path,
) -> None:
    """With 1,000 idle partitions, visiting every one each 100 ms tick cost a broker 7% of a
    core. Now a tick visits the partitions whose logs told of work (an append, a deletion set
    aside) and keeps those not idle yet; the running maintenance thread still deletes a
    truncated segment's files once file.delete.delay.ms passed, with nothing else to visit."""
    replicas = manager(tmp_path, [])
    config = LogConfig.model_validate({"segment.bytes": 1024, "file.delete.delay.ms": 200})
    busy = replicas._open("busy", 0, uuid.uuid4(), config)
    idle = replicas._open("idle", 0, uuid.uuid4(), config)
    for partition in (busy, idle):
        replicas._partitions[(partition.topic, 0)] = partition
    assert replicas._maintenance_due.take() == {busy, idle}  # opened: looked at once
    assert replicas._release_due.take() == {busy, idle}
    for _ in range(4):  # a segment each: 1 KiB segments
        busy.log.append(values_batch([b"v" * 600]), leader_epoch=0)
    assert replicas._release_due.take() == {busy}
    assert replicas._maintenance_due.take() == {busy}
    busy.log.truncate_to(1)
    pending = sorted(busy.log.directory.glob("*.deleted"))
    assert pending and busy.log.has_timed_work()
    replicas.start()
    try:
        wait_for("the set-aside files deleted", lambda: not any(p.exists() for p in pending), 10)
        wait_for("the partition idle again", lambda: not busy.log.has_timed_work(), 10)
    finally:
        replicas.close()
