"""``controller.quorum.bootstrap.servers`` (KIP-853) and cordoned brokers, with real processes on
127.0.0.242-245: three combined nodes, and a fourth on 245 that knows only bootstrap servers.

A broker-only node given only the bootstrap servers (what ``raftlog cluster add-node`` writes)
registers, is unfenced, learns the voters from the metadata and takes a replica in a
reassignment. Cordoned (``raftlog cluster cordon``), it gets no replica of a new topic and an
explicit move onto it is refused, naming the cordon, while it keeps its replica; the cordon
outlives its restart and a restart of the active controller, until ``uncordon``. A controller
given only the bootstrap servers starts as an observer and becomes a voter with
``raftlog quorum add-controller --config``."""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from dataplane.client import AdminClient, NewTopic, Producer
from dataplane.server.config import NodeConfig
from dataplane.tools.cluster_status import cluster_status_rows
from dataplane.tools.entry import COMMAND as RAFTLOG
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port, wait_for
from dataplane.tools.owned_process import popen_owned
from metadata_quorum.client import ControllerClient
from protos import controller_pb2 as pb
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import RANGES, fetch, read_all, wait_for_leaders

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-bootstrap-servers")]
SPAN = 4  # three combined nodes and the one that joins with bootstrap servers only


@contextmanager
def three_nodes(root: Path) -> Iterator[LocalCluster]:
    """Three combined nodes, on a port free on all SPAN addresses (the fourth comes later)."""
    first_host = RANGES["bootstrap_servers"]
    hosts = [f"127.0.0.{first_host + n}" for n in range(SPAN)]
    cluster = LocalCluster(root, nodes=3, first_host=first_host, port=pick_cluster_port(hosts))
    try:
        cluster.up()
        yield cluster
    except BaseException:
        for spec in cluster.specs:
            if spec.log_path.exists():
                print(f"---- {spec.log_path}\n{spec.log_path.read_text()[-4000:]}")
        raise
    finally:
        cluster.down()


def raftlog(*args: str) -> str:
    done = subprocess.run(
        [*RAFTLOG, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def brokers(admin: AdminClient) -> dict[int, tuple[bool, bool]]:
    """broker id -> (fenced, cordoned), as the active controller answers."""
    return {b.broker_id: (b.fenced, b.cordoned) for b in admin.describe_cluster().brokers}


def replicas_of(admin: AdminClient, topic: str) -> dict[int, tuple[int, ...]]:
    return {p.partition: p.replicas for p in admin.describe_topics([topic])[topic].partitions}


def test_a_broker_with_bootstrap_servers_registers_takes_replicas_and_can_be_cordoned(
    tmp_path: Path,
) -> None:
    with three_nodes(tmp_path) as cluster:
        node = cluster.add_node()  # registered and unfenced, or it raises
        assert node == 4
        written = cluster.spec(4).config_path.read_text()
        assert '"controller.quorum.bootstrap.servers" = ' in written
        assert "controller.quorum.voters" not in written
        assert NodeConfig.load(cluster.spec(4).config_path, {}).voters == []
        bootstrap = ",".join(cluster.bootstrap_servers)
        with AdminClient(cluster.bootstrap_servers) as admin:
            assert brokers(admin)[4] == (False, False)

            # it takes a replica in a reassignment and serves it
            assignment = {0: (1, 2, 3), 1: (2, 3, 1)}
            assert admin.create_topics([NewTopic("boot", replica_assignment=assignment)]) == {
                "boot": None
            }
            wait_for_leaders(cluster, "boot", 2)
            with Producer(cluster.bootstrap_servers, acks="all") as producer:
                for n in range(50):
                    producer.send("boot", f"{n:03d}".encode(), partition=0)
                producer.flush()
            moved = admin.alter_partition_reassignments({("boot", 0): (4, 2, 3)})
            assert set(moved.values()) == {None}
            wait_for(
                "the move onto broker 4",
                lambda: not admin.list_partition_reassignments() or None,
                timeout_s=90,
            )
            after = admin.describe_topics(["boot"])["boot"].partitions[0]
            assert after.replicas == (4, 2, 3) and set(after.isr) == {2, 3, 4}
            # its preferred leader now: broker 4 leads it and serves every record
            elected = admin.elect_leaders("preferred")
            assert all(
                e is None or e.error is ErrorCode.ELECTION_NOT_NEEDED for e in elected.values()
            ), elected
            wait_for_leaders(cluster, "boot", 2)
            address = cluster.broker_address(4)
            wait_for(
                "broker 4 to serve the partition",
                lambda: fetch(address, "boot", 0, 0).high_watermark >= 50 or None,
            )
            stored = [r.value for r in read_all(address, "boot", 0, 50)]
            assert stored == [f"{n:03d}".encode() for n in range(50)]

            # cordoned: no new replicas on it; the one it has stays
            out = raftlog("cluster", "cordon", "4", "--bootstrap-server", bootstrap)
            assert "broker 4 cordoned" in out and "its replicas (1)" in out
            assert brokers(admin)[4] == (False, True)
            assert admin.create_topics([NewTopic("fresh", 8, 3)]) == {"fresh": None}
            placed = replicas_of(admin, "fresh")
            assert all(4 not in r for r in placed.values()), placed
            refused = admin.alter_partition_reassignments({("fresh", 0): (4, 1, 2)})
            error = refused[next(iter(refused))]
            assert error is not None and error.error is ErrorCode.INVALID_REPLICA_ASSIGNMENT
            assert "cordoned" in error.message
            assert replicas_of(admin, "fresh") == placed, "nothing changed"
            assert replicas_of(admin, "boot")[0] == (4, 2, 3)

            # the cordon outlives the broker's restart and the active controller's
            cluster.restart_node(4)
            cluster.wait_for_brokers([4], timeout_s=60)
            assert brokers(admin)[4] == (False, True)
            cluster.restart_node(cluster.wait_for_leader())  # it hands the leadership over
            cluster.wait_for_leader(timeout_s=60)
            cluster.wait_for_brokers(timeout_s=60)
            assert brokers(admin)[4] == (False, True)
            status = {row["node"]: row["broker"] for row in cluster_status_rows(cluster)}
            assert status[4] == "unfenced, cordoned", status

            # uncordoned: placement uses it again
            out = raftlog("cluster", "uncordon", "4", "--bootstrap-server", bootstrap)
            assert "broker 4 uncordoned" in out
            assert brokers(admin)[4] == (False, False)
            assert admin.create_topics([NewTopic("later", 8, 3)]) == {"later": None}
            counts = Counter(b for r in replicas_of(admin, "later").values() for b in r)
            # the first replicas go round all four brokers: broker 4 leads two at least
            assert counts[4] >= 2, counts


def controller_config(cluster: LocalCluster, root: Path) -> Path:
    """Node 4 on the fourth address: a controller that knows only the bootstrap servers."""
    host = f"127.0.0.{RANGES['bootstrap_servers'] + 3}"
    config = NodeConfig.parse({
        "node.id": 4,
        "process.roles": "controller",
        "controller.quorum.bootstrap.servers": ",".join(cluster.controller_addresses),
        "listeners": f"CONTROLLER://{host}:{cluster.port}",
        "log.dirs": str(root / "node-4" / "data"),
    })  # fmt: skip
    path = root / "node-4" / "node.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config.to_toml())
    return path


def describe_at(address: str) -> pb.DescribeClusterResponse:
    """DescribeCluster as the controller at ``address`` answers it (not following hints)."""
    client = ControllerClient([address])
    try:
        answer: pb.DescribeClusterResponse = client.stub(address).DescribeCluster(
            pb.DescribeClusterRequest(), timeout=2.0
        )
    finally:
        client.close()
    return answer


def voters_named_by(address: str) -> list[int] | None:
    """The voters the controller at ``address`` names (None while it does not answer)."""
    try:
        answer = describe_at(address)
    except grpc.RpcError:
        return None
    return [v.node_id for v in answer.voters]


def test_a_controller_with_bootstrap_servers_joins_through_add_controller(
    tmp_path: Path,
) -> None:
    with three_nodes(tmp_path / "cluster") as cluster:
        config = controller_config(cluster, tmp_path)
        address = NodeConfig.load(config, {}).controller_voter().address
        with (config.parent / "node.log").open("ab") as log:
            proc = popen_owned(
                [*RAFTLOG, "node", "--config", str(config)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        try:
            # an observer: it serves, learned the voters from the quorum, and does not vote;
            # with no entries yet it sends reads to the active controller (NOT_CONTROLLER)
            learned = wait_for("node 4 to answer", lambda: voters_named_by(address), timeout_s=60)
            assert learned == [1, 2, 3]
            assert describe_at(address).status.error_code == ErrorCode.NOT_CONTROLLER.code
            controllers = ",".join(cluster.controller_addresses)
            with AdminClient(bootstrap_controllers=cluster.controller_addresses) as admin:
                assert {v.node_id for v in admin.describe_quorum().voters} == {1, 2, 3}
                added = raftlog(
                    "quorum", "add-controller", "--config", str(config),
                    "--bootstrap-controller", controllers,
                )  # fmt: skip
                assert "controller 4 added" in added, added

                def caught_up() -> bool:
                    lags = {v.node_id: v.lag for v in admin.describe_quorum().voters}
                    return set(lags) == {1, 2, 3, 4} and 0 <= lags[4] <= 5

                wait_for("controller 4 to catch up as a voter", caught_up, timeout_s=60)
                wait_for(
                    "node 4 to know it votes",
                    lambda: voters_named_by(address) == [1, 2, 3, 4],
                    timeout_s=30,
                )
                # the quorum commits with it: a write goes through
                assert admin.create_topics([NewTopic("after-join", 1, 1)]) == {"after-join": None}
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_a_controller_with_bootstrap_servers_and_no_quorum_does_not_start(
    tmp_path: Path,
) -> None:
    """Bootstrap servers join a running quorum: with none answering, the node says so and
    exits instead of starting a quorum of its own."""
    host = f"127.0.0.{RANGES['bootstrap_servers'] + 3}"
    port = pick_cluster_port([host])
    config = NodeConfig.parse({
        "node.id": 9,
        "process.roles": "controller",
        "controller.quorum.bootstrap.servers": f"{host}:{port + 10}",
        "listeners": f"CONTROLLER://{host}:{port}",
        "log.dirs": str(tmp_path / "data"),
    })  # fmt: skip
    path = tmp_path / "node.toml"
    path.write_text(config.to_toml())
    done = subprocess.run(
        [*RAFTLOG, "node", "--config", str(path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "error: controller.quorum.bootstrap.servers" in done.stderr
    assert "bootstrap servers join a running quorum" in " ".join(done.stderr.split())
