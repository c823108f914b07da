"""Full-disk faults: each node's data directory on its own size-limited tmpfs, filled on demand.

Why tmpfs
---------
A full disk must come from the kernel (ENOSPC from write, fallocate, mmap growth) exactly where a
real one would, without filling the machine's disk. A tmpfs mounted with ``size=`` is such a disk:
`fill` takes every free byte with a root-owned filler file, healing deletes it. Its pages outlive
a SIGKILL of the node just as a disk's page cache does, which is all the harness needs: it kills
processes, it never cuts power.

A slow disk is not made: it needs a block device to throttle (dm-delay, or cgroup v2 ``io.max``);
tmpfs has none, and this machine has no device mapper.

What is mounted, and how it goes away
-------------------------------------
Every mount's source is ``raftlog-disk-<run id>`` (what /proc/self/mounts shows), the run id being
the one of the run's iptables chain (it starts with the run's pid). Leaving the `DiskFaults`
context, also by an exception or Ctrl-C, deletes the fillers, copies each node's data to
``<data>.saved`` beside the mount (the segment files a failed run is debugged with) and unmounts
(lazily when a process still holds a file there). `sweep_mounts` unmounts what a crashed run left.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from chaos.network import pid_alive
from dataplane.client._closing import Closing

log = logging.getLogger(__name__)

SOURCE_PREFIX = "raftlog-disk-"
FILLER = ".chaos-disk-filler"
COMMAND_TIMEOUT_S = 15.0
FILL_CHUNK = 1 << 20


class DiskFaultError(RuntimeError):
    """A mount or unmount failed; the message names the command and its stderr."""


def _run(argv: list[str]) -> None:
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DiskFaultError(f"`{' '.join(argv)}`: {error}") from error
    if result.returncode != 0:
        raise DiskFaultError(
            f"`{' '.join(argv)}` exited with {result.returncode}: {result.stderr.strip()}"
        )


@dataclass
class _Mount:
    path: Path
    filler: Path | None = None  # set while the disk is full


class DiskFaults(Closing):
    """Size-limited disks for node data directories, and full-disk faults on them; leaving
    the ``with`` block calls `close`."""

    def __init__(self, run_id: str, size_bytes: int) -> None:
        if size_bytes < 1 << 20:
            raise ValueError(f"a node disk needs at least 1 MiB: {size_bytes}")
        self.source = SOURCE_PREFIX + run_id
        self.size_bytes = size_bytes
        self._mounts: dict[int, _Mount] = {}

    def mount(self, node_id: int, path: Path, uid: int, gid: int) -> None:
        """Mount the node's disk on `path` (created if missing), owned by the node's user."""
        path.mkdir(parents=True, exist_ok=True)
        options = f"size={self.size_bytes},mode=0750,uid={uid},gid={gid}"
        _run(["mount", "-t", "tmpfs", "-o", options, self.source, str(path)])
        self._mounts[node_id] = _Mount(path)
        log.info("node %d: data on a %d-byte tmpfs at %s", node_id, self.size_bytes, path)

    def fill(self, node_id: int) -> Callable[[], None]:
        """Take every free byte of the node's disk; the returned heal frees them again."""
        mount = self._mounts[node_id]
        filler = mount.path / FILLER
        mount.filler = filler
        taken = fill_filesystem(filler)
        log.info("node %d: disk full (%d bytes taken by %s)", node_id, taken, filler)
        return lambda: self.free(node_id)

    def free(self, node_id: int) -> None:
        mount = self._mounts[node_id]
        if mount.filler is not None:
            mount.filler.unlink(missing_ok=True)
            mount.filler = None

    def free_all(self) -> None:
        for node_id in self._mounts:
            with contextlib.suppress(OSError):
                self.free(node_id)

    def close(self) -> None:
        """Free, save and unmount every disk; safe to call more than once."""
        self.free_all()
        for node_id in list(self._mounts):
            mount = self._mounts.pop(node_id)
            saved = mount.path.with_name(mount.path.name + ".saved")
            shutil.rmtree(saved, ignore_errors=True)
            try:
                shutil.copytree(mount.path, saved, symlinks=True)
            except (OSError, shutil.Error) as error:
                log.warning("node %d: data not saved to %s: %s", node_id, saved, error)
            unmount(mount.path)


def fill_filesystem(filler: Path) -> int:
    """Create `filler` and grow it until the filesystem holding it has no free byte left."""
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    taken = 0
    try:
        stats = os.statvfs(filler.parent)
        free = stats.f_bavail * stats.f_frsize
        if free:
            with contextlib.suppress(OSError):  # raced with a node's write: topped up below
                os.posix_fallocate(fd, 0, free)
                taken = free
        os.lseek(fd, taken, os.SEEK_SET)
        chunk = FILL_CHUNK
        while chunk:
            try:
                taken += os.write(fd, b"\0" * chunk)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                chunk //= 2
    finally:
        os.close(fd)
    return taken


def unmount(path: Path) -> None:
    """Unmount `path`; lazily (detached now, gone when the last file closes) if it is busy."""
    try:
        _run(["umount", str(path)])
    except DiskFaultError as error:
        log.warning("%s; unmounting lazily", error)
        _run(["umount", "-l", str(path)])


def mounts_of(source_prefix: str, table: Iterable[str]) -> list[tuple[str, Path]]:
    """(source, mount point) of the mounts in a /proc/self/mounts listing whose source starts
    with `source_prefix` (mount points are octal-escaped there: a space is \\040)."""
    found = []
    for line in table:
        fields = line.split()
        if len(fields) >= 2 and fields[0].startswith(source_prefix):
            point = fields[1].encode().decode("unicode_escape")
            found.append((fields[0], Path(point)))
    return found


def sweep_mounts() -> list[Path]:
    """Unmount the disks of every crashed run (the pid its run id starts with is gone)."""
    table = Path("/proc/self/mounts").read_text().splitlines()
    swept = []
    for source, point in mounts_of(SOURCE_PREFIX, table):
        pid, dash, _ = source.removeprefix(SOURCE_PREFIX).partition("-")
        if dash and pid.isdigit() and not pid_alive(int(pid)):
            unmount(point)
            swept.append(point)
    return swept
