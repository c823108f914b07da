"""Distributed mode against a real 3-node cluster, and the classic group RPCs under it.

- the JoinGroup/SyncGroup/Heartbeat/LeaveGroup RPCs spoken raw over gRPC;
- two ``GroupMembership`` members sharing a group, one leaving;
- two worker processes sharing a file source (4 tasks) and a file sink (2 tasks): one is
  SIGKILLed while lines flow, its tasks move to the other, which resumes from the committed
  offsets. Delivery is at-least-once: the test bounds the duplicates (a restart from the
  beginning of a file would exceed the bound) and requires every line.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from dataplane.client import GroupAssignment, GroupMembership, JoinedMember
from dataplane.tools.local_cluster import LocalCluster, wait_for
from protos import group_pb2 as gpb
from protos import group_pb2_grpc as gpb_grpc
from raftlog.errors import ErrorCode
from tests.connect.support import CLUSTER_OVERRIDES, Worker, lines, worker_config
from tests.dataplane.cluster_support import create_topic, running_cluster

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("connect-distributed")]
HOSTS = ("127.0.0.187", "127.0.0.188")
FILES = 4
WRITE_EVERY_S = 0.01  # the writer's pace: one line per file every 10 ms
DUPLICATES_PER_FILE_MAX = 150
SESSION_TIMEOUT_MS = 2000  # lines of ~1.5 s; a restart from the beginning would be 300+


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("connect-distributed")
    with running_cluster(root, "connect_distributed", CLUSTER_OVERRIDES) as running:
        yield running


def group_stub(address: str) -> gpb_grpc.GroupCoordinatorServiceStub:
    return gpb_grpc.GroupCoordinatorServiceStub(grpc.insecure_channel(address))


def coordinator_of(cluster: LocalCluster, group: str) -> str:
    def find() -> str | None:
        found = group_stub(cluster.bootstrap_servers[0]).FindCoordinator(
            gpb.FindCoordinatorRequest(group_ids=[group]), timeout=10
        )
        item = found.coordinators[0]
        return None if item.error_code else f"{item.host}:{item.port}"

    return wait_for(f"the coordinator of {group}", find, 30)


COORDINATOR_MOVING = (ErrorCode.NOT_COORDINATOR.code, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS.code)


def test_classic_group_rpcs(cluster: LocalCluster) -> None:
    join = gpb.JoinGroupRequest(
        group_id="rpc-group", session_timeout_ms=5000, rebalance_timeout_ms=5000,
        protocol_type="connect", client_id="t",
        protocols=[gpb.JoinGroupProtocol(name="default", metadata=b"meta")],
    )  # fmt: skip

    def first_join() -> tuple[str, gpb.JoinGroupResponse] | None:
        # as a Kafka client: the coordinator found may not know yet that it is one (its
        # metadata lags the broker asked) or still be loading: find it again and retry
        address = coordinator_of(cluster, "rpc-group")
        answer = group_stub(address).JoinGroup(join, timeout=30)
        return None if answer.error_code in COORDINATOR_MOVING else (address, answer)

    address, first = wait_for("a coordinator that takes the join", first_join, 60)
    stub = group_stub(address)
    assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED.code and first.member_id
    join.member_id = first.member_id
    joined = stub.JoinGroup(join, timeout=30)
    assert joined.error_code == 0, joined.error_message
    assert (joined.leader, joined.member_id, joined.protocol_name) == (
        first.member_id, first.member_id, "default",
    )  # fmt: skip
    assert [(m.member_id, m.metadata) for m in joined.members] == [(first.member_id, b"meta")]

    sync = stub.SyncGroup(
        gpb.SyncGroupRequest(
            group_id="rpc-group", generation_id=joined.generation_id, member_id=first.member_id,
            protocol_type="connect", protocol_name="default",
            assignments=[gpb.SyncGroupAssignment(member_id=first.member_id, assignment=b"mine")],
        ),
        timeout=30,
    )  # fmt: skip
    assert (sync.error_code, sync.assignment, sync.protocol_type) == (0, b"mine", "connect")

    def heartbeat(generation: int) -> int:
        return int(
            stub.Heartbeat(
                gpb.HeartbeatRequest(
                    group_id="rpc-group", generation_id=generation, member_id=first.member_id
                ),
                timeout=10,
            ).error_code
        )

    assert heartbeat(joined.generation_id) == 0
    assert heartbeat(joined.generation_id + 5) == ErrorCode.ILLEGAL_GENERATION.code

    others = [a for a in cluster.bootstrap_servers if a != address]
    elsewhere = group_stub(others[0]).JoinGroup(join, timeout=30)
    assert elsewhere.error_code == ErrorCode.NOT_COORDINATOR.code

    leave = gpb.LeaveGroupRequest(
        group_id="rpc-group", members=[gpb.LeaveGroupMember(member_id=first.member_id)]
    )
    left = stub.LeaveGroup(leave, timeout=10)
    assert left.error_code == 0 and [m.error_code for m in left.members] == [0]
    again = stub.LeaveGroup(leave, timeout=10)
    assert [m.error_code for m in again.members] == [ErrorCode.UNKNOWN_MEMBER_ID.code]


def test_group_membership_members_share_and_rebalance_when_one_leaves(
    cluster: LocalCluster,
) -> None:
    seen: dict[str, list[GroupAssignment]] = {"a": [], "b": []}
    revoked: Counter[str] = Counter()
    slow_stop = threading.Event()

    def on_revoked(name: str) -> None:
        revoked.update([name])
        if name == "a" and revoked["a"] == 1:
            # a first revocation slower than the session: the member must keep heartbeating
            slow_stop.wait(SESSION_TIMEOUT_MS / 1000 + 1)

    def assign(protocol: str, members: Sequence[JoinedMember]) -> dict[str, bytes]:
        # every member gets the sorted list of everyone's metadata
        everyone = b",".join(sorted(m.metadata for m in members))
        return {m.member_id: everyone for m in members}

    def member(name: str) -> GroupMembership:
        return GroupMembership(
            cluster.bootstrap_servers, "membership-group", protocol_type="connect",
            protocols=lambda: [("default", name.encode())], assign=assign,
            on_assigned=seen[name].append, on_revoked=lambda: on_revoked(name),
            session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=200,
            rebalance_timeout_ms=10_000,
        )  # fmt: skip

    a, b = member("a"), member("b")
    try:
        a.start()

        def last(name: str) -> bytes | None:
            return seen[name][-1].assignment if seen[name] else None

        wait_for("a alone", lambda: last("a") == b"a", 30)
        b.start()
        wait_for("a and b", lambda: last("b") == b"a,b", 30)
        wait_for("a sees b", lambda: last("a") == b"a,b", 30)
        assert seen["a"][-1].generation_id == seen["b"][-1].generation_id
        assert revoked["a"] >= 1, "a stopped its work before the rebalance (eager)"
        assert seen["a"][-1].member_id == seen["a"][0].member_id, "a's session never expired"
        b.close()
        wait_for("a alone again", lambda: last("a") == b"a", 30)
    finally:
        a.close()
        b.close()


# -- two workers -------------------------------------------------------------------------------
class Writer:
    """Appends ``f<k>-<n>`` lines to each source file at a steady pace on its own thread."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.written = [0] * len(paths)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        handles = [p.open("a") for p in self.paths]
        try:
            while not self.stopped.wait(WRITE_EVERY_S):  # pacing the load, not a synchronisation
                for k, handle in enumerate(handles):
                    handle.write(f"f{k}-{self.written[k]:06d}\n")
                    handle.flush()
                    self.written[k] += 1
        finally:
            for handle in handles:
                handle.close()

    def expected(self) -> set[str]:
        return {f"f{k}-{n:06d}" for k, count in enumerate(self.written) for n in range(count)}


def task_workers(worker: Worker, name: str) -> dict[int, str] | None:
    answer = worker.call("GET", f"/connectors/{name}/status")
    if answer.status_code != 200:
        return None
    tasks: list[dict[str, Any]] = answer.json()["tasks"]
    if not tasks or any(t["state"] != "RUNNING" for t in tasks):
        return None
    return {int(t["id"]): str(t["worker_id"]) for t in tasks}


def test_two_workers_share_tasks_and_a_killed_workers_tasks_move(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    create_topic(cluster, "dist-lines", 2)
    sources = [tmp_path / f"in-{k}.txt" for k in range(FILES)]
    for path in sources:
        path.touch()
    sink = tmp_path / "out.txt"
    config = worker_config(
        cluster,
        **{"group.id": "connect-test", "session.timeout.ms": 3000, "heartbeat.interval.ms": 300,
           "rebalance.timeout.ms": 10_000, "offset.flush.interval.ms": 300,
           "offset.storage.partitions": 2, "status.storage.partitions": 2},
    )  # fmt: skip
    workers = [
        Worker(tmp_path, f"w{i + 1}", h, ["distributed"], config) for i, h in enumerate(HOSTS)
    ]
    writer = Writer(sources)
    try:
        for worker in workers:
            worker.start()
        w1, w2 = workers
        src = {"connector.class": "FileStreamSource", "files": ",".join(map(str, sources)),
               "topic": "dist-lines", "tasks.max": 4}  # fmt: skip
        snk = {"connector.class": "FileStreamSink", "file": str(sink), "topics": "dist-lines",
               "tasks.max": 2}  # fmt: skip

        def created(worker: Worker, name: str, body: dict[str, Any]) -> bool:
            answer = worker.call("POST", "/connectors", {"name": name, "config": body})
            assert answer.status_code in (201, 409), answer.text  # 409: a rebalance, try again
            return answer.status_code == 201

        wait_for("src created", lambda: created(w1, "src", src), 30)
        wait_for("snk created through the other worker", lambda: created(w2, "snk", snk), 30)
        owners = wait_for("4 source tasks running", lambda: task_workers(w1, "src"), 60)
        wait_for("2 sink tasks running", lambda: task_workers(w2, "snk"), 60)
        w2_id = w2.url.removeprefix("http://")
        assert set(owners.values()) == {w1.url.removeprefix("http://"), w2_id}, owners
        moved = [task for task, owner in owners.items() if owner == w2_id]

        writer.thread.start()
        wait_for("lines flowing", lambda: len(lines(sink)) >= 1200, 60)
        w2.kill()

        def all_on_w1() -> bool:
            for name in ("src", "snk"):
                placed = task_workers(w1, name)
                if placed is None or set(placed.values()) != {w1.url.removeprefix("http://")}:
                    return False
            return True

        wait_for("every task on w1", all_on_w1, 60)
        wait_for("more lines after the move", lambda: len(lines(sink)) >= 2400, 60)
        writer.stopped.set()
        writer.thread.join(10)
        expected = writer.expected()
        wait_for("every line in the sink", lambda: expected <= set(lines(sink)), 60)
        counts = Counter(lines(sink))
        assert set(counts) == expected, "no line that was not written"
        duplicated = Counter(line.split("-")[0] for line, n in counts.items() for _ in range(n - 1))
        assert all(n <= DUPLICATES_PER_FILE_MAX for n in duplicated.values()), (
            f"duplicates per file {dict(duplicated)} (w2 ran source tasks {moved})"
        )
    finally:
        writer.stopped.set()
        for worker in workers:
            worker.stop()
