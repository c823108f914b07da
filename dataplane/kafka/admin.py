"""The KAFKA listener's admin APIs: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
AlterConfigs and IncrementalAlterConfigs (dataplane/kafka/alter_configs.py), DescribeCluster,
AlterPartitionReassignments, ListPartitionReassignments, UnregisterBroker,
AddRaftVoter and RemoveRaftVoter.

As a KRaft broker forwards admin requests to the active controller (KIP-590), each request is
turned into the controller's own RPC and sent through the broker's controller client, which
follows the active controller; the controller validates, commits the records and answers with
Kafka's error codes, which are passed on per topic or resource. DescribeCluster is answered from
the broker's metadata image, with the brokers' KAFKA endpoints. Kafka clients cannot reach
controllers, so wherever the protocol names "the controller" (Metadata, DescribeCluster) this
broker names itself, as Kafka's brokers name a live broker: it forwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from dataplane.kafka import codec as kc
from dataplane.kafka.alter_configs import (
    RESOURCE_TYPES,
    alter_configs,
    incremental_alter_configs,
)
from metadata_quorum.client import ControllerClient
from metadata_quorum.image import MetadataImage
from metadata_quorum.request_authorization import authorized, check_cluster
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl
from protos import controller_pb2 as cpb
from protos import metadata_pb2 as mpb
from raftlog.errors import ErrorCode, KafkaError

ENDPOINT_TYPE_BROKERS = 1  # DescribeCluster v1: 1 brokers, 2 controllers
FORWARD_DEADLINE_S = 30.0


def _failed(error: KafkaError) -> dict[str, Any]:
    return {"error_code": error.error.code, "error_message": error.message}


def _outcome(code: int, message: str) -> dict[str, Any]:
    return {"error_code": code, "error_message": message or None}


class KafkaAdmin:
    """Admin requests of the KAFKA listener, forwarded to the controller quorum."""

    def __init__(
        self,
        controller: ControllerClient,
        image: Callable[[], MetadataImage],
        broker_id: int,
        cluster_id: str,
        listener: str,
        access: AccessControl = ALLOW_ALL,
    ) -> None:
        self.controller = controller
        # The broker forwards with its own identity, so it authorizes first, as the
        # controller would (metadata_quorum.request_authorization)
        self.access = access
        self.image = image
        self.broker_id = broker_id
        self.cluster_id = cluster_id
        self.listener = listener

    def handlers(self) -> dict[int, Callable[[kc.Request], kc.Data]]:
        return {
            kc.API_CREATE_TOPICS: self.create_topics,
            kc.API_DELETE_TOPICS: self.delete_topics,
            kc.API_CREATE_PARTITIONS: self.create_partitions,
            kc.API_DESCRIBE_CONFIGS: self.describe_configs,
            kc.API_ALTER_CONFIGS: lambda r: alter_configs(self._forward, r),
            kc.API_INCREMENTAL_ALTER_CONFIGS: lambda r: incremental_alter_configs(self._forward, r),
            kc.API_DESCRIBE_CLUSTER: self.describe_cluster,
            kc.API_ALTER_PARTITION_REASSIGNMENTS: self.alter_partition_reassignments,
            kc.API_LIST_PARTITION_REASSIGNMENTS: self.list_partition_reassignments,
            kc.API_UNREGISTER_BROKER: self.unregister_broker,
            kc.API_ADD_RAFT_VOTER: self.add_raft_voter,
            kc.API_REMOVE_RAFT_VOTER: self.remove_raft_voter,
        }

    def _forward(self, method: str, request: Any, timeout_ms: int) -> Any:
        """The controller's answer within the request's timeout (1 s to FORWARD_DEADLINE_S);
        raises its top-level error (no active controller, ...)."""
        deadline_s = min(max(timeout_ms / 1000, 1.0), FORWARD_DEADLINE_S)
        return authorized(
            self.access, method, request,
            lambda allowed: self.controller.checked(method, allowed, deadline_s=deadline_s),
        )  # fmt: skip

    # -- CreateTopics -----------------------------------------------------------------------------
    def create_topics(self, request: kc.Request) -> kc.Data:
        body = request.body
        forwarded = cpb.CreateTopicsRequest(
            validate_only=bool(kc.field(body, "validate_only", False))
        )
        for topic in body.topics:
            forwarded.topics.add(
                name=topic.name,
                num_partitions=topic.num_partitions,
                replication_factor=topic.replication_factor,
                assignments=[
                    cpb.ReplicaAssignment(partition=a.partition_index, broker_ids=a.broker_ids)
                    for a in topic.assignments
                ],
                configs={c.name: c.value for c in topic.configs if c.value is not None},
            )
        try:
            answer = self._forward("CreateTopics", forwarded, kc.millis(body.timeout))
        except KafkaError as error:
            failed = _failed(error)
            return {"throttle_time": 0, "topics": [
                {"name": t.name, "topic_id": None, **failed, "num_partitions": -1,
                 "replication_factor": -1, "configs": None}
                for t in body.topics
            ]}  # fmt: skip
        return {
            "throttle_time": 0,
            "topics": [
                {
                    "name": t.name,
                    "topic_id": uuid.UUID(bytes=t.topic_id) if len(t.topic_id) == 16 else None,
                    **_outcome(t.error_code, t.error_message),
                    "num_partitions": t.num_partitions if not t.error_code else -1,
                    "replication_factor": t.replication_factor if not t.error_code else -1,
                    "configs": None if t.error_code else [],
                }
                for t in answer.topics
            ],
        }

    # -- DeleteTopics -----------------------------------------------------------------------------
    def delete_topics(self, request: kc.Request) -> kc.Data:
        body = request.body
        image = self.image()
        by_id = {topic_id: name for name, topic_id in image.topic_ids.items()}
        if request.api_version >= 6:
            wanted = [(t.name or by_id.get(t.topic_id), t.topic_id) for t in body.topics]
        else:
            wanted = [(name, None) for name in body.topic_names]
        results: list[dict[str, Any]] = []
        names = [name for name, _ in wanted if name]
        answers: dict[str, dict[str, Any]] = {}
        if names:
            try:
                answer = self._forward(
                    "DeleteTopics", cpb.DeleteTopicsRequest(names=names), kc.millis(body.timeout)
                )
                answers = {t.name: _outcome(t.error_code, t.error_message) for t in answer.topics}
            except KafkaError as error:
                answers = {name: _failed(error) for name in names}
        for name, topic_id in wanted:
            if name is None:
                missing = KafkaError(ErrorCode.UNKNOWN_TOPIC_ID, f"no topic with id {topic_id}")
                results.append({"name": None, "topic_id": topic_id, **_failed(missing)})
                continue
            outcome = answers.get(name, _outcome(ErrorCode.UNKNOWN_SERVER_ERROR.code, "no answer"))
            known = image.topic_ids.get(name)
            results.append({"name": name, "topic_id": topic_id or known, **outcome})
        return {"throttle_time": 0, "responses": results}

    # -- CreatePartitions -------------------------------------------------------------------------
    def create_partitions(self, request: kc.Request) -> kc.Data:
        body = request.body
        image = self.image()
        forwarded = cpb.CreatePartitionsRequest(validate_only=bool(body.validate_only))
        for topic in body.topics:
            existing = image.topic(topic.name)
            first = 0 if existing is None else len(existing.partitions)
            forwarded.topics.add(
                name=topic.name,
                count=topic.count,
                assignments=[
                    cpb.ReplicaAssignment(partition=first + n, broker_ids=a.broker_ids)
                    for n, a in enumerate(topic.assignments or ())
                ],
            )
        try:
            answer = self._forward("CreatePartitions", forwarded, kc.millis(body.timeout))
        except KafkaError as error:
            failed = _failed(error)
            return {
                "throttle_time": 0,
                "results": [{"name": t.name, **failed} for t in body.topics],
            }
        return {
            "throttle_time": 0,
            "results": [
                {"name": t.name, **_outcome(t.error_code, t.error_message)} for t in answer.topics
            ],
        }

    # -- AlterPartitionReassignments / ListPartitionReassignments (KIP-455) ------------------------
    def alter_partition_reassignments(self, request: kc.Request) -> kc.Data:
        body = request.body
        allow = bool(kc.field(body, "allow_replication_factor_change", True))
        forwarded = cpb.AlterPartitionReassignmentsRequest(allow_replication_factor_change=allow)
        for topic in body.topics:
            for p in topic.partitions:
                forwarded.partitions.add(
                    topic=topic.name,
                    partition=p.partition_index,
                    replicas=list(p.replicas or ()),
                    cancel=p.replicas is None,
                )
        answer: dict[str, Any] = {"throttle_time": 0, "allow_replication_factor_change": allow}
        try:
            reply = self._forward("AlterPartitionReassignments", forwarded, kc.millis(body.timeout))
        except KafkaError as error:
            return {**answer, **_failed(error), "responses": []}
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for state in reply.partitions:
            by_topic.setdefault(state.topic, []).append(
                {
                    "partition_index": state.partition,
                    **_outcome(state.error_code, state.error_message),
                }
            )
        return {
            **answer,
            **_outcome(0, ""),
            "responses": [{"name": name, "partitions": ps} for name, ps in by_topic.items()],
        }

    def list_partition_reassignments(self, request: kc.Request) -> kc.Data:
        body = request.body
        wanted = [
            cpb.TopicPartition(topic=t.name, partition=p)
            for t in body.topics or ()
            for p in t.partition_indexes
        ]
        if body.topics is not None and not wanted:
            return {"throttle_time": 0, **_outcome(0, ""), "topics": []}
        try:
            reply = self._forward(
                "ListPartitionReassignments",
                cpb.ListPartitionReassignmentsRequest(partitions=wanted),
                kc.millis(body.timeout),
            )
        except KafkaError as error:
            return {"throttle_time": 0, **_failed(error), "topics": []}
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for state in reply.partitions:
            by_topic.setdefault(state.topic, []).append(
                {
                    "partition_index": state.partition,
                    "replicas": list(state.replicas),
                    "adding_replicas": list(state.adding_replicas),
                    "removing_replicas": list(state.removing_replicas),
                }
            )
        return {
            "throttle_time": 0,
            **_outcome(0, ""),
            "topics": [{"name": name, "partitions": ps} for name, ps in by_topic.items()],
        }

    # -- UnregisterBroker -------------------------------------------------------------------------
    def unregister_broker(self, request: kc.Request) -> kc.Data:
        """Never forced: over the Kafka protocol a broker that still hosts replicas or is
        unfenced is refused (INVALID_REQUEST), where Kafka's controller refuses neither."""
        forwarded = cpb.UnregisterBrokerRequest(broker_id=request.body.broker_id)
        try:
            self._forward("UnregisterBroker", forwarded, int(FORWARD_DEADLINE_S * 1000))
        except KafkaError as error:
            return {"throttle_time": 0, **_failed(error)}
        return {"throttle_time": 0, **_outcome(0, "")}

    # -- AddRaftVoter / RemoveRaftVoter (KIP-853) --------------------------------------------------
    def add_raft_voter(self, request: kc.Request) -> kc.Data:
        """The new voter's first listener is its CONTROLLER listener; its Raft port is that
        port + 1 (controller.quorum.raft.port.offset's default). The directory id is not used:
        raftlog knows a voter by its node id and addresses."""
        body = request.body
        if not body.listeners:
            refused = KafkaError(ErrorCode.INVALID_REQUEST, "the new voter names no listener")
            return {"throttle_time": 0, **_failed(refused)}
        host, port = body.listeners[0].host, int(body.listeners[0].port)
        voter = mpb.ControllerVoter(node_id=body.voter_id, host=host, port=port, raft_port=port + 1)
        forwarded = cpb.AddRaftVoterRequest(cluster_id=body.cluster_id or "", voter=voter)
        return self._voter_change("AddRaftVoter", forwarded, kc.millis(body.timeout))

    def remove_raft_voter(self, request: kc.Request) -> kc.Data:
        body = request.body
        forwarded = cpb.RemoveRaftVoterRequest(
            cluster_id=body.cluster_id or "", voter_id=body.voter_id
        )
        return self._voter_change("RemoveRaftVoter", forwarded, int(FORWARD_DEADLINE_S * 1000))

    def _voter_change(self, method: str, forwarded: Any, timeout_ms: int) -> kc.Data:
        try:
            self._forward(method, forwarded, timeout_ms)
        except KafkaError as error:
            return {"throttle_time": 0, **_failed(error)}
        return {"throttle_time": 0, **_outcome(0, "")}

    # -- DescribeConfigs --------------------------------------------------------------------------
    def describe_configs(self, request: kc.Request) -> kc.Data:
        body = request.body
        results: list[dict[str, Any]] = []
        asked: list[tuple[Any, cpb.ConfigResource]] = []
        for resource in body.resources:
            resource_type = RESOURCE_TYPES.get(resource.resource_type)
            if resource_type is None:
                unsupported = KafkaError(
                    ErrorCode.INVALID_REQUEST,
                    f"resource type {resource.resource_type} is not described (topics: 2, "
                    "brokers: 4)",
                )
                results.append(_described(resource, [], _failed(unsupported)))
                continue
            asked.append(
                (resource, cpb.ConfigResource(
                    resource_type=resource_type, resource_name=resource.resource_name
                ))
            )  # fmt: skip
        if asked:
            try:
                answer = self._forward(
                    "DescribeConfigs",
                    cpb.DescribeConfigsRequest(resources=[r for _, r in asked]),
                    int(FORWARD_DEADLINE_S * 1000),  # DescribeConfigs carries no timeout
                )
                described = list(answer.resources)
            except KafkaError as error:
                described = []
                results += [_described(r, [], _failed(error)) for r, _ in asked]
            for (resource, _), found in zip(asked, described, strict=False):
                keys = resource.configuration_keys
                entries = [e for e in found.entries if keys is None or e.name in keys]
                configs = [_config(e) for e in entries]
                outcome = _outcome(found.error_code, found.error_message)
                results.append(_described(resource, configs, outcome))
        return {"throttle_time": 0, "results": results}

    # -- DescribeCluster --------------------------------------------------------------------------
    def describe_cluster(self, request: kc.Request) -> kc.Data:
        endpoint_type = kc.field(request.body, "endpoint_type", ENDPOINT_TYPE_BROKERS)
        out: dict[str, Any] = {
            "throttle_time": 0, "error_code": 0, "error_message": None,
            "endpoint_type": endpoint_type, "cluster_id": self.cluster_id,
            "controller_id": self.broker_id, "brokers": [],
            "cluster_authorized_operations": -(2**31),
        }  # fmt: skip
        try:
            check_cluster(self.access, "DescribeCluster")
        except KafkaError as error:
            return {**out, **_failed(error)}
        if endpoint_type != ENDPOINT_TYPE_BROKERS:
            refused = KafkaError(
                ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
                "controllers are not reachable over the Kafka protocol; ask for brokers",
            )
            return {**out, **_failed(refused)}
        for broker in self.image().unfenced_brokers():
            endpoint = broker.endpoint(self.listener)
            if endpoint is not None:
                out["brokers"].append({
                    "broker_id": broker.broker_id, "host": endpoint.host, "port": endpoint.port,
                    "rack": broker.rack, "is_fenced": False,
                })  # fmt: skip
        return out


def _described(resource: Any, configs: list[dict[str, Any]], outcome: dict[str, Any]) -> Any:
    return {
        **outcome,
        "resource_type": resource.resource_type,
        "resource_name": resource.resource_name,
        "configs": configs,
    }


def _config(entry: cpb.ConfigEntry) -> dict[str, Any]:
    """The controller names each value's source with Kafka's own ConfigSource numbers."""
    return {
        "name": entry.name,
        "value": entry.value,
        "read_only": False,
        "is_default": entry.is_default,  # v0 only; later versions say it with config_source
        "config_source": entry.source,
        "is_sensitive": False,
        "synonyms": [],
        "config_type": 0,  # UNKNOWN: the controller's entries carry no type
        "documentation": None,
    }
