"""The forgetful filesystem: a FUSE mount that loses, at a simulated power cut, whatever was not
made durable by fsync, as LazyFS does for Jepsen (docs/chaos.md, "The forgetful filesystem").

::

    with ForgetfulFS(backing, mountpoint) as fs:   # mounted; the FUSE process is fs.pid
        ...run a program whose data directory is under mountpoint...
        fs.fsyncs()                                 # fsync/fdatasync/msync/dir fsyncs seen
        fs.power_off_after(k)                       # the (k+1)-th fails with EIO: all dark
        ...stop (SIGKILL) whatever uses the mount...
        report = fs.cut_power(seed, "torn")         # drop what was not durable, remount
    # unmounted (fusermount3 -u), the process stopped by its pid

The rules of durability and what is not modelled are in :mod:`chaos.lazyfs._state`; the FUSE side
(mmap, the kernel's page cache) in :mod:`chaos.lazyfs._server`. Needs ``/dev/fuse``,
``fusermount3`` (Debian's ``fuse3``) and the ``pyfuse3`` package (built against
``libfuse3-dev``); :func:`available` says whether they are there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from chaos.lazyfs._state import STAGING_DIR, CutMode, CutReport

__all__ = ["STAGING_DIR", "CutMode", "CutReport", "ForgetfulFS", "FsyncEvent", "available"]

MOUNT_TIMEOUT_S = 30.0  # a Python process importing pyfuse3 and trio on a busy 2-core machine
CONTROL_TIMEOUT_S = 60.0  # a cut renames every file of the tree
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class FsyncEvent:
    """One durability point the filesystem saw: ``fsync``, ``fdatasync`` or ``fsyncdir``, and
    the path (relative to the backing directory) it made durable."""

    kind: str
    path: str


def available() -> str | None:
    """None if a forgetful filesystem can be mounted here, else why not."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "no fusermount3 (Debian package fuse3)"
    try:
        import pyfuse3  # noqa: F401, PLC0415 - only the FUSE process needs it
    except ImportError as error:
        return f"pyfuse3 does not import: {error}"
    return None


class ForgetfulFS:
    """A forgetful mount of ``backing`` at ``mountpoint``, served by a child process that this
    object owns: :meth:`unmount` (or leaving the ``with`` block) unmounts it and stops the
    process by its pid, whatever happened. ``allow_other``: let users other than the mounting
    one use it (the chaos harness's node users)."""

    def __init__(self, backing: Path, mountpoint: Path, *, allow_other: bool = False) -> None:
        self.backing = Path(backing)
        self.mountpoint = Path(mountpoint)
        self.allow_other = allow_other
        self._process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._buffer = b""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def __enter__(self) -> ForgetfulFS:
        self.mount()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.unmount()

    # -- mounting ------------------------------------------------------------------------------
    def mount(self) -> None:
        """Start the FUSE process and wait until the mount serves."""
        assert self._process is None, "already mounted"
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair()
        command = [
            sys.executable, "-m", "chaos.lazyfs", "--backing", str(self.backing),
            "--mountpoint", str(self.mountpoint), "--control-fd", str(theirs.fileno()),
        ]  # fmt: skip
        if self.allow_other:
            command.append("--allow-other")
        try:
            self._process = subprocess.Popen(command, pass_fds=[theirs.fileno()])
        finally:
            theirs.close()
        self._control = ours
        try:
            ready = self._receive(MOUNT_TIMEOUT_S)
            if not ready.get("ready"):
                raise RuntimeError(f"forgetful filesystem did not start: {ready}")
        except BaseException:
            self.unmount()
            raise

    def unmount(self) -> None:
        """Unmount (``fusermount3 -u -z``: a descriptor still open on the mount does not keep
        it) and stop the FUSE process. Without a cut before, everything written stays, as a clean
        unmount syncs it."""
        process, control = self._process, self._control
        self._process, self._control, self._buffer = None, None, b""
        if process is None:
            return
        try:
            if process.poll() is None:
                subprocess.run(
                    ["fusermount3", "-u", "-z", str(self.mountpoint)],
                    check=False, capture_output=True, timeout=STOP_TIMEOUT_S,
                )  # fmt: skip
        finally:
            if control is not None:
                control.close()  # the process ends its loop on EOF, mounted or not
            _stop(process)

    # -- control -------------------------------------------------------------------------------
    def fsyncs(self) -> int:
        """How many fsync/fdatasync/fsyncdir calls this mount has seen."""
        return int(self._call({"op": "stats", "trace_since": 1 << 62})["fsyncs"])

    def fsync_trace(self, since: int = 0) -> list[FsyncEvent]:
        """The durability points of this mount from the ``since``-th on (the last 100,000 are
        kept)."""
        answer = self._call({"op": "stats", "trace_since": since})
        return [FsyncEvent(kind, path) for kind, path in answer["trace"]]

    def power_off_after(self, fsyncs: int) -> None:
        """Arm the crash point: after ``fsyncs`` durability points of this mount, the next fails
        with EIO and every later change too (the machine is off; what it wrote since its last
        durable point is what :meth:`cut_power` drops)."""
        self._call({"op": "power_off_after", "fsyncs": fsyncs})

    def power_off(self) -> None:
        """Go dark now: every later change fails with EIO."""
        self._call({"op": "power_off"})

    def cut_power(self, seed: int, mode: CutMode = "all", *, remount: bool = True) -> CutReport:
        """Drop what was not durable (``"all"``), or keep besides a seeded prefix of each file's
        last unsynced write (``"torn"``), then unmount and, with ``remount``, mount again: the
        kernel's caches of the mount go too, as a reboot's would. Stop the programs that use the
        mount first (their writes after this fail with EIO, or ENOTCONN once unmounted)."""
        answer = self._call({"op": "cut", "seed": seed, "mode": mode})
        report = answer["report"]
        self.unmount()
        if remount:
            self.mount()
        return CutReport(**report)

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._control is not None, "not mounted"
        self._control.sendall(json.dumps(request).encode() + b"\n")
        answer = self._receive(CONTROL_TIMEOUT_S)
        if not answer.get("ok"):
            raise RuntimeError(f"forgetful filesystem refused {request}: {answer}")
        return answer

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        assert self._control is not None, "not mounted"
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"forgetful filesystem silent for {timeout_s} s")
            self._control.settimeout(remaining)
            chunk = self._control.recv(65536)
            if not chunk:
                raise RuntimeError("forgetful filesystem process exited")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Wait for the FUSE process to end; SIGKILL it by its pid if it does not."""
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_TIMEOUT_S)
