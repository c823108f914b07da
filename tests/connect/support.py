"""Connect worker processes for tests: started with ``raftlog connect ...``, each REST server on
a node address of the test's own loopback range, stopped by pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx

from bench.profiles import py_spy
from dataplane.tools.entry import COMMAND as RAFTLOG
from dataplane.tools.local_cluster import LocalCluster, free_port, wait_for
from dataplane.tools.owned_process import popen_owned

REPO = Path(__file__).resolve().parents[2]
HTTP_TIMEOUT_S = 30.0
# Small timeouts so the tests see rebalances and expiries within seconds.
CLUSTER_OVERRIDES: dict[str, str | int] = {
    "group.min.session.timeout.ms": 1000,
    "group.initial.rebalance.delay.ms": 0,
    "group.consumer.session.timeout.ms": 3000,
    "group.consumer.heartbeat.interval.ms": 300,
    "offsets.topic.num.partitions": 5,
}


class Worker:
    """One ``raftlog connect standalone|distributed`` process."""

    def __init__(self, root: Path, name: str, host: str, args: list[str], config: dict[str, Any]):
        self.root = root
        self.name = name
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.config_path = root / f"{name}.json"
        self.config_path.write_text(json.dumps({**config, "listeners": self.url}))
        self.args = args
        self.log_path = root / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with self.log_path.open("ab") as log:
            self.process = popen_owned(  # dies with this process if the test run is killed
                [*RAFTLOG, "connect", self.args[0], str(self.config_path), *self.args[1:]],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_for(f"{self.name}'s REST API", self._answers, 60)

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited: {self.log_path.read_text()[-3000:]}")
        try:
            return httpx.get(self.url + "/connectors", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM (a clean stop: tasks commit), SIGKILL after ``timeout_s``."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        return httpx.request(method, self.url + path, json=body, timeout=HTTP_TIMEOUT_S)


def worker_config(cluster: LocalCluster, **settings: Any) -> dict[str, Any]:
    return {"bootstrap.servers": ",".join(cluster.bootstrap_servers), **settings}


def lines(path: Path) -> list[str]:
    """The complete lines of ``path`` (a partial last line is not one)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1].decode().splitlines()


class MirrorProcess:
    """One ``raftlog mirror`` process (``args`` after ``raftlog mirror``, its REST server at
    ``url``), stopped by its pid. Unbuffered, so its last log lines survive a SIGKILL."""

    def __init__(self, url: str, log_path: Path, args: list[str]) -> None:
        self.url = url
        self.log_path = log_path
        self.args = [*RAFTLOG, "mirror", *args, "--listeners", url]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            self.process = popen_owned(self.args, env=env, stdout=log,
                                       stderr=subprocess.STDOUT)  # fmt: skip
        wait_for("the mirror's connectors", self._configured, 90)

    def _configured(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the mirror exited: {self.log_path.read_text()[-3000:]}")
        try:
            answer = httpx.get(self.url + "/connectors", timeout=2)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200 and len(answer.json()) == 2

    def threads(self) -> str:
        """What each of the running mirror's threads is doing now (py-spy's dump, from this
        interpreter's environment): for a test that timed out waiting on it."""
        if self.process is None or self.process.poll() is not None:
            return "(the mirror is not running)"
        try:
            spy = py_spy()
        except RuntimeError as missing:
            return str(missing)
        done = subprocess.run([spy, "dump", "-p", str(self.process.pid)],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        return done.stdout + done.stderr

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
