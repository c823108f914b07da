"""How long a thread that makes system calls waits for the GIL beside busy threads.

``python -m bench.gil_convoy [--rounds 100]``

One thread does what pysyncobj's Raft tick does between two polls, in miniature: 10 system
calls (a byte written to a pipe and read back, each call giving the GIL up and taking it back);
beside it 0, 1, 3 and 6 threads count in pure Python, as a node's busy threads (opening
partitions, applying metadata, replication) do. For CPython's default switch interval (5 ms)
and shorter ones: the median, p99 and longest time of the 10 calls over ``--rounds`` rounds.

A thread that wants the GIL back waits until its holder is asked to let go, one switch interval
after it started waiting, and may wait that long behind each busy thread: the figures are why
a node sets ``gil.switch.interval.us`` (docs/operations.md#many-partitions). They depend on the
machine's load: read them beside each other, from one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

INTERVALS_US = (5000, 1000, 500)  # CPython's default, raftlog's node default, shorter
BUSY_THREADS = (0, 1, 3, 6)
CALLS = 10
PAUSE_S = 0.01  # between rounds, as a tick waits in its poll


@dataclass(frozen=True)
class ConvoyFigure:
    interval_us: int
    busy_threads: int
    median_ms: float
    p99_ms: float
    max_ms: float


def _count(stop: threading.Event) -> None:
    total = 0
    while not stop.is_set():
        for n in range(1000):
            total += n


def _rounds(rounds: int) -> list[float]:
    read_end, write_end = os.pipe()
    try:
        seconds: list[float] = []
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(CALLS):
                os.write(write_end, b"x")
                os.read(read_end, 1)
            seconds.append(time.perf_counter() - started)
            time.sleep(PAUSE_S)  # the pause between rounds, not a wait for a condition
        return seconds
    finally:
        os.close(read_end)
        os.close(write_end)


def measure(interval_us: int, busy_threads: int, rounds: int) -> ConvoyFigure:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(interval_us / 1_000_000)
    stop = threading.Event()
    busy = [threading.Thread(target=_count, args=(stop,), daemon=True) for _ in range(busy_threads)]
    try:
        for thread in busy:
            thread.start()
        seconds = sorted(_rounds(rounds))
    finally:
        stop.set()
        for thread in busy:
            thread.join(timeout=10)
        sys.setswitchinterval(previous)
    p99 = seconds[min(len(seconds) - 1, round(0.99 * (len(seconds) - 1)))]
    return ConvoyFigure(
        interval_us,
        busy_threads,
        statistics.median(seconds) * 1000,
        p99 * 1000,
        seconds[-1] * 1000,
    )


def run(rounds: int) -> list[ConvoyFigure]:
    return [measure(us, busy, rounds) for us in INTERVALS_US for busy in BUSY_THREADS]


def print_figures(console: Console, figures: Sequence[ConvoyFigure]) -> None:
    table = Table(title=f"{CALLS} system calls beside busy threads (ms)")
    for column in ("switch interval µs", "busy threads", "median", "p99", "max"):
        table.add_column(column, justify="right")
    for f in figures:
        table.add_row(
            f"{f.interval_us:,}",
            str(f.busy_threads),
            f"{f.median_ms:.1f}",
            f"{f.p99_ms:.1f}",
            f"{f.max_ms:.1f}",
        )
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    print_figures(Console(), run(args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
