"""Child processes that die with the process that started them (their owner).

Nodes, Connect workers, servers and tools started by tests, the chaos harness, the benchmarks
and the demos must not outlive a killed owner (a test run stopped by a timeout, Ctrl-C, SIGTERM
or SIGKILL), holding ports and CPU. Normal teardown still stops every child by its pid; this is
the safety net for when the owner cannot. ``raftlog cluster up`` nodes are the exception: they
outlive the command on purpose and are started without it (`dataplane.tools.local_cluster`'s
``detached_launcher``).

How: `popen_owned` starts ``setpriv --pdeathsig KILL -- /bin/sh -c CHECK OWNER_PID argv...``.

- ``setpriv`` (util-linux) arms ``PR_SET_PDEATHSIG`` and execs, so the kernel signals the child
  when its owner exits, however it exits, SIGKILL included. It works for any program (nats-server,
  perf, iperf3), not only ours, and after setpriv's own credential changes: the chaos harness
  adds ``--reuid`` etc. (`popen_owned`'s ``setpriv_options``) and setpriv arms the signal after
  changing user (a credential change clears it). ``preexec_fn`` is not used: it forks the whole
  process, unsafe with gRPC's threads (tests/protos/test_fork_safety.py).
- ``CHECK`` closes the race in which the owner dies between fork and prctl: the shell execs
  ``argv`` only if its parent is still the owner, else exits with `ORPHANED_EXIT_STATUS`.
- Every exec keeps the pid, so the pid Popen returns is the program's own (stop it, pause it,
  read its /proc/<pid>/cmdline), and the death signal stays armed across the execs.
- The kernel sends the signal when the *thread* that forked the child ends, not the process. So
  a call from any thread but the main one is handed to one daemon thread that lives as long as
  the process (`_LastingThread`); the main thread lives until the process ends.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

ORPHANED_EXIT_STATUS = 111  # the shell's status when the owner was gone before the exec
_OWNER_CHECK = f'[ "$PPID" = "$0" ] || exit {ORPHANED_EXIT_STATUS}; exec "$@"'
START_TIMEOUT_S = 30.0  # a start handed to the lasting thread (a Popen takes milliseconds)
_STARTS_MAX = 64  # starts waiting for the lasting thread

T = TypeVar("T")


class OwnedProcessError(RuntimeError):
    """An owned process cannot be started here (setpriv is missing)."""


def setpriv_path() -> str:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise OwnedProcessError(
            "setpriv (util-linux >= 2.33) is missing: `apt-get install -y util-linux`"
        )
    return setpriv


def owned_argv(
    argv: Sequence[str],
    *,
    death_signal: signal.Signals = signal.SIGKILL,
    setpriv_options: Sequence[str] = (),
) -> list[str]:
    """``argv`` wrapped so the process gets ``death_signal`` when this process ends."""
    if not argv:
        raise ValueError("an owned process needs a command")
    return [
        setpriv_path(), *setpriv_options, f"--pdeathsig={death_signal.name}", "--",
        "/bin/sh", "-c", _OWNER_CHECK, str(os.getpid()), *argv,
    ]  # fmt: skip


def popen_owned(
    argv: Sequence[str],
    *,
    death_signal: signal.Signals = signal.SIGKILL,
    setpriv_options: Sequence[str] = (),
    **popen_kwargs: Any,
) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **popen_kwargs)`` whose process dies with this one (SIGKILL, or
    ``death_signal``: SIGINT/SIGTERM give an owner of its own children time to clean up).
    ``popen_kwargs`` must not hold ``preexec_fn`` (see the module doc)."""
    if "preexec_fn" in popen_kwargs:
        raise ValueError("preexec_fn forks the whole process: not with gRPC threads around")
    wrapped = owned_argv(argv, death_signal=death_signal, setpriv_options=setpriv_options)
    return _from_lasting_thread(lambda: subprocess.Popen(wrapped, **popen_kwargs))


def _from_lasting_thread(start: Callable[[], T]) -> T:
    if threading.current_thread() is threading.main_thread():
        return start()
    return _lasting_thread().call(start)


class _LastingThread:
    """A daemon thread that forks for the threads that may end before the process does."""

    def __init__(self) -> None:
        self._starts: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue(
            maxsize=_STARTS_MAX
        )
        thread = threading.Thread(target=self._serve, name="owned-process-starter", daemon=True)
        thread.start()

    def _serve(self) -> None:
        while True:
            start, future = self._starts.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(start())
            except Exception as exc:  # noqa: BLE001 - not swallowed: raised in the caller
                future.set_exception(exc)

    def call(self, start: Callable[[], T]) -> T:
        future: Future[T] = Future()
        self._starts.put((start, future), timeout=START_TIMEOUT_S)
        return future.result(timeout=START_TIMEOUT_S)


# The process's forking thread, by pid: a forked child starts its own.
_lasting_threads: dict[int, _LastingThread] = {}
_lasting_lock = threading.Lock()


def _lasting_thread() -> _LastingThread:
    with _lasting_lock:
        lasting = _lasting_threads.get(os.getpid())
        if lasting is None:
            _lasting_threads.clear()  # a parent's, inherited by fork: its thread is not here
            lasting = _lasting_threads[os.getpid()] = _LastingThread()
        return lasting
