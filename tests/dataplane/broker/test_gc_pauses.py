"""CPython's garbage collector in a node or a client's process (dataplane/broker/gc_pauses.py):
each collection's pause timed, and full scans bounded to one per interval by freezing what
survives."""

from __future__ import annotations

import gc
import logging
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from dataplane.broker.gc_pauses import FULL_SCAN_INTERVAL_S, GcPolicy, govern_collector
from dataplane.broker.metrics import NodeMetrics
from dataplane.tools.local_cluster import wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def metrics() -> Iterator[NodeMetrics]:
    yield NodeMetrics()
    assert gc.get_freeze_count() == 0, "a policy left objects frozen"


def pauses(metrics: NodeMetrics, generation: int) -> float:
    count = metrics.registry.get_sample_value(
        "raftlog_gc_pause_seconds_count", {"generation": str(generation)}
    )
    return 0.0 if count is None else count


@contextmanager
def governing(
    metrics: NodeMetrics, stop: threading.Event | None = None, **settings: Any
) -> Iterator[GcPolicy]:
    policy = GcPolicy(metrics.gc_pauses, **settings).install(stop)
    try:
        yield policy
    finally:
        if stop is not None:
            stop.set()
        policy.uninstall()
    assert policy not in gc.callbacks


def test_each_collection_is_timed_by_generation_and_a_slow_one_logged(
    metrics: NodeMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        governing(metrics, slow_s=0.0),
        caplog.at_level(logging.WARNING, logger="dataplane.broker.gc_pauses"),
    ):
        gc.collect(2)
        gc.collect(0)
    assert pauses(metrics, 2) >= 1 and pauses(metrics, 0) >= 1
    assert any("generation 2 paused the process" in r.getMessage() for r in caplog.records)


def test_a_quick_collection_is_not_logged_and_nothing_is_frozen_without_an_interval(
    metrics: NodeMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        governing(metrics, slow_s=60.0),
        caplog.at_level(logging.WARNING, logger="dataplane.broker.gc_pauses"),
    ):
        gc.collect(2)
        assert gc.get_freeze_count() == 0
    assert pauses(metrics, 2) >= 1
    assert not caplog.records


def test_survivors_of_a_full_collection_are_frozen_until_the_interval_s_full_scan(
    metrics: NodeMetrics,
) -> None:
    clock = Clock()
    with governing(metrics, full_scan_interval_s=600.0, clock=clock) as policy:
        kept = Cycle()
        gc.collect(2)  # it survives: frozen with the rest of the heap
        assert gc.get_freeze_count() > 0
        garbage = weakref.ref(kept)
        del kept  # a cycle among frozen objects: only a full scan frees it
        gc.collect(2)
        assert garbage() is not None, "a collection before the interval visited frozen objects"
        clock.now = 600.0
        assert policy.full_scan_due()
        gc.collect(2)
        assert garbage() is None, "the interval's full scan did not visit the frozen objects"
        assert not policy.full_scan_due()
        assert gc.get_freeze_count() > 0, "the full scan's survivors are frozen again"


def test_a_thread_makes_sure_the_full_scan_comes_on_a_process_that_allocates_little(
    metrics: NodeMetrics,
) -> None:
    with governing(metrics, threading.Event(), full_scan_interval_s=0.2):
        wait_for("a full scan", lambda: pauses(metrics, 2) >= 1, timeout_s=10.0)
        assert any(t.name == "gc-full-scan" for t in threading.enumerate())
    wait_for(
        "the thread to end",
        lambda: not any(t.name == "gc-full-scan" for t in threading.enumerate()),
        timeout_s=5.0,
    )


def scan_threads() -> int:
    return sum(t.name == "gc-full-scan" for t in threading.enumerate())


def test_a_policy_installed_takes_the_place_of_the_one_before_and_its_thread(
    metrics: NodeMetrics,
) -> None:
    """The CLI installs a policy for every command; a node's own replaces it."""
    with governing(metrics, threading.Event(), full_scan_interval_s=0.2) as first:
        wait_for("the first policy's scan thread", lambda: scan_threads() == 1, timeout_s=5.0)
        gc.collect(2)
        assert gc.get_freeze_count() > 0
        with governing(metrics, slow_s=60.0) as second:
            assert first not in gc.callbacks and second in gc.callbacks
            assert gc.get_freeze_count() == 0, "the replaced policy's frozen objects stay frozen"
            wait_for("the first policy's thread to end", lambda: scan_threads() == 0, 5.0)
            gc.collect(2)
            assert gc.get_freeze_count() == 0, "the replaced policy still freezes"


def test_a_client_process_gets_the_nodes_policy_with_its_default_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """And no log line, however long a pause: a command's stderr is its own."""
    policy = govern_collector()
    try:
        with caplog.at_level(logging.WARNING, logger="dataplane.broker.gc_pauses"):
            policy(  # a pause of 1 s
                "start", {"generation": 2, "collected": 0, "uncollectable": 0}
            )
            policy._started -= 1.0
            policy("stop", {"generation": 2, "collected": 0, "uncollectable": 0})
        assert not caplog.records, "a client's process logged a collection"
        assert policy in gc.callbacks
        assert policy.full_scan_interval_s == FULL_SCAN_INTERVAL_S
        gc.collect(2)
        assert gc.get_freeze_count() > 0, "a full collection's survivors were not frozen"
    finally:
        policy.uninstall()
    assert gc.get_freeze_count() == 0
