"""Metadata records: plain, immutable values; the only way the metadata image changes.

The active controller *generates* records from requests; every controller and broker *replays*
them (``metadata_quorum.image``). Each record carries the preconditions it was computed against
(a broker epoch, a partition epoch), so a record that lost a race is rejected the same way on
every node. ``metadata_quorum.codec`` maps them to and from their protobuf form.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass

from metadata_quorum.security.acl import AclBinding
from metadata_quorum.security.scram import ScramCredential, ScramMechanism

NO_LEADER = -1


@dataclass(frozen=True)
class Endpoint:
    name: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class RegisterBroker:
    """A broker (re)registers; its broker epoch becomes this record's metadata offset. Fenced.
    ``static_configs``: the dynamic broker configs its node config file sets, sorted (name,
    value) pairs (see metadata_quorum.configs: below every dynamic value)."""

    broker_id: int
    incarnation_id: str
    endpoints: tuple[Endpoint, ...]
    rack: str | None
    static_configs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class UnregisterBroker:
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True)
class FenceBroker:
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True)
class UnfenceBroker:
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True)
class BrokerRegistrationChange:
    broker_id: int
    broker_epoch: int
    in_controlled_shutdown: bool


@dataclass(frozen=True)
class CordonBroker:
    """Cordon a broker (``cordoned``) or lift its cordon: placement puts no new replica on a
    cordoned broker, which keeps the replicas and leaderships it has (KIP-1066's cordoned log
    directories, at the level of the whole broker). Keyed by broker id, not epoch: a cordon
    outlives the broker's restarts (re-registrations) until it is lifted or the broker is
    unregistered."""

    broker_id: int
    cordoned: bool


@dataclass(frozen=True)
class TopicRecord:
    name: str
    topic_id: uuid.UUID


@dataclass(frozen=True)
class PartitionRecord:
    topic_id: uuid.UUID
    partition_id: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    adding_replicas: tuple[int, ...] = ()  # a reassignment in progress (KIP-455), see image.py
    removing_replicas: tuple[int, ...] = ()
    # KIP-966 (eligible.leader.replicas.version 1): see image.PartitionRegistration
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()


@dataclass(frozen=True)
class PartitionChange:
    """Compare-and-set on ``expected_partition_epoch``; ``None`` fields are unchanged."""

    topic_id: uuid.UUID
    partition_id: int
    expected_partition_epoch: int
    leader: int | None = None
    isr: tuple[int, ...] | None = None
    replicas: tuple[int, ...] | None = None
    adding_replicas: tuple[int, ...] | None = None
    removing_replicas: tuple[int, ...] | None = None
    elr: tuple[int, ...] | None = None
    last_known_elr: tuple[int, ...] | None = None


@dataclass(frozen=True)
class RemoveTopic:
    topic_id: uuid.UUID


class ConfigResourceType(enum.IntEnum):
    """Kafka's resource type codes for DescribeConfigs / AlterConfigs."""

    TOPIC = 2
    BROKER = 4
    CLIENT_METRICS = 16  # KIP-714 subscriptions (metadata_quorum/client_metrics_configs.py)
    GROUP = 32  # Kafka 4's group configs (metadata_quorum/group_configs.py)


@dataclass(frozen=True)
class ConfigRecord:
    """Set (``value`` given) or delete (``None``) one config override of a resource."""

    resource_type: ConfigResourceType
    resource_name: str
    name: str
    value: str | None


@dataclass(frozen=True)
class ProducerIdsRecord:
    """Hands ``broker_id`` the block ending at ``next_producer_id`` (exclusive)."""

    broker_id: int
    broker_epoch: int
    next_producer_id: int


@dataclass(frozen=True)
class LeaderChange:
    """A newly active controller names itself before serving writes."""

    leader_id: int
    term: int


@dataclass(frozen=True)
class ControllerVoter:
    """A voter of the metadata quorum: its node id, the CONTROLLER listener (gRPC) clients use,
    the Raft port voters use (on the same host)."""

    node_id: int
    host: str
    port: int
    raft_port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"


@dataclass(frozen=True)
class VotersRecord:
    """The whole voter set of the metadata quorum (KIP-853's VotersRecord), written by the
    active controller after each committed membership change and when the image's set is not
    the Raft log's (the first active controller, a change whose record a failover lost)."""

    voters: tuple[ControllerVoter, ...]


@dataclass(frozen=True)
class AccessControlEntryRecord:
    """An ACL is created (Kafka's AccessControlEntryRecord); an identical one is refused."""

    binding: AclBinding


@dataclass(frozen=True)
class RemoveAccessControlEntryRecord:
    binding: AclBinding


@dataclass(frozen=True)
class UserScramCredentialRecord:
    """A user's SCRAM credential for one mechanism is set or replaced (KIP-554): the salt,
    iterations, StoredKey and ServerKey, never the password."""

    name: str
    credential: ScramCredential


@dataclass(frozen=True)
class RemoveUserScramCredentialRecord:
    name: str
    mechanism: ScramMechanism


@dataclass(frozen=True)
class FeatureLevelRecord:
    """A feature's finalized level (Kafka's FeatureLevelRecord, KIP-584/778); level 0 turns the
    feature off. metadata_quorum.features decides which levels are allowed."""

    name: str
    feature_level: int


MetadataRecord = (
    RegisterBroker
    | UnregisterBroker
    | FenceBroker
    | UnfenceBroker
    | BrokerRegistrationChange
    | CordonBroker
    | TopicRecord
    | PartitionRecord
    | PartitionChange
    | RemoveTopic
    | ConfigRecord
    | ProducerIdsRecord
    | LeaderChange
    | VotersRecord
    | AccessControlEntryRecord
    | RemoveAccessControlEntryRecord
    | UserScramCredentialRecord
    | RemoveUserScramCredentialRecord
    | FeatureLevelRecord
)

RECORD_TYPES: tuple[type, ...] = (
    RegisterBroker,
    UnregisterBroker,
    FenceBroker,
    UnfenceBroker,
    BrokerRegistrationChange,
    CordonBroker,
    TopicRecord,
    PartitionRecord,
    PartitionChange,
    RemoveTopic,
    ConfigRecord,
    ProducerIdsRecord,
    LeaderChange,
    VotersRecord,
    AccessControlEntryRecord,
    RemoveAccessControlEntryRecord,
    UserScramCredentialRecord,
    RemoveUserScramCredentialRecord,
    FeatureLevelRecord,
)
