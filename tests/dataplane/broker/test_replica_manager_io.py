"""Which IO errors take the broker's log directory offline: every one, a full disk included even
while a partition is being removed, except ENOENT from a thread that still held a partition whose
topic was deleted (its directory is gone)."""

from __future__ import annotations

import errno
import uuid
from pathlib import Path

import pytest

from dataplane.broker.partition import IsrChange, Role
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from raftlog.config import LogConfig
from raftlog.errors import LogDirIOError


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
    (directory deleted), and the high-watermark checkpoint of it fails with ENOENT: seen in a
    chaos run (seed 20261123, CI) as a broker halting for no disk fault at all."""
    failures: list[tuple[Path, OSError]] = []
    replicas = manager(tmp_path, failures)
    partition = replicas._open("deleted", 0, uuid.uuid4(), LogConfig())
    replicas._partitions[("deleted", 0)] = partition
    partition.high_watermark = 5  # a checkpoint is due
    replicas._remove(partition)
    assert not partition.log.directory.exists()
    partition.role = Role.LEADER  # what the maintenance thread's stale view still says
    with pytest.raises(LogDirIOError):
        replicas.checkpoint([partition])
    assert failures == []


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
