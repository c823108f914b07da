"""The child process of the recovery benchmark: append until killed.

``python -m bench.recovery_writer --dir D --ready-bytes N ...`` appends the same batch to the log
in D; once it has written at least N bytes it prints ``ready <bytes written> <log end offset>``
on stdout and keeps appending, so the parent's SIGKILL lands in the middle of the write stream.
It stops by itself (exit status 3, the log abandoned as a crash would leave it) only when a limit
is reached, which means nobody killed it in time.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench import build_batch
from raftlog.config import LogConfig
from raftlog.log import Log

EXIT_LIMIT_REACHED = 3


def append_until_killed(
    log: Log, batch: bytes, *, ready_bytes: int, max_bytes: int, max_seconds: float
) -> int:
    """Append ``batch`` until a limit; announce readiness once. Returns the bytes written."""
    written = 0
    announced = False
    deadline = time.monotonic() + max_seconds
    while written < max_bytes and time.monotonic() < deadline:
        log.append(batch, leader_epoch=0)
        written += len(batch)
        if not announced and written >= ready_bytes:
            print(f"ready {written} {log.log_end_offset}", flush=True)
            announced = True
    return written


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="the partition directory")
    parser.add_argument("--segment-bytes", type=int, required=True)
    parser.add_argument("--records-per-batch", type=int, required=True)
    parser.add_argument("--ready-bytes", type=int, required=True)
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--max-seconds", type=float, required=True)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    log = Log(args.dir, LogConfig.parse({"segment.bytes": str(args.segment_bytes)}))
    written = append_until_killed(
        log,
        build_batch(args.records_per_batch),
        ready_bytes=args.ready_bytes,
        max_bytes=args.max_bytes,
        max_seconds=args.max_seconds,
    )
    log.abandon()
    print(f"limit reached after {written} bytes: nobody killed this writer", file=sys.stderr)
    return EXIT_LIMIT_REACHED


if __name__ == "__main__":
    sys.exit(main())
