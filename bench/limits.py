"""The machine's limits, measured in the same run as the systems: what the disk and loopback
can do at all, so a figure can be read as a fraction of what was possible.

- ``fio`` sequential jobs, one at a time, in a scratch directory under the benchmark's work
  directory (the filesystem the brokers write to), removed afterwards:
    - writes of 64 KiB blocks with ``fdatasync`` after every block (a durable log's worst case);
    - writes of 64 KiB blocks buffered (one ``fsync`` at the end, counted). A figure only, no
      target: it measures the page cache, so the VM's memory more than its disk (1 GiB fits
      in it; it read 913-3,158 MB/s in one afternoon here);
    - writes of at least 4 GiB with ``--direct=1`` (no page cache), then reads of the same file
      with ``--direct=1``: the disk's own rates. 1 MiB blocks, 4 in flight (``libaio``): the
      shape of the kernel's writeback of a log, which sends large requests, several at once.
  The limits derived from them: produce at most the direct write rate ÷ the replication
  factor (every copy is on this one disk), a consumer catching up from the disk at most the
  direct read rate.
- ``iperf3`` over loopback between two of the run's own addresses: one TCP stream, bytes/s.

Both tools are Debian packages (``make bench`` installs them); a missing tool is an error,
not a silent gap. Every process started here is waited for (``iperf3``'s one-off server is
killed by its pid if the client failed).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from dataplane.tools.local_cluster import free_port, wait_for
from dataplane.tools.owned_process import popen_owned

FIO_BLOCK = "64k"
FIO_SIZE = {"full": "1g", "quick": "64m"}
FIO_FDATASYNC_SIZE = {"full": "256m", "quick": "16m"}
FIO_RUNTIME_S = 30  # fio stops a buffered or fdatasync job after this, whatever its size
FIO_DIRECT_BLOCK = "1m"
FIO_DIRECT_IODEPTH = 4
FIO_DIRECT_BYTES = {"full": 4 << 30, "quick": 64 << 20}  # at least 4 GiB: the figure
# a direct job runs to its size (the bytes are the point), bounded by this: 4 GiB in 10 minutes
# is 7 MB/s, far below any disk a broker runs on
FIO_DIRECT_RUNTIME_S = 600
IPERF_SECONDS = {"full": 5, "quick": 1}
TOOL_TIMEOUT_S = 120.0


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed (make bench installs the Debian package)")
    return path


def _fio(directory: Path, name: str, size: str, *extra: str) -> float:
    """Bytes/s of one fio sequential-write job of 64 KiB blocks in ``directory``."""
    command = [
        _tool("fio"), f"--name={name}", f"--directory={directory}", "--rw=write",
        f"--bs={FIO_BLOCK}", f"--size={size}", "--ioengine=psync", f"--runtime={FIO_RUNTIME_S}",
        "--output-format=json", *extra,
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=True
    )
    return fio_rate(done.stdout, "write")[0]


def fio_rate(output: str, direction: str) -> tuple[float, int]:
    """(bytes/s, bytes moved) of the first job in fio's JSON output, ``direction`` being
    ``read`` or ``write``. A job that moved nothing is an error: fio reports 0 B/s for a job
    it could not run (``--direct=1`` on a filesystem without O_DIRECT, say), not a failure."""
    job = json.loads(output)["jobs"][0]
    figures = job[direction]
    moved = int(figures["io_bytes"])
    if moved <= 0 or int(job.get("error", 0)) != 0:
        raise RuntimeError(
            f"fio's {job.get('jobname')} job moved no data: error {job.get('error')}"
        )
    return float(figures["bw_bytes"]), moved


def _fio_direct(path: Path, direction: str, size_bytes: int) -> tuple[float, int]:
    """fio's sequential ``direction`` (read or write) of ``size_bytes`` of ``path`` with
    ``--direct=1``: (bytes/s, bytes moved)."""
    command = [
        _tool("fio"), f"--name=direct-{direction}", f"--filename={path}", f"--rw={direction}",
        f"--bs={FIO_DIRECT_BLOCK}", f"--size={size_bytes}", "--direct=1", "--ioengine=libaio",
        f"--iodepth={FIO_DIRECT_IODEPTH}", f"--runtime={FIO_DIRECT_RUNTIME_S}",
        "--output-format=json",
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=FIO_DIRECT_RUNTIME_S + TOOL_TIMEOUT_S,
        check=True,
    )  # fmt: skip
    return fio_rate(done.stdout, direction)


def disk_limits(workdir: Path, size: str, direct_bytes: int | None = None) -> dict[str, Any]:
    """fio's sequential rates (MB/s) in a scratch directory under ``workdir`` (see the module's
    docstring); ``direct_bytes`` overrides the size of the direct jobs."""
    direct_size = FIO_DIRECT_BYTES[size] if direct_bytes is None else direct_bytes
    scratch = Path(tempfile.mkdtemp(prefix="fio-", dir=workdir))
    try:
        durable = _fio(scratch, "fdatasync", FIO_FDATASYNC_SIZE[size], "--fdatasync=1")
        buffered = _fio(scratch, "buffered", FIO_SIZE[size], "--end_fsync=1")
        for leftover in scratch.iterdir():  # room for the direct jobs' file
            leftover.unlink()
        direct_file = scratch / "direct.fio"
        written, written_bytes = _fio_direct(direct_file, "write", direct_size)
        read, read_bytes = _fio_direct(direct_file, "read", direct_size)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "tool": "fio " + tool_version("fio"),
        "block": FIO_BLOCK,
        "fdatasync_mb_per_s": round(durable / 1e6, 1),
        "buffered_mb_per_s": round(buffered / 1e6, 1),
        "direct_block": FIO_DIRECT_BLOCK,
        "direct_iodepth": FIO_DIRECT_IODEPTH,
        "direct_write_bytes": written_bytes,
        "direct_write_mb_per_s": round(written / 1e6, 1),
        "direct_read_bytes": read_bytes,
        "direct_read_mb_per_s": round(read / 1e6, 1),
    }


def derived_limits(disk: dict[str, Any], copies: int) -> dict[str, Any]:
    """What the disk allows the systems: produce (every record written ``copies`` times on this
    one disk) at most the direct write rate ÷ ``copies``; a consumer catching up from the disk
    at most the direct read rate."""
    return {
        "produce_limit_mb_per_s": round(disk["direct_write_mb_per_s"] / copies, 1),
        "catch_up_consume_limit_mb_per_s": disk["direct_read_mb_per_s"],
        "replication_factor": copies,
    }


def loopback_limit(server_host: str, client_host: str, size: str) -> dict[str, Any]:
    """iperf3: one TCP stream from ``client_host`` to ``server_host`` (MB/s received)."""
    iperf3 = _tool("iperf3")
    port = free_port(server_host)
    server = popen_owned(  # a one-off server waits for ever for its client: not past us
        [iperf3, "--server", "--bind", server_host, "--port", str(port), "--one-off"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for("iperf3 listening", lambda: _listening(server_host, port), timeout_s=10.0)
        done = subprocess.run(
            [
                iperf3, "--client", server_host, "--bind", client_host, "--port", str(port),
                "--time", str(IPERF_SECONDS[size]), "--json",
            ],
            capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=True,
        )  # fmt: skip
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        server.wait(timeout=TOOL_TIMEOUT_S)
    received = json.loads(done.stdout)["end"]["sum_received"]["bits_per_second"] / 8
    return {
        "tool": "iperf3 " + tool_version("iperf3"),
        "streams": 1,
        "loopback_mb_per_s": round(received / 1e6, 1),
    }


def _listening(host: str, port: int) -> bool:
    """Whether something listens on host:port, read from the kernel's socket table (a probe
    connection would be taken by iperf3's one-off server as its test)."""
    wanted = f"{_hex_ip(host)}:{port:04X}"
    table = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return any(line.split()[1] == wanted and line.split()[3] == "0A" for line in table)


def _hex_ip(host: str) -> str:
    """/proc/net/tcp's address form: the IPv4 bytes in host (little-endian) order, in hex."""
    return "".join(f"{int(part):02X}" for part in reversed(host.split(".")))


def tool_version(tool: str, flag: str = "--version") -> str:
    """The first line a tool prints of its version (an installed tool is required)."""
    done = subprocess.run(
        [_tool(tool), flag], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
    )
    first = (done.stdout or done.stderr).strip().splitlines()
    return first[0] if first else "unknown"


def measure_limits(
    workdir: Path,
    hosts: tuple[str, str],
    size: str,
    copies: int,
    direct_bytes: int | None = None,
) -> dict[str, Any]:
    """Both limits and what they allow ``copies`` replicas on this disk, with how long they
    took to measure."""
    started = time.monotonic()
    disk = disk_limits(workdir, size, direct_bytes)
    network = loopback_limit(hosts[0], hosts[1], size)
    return {
        "disk": disk,
        "network": network,
        "derived": derived_limits(disk, copies),
        "measured_in_s": round(time.monotonic() - started, 1),
    }
