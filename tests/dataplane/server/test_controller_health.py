"""The CONTROLLER listener's health follows the metadata quorum (docs/api.md "Health"), against
three real combined nodes: a controller cut off from the majority of the voters says
NOT_SERVING, and SERVING again once the majority is back (`QuorumController.in_serving_quorum`).

The other two nodes are paused (SIGSTOP), not killed: their sockets stay open and nothing tells
the survivor they are gone but the silence, as in a network partition; the test does not restart
anything, so it stays short. A paused node is resumed (SIGCONT) in a ``finally``, and
`running_cluster` stops every node by its pid."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dataplane.tools.local_cluster import LocalCluster, wait_for
from tests.dataplane.cluster_support import running_cluster

pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("grpc-product")]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
CONTROLLER_SERVICE = "raftlog.controller.v1.ControllerService"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "cluster", "controller_health") as running:
        yield running


def _status(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        status: int = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
        return status


def _name(status: int) -> str:
    name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
    return name


def test_a_controller_cut_off_from_the_majority_is_not_serving_until_it_is_back(
    cluster: LocalCluster,
) -> None:
    # the survivor is the active controller: the harder case, a leader that must notice it
    # leads no majority any more (a follower would also see its leader go)
    survivor = cluster.wait_for_leader()
    address = f"{cluster.spec(survivor).host}:{cluster.port}"
    others = [s.node_id for s in cluster.specs if s.node_id != survivor]
    seen = [_status(address)]
    assert seen == [SERVING]
    assert _status(address, CONTROLLER_SERVICE) == SERVING
    try:
        for node_id in others:
            cluster.signal_node(node_id, signal.SIGSTOP)
        wait_for("NOT_SERVING", lambda: _status(address) == NOT_SERVING, 30)
        seen.append(NOT_SERVING)
        assert _status(address, CONTROLLER_SERVICE) == NOT_SERVING, "every name shares one status"
    finally:
        for node_id in others:
            cluster.signal_node(node_id, signal.SIGCONT)
    wait_for("SERVING again", lambda: _status(address) == SERVING, 30)
    seen.append(SERVING)
    print(f"controller {survivor}, the other two paused and resumed:", [_name(s) for s in seen])
    assert _status(address, CONTROLLER_SERVICE) == SERVING
