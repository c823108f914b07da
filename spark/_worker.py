"""The process settings of a Spark Python worker that runs raftlog's read and write tasks.

A task moves megabytes a second through the client library in one of Spark's Python worker
processes, which are Spark's, not ours: no ``raftlog`` command line applied the settings its
producers and consumers run with elsewhere (``dataplane/tools/cli.py``). So the first task in
each worker process applies them, once:

- glibc's malloc settings (``dataplane/broker/malloc_tuning.py``): without them every batch the
  producer encodes and every request it serialises starts on fresh pages. Measured on the write
  path alone (2 tasks of 500,000 rows of 1 KiB, 512 KiB batches, one run each): the producer's
  sending thread went from 9.1 to 7.6 µs of CPU per record, the whole task from ~21.5 to ~20.
- the collector's policy (``dataplane/broker/gc_pauses.py``): a task's records in flight live
  long enough to reach CPython's oldest generation.

A worker forked from one that applied them inherits malloc's settings and the collector's
callback; the check is per process id, so a forked worker applies them again (its scan thread
did not survive the fork). Spark reuses workers for other Python work (UDFs, other sources):
the settings change how fast memory is reused, not what any code computes.
"""

from __future__ import annotations

import logging
import os
import threading

from dataplane.tools.process_tuning import tune_process

log = logging.getLogger("spark.raftlog")
_lock = threading.Lock()
_tuned_pids: set[int] = set()  # this process's id once it applied them


def tune_worker() -> None:
    """Apply the settings in this process unless it already has (cheap after the first)."""
    if os.getpid() in _tuned_pids:
        return
    with _lock:
        if os.getpid() in _tuned_pids:
            return
        applied = tune_process()
        _tuned_pids.add(os.getpid())
    log.info("raftlog's process settings in Spark worker %d: malloc %s", os.getpid(), applied)
