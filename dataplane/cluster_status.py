"""What ``raftlog cluster status`` shows: each node's pid, role and Raft replication lag."""

from __future__ import annotations

import grpc

from dataplane.local_cluster import LocalCluster
from metadata_quorum.client import ControllerClient


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
            }
        )
    return rows
