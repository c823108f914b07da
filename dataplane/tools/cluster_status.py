"""What ``raftlog cluster status`` shows: each node's pid, controller role (``broker`` for a
broker-only node), Raft match index and lag as the active controller sees them, and broker state
(unfenced, fenced, shutting down; ``cordoned`` added when it takes no new replicas) from the
active controller."""

from __future__ import annotations

import grpc

from dataplane.tools.local_cluster import LocalCluster
from metadata_quorum.client import ControllerClient
from protos import controller_pb2 as pb
from raftlog.errors import KafkaError


def cluster_status_rows(cluster: LocalCluster) -> list[dict[str, object]]:
    client: ControllerClient = cluster.client()
    try:
        quorum = _describe_quorum(cluster, client)
        brokers = _broker_states(client) if quorum is not None else {}
    finally:
        client.close()
    voters = {v.node_id: v for v in quorum.voters} if quorum else {}
    controllers = cluster.controller_specs
    rows: list[dict[str, object]] = []
    for spec in cluster.specs:
        pid = cluster.pid(spec.node_id)
        voter = voters.get(spec.node_id)
        if pid is None:
            role = "down"
        elif spec not in cluster.controller_specs:
            role = "broker"
        elif quorum is not None and quorum.leader_id == spec.node_id:
            role = "active controller"
        else:
            role = "controller"
        rows.append(
            {
                "node": spec.node_id,
                "address": f"{spec.host}:{cluster.port}" if voter or spec in controllers else "-",
                "pid": pid if pid is not None else "-",
                "role": role,
                "match": voter.match_index if voter and voter.match_index >= 0 else "-",
                "lag": voter.lag if voter and voter.lag >= 0 else "-",
                "broker": brokers.get(spec.node_id, "-") if pid is not None else "-",
            }
        )
    return rows


def _describe_quorum(
    cluster: LocalCluster, client: ControllerClient
) -> pb.DescribeQuorumResponse | None:
    """The first live node's DescribeQuorum answer given by the active controller, the only
    node that knows the voters' match indexes: any controller's answer is (a standby forwards
    the request), unless the active controller did not answer the standby; such an answer is
    kept only if no node does better."""
    best = None
    for spec in cluster.controller_specs:
        if cluster.pid(spec.node_id) is None:
            continue
        try:
            quorum = client.describe_quorum(f"{spec.host}:{cluster.port}")
        except grpc.RpcError:
            continue
        if _from_active_controller(quorum):
            return quorum
        if best is None or (best.leader_id < 0 <= quorum.leader_id):
            best = quorum
    return best


def _from_active_controller(quorum: pb.DescribeQuorumResponse) -> bool:
    """The answer holds the leader's own match index (its last index), known only there."""
    leader = next((v for v in quorum.voters if v.node_id == quorum.leader_id), None)
    return leader is not None and leader.match_index >= 0


def _broker_states(client: ControllerClient) -> dict[int, str]:
    try:
        described = client.call("DescribeCluster", pb.DescribeClusterRequest(), deadline_s=3.0)
    except KafkaError:  # no active controller: the broker column stays "-"
        return {}
    states = {}
    for b in described.brokers:
        state = (
            "shutting down" if b.in_controlled_shutdown else ("fenced" if b.fenced else "unfenced")
        )
        states[b.broker_id] = f"{state}, cordoned" if b.cordoned else state
    return states
