"""The KAFKA listener's admin APIs: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
AlterConfigs and IncrementalAlterConfigs (dataplane/kafka/alter_configs.py), DescribeCluster,
AlterPartitionReassignments, ListPartitionReassignments, UnregisterBroker,
AddRaftVoter and RemoveRaftVoter, ElectLeaders, and UpdateFeatures (dataplane/kafka/features.py).

As a KRaft broker forwards admin requests to the active controller (KIP-590), each request is
turned into the controller's own RPC and sent through the broker's controller client, which
follows the active controller; the controller validates, commits the records and answers with
Kafka's error codes, which are passed on per topic or resource. DescribeCluster is answered from
the broker's metadata image, with the brokers' KAFKA endpoints. Kafka clients cannot reach
controllers, so wherever the protocol names "the controller" (Metadata, DescribeCluster) this
broker names itself, as Kafka's brokers name a live broker: it forwards. DescribeConfigs of
a topic is forwarded too; of a group, a broker (this one, or "" for the cluster-wide values),
its loggers (BROKER_LOGGER) or a client metrics subscription it is answered here, from this
broker's image and node config, as Kafka's broker answers it (dataplane/kafka/config_resources.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from dataplane.broker import authorization as authz
from dataplane.kafka import codec as kc
from dataplane.kafka.alter_configs import (
    RESOURCE_TYPES,
    alter_configs,
    incremental_alter_configs,
)
from dataplane.kafka.config_resources import (
    BROKER,
    BROKER_LOGGER,
    CLIENT_METRICS,
    GROUP,
    KafkaConfigResources,
)
from dataplane.kafka.features import update_features
from metadata_quorum.client import ControllerClient
from metadata_quorum.image import MetadataImage
from metadata_quorum.request_authorization import authorized, check_cluster
from metadata_quorum.security.acl import CLUSTER_NAME
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl
from metadata_quorum.topic_config_defs import config_type, documentation
from protos import controller_pb2 as cpb
from protos import metadata_pb2 as mpb
from raftlog.errors import ErrorCode, KafkaError

ENDPOINT_TYPE_BROKERS = 1  # DescribeCluster v1: 1 brokers, 2 controllers
ELECTION_PREFERRED, ELECTION_UNCLEAN = 0, 1  # ElectLeaders' election_type
FORWARD_DEADLINE_S = 30.0
# An admin answer waits for this broker's image up to the request's timeout, and at least
# this long: confluent-kafka sends CreateTopics with a timeout of 0 by default, and its next
# Metadata to this broker must still see the new topic.
PROPAGATION_WAIT_MIN_S = 1.0
WaitForImage = Callable[[Callable[[MetadataImage], bool], float], MetadataImage]


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
        wait_for_image: WaitForImage | None = None,
        config_resources: KafkaConfigResources | None = None,
    ) -> None:
        self.controller = controller
        # DescribeConfigs of groups, brokers, loggers and client metrics, answered by this
        # broker, and its loggers' IncrementalAlterConfigs (dataplane/kafka/config_resources.py)
        self.config_resources = config_resources or KafkaConfigResources(image, access=access)
        # CreateTopics, DeleteTopics and CreatePartitions are answered once this broker's
        # image shows their change (None: at once)
        self.wait_for_image = wait_for_image
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
            kc.API_INCREMENTAL_ALTER_CONFIGS: lambda r: incremental_alter_configs(
                self._forward, r, self.config_resources.alter_loggers
            ),
            kc.API_DESCRIBE_CLUSTER: self.describe_cluster,
            kc.API_ALTER_PARTITION_REASSIGNMENTS: self.alter_partition_reassignments,
            kc.API_LIST_PARTITION_REASSIGNMENTS: self.list_partition_reassignments,
            kc.API_UNREGISTER_BROKER: self.unregister_broker,
            kc.API_ADD_RAFT_VOTER: self.add_raft_voter,
            kc.API_REMOVE_RAFT_VOTER: self.remove_raft_voter,
            kc.API_ELECT_LEADERS: self.elect_leaders,
            kc.API_UPDATE_FEATURES: lambda r: update_features(self._forward, r),
        }

    def _forward(self, method: str, request: Any, timeout_ms: int) -> Any:
        """The controller's answer within the request's timeout (1 s to FORWARD_DEADLINE_S);
        raises its top-level error (no active controller, ...)."""
        deadline_s = min(max(timeout_ms / 1000, 1.0), FORWARD_DEADLINE_S)
        return authorized(
            self.access, method, request,
            lambda allowed: self.controller.checked(method, allowed, deadline_s=deadline_s),
        )  # fmt: skip

    def _until_shown(
        self, shown: Callable[[MetadataImage], bool], started_s: float, timeout_ms: int
    ) -> None:
        """Hold the answer until this broker's image shows the change (``shown``), or the
        request's timeout (at least PROPAGATION_WAIT_MIN_S, at most FORWARD_DEADLINE_S from
        ``started_s``) passes: a client that asks this broker for metadata right after its
        answer must see the change (Kafka's clients wait for leaders after CreateTopics). The
        change is committed either way; only its visibility here is waited for."""
        if self.wait_for_image is None:
            return
        budget_s = min(max(timeout_ms / 1000, PROPAGATION_WAIT_MIN_S), FORWARD_DEADLINE_S)
        self.wait_for_image(shown, max(0.0, started_s + budget_s - time.monotonic()))

    # -- CreateTopics -----------------------------------------------------------------------------
    def create_topics(self, request: kc.Request) -> kc.Data:
        started_s = time.monotonic()
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
        created = {
            t.name: uuid.UUID(bytes=t.topic_id)
            for t in answer.topics
            if not t.error_code and len(t.topic_id) == 16
        }
        if created and not forwarded.validate_only:
            self._until_shown(
                lambda image: all(image.topic_ids.get(n) == i for n, i in created.items()),
                started_s, kc.millis(body.timeout),
            )  # fmt: skip
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
        started_s = time.monotonic()
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
                deleted = [(t.name, t.topic_id) for t in answer.topics if not t.error_code]
                if deleted:
                    self._until_shown(
                        lambda image: all(_gone(image, n, i) for n, i in deleted),
                        started_s, kc.millis(body.timeout),
                    )  # fmt: skip
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
        started_s = time.monotonic()
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
        counts = {t.name: t.count for t in body.topics}
        grown = {t.name: counts[t.name] for t in answer.topics if not t.error_code}
        if grown and not forwarded.validate_only:
            self._until_shown(
                lambda image: all(_partition_count(image, n) >= c for n, c in grown.items()),
                started_s, kc.millis(body.timeout),
            )  # fmt: skip
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

    # -- ElectLeaders (KIP-460) -------------------------------------------------------------------
    def elect_leaders(self, request: kc.Request) -> kc.Data:
        """Preferred (0) or unclean (1) elections by the controller. Null partitions elect
        every partition and, as Kafka's controller, leave out those that need no election."""
        body = request.body
        election_type = kc.field(body, "election_type", ELECTION_PREFERRED)  # v0: preferred
        asked = body.topic_partitions
        wanted = [(t.topic, p) for t in asked or () for p in t.partitions]
        answer: dict[str, Any] = {"throttle_time": 0, **_outcome(0, "")}
        if election_type not in (ELECTION_PREFERRED, ELECTION_UNCLEAN):
            refused = KafkaError(
                ErrorCode.INVALID_REQUEST, f"election type {election_type} is not 0 or 1"
            )
            return {**answer, **_failed(refused), "replica_election_results": _elected(
                [(topic, p, _failed(refused)) for topic, p in wanted]
            )}  # fmt: skip
        if asked is not None and not wanted:
            return {**answer, "replica_election_results": []}
        forwarded = cpb.ElectLeadersRequest(
            election_type=cpb.UNCLEAN if election_type == ELECTION_UNCLEAN else cpb.PREFERRED,
            partitions=[cpb.TopicPartition(topic=t, partition=p) for t, p in wanted],
        )
        try:
            reply = self._forward("ElectLeaders", forwarded, kc.millis(body.timeout))
        except KafkaError as error:
            failed = _failed(error)
            return {**answer, **failed, "replica_election_results": _elected(
                [(topic, p, failed) for topic, p in wanted]
            )}  # fmt: skip
        not_needed = ErrorCode.ELECTION_NOT_NEEDED.code
        outcomes = [
            (s.topic, s.partition, _outcome(s.error_code, s.error_message))
            for s in reply.partitions
            if asked is not None or s.error_code != not_needed
        ]
        return {**answer, "replica_election_results": _elected(outcomes)}

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
        synonyms = bool(kc.field(body, "include_synonyms", False))
        documented = bool(kc.field(body, "include_documentation", False))
        results: list[dict[str, Any]] = []
        asked: list[tuple[Any, cpb.ConfigResource]] = []
        for resource in body.resources:
            if resource.resource_type == GROUP:
                results.append(self.config_resources.describe_group(resource, synonyms))
                continue
            if resource.resource_type in (BROKER, BROKER_LOGGER, CLIENT_METRICS):
                described_here = self.config_resources.describe_local(
                    resource, synonyms, documented
                )
                results.append(described_here)
                continue
            resource_type = RESOURCE_TYPES.get(resource.resource_type)
            if resource_type is None:
                unsupported = KafkaError(
                    ErrorCode.INVALID_REQUEST,
                    f"Unsupported resource type: {resource.resource_type}",
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
                    cpb.DescribeConfigsRequest(
                        resources=[r for _, r in asked], broker_id=self.broker_id
                    ),
                    int(FORWARD_DEADLINE_S * 1000),  # DescribeConfigs carries no timeout
                )
                described = list(answer.resources)
            except KafkaError as error:
                described = []
                results += [_described(r, [], _failed(error)) for r, _ in asked]
            for (resource, _), found in zip(asked, described, strict=False):
                keys = resource.configuration_keys
                entries = [e for e in found.entries if keys is None or e.name in keys]
                configs = [_config(e, synonyms, documented) for e in entries]
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
            "cluster_authorized_operations": authz.authorized_operations(
                self.access, authz.CLUSTER, CLUSTER_NAME,
                bool(kc.field(request.body, "include_cluster_authorized_operations", False)),
            ),
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


def _elected(outcomes: list[tuple[str, int, dict[str, Any]]]) -> list[dict[str, Any]]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for topic, partition, outcome in outcomes:
        by_topic.setdefault(topic, []).append({"partition_id": partition, **outcome})
    return [{"topic": topic, "partition_result": ps} for topic, ps in by_topic.items()]


def _gone(image: MetadataImage, name: str, topic_id: bytes) -> bool:
    """The deleted topic is no longer in ``image`` (a topic of the same name created since
    has another id)."""
    current = image.topic_ids.get(name)
    return current is None or (len(topic_id) == 16 and current != uuid.UUID(bytes=topic_id))


def _partition_count(image: MetadataImage, name: str) -> int:
    topic = image.topic(name)
    return 0 if topic is None else len(topic.partitions)


def _described(resource: Any, configs: list[dict[str, Any]], outcome: dict[str, Any]) -> Any:
    return {
        **outcome,
        "resource_type": resource.resource_type,
        "resource_name": resource.resource_name,
        "configs": configs,
    }


def _config(entry: cpb.ConfigEntry, synonyms: bool, documented: bool) -> dict[str, Any]:
    """The controller names each value's source and synonyms with Kafka's own ConfigSource
    numbers; the type and doc string are Kafka's (metadata_quorum.topic_config_defs). Every
    config described here may be altered (read_only false) and none is a password."""
    return {
        "name": entry.name,
        "value": entry.value,
        "read_only": False,
        "is_default": entry.is_default,  # v0 only; later versions say it with config_source
        "config_source": entry.source,
        "is_sensitive": False,
        "synonyms": [{"name": s.name, "value": s.value, "source": s.source} for s in entry.synonyms]
        if synonyms
        else [],
        "config_type": int(config_type(entry.name)),
        "documentation": documentation(entry.name) if documented else None,
    }
