"""The forgetful filesystem (chaos.lazyfs): what a power cut keeps and drops, file by file and name
by name, through a real FUSE mount."""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.lazyfs import STAGING_DIR, ForgetfulFS, FsyncEvent, available
from dataplane.tools.local_cluster import wait_for

pytestmark = pytest.mark.skipif(available() is not None, reason=f"no FUSE: {available()}")


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[ForgetfulFS]:
    with ForgetfulFS(tmp_path / "backing", tmp_path / "mount") as mounted:
        yield mounted


def write(path: Path, data: bytes, *, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_only_what_was_fsynced_survives_a_cut(fs: ForgetfulFS) -> None:
    root = fs.mountpoint
    write(root / "durable", b"synced", sync=True)
    sync_dir(root)
    write(root / "durable", b" and not", sync=False)
    write(root / "nameless", b"data synced, name not", sync=True)
    assert (root / "durable").read_bytes() == b"synced and not"  # reads see the page cache
    assert fs.fsyncs() == 3
    report = fs.cut_power(seed=1)
    assert (root / "durable").read_bytes() == b"synced"
    assert not (root / "nameless").exists()
    assert (report.files, report.dropped_names, report.reverted_files) == (1, 1, 1)


def test_a_name_synced_before_its_data_is_an_empty_file(fs: ForgetfulFS) -> None:
    write(fs.mountpoint / "empty", b"never synced", sync=False)
    sync_dir(fs.mountpoint)
    fs.cut_power(seed=1)
    assert (fs.mountpoint / "empty").read_bytes() == b""


def test_unsynced_renames_unlinks_and_truncations_are_undone(fs: ForgetfulFS) -> None:
    root = fs.mountpoint
    (root / "dir").mkdir()
    for name in ("a", "b", "c"):
        write(root / "dir" / name, name.encode() * 3, sync=True)
    sync_dir(root / "dir")
    sync_dir(root)
    os.rename(root / "dir" / "a", root / "dir" / "b")  # over b: b's old file must come back
    (root / "dir" / "c").unlink()
    os.truncate(root / "dir" / "b", 1)
    (root / "dir2").mkdir()
    fs.cut_power(seed=1)
    assert sorted(os.listdir(root)) == ["dir"]
    assert {p.name: p.read_bytes() for p in (root / "dir").iterdir()} == {
        "a": b"aaa", "b": b"bbb", "c": b"ccc",
    }  # fmt: skip


def test_a_rename_between_directories_is_durable_in_both_at_the_fsync_of_either(
    fs: ForgetfulFS,
) -> None:
    root = fs.mountpoint
    for name in ("from", "to"):
        (root / name).mkdir()
    write(root / "from" / "file", b"moved", sync=True)
    sync_dir(root / "from")
    sync_dir(root)
    os.rename(root / "from" / "file", root / "to" / "file")
    sync_dir(root / "to")
    fs.cut_power(seed=1)
    assert not (root / "from" / "file").exists()
    assert (root / "to" / "file").read_bytes() == b"moved"


def test_a_torn_cut_keeps_a_seeded_prefix_of_the_last_write(fs: ForgetfulFS) -> None:
    path = fs.mountpoint / "log"
    write(path, b"durable|", sync=True)
    sync_dir(fs.mountpoint)
    write(path, b"dropped|", sync=False)
    last = bytes(range(256)) * 8  # 2 KiB from byte 16: sector boundaries at 512, 1024, 1536
    write(path, last, sync=False)
    report = fs.cut_power(seed=7, mode="torn")
    kept = report.torn["log"]
    assert kept in (512 - 16, 1024 - 16, 1536 - 16)  # torn at a sector boundary, never whole
    # the earlier unsynced write is dropped; its bytes read as zeros (a hole), as on XFS
    assert path.read_bytes() == b"durable|" + b"\0" * 8 + last[:kept]


def test_a_write_inside_one_sector_is_kept_whole_or_not_at_all(fs: ForgetfulFS) -> None:
    path = fs.mountpoint / "header"
    write(path, b"\0" * 64, sync=True)
    sync_dir(fs.mountpoint)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\xff\xff\xff\xff", 36)  # a journal's end offset, say
    finally:
        os.close(fd)
    kept = fs.cut_power(seed=3, mode="torn").torn["header"]
    assert kept in (0, 4)
    assert path.read_bytes()[36:40] == (b"\xff" * 4 if kept else b"\0" * 4)


def test_power_off_fails_the_next_fsync_and_every_change_after(fs: ForgetfulFS) -> None:
    path = fs.mountpoint / "file"
    fs.power_off_after(1)
    write(path, b"one", sync=True)
    with pytest.raises(OSError) as failed:
        write(path, b"two", sync=True)
    assert failed.value.errno == errno.EIO
    with pytest.raises(OSError):
        write(fs.mountpoint / "other", b"x", sync=False)
    assert fs.fsync_trace() == [FsyncEvent("fsync", "file")]


def test_msync_of_a_shared_mapping_is_a_durability_point(fs: ForgetfulFS) -> None:
    path = fs.mountpoint / "index"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, mmap.PAGESIZE * 2)
        mapped = mmap.mmap(fd, mmap.PAGESIZE * 2)
        mapped[:4] = b"kept"
        mapped.flush()  # msync(MS_SYNC): the kernel writes the page back, then fsyncs
        mapped[mmap.PAGESIZE : mmap.PAGESIZE + 4] = b"lost"
        mapped.close()
    finally:
        os.close(fd)
    sync_dir(fs.mountpoint)
    assert fs.fsync_trace()[0] == FsyncEvent("fdatasync", "index")
    fs.cut_power(seed=1)
    data = path.read_bytes()
    assert data[:4] == b"kept" and data[mmap.PAGESIZE :] == b"\0" * mmap.PAGESIZE


def test_a_clean_unmount_keeps_everything_and_leaves_no_staging(tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    fs = ForgetfulFS(backing, tmp_path / "mount")
    with fs:
        (fs.mountpoint / "d").mkdir()
        write(fs.mountpoint / "d" / "f", b"unsynced", sync=False)
        (fs.mountpoint / "gone").mkdir()
        (fs.mountpoint / "gone").rmdir()
        held = os.open(fs.mountpoint / "d" / "f", os.O_RDONLY)  # lazy unmount: does not block
        pid = fs.pid
    try:
        os.close(held)  # closed either way; the flush it sends finds no filesystem
    except OSError as error:
        assert error.errno == errno.ENOTCONN
    assert pid is not None and fs.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped by its pid
    assert sorted(os.listdir(backing)) == ["d"] and STAGING_DIR not in os.listdir(backing)
    assert (backing / "d" / "f").read_bytes() == b"unsynced"


def test_a_terminated_filesystem_process_unmounts(tmp_path: Path) -> None:
    fs = ForgetfulFS(tmp_path / "backing", tmp_path / "mount")
    with fs:
        write(fs.mountpoint / "f", b"unsynced", sync=False)
        assert fs.pid is not None
        os.kill(fs.pid, signal.SIGTERM)  # not its owner's doing: a pkill, a sweep
        # the mount table, not os.path.ismount: that is False too while the mount is still
        # there but its process has closed the connection (lstat fails with ENOTCONN)
        wait_for("the mount to go", lambda: not _in_mount_table(fs.mountpoint))
        assert os.listdir(fs.mountpoint) == []  # the empty directory, not ENOTCONN


def _in_mount_table(mountpoint: Path) -> bool:
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        return any(line.split()[1] == str(mountpoint) for line in mounts)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_with_allow_other_another_user_owns_what_it_creates(tmp_path: Path) -> None:
    nobody = 65534
    # pytest's temporary directories are root's alone: the mount goes where nobody can reach it
    reachable = Path(tempfile.mkdtemp(prefix="lazyfs-"))
    os.chmod(reachable, 0o755)
    try:
        _write_as(nobody, tmp_path / "backing", reachable / "mount")
    finally:
        shutil.rmtree(reachable)


def _write_as(user: int, backing: Path, mountpoint: Path) -> None:
    with ForgetfulFS(backing, mountpoint, allow_other=True) as fs:
        os.chmod(fs.mountpoint, 0o777)
        pid = os.fork()
        if pid == 0:  # the child: a node user writing its data directory
            code = 1
            try:
                os.setgid(user)
                os.setuid(user)
                (fs.mountpoint / "data").mkdir()
                write(fs.mountpoint / "data" / "segment", b"by nobody", sync=True)
                write(fs.mountpoint / "data" / "segment", b", again", sync=False)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        owner = os.stat(fs.backing / "data" / "segment")
        assert (owner.st_uid, owner.st_gid) == (user, user)
        assert (fs.mountpoint / "data" / "segment").read_bytes() == b"by nobody, again"
