"""A controller quorum that changes membership (KIP-853), with real node processes.

Controllers 1-3 start as the quorum on 127.0.0.236-238; controllers 4 and 5 (127.0.0.239-240)
join it at run time, two of 1-3 leave (the active controller among them), 4 is killed; a removed
controller comes back and cannot vote; a broker-only node (6, 127.0.0.241) started
with the first three controllers keeps its session through all of it. Every node's
configuration names controllers 1-3 as ``controller.quorum.voters`` from start to end: the
voter set a restarted node uses comes from its log. A writer creates topics the whole time.
127.0.0.236-241 are this module's.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest
from kio.serial import entity_reader, entity_writer

from dataplane.client.admin import AdminClient, RaftVoter
from dataplane.kafka import codec as kc
from dataplane.server.config import NodeConfig
from dataplane.tools.entry import COMMAND
from dataplane.tools.local_cluster import pick_cluster_port
from dataplane.tools.owned_process import popen_owned
from metadata_quorum.client import ControllerClient
from protos import broker_pb2 as bpb
from protos import broker_pb2_grpc as bpb_grpc
from protos import controller_pb2 as pb
from raftlog.errors import ErrorCode, KafkaError
from tests.metadata_quorum.quorum_support import register_brokers, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("quorum"), pytest.mark.timeout(300)]

FIRST_HOST = 236
CONTROLLERS = (1, 2, 3, 4, 5)
BROKER = 6
WRITE_GAP_MAX_S = 10.0  # the longest a topic creation may wait through the changes (failovers)


class Nodes:
    """Node processes on 127.0.0.(235 + id), started and stopped by pid."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.hosts = {n: f"127.0.0.{FIRST_HOST - 1 + n}" for n in (*CONTROLLERS, BROKER)}
        self.port = pick_cluster_port(list(self.hosts.values()))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def address(self, node_id: int) -> str:
        return f"{self.hosts[node_id]}:{self.port}"

    def voter(self, node_id: int) -> RaftVoter:
        return RaftVoter(node_id, self.hosts[node_id], self.port, self.port + 1)

    def config_path(self, node_id: int) -> Path:
        host = self.hosts[node_id]
        listener = (
            f"BROKER://{host}:{self.port - 1},KAFKA://{host}:{self.port + 3}" if node_id == BROKER
            else f"CONTROLLER://{host}:{self.port}"
        )  # fmt: skip
        config = NodeConfig.parse({
            "node.id": node_id,
            "process.roles": "broker" if node_id == BROKER else "controller",
            "controller.quorum.voters": ",".join(f"{n}@{self.address(n)}" for n in (1, 2, 3)),
            "listeners": listener,
            "log.dirs": str(self.root / f"node-{node_id}" / "data"),
            "broker.session.timeout.ms": 600_000,
            "controller.quorum.election.timeout.ms": 600,
        })  # fmt: skip
        path = self.root / f"node-{node_id}" / "node.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config.to_toml())
        return path

    def start(self, node_id: int) -> None:
        argv = [*COMMAND, "node", "--config"]
        argv.append(str(self.config_path(node_id)))
        with (self.root / f"node-{node_id}" / "node.log").open("ab") as out:
            self.procs[node_id] = popen_owned(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def kill(self, node_id: int) -> None:
        proc = self.procs.pop(node_id, None)
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        if proc is not None:
            proc.wait(timeout=10)

    def kill_all(self) -> None:
        for node_id in list(self.procs):
            self.kill(node_id)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    nodes = Nodes(tmp_path)
    try:
        yield nodes
    finally:
        nodes.kill_all()


@dataclass
class Writer:
    """Creates one topic after another through a client that learns the voters from the
    metadata (DescribeCluster), as brokers do from their image; notes the longest gap."""

    bootstrap: list[str]
    created: int = 0
    failures: list[str] = field(default_factory=list)
    gap_max_s: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        client = ControllerClient(self.bootstrap, deadline_s=WRITE_GAP_MAX_S)
        last = time.monotonic()
        try:
            while not self.stop.is_set():
                topic = pb.CreatableTopic(
                    name=f"w-{self.created:05d}", num_partitions=1, replication_factor=1
                )
                try:
                    response = client.create_topics([topic])
                except KafkaError as error:
                    self.failures.append(f"{error.error.name}: {error.message}")
                    continue
                errors = [t.error_message for t in response.topics if t.error_code]
                if errors:  # a retry of a creation that committed: TOPIC_ALREADY_EXISTS
                    self.failures += [e for e in errors if "already exists" not in e]
                now = time.monotonic()
                self.gap_max_s, last = max(self.gap_max_s, now - last), now
                self.created += 1
                described = client.call("DescribeCluster", pb.DescribeClusterRequest())
                client.learn([f"{v.host}:{v.port}" for v in described.voters])
        finally:
            client.close()


def kafka_call(nodes: Nodes, api_key: int, data: dict[str, Any]) -> Any:
    """One request (version 0) over Kafka's binary protocol to the broker's KAFKA listener."""
    schema = kc.request_schema(api_key, 0)
    header = kc.to_entity(schema.__header_schema__, {
        "request_api_key": api_key, "request_api_version": 0, "correlation_id": 1,
        "client_id": "membership-test",
    })  # fmt: skip
    buffer = io.BytesIO()
    entity_writer(schema.__header_schema__)(buffer, header)
    entity_writer(schema)(buffer, kc.to_entity(schema, data))
    frame = buffer.getvalue()
    with socket.create_connection((nodes.hosts[BROKER], nodes.port + 3), timeout=60) as conn:
        conn.sendall(struct.pack(">i", len(frame)) + frame)
        (size,) = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))
        answer = conn.recv(size, socket.MSG_WAITALL)
    response_schema = kc.response_schema(api_key, 0)
    _, offset = entity_reader(response_schema.__header_schema__)(answer, 0)
    return entity_reader(response_schema)(answer, offset)[0]


def quorum(admin: AdminClient) -> dict[int, int]:
    """voter id -> lag, as the active controller sees it."""
    return {v.node_id: v.lag for v in admin.describe_quorum().voters}


def caught_up(admin: AdminClient, voter_ids: set[int]) -> bool:
    lags = quorum(admin)
    return set(lags) == voter_ids and all(0 <= lag <= 5 for lag in lags.values())


def refused(call: object, code: ErrorCode) -> str:
    assert callable(call)
    with pytest.raises(KafkaError) as raised:
        call()
    assert raised.value.error is code, raised.value
    return raised.value.message


def described_voters(nodes: Nodes, node_id: int) -> list[int] | None:
    """The voters node ``node_id``'s own image names (None if it does not answer)."""
    client = ControllerClient([nodes.address(node_id)])
    try:
        answer = client.stub(nodes.address(node_id)).DescribeCluster(
            pb.DescribeClusterRequest(), timeout=2.0
        )
    except grpc.RpcError:
        return None
    finally:
        client.close()
    return [v.node_id for v in answer.voters]


def names_voters(nodes: Nodes, node_id: int, voters: list[int]) -> bool:
    return described_voters(nodes, node_id) == voters


def test_grow_replace_and_shrink_the_controller_quorum_while_it_commits(nodes: Nodes) -> None:
    for node_id in (1, 2, 3, BROKER):
        nodes.start(node_id)
    initial = [nodes.address(n) for n in (1, 2, 3)]
    admin = AdminClient(bootstrap_controllers=initial, request_timeout_ms=30_000)
    client = ControllerClient(initial)
    writer = Writer(initial)
    thread = threading.Thread(target=writer.run, name="topic-writer")
    try:
        wait_for(lambda: caught_up(admin, {1, 2, 3}), 30, "a quorum of 1, 2, 3")
        register_brokers(client, [7, 8, 9])  # RPC brokers; node 6 registers itself
        thread.start()

        for new in (4, 5):  # grow: each new controller runs first, known to nobody
            nodes.start(new)
            wait_for(partial(described_voters, nodes, new), 30, f"node {new} up")
            if new == 4:
                voters = admin.add_raft_voter(nodes.voter(new))
                assert [v.node_id for v in voters] == [1, 2, 3, 4]
            else:  # Kafka's AddRaftVoter (key 80), through the broker's KAFKA listener
                listener = {"name": "CONTROLLER", "host": nodes.hosts[new], "port": nodes.port}
                added = kafka_call(nodes, kc.API_ADD_RAFT_VOTER, {
                    "cluster_id": "raftlog-local", "timeout": 30_000, "voter_id": new,
                    "voter_directory_id": None, "listeners": [listener],
                })  # fmt: skip
                assert (added.error_code, added.error_message) == (0, None)
            wait_for(partial(caught_up, admin, set(range(1, new + 1))), 30, f"{new} caught up")

        # bad input: the cluster unchanged
        refused(lambda: admin.add_raft_voter(nodes.voter(4)), ErrorCode.DUPLICATE_VOTER)
        same_address = RaftVoter(7, nodes.hosts[4], nodes.port, nodes.port + 1)
        refused(lambda: admin.add_raft_voter(same_address), ErrorCode.DUPLICATE_VOTER)
        refused(lambda: admin.remove_raft_voter(9), ErrorCode.VOTER_NOT_FOUND)
        unknown = kafka_call(nodes, kc.API_REMOVE_RAFT_VOTER, {
            "cluster_id": None, "voter_id": 9, "voter_directory_id": None,
        })  # fmt: skip
        assert unknown.error_code == ErrorCode.VOTER_NOT_FOUND.code
        not_running = RaftVoter(7, nodes.hosts[BROKER], nodes.port + 10, nodes.port + 11)
        refused(lambda: admin.add_raft_voter(not_running), ErrorCode.REQUEST_TIMED_OUT)
        refused(
            lambda: admin.add_raft_voter(nodes.voter(4), "other"), ErrorCode.INCONSISTENT_CLUSTER_ID
        )
        assert set(quorum(admin)) == {1, 2, 3, 4, 5}

        # shrink: the active controller (if one of 1-3, else 1) and one more of 1-3 leave; the
        # active controller hands its leadership over first
        leader = admin.describe_quorum().leader_id
        first = leader if leader in (1, 2, 3) else 1
        gone = [first, next(n for n in (1, 2, 3) if n != first)]
        kept = next(n for n in (1, 2, 3) if n not in gone)
        staying = sorted([kept, 4, 5])
        for old in gone:
            voters = admin.remove_raft_voter(old)
            assert old not in [v.node_id for v in voters]
            nodes.kill(old)
        wait_for(lambda: caught_up(admin, set(staying)), 30, "a quorum of 4, 5 and one old")

        nodes.kill(4)  # a new voter dies: 3 and 5 are a majority of 3, 4, 5
        created = writer.created
        wait_for(lambda: writer.created > created + 3, 30, "commits without controller 4")
        message = refused(lambda: admin.remove_raft_voter(5), ErrorCode.INVALID_REQUEST)
        assert "no majority" in message  # the old one and dead 4 would be left
        writer.stop.set()
        thread.join(timeout=60)
        assert not thread.is_alive()
        assert writer.failures == [], writer.failures[:5]
        print(f"\n{writer.created} topics created; longest gap {writer.gap_max_s:.2f} s")
        assert writer.gap_max_s < WRITE_GAP_MAX_S

        # a removed controller that comes back, with a log that names it a voter, cannot vote:
        removed = gone[0]
        nodes.start(removed)
        wait_for(lambda: described_voters(nodes, removed) is not None, 30, "the removed one up")
        nodes.kill(5)  # one voter alive of three (the removed one running): no commit
        short = ControllerClient([nodes.address(n) for n in (removed, kept)], deadline_s=3.0)
        try:
            refused(lambda: short.create_topics([pb.CreatableTopic(
                name="no-majority", num_partitions=1, replication_factor=1)]),
                ErrorCode.NOT_CONTROLLER)  # fmt: skip
        finally:
            short.close()
        assert removed in (described_voters(nodes, removed) or []), "it never heard of it"

        for back in (4, 5):  # restarted with the same stale configuration file
            nodes.start(back)
        wait_for(lambda: caught_up(admin, set(staying)), 30, "the three voters again")
        for node_id in staying:
            wait_for(partial(names_voters, nodes, node_id, staying), 15, f"{node_id}'s voters")
        nodes.kill(kept)
        nodes.start(kept)
        wait_for(lambda: caught_up(admin, set(staying)), 30, "the old one back among the three")
        response = client.create_topics(
            [pb.CreatableTopic(name="after", num_partitions=1, replication_factor=1)]
        )
        assert not response.topics[0].error_code
        assert removed not in quorum(admin)

        described = client.call("DescribeCluster", pb.DescribeClusterRequest())
        assert BROKER in [b.broker_id for b in described.brokers if not b.fenced]
        wanted = [nodes.address(n) for n in staying]
        with grpc.insecure_channel(f"{nodes.hosts[BROKER]}:{nodes.port - 1}") as channel:
            stub = bpb_grpc.BrokerServiceStub(channel)

            def broker_names_the_staying_voters() -> bool:
                # the broker follows the metadata: it applies the last VotersRecord soon after
                metadata = stub.Metadata(bpb.MetadataRequest(), timeout=5)
                return sorted(metadata.controller_addresses) == wanted

            wait_for(broker_names_the_staying_voters, 15, "the broker's controller addresses")
    finally:
        writer.stop.set()
        if thread.is_alive():
            thread.join(timeout=60)
        client.close()
        admin.close()
