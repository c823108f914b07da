"""The admin client: topics, partitions, configs, leaders and cluster state, via the controllers.

It bootstraps from broker addresses (``bootstrap.servers``): one ``Metadata`` call to any of
them yields the controller quorum's addresses. Or it is given them directly with
``bootstrap_controllers`` (as Kafka's KIP-919). Every call then goes through
:class:`metadata_quorum.client.ControllerClient`, which follows NOT_CONTROLLER to the active
controller within a bounded deadline (``request_timeout_ms``).

Errors: a failure of the whole request raises ``KafkaError``. Calls that act on many items
(``create_topics``, ``delete_topics``, ``create_partitions``, ``elect_leaders``) return one
entry per item: ``None`` for success or the item's ``KafkaError``, like confluent-kafka's
per-item futures without the futures; ``raise_for_errors`` turns such a dict into the first
error. Describe calls raise the first item error (an unknown topic is
UNKNOWN_TOPIC_OR_PARTITION).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from dataplane.client._closing import Closing
from dataplane.client._cluster import Cluster
from dataplane.client._types import TopicPartition
from metadata_quorum.client import ControllerClient
from protos import controller_pb2 as pb
from protos import metadata_pb2
from raftlog.errors import ErrorCode, KafkaError

__all__ = [
    "AdminClient",
    "BrokerDescription",
    "ClusterDescription",
    "ConfigEntry",
    "ConfigResource",
    "NewTopic",
    "PartitionDescription",
    "QuorumDescription",
    "ResourceType",
    "TopicDescription",
    "raise_for_errors",
]


class ResourceType(enum.IntEnum):
    """Kafka's ``ConfigResource.Type`` ids."""

    TOPIC = metadata_pb2.CONFIG_RESOURCE_TOPIC
    BROKER = metadata_pb2.CONFIG_RESOURCE_BROKER


class ConfigResource(NamedTuple):
    type: ResourceType
    name: str  # topic name, broker id as a string, "" = cluster-wide broker default


@dataclass(frozen=True)
class NewTopic:
    name: str
    num_partitions: int = -1  # -1 = the cluster's num.partitions
    replication_factor: int = -1  # -1 = default.replication.factor
    configs: Mapping[str, str] = field(default_factory=dict)
    replica_assignment: Mapping[int, Sequence[int]] | None = None  # partition -> broker ids


@dataclass(frozen=True)
class PartitionDescription:
    partition: int
    leader: int  # -1 = none
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True)
class TopicDescription:
    name: str
    topic_id: bytes
    partitions: tuple[PartitionDescription, ...]
    configs: Mapping[str, str]  # overrides only


@dataclass(frozen=True)
class Endpoint:
    name: str
    host: str
    port: int


@dataclass(frozen=True)
class BrokerDescription:
    broker_id: int
    endpoints: tuple[Endpoint, ...]
    rack: str
    fenced: bool
    broker_epoch: int
    in_controlled_shutdown: bool


@dataclass(frozen=True)
class ClusterDescription:
    cluster_id: str
    controller_id: int
    controller_address: str
    brokers: tuple[BrokerDescription, ...]
    metadata_offset: int


@dataclass(frozen=True)
class VoterDescription:
    node_id: int
    address: str
    match_index: int  # -1 = unknown
    lag: int  # -1 = unknown
    connected: bool


@dataclass(frozen=True)
class QuorumDescription:
    leader_id: int  # -1 = none
    leader_epoch: int  # the Raft term
    commit_index: int
    metadata_offset: int
    has_quorum: bool
    voters: tuple[VoterDescription, ...]


class ConfigEntry(NamedTuple):
    name: str
    value: str
    is_default: bool


def raise_for_errors(results: Mapping[Any, KafkaError | None]) -> None:
    """Raise the first per-item error of a result dict."""
    for error in results.values():
        if error is not None:
            raise error


def _item_error(code: int, message: str) -> KafkaError | None:
    return None if code == ErrorCode.NONE.code else KafkaError(ErrorCode.from_code(code), message)


def _partition(state: pb.PartitionState) -> PartitionDescription:
    return PartitionDescription(
        partition=state.partition,
        leader=state.leader,
        leader_epoch=state.leader_epoch,
        replicas=tuple(state.replicas),
        isr=tuple(state.isr),
    )


def _assignments(assignment: Mapping[int, Sequence[int]] | None) -> list[pb.ReplicaAssignment]:
    return [
        pb.ReplicaAssignment(partition=p, broker_ids=list(brokers))
        for p, brokers in sorted((assignment or {}).items())
    ]


class AdminClient(Closing):
    def __init__(
        self,
        bootstrap_servers: str | Sequence[str] | None = None,
        *,
        bootstrap_controllers: str | Sequence[str] | None = None,
        request_timeout_ms: int = 30_000,
    ) -> None:
        if (bootstrap_servers is None) == (bootstrap_controllers is None):
            raise ValueError("give exactly one of bootstrap_servers or bootstrap_controllers")
        if not 1 <= request_timeout_ms <= 600_000:
            raise ValueError(f"request_timeout_ms out of [1, 600000]: {request_timeout_ms}")
        self._timeout_s = request_timeout_ms / 1000
        if bootstrap_controllers is not None:
            controllers = (
                bootstrap_controllers.split(",")
                if isinstance(bootstrap_controllers, str)
                else list(bootstrap_controllers)
            )
        else:
            assert bootstrap_servers is not None, "checked above"
            controllers = self._discover_controllers(bootstrap_servers, request_timeout_ms)
        self._controllers = ControllerClient(controllers, deadline_s=self._timeout_s)

    @staticmethod
    def _discover_controllers(servers: str | Sequence[str], request_timeout_ms: int) -> list[str]:
        cluster = Cluster(servers, request_timeout_ms=request_timeout_ms)
        try:
            addresses = list(cluster.refresh().controller_addresses)
        finally:
            cluster.close()
        if not addresses:
            raise KafkaError(ErrorCode.BROKER_NOT_AVAILABLE, "Metadata named no controller")
        return addresses

    def _checked(self, method: str, request: Any) -> Any:
        return self._controllers.checked(method, request, deadline_s=self._timeout_s)

    # -- topics ----------------------------------------------------------------------------
    def create_topics(
        self, new_topics: Iterable[NewTopic], validate_only: bool = False
    ) -> dict[str, KafkaError | None]:
        topics = [
            pb.CreatableTopic(
                name=t.name,
                num_partitions=t.num_partitions,
                replication_factor=t.replication_factor,
                assignments=_assignments(t.replica_assignment),
                configs=dict(t.configs),
            )
            for t in new_topics
        ]
        request = pb.CreateTopicsRequest(topics=topics, validate_only=validate_only)
        response = self._checked("CreateTopics", request)
        return {r.name: _item_error(r.error_code, r.error_message) for r in response.topics}

    def delete_topics(self, names: Iterable[str]) -> dict[str, KafkaError | None]:
        response = self._checked("DeleteTopics", pb.DeleteTopicsRequest(names=list(names)))
        return {r.name: _item_error(r.error_code, r.error_message) for r in response.topics}

    def create_partitions(
        self,
        new_totals: Mapping[str, int],
        validate_only: bool = False,
        assignments: Mapping[str, Mapping[int, Sequence[int]]] | None = None,
    ) -> dict[str, KafkaError | None]:
        """Grow each topic to ``new_totals[name]`` partitions (the new total, as Kafka)."""
        topics = [
            pb.CreatePartitionsTopic(
                name=name, count=count, assignments=_assignments((assignments or {}).get(name))
            )
            for name, count in new_totals.items()
        ]
        request = pb.CreatePartitionsRequest(topics=topics, validate_only=validate_only)
        response = self._checked("CreatePartitions", request)
        return {r.name: _item_error(r.error_code, r.error_message) for r in response.topics}

    def list_topics(self) -> list[str]:
        response = self._checked("DescribeTopics", pb.DescribeTopicsRequest())
        return sorted(t.name for t in response.topics if t.error_code == ErrorCode.NONE.code)

    def describe_topics(self, names: Iterable[str] | None = None) -> dict[str, TopicDescription]:
        """Every topic when ``names`` is None. Raises the first topic's error."""
        request = pb.DescribeTopicsRequest(names=list(names or ()))
        response = self._checked("DescribeTopics", request)
        result: dict[str, TopicDescription] = {}
        for topic in response.topics:
            error = _item_error(topic.error_code, f"{topic.name}: {topic.error_message}")
            if error is not None:
                raise error
            partitions = sorted(
                (_partition(p) for p in topic.partitions), key=lambda p: p.partition
            )
            result[topic.name] = TopicDescription(
                name=topic.name,
                topic_id=topic.topic_id,
                partitions=tuple(partitions),
                configs=dict(topic.configs),
            )
        return result

    # -- cluster ---------------------------------------------------------------------------
    def describe_cluster(self) -> ClusterDescription:
        response = self._checked("DescribeCluster", pb.DescribeClusterRequest())
        brokers = tuple(
            BrokerDescription(
                broker_id=b.broker_id,
                endpoints=tuple(Endpoint(e.name, e.host, e.port) for e in b.endpoints),
                rack=b.rack,
                fenced=b.fenced,
                broker_epoch=b.broker_epoch,
                in_controlled_shutdown=b.in_controlled_shutdown,
            )
            for b in response.brokers
        )
        return ClusterDescription(
            cluster_id=response.cluster_id,
            controller_id=response.controller_id,
            controller_address=response.controller_address,
            brokers=brokers,
            metadata_offset=response.metadata_offset,
        )

    def describe_quorum(self) -> QuorumDescription:
        response = self._controllers.call(
            "DescribeQuorum", pb.DescribeQuorumRequest(), deadline_s=self._timeout_s, any_node=True
        )
        error = _item_error(response.status.error_code, response.status.error_message)
        if error is not None:
            raise error
        return QuorumDescription(
            leader_id=response.leader_id,
            leader_epoch=response.term,
            commit_index=response.commit_index,
            metadata_offset=response.metadata_offset,
            has_quorum=response.has_quorum,
            voters=tuple(
                VoterDescription(v.node_id, v.address, v.match_index, v.lag, v.connected)
                for v in response.voters
            ),
        )

    def elect_leaders(
        self,
        election_type: Literal["preferred", "unclean"] = "preferred",
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
    ) -> dict[TopicPartition, KafkaError | None]:
        """Elect leaders of ``partitions`` (None = every partition). ELECTION_NOT_NEEDED is
        reported per partition like any other outcome."""
        kind = {"preferred": pb.PREFERRED, "unclean": pb.UNCLEAN}[election_type]
        request = pb.ElectLeadersRequest(
            election_type=kind,
            partitions=[pb.TopicPartition(topic=t, partition=p) for t, p in partitions or ()],
        )
        response = self._checked("ElectLeaders", request)
        return {
            TopicPartition(s.topic, s.partition): _item_error(s.error_code, s.error_message)
            for s in response.partitions
        }

    # -- configs ---------------------------------------------------------------------------
    def alter_configs(
        self,
        resource: ConfigResource,
        configs: Mapping[str, str | None],
        validate_only: bool = False,
    ) -> None:
        """Set each config to its value, or delete the override when the value is None
        (Kafka's incrementalAlterConfigs SET/DELETE). Raises the resource's error."""
        entries = [
            pb.AlterableConfig(
                name=name, value=value or "", op=pb.DELETE if value is None else pb.SET
            )
            for name, value in configs.items()
        ]
        request = pb.AlterConfigsRequest(
            resources=[
                pb.AlterConfigsResource(
                    resource=pb.ConfigResource(
                        resource_type=metadata_pb2.ConfigResourceType.ValueType(resource.type),
                        resource_name=resource.name,
                    ),
                    configs=entries,
                )
            ],
            validate_only=validate_only,
        )
        response = self._checked("AlterConfigs", request)
        for result in response.resources:
            error = _item_error(result.error_code, f"{resource}: {result.error_message}")
            if error is not None:
                raise error

    def describe_configs(
        self, resources: Iterable[ConfigResource]
    ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        wanted = [
            pb.ConfigResource(
                resource_type=metadata_pb2.ConfigResourceType.ValueType(r.type),
                resource_name=r.name,
            )
            for r in resources
        ]
        response = self._checked("DescribeConfigs", pb.DescribeConfigsRequest(resources=wanted))
        result: dict[ConfigResource, dict[str, ConfigEntry]] = {}
        for described in response.resources:
            resource = ConfigResource(
                ResourceType(described.resource.resource_type), described.resource.resource_name
            )
            error = _item_error(described.error_code, f"{resource}: {described.error_message}")
            if error is not None:
                raise error
            result[resource] = {
                e.name: ConfigEntry(e.name, e.value, e.is_default) for e in described.entries
            }
        return result

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        self._controllers.close()
