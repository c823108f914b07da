"""Cut the active controller off with iptables: the majority goes on, the minority commits nothing;
cut one voter off from the leader alone: nothing moves (pre-vote).

Each controller runs as its own system user on 127.0.0.61-63 so rules can match the socket owner
(see chaos/network.py); every rule is removed when the NetworkFaults context exits, also on
failure, and every node process is killed by its pid.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from chaos.network import (
    NetworkFaults,
    NodeIdentity,
    ensure_node_identity,
    node_user_name,
    prepare_data_dir,
    prepare_runtime,
    spawn,
)
from dataplane.tools.local_cluster import LocalCluster
from metadata_quorum.client import ControllerClient
from protos import controller_pb2 as pb
from tests.metadata_quorum.quorum_support import (
    create_topics,
    describe_node,
    make_cluster,
    register_brokers,
    topic_summary,
    wait_for,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("quorum-partition"),
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="iptables and node users need root"),
]
FIRST_HOST = 61
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def identities() -> dict[int, NodeIdentity]:
    out = {}
    for n in range(1, 4):
        host = FIRST_HOST + n - 1
        out[n] = ensure_node_identity(node_user_name(host), [f"127.0.0.{host}"])
    modules = ("raftlog", "metadata_quorum", "dataplane", "protos", "grpc", "pysyncobj")
    prepare_runtime(out[1], Path(sys.executable), REPO, modules)
    return out


@pytest.fixture
def partitioned(
    tmp_path: Path, identities: dict[int, NodeIdentity]
) -> Iterator[tuple[LocalCluster, NetworkFaults]]:
    def launcher(node_id: int, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        prepare_data_dir(identities[node_id], log_path.parent)
        with log_path.open("ab") as out:
            return spawn(identities[node_id], argv, cwd=REPO, stdout=out, stderr=out)

    cluster = make_cluster(tmp_path / "cluster", first_host=FIRST_HOST, launcher=launcher)
    # Enter the faults context before the nodes start, so connections are attributed right.
    with NetworkFaults(list(identities.values())) as faults:
        try:
            cluster.up(timeout_s=30)
            yield cluster, faults
        finally:
            for spec in cluster.specs:
                cluster.stop_node(spec.node_id, kill=True)


def test_isolated_active_controller_commits_nothing_and_catches_up_after_heal(
    partitioned: tuple[LocalCluster, NetworkFaults], identities: dict[int, NodeIdentity]
) -> None:
    cluster, faults = partitioned
    client = cluster.client()
    try:
        old = _with_a_topic(cluster, client, "before-partition")
        faults.isolate(identities[old], [i for n, i in identities.items() if n != old])

        majority = [f"{s.host}:{cluster.port}" for s in cluster.specs if s.node_id != old]
        majority_client = ControllerClient(majority, deadline_s=30)
        try:
            create_topics(majority_client, ["during-partition"])
        finally:
            majority_client.close()
        new = wait_for(
            lambda: next((n for n in range(1, 4) if n != old and _leads(cluster, n)), None),
            15,
            "a new active controller in the majority",
        )
        assert new != old

        # A write sent to the isolated node cannot commit: it is refused or times out.
        old_address = f"{cluster.spec(old).host}:{cluster.port}"
        minority = ControllerClient([old_address])
        try:
            request = pb.CreateTopicsRequest(
                topics=[pb.CreatableTopic(name="minority-write", num_partitions=1)]
            )
            try:
                answer = minority.stub(old_address).CreateTopics(request, timeout=15)
                assert answer.status.error_code != 0, "the isolated controller committed a write"
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        finally:
            minority.close()

        described = describe_node(cluster, new)
        assert described is not None
        expected = topic_summary(described)
        assert set(expected) == {"before-partition", "during-partition"}

        faults.heal()
        wait_for(
            lambda: (d := describe_node(cluster, old)) is not None and topic_summary(d) == expected,
            30,
            "the healed node to catch up with the majority",
        )
        create_topics(client, ["after-heal"])
    finally:
        client.close()


def test_a_controller_cut_off_from_the_leader_alone_does_not_unseat_it(
    partitioned: tuple[LocalCluster, NetworkFaults], identities: dict[int, NodeIdentity]
) -> None:
    """KIP-996's pre-vote and Raft's leader stickiness (metadata_quorum/raft.py, `_PreVote`).
    A voter that cannot hear the active controller while the third voter can asks, once its
    election timer runs out, whether the others would elect it; the third refuses while it
    hears the leader, so no term moves and the leader keeps leading. Without it the cut-off
    voter raised its term every election timeout and the third, taking the later term,
    stopped following the leader: a new election each time."""
    cluster, faults = partitioned
    client = cluster.client()
    try:
        leader = _with_a_topic(cluster, client, "before-cut")
        term = _term(cluster, leader)
        cut_off = next(n for n in range(1, 4) if n != leader)
        log = cluster.spec(cut_off).log_path
        faults.cut(identities[cut_off], identities[leader])
        wait_for(
            lambda: "(pre-vote round 4)" in log.read_text(errors="replace"),
            30,
            "four pre-vote rounds of the cut-off voter",
        )
        create_topics(client, ["during-cut"])  # the leader commits with the third voter
        assert _leads(cluster, leader)
        assert [_term(cluster, n) for n in range(1, 4)] == [term] * 3

        faults.heal()
        expected = topic_summary(describe_node(cluster, leader) or pb.DescribeTopicsResponse())
        assert set(expected) == {"before-cut", "during-cut"}
        wait_for(
            lambda: (d := describe_node(cluster, cut_off)) and topic_summary(d) == expected,
            30,
            "the cut-off voter to catch up",
        )
        assert [_term(cluster, n) for n in range(1, 4)] == [term] * 3
        assert _leads(cluster, leader)
    finally:
        client.close()


def _with_a_topic(cluster: LocalCluster, client: ControllerClient, topic: str) -> int:
    """Three registered brokers and ``topic`` committed; the active controller's id."""
    register_brokers(client, [1, 2, 3])
    create_topics(client, [topic])
    return cluster.wait_for_leader()


def _term(cluster: LocalCluster, node_id: int) -> int:
    quorum = _quorum(cluster, node_id)
    assert quorum is not None, f"node {node_id} did not answer DescribeQuorum"
    return int(quorum.term)


def _leads(cluster: LocalCluster, node_id: int) -> bool:
    quorum = _quorum(cluster, node_id)
    return bool(quorum is not None and quorum.leader_id == node_id and quorum.has_quorum)


def _quorum(cluster: LocalCluster, node_id: int) -> pb.DescribeQuorumResponse | None:
    """The quorum as one node sees it; None if it does not answer."""
    spec = cluster.spec(node_id)
    client = ControllerClient([f"{spec.host}:{cluster.port}"])
    try:
        return client.describe_quorum(f"{spec.host}:{cluster.port}")
    except grpc.RpcError:
        return None
    finally:
        client.close()
