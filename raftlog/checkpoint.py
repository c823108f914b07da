"""Small files that must never be half-written: write a temporary, fsync it, rename, fsync the dir.

Kafka's checkpoint text format: a version line, an entry-count line, then one entry per line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from raftlog.errors import StorageError

CHECKPOINT_VERSION = 0
MAX_CHECKPOINT_ENTRIES = 1_000_000


def write_atomically(
    path: Path, data: bytes, *, durable: bool = True, sync_data: bool = False
) -> None:
    """Write a temporary, rename it over ``path``. ``durable``: fsync the file before the rename
    and the directory after; without, a crash may leave the file empty or torn (for a file that
    is a cache and checked when read, whose fsync the caller does later: ``fsync_path``).
    ``sync_data`` alone: the file's data is fsynced before the rename, the directory is not, so
    a crash leaves either the old file or the new one, each whole (the Raft meta file).

    A failed write (ENOSPC on a full disk, EIO) raises with ``path`` untouched and the
    temporary removed, so a full disk keeps the previous file and gets no half-written one."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable or sync_data:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_path(path.parent)


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory: so the names in it are durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(path: Path, entries: list[tuple[int, ...]], *, durable: bool = True) -> None:
    _write_entries(path, [" ".join(str(field) for field in entry) for entry in entries], durable)


def read_checkpoint(path: Path, fields: int) -> list[tuple[int, ...]] | None:
    """Entries of a checkpoint file, None if it does not exist. A malformed file is a
    StorageError naming the file: it was written atomically, so damage means outside hands."""
    lines = _read_entries(path)
    if lines is None:
        return None
    try:
        entries = [tuple(int(field) for field in line.split()) for line in lines]
        if any(len(entry) != fields for entry in entries):
            raise ValueError("entries do not match the field count")
    except ValueError as error:
        raise _malformed(path, error) from error
    return entries


def write_offset_checkpoint(
    path: Path, offsets: Mapping[tuple[str, int], int], *, durable: bool = True
) -> None:
    """Kafka's ``OffsetCheckpointFile`` (``replication-offset-checkpoint``): one entry per
    partition, ``topic partition offset``. Topic names hold no whitespace (Kafka's legal
    characters), so a space separates the fields."""
    lines = [f"{topic} {partition} {offset}" for (topic, partition), offset in offsets.items()]
    _write_entries(path, lines, durable)


def read_offset_checkpoint(path: Path) -> dict[tuple[str, int], int] | None:
    """The entries of :func:`write_offset_checkpoint`'s file, None if it does not exist; a
    malformed one is a StorageError naming the file, as :func:`read_checkpoint`."""
    lines = _read_entries(path)
    if lines is None:
        return None
    offsets: dict[tuple[str, int], int] = {}
    try:
        for line in lines:
            topic, partition, offset = line.split(" ")
            offsets[(topic, int(partition))] = int(offset)
        if len(offsets) != len(lines):
            raise ValueError("a partition appears twice")
    except ValueError as error:
        raise _malformed(path, error) from error
    return offsets


def _write_entries(path: Path, entries: list[str], durable: bool) -> None:
    lines = [str(CHECKPOINT_VERSION), str(len(entries)), *entries]
    write_atomically(path, ("\n".join(lines) + "\n").encode(), durable=durable)


def _read_entries(path: Path) -> list[str] | None:
    """The entry lines of a checkpoint file (its version and count checked), None if it does
    not exist."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    lines = text.split("\n")
    try:
        version, count = int(lines[0]), int(lines[1])
        if version != CHECKPOINT_VERSION or not 0 <= count <= MAX_CHECKPOINT_ENTRIES:
            raise ValueError(f"version {version}, {count} entries")
        entries = lines[2 : 2 + count]
        if len(entries) != count:
            raise ValueError("entries do not match the count")
    except (ValueError, IndexError) as error:
        raise _malformed(path, error) from error
    return entries


def _malformed(path: Path, error: Exception) -> StorageError:
    return StorageError(f"checkpoint {path} is malformed: {error}")
