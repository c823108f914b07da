"""glibc malloc settings for a process that moves megabytes a second, set with ``mallopt``.

A node applies them when it starts, and so do the ``raftlog`` CLI and the benchmarks for their
producers and consumers; an application using the client library calls :func:`tune_malloc`
itself (it changes the whole process) or sets the environment variables below.

A broker allocates a buffer of about a batch's size for every produce request it parses and every
fetch response it builds: megabytes, many times a second; a producer one for every batch it
encodes and every request it serialises. glibc serves such sizes with ``mmap``
(or from a thread's arena, which it trims back to the kernel after each free), so every buffer
starts on fresh pages: a page fault and a page clear per 4 KiB before the bytes are copied in.
Measured on the leader of the peer benchmark's produce run (1 KiB records, RF 3): page faults were
16% of its CPU, and these two settings took it from 8.6-9.1 to 6.2 µs of CPU per record; the
producing process went from 7.1 to 6.7 µs. (Serialising a 1 MB message took 1.08 ms without
them and 60 µs with them.) They
keep freed buffers in the process for the next request, as the JVM's heap does for Kafka:

- ``M_MMAP_THRESHOLD`` 32 MiB (glibc's ceiling): buffers below it come from the arenas;
- ``M_TRIM_THRESHOLD`` 64 MiB: an arena gives memory back only above this much free at its top;
- ``M_ARENA_MAX`` 2: at most two arenas. glibc gives each thread that meets a locked arena a new
  one, up to 8 per core, and a node runs 30-90 threads (gRPC's pool, fetchers, the Kafka
  listener, pysyncobj). Each arena keeps up to the trim threshold free, so with many arenas the
  bursts of catch-ups after faults land on different ones and every arena's high-water mark
  creeps up: the 2-hour soak's RSS rose ~1 MiB per 10 minutes with a flat Python heap
  (docs/soak.md). Nearly every allocation is made holding the GIL, so a second arena is already
  more than the threads contend for (``MALLOC_ARENA_MAX=2`` is the usual setting for Python and
  Ruby servers).

The operator's own ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` / ``MALLOC_ARENA_MAX``
environment variables win: a setting given there is left alone. On a C library without
``mallopt`` (musl) nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # HEAP_MAX_SIZE / 2 on 64-bit: mallopt refuses more
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024
ARENA_MAX = 2
SETTINGS = {
    "MALLOC_MMAP_THRESHOLD_": (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
    "MALLOC_TRIM_THRESHOLD_": (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
    "MALLOC_ARENA_MAX": (M_ARENA_MAX, ARENA_MAX),
}


def tune_malloc() -> dict[str, int]:
    """Apply the settings the environment does not give; return those applied (env name ->
    value: bytes, or arenas). Empty when the C library has no ``mallopt``."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        log.info("no mallopt in the C library (%s): malloc left as it is", name)
        return {}
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    applied = {}
    for env, (param, value) in SETTINGS.items():
        if env in os.environ:
            continue
        if mallopt(param, value) != 1:
            log.warning("mallopt(%d, %d) refused: malloc left as it is for %s", param, value, env)
            continue
        applied[env] = value
    return applied
