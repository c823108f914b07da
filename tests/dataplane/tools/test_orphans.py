"""Processes die with their owner (dataplane/tools/owned_process.py), ``raftlog cluster up``'s
nodes excepted.

The end-to-end case: a child pytest session (orphan_session.py) starts a 3-node cluster with the
fixture code of every cluster test, on 127.0.0.211-213 (``RANGES["orphans"]``) and ephemeral
ports; it is killed (SIGKILL, SIGTERM, SIGINT) and no node of it may be left. Then the
mechanism's edges, with ``sleep`` standing in for a node. Every process started here is killed
by its pid at the end, also when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from dataplane.tools import cli
from dataplane.tools.local_cluster import (
    LocalCluster,
    detached_launcher,
    owned_launcher,
    wait_for,
)
from dataplane.tools.owned_process import ORPHANED_EXIT_STATUS, owned_argv, popen_owned
from tests.dataplane.tools.orphan_session import ORPHAN_DIR

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.xdist_group("dataplane-orphans"),
]

REPO = Path(__file__).resolve().parents[3]
SESSION = Path(__file__).with_name("orphan_session.py")
NODE = b"dataplane.tools.entry"  # in every node's command line
SLEEP = b"sleep"
PYTHON = b"python"
UP_S = 90.0  # the child session's start and its cluster's
GONE_S = 60.0  # from the kill to the last node gone (after SIGINT: the session's own teardown,
# three clean node stops: over 20 s on a loaded 2-core CI machine, in two CI runs)
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def process_state(pid: int) -> str | None:
    """``pid``'s state letter in /proc (R, S, D, Z, ...); None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def running(pid: int, marker: bytes) -> bool:
    """Whether ``pid`` is a live process (a zombie is not) whose command line holds ``marker``
    (so a reused pid is not taken for ours)."""
    state = process_state(pid)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in (None, "Z") and marker in cmdline


def survivors(pids: Iterable[int], marker: bytes, timeout_s: float = GONE_S) -> list[int]:
    """Those of ``pids`` still running once all are gone or ``timeout_s`` has passed."""
    pids = list(pids)
    with contextlib.suppress(TimeoutError):
        wait_for("the processes to be gone", lambda: not any(running(p, marker) for p in pids),
                 timeout_s)  # fmt: skip
    return [pid for pid in pids if running(pid, marker)]


def kill_running(pids: Iterable[int], marker: bytes) -> None:
    for pid in pids:
        if running(pid, marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# -- a killed pytest session --------------------------------------------------------------------
class ChildSession:
    """``pytest orphan_session.py`` in its own process, its files under ``root``."""

    def __init__(self, root: Path, *pytest_args: str) -> None:
        self.root = root
        self.log_path = root / "session.log"
        self.holder: int | None = None  # the process that runs the test, once known
        argv = [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "--basetemp", str(root / "tmp"), *pytest_args, str(SESSION),
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.proc = popen_owned(
                argv, cwd=REPO, env={**ENV, ORPHAN_DIR: str(root)}, stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_until_up(self) -> list[int]:
        """The node pids, once the session has its cluster up."""

        def ready() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"the session ended ({self.proc.returncode}):\n{self.tail()}")
            try:
                return dict(json.loads((self.root / "pids.json").read_text()))
            except FileNotFoundError:
                return None

        started = wait_for("the child session's cluster", ready, UP_S)
        self.holder = int(started["session"])  # this session, or its xdist worker
        return [int(pid) for pid in started["nodes"].values()]

    def nodes_state(self, nodes: list[int]) -> str:
        """Each node's process state and the end of its log: where a slow teardown waits."""
        lines = [f"node pid {pid}: {process_state(pid) or 'gone'}" for pid in nodes]
        for log in sorted((self.root / "cluster").glob("node-*/node.log")):
            lines.append(f"---- {log}\n{log.read_text(errors='replace')[-1500:]}")
        return "\n".join(lines)

    def recorded_nodes(self) -> list[int]:
        """Every node pid the session's cluster recorded, also before it was up."""
        try:
            state = json.loads((self.root / "cluster" / "cluster.json").read_text())
        except FileNotFoundError:
            return []
        return [int(pid) for pid in state["pids"].values()]

    def kill_everything(self, nodes: list[int]) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=GONE_S)
        if self.holder is not None:
            kill_running([self.holder], PYTHON)
        kill_running({*nodes, *self.recorded_nodes()}, NODE)


def kill_session_and_check(root: Path, signum: signal.Signals, *pytest_args: str) -> None:
    session = ChildSession(root, *pytest_args)
    nodes: list[int] = []
    try:
        nodes = session.wait_until_up()
        assert len(nodes) == 3 and all(running(pid, NODE) for pid in nodes), nodes
        os.kill(session.proc.pid, signum)
        try:
            session.proc.wait(timeout=GONE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the session lived {GONE_S} s after {signum.name}:\n{session.tail()}\n"
                        f"{session.nodes_state(nodes)}")  # fmt: skip
        left = survivors(nodes, NODE)
        assert not left, f"nodes {left} outlived the session ({signum.name}):\n{session.tail()}"
        assert session.holder is not None and not survivors([session.holder], PYTHON)
    finally:
        session.kill_everything(nodes)


@pytest.mark.parametrize(
    "signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name
)
def test_no_node_outlives_the_killed_pytest_session_that_started_it(
    tmp_path: Path, signum: signal.Signals
) -> None:
    kill_session_and_check(tmp_path, signum)


def test_no_node_outlives_a_killed_xdist_session(tmp_path: Path) -> None:
    """The nodes' owner is the xdist worker; killing the controller ends the worker."""
    kill_session_and_check(tmp_path, signal.SIGKILL, "-n", "1")


# -- the mechanism's edges ----------------------------------------------------------------------
def start_and_report(code: str, *args: str) -> tuple[subprocess.Popen[str], list[int]]:
    """Run ``code`` (which prints one child pid per line, then "done") in its own process."""
    proc = popen_owned(
        [sys.executable, "-c", code, *args], cwd=REPO, env=ENV, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    pids: list[int] = []
    for line in proc.stdout:  # ends with "done" or at EOF (the starter failed)
        if line.strip() == "done":
            break
        pids.append(int(line))
    return proc, pids


OWNER = """
import sys
from dataplane.tools.owned_process import popen_owned
options = sys.argv[1:]
print(popen_owned(["sleep", "600"], setpriv_options=options).pid, flush=True)
print("done", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize(
    "options",
    [
        pytest.param([], id="same-user"),
        pytest.param(
            ["--reuid=65534", "--regid=65534", "--clear-groups"],
            id="other-user",
            marks=pytest.mark.skipif(os.geteuid() != 0, reason="changing user needs root"),
        ),
    ],
)
def test_a_child_dies_when_its_owner_is_sigkilled(options: list[str]) -> None:
    """Also as another user (the chaos harness's nodes): setpriv arms the death signal after
    changing the user, which would clear it."""
    owner, children = start_and_report(OWNER, *options)
    try:
        assert len(children) == 1, children
        # Popen returns once setpriv runs; its shell then execs sleep, and /proc/<pid>/cmdline
        # reads empty while an exec replaces the process's memory.
        wait_for("the child to run sleep", lambda: running(children[0], SLEEP), 10)
        owner.kill()
        owner.communicate(timeout=GONE_S)
        assert not survivors(children, SLEEP)
    finally:
        owner.kill()
        owner.communicate(timeout=GONE_S)
        kill_running(children, SLEEP)


STARTER = """
import sys
from pathlib import Path
from dataplane.tools.local_cluster import detached_launcher, owned_launcher
log = Path(sys.argv[1])
for launcher in (owned_launcher, detached_launcher):
    print(launcher(1, ["sleep", "600"], log).pid, flush=True)
print("done", flush=True)
"""


def test_a_detached_node_outlives_its_starter_and_an_owned_one_does_not(tmp_path: Path) -> None:
    starter, children = start_and_report(STARTER, str(tmp_path / "node.log"))
    try:
        starter.communicate(timeout=GONE_S)
        assert starter.returncode == 0 and len(children) == 2, children
        owned, detached = children
        assert not survivors([owned], SLEEP), "an owned node dies with the process that started it"
        # The owned node's death shows that the starter's end has been dealt with.
        assert running(detached, SLEEP), "a detached node (raftlog cluster up) lives on"
    finally:
        kill_running(children, SLEEP)


def test_the_cluster_commands_detach_their_nodes_and_the_library_does_not(tmp_path: Path) -> None:
    assert cli.local_cluster(3, tmp_path).launcher is detached_launcher
    assert LocalCluster(tmp_path).launcher is owned_launcher


ARMED = [sys.executable, "-c", "import sys; print('armed', flush=True); sys.stdin.read()"]


def test_a_child_outlives_the_thread_that_started_it() -> None:
    """The kernel sends the death signal when the forking *thread* ends: a bare ``setpriv
    --pdeathsig`` child started from a short-lived thread dies with the thread; one started by
    ``popen_owned`` from that thread lives on (its forking thread lasts as long as the process)."""
    started: dict[str, subprocess.Popen[bytes]] = {}
    armed: dict[str, bytes] = {}

    def start() -> None:  # both children armed before the thread ends
        started["bare"] = subprocess.Popen(owned_argv(ARMED), stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE)  # fmt: skip
        started["owned"] = popen_owned(ARMED, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for name, proc in started.items():
            assert proc.stdout is not None
            armed[name] = proc.stdout.readline()

    thread = threading.Thread(target=start)
    thread.start()
    thread.join(timeout=60)
    try:
        assert armed == {"bare": b"armed\n", "owned": b"armed\n"}, armed
        bare, owned = started["bare"], started["owned"]
        wait_for("the bare child to die with its thread", lambda: bare.poll() is not None, GONE_S)
        assert bare.returncode == -signal.SIGKILL
        assert owned.poll() is None, "the owned child outlives the thread that started it"
    finally:
        for proc in started.values():
            proc.kill()
            proc.communicate(timeout=GONE_S)


def test_a_child_whose_owner_is_gone_before_it_runs_never_runs() -> None:
    """An owner that dies between the fork and the arming of the signal: the shell between
    setpriv and the command sees another parent than the owner named in the command and exits.
    Simulated by a shell that forks the wrapped command, so its parent is not this process."""
    wrapped = owned_argv(["echo", "ran"])
    direct = subprocess.run(wrapped, capture_output=True, text=True, timeout=30, check=False)
    assert (direct.returncode, direct.stdout) == (0, "ran\n")
    forked = subprocess.run(["/bin/sh", "-c", '"$@"; exit $?', "sh", *wrapped],
                            capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert (forked.returncode, forked.stdout) == (ORPHANED_EXIT_STATUS, "")


def test_preexec_fn_is_refused() -> None:
    with pytest.raises(ValueError, match="preexec_fn"):
        popen_owned(["true"], preexec_fn=os.setpgrp)
