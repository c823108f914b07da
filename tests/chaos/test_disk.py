"""Full-disk faults: real tmpfs mounts, filled and freed, always unmounted.

Root only (mounts); every mount a test makes is unmounted in a ``finally`` of the code under test
or, as a last resort, of the test itself.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from chaos.disk import DiskFaults, fill_filesystem, mounts_of, sweep_mounts, unmount
from chaos.faults import FaultInjector
from chaos.network import NetworkFaults, NodeIdentity
from chaos.schedule import PlannedFault

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
]
SIZE = 4 << 20


def mounted(path: Path) -> bool:
    return os.path.ismount(path)


def write_until_full(path: Path) -> int:
    """Bytes a node-like writer still gets onto the disk holding `path`."""
    written = 0
    with path.open("ab", buffering=0) as out:
        try:
            for _ in range(1024):
                written += out.write(b"x" * 4096) or 0
        except OSError as error:
            assert error.errno == errno.ENOSPC
            return written
    raise AssertionError(f"{path}: 4 MiB more fitted on a full disk")


def test_fill_takes_every_byte_and_free_gives_them_back(tmp_path: Path) -> None:
    data = tmp_path / "node-1" / "data"
    with DiskFaults("test-fill", SIZE) as disks:
        disks.mount(1, data, os.getuid(), os.getgid())
        assert mounted(data)
        (data / "segment.log").write_bytes(b"acknowledged" * 100)
        heal = disks.fill(1)
        assert os.statvfs(data).f_bavail == 0
        assert write_until_full(data / "segment.log") < 4096  # at most the last page's tail
        heal()
        assert os.statvfs(data).f_bavail > 0
        assert write_until_full(data / "more.log") > SIZE // 2
    assert not mounted(data)
    saved = tmp_path / "node-1" / "data.saved"
    assert (saved / "segment.log").read_bytes().startswith(b"acknowledged" * 100)
    assert not (saved / ".chaos-disk-filler").exists()


def test_leaving_the_context_on_an_error_unmounts_a_full_disk(tmp_path: Path) -> None:
    data = tmp_path / "data"
    busy = None
    with pytest.raises(RuntimeError, match="interrupted"), DiskFaults("test-error", SIZE) as disks:
        disks.mount(1, data, os.getuid(), os.getgid())
        disks.fill(1)
        busy = (data / "open.log").open("ab")  # a process still holding a file: lazy unmount
        raise RuntimeError("interrupted")
    assert busy is not None
    busy.close()
    assert not mounted(data)


def test_the_injector_fills_a_disk_and_heals_by_freeing_and_restarting(tmp_path: Path) -> None:
    class Processes:
        started: list[int] = []

        def pid(self, node_id: int) -> int | None:
            return None

        def start(self, node_id: int) -> None:
            self.started.append(node_id)

    data = tmp_path / "data"
    processes = Processes()
    with (
        DiskFaults("test-inject", SIZE) as disks,
        NetworkFaults([]) as network,
        FaultInjector(processes, {}, network, disks) as injector,
    ):
        disks.mount(1, data, os.getuid(), os.getgid())
        heal = injector.fill_disk(1)
        assert os.statvfs(data).f_bavail == 0
        heal()
        assert os.statvfs(data).f_bavail > 0
        assert processes.started == [1]
        injector.fill_disk(1)
    assert not mounted(data)  # released (freed) and unmounted on the way out


def test_an_injector_without_disks_refuses_disk_full() -> None:
    identity = NodeIdentity(user="nobody-here", uid=4242, gid=4242, addresses=("127.0.0.136",))
    with (
        NetworkFaults([]) as network,
        FaultInjector(object(), {1: identity}, network) as injector,  # type: ignore[arg-type]
    ):
        fault = PlannedFault(id=1, kind="disk-full", at_s=0, length_s=1)
        with pytest.raises(ValueError, match="own disks"):
            injector.inject(fault, controller=lambda: -1, leader=lambda p: -1)


def test_sweep_unmounts_the_disks_of_crashed_runs_only(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    crashed, live = tmp_path / "crashed", tmp_path / "live"
    for path, run_id in ((crashed, f"{gone.pid}-dead"), (live, f"{os.getpid()}-live")):
        path.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", f"raftlog-disk-{run_id}", str(path)],
            check=True,
        )
    try:
        assert crashed in sweep_mounts()
        assert not mounted(crashed) and mounted(live)
    finally:
        for path in (crashed, live):
            if mounted(path):
                unmount(path)


def test_mounts_of_reads_the_mount_table() -> None:
    table = [
        "tmpfs /tmp tmpfs rw 0 0",
        r"raftlog-disk-123-ab /work/a\040b/data tmpfs rw,size=4096k 0 0",
        "raftlog-disk-9-cd /x tmpfs rw 0 0",
    ]
    assert mounts_of("raftlog-disk-", table) == [
        ("raftlog-disk-123-ab", Path("/work/a b/data")),
        ("raftlog-disk-9-cd", Path("/x")),
    ]


def test_fill_filesystem_of_an_already_full_disk_takes_nothing(tmp_path: Path) -> None:
    with DiskFaults("test-twice", SIZE) as disks:
        disks.mount(1, tmp_path / "d", os.getuid(), os.getgid())
        disks.fill(1)
        assert fill_filesystem(tmp_path / "d" / "second-filler") == 0
