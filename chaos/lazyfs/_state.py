"""What the forgetful filesystem remembers: the current tree (what programs see, kept in the
backing directory as it is) and, beside it, enough to bring back the durable one at a power cut.

The backing directory always holds the *current* state: every write, truncation, create, rename
and unlink is done there at once, so reads (and mmap, through the kernel's own page cache of the
mount) are plain passthrough. What is not yet durable is remembered the other way round, as an
undo record (a journal of old contents, where LazyFS keeps a cache of the new ones): per file, the
size it had at its last fsync and the old bytes of every page changed since; per directory, its
entries as of its last fsync; unlinked files whose old name is still durable wait in a trash
directory. :meth:`Tree.cut` rebuilds the durable state from that record; an append-only log costs
no memory at all between fsyncs (appended bytes past the durable size need no old copy).

Durability rules (POSIX's, taken strictly, as LazyFS and ALICE take them):
- a file's data and size are durable at fsync/fdatasync of the file (msync(MS_SYNC) is one);
- a name (create, rename, unlink, mkdir, rmdir) is durable at fsync of its directory; a rename
  between two directories becomes durable in both at the fsync of either (one journal transaction,
  as on ext4), so a file is never found under two names after a cut;
- a name made durable before its file's data is an empty file after the cut.
Not modelled: hard links, symlinks and device nodes (refused with EPERM), extended attributes,
and the durability of modes and times (they are kept as set).
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import stat
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

PAGE_BYTES = 4096
SECTOR_BYTES = 512  # a torn write tears at these boundaries
ROOT_INO = 1
STAGING_DIR = ".lazyfs"  # under the backing root, hidden from the mount: trash and cut staging
FSYNC_TRACE_MAX = 100_000  # the fsyncs a run remembers (kind, path), oldest dropped first
CutMode = Literal["all", "torn"]


class FsError(Exception):
    """An operation refused with an errno (the FUSE layer answers it to the kernel)."""

    def __init__(self, code: int) -> None:
        super().__init__(os.strerror(code))
        self.code = code


@dataclass
class Node:
    """One inode. ``durable_size``/``saved``: a file's durable content is the current bytes below
    ``durable_size`` with each page of ``saved`` (its bytes at the last fsync) put back."""

    ino: int
    is_dir: bool
    durable_size: int = 0
    saved: dict[int, bytes] = field(default_factory=dict)
    last_write: tuple[int, int] | None = None  # (offset, length) of the last unsynced write
    open_count: int = 0
    in_trash: bool = False


@dataclass(frozen=True)
class CutReport:
    """What a power cut kept and dropped."""

    mode: str
    seed: int
    files: int  # files that survived
    directories: int
    dropped_names: int  # current names that did not survive
    reverted_files: int  # surviving files whose content went back to their last fsync
    torn: dict[str, int]  # path -> bytes kept of its last unsynced write (mode torn)


class Tree:
    """The inode table over a backing directory; every method runs on the FUSE loop's thread."""

    def __init__(self, backing: Path) -> None:
        self.backing = backing
        self.staging = backing / STAGING_DIR
        if self.staging.exists():
            shutil.rmtree(self.staging)  # a cut or a run the process did not finish
        self.trash = self.staging / "trash"
        self.trash.mkdir(parents=True)
        self.nodes: dict[int, Node] = {ROOT_INO: Node(ROOT_INO, True)}
        self.current: dict[int, dict[str, int]] = {ROOT_INO: {}}
        self.durable: dict[int, dict[str, int]] = {ROOT_INO: {}}
        self.parent: dict[int, tuple[int, str]] = {}  # current name of every linked inode
        # Renames between two directories not yet durable in either: (ino, from dir, from name,
        # to dir, to name); a fsync of either directory commits both sides.
        self.moves: list[tuple[int, int, str, int, str]] = []
        self.fsync_count = 0
        self.fsync_trace: deque[tuple[str, str]] = deque(maxlen=FSYNC_TRACE_MAX)
        self._next_ino = ROOT_INO + 1
        self._scan(ROOT_INO, backing)

    def _scan(self, dir_ino: int, path: Path) -> None:
        with os.scandir(path) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if dir_ino == ROOT_INO and entry.name == STAGING_DIR:
                    continue
                if entry.is_symlink() or not (entry.is_dir() or entry.is_file()):
                    raise FsError(errno.EPERM)  # only files and directories are modelled
                node = self._new_node(is_dir=entry.is_dir())
                if not node.is_dir:
                    node.durable_size = entry.stat().st_size
                self._link(dir_ino, entry.name, node.ino)
                self.durable[dir_ino][entry.name] = node.ino
                if node.is_dir:
                    self._scan(node.ino, Path(entry.path))

    def _new_node(self, *, is_dir: bool) -> Node:
        node = Node(self._next_ino, is_dir)
        self._next_ino += 1
        self.nodes[node.ino] = node
        if is_dir:
            self.current[node.ino] = {}
            self.durable[node.ino] = {}
        return node

    def _link(self, dir_ino: int, name: str, ino: int) -> None:
        self.current[dir_ino][name] = ino
        self.parent[ino] = (dir_ino, name)

    # -- paths ---------------------------------------------------------------------------------
    def path(self, ino: int) -> Path:
        """Where the inode's bytes are in the backing directory now."""
        if self.nodes[ino].in_trash:
            return self.trash / str(ino)
        parts: list[str] = []
        while ino != ROOT_INO:
            ino, name = self.parent[ino]
            parts.append(name)
        return self.backing.joinpath(*reversed(parts))

    def lookup(self, dir_ino: int, name: str) -> int:
        entries = self.current.get(dir_ino)
        if entries is None:
            raise FsError(errno.ENOTDIR)
        ino = entries.get(name)
        if ino is None:
            raise FsError(errno.ENOENT)
        return ino

    def check_new_name(self, dir_ino: int, name: str) -> None:
        if dir_ino == ROOT_INO and name == STAGING_DIR:
            raise FsError(errno.EPERM)
        if name in self.current[dir_ino]:
            raise FsError(errno.EEXIST)

    # -- namespace -----------------------------------------------------------------------------
    def create(self, dir_ino: int, name: str, *, is_dir: bool, mode: int) -> int:
        self.check_new_name(dir_ino, name)
        path = self.path(dir_ino) / name
        if is_dir:
            os.mkdir(path, mode)
        else:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode))
        node = self._new_node(is_dir=is_dir)
        self._link(dir_ino, name, node.ino)
        return node.ino

    def remove(self, dir_ino: int, name: str, *, is_dir: bool) -> None:
        ino = self.lookup(dir_ino, name)
        node = self.nodes[ino]
        if node.is_dir != is_dir:
            raise FsError(errno.EISDIR if node.is_dir else errno.ENOTDIR)
        if is_dir and self.current[ino]:
            raise FsError(errno.ENOTEMPTY)
        self._unlink_node(ino)

    def _unlink_node(self, ino: int) -> None:
        """Take ``ino`` out of the current tree: into the trash while something still needs its
        bytes (a durable name, an open descriptor), removed for good otherwise."""
        dir_ino, name = self.parent.pop(ino)
        path = self.backing_path_of(dir_ino, name)
        del self.current[dir_ino][name]
        node = self.nodes[ino]
        if self._needed(node):
            os.rename(path, self.trash / str(ino))
            node.in_trash = True
        else:
            self._destroy(node, path)

    def backing_path_of(self, dir_ino: int, name: str) -> Path:
        return self.path(dir_ino) / name

    def rename(self, old_dir: int, old_name: str, new_dir: int, new_name: str) -> None:
        ino = self.lookup(old_dir, old_name)
        if new_dir == ROOT_INO and new_name == STAGING_DIR:
            raise FsError(errno.EPERM)
        node = self.nodes[ino]
        if node.is_dir and self._is_ancestor(ino, new_dir):
            raise FsError(errno.EINVAL)
        victim = self.current[new_dir].get(new_name)
        if victim == ino:
            return
        if victim is not None:
            victim_node = self.nodes[victim]
            if victim_node.is_dir != node.is_dir:
                raise FsError(errno.EISDIR if victim_node.is_dir else errno.ENOTDIR)
            if victim_node.is_dir and self.current[victim]:
                raise FsError(errno.ENOTEMPTY)
            self._unlink_node(victim)
        os.rename(self.backing_path_of(old_dir, old_name), self.backing_path_of(new_dir, new_name))
        del self.current[old_dir][old_name]
        self._link(new_dir, new_name, ino)
        if old_dir != new_dir:
            self.moves.append((ino, old_dir, old_name, new_dir, new_name))

    def _is_ancestor(self, ino: int, of: int) -> bool:
        while True:
            if of == ino:
                return True
            if of == ROOT_INO:
                return False
            of = self.parent[of][0]

    def _needed(self, node: Node) -> bool:
        if node.open_count > 0 or node.ino in self.parent:
            return True
        return any(node.ino in entries.values() for entries in self.durable.values())

    def _destroy(self, node: Node, path: Path) -> None:
        if node.is_dir:
            os.rmdir(path)
            del self.current[node.ino]
        else:
            os.unlink(path)
        node.saved.clear()
        node.in_trash = False
        del self.nodes[node.ino]
        if node.is_dir:  # unreachable: what only its durable entries kept may go now
            for child in self.durable.pop(node.ino).values():
                self.collect(child)

    def collect(self, ino: int) -> None:
        """Free a trashed inode nothing needs any more (after a release or a directory fsync)."""
        node = self.nodes.get(ino)
        if node is not None and node.in_trash and not self._needed(node):
            self._destroy(node, self.trash / str(ino))

    # -- file contents -------------------------------------------------------------------------
    def before_write(self, ino: int, fd: int, offset: int, length: int) -> None:
        """Keep the durable bytes of the pages ``[offset, offset + length)`` is about to change."""
        node = self.nodes[ino]
        end = min(offset + length, node.durable_size)
        for page in range(offset // PAGE_BYTES, (end - 1) // PAGE_BYTES + 1 if end > offset else 0):
            self._save_page(node, fd, page)
        node.last_write = (offset, length)

    def before_truncate(self, ino: int, fd: int, size: int) -> None:
        """Keep the durable bytes a truncation to ``size`` takes (holes and zeros need none:
        a restore's ftruncate brings zeros back)."""
        node = self.nodes[ino]
        if size >= node.durable_size:
            return
        if size % PAGE_BYTES:
            self._save_page(node, fd, size // PAGE_BYTES)
        for start, end in _data_extents(fd, size, node.durable_size):
            for page in range(start // PAGE_BYTES, (end - 1) // PAGE_BYTES + 1):
                self._save_page(node, fd, page, skip_zeros=True)
        node.last_write = None

    def _save_page(self, node: Node, fd: int, page: int, *, skip_zeros: bool = False) -> None:
        if page in node.saved:
            return
        start = page * PAGE_BYTES
        data = os.pread(fd, min(PAGE_BYTES, node.durable_size - start), start)
        if skip_zeros and not data.strip(b"\0"):
            return
        node.saved[page] = data

    def fsync_file(self, ino: int, fd: int, kind: str) -> None:
        node = self.nodes[ino]
        node.durable_size = os.fstat(fd).st_size
        node.saved.clear()
        node.last_write = None
        self._count(kind, ino)

    def fsync_dir(self, ino: int) -> None:
        for move in [m for m in self.moves if ino in (m[1], m[3])]:
            moved, old_dir, old_name, new_dir, new_name = move
            if self.durable[old_dir].get(old_name) == moved:
                del self.durable[old_dir][old_name]
            self.durable[new_dir][new_name] = moved
            self.moves.remove(move)
        before = set(self.durable[ino].values())
        self.durable[ino] = dict(self.current[ino])
        for gone in before - set(self.durable[ino].values()):
            self.collect(gone)
        self._count("fsyncdir", ino)

    def _count(self, kind: str, ino: int) -> None:
        self.fsync_count += 1
        self.fsync_trace.append((kind, str(self.path(ino).relative_to(self.backing))))

    # -- the power cut -------------------------------------------------------------------------
    def cut(self, seed: int, mode: CutMode) -> CutReport:
        """Turn the backing directory into what survives a power cut now: the durable tree, each
        file at its durable content; with ``mode="torn"`` a seeded prefix of each surviving
        file's last unsynced write is kept too, cut at a sector boundary (an out-of-order
        writeback cut mid-way: the bytes between the durable end and that write read as zeros,
        as on XFS)."""
        rng = random.Random(seed)
        survivors = dict(self._durable_paths())
        torn: dict[str, int] = {}
        reverted = 0
        for ino, relative in sorted(survivors.items()):
            node = self.nodes[ino]
            if node.is_dir:
                continue
            size = os.stat(self.path(ino)).st_size
            reverted += bool(node.saved) or size != node.durable_size
            kept = self._revert(node, rng if mode == "torn" else None)
            if kept is not None:
                torn[str(relative)] = kept
        dropped = sum(1 for ino in self.parent if ino not in survivors)
        stage = self.staging / "cut"
        stage.mkdir()
        modes = {ino: stat.S_IMODE(os.stat(self.path(ino)).st_mode) for ino in survivors}
        for ino in list(self.nodes):
            node = self.nodes[ino]
            if ino == ROOT_INO or node.is_dir:
                continue
            if ino in survivors:
                os.rename(self.path(ino), stage / str(ino))
            else:
                os.unlink(self.path(ino))
        for entry in self.backing.iterdir():
            if entry.name != STAGING_DIR:
                shutil.rmtree(entry)  # only directories are left, and they are empty
        for ino, relative in sorted(survivors.items(), key=lambda item: len(item[1].parts)):
            target = self.backing / relative
            if self.nodes[ino].is_dir:
                os.mkdir(target, modes[ino])
            else:
                os.rename(stage / str(ino), target)
        shutil.rmtree(self.staging)
        files = sum(1 for ino in survivors if not self.nodes[ino].is_dir)
        return CutReport(mode, seed, files, len(survivors) - files, dropped, reverted, torn)

    def _durable_paths(self) -> Iterator[tuple[int, Path]]:
        """Every inode reachable from the root through durable names, with its path."""
        pending: list[tuple[int, Path]] = [(ROOT_INO, Path())]
        seen = {ROOT_INO}
        while pending:
            dir_ino, relative = pending.pop()
            for name, ino in sorted(self.durable[dir_ino].items()):
                if ino in seen or ino not in self.nodes:
                    continue
                seen.add(ino)
                yield ino, relative / name
                if self.nodes[ino].is_dir:
                    pending.append((ino, relative / name))

    def _revert(self, node: Node, rng: random.Random | None) -> int | None:
        """Put a file back to its durable content; with ``rng``, then a prefix of its last
        unsynced write (its length returned)."""
        path = self.path(node.ino)
        fd = os.open(path, os.O_RDWR)
        try:
            prefix = b""
            if rng is not None and node.last_write is not None:
                offset, length = node.last_write
                prefix = os.pread(fd, _torn_length(offset, length, rng), offset)
            os.ftruncate(fd, node.durable_size)
            for page, data in node.saved.items():
                os.pwrite(fd, data, page * PAGE_BYTES)
            if rng is None or node.last_write is None:
                return None
            os.pwrite(fd, prefix, node.last_write[0])
            return len(prefix)
        finally:
            os.close(fd)

    def sync_all(self) -> None:
        """A clean unmount: everything is durable as it is; the trash goes."""
        shutil.rmtree(self.staging)


def _torn_length(offset: int, length: int, rng: random.Random) -> int:
    """How much of a write at ``offset`` a torn cut keeps: up to a sector boundary inside it
    (some of it, never all nor nothing); a write inside one sector all or nothing: a sector is
    written whole or not at all, what ALICE and journaling filesystems assume of a disk."""
    first = (offset // SECTOR_BYTES + 1) * SECTOR_BYTES
    boundaries = range(first, offset + length, SECTOR_BYTES)
    if not boundaries:
        return rng.choice((0, length))
    return rng.choice(boundaries) - offset


def _data_extents(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The ranges of ``[start, end)`` that hold data (SEEK_DATA/SEEK_HOLE: a preallocated index
    is mostly a hole, and reading it whole would cost megabytes per roll)."""
    position = start
    while position < end:
        try:
            data = os.lseek(fd, position, os.SEEK_DATA)
        except OSError as error:
            if error.errno == errno.ENXIO:
                return  # no data after position
            raise
        if data >= end:
            return
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        yield data, hole
        position = hole
