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

Consumer-group calls (``list_groups``, ``describe_groups``, ``delete_groups``,
``list_group_offsets``, ``alter_group_offsets``, ``delete_consumer_group_offsets``) go to the
brokers (so they need ``bootstrap_servers``): to each group's coordinator, or to every broker for
a listing. So do the transaction calls (``describe_transactions``, ``list_transactions``,
``describe_producers``: see ``_admin_transactions``) and ``delete_records`` (to each
partition's leader: see ``_admin_records``).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import grpc

from dataplane.client import _admin_records as records_calls
from dataplane.client import _admin_security as security_calls
from dataplane.client import _admin_transactions as txn_calls
from dataplane.client._admin_records import DeletedRecords
from dataplane.client._admin_security import (
    AclDeleteResult,
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from dataplane.client._admin_transactions import (
    ProducerState,
    TransactionDescription,
    TransactionListing,
)
from dataplane.client._closing import Closing
from dataplane.client._cluster import Cluster, SecuritySetting, client_security, rpc_error
from dataplane.client._group import GroupClient, commit_request, from_wire
from dataplane.client._types import OffsetAndMetadata, TopicPartition
from metadata_quorum.client import ControllerClient
from metadata_quorum.security.acl import AclBinding, AclFilter
from protos import broker_pb2 as bpb
from protos import controller_pb2 as pb
from protos import group_pb2 as gpb
from protos import metadata_pb2
from raftlog.errors import ErrorCode, KafkaError

__all__ = [
    "AclBinding",
    "AclDeleteResult",
    "AclFilter",
    "AdminClient",
    "BrokerDescription",
    "ClusterDescription",
    "ConfigEntry",
    "ConfigResource",
    "ConfigSynonym",
    "DeletedRecords",
    "GroupDescription",
    "GroupListing",
    "MemberDescription",
    "NewTopic",
    "PartitionDescription",
    "ProducerState",
    "QuorumDescription",
    "ResourceType",
    "ScramCredentialInfo",
    "TopicDescription",
    "TransactionDescription",
    "TransactionListing",
    "UserScramCredentialDeletion",
    "UserScramCredentialUpsertion",
    "raise_for_errors",
]


class ResourceType(enum.IntEnum):
    """Kafka's ``ConfigResource.Type`` ids."""

    TOPIC = metadata_pb2.CONFIG_RESOURCE_TOPIC
    BROKER = metadata_pb2.CONFIG_RESOURCE_BROKER
    GROUP = metadata_pb2.CONFIG_RESOURCE_GROUP  # Kafka 4's group configs (name: the group id)


class ConfigResource(NamedTuple):
    type: ResourceType
    name: str  # topic name, broker id as a string, "" = cluster-wide broker default

    def __str__(self) -> str:
        """As errors name it: ``topic t``, ``broker 1``, ``broker default``, ``group g``."""
        if self.type is ResourceType.BROKER and not self.name:
            return "broker default"
        return f"{self.type.name.lower()} {self.name}"


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
    adding_replicas: tuple[int, ...] = ()  # a reassignment in progress
    removing_replicas: tuple[int, ...] = ()
    elr: tuple[int, ...] = ()  # KIP-966's eligible leader replicas
    last_known_elr: tuple[int, ...] = ()


@dataclass(frozen=True)
class PartitionReassignment:
    """A partition being moved (Kafka's ``PartitionReassignment``): its replicas are the target
    followed by the ones leaving."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]


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
    cordoned: bool = False  # takes no new replicas (raftlog cluster cordon)


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
    raft_address: str = ""


@dataclass(frozen=True)
class ObserverDescription:
    """A broker following the metadata: its offset as of its last heartbeat, its lag."""

    node_id: int
    metadata_offset: int  # -1 = unknown
    lag: int  # -1 = unknown


@dataclass(frozen=True)
class RaftVoter:
    """A voter of the metadata quorum (KIP-853): CONTROLLER listener and Raft port."""

    node_id: int
    host: str
    port: int
    raft_port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class QuorumDescription:
    leader_id: int  # -1 = none
    leader_epoch: int  # the Raft term
    commit_index: int
    metadata_offset: int
    has_quorum: bool
    voters: tuple[VoterDescription, ...]
    observers: tuple[ObserverDescription, ...] = ()


# Kafka's Java ``ConfigEntry.ConfigSource`` names of the controller's ``ConfigSource`` values
CONFIG_SOURCE_NAMES = {
    pb.UNKNOWN_CONFIG: "UNKNOWN",
    pb.DYNAMIC_TOPIC_CONFIG: "DYNAMIC_TOPIC_CONFIG",
    pb.DYNAMIC_BROKER_CONFIG: "DYNAMIC_BROKER_CONFIG",
    pb.DYNAMIC_DEFAULT_BROKER_CONFIG: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    pb.STATIC_BROKER_CONFIG: "STATIC_BROKER_CONFIG",
    pb.DEFAULT_CONFIG: "DEFAULT_CONFIG",
    pb.GROUP_CONFIG: "DYNAMIC_GROUP_CONFIG",
}


class ConfigSynonym(NamedTuple):
    """A source that sets a config (Kafka's ``ConfigEntry.ConfigSynonym``)."""

    name: str
    value: str
    source: str  # a CONFIG_SOURCE_NAMES value


class ConfigEntry(NamedTuple):
    """A described config. ``source`` is Kafka's ``ConfigSource`` name (DYNAMIC_TOPIC_CONFIG,
    DEFAULT_CONFIG, ...); ``synonyms`` every source that sets it, the winning one first. The
    controller describes only the configs a resource can change dynamically, so no entry is
    read-only; none is sensitive (raftlog stores no password configs)."""

    name: str
    value: str
    is_default: bool
    source: str = "UNKNOWN"
    synonyms: tuple[ConfigSynonym, ...] = ()


def _config_entry(e: pb.ConfigEntry) -> ConfigEntry:
    synonyms = tuple(
        ConfigSynonym(s.name, s.value, CONFIG_SOURCE_NAMES.get(s.source, "UNKNOWN"))
        for s in e.synonyms
    )
    source = CONFIG_SOURCE_NAMES.get(e.source, "UNKNOWN")
    return ConfigEntry(e.name, e.value, e.is_default, source, synonyms)


class GroupListing(NamedTuple):
    group_id: str
    state: str
    group_type: str


@dataclass(frozen=True)
class LogDirDescription:
    """One broker's log directory (Kafka's ``describeLogDirs``): the filesystem's total and
    usable bytes and the size of each replica it hosts, keyed by partition."""

    broker_id: int
    path: str
    total_bytes: int
    usable_bytes: int
    replica_bytes: Mapping[TopicPartition, int]

    @property
    def used_bytes(self) -> int:
        """What the broker's replicas take (their segments and indexes)."""
        return sum(self.replica_bytes.values())


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    client_id: str
    member_epoch: int
    state: str
    subscribed_topics: tuple[str, ...]
    subscribed_pattern: str
    assignment: frozenset[TopicPartition]
    target_assignment: frozenset[TopicPartition]


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    coordinator_id: int
    members: tuple[MemberDescription, ...]
    group_type: str = "consumer"  # "classic" (epoch = the generation) or "share" (KIP-932)


def _member_description(m: gpb.DescribedMember) -> MemberDescription:
    return MemberDescription(
        m.member_id, m.client_id, m.member_epoch, m.state, tuple(m.subscribed_topic_names),
        m.subscribed_topic_regex, from_wire(m.assignment), from_wire(m.target_assignment),
    )  # fmt: skip


def _group_description(d: gpb.DescribedGroup) -> GroupDescription:
    return GroupDescription(
        d.group_id, d.state, d.group_epoch, d.assignment_epoch, d.assignor, d.coordinator_id,
        tuple(_member_description(m) for m in d.members), d.group_type or "consumer",
    )  # fmt: skip


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
        adding_replicas=tuple(state.adding_replicas),
        removing_replicas=tuple(state.removing_replicas),
        elr=tuple(state.eligible_leader_replicas),
        last_known_elr=tuple(state.last_known_elr),
    )


def _assignments(assignment: Mapping[int, Sequence[int]] | None) -> list[pb.ReplicaAssignment]:
    return [
        pb.ReplicaAssignment(partition=p, broker_ids=list(brokers))
        for p, brokers in sorted((assignment or {}).items())
    ]


def _raft_voters(response: pb.RaftVoterResponse) -> tuple[RaftVoter, ...]:
    return tuple(RaftVoter(v.node_id, v.host, v.port, v.raft_port) for v in response.voters)


class AdminClient(Closing):
    def __init__(
        self,
        bootstrap_servers: str | Sequence[str] | None = None,
        *,
        bootstrap_controllers: str | Sequence[str] | None = None,
        request_timeout_ms: int = 30_000,
        security: SecuritySetting = None,
    ) -> None:
        if (bootstrap_servers is None) == (bootstrap_controllers is None):
            raise ValueError("give exactly one of bootstrap_servers or bootstrap_controllers")
        if not 1 <= request_timeout_ms <= 600_000:
            raise ValueError(f"request_timeout_ms out of [1, 600000]: {request_timeout_ms}")
        self._timeout_s = request_timeout_ms / 1000
        self.security = client_security(security)
        self._brokers: Cluster | None = None
        if bootstrap_controllers is not None:
            controllers = (
                bootstrap_controllers.split(",")
                if isinstance(bootstrap_controllers, str)
                else list(bootstrap_controllers)
            )
        else:
            assert bootstrap_servers is not None, "checked above"
            self._brokers = Cluster(
                bootstrap_servers, request_timeout_ms=request_timeout_ms, security=self.security
            )
            try:
                controllers = list(self._brokers.refresh().controller_addresses)
            except KafkaError:
                self._brokers.close()
                raise
            if not controllers:
                self._brokers.close()
                raise KafkaError(ErrorCode.BROKER_NOT_AVAILABLE, "Metadata named no controller")
        self._controllers = ControllerClient(
            controllers, deadline_s=self._timeout_s, security=self.security
        )
        self._closed = threading.Event()

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
                cordoned=b.cordoned,
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
        """The quorum as the active controller sees it (any controller forwards the request
        there). A controller that knows no leader (cut off, or removed from the voters and
        never told) answers from its own view: another one that knows the leader is asked."""
        request = pb.DescribeQuorumRequest()
        response = self._controllers.call(
            "DescribeQuorum", request, deadline_s=self._timeout_s, any_node=True
        )
        for address in self._controllers.controllers if response.leader_id < 0 else ():
            try:
                other = self._controllers.stub(address).DescribeQuorum(request, timeout=2.0)
            except grpc.RpcError:
                continue
            if other.leader_id >= 0:
                response = other
                break
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
                VoterDescription(
                    v.node_id, v.address, v.match_index, v.lag, v.connected, v.raft_address
                )
                for v in response.voters
            ),
            observers=tuple(
                ObserverDescription(o.node_id, o.metadata_offset, o.lag) for o in response.observers
            ),
        )

    def add_raft_voter(self, voter: RaftVoter, cluster_id: str = "") -> tuple[RaftVoter, ...]:
        """Make a running controller a voter (Kafka's AddRaftVoter); the voters after it.
        DUPLICATE_VOTER if its id or an address is a voter's, REQUEST_TIMED_OUT if it does not
        answer (or another change is in flight), INCONSISTENT_CLUSTER_ID if it serves another
        cluster, INVALID_REQUEST if the new set would have no live majority."""
        wire = metadata_pb2.ControllerVoter(
            node_id=voter.node_id, host=voter.host, port=voter.port, raft_port=voter.raft_port
        )
        request = pb.AddRaftVoterRequest(cluster_id=cluster_id, voter=wire)
        return _raft_voters(self._checked("AddRaftVoter", request))

    def remove_raft_voter(self, voter_id: int, cluster_id: str = "") -> tuple[RaftVoter, ...]:
        """Remove a voter (Kafka's RemoveRaftVoter); the voters after it. VOTER_NOT_FOUND for
        an id that is not a voter, INVALID_REQUEST for the last voter or one whose removal
        leaves no live majority."""
        request = pb.RemoveRaftVoterRequest(cluster_id=cluster_id, voter_id=voter_id)
        return _raft_voters(self._checked("RemoveRaftVoter", request))

    def unregister_broker(self, broker_id: int, force: bool = False) -> None:
        """Remove a broker from the cluster's metadata (Kafka's ``unregisterBroker``). Refused
        (INVALID_REQUEST) while it still hosts replicas or is unfenced (running), unless
        ``force``; BROKER_ID_NOT_REGISTERED for an unknown broker."""
        request = pb.UnregisterBrokerRequest(broker_id=broker_id, force=force)
        self._checked("UnregisterBroker", request)

    def cordon_broker(self, broker_id: int, cordoned: bool = True) -> None:
        """Cordon a broker (no new replicas are placed on it; it keeps those it has and leads
        them) or, with ``cordoned=False``, lift the cordon. BROKER_ID_NOT_REGISTERED for an
        unknown broker; a no-op when it already is so."""
        request = pb.CordonBrokerRequest(broker_id=broker_id, cordoned=cordoned)
        self._checked("CordonBroker", request)

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

    # -- reassignment ----------------------------------------------------------------------
    def alter_partition_reassignments(
        self,
        reassignments: Mapping[TopicPartition | tuple[str, int], Sequence[int] | None],
        allow_replication_factor_change: bool = True,
    ) -> dict[TopicPartition, KafkaError | None]:
        """Move each partition to its target replicas (the first is the preferred leader), or
        cancel its move when the target is None (Kafka's alterPartitionReassignments). The
        move goes on in the cluster after this returns: follow it with
        :meth:`list_partition_reassignments`."""
        request = pb.AlterPartitionReassignmentsRequest(
            partitions=[
                pb.ReassignableTopicPartition(
                    topic=t, partition=p, replicas=list(target or ()), cancel=target is None
                )
                for (t, p), target in reassignments.items()
            ],
            allow_replication_factor_change=allow_replication_factor_change,
        )
        response = self._checked("AlterPartitionReassignments", request)
        return {
            TopicPartition(s.topic, s.partition): _item_error(s.error_code, s.error_message)
            for s in response.partitions
        }

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> dict[TopicPartition, PartitionReassignment]:
        """The partitions being moved (of ``partitions``, or all)."""
        request = pb.ListPartitionReassignmentsRequest(
            partitions=[pb.TopicPartition(topic=t, partition=p) for t, p in partitions or ()]
        )
        response = self._checked("ListPartitionReassignments", request)
        return {
            TopicPartition(s.topic, s.partition): PartitionReassignment(
                tuple(s.replicas), tuple(s.adding_replicas), tuple(s.removing_replicas)
            )
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
            result[resource] = {e.name: _config_entry(e) for e in described.entries}
        return result

    # -- consumer groups -------------------------------------------------------------------
    def _group(self, group_id: str) -> GroupClient:
        if self._brokers is None:
            raise ValueError("group calls need bootstrap_servers (brokers), not controllers")
        return GroupClient(self._brokers, group_id, self._closed, time.monotonic)

    def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        """Every consumer group of the cluster (asking every broker for the ones it
        coordinates), optionally only those in ``states`` (Empty, Stable, ...)."""
        if self._brokers is None:
            raise ValueError("group calls need bootstrap_servers (brokers), not controllers")
        snapshot = self._brokers.refresh()
        request = gpb.ListGroupsRequest(states_filter=list(states))
        found: dict[str, GroupListing] = {}
        for broker in snapshot.brokers.values():
            try:
                response = self._brokers.group_stub(broker).ListGroups(
                    request, timeout=self._timeout_s
                )
            except grpc.RpcError as error:
                raise rpc_error(error, f"ListGroups to broker {broker.node_id}") from error
            for group in response.groups:
                found[group.group_id] = GroupListing(group.group_id, group.state, group.group_type)
        return [found[g] for g in sorted(found)]

    def describe_groups(self, group_ids: Iterable[str]) -> dict[str, GroupDescription]:
        """Members, their subscriptions and assignments, per group; raises the first error
        (GROUP_ID_NOT_FOUND for an unknown group)."""
        result: dict[str, GroupDescription] = {}
        for group_id in group_ids:
            request = gpb.DescribeGroupsRequest(group_ids=[group_id])
            response = self._group(group_id).call(
                "DescribeGroups", request, self._timeout_s, lambda r: r.groups[0]
            )
            described = response.groups[0]
            if described.error_code:
                raise KafkaError(ErrorCode.from_code(described.error_code), described.error_message)
            result[group_id] = _group_description(described)
        return result

    def delete_groups(self, group_ids: Iterable[str]) -> dict[str, KafkaError | None]:
        """Delete empty groups with their offsets (NON_EMPTY_GROUP while members remain)."""
        result: dict[str, KafkaError | None] = {}
        for group_id in group_ids:
            request = gpb.DeleteGroupsRequest(group_ids=[group_id])
            response = self._group(group_id).call(
                "DeleteGroups", request, self._timeout_s, lambda r: r.results[0]
            )
            answer = response.results[0]
            result[group_id] = _item_error(answer.error_code, answer.error_message)
        return result

    def list_group_offsets(
        self, group_id: str, *, require_stable: bool = False
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Every offset the group committed. ``require_stable`` (Kafka's
        ``ListConsumerGroupOffsetsOptions.requireStable``, KIP-447): while a transaction's
        offsets wait for its marker the coordinator answers UNSTABLE_OFFSET_COMMIT, retried
        until the request timeout, so the answer never misses a commit in progress."""
        request = gpb.OffsetFetchRequest(group_id=group_id, require_stable=require_stable)
        group = self._group(group_id)
        deadline = time.monotonic() + self._timeout_s
        while True:
            response = group.call("OffsetFetch", request, max(0.001, deadline - time.monotonic()))
            codes = [ErrorCode.from_code(response.error_code)] + [
                ErrorCode.from_code(p.error_code) for t in response.topics for p in t.partitions
            ]
            if ErrorCode.UNSTABLE_OFFSET_COMMIT not in codes or time.monotonic() >= deadline:
                break
            self._closed.wait(self._brokers.backoff_s() if self._brokers else 0.1)
        if response.error_code:
            raise KafkaError(ErrorCode.from_code(response.error_code), response.error_message)
        unstable = [
            f"{t.name}-{p.partition}"
            for t in response.topics
            for p in t.partitions
            if p.error_code == ErrorCode.UNSTABLE_OFFSET_COMMIT.code
        ]
        if unstable:
            raise KafkaError(
                ErrorCode.UNSTABLE_OFFSET_COMMIT,
                f"group {group_id!r}: offsets of {', '.join(unstable)} still wait for a "
                "transaction's marker",
            )
        return {
            TopicPartition(t.name, p.partition): OffsetAndMetadata(
                p.committed_offset, p.metadata, p.committed_leader_epoch
            )
            for t in response.topics
            for p in t.partitions
            if p.committed_offset >= 0
        }

    def alter_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int | OffsetAndMetadata]
    ) -> dict[TopicPartition, KafkaError | None]:
        """Set a group's committed offsets: only while it has no members (UNKNOWN_MEMBER_ID
        otherwise), as Kafka's ``alterConsumerGroupOffsets``."""
        request = commit_request(group_id, "", -1, offsets)
        response = self._group(group_id).call("OffsetCommit", request, self._timeout_s)
        return {
            TopicPartition(t.name, p.partition): _item_error(p.error_code, p.error_message)
            for t in response.topics
            for p in t.partitions
        }

    def delete_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, KafkaError | None]:
        """Delete the group's committed offsets of ``partitions`` (OffsetDelete, Kafka's
        ``deleteConsumerGroupOffsets``): per partition GROUP_SUBSCRIBED_TO_TOPIC while a
        member subscribes to its topic; the group's own refusal (GROUP_ID_NOT_FOUND,
        NON_EMPTY_GROUP for a classic group of another protocol) is raised."""
        wanted = sorted({TopicPartition(*tp) for tp in partitions})
        by_topic: dict[str, list[int]] = {}
        for tp in wanted:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = gpb.OffsetDeleteRequest(
            group_id=group_id,
            topics=[gpb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()],
        )
        response = self._group(group_id).call("OffsetDelete", request, self._timeout_s)
        if response.error_code:
            raise KafkaError(ErrorCode.from_code(response.error_code), response.error_message)
        return {
            TopicPartition(t.name, p.partition): _item_error(p.error_code, p.error_message)
            for t in response.topics
            for p in t.partitions
        }

    # -- records ---------------------------------------------------------------------------
    def delete_records(
        self, offsets: Mapping[TopicPartition, int] | Mapping[tuple[str, int], int]
    ) -> dict[TopicPartition, DeletedRecords]:
        """Move each partition's log start offset up to its offset (-1: the high watermark),
        Kafka's ``deleteRecords``: records below it are no longer read, and each partition's
        outcome is its new low watermark or its error (OFFSET_OUT_OF_RANGE past the high
        watermark, TOPIC_AUTHORIZATION_FAILED without DELETE on the topic, ...)."""
        cluster = self._broker_cluster("delete_records")
        wanted = {TopicPartition(*tp): offset for tp, offset in offsets.items()}
        return records_calls.delete_records(cluster, wanted, self._closed, self._timeout_s)

    # -- transactions ----------------------------------------------------------------------
    def _broker_cluster(self, what: str) -> Cluster:
        if self._brokers is None:
            raise ValueError(f"{what} needs bootstrap_servers (brokers), not controllers")
        return self._brokers

    def describe_transactions(
        self, transactional_ids: Iterable[str]
    ) -> dict[str, TransactionDescription]:
        """Each transactional id's state at its coordinator (state, producer id and epoch,
        timeout, open transaction's start and partitions); raises the first error
        (TRANSACTIONAL_ID_NOT_FOUND for an unknown id)."""
        cluster = self._broker_cluster("describe_transactions")
        return txn_calls.describe_transactions(
            cluster, transactional_ids, self._closed, self._timeout_s
        )

    def list_transactions(
        self,
        states: Iterable[str] = (),
        producer_ids: Iterable[int] = (),
        duration_ms: int = 0,
    ) -> list[TransactionListing]:
        """Every transactional id of the cluster (asking every broker for the ones it
        coordinates), optionally only those in ``states`` (Kafka's names: Ongoing, ...), of
        ``producer_ids``, or open longer than ``duration_ms``."""
        cluster = self._broker_cluster("list_transactions")
        return txn_calls.list_transactions(
            cluster, states, producer_ids, duration_ms, self._timeout_s
        )

    def describe_log_dirs(
        self, broker_ids: Iterable[int] | None = None, topics: Iterable[str] = ()
    ) -> dict[int, LogDirDescription]:
        """Each broker's log directory (default: every live broker's), with the replicas of
        ``topics`` it hosts (none named: all). Raises CLUSTER_AUTHORIZATION_FAILED without
        DESCRIBE on the cluster."""
        cluster = self._broker_cluster("describe_log_dirs")
        brokers = cluster.refresh().brokers
        wanted = sorted(brokers) if broker_ids is None else sorted(set(broker_ids))
        request = bpb.DescribeLogDirsRequest(topics=sorted(set(topics)))
        found: dict[int, LogDirDescription] = {}
        for broker_id in wanted:
            broker = brokers.get(broker_id)
            if broker is None:
                raise KafkaError(ErrorCode.BROKER_NOT_AVAILABLE, f"no live broker {broker_id}")
            try:
                answer = cluster.stub(broker).DescribeLogDirs(request, timeout=self._timeout_s)
            except grpc.RpcError as error:
                raise rpc_error(error, f"DescribeLogDirs to broker {broker_id}") from error
            if answer.error_code:
                code = ErrorCode.from_code(answer.error_code)
                raise KafkaError(code, f"DescribeLogDirs to broker {broker_id}")
            sizes = {TopicPartition(r.topic, r.partition): r.size_bytes for r in answer.replicas}
            found[broker_id] = LogDirDescription(
                broker_id, answer.log_dir, answer.total_bytes, answer.usable_bytes, sizes
            )
        return found

    def describe_producers(
        self, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, tuple[ProducerState, ...]]:
        """The producers each partition's leader remembers (id, epoch, last sequence and
        timestamp, the open transaction's first offset)."""
        cluster = self._broker_cluster("describe_producers")
        wanted = [TopicPartition(*tp) for tp in partitions]
        return txn_calls.describe_producers(cluster, wanted, self._closed, self._timeout_s)

    # -- ACLs and SCRAM credentials (docs/security.md; see _admin_security) ----------------
    def create_acls(self, bindings: Iterable[AclBinding]) -> dict[AclBinding, KafkaError | None]:
        """Each ACL's outcome (an existing one is a success); SECURITY_DISABLED is raised when
        the controllers run no authorizer."""
        return security_calls.create_acls(self._checked, bindings)

    def describe_acls(self, acl_filter: AclFilter | None = None) -> list[AclBinding]:
        """The ACLs the filter matches (default: every ACL)."""
        return security_calls.describe_acls(self._checked, acl_filter or AclFilter())

    def delete_acls(self, filters: Iterable[AclFilter]) -> dict[AclFilter, AclDeleteResult]:
        """Each filter's deleted ACLs (or its error)."""
        return security_calls.delete_acls(self._checked, filters)

    def alter_user_scram_credentials(
        self,
        upsertions: Iterable[UserScramCredentialUpsertion] = (),
        deletions: Iterable[UserScramCredentialDeletion] = (),
    ) -> dict[str, KafkaError | None]:
        """Each user's outcome; the password is salted and hashed here, never sent."""
        return security_calls.alter_user_scram_credentials(self._checked, upsertions, deletions)

    def describe_user_scram_credentials(
        self, users: Iterable[str] | None = None
    ) -> dict[str, tuple[ScramCredentialInfo, ...]]:
        """Each user's mechanisms and iterations (default: every user); raises the first
        error (RESOURCE_NOT_FOUND for a user without credentials)."""
        return security_calls.describe_user_scram_credentials(self._checked, users)

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        self._closed.set()
        self._controllers.close()
        if self._brokers is not None:
            self._brokers.close()
