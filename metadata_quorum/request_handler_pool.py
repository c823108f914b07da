"""The threads that run a gRPC server's calls: at most ``max_workers``, started on demand, each
leaving after ``keep_alive_s`` without work.

A gRPC server (``grpc.server(executor)``) runs every call on a thread of its executor. The
standard ``concurrent.futures.ThreadPoolExecutor`` starts a thread whenever a call arrives
while none is idle, and never lets one go: its thread count is the highest number of calls
that ever ran at once. On a node that is the highest burst since it started, and bursts come
with faults: when a peer is killed, paused or cut off and comes back, its broker re-registers,
heartbeats and ISR changes queue up, clients retry together, and the pool takes a few more
threads each time, for good (the 2-hour soak, docs/soak.md: a witness node went from 68 to 91
threads over 39 faults, its resident memory with them, each thread with its stack and its own
malloc arena).

So workers here behave as a ``java.util.concurrent.ThreadPoolExecutor`` with no core threads
and a keep-alive (``Executors.newCachedThreadPool``'s shape, bounded): a burst still gets up to
``max_workers`` threads at once, and after it the pool goes back to what the steady load needs.
Kafka's request handler pool (``num.io.threads``) is of fixed size instead, with a bounded
request queue in front; a gRPC sync server holds a thread for the whole of a long poll, so a
fixed pool large enough for the polls would hold that many threads all the time.

Calls beyond ``max_workers`` wait in the queue, as with ``ThreadPoolExecutor``; the server's
``maximum_concurrent_rpcs`` (when set) is what bounds them.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

KEEP_ALIVE_S = 60.0  # java.util.concurrent.Executors.newCachedThreadPool's keep-alive


@dataclass
class _WorkItem:
    future: futures.Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return  # cancelled while it waited
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as error:  # noqa: BLE001 - the call's own: its future raises it
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


class _Worker:
    """One thread's mailbox: the item handed to it while it waits idle."""

    def __init__(self) -> None:
        self.handed = threading.Event()
        self.item: _WorkItem | None = None


class RequestHandlerPool(futures.Executor):
    """An executor of at most ``max_workers`` threads named ``<thread_name_prefix>_<n>``; a
    thread idle for ``keep_alive_s`` ends.

    The next call goes to the thread idle for the shortest time (a stack, as the cached pool's
    ``SynchronousQueue`` does): handing calls round-robin over every idle thread would keep
    all of them busy now and then, and none would ever stay idle long enough to end."""

    def __init__(
        self,
        max_workers: int,
        thread_name_prefix: str,
        keep_alive_s: float = KEEP_ALIVE_S,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1: {max_workers}")
        if keep_alive_s <= 0:
            raise ValueError(f"keep_alive_s must be positive: {keep_alive_s}")
        self.max_workers = max_workers
        self.thread_name_prefix = thread_name_prefix
        self.keep_alive_s = keep_alive_s
        self._lock = threading.Lock()
        # calls no thread could take (all max_workers busy); invariant: non-empty only while
        # no worker is idle
        self._items: deque[_WorkItem] = deque()
        self._idle: list[_Worker] = []  # the most recently idle last
        self._threads: set[threading.Thread] = set()  # invariant: len <= max_workers
        self._started = 0  # threads ever started: their names' numbers
        self._shutdown = False

    @property
    def workers(self) -> int:
        """Threads alive now (running a call or waiting for one)."""
        with self._lock:
            return len(self._threads)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future[Any]:
        future: futures.Future[Any] = futures.Future()
        item = _WorkItem(future, fn, args, kwargs)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._idle:
                worker = self._idle.pop()
                worker.item = item
                worker.handed.set()
            elif len(self._threads) < self.max_workers:
                self._start_worker(item)
            else:
                self._items.append(item)
        return future

    def _start_worker(self, item: _WorkItem) -> None:
        thread = threading.Thread(
            target=self._work,
            args=(item,),
            name=f"{self.thread_name_prefix}_{self._started}",
            daemon=True,
        )
        self._started += 1
        self._threads.add(thread)
        thread.start()

    def _work(self, first: _WorkItem) -> None:
        item: _WorkItem | None = first
        worker = _Worker()
        while item is not None:
            item.run()
            item = None  # drop the call's objects before waiting, as ThreadPoolExecutor does
            item = self._next_item(worker)

    def _next_item(self, worker: _Worker) -> _WorkItem | None:
        """The next item to run, or None when this thread ends (idle past the keep-alive, or
        the pool shut down with nothing left to run)."""
        with self._lock:
            if self._items:
                return self._items.popleft()
            if self._shutdown:
                self._threads.discard(threading.current_thread())
                return None
            worker.handed.clear()
            self._idle.append(worker)
        worker.handed.wait(self.keep_alive_s)
        with self._lock:
            if worker.item is not None:  # handed one (perhaps just as the wait ended)
                item, worker.item = worker.item, None
                return item
            if worker in self._idle:
                self._idle.remove(worker)
            self._threads.discard(threading.current_thread())
            return None

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while self._items:
                    self._items.popleft().future.cancel()
            idle, self._idle = self._idle, []
            threads = list(self._threads)
        for worker in idle:
            worker.handed.set()  # no item: it ends
        if wait:
            for thread in threads:
                thread.join()
