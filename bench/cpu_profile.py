"""Where the whole machine's CPU goes while a run goes on: ``perf record -a``, kernel included.

py-spy (``bench.profiles``) sees a broker's Python frames only; here most of a broker's time
is not there. Sampled system-wide during the peer benchmark's produce run (1 KiB, RF 3, 2
cores), a leader spent ~45% of its CPU and a follower ~70% in one kernel function:
``copy_folio_from_iter_atomic``, the copy of a ``write`` into page-cache pages.

:func:`system_sampling` runs ``perf record -a`` (``cpu-clock``: works in VMs without a PMU;
no call graphs: the leaf of a sample is enough here, and cheap) for as long as the ``with``
block lasts. :func:`breakdown` reads the samples back with ``perf script`` and splits them by
who ran (a role per set of pids: leader, followers, client...; ``idle`` for the idle task;
``other`` for anyone else) and by what ran, from the sample's symbol and library:

- ``page-cache write``: copying written bytes into page-cache pages;
- ``kernel copy``: the kernel's other copies to or from user memory (sockets, reads);
- ``page clearing``: zeroing fresh pages (anonymous memory);
- ``kernel other``: everything else in the kernel (scheduling, futexes, TCP, ext4);
- ``Python``, ``gRPC core``, ``libc``, ``CRC32C``: ``libpython``, ``cygrpc``, ``libc``, ``crc32c``;
- ``native other``: any other library or binary (``nats-server`` is one).

Each figure is per record produced: CPU microseconds (samples / rate / records), so a run of
any length or speed reads the same (the keys avoid the regression guard's endings: these
explain figures, they are not figures). ``page_cache_mb_per_cpu_second`` is the bytes the run wrote
into the page cache (its caller says how many) over the CPU time of that copy: the rate the
machine gives a writer, the figure that tells a fast run from a slow one here (see
docs/performance.md, **Where the CPU goes**, and docs/operations.md, **The page cache**).
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dataplane.tools.owned_process import popen_owned

SAMPLE_RATE_HZ = 999  # not a multiple of the scheduler's tick
START_TIMEOUT_S = 30.0  # perf opens a sampling event on every CPU first
STOP_TIMEOUT_S = 60.0
MB = 1_000_000
PAGE_CACHE_WRITE = ("copy_folio_from_iter_atomic", "copy_page_from_iter_atomic")
KERNEL_COPY = ("_copy_to_iter", "_copy_from_iter", "copy_page_to_iter", "rep_movs_alternative",
               "copy_user_enhanced_fast_string", "copy_user_generic_string")  # fmt: skip
LIBRARIES = (  # (category, what the library's file name starts with)
    ("Python", "libpython"),
    ("gRPC core", "cygrpc"),
    ("gRPC core", "libgrpc"),
    ("CRC32C", "_crc32c"),
    ("libc", "libc."),
    ("libc", "libc-"),
)
CATEGORIES = (
    "page-cache write", "kernel copy", "page clearing", "kernel other",
    "Python", "gRPC core", "libc", "CRC32C", "native other",
)  # fmt: skip
IDLE, OTHER = "idle", "other"
# "  1234  ffffffff81b6d36d copy_folio_from_iter_atomic ([kernel.kallsyms])"
SAMPLE_LINE = re.compile(r"^\s*(\d+)\s+[0-9a-f]+\s+(.*?)\s*\((.*)\)\s*$")


def _perf() -> str:
    found = shutil.which("perf")
    if found is None:
        raise RuntimeError("perf is not installed (make bench installs the Debian linux-perf)")
    return found


@contextmanager
def system_sampling(output: Path) -> Iterator[Path]:
    """``perf record -a`` into ``output`` while the block runs. perf starts with its events off
    and the block begins once perf acknowledged turning them on (``--control``), so a short
    run is sampled from its first instruction; SIGINT ends it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.unlink(missing_ok=True)
    log, control, ack = (output.with_suffix(suffix) for suffix in (".log", ".ctl", ".ack"))
    for fifo in (control, ack):
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
    command = [
        _perf(), "record", "-a", "-F", str(SAMPLE_RATE_HZ), "-o", str(output),
        "--delay=-1", f"--control=fifo:{control},{ack}",
    ]  # fmt: skip
    # O_RDWR: opening a fifo so never waits for the other end (perf may fail before it opens)
    control_fd, ack_fd = os.open(control, os.O_RDWR), os.open(ack, os.O_RDWR)
    with log.open("wb") as out:
        proc = popen_owned(command, stdout=out, stderr=subprocess.STDOUT)  # not past us: -a
    try:
        os.write(control_fd, b"enable\n")
        deadline = time.monotonic() + START_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([ack_fd], [], [], 0.1)[0]:  # a bounded wait for perf's answer
                break
        else:
            raise RuntimeError(f"perf record did not start: {_tail(log)}")
        os.read(ack_fd, 64)
        yield output
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # perf finishes the file on Ctrl-C
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)
        for fd in (control_fd, ack_fd):
            os.close(fd)
        for path in (control, ack, log):
            path.unlink(missing_ok=True)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-500:] if log.exists() else "(no output)"


def category(symbol: str, library: str) -> str:
    """What a sample's leaf was doing, from its symbol and the file it is in."""
    if library.startswith("[kernel"):
        if symbol in PAGE_CACHE_WRITE:
            return "page-cache write"
        if symbol in KERNEL_COPY:
            return "kernel copy"
        if symbol.startswith("clear_page"):
            return "page clearing"
        return "kernel other"
    name = library.rsplit("/", 1)[-1]
    return next((cat for cat, prefix in LIBRARIES if name.startswith(prefix)), "native other")


def count_samples(
    lines: Iterable[str], roles: Mapping[str, Sequence[int]]
) -> Counter[tuple[str, str]]:
    """(role, category) -> samples, from ``perf script -F pid,ip,sym,dso`` lines."""
    role_of = {pid: role for role, pids in roles.items() for pid in pids}
    counts: Counter[tuple[str, str]] = Counter()
    for line in lines:
        match = SAMPLE_LINE.match(line)
        if match is None:
            continue
        pid, symbol, library = int(match.group(1)), match.group(2), match.group(3)
        if pid == 0:
            counts[IDLE, "kernel other"] += 1
            continue
        counts[role_of.get(pid, OTHER), category(symbol, library)] += 1
    return counts


def summarize_counts(
    counts: Counter[tuple[str, str]],
    records: int,
    page_cache_bytes: int,
    order: Sequence[str] = (),
) -> dict[str, Any]:
    """Per role (those of ``order`` first, then idle and other): CPU seconds, CPU µs per
    record, and that split by category."""
    per_record_us = 1e6 / SAMPLE_RATE_HZ / max(records, 1)
    roles: dict[str, Any] = {}
    seen = {role for role, _ in counts}
    for role in dict.fromkeys([*order, IDLE, OTHER, *sorted(seen)]):
        if role not in seen:
            continue
        mine = {cat: counts[role, cat] for cat in CATEGORIES if counts[role, cat]}
        total = sum(mine.values())
        roles[role] = {
            "cpu_time": round(total / SAMPLE_RATE_HZ, 3),  # seconds
            "us_per_record": round(total * per_record_us, 2),
            "us_per_record_by_category": {c: round(n * per_record_us, 2) for c, n in mine.items()},
        }
    copy_s = sum(n for (_, cat), n in counts.items() if cat == "page-cache write") / SAMPLE_RATE_HZ
    return {
        "tool": "perf record -a",
        "sample_rate_hz": SAMPLE_RATE_HZ,
        "records": records,
        "roles": roles,
        "page_cache_write_cpu_time": round(copy_s, 3),  # seconds
        "page_cache_mb_per_cpu_second": round(page_cache_bytes / MB / copy_s) if copy_s else None,
    }


def breakdown(
    data: Path,
    roles: Mapping[str, Sequence[int]],
    records: int,
    page_cache_bytes: int,
    timeout_s: float = STOP_TIMEOUT_S,
) -> dict[str, Any]:
    """Read ``perf record``'s file back: the summary of :func:`summarize_counts`. ``perf
    script``'s lines are counted as they come (a sustained run's recording holds millions of
    samples: ~80 bytes of text each), and it is killed after ``timeout_s``."""
    command = [_perf(), "script", "-i", str(data), "-F", "pid,ip,sym,dso"]
    proc = popen_owned(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    watchdog = threading.Timer(timeout_s, proc.kill)  # a bound on reading, as run(timeout=)
    watchdog.start()
    try:
        assert proc.stdout is not None, "stdout is a pipe"
        counts = count_samples(proc.stdout, roles)
        code = proc.wait(timeout=timeout_s)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)
    if code != 0:
        raise RuntimeError(f"perf script exited with {code} (killed after {timeout_s} s: < 0)")
    return summarize_counts(counts, records, page_cache_bytes, order=list(roles))
