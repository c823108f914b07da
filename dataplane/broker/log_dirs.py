"""The broker's one log directory as DescribeLogDirs tells it, for the KAFKA listener
(dataplane/kafka/log_dirs.py) and for BrokerService's DescribeLogDirs alike: each hosted
replica's size and offset lag, and the filesystem's total and usable bytes."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class _Log(Protocol):
    @property
    def size_bytes(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...


class Partition(Protocol):
    """What is read of a hosted replica (dataplane.broker.partition.Partition)."""

    topic: str
    partition: int
    high_watermark: int

    @property
    def log(self) -> _Log: ...


@dataclass(frozen=True)
class ReplicaLog:
    """What DescribeLogDirs tells of one hosted replica."""

    topic: str
    partition: int
    size_bytes: int
    offset_lag: int


def replica_logs(partitions: Iterable[Partition]) -> list[ReplicaLog]:
    """Each replica's size and offset lag (Kafka's ``max(high watermark - log end offset, 0)``:
    0 for every current replica), by topic and partition."""
    found = [
        ReplicaLog(
            p.topic,
            p.partition,
            p.log.size_bytes,
            max(p.high_watermark - p.log.log_end_offset, 0),
        )
        for p in partitions
    ]
    return sorted(found, key=lambda r: (r.topic, r.partition))


def log_dir_path(log_dir: Path) -> str:
    """The directory as DescribeLogDirs names it: absolute and normalised."""
    return os.path.normpath(log_dir.absolute())


def disk_usage(log_dir: Path) -> tuple[int, int]:
    """(total, usable) bytes of the filesystem holding ``log_dir``."""
    usage = shutil.disk_usage(log_dir)
    return usage.total, usage.free
