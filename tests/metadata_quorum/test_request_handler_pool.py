"""RequestHandlerPool: a burst gets its threads, at most ``max_workers``, and they end once idle
for the keep-alive, so repeated bursts (the faults of a soak) leave the thread count where it
was; and the controller's gRPC server runs on it (before, a ThreadPoolExecutor kept every
thread a burst had started)."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest

from dataplane.tools.local_cluster import free_port, wait_for
from metadata_quorum.request_handler_pool import RequestHandlerPool
from metadata_quorum.service import serve
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pb_grpc

KEEP_ALIVE_S = 0.2
TIMEOUT_S = 10.0


def _threads_named(prefix: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith(f"{prefix}_"))


def _burst(pool: RequestHandlerPool, calls: int) -> list[futures.Future[int]]:
    """``calls`` calls submitted at once, each blocked until the burst is released."""
    release = threading.Event()
    started = threading.Semaphore(0)

    def call(n: int) -> int:
        started.release()
        release.wait(TIMEOUT_S)
        return n

    submitted = [pool.submit(call, n) for n in range(calls)]
    for _ in range(min(calls, pool.max_workers)):
        assert started.acquire(timeout=TIMEOUT_S)
    assert pool.workers == min(calls, pool.max_workers)
    release.set()
    return submitted


def test_a_burst_gets_threads_up_to_the_bound_and_they_end_when_idle() -> None:
    pool = RequestHandlerPool(4, "burst", keep_alive_s=KEEP_ALIVE_S)
    try:
        done = _burst(pool, 10)  # 4 run at once, 6 wait in the queue
        assert [f.result(TIMEOUT_S) for f in done] == list(range(10))
        assert pool.workers <= 4
        wait_for("the burst's threads to end", lambda: pool.workers == 0, TIMEOUT_S)
        assert _threads_named("burst") == 0
    finally:
        pool.shutdown()


def test_repeated_bursts_do_not_ratchet_the_thread_count() -> None:
    pool = RequestHandlerPool(32, "faults", keep_alive_s=KEEP_ALIVE_S)
    try:
        for calls in (3, 7, 5, 11, 2):  # each a fault's burst, larger or smaller
            for future in _burst(pool, calls):
                future.result(TIMEOUT_S)
            wait_for("the burst's threads to end", lambda: pool.workers == 0, TIMEOUT_S)
    finally:
        pool.shutdown()


def test_a_trickle_of_calls_keeps_one_thread_not_the_whole_burst() -> None:
    """After a burst, calls that come one at a time more often than the keep-alive go to the
    thread idle the shortest time: the others end. (Handed round-robin, each thread would get
    one in turn and none would ever be idle for a whole keep-alive.)"""
    pool = RequestHandlerPool(16, "trickle", keep_alive_s=KEEP_ALIVE_S)
    try:
        for future in _burst(pool, 6):
            future.result(TIMEOUT_S)

        def one_call_then_count() -> bool:
            pool.submit(lambda: None).result(TIMEOUT_S)
            threading.Event().wait(KEEP_ALIVE_S / 10)  # the trickle's pace, not a synchronisation
            return pool.workers == 1

        wait_for("the burst's other threads to end", one_call_then_count, TIMEOUT_S)
    finally:
        pool.shutdown()


def test_errors_go_to_the_future_and_the_worker_lives_on() -> None:
    pool = RequestHandlerPool(1, "errors", keep_alive_s=30.0)
    try:
        failed = pool.submit(lambda: 1 // 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(TIMEOUT_S)
        assert pool.submit(lambda: "next").result(TIMEOUT_S) == "next"
        assert pool.workers == 1
    finally:
        pool.shutdown()


def test_shutdown_runs_what_waits_or_cancels_it_and_refuses_more() -> None:
    pool = RequestHandlerPool(1, "stop", keep_alive_s=30.0)
    release = threading.Event()
    first = pool.submit(release.wait, TIMEOUT_S)
    queued = pool.submit(lambda: "queued")
    cancelled_pool = RequestHandlerPool(1, "cancel", keep_alive_s=30.0)
    blocker = cancelled_pool.submit(release.wait, TIMEOUT_S)
    dropped = cancelled_pool.submit(lambda: "dropped")
    release.set()
    pool.shutdown(wait=True)
    cancelled_pool.shutdown(wait=True, cancel_futures=True)
    assert first.result(0) is True and queued.result(0) == "queued"
    assert blocker.result(0) is True
    assert dropped.cancelled() or dropped.result(0) == "dropped"  # it may have started first
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
    assert _threads_named("stop") == 0 and _threads_named("cancel") == 0


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        RequestHandlerPool(0, "none")
    with pytest.raises(ValueError):
        RequestHandlerPool(1, "never", keep_alive_s=0)


class _Blocking(pb_grpc.ControllerServiceServicer):
    """DescribeCluster waits until released: concurrent calls hold a server thread each."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def DescribeCluster(
        self, request: pb.DescribeClusterRequest, context: object
    ) -> pb.DescribeClusterResponse:
        self.entered.release()
        self.release.wait(TIMEOUT_S)
        return pb.DescribeClusterResponse(cluster_id="c")


def test_the_controller_server_lets_a_burst_s_threads_go() -> None:
    """What the soak saw (docs/soak.md "Two hours"): each fault's burst of controller calls left
    its threads in the server's pool. Here 8 concurrent calls start 8 ``ctl`` threads, and
    they end once idle, back to none."""
    servicer = _Blocking()  # type: ignore[abstract]  # the other calls: the base's UNIMPLEMENTED
    address = f"127.0.0.1:{free_port('127.0.0.1')}"
    server = serve(servicer, address, keep_alive_s=KEEP_ALIVE_S)  # type: ignore[arg-type]
    try:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.ControllerServiceStub(channel)
            calls = [stub.DescribeCluster.future(pb.DescribeClusterRequest()) for _ in range(8)]
            for _ in calls:
                assert servicer.entered.acquire(timeout=TIMEOUT_S)
            assert _threads_named("ctl") >= 8
            servicer.release.set()
            assert all(c.result(TIMEOUT_S).cluster_id == "c" for c in calls)
        wait_for("the ctl threads to end", lambda: _threads_named("ctl") == 0, TIMEOUT_S)
    finally:
        server.stop(grace=None)
