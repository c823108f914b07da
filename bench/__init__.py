"""Benchmarks of raftlog: ``python -m bench.storage_bench`` measures the storage engine.

Every benchmark appends the same workload: records of ``RECORD_BYTES`` random bytes, encoded once
into a batch up front (the benchmarks measure the log, not the encoder). Sizes are in bytes;
throughputs are decimal megabytes per second (1 MB = 10**6 bytes).

All benchmarks write one results file: ``{"machine": {...}, "date": ..., "<section>": {...}}``.
Each benchmark owns one section (``storage``, later the metadata quorum, brokers, NATS) and
:func:`write_section` replaces only that section, keeping the others.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from raftlog.records import Record, encode_batch

REPO_ROOT = Path(__file__).resolve().parent.parent
RECORD_BYTES = 1024
BENCH_SEED = 20240601
BASE_TIMESTAMP_MS = 1_700_000_000_000
GIT_TIMEOUT_S = 10.0


def build_batch(records_per_batch: int, *, record_bytes: int = RECORD_BYTES) -> bytes:
    """One uncompressed RecordBatch v2 of ``records_per_batch`` keyless records (seeded)."""
    assert records_per_batch >= 1, "a batch holds at least one record"
    rng = random.Random(BENCH_SEED + records_per_batch)
    records = [
        Record(
            offset=-1, timestamp=BASE_TIMESTAMP_MS + n, key=None, value=rng.randbytes(record_bytes)
        )
        for n in range(records_per_batch)
    ]
    return encode_batch(records)


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,  # a failure is a null in the results, not an error
        )
    except (OSError, subprocess.TimeoutExpired):
        return None  # no git here: the results say so with nulls
    return done.stdout.strip() if done.returncode == 0 else None


def machine_info() -> dict[str, Any]:
    status = _git("status", "--porcelain")
    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "kernel": platform.release(),
        "system": platform.system(),
        "arch": platform.machine(),
        "mem_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
    }


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def write_section(path: Path, name: str, section: dict[str, Any]) -> dict[str, Any]:
    """Replace section ``name`` of the results file at ``path`` (kept: the other sections) and
    stamp the machine and date. Returns what was written."""
    results: dict[str, Any] = {}
    if path.exists():
        loaded = json.loads(path.read_text())
        if not isinstance(loaded, dict):
            raise ValueError(f"{path} holds {type(loaded).__name__}, not a results object")
        results = loaded
    results.update({"machine": machine_info(), "date": utc_now(), name: section})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return results


def bench_main(
    argv: Sequence[str] | None,
    description: str,
    section: str,
    run: Callable[[Path, bool, Console], dict[str, Any]],
    report: Callable[[Console, dict[str, Any]], None],
) -> int:
    """The command line of a benchmark that writes one section: ``--out``, ``--quick`` and
    ``--workdir``; ``run(workdir, quick, progress)`` gives the figures, ``report`` prints them."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True, help="results JSON file to update")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / ".raftlog" / "bench")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    figures = run(args.workdir, args.quick, Console(stderr=True))
    write_section(args.out, section, figures)
    console = Console()
    report(console, figures)
    console.print(f"figures written to {args.out}")
    return 0
