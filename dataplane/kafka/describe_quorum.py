"""The KAFKA listener's DescribeQuorum (key 55, v0-2): the controller quorum, as Kafka's brokers
answer it by forwarding to the active controller.

The broker asks the controllers (``DescribeQuorum`` of protos/controller.proto; a standby
forwards it to the active controller, which alone knows how far each voter's log matches) and
writes the answer in Kafka's shape: topic ``__cluster_metadata`` partition 0. raftlog's quorum
is pysyncobj's Raft, so the numbers are Raft's, mapped as honestly as they go:

- ``leader_id``: the active controller; ``leader_epoch``: the Raft term;
- ``high_watermark``: the Raft commit index (entries committed, no-ops and membership entries
  included, so it is not the metadata offset the brokers' images count);
- each voter's ``log_end_offset``: its Raft match index as the leader knows it (the leader's
  own: its last log index; -1 where unknown: an answer from a standby, or a voter that has
  confirmed nothing since the election);
- each observer (every registered broker: it follows the metadata) ``log_end_offset``: the
  metadata offset its last heartbeat reported (-1 until one has);
- ``last_fetch_timestamp`` / ``last_caught_up_timestamp`` (v1+): the leader's are now, as in
  Kafka; pysyncobj's leader pushes entries instead of serving fetches and keeps no times, so
  the others' are -1 ("unknown", which Kafka's schema allows);
- ``nodes`` (v2): each voter with its CONTROLLER listener (the gRPC address raftlog's
  controllers serve; Kafka clients cannot speak to it, it is listed for what it is).

It needs DESCRIBE on the cluster (Kafka's ControllerApis), checked here before forwarding.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from dataplane.kafka import codec as kc
from metadata_quorum.client import ControllerClient
from metadata_quorum.request_authorization import authorized
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl
from protos import controller_pb2 as cpb
from raftlog.errors import ErrorCode, KafkaError

METADATA_TOPIC = "__cluster_metadata"
CONTROLLER_LISTENER = "CONTROLLER"
DESCRIBE_DEADLINE_S = 10.0
NO_DIRECTORY = uuid.UUID(int=0)  # raftlog knows a voter by id and address, not directory id


def _replica(node_id: int, log_end_offset: int, now_ms: int | None) -> dict[str, Any]:
    stamp = -1 if now_ms is None else now_ms
    return {
        "replica_id": node_id,
        "replica_directory_id": NO_DIRECTORY,
        "log_end_offset": log_end_offset,
        "last_fetch_timestamp": stamp,
        "last_caught_up_timestamp": stamp,
    }


def _host_port(address: str) -> tuple[str, int] | None:
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def quorum_partition(answer: cpb.DescribeQuorumResponse, now_ms: int) -> dict[str, Any]:
    """``__cluster_metadata`` partition 0 of a DescribeQuorum answer, from the controllers'."""
    partition: dict[str, Any] = {
        "partition_index": 0, "error_code": 0, "error_message": None,
        "leader_id": answer.leader_id, "leader_epoch": answer.term,
        "high_watermark": answer.commit_index, "current_voters": [], "observers": [],
    }  # fmt: skip
    if answer.leader_id < 0:
        return {**partition, "error_code": ErrorCode.NOT_LEADER_OR_FOLLOWER.code,
                "error_message": "the controller quorum has no leader"}  # fmt: skip
    partition["current_voters"] = [
        _replica(v.node_id, v.match_index, now_ms if v.node_id == answer.leader_id else None)
        for v in answer.voters
    ]
    partition["observers"] = [
        _replica(o.node_id, o.metadata_offset, None) for o in answer.observers
    ]
    return partition


def quorum_nodes(answer: cpb.DescribeQuorumResponse) -> list[dict[str, Any]]:
    nodes = []
    for voter in answer.voters:
        endpoint = _host_port(voter.address)
        listeners = [] if endpoint is None else [
            {"name": CONTROLLER_LISTENER, "host": endpoint[0], "port": endpoint[1]}
        ]  # fmt: skip
        nodes.append({"node_id": voter.node_id, "listeners": listeners})
    return nodes


class KafkaDescribeQuorum:
    """DescribeQuorum, forwarded to the controllers through the broker's controller client."""

    def __init__(
        self,
        controller: ControllerClient,
        access: AccessControl = ALLOW_ALL,
        wall_clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.controller = controller
        self.access = access
        self.wall_clock_ms = wall_clock_ms

    def handlers(self) -> dict[int, Callable[[kc.Request], kc.Data]]:
        return {kc.API_DESCRIBE_QUORUM: self.describe_quorum}

    def describe_quorum(self, request: kc.Request) -> kc.Data:
        out: dict[str, Any] = {"error_code": 0, "error_message": None, "topics": [], "nodes": []}
        asked = [(t.topic_name, p.partition_index) for t in request.body.topics
                 for p in t.partitions]  # fmt: skip
        if asked != [(METADATA_TOPIC, 0)]:
            unknown = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code
            return {**out, "topics": [
                {"topic_name": t.topic_name, "partitions": [
                    {"partition_index": p.partition_index, "error_code": unknown,
                     "error_message": f"only {METADATA_TOPIC}-0 is a quorum",
                     "leader_id": -1, "leader_epoch": -1, "high_watermark": -1,
                     "current_voters": [], "observers": []}
                    for p in t.partitions
                ]}
                for t in request.body.topics
            ]}  # fmt: skip
        try:
            answer = authorized(
                self.access, "DescribeQuorum", cpb.DescribeQuorumRequest(),
                lambda r: self.controller.checked(
                    "DescribeQuorum", r, any_node=True, deadline_s=DESCRIBE_DEADLINE_S
                ),
            )  # fmt: skip
        except KafkaError as error:
            return {**out, "error_code": error.error.code, "error_message": error.message}
        return {
            **out,
            "topics": [{
                "topic_name": METADATA_TOPIC,
                "partitions": [quorum_partition(answer, self.wall_clock_ms())],
            }],
            "nodes": quorum_nodes(answer),
        }  # fmt: skip
