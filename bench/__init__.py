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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from dataplane.broker.malloc_tuning import tune_malloc
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


REGRESSION_FRACTION = 0.10  # the guard reports figures that got worse by more than this
# A figure's direction comes from its path in the results: rates are better higher; times,
# latencies and failovers better lower; anything else (counts, sizes, settings) is not judged.
# endings of the figure's own key (checked before the lower-is-better ones: "records_s" ends
# in "_s" too)
HIGHER_IS_BETTER = ("per_s", "percent_of_raw", "records_s", "records_s_best", "records_s_median")
LOWER_IS_BETTER = ("seconds", "_ms", "_s", "us_per_batch")  # endings of the figure's own key
LOWER_IS_BETTER_UNDER = ("latency", "failover")  # anywhere in its path
# a "seconds" beside a "records" that changed timed another workload: not judged
WORKLOAD_KEY = "records"
# keys that name a node, a count, a position or a setting, also under those: never judged
# ("window_s": the length of the window a sustained run's figures are taken over; "delay_ms":
# the network delay bench.netem set; "offered_s": how long bench.e2e_latency offered records)
NOT_FIGURES = (
    "killed", "new_controller", "attempts", "metadata_offset", "leader", "node", "acknowledged",
    "window_s", "delay_ms", "offered_s",
)  # fmt: skip


@dataclass(frozen=True)
class Regression:
    path: str
    before: float
    after: float

    def describe(self) -> str:
        change = (self.after - self.before) / self.before * 100 if self.before else 0.0
        return f"{self.path}: {_figure(self.before)} -> {_figure(self.after)} ({change:+.0f}%)"


def _figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _direction(path: str) -> int:
    """+1 when a larger value is better, -1 when a smaller one is, 0 when not judged."""
    last = path.rsplit(".", 1)[-1].split("[", 1)[0]
    if last in NOT_FIGURES:
        return 0
    if any(last.endswith(suffix) for suffix in HIGHER_IS_BETTER):
        return 1
    if any(last.endswith(suffix) for suffix in LOWER_IS_BETTER):
        return -1
    if any(part in path for part in LOWER_IS_BETTER_UNDER):
        return -1
    return 0


def regressions(before: Any, after: Any, path: str = "") -> list[Regression]:
    """The figures of ``after`` worse than in ``before`` by more than REGRESSION_FRACTION
    (matched by key, and by position in lists of the same length)."""
    found: list[Regression] = []
    if isinstance(before, dict) and isinstance(after, dict):
        # a run that timed another number of records took another time: its rate is the figure
        resized = before.get(WORKLOAD_KEY) != after.get(WORKLOAD_KEY)
        for key in [k for k in after if k in before]:  # in the new section's order
            if resized and key == "seconds":
                continue
            found += regressions(before[key], after[key], f"{path}.{key}" if path else key)
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            found += regressions(old, new, f"{path}[{index}]")
    elif (
        isinstance(before, int | float)
        and isinstance(after, int | float)
        and not isinstance(before, bool)
        and before > 0
    ):
        direction = _direction(path)
        worse = (before - after) if direction > 0 else (after - before) if direction < 0 else 0
        if worse > REGRESSION_FRACTION * before:
            found.append(Regression(path, float(before), float(after)))
    return found


def write_section(path: Path, name: str, section: dict[str, Any]) -> dict[str, Any]:
    """Replace section ``name`` of the results file at ``path`` (kept: the other sections) and
    stamp the machine and date; first print (to stderr) every figure of the section that got
    more than 10% worse than in the file. Returns what was written."""
    results: dict[str, Any] = {}
    if path.exists():
        loaded = json.loads(path.read_text())
        if not isinstance(loaded, dict):
            raise ValueError(f"{path} holds {type(loaded).__name__}, not a results object")
        results = loaded
    worse = regressions(results.get(name), section, name)
    console = Console(stderr=True)
    for regression in worse:
        console.print(f"[yellow]slower than the previous results:[/yellow] {regression.describe()}")
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
    own: argparse.ArgumentParser | None = None,
) -> int:
    """The command line of a benchmark that writes one section: ``--out``, ``--quick`` and
    ``--workdir``; ``run(workdir, quick, progress)`` gives the figures, ``report`` prints them.
    ``own``: the benchmark's own options (a parser without help, parsed by the benchmark), so
    ``--help`` lists them too."""
    parser = argparse.ArgumentParser(description=description, parents=[own] if own else [])
    parser.add_argument("--out", type=Path, required=True, help="results JSON file to update")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / ".raftlog" / "bench")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    tune_malloc()  # the producers and consumers run in this process, as the raftlog CLI's do
    figures = run(args.workdir, args.quick, Console(stderr=True))
    write_section(args.out, section, figures)
    console = Console()
    report(console, figures)
    console.print(f"figures written to {args.out}")
    return 0
