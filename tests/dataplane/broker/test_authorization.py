"""Every request asks AccessControl first (issue 28), in process: the broker's servicers, the
group and transaction coordinators and the controller, each under
``acting_as(Session(User:bob, ...))`` with an authorizer over an image holding ACLs (replayed
AccessControlEntryRecords), answered with Kafka's errors per topic, group or transactional id."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dataplane.broker.authorization import (
    SUPPORTED_OPERATIONS,
    authorized_operations,
    described_groups,
)
from dataplane.broker.metrics import NodeMetrics
from dataplane.broker.partition import IsrChange
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from dataplane.broker.service import BrokerServicer
from dataplane.coordinator import classic_group as cg
from dataplane.coordinator.group_coordinator import GroupConfig, GroupCoordinator
from dataplane.coordinator.transaction_coordinator import TransactionServicer
from dataplane.kafka.admin import KafkaAdmin
from metadata_quorum.image import MetadataImage, apply
from metadata_quorum.records import AccessControlEntryRecord
from metadata_quorum.request_authorization import authorized
from metadata_quorum.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl, AuthorizerSettings
from metadata_quorum.security.principal import KafkaPrincipal, Session, acting_as
from metadata_quorum.service import ControllerServicer
from protos import broker_pb2 as pb
from protos import controller_pb2 as cpb
from protos import group_pb2 as gpb
from protos import transaction_pb2 as tpb
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import encode_batch
from tests.dataplane.broker.test_replication_core import Clock
from tests.dataplane.broker.test_transactions_service import TOPIC, image

BOB = Session(KafkaPrincipal.user("bob"), "127.0.0.1", "BROKER")
ALLOW, DENY = PermissionType.ALLOW, PermissionType.DENY
TOPIC_T, GROUP_T, CLUSTER_T = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
TXN_T = ResourceType.TRANSACTIONAL_ID
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
Op = AclOperation


def acl(
    resource_type: ResourceType,
    name: str,
    operation: AclOperation,
    permission: PermissionType = ALLOW,
    pattern: PatternType = LITERAL,
    principal: str = "User:bob",
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, "*", operation, permission)


def with_acls(base: MetadataImage, *bindings: AclBinding) -> MetadataImage:
    updated, rejected = apply(base, [AccessControlEntryRecord(b) for b in bindings])
    assert not rejected
    return updated


class Images:
    """The image an AccessControl reads; a test swaps in its ACLs."""

    def __init__(self, current: MetadataImage) -> None:
        self.current = current

    def access(self) -> AccessControl:
        return AccessControl(lambda: self.current, AuthorizerSettings())


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[ReplicaManager]:
    def alter(change: IsrChange) -> None:
        pass

    def failed(directory: Path, error: OSError) -> None:
        raise AssertionError(f"no log dir failure expected: {directory}: {error}")

    manager = ReplicaManager(1, tmp_path, ReplicaManagerConfig(), Clock(), alter, failed)
    manager.apply_image(image(), caught_up=True)
    yield manager
    manager.close()


@pytest.fixture
def images() -> Images:
    return Images(image())


@pytest.fixture
def servicer(replicas: ReplicaManager, images: Images) -> BrokerServicer:
    return BrokerServicer(
        1, replicas, NodeMetrics(), "test", [], lambda c: None, lambda: 7, access=images.access()
    )


def produce(
    servicer: BrokerServicer, *values: bytes, txn_id: str = ""
) -> pb.ProducePartitionResponse:
    batch = encode_batch([(None, v, 1_000_000, ()) for v in values])
    request = pb.ProduceRequest(
        acks=1, timeout_ms=5_000, transactional_id=txn_id,
        topics=[pb.ProduceTopic(name=TOPIC, partitions=[
            pb.ProducePartition(partition=0, records=batch)])],
    )  # fmt: skip
    with acting_as(BOB):
        return servicer.Produce(request, None).topics[0].partitions[0]


def fetch(servicer: BrokerServicer, replica_id: int = -1) -> pb.FetchPartitionResponse:
    request = pb.FetchRequest(
        replica_id=replica_id, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
        topics=[pb.FetchTopic(name=TOPIC, partitions=[
            pb.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                              current_leader_epoch=-1)])],
    )  # fmt: skip
    with acting_as(BOB):
        return servicer.Fetch(request, None).topics[0].partitions[0]


def log_end(replicas: ReplicaManager) -> int:
    return replicas.get(TOPIC, 0).log.log_end_offset


# -- the broker ---------------------------------------------------------------------------------
def test_a_reader_may_fetch_but_not_produce(
    servicer: BrokerServicer, replicas: ReplicaManager, images: Images
) -> None:
    images.current = with_acls(image(), acl(TOPIC_T, TOPIC, Op.READ))
    before = log_end(replicas)
    refused = produce(servicer, b"bob's")
    assert refused.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
    assert log_end(replicas) == before  # nothing stored
    assert fetch(servicer).error_code == 0


def test_no_acl_denies_everything(servicer: BrokerServicer, replicas: ReplicaManager) -> None:
    """With an authorizer and allow.everyone.if.no.acl.found false, bob may do nothing; the
    node itself (no session) still may."""
    assert produce(servicer, b"x").error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
    assert fetch(servicer).error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
    assert log_end(replicas) == 0


def test_prefixed_acl_matches_only_its_prefix(servicer: BrokerServicer, images: Images) -> None:
    images.current = with_acls(image(), acl(TOPIC_T, TOPIC[:3], Op.WRITE, pattern=PREFIXED))
    assert produce(servicer, b"x").error_code == 0
    images.current = with_acls(image(), acl(TOPIC_T, "invoices", Op.WRITE, pattern=PREFIXED))
    assert produce(servicer, b"x").error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED.code


def test_deny_overrides_allow(servicer: BrokerServicer, images: Images) -> None:
    images.current = with_acls(
        image(),
        acl(TOPIC_T, "*", Op.ALL),
        acl(TOPIC_T, TOPIC, Op.WRITE, DENY),
    )
    assert produce(servicer, b"x").error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
    assert fetch(servicer).error_code == 0


def test_metadata_hides_what_bob_may_not_describe(servicer: BrokerServicer, images: Images) -> None:
    with acting_as(BOB):
        everything = servicer.Metadata(pb.MetadataRequest(all_topics=True), None)
        named = servicer.Metadata(pb.MetadataRequest(topics=[TOPIC]), None)
    assert [t.name for t in everything.topics] == []
    assert named.topics[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
    assert not named.topics[0].partitions  # nothing said about it
    images.current = with_acls(image(), acl(TOPIC_T, TOPIC, Op.READ))  # READ implies DESCRIBE
    with acting_as(BOB):
        everything = servicer.Metadata(pb.MetadataRequest(all_topics=True), None)
    assert [t.name for t in everything.topics] == [TOPIC]


def test_list_offsets_needs_describe(servicer: BrokerServicer, images: Images) -> None:
    request = pb.ListOffsetsRequest(replica_id=-1, topics=[pb.ListOffsetsTopic(
        name=TOPIC, partitions=[pb.ListOffsetsPartition(partition=0, timestamp=-1,
                                                        current_leader_epoch=-1)])])  # fmt: skip
    with acting_as(BOB):
        refused = servicer.ListOffsets(request, None).topics[0].partitions[0]
    assert refused.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
    images.current = with_acls(image(), acl(TOPIC_T, TOPIC, Op.DESCRIBE))
    with acting_as(BOB):
        assert servicer.ListOffsets(request, None).topics[0].partitions[0].error_code == 0


def test_replica_fetch_needs_cluster_action(servicer: BrokerServicer, images: Images) -> None:
    images.current = with_acls(image(), acl(TOPIC_T, TOPIC, Op.ALL))
    assert fetch(servicer, replica_id=2).error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
    images.current = with_acls(image(), acl(CLUSTER_T, CLUSTER_NAME, Op.CLUSTER_ACTION))
    # past the authorizer, the partition answers: broker 2 is no replica of partition 0
    assert fetch(servicer, replica_id=2).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code


def test_write_txn_markers_needs_cluster_action(servicer: BrokerServicer) -> None:
    request = pb.WriteTxnMarkersRequest(markers=[pb.TxnMarker(
        producer_id=5, producer_epoch=0, committed=True, coordinator_epoch=0,
        topics=[pb.TxnMarkerTopic(name=TOPIC, partitions=[0])])])  # fmt: skip
    with acting_as(BOB):
        result = servicer.WriteTxnMarkers(request, None).markers[0].topics[0].partitions[0]
    assert result.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code


def test_init_producer_id(servicer: BrokerServicer, images: Images) -> None:
    with acting_as(BOB):
        idempotent = servicer.InitProducerId(pb.InitProducerIdRequest(), None)
        transactional = servicer.InitProducerId(
            pb.InitProducerIdRequest(transactional_id="bob-txn"), None
        )
    assert idempotent.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code
    assert transactional.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
    images.current = with_acls(image(), acl(TOPIC_T, "any", Op.WRITE, pattern=PREFIXED))
    with acting_as(BOB):  # WRITE on some topic is enough for an idempotent producer (KIP-679)
        assert servicer.InitProducerId(pb.InitProducerIdRequest(), None).producer_id == 7


def test_transactional_produce_needs_the_transactional_id(
    servicer: BrokerServicer, replicas: ReplicaManager, images: Images
) -> None:
    images.current = with_acls(image(), acl(TOPIC_T, TOPIC, Op.WRITE))
    batch = encode_batch([(None, b"t", 1_000_000, ())], producer_id=3, producer_epoch=0,
                         base_sequence=0, is_transactional=True)  # fmt: skip
    request = pb.ProduceRequest(
        acks=1, timeout_ms=5_000, transactional_id="bob-txn",
        topics=[pb.ProduceTopic(name=TOPIC, partitions=[
            pb.ProducePartition(partition=0, records=batch)])],
    )  # fmt: skip
    with acting_as(BOB):
        result = servicer.Produce(request, None).topics[0].partitions[0]
    assert result.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
    assert log_end(replicas) == 0


def test_denials_are_audited_with_the_resource(
    servicer: BrokerServicer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="raftlog.audit"):
        produce(servicer, b"x")
    assert any(
        "principal=User:bob" in r.message and f"resource=TOPIC:{TOPIC}" in r.message
        and "operation=WRITE" in r.message
        for r in caplog.records
    ), [r.message for r in caplog.records]  # fmt: skip


# -- groups and transactions --------------------------------------------------------------------
def test_list_groups_shows_only_described_groups(images: Images) -> None:
    access = images.access()
    images.current = with_acls(image(), acl(GROUP_T, "team-", Op.READ, pattern=PREFIXED))
    with acting_as(BOB):
        assert described_groups(access, ["team-a", "other", "team-b"]) == ["team-a", "team-b"]
    images.current = with_acls(image(), acl(CLUSTER_T, CLUSTER_NAME, Op.DESCRIBE))
    with acting_as(BOB):
        assert described_groups(access, ["team-a", "other"]) == ["team-a", "other"]


class Coordinator:
    """Records what the transaction servicer passed on (nothing, when refused)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def add_partitions(self, *args: Any) -> dict[tuple[str, int], ErrorCode]:
        self.calls.append("add_partitions")
        return {tp: ErrorCode.NONE for tp in args[3]}

    def end_transaction(self, *args: Any) -> None:
        self.calls.append("end_transaction")

    def add_offsets(self, *args: Any) -> None:
        self.calls.append("add_offsets")


def test_transactional_id_denied(images: Images) -> None:
    coordinator = Coordinator()
    servicer = TransactionServicer(coordinator, images.access())  # type: ignore[arg-type]
    images.current = with_acls(image(), acl(TOPIC_T, TOPIC, Op.WRITE))
    add = tpb.AddPartitionsToTxnRequest(
        transactional_id="bob-txn", producer_id=3, producer_epoch=0,
        topics=[tpb.TopicPartitions(topic=TOPIC, partitions=[0])],
    )  # fmt: skip
    with acting_as(BOB):
        refused = servicer.AddPartitionsToTxn(add, None)
        ended = servicer.EndTxn(tpb.EndTxnRequest(transactional_id="bob-txn"), None)
    assert refused.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
    assert ended.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
    assert coordinator.calls == []
    images.current = with_acls(
        image(), acl(TXN_T, "bob-", Op.WRITE, pattern=PREFIXED), acl(TOPIC_T, "other", Op.WRITE)
    )
    with acting_as(BOB):
        partly = servicer.AddPartitionsToTxn(add, None)
        offsets = servicer.AddOffsetsToTxn(
            tpb.AddOffsetsToTxnRequest(transactional_id="bob-txn", group_id="g"), None
        )
    assert [r.error_code for r in partly.results] == [ErrorCode.TOPIC_AUTHORIZATION_FAILED.code]
    assert offsets.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED.code
    assert coordinator.calls == []
    images.current = with_acls(
        image(), acl(TXN_T, "bob-", Op.WRITE, pattern=PREFIXED), acl(TOPIC_T, TOPIC, Op.WRITE)
    )
    with acting_as(BOB):
        assert servicer.AddPartitionsToTxn(add, None).results[0].error_code == 0
    assert coordinator.calls == ["add_partitions"]


# -- the controller -----------------------------------------------------------------------------
class Controller:
    """What ControllerServicer reads of its QuorumController for these RPCs."""

    def __init__(self, state_image: MetadataImage) -> None:
        self.state = SimpleNamespace(image=state_image)
        self.writes = 0
        self.node_id = 1

    def active_controller_id(self) -> int:
        return 1

    def voters(self) -> list[Any]:
        return []

    def now_ms(self) -> int:
        return 0

    def write(self, generate: Any) -> Any:
        self.writes += 1
        raise AssertionError("a refused request must not be written")


def test_register_broker_without_cluster_action_is_refused(images: Images) -> None:
    controller = Controller(image())
    servicer = ControllerServicer(controller, "test", images.access())  # type: ignore[arg-type]
    with acting_as(BOB):
        answer = servicer.RegisterBroker(cpb.RegisterBrokerRequest(broker_id=9), None)
    assert answer.status.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code
    assert controller.writes == 0


def test_controller_topic_requests_refused_per_topic(images: Images) -> None:
    """CreateTopics: CREATE on the cluster or the topic; the allowed topics are served, the
    others answered TOPIC_AUTHORIZATION_FAILED in their place."""
    images.current = with_acls(image(), acl(TOPIC_T, "bob-", Op.CREATE, pattern=PREFIXED))
    access = images.access()
    request = cpb.CreateTopicsRequest(topics=[
        cpb.CreatableTopic(name="alice-1"), cpb.CreatableTopic(name="bob-1")])  # fmt: skip
    served: list[list[str]] = []

    def serve(allowed: cpb.CreateTopicsRequest) -> cpb.CreateTopicsResponse:
        served.append([t.name for t in allowed.topics])
        return cpb.CreateTopicsResponse(topics=[cpb.CreatableTopicResult(name="bob-1")])

    with acting_as(BOB):
        answer = authorized(access, "CreateTopics", request, serve)
    assert served == [["bob-1"]]
    assert [(t.name, t.error_code) for t in answer.topics] == [
        ("alice-1", ErrorCode.TOPIC_AUTHORIZATION_FAILED.code), ("bob-1", 0),
    ]  # fmt: skip
    images.current = with_acls(image(), acl(CLUSTER_T, CLUSTER_NAME, Op.CREATE))
    with acting_as(BOB):
        answer = authorized(access, "CreateTopics", request, lambda r: r)
    assert len(answer.topics) == 2  # CREATE on the cluster: every topic goes through


class Shard:
    """A loaded ``__consumer_offsets`` shard as list_groups reads it."""

    def __init__(self, groups: list[str]) -> None:
        self.lock = threading.Lock()
        self.state = SimpleNamespace(
            group_ids=lambda: groups,
            group_state=lambda g: "Empty",
            group_type=lambda g: "classic",
            protocol_type=lambda g: "",
        )


@pytest.fixture
def groups(replicas: ReplicaManager, images: Images) -> GroupCoordinator:
    def create_topic(name: str, partitions: int, rf: int, configs: Any) -> None:
        raise AssertionError("nothing is created for a refused request")

    coordinator = GroupCoordinator(1, GroupConfig(), replicas, create_topic, Clock())
    coordinator.access = images.access()
    return coordinator


def test_group_requests_need_the_group(groups: GroupCoordinator, images: Images) -> None:
    """Refused before any state is looked at (this broker has no ``__consumer_offsets``: a
    request that passes the authorizer meets COORDINATOR_NOT_AVAILABLE instead)."""
    calls: dict[str, Callable[[], object]] = {
        "join": lambda: groups.join_group(cg.JoinRequest(
            group_id="g", member_id="", group_instance_id=None, client_id="c", client_host="h",
            session_timeout_ms=10_000, rebalance_timeout_ms=10_000, protocol_type="consumer",
            protocols=(("range", b""),), require_known_member_id=True)),
        "heartbeat": lambda: groups.classic_heartbeat("g", 1, "m", None),
        "commit": lambda: groups.commit("g", "m", 1, []),
        "fetch": lambda: groups.fetch_offsets("g", None),
        "describe": lambda: groups.describe_group("g"),
        "delete": lambda: groups.delete_group("g"),
    }  # fmt: skip
    for name, call in calls.items():
        with acting_as(BOB), pytest.raises(KafkaError) as refused:
            call()
        assert refused.value.error is ErrorCode.GROUP_AUTHORIZATION_FAILED, name
    images.current = with_acls(image(), acl(GROUP_T, "g", Op.ALL))
    for name, call in calls.items():
        with acting_as(BOB), pytest.raises(KafkaError) as passed:
            call()
        assert passed.value.error is not ErrorCode.GROUP_AUTHORIZATION_FAILED, name


def test_consumer_group_heartbeat_needs_describe_on_each_subscribed_topic(
    groups: GroupCoordinator, images: Images
) -> None:
    """Kafka 4's rule: READ on the group is not enough to subscribe to a topic the member may
    not DESCRIBE; the heartbeat is refused whole, before the group's state is looked at."""
    request = gpb.ConsumerGroupHeartbeatRequest(
        group_id="g", member_epoch=0, rebalance_timeout_ms=10_000,
        subscribed_topic_names=gpb.TopicNames(names=[TOPIC, "secret"]),
    )  # fmt: skip
    images.current = with_acls(image(), acl(GROUP_T, "g", Op.READ), acl(TOPIC_T, TOPIC, Op.READ))
    with acting_as(BOB), pytest.raises(KafkaError) as refused:
        groups.heartbeat(request)
    assert refused.value.error is ErrorCode.TOPIC_AUTHORIZATION_FAILED
    images.current = with_acls(image(), acl(GROUP_T, "g", Op.READ), acl(TOPIC_T, "*", Op.DESCRIBE))
    with acting_as(BOB), pytest.raises(KafkaError) as passed:  # no __consumer_offsets here
        groups.heartbeat(request)
    assert passed.value.error is ErrorCode.NOT_COORDINATOR


def test_authorized_operations_are_what_the_acls_allow(images: Images) -> None:
    """Kafka's bit field: bit n for the operation with code n; READ implies DESCRIBE; every
    supported operation without an authorizer; not computed unless asked."""
    access = images.access()
    images.current = with_acls(image(), acl(TOPIC_T, TOPIC, Op.READ))
    with acting_as(BOB):
        bits = authorized_operations(access, TOPIC_T, TOPIC)
        assert bits == (1 << Op.READ) | (1 << Op.DESCRIBE)
        assert authorized_operations(access, TOPIC_T, "other") == 0
        assert authorized_operations(access, TOPIC_T, TOPIC, requested=False) == -(2**31)
    cluster_ops = authorized_operations(ALLOW_ALL, CLUSTER_T, CLUSTER_NAME)
    assert cluster_ops == sum(1 << op for op in SUPPORTED_OPERATIONS[CLUSTER_T])


def test_list_groups_is_filtered(
    groups: GroupCoordinator, images: Images, monkeypatch: pytest.MonkeyPatch
) -> None:
    shards = [Shard(["team-a", "other"]), Shard(["team-b"])]
    monkeypatch.setattr(groups.runtime, "loaded_shards", lambda: shards)
    images.current = with_acls(image(), acl(GROUP_T, "team-", Op.DESCRIBE, pattern=PREFIXED))
    with acting_as(BOB):
        assert [g for g, *_ in groups.list_groups()] == ["team-a", "team-b"]
    assert [g for g, *_ in groups.list_groups()] == ["other", "team-a", "team-b"]  # the node


class ForwardedTo:
    """The broker's controller client: records what the broker forwarded."""

    def __init__(self) -> None:
        self.forwarded: list[tuple[str, list[str]]] = []

    def checked(self, method: str, request: Any, deadline_s: float) -> Any:
        self.forwarded.append((method, [t.name for t in request.topics]))
        return cpb.CreateTopicsResponse(
            topics=[cpb.CreatableTopicResult(name=t.name) for t in request.topics]
        )


def test_kafka_admin_authorizes_before_forwarding(images: Images) -> None:
    """The broker forwards with its own identity: it refuses what bob may not do itself."""
    controller = ForwardedTo()
    admin = KafkaAdmin(controller, lambda: images.current, 1, "test", "KAFKA", images.access())  # type: ignore[arg-type]
    images.current = with_acls(image(), acl(TOPIC_T, "bob-1", Op.CREATE))
    request = cpb.CreateTopicsRequest(
        topics=[cpb.CreatableTopic(name="bob-1"), cpb.CreatableTopic(name="alice-1")]
    )
    with acting_as(BOB):
        answer = admin._forward("CreateTopics", request, 5_000)
        with pytest.raises(KafkaError) as refused:
            admin._forward(
                "AlterPartitionReassignments", cpb.AlterPartitionReassignmentsRequest(), 5_000
            )
        cluster = admin.describe_cluster(SimpleNamespace(body=SimpleNamespace()))  # type: ignore[arg-type]
    assert controller.forwarded == [("CreateTopics", ["bob-1"])]
    assert [(t.name, t.error_code) for t in answer.topics] == [
        ("bob-1", 0), ("alice-1", ErrorCode.TOPIC_AUTHORIZATION_FAILED.code),
    ]  # fmt: skip
    assert refused.value.error is ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert cluster["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code
