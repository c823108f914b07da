"""Power-loss faults: each node's data directory on its own forgetful filesystem, cut on demand.

A SIGKILL leaves every page a node wrote in the kernel's page cache, so a write acknowledged but
never fsynced survives it: killing processes cannot show what a power cut loses. With a
``power-loss`` or ``power-loss-all`` fault among a run's faults, each node's data directory (its
partition logs and the metadata quorum's journal, ``__cluster_metadata``, both under
``log.dirs``) is a mount of the forgetful filesystem (chaos.lazyfs, docs/chaos.md "The forgetful
filesystem"), backed by a directory of its own. The fault SIGKILLs the node(s) by pid, waits
until they are gone, and cuts power on their mounts: what was not made durable by fsync is
dropped (all of it, or with a torn prefix of each file's last unsynced write), and the mount
comes back as after a reboot. The heal starts the nodes again (`chaos.faults.FaultInjector`).

Ownership: `PowerFaults` owns every FUSE process it started. Leaving its ``with`` block — also by
an exception or Ctrl-C — unmounts every mount and stops its process by pid (a clean unmount makes
everything written durable, so the data stays in the backing directory for debugging). If the
harness itself is killed, each FUSE process sees its control socket close and unmounts itself
(chaos.lazyfs._server), the nodes having died with the harness (`popen_owned`); a mount whose
FUSE process is gone all the same (killed too) answers ENOTCONN, and `sweep_mounts` (``raftlog
chaos sweep``) unmounts it.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import time
from pathlib import Path

from chaos.disk import mounts_of
from chaos.history import PowerCut
from chaos.lazyfs import CutMode, ForgetfulFS, available
from dataplane.client._closing import Closing
from raftlog.clean_shutdown import SAME_BOOT_FILE

log = logging.getLogger(__name__)

FSNAME = "raftlog-lazyfs"  # the source /proc/self/mounts shows for a forgetful filesystem
EXIT_TIMEOUT_S = 30.0  # a SIGKILLed node's exit (its descriptors closed through FUSE)
POLL_S = 0.02


class PowerFaultError(RuntimeError):
    """The forgetful filesystem cannot be had here, or a node did not die before its cut."""


class PowerFaults(Closing):
    """Forgetful mounts for node data directories, and power cuts on them; leaving the ``with``
    block calls `close`."""

    def __init__(self) -> None:
        missing = available()
        if missing is not None:
            raise PowerFaultError(f"power-loss faults need the forgetful filesystem: {missing}")
        self._mounts: dict[int, ForgetfulFS] = {}

    def mount(self, node_id: int, path: Path, backing: Path, uid: int, gid: int) -> None:
        """Mount a forgetful filesystem over ``backing`` on ``path`` (both created if missing),
        its root owned by the node's user; other users (the node's) may use it."""
        backing.mkdir(parents=True, exist_ok=True)
        os.chown(backing, uid, gid)
        backing.chmod(0o750)
        fs = ForgetfulFS(backing, path, allow_other=True)
        fs.mount()
        self._mounts[node_id] = fs
        log.info("node %d: data on a forgetful filesystem at %s (backing %s)", node_id, path,
                 backing)  # fmt: skip

    @property
    def fuse_pids(self) -> dict[int, int]:
        """Node id -> the pid of the FUSE process serving its data directory now."""
        return {n: fs.pid for n, fs in self._mounts.items() if fs.pid is not None}

    def cut(self, node_id: int, seed: int, mode: CutMode) -> PowerCut:
        """Cut the power of the node's disk: drop what was not durable (the node must be dead:
        `wait_exited`), then mount it again, as a reboot finds it. A reboot also starts a new
        boot, which this machine cannot: the broker's same-boot note (raftlog.clean_shutdown)
        is removed instead, so its next start proves nothing it does not have, as after a
        real power cut."""
        fs = self._mounts[node_id]
        report = fs.cut_power(seed, mode)
        (fs.mountpoint / SAME_BOOT_FILE).unlink(missing_ok=True)
        return PowerCut(
            node_id=node_id,
            mode=mode,
            seed=seed,
            files=report.files,
            dropped_names=report.dropped_names,
            reverted_files=report.reverted_files,
            torn=dict(report.torn),
        )

    def close(self) -> None:
        """Unmount every mount and stop its FUSE process by pid; safe to call more than once."""
        for node_id in list(self._mounts):
            fs = self._mounts.pop(node_id)
            try:
                fs.unmount()
            except (OSError, RuntimeError) as error:  # the others are still unmounted
                log.warning("node %d: unmounting %s: %s", node_id, fs.mountpoint, error)


def process_exited(pid: int) -> bool:
    """Whether ``pid`` has exited: gone, or a zombie its parent has not reaped yet (a zombie has
    closed every descriptor and unmapped every page: it writes nothing any more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat[stat.rindex(")") + 2] in ("Z", "X")


def wait_exited(pids: list[int], timeout_s: float = EXIT_TIMEOUT_S) -> None:
    """Wait until every one of ``pids`` has exited; PowerFaultError naming those that did not."""
    deadline = time.monotonic() + timeout_s
    while alive := [pid for pid in pids if not process_exited(pid)]:
        if time.monotonic() > deadline:
            raise PowerFaultError(f"pids {alive} still running {timeout_s} s after SIGKILL")
        time.sleep(POLL_S)  # polling a condition with a deadline


def sweep_mounts() -> list[Path]:
    """Unmount every forgetful filesystem whose FUSE process is gone (the mount answers
    ENOTCONN): what a run killed with its FUSE processes left behind."""
    table = Path("/proc/self/mounts").read_text().splitlines()
    swept = []
    for _, point in mounts_of(FSNAME, table):
        try:
            os.stat(point)
            continue  # served: a live run's
        except OSError as error:
            if error.errno != errno.ENOTCONN:
                raise
        subprocess.run(
            ["fusermount3", "-u", "-z", str(point)], check=True, capture_output=True, timeout=15
        )
        swept.append(point)
    return swept
