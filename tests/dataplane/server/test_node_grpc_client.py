"""A client in another language (issue 31): examples/node/produce_fetch_failover.js, written with
@grpc/grpc-js and @grpc/proto-loader (pinned by examples/node/package-lock.json), against a real
3-node cluster (127.0.0.231-233).

The Node program creates a topic, produces with acks=all (a RecordBatch v2 it encodes itself),
fetches the records back, prints ``ready: ...`` and waits on stdin. Here the partition's leader
is SIGKILLed; once the survivors have elected another, the killed broker is started again and
comes back as a follower. Then the program is told to go on: it produces to the leader it knows,
gets NOT_LEADER_OR_FOLLOWER (the per-partition error_code), asks for Metadata again and produces
and fetches on the new leader. Every acknowledged record must be read back once and in order,
by the Node program and by the Python test from the new leader."""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataplane.tools.local_cluster import LocalCluster, wait_for
from tests.dataplane.cluster_support import fetch, metadata, read_all, running_cluster

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("grpc-node")]
EXAMPLE_DIR = Path(__file__).resolve().parents[3] / "examples" / "node"
PROGRAM = "produce_fetch_failover.js"
TOPIC = "node-grpc"
LINE_TIMEOUT_S = 30.0  # one step takes a second or two; an election a few
PROGRAM_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("node-grpc"), "grpc_node") as running:
        yield running


class NodeProgram:
    """The Node program as a child process, its stdout read line by line with deadlines."""

    def __init__(self, node: str, bootstrap: list[str]) -> None:
        env = {**os.environ, "RAFTLOG_BOOTSTRAP": ",".join(bootstrap)}
        self.process = subprocess.Popen(
            [node, PROGRAM, TOPIC], cwd=EXAMPLE_DIR, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue(maxsize=1000)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def until(self, pattern: str, timeout_s: float = LINE_TIMEOUT_S) -> re.Match[str]:
        """The first line from now on that matches ``pattern``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no line matching {pattern!r} in {timeout_s} s:\n{self.transcript()}")
            if line is None:
                pytest.fail(f"the program ended before {pattern!r}:\n{self.transcript()}")
            self.lines.append(line)
            found = re.search(pattern, line)
            if found:
                return found

    def say(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def finish(self) -> int:
        """Wait for the exit; the rest of stdout joins ``lines``."""
        code = self.process.wait(timeout=PROGRAM_TIMEOUT_S)
        self._reader.join(timeout=LINE_TIMEOUT_S)
        while (line := self._queue.get_nowait()) is not None:
            self.lines.append(line)
        return code

    def transcript(self) -> str:
        stderr = ""
        if self.process.poll() is not None and self.process.stderr is not None:
            stderr = self.process.stderr.read()[-4000:]
        return "\n".join(self.lines) + f"\n-- stderr\n{stderr}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def leader_seen_by(cluster: LocalCluster, node_id: int) -> int | None:
    described = metadata(cluster, node_id, TOPIC)
    if described is None or described.error_code or not described.partitions:
        return None
    return described.partitions[0].leader_id


def test_node_client_produces_fetches_and_follows_a_leader_change(cluster: LocalCluster) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (make test installs the Debian package nodejs)")
    assert (EXAMPLE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir(), (
        "the example's packages are not installed: npm ci --prefix examples/node (make test does)"
    )
    program = NodeProgram(node, cluster.bootstrap_servers)
    try:
        ready = program.until(r"^ready: leader is broker (\d+)")
        old_leader = int(ready.group(1))
        survivors = [s.node_id for s in cluster.specs if s.node_id != old_leader]

        cluster.stop_node(old_leader, kill=True)

        def new_leader() -> int | None:
            seen = {leader_seen_by(cluster, n) for n in survivors}
            leader = seen.pop() if len(seen) == 1 else None
            return leader if leader in survivors else None

        elected = wait_for("the survivors' new leader", new_leader, 30)
        cluster.start_node(old_leader)
        wait_for(
            f"broker {old_leader} back as a follower of {elected}",
            lambda: leader_seen_by(cluster, old_leader) == elected,
            30,
        )
        program.say("go")
        program.until(
            rf"^produce on broker {old_leader} failed: NOT_LEADER_OR_FOLLOWER \(6, retriable, "
            rf"error_code\).*leader hint broker {elected}$"
        )
        program.until(rf"^metadata from .*: leader of {TOPIC}-0 is broker {elected} ")
        program.until(rf"^produced 3 records with acks=all to broker {elected}: offsets 3-5$")
        fetched = program.until(rf"^fetched 6 records from broker {elected}: (.*)$")
        program.until(r"^done: 6 acknowledged records read back once and in order$")
        assert program.finish() == 0, program.transcript()
        print("\n".join(program.lines))  # docs/api.md shows this transcript
    finally:
        program.kill()
    expected = [f"value-{n}" for n in range(6)]
    assert fetched.group(1) == " ".join(f"{n}:{v}" for n, v in enumerate(expected))
    address = cluster.broker_address(elected)
    assert fetch(address, TOPIC, 0, 0).high_watermark == 6, "a record stored twice or lost"
    stored = read_all(address, TOPIC, 0, 6)
    assert [(r.offset, r.key, r.value) for r in stored] == [
        (n, f"key-{n}".encode(), f"value-{n}".encode()) for n in range(6)
    ]
