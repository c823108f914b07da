"""Helpers for tests that run a real controller quorum: brokers that register by RPC, waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port
from metadata_quorum.client import ControllerClient
from protos import controller_pb2 as pb
from protos import metadata_pb2 as mpb

T = TypeVar("T")
POLL_S = 0.05


def wait_for(condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(POLL_S)  # polling a condition with a deadline
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def make_cluster(root: Path, first_host: int, **kwargs: Any) -> LocalCluster:
    hosts = [f"127.0.0.{first_host + n}" for n in range(3)]
    overrides: dict[str, str | int] = {
        "broker.session.timeout.ms": 600_000,
        "controller.quorum.election.timeout.ms": 600,
    }
    overrides.update(kwargs.pop("overrides", {}))
    return LocalCluster(
        root, nodes=3, first_host=first_host, port=pick_cluster_port(hosts),
        overrides=overrides, roles="controller", **kwargs,
    )  # fmt: skip


def register_brokers(client: ControllerClient, broker_ids: list[int]) -> dict[int, int]:
    """Register brokers (no processes: the RPCs a broker makes) and unfence them; their epochs."""
    epochs = {}
    for broker_id in broker_ids:
        response = client.checked(
            "RegisterBroker",
            pb.RegisterBrokerRequest(
                broker_id=broker_id,
                incarnation_id=f"test-incarnation-{broker_id}",
                endpoints=[mpb.Endpoint(name="BROKER", host="127.0.0.1", port=9000 + broker_id)],
            ),
        )
        epochs[broker_id] = response.broker_epoch
    for broker_id, epoch in epochs.items():
        heartbeat = client.checked(
            "BrokerHeartbeat",
            pb.BrokerHeartbeatRequest(
                broker_id=broker_id, broker_epoch=epoch, current_metadata_offset=2**62
            ),
        )
        assert not heartbeat.is_fenced
    return epochs


def create_topics(client: ControllerClient, names: list[str], partitions: int = 3) -> None:
    response = client.create_topics(
        [pb.CreatableTopic(name=n, num_partitions=partitions, replication_factor=3) for n in names]
    )
    errors = {t.name: t.error_message for t in response.topics if t.error_code}
    assert not errors, errors


def describe_node(cluster: LocalCluster, node_id: int) -> pb.DescribeTopicsResponse | None:
    """DescribeTopics answered by one node (its own committed image), or None if unreachable."""
    spec = cluster.spec(node_id)
    client = ControllerClient([f"{spec.host}:{cluster.port}"])
    try:
        response: pb.DescribeTopicsResponse = client.stub(
            f"{spec.host}:{cluster.port}"
        ).DescribeTopics(pb.DescribeTopicsRequest(), timeout=2.0)
        return response
    except grpc.RpcError:
        return None
    finally:
        client.close()


def topic_summary(response: pb.DescribeTopicsResponse) -> dict[str, tuple[bytes, int]]:
    return {t.name: (t.topic_id, len(t.partitions)) for t in response.topics}
