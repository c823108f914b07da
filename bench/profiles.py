"""Where the brokers' time goes while a benchmark runs: py-spy samples of live node processes.

:func:`sampling` runs ``py-spy record --format raw`` against each given process
for as long as the ``with`` block lasts (SIGINT ends it; py-spy then writes the file), and
leaves one collapsed-stack file per process (``<label>-<role>.folded``: one line per distinct
stack, ``frame;frame;... count``, which speedscope and flamegraph.pl read). :func:`summarize`
reads one back: the busiest functions by their own samples, and the share of samples spent
under the per-record codec (``raftlog/records.py``: encoding or decoding records one by one).
The brokers' produce, replication and fetch paths work on whole batches, so that share must
be zero there; the summary says so with numbers, not by assertion.
"""

from __future__ import annotations

import functools
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dataplane.tools.local_cluster import wait_for

SAMPLE_RATE_HZ = 500
ATTACH_S = 30.0
STOP_TIMEOUT_S = 30.0
TOP_FUNCTIONS = 12
# Frames of the per-record codec: any sample with one of these under it did per-record work.
PER_RECORD_MARKERS = ("raftlog/records.py",)
# Frames of threads waiting in C (py-spy counts a thread blocked inside a C call as busy).
WAITING_MARKERS = (
    "Condition.wait (threading.py",
    "PollPoller.poll (pysyncobj",
    "_worker (concurrent/futures/thread.py",
    "select (selectors.py",
    "channel_spin (grpc/_channel.py",
)


def py_spy() -> str:
    """The py-spy executable: the venv's (also when it is not activated), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"  # the venv's, also when not activated
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise RuntimeError("py-spy is not installed (it is in the dev extra: make bench)")
    return found


@contextmanager
def sampling(pids: Mapping[str, int], out_dir: Path, label: str) -> Iterator[dict[str, Path]]:
    """Sample each process of ``pids`` (role -> pid) while the block runs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = {role: out_dir / f"{label}-{role}.folded" for role in pids}
    logs = {role: out_dir / f"{label}-{role}.py-spy.log" for role in pids}
    procs = [_record(pid, outputs[role], logs[role]) for role, pid in pids.items()]
    try:
        for role, log in logs.items():  # attaching takes py-spy a moment: sample the workload
            wait_for(f"py-spy sampling the {role}", functools.partial(_sampling, log), ATTACH_S)
        yield outputs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        for proc in procs:
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)
        for log in logs.values():
            log.unlink(missing_ok=True)


def _sampling(log: Path) -> bool:
    return log.exists() and "Sampling process" in log.read_text(errors="replace")


def _record(pid: int, output: Path, log: Path) -> subprocess.Popen[bytes]:
    command = [
        py_spy(), "record", "--pid", str(pid), "--rate", str(SAMPLE_RATE_HZ),
        "--format", "raw", "--output", str(output),
    ]  # fmt: skip
    with log.open("wb") as out:  # "Sampling process ..." goes to stdout, errors to stderr
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def _frames(line: str) -> tuple[list[str], int]:
    stack, _, count = line.rstrip("\n").rpartition(" ")
    return stack.split(";"), int(count)


def summarize(folded: Path) -> dict[str, Any]:
    """The busiest functions (own samples, waiting excluded) and the per-record share."""
    own: Counter[str] = Counter()
    busy = per_record = 0
    lines = folded.read_text().splitlines() if folded.exists() else []
    for line in lines:
        frames, count = _frames(line)
        leaf = frames[-1]
        if any(marker in leaf for marker in WAITING_MARKERS):
            continue
        busy += count
        own[leaf] += count
        if any(marker in frame for frame in frames for marker in PER_RECORD_MARKERS):
            per_record += count
    return {
        "file": folded.name,
        "busy_samples": busy,
        "sample_rate_hz": SAMPLE_RATE_HZ,
        "per_record_codec_samples": per_record,
        "per_record_codec_percent": round(100 * per_record / busy, 2) if busy else 0.0,
        "top_own": [
            {"function": name, "percent": round(100 * count / busy, 1)}
            for name, count in own.most_common(TOP_FUNCTIONS)
        ],
    }
