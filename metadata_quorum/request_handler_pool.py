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
import time
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


class RequestHandlerPool(futures.Executor):
    """An executor of at most ``max_workers`` threads named ``<thread_name_prefix>_<n>``; a
    thread idle for ``keep_alive_s`` ends."""

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
        self._cond = threading.Condition()
        self._items: deque[_WorkItem] = deque()
        # invariant: 0 <= _idle <= len(_threads) <= max_workers; _idle counts the workers not
        # running an item (waiting for one, or started and not yet waiting)
        self._threads: set[threading.Thread] = set()
        self._idle = 0
        self._started = 0  # threads ever started: their names' numbers
        self._shutdown = False

    @property
    def workers(self) -> int:
        """Threads alive now (running a call or waiting for one)."""
        with self._cond:
            return len(self._threads)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future[Any]:
        future: futures.Future[Any] = futures.Future()
        with self._cond:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._items.append(_WorkItem(future, fn, args, kwargs))
            if self._idle < len(self._items) and len(self._threads) < self.max_workers:
                self._start_worker()
            self._cond.notify()
        return future

    def _start_worker(self) -> None:
        thread = threading.Thread(
            target=self._work,
            name=f"{self.thread_name_prefix}_{self._started}",
            daemon=True,
        )
        self._started += 1
        self._threads.add(thread)
        self._idle += 1
        thread.start()

    def _work(self) -> None:
        while True:
            item = self._next_item()
            if item is None:
                return
            item.run()
            del item  # drop the call's objects before waiting, as ThreadPoolExecutor does
            with self._cond:
                self._idle += 1

    def _next_item(self) -> _WorkItem | None:
        """The next item to run, or None when this worker ends (idle past the keep-alive, or
        the pool shut down with nothing left to run)."""
        with self._cond:
            idle_until = time.monotonic() + self.keep_alive_s
            while not self._items:
                remaining_s = idle_until - time.monotonic()
                if self._shutdown or remaining_s <= 0:
                    self._threads.discard(threading.current_thread())
                    self._idle -= 1
                    return None
                self._cond.wait(remaining_s)
            self._idle -= 1
            return self._items.popleft()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cond:
            self._shutdown = True
            if cancel_futures:
                while self._items:
                    self._items.popleft().future.cancel()
            self._cond.notify_all()
            threads = list(self._threads)
        if wait:
            for thread in threads:
                thread.join()
