"""CPython's garbage collector in a node or a client's process: its pauses timed, and the full
scans bounded.

A collection runs in whichever thread's allocation crossed a threshold, holding the GIL: every
other thread of the process (Raft's ticks, the fetchers, gRPC's handlers) waits for it to end. A
full collection (generation 2) visits every tracked object, and a broker hosting thousands of
partitions holds millions of them (each partition's log, index, state and their dicts) that
live as long as the process and are never garbage. Measured on the 10,000-partition benchmark
(`bench/metadata_scale.py`): a full collection every 7-17 s on each node, each pausing it
400-1,190 ms (median 721) and freeing 0-100 objects; Raft's ticks came up to a second late,
the controllers went through 46 terms in one run, and a new controller fenced brokers whose
heartbeats a pause had held.

So, with ``gc.full.scan.interval.ms`` > 0 (:class:`GcPolicy`), what survives a full collection
is frozen (``gc.freeze``: moved to the permanent generation, which no collection visits) and the
next full collections visit only what was tracked since. Reference counting still frees every
frozen object whose last reference goes; only a reference cycle among frozen objects waits, for
the full scan that unfreezes everything once per interval (one long pause per interval instead
of one every few seconds). 0 leaves CPython's collector as it is.

Either way each collection's pause is observed in ``raftlog_gc_pause_seconds`` (by generation)
and one of ``SLOW_PAUSE_S`` or more is logged: the JVM's GC log, for a node.

A process that moves records through the client library meets the same collector the other way
round: its heap is small but every record in flight (up to ``buffer.memory`` of them, with its
future, callback and, in Connect, its source offset) lives long enough to be promoted to
generation 2, so full collections come every second or so, each visiting the whole heap.
Measured on a Connect worker's file source (100,000 lines of 1 KiB): 14 full collections took
4.1-4.2 s of an 18 s run. :func:`govern_collector` gives such a process the nodes' policy; the
``raftlog`` command line installs it for every command (a node then installs its own).
"""

from __future__ import annotations

import gc
import logging
import math
import threading
import time
from typing import Any

from prometheus_client import Histogram

log = logging.getLogger(__name__)

SLOW_PAUSE_S = 0.2  # a third of the default election timeout: worth a line
FULL = 2  # the oldest generation: a collection of it visits every tracked object
FULL_SCAN_INTERVAL_S = 600.0  # gc.full.scan.interval.ms's default, for a client's process


class GcPolicy:
    """A ``gc.callbacks`` entry (`install` / `uninstall`): times each collection and, with a
    ``full_scan_interval_s``, freezes the survivors of each full one. Everything runs in the
    collecting thread, holding the GIL; the collector does not run again inside its callbacks,
    so nothing here needs a lock."""

    def __init__(
        self,
        pauses: Histogram,
        full_scan_interval_s: float = 0.0,
        slow_s: float = SLOW_PAUSE_S,
        clock: Any = time.monotonic,
    ) -> None:
        # one series per generation, bound once: a young collection comes every few hundred
        # allocations, and ``labels`` would look its series up under a lock each time
        self.pauses = [pauses.labels(str(generation)) for generation in range(FULL + 1)]
        self.full_scan_interval_s = full_scan_interval_s
        self.slow_s = slow_s
        self.clock = clock
        self._started = 0.0
        self._scanned_all_at = clock()  # the process's start: nothing was frozen before it

    def install(self, stop: threading.Event | None = None) -> GcPolicy:
        """Time (and govern) every collection from now on, in place of any policy installed
        before (one governs a process: the CLI installs one for every command, a node its
        own with its metrics); with `stop` and an interval, a thread also makes sure a full
        scan comes once per interval until `stop` is set (a process that allocates little may
        not reach generation 2's threshold for hours)."""
        for other in [c for c in gc.callbacks if isinstance(c, GcPolicy) and c is not self]:
            other.uninstall()
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        if stop is not None and self.full_scan_interval_s > 0:
            threading.Thread(
                target=self._scan_while, args=(stop,), name="gc-full-scan", daemon=True
            ).start()
        return self

    def _scan_while(self, stop: threading.Event) -> None:
        while not stop.wait(self.full_scan_interval_s / 4) and self in gc.callbacks:
            if self.full_scan_due():
                gc.collect(FULL)

    def uninstall(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
        if self.full_scan_interval_s > 0:
            gc.unfreeze()

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        generation = info["generation"]
        if phase == "start":
            if generation == FULL and self.full_scan_due():
                gc.unfreeze()  # this collection visits everything: cycles among the frozen too
                self._scanned_all_at = self.clock()
            self._started = time.perf_counter()
            return
        paused = time.perf_counter() - self._started
        self.pauses[generation].observe(paused)
        if generation == FULL and self.full_scan_interval_s > 0:
            gc.freeze()
        if paused >= self.slow_s:
            log.warning(
                "garbage collection of generation %d paused the process %.0f ms "
                "(%d objects collected, %d frozen)",
                generation, paused * 1000, info["collected"], gc.get_freeze_count(),
            )  # fmt: skip

    def full_scan_due(self) -> bool:
        interval = self.full_scan_interval_s
        return interval > 0 and self.clock() - self._scanned_all_at >= interval


def govern_collector(full_scan_interval_s: float = FULL_SCAN_INTERVAL_S) -> GcPolicy:
    """Install the nodes' policy in a process that produces or consumes (the ``raftlog``
    commands; an application using the client library at high rates may call it at
    start-up): survivors of each full collection frozen, everything visited once per
    ``full_scan_interval_s``. Its pauses are timed in a histogram no registry exports and
    never logged: a command's output is its own (the first full collection of a ``raftlog``
    command, at start-up, took 217-274 ms on a loaded machine)."""
    pauses = Histogram(
        "raftlog_gc_pause_seconds", "CPython garbage collections by generation",
        ["generation"], registry=None,
    )  # fmt: skip
    policy = GcPolicy(pauses, full_scan_interval_s, slow_s=math.inf)
    return policy.install(threading.Event())
