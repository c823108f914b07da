"""A broker restarted at once after a SIGKILL serves no client before it has caught up with
the metadata (Kafka enables request processing only then). Its old incarnation's session still
lives, so the controller refuses the new registration for up to a session timeout: all that
time the new process is up with an image that lacks its registration. Before this gate it
answered Metadata from a half-replayed image (``UNKNOWN_TOPIC_OR_PARTITION`` for a topic that
exists), and a producer failed every queued batch on that answer (a CI failure of the demo)."""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import pytest

from dataplane.tools.local_cluster import wait_for
from protos import broker_pb2 as pb
from tests.dataplane.cluster_support import (
    create_topic,
    produce,
    running_cluster,
    stub,
    values_batch,
)

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("dataplane-restart")]
SESSION_TIMEOUT_MS = 8000


def _kafka_connection_is_refused(address: str) -> bool | None:
    """True if the listener closes a new connection without answering an ApiVersions, False if
    it answers, None if it is not listening yet (the gRPC server starts a moment before it)."""
    host, port = address.rsplit(":", 1)
    try:
        connection = socket.create_connection((host, int(port)), timeout=5)
    except ConnectionRefusedError:
        return None
    with connection:
        # ApiVersions v0, correlation id 7, client id "t": the listener closes before reading.
        body = b"\x00\x12\x00\x00\x00\x00\x00\x07\x00\x01t"
        try:
            connection.sendall(len(body).to_bytes(4, "big") + body)
            return connection.recv(4) == b""
        except ConnectionResetError:
            return True


def _still_catching_up(address: str) -> bool:
    try:
        stub(address).Metadata(pb.MetadataRequest(topics=["rs"]), timeout=2)
    except grpc.RpcError as error:
        return "catching up" in (error.details() or "")
    return False


def test_a_restarted_broker_refuses_clients_until_it_has_caught_up(tmp_path: Path) -> None:
    overrides: dict[str, str | int] = {"broker.session.timeout.ms": SESSION_TIMEOUT_MS}
    with running_cluster(tmp_path, "restart", overrides) as cluster:
        leader = create_topic(cluster, "rs", 3, 3)[0].leader_id
        answer = produce(cluster.broker_address(leader), "rs", 0, values_batch([b"kept"]))
        assert answer.error_code == 0, answer.error_message
        cluster.stop_node(leader, kill=True)
        cluster.start_node(leader)
        address = cluster.broker_address(leader)
        refusals: list[str] = []
        kafka_refused: list[bool] = []

        def answered() -> pb.MetadataResponse | None:
            try:
                response: pb.MetadataResponse = stub(address).Metadata(
                    pb.MetadataRequest(topics=["rs"]), timeout=2
                )
                return response
            except grpc.RpcError as error:
                assert error.code() is grpc.StatusCode.UNAVAILABLE, error
                if "catching up" in (error.details() or ""):
                    probed = _kafka_connection_is_refused(cluster.kafka_address(leader))
                    # a probe served counts only if the broker still refused gRPC after it: it
                    # may have caught up between the refusal above and the probe (both
                    # listeners open on the same event)
                    if probed or (probed is False and _still_catching_up(address)):
                        kafka_refused.append(probed)
                    refusals.append(error.details() or "")
                return None

        response = wait_for("the restarted broker to serve", answered, timeout_s=60)
        assert refusals, "the restarted broker was never seen refusing while catching up"
        assert kafka_refused, "the Kafka listener was never probed while catching up"
        assert all(kafka_refused), "the Kafka listener served before catching up"
        topic = response.topics[0]
        assert topic.error_code == 0, topic.error_message
        assert len(topic.partitions) == 3
