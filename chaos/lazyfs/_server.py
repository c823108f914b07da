"""The FUSE process: pyfuse3 operations over a :class:`~chaos.lazyfs._state.Tree`, and the control
socket its owner drives it through (``python -m chaos.lazyfs``; :class:`chaos.lazyfs.ForgetfulFS`
starts it).

The mount is a passthrough with the kernel's page cache on (no ``direct_io``, ``keep_cache``):
``mmap(MAP_SHARED)`` works, dirty mapped pages reach :meth:`write` when the kernel writes them
back, and ``msync(MS_SYNC)`` arrives as :meth:`fsync`. Writes are write-through (no FUSE
writeback cache), so each ``write(2)`` is one :meth:`write` here: the "last unsynced write" of a
torn cut is the program's last write call (split at 128 KiB, FUSE's largest request).

Control protocol: one JSON object per line each way. Requests ``{"op": "stats"}``,
``{"op": "power_off_after", "fsyncs": k}`` (the fsync after the k-th of this mount fails with EIO
and the filesystem goes dark: every later change fails with EIO), ``{"op": "power_off"}`` and
``{"op": "cut", "seed": s, "mode": "all" | "torn"}``; each is answered by ``{"ok": true, ...}``.
The process says ``{"ready": true}`` once mounted; on EOF of the socket it unmounts and exits.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import signal
import socket
import stat
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import pyfuse3
import trio

from chaos.lazyfs._state import ROOT_INO, CutMode, FsError, Tree

ATTR_TIMEOUT_S = 300  # nothing but this process changes the backing directory while mounted
CONTROL_LINE_MAX_BYTES = 1024 * 1024

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _errors(
    method: Callable[_P, Coroutine[Any, Any, _R]],
) -> Callable[_P, Coroutine[Any, Any, _R]]:
    """OSError and FsError as the FUSEError the kernel gets (pyfuse3 answers EIO to anything
    else, and logs it)."""

    async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await method(*args, **kwargs)
        except FsError as error:
            raise pyfuse3.FUSEError(error.code) from error
        except OSError as error:
            raise pyfuse3.FUSEError(error.errno or errno.EIO) from error

    wrapper.__name__ = method.__name__
    return wrapper


class ForgetfulOperations(pyfuse3.Operations):
    def __init__(self, tree: Tree) -> None:
        super().__init__()
        self.tree = tree
        self.handles: dict[int, int] = {}  # fh (the backing descriptor) -> inode
        self.power_off_after: int | None = None
        self.dark = False
        self.cut_done = False
        self.owner_gone = False  # the control socket closed before the mount went

    # -- helpers -------------------------------------------------------------------------------
    def _alive(self) -> None:
        if self.dark:
            raise FsError(errno.EIO)

    def _fsync_allowed(self) -> None:
        self._alive()
        limit = self.power_off_after
        if limit is not None and self.tree.fsync_count >= limit:
            self.dark = True  # the power went before this fsync could finish
            raise FsError(errno.EIO)

    def _attributes(self, ino: int, st: os.stat_result | None = None) -> pyfuse3.EntryAttributes:
        st = st or os.lstat(self.tree.path(ino))
        attributes = pyfuse3.EntryAttributes()
        attributes.st_ino = pyfuse3.InodeT(ino)
        attributes.generation = 0
        attributes.entry_timeout = ATTR_TIMEOUT_S
        attributes.attr_timeout = ATTR_TIMEOUT_S
        attributes.st_mode = pyfuse3.ModeT(st.st_mode)
        attributes.st_nlink = st.st_nlink
        attributes.st_uid = st.st_uid
        attributes.st_gid = st.st_gid
        attributes.st_rdev = st.st_rdev
        attributes.st_size = st.st_size
        attributes.st_blksize = st.st_blksize
        attributes.st_blocks = st.st_blocks
        attributes.st_atime_ns = st.st_atime_ns
        attributes.st_mtime_ns = st.st_mtime_ns
        attributes.st_ctime_ns = st.st_ctime_ns
        return attributes

    def _own(self, ino: int, ctx: pyfuse3.RequestContext) -> None:
        """A new file or directory belongs to the caller (``allow_other``: a node user), as on
        any filesystem; this process creates it as root."""
        if os.geteuid() == 0 and (ctx.uid, ctx.gid) != (0, 0):
            os.chown(self.tree.path(ino), ctx.uid, ctx.gid)

    def _open_backing(self, ino: int) -> int:
        fd = os.open(self.tree.path(ino), os.O_RDWR)
        self.tree.nodes[ino].open_count += 1
        self.handles[fd] = ino
        return fd

    # -- names ---------------------------------------------------------------------------------
    @_errors
    async def lookup(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        text = os.fsdecode(name)
        if text == ".":
            return self._attributes(parent_inode)
        if text == "..":
            up = ROOT_INO if parent_inode == ROOT_INO else self.tree.parent[parent_inode][0]
            return self._attributes(up)
        return self._attributes(self.tree.lookup(parent_inode, text))

    async def forget(self, inode_list: Any) -> None:
        return None  # inodes live as long as the tree needs them, not the kernel's lookups

    @_errors
    async def getattr(
        self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        if inode not in self.tree.nodes:
            raise FsError(errno.ENOENT)
        return self._attributes(inode)

    @_errors
    async def setattr(
        self,
        inode: pyfuse3.InodeT,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: pyfuse3.FileHandleT | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        self._alive()
        path = self.tree.path(inode)
        if fields.update_size:
            fd = fh if fh is not None else os.open(path, os.O_RDWR)
            try:
                self.tree.before_truncate(inode, fd, attr.st_size)
                os.ftruncate(fd, attr.st_size)
            finally:
                if fh is None:
                    os.close(fd)
        if fields.update_mode:
            os.chmod(path, stat.S_IMODE(attr.st_mode))
        if fields.update_uid or fields.update_gid:
            os.chown(
                path,
                attr.st_uid if fields.update_uid else -1,
                attr.st_gid if fields.update_gid else -1,
            )
        if fields.update_atime or fields.update_mtime:
            st = os.lstat(path)
            os.utime(path, ns=(
                attr.st_atime_ns if fields.update_atime else st.st_atime_ns,
                attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns,
            ))  # fmt: skip
        return self._attributes(inode)

    @_errors
    async def mkdir(
        self,
        parent_inode: pyfuse3.InodeT,
        name: pyfuse3.FileNameT,
        mode: pyfuse3.ModeT,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        self._alive()
        ino = self.tree.create(parent_inode, os.fsdecode(name), is_dir=True, mode=mode)
        self._own(ino, ctx)
        return self._attributes(ino)

    @_errors
    async def create(
        self,
        parent_inode: pyfuse3.InodeT,
        name: pyfuse3.FileNameT,
        mode: pyfuse3.ModeT,
        flags: pyfuse3.FlagT,
        ctx: pyfuse3.RequestContext,
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        self._alive()
        ino = self.tree.create(parent_inode, os.fsdecode(name), is_dir=False, mode=mode)
        self._own(ino, ctx)
        fd = self._open_backing(ino)
        info = pyfuse3.FileInfo(fh=pyfuse3.FileHandleT(fd), keep_cache=True)
        return info, self._attributes(ino, os.fstat(fd))

    @_errors
    async def unlink(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> None:
        self._alive()
        self.tree.remove(parent_inode, os.fsdecode(name), is_dir=False)

    @_errors
    async def rmdir(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> None:
        self._alive()
        self.tree.remove(parent_inode, os.fsdecode(name), is_dir=True)

    @_errors
    async def rename(
        self,
        parent_inode_old: pyfuse3.InodeT,
        name_old: pyfuse3.FileNameT,
        parent_inode_new: pyfuse3.InodeT,
        name_new: pyfuse3.FileNameT,
        flags: pyfuse3.FlagT,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        self._alive()
        old, new = os.fsdecode(name_old), os.fsdecode(name_new)
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise FsError(errno.EINVAL)
        if flags & pyfuse3.RENAME_NOREPLACE and new in self.tree.current[parent_inode_new]:
            raise FsError(errno.EEXIST)
        self.tree.rename(parent_inode_old, old, parent_inode_new, new)

    async def link(self, *args: Any) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EPERM)  # hard links are not modelled

    async def symlink(self, *args: Any) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EPERM)

    async def mknod(self, *args: Any) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EPERM)

    # -- files ---------------------------------------------------------------------------------
    @_errors
    async def open(
        self, inode: pyfuse3.InodeT, flags: pyfuse3.FlagT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.FileInfo:
        if self.tree.nodes[inode].is_dir:
            raise FsError(errno.EISDIR)
        if flags & os.O_TRUNC:
            self._alive()
        fd = self._open_backing(inode)
        if flags & os.O_TRUNC:
            self.tree.before_truncate(inode, fd, 0)
            os.ftruncate(fd, 0)
        return pyfuse3.FileInfo(fh=pyfuse3.FileHandleT(fd), keep_cache=True)

    @_errors
    async def read(self, fh: pyfuse3.FileHandleT, off: int, size: int) -> bytes:
        return os.pread(fh, size, off)

    @_errors
    async def write(self, fh: pyfuse3.FileHandleT, off: int, buf: bytes) -> int:
        self._alive()
        self.tree.before_write(self.handles[fh], fh, off, len(buf))
        return os.pwrite(fh, buf, off)

    async def flush(self, fh: pyfuse3.FileHandleT) -> None:
        return None  # close(2): nothing becomes durable

    @_errors
    async def release(self, fh: pyfuse3.FileHandleT) -> None:
        os.close(fh)
        ino = self.handles.pop(fh)
        node = self.tree.nodes[ino]
        node.open_count -= 1
        if not self.cut_done:
            self.tree.collect(ino)

    @_errors
    async def fsync(self, fh: pyfuse3.FileHandleT, datasync: bool) -> None:
        self._fsync_allowed()
        self.tree.fsync_file(self.handles[fh], fh, "fdatasync" if datasync else "fsync")

    # -- directories ---------------------------------------------------------------------------
    @_errors
    async def opendir(
        self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.FileHandleT:
        if inode not in self.tree.current:
            raise FsError(errno.ENOTDIR)
        return pyfuse3.FileHandleT(inode)

    @_errors
    async def readdir(
        self, fh: pyfuse3.FileHandleT, start_id: int, token: pyfuse3.ReaddirToken
    ) -> None:
        entries = sorted(self.tree.current[fh].items())
        for n in range(start_id, len(entries)):
            name, ino = entries[n]
            attributes = self._attributes(ino)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attributes, n + 1):
                return

    async def releasedir(self, fh: pyfuse3.FileHandleT) -> None:
        return None

    @_errors
    async def fsyncdir(self, fh: pyfuse3.FileHandleT, datasync: bool) -> None:
        self._fsync_allowed()
        self.tree.fsync_dir(fh)

    @_errors
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        st = os.statvfs(self.tree.backing)
        data = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                     "f_ffree", "f_favail", "f_namemax"):  # fmt: skip
            setattr(data, name, getattr(st, name))
        return data

    # -- control -------------------------------------------------------------------------------
    def control(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "stats":
            since = int(request.get("trace_since", 0))
            trace = list(self.tree.fsync_trace)[since:]
            return {"ok": True, "fsyncs": self.tree.fsync_count, "trace": trace}
        if op == "power_off_after":
            self.power_off_after = int(request["fsyncs"])
            return {"ok": True}
        if op == "power_off":
            self.dark = True
            return {"ok": True}
        if op == "cut":
            mode: CutMode = "torn" if request.get("mode") == "torn" else "all"
            self.dark = True
            report = self.tree.cut(int(request["seed"]), mode)
            self.cut_done = True
            return {"ok": True, "report": dataclasses.asdict(report)}
        return {"ok": False, "error": f"unknown op {op!r}"}


async def _serve_control(operations: ForgetfulOperations, control: trio.SocketStream) -> None:
    """Answer control requests until the owner closes the socket, then end the FUSE loop."""
    buffer = b""
    while True:
        chunk = await control.receive_some(65536)
        if not chunk:
            break
        buffer += chunk
        if len(buffer) > CONTROL_LINE_MAX_BYTES:
            raise ValueError("control request over 1 MiB")
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            answer = operations.control(json.loads(line))
            await control.send_all(json.dumps(answer).encode() + b"\n")
    operations.owner_gone = True  # still mounted: unmount on the way out
    pyfuse3.terminate()


async def _stop_on_signal(operations: ForgetfulOperations) -> None:
    """SIGTERM or SIGINT (a sweep, a ``pkill``, the session ending) unmounts on the way out, as
    the owner's going does: a FUSE process that just died would leave a mount whose every
    access fails with ENOTCONN."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            operations.owner_gone = True
            pyfuse3.terminate()
            return


async def _run(operations: ForgetfulOperations, control_fd: int) -> None:
    control = trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=control_fd)))
    await control.send_all(b'{"ready": true}\n')
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve_control, operations, control)
        nursery.start_soon(_stop_on_signal, operations)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()  # unmounted by fusermount3 -u: stop listening


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the forgetful filesystem (chaos.lazyfs)")
    parser.add_argument("--backing", type=Path, required=True)
    parser.add_argument("--mountpoint", type=Path, required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--allow-other", action="store_true")
    args = parser.parse_args(argv)
    operations = ForgetfulOperations(Tree(args.backing.resolve()))
    options = set(pyfuse3.default_options) | {"fsname=raftlog-lazyfs"}
    if args.allow_other:
        options.add("allow_other")
    pyfuse3.init(operations, str(args.mountpoint), options)
    try:
        trio.run(_run, operations, args.control_fd)
    finally:
        pyfuse3.close(unmount=operations.owner_gone)  # else fusermount3 -u did it
        if not operations.cut_done:
            operations.tree.sync_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
