"""What ``raftlog cluster status`` shows: each node's pid, controller role, Raft replication
lag, and broker state (unfenced, fenced, shutting down) from the active controller."""

from __future__ import annotations

import grpc

from dataplane.tools.local_cluster import LocalCluster
from metadata_quorum.client import ControllerClient
from protos import controller_pb2 as pb
from raftlog.errors import KafkaError


def cluster_status_rows(cluster: LocalCluster) -> list[dict[str, object]]:
    client: ControllerClient = cluster.client()
    quorum = None
    try:
        for spec in cluster.specs:
            if cluster.pid(spec.node_id) is None:
                continue
            try:
                quorum = client.describe_quorum(f"{spec.host}:{cluster.port}")
            except grpc.RpcError:
                continue
            if quorum.leader_id >= 0:
                break
        brokers = _broker_states(client) if quorum is not None else {}
    finally:
        client.close()
    voters = {v.node_id: v for v in quorum.voters} if quorum else {}
    rows: list[dict[str, object]] = []
    for spec in cluster.specs:
        pid = cluster.pid(spec.node_id)
        voter = voters.get(spec.node_id)
        if pid is None:
            role = "down"
        elif quorum is not None and quorum.leader_id == spec.node_id:
            role = "active controller"
        else:
            role = "controller"
        rows.append(
            {
                "node": spec.node_id,
                "address": f"{spec.host}:{cluster.port}",
                "pid": pid if pid is not None else "-",
                "role": role,
                "match": voter.match_index if voter and voter.match_index >= 0 else "-",
                "lag": voter.lag if voter and voter.lag >= 0 else "-",
                "broker": brokers.get(spec.node_id, "-") if pid is not None else "-",
            }
        )
    return rows


def _broker_states(client: ControllerClient) -> dict[int, str]:
    try:
        described = client.call("DescribeCluster", pb.DescribeClusterRequest(), deadline_s=3.0)
    except KafkaError:  # no active controller: the broker column stays "-"
        return {}
    return {
        b.broker_id: "shutting down"
        if b.in_controlled_shutdown
        else ("fenced" if b.fenced else "unfenced")
        for b in described.brokers
    }
