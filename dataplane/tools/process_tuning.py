"""What a process that produces or consumes at high rates runs with: glibc's malloc settings
(``dataplane/broker/malloc_tuning.py``) and the nodes' garbage-collector policy
(``dataplane/broker/gc_pauses.py``). The ``raftlog`` command line applies both for every command
and Spark's tasks for their worker process; an application may call :func:`tune_process` once
at start-up. Both change the whole process, and neither changes what any code computes."""

from __future__ import annotations

from dataplane.broker.gc_pauses import govern_collector
from dataplane.broker.malloc_tuning import tune_malloc


def tune_process() -> dict[str, int]:
    """Apply both; return the malloc settings applied (those the environment did not give)."""
    applied = tune_malloc()
    govern_collector()
    return applied
