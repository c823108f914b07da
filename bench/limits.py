"""The machine's limits, measured in the same run as the systems: what the disk and loopback
can do at all, so a figure can be read as a fraction of what was possible.

- ``fio`` sequential writes of 64 KiB blocks, one job, in the benchmark's work directory (the
  disk the brokers write to): with ``fdatasync`` after every block (a durable log's worst
  case) and buffered (page cache, one ``fsync`` at the end, which is counted: the rate a
  sustained writer gets from this disk);
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
FIO_RUNTIME_S = 30  # fio stops a job after this, whatever its size
IPERF_SECONDS = {"full": 5, "quick": 1}
TOOL_TIMEOUT_S = 120.0


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed (make bench installs the Debian package)")
    return path


def _fio(directory: Path, name: str, size: str, *extra: str) -> float:
    """Bytes/s of one fio sequential-write job in ``directory``."""
    command = [
        _tool("fio"), f"--name={name}", f"--directory={directory}", "--rw=write",
        f"--bs={FIO_BLOCK}", f"--size={size}", "--ioengine=psync", f"--runtime={FIO_RUNTIME_S}",
        "--output-format=json", *extra,
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=True
    )
    job = json.loads(done.stdout)["jobs"][0]
    return float(job["write"]["bw_bytes"])


def disk_limits(workdir: Path, size: str) -> dict[str, Any]:
    """fio's sequential 64 KiB write rates (MB/s) in a scratch directory under ``workdir``."""
    scratch = Path(tempfile.mkdtemp(prefix="fio-", dir=workdir))
    try:
        durable = _fio(scratch, "fdatasync", FIO_FDATASYNC_SIZE[size], "--fdatasync=1")
        buffered = _fio(scratch, "buffered", FIO_SIZE[size], "--end_fsync=1")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "tool": "fio " + tool_version("fio"),
        "block": FIO_BLOCK,
        "fdatasync_mb_per_s": round(durable / 1e6, 1),
        "buffered_mb_per_s": round(buffered / 1e6, 1),
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


def measure_limits(workdir: Path, hosts: tuple[str, str], size: str) -> dict[str, Any]:
    """Both limits, with how long they took to measure."""
    started = time.monotonic()
    disk = disk_limits(workdir, size)
    network = loopback_limit(hosts[0], hosts[1], size)
    return {
        "disk": disk,
        "network": network,
        "measured_in_s": round(time.monotonic() - started, 1),
    }
