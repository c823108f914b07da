"""Auto-created topics and admin answers that wait for the broker's image, in process: the rule
(`plan_auto_create`, `answer_for`, the sizes), the shell (`AutoTopicCreation.fill_in`) over a
fake controller that commits into a fake image, and KafkaAdmin holding CreateTopics,
CreatePartitions and DeleteTopics answers until the image shows their change."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dataplane.broker.partition import IsrChange
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from dataplane.kafka.admin import PROPAGATION_WAIT_MIN_S, KafkaAdmin
from dataplane.kafka.auto_create import (
    AutoCreateSettings,
    AutoTopicCreation,
    answer_for,
    is_internal,
    plan_auto_create,
)
from dataplane.server.config import NodeConfig
from metadata_quorum.image import MetadataImage, apply
from metadata_quorum.records import (
    AccessControlEntryRecord,
    ConfigRecord,
    ConfigResourceType,
    PartitionRecord,
    RemoveTopic,
    TopicRecord,
)
from metadata_quorum.security.acl import (
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl, AuthorizerSettings
from metadata_quorum.security.principal import KafkaPrincipal, Session, acting_as
from protos import broker_pb2 as pb
from protos import controller_pb2 as cpb
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.broker.test_replication_core import Clock

UNKNOWN = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
INVALID = ErrorCode.INVALID_TOPIC_EXCEPTION


# -- the rule -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "enabled", "allowed", "expected"),
    [
        ("orders", True, True, None),  # created
        ("__orders", True, True, None),  # not one of Kafka's internal topics
        ("a" * 249, True, True, None),
        ("orders", False, True, UNKNOWN),  # auto.create.topics.enable=false
        ("orders", True, False, UNKNOWN),  # a consumer's request
        ("__consumer_offsets", True, True, UNKNOWN),
        ("__transaction_state", True, True, UNKNOWN),
        ("__share_group_state", True, True, UNKNOWN),
        ("bad name", True, True, INVALID),
        ("bad/name", False, False, INVALID),  # invalid whether or not creation is on
        (".", True, True, INVALID),
        ("..", True, True, INVALID),
        ("a" * 250, True, True, INVALID),
        ("", True, True, INVALID),
    ],
)
def test_which_topics_are_created_and_what_the_others_are_answered(
    name: str, enabled: bool, allowed: bool, expected: ErrorCode | None
) -> None:
    plan = plan_auto_create([name], allowed, enabled)
    if expected is None:
        assert plan.create == (name,) and not plan.refused
    else:
        assert plan.create == () and plan.refused[name].error is expected


def test_a_plan_keeps_the_order_asked_and_names_each_topic_once() -> None:
    plan = plan_auto_create(["b", "a", "b", "__consumer_offsets", "a!"], True, True)
    assert plan.create == ("b", "a")
    assert {n: e.error for n, e in plan.refused.items()} == {
        "__consumer_offsets": UNKNOWN, "a!": INVALID,
    }  # fmt: skip


def test_internal_topics_are_kafkas_three() -> None:
    assert is_internal("__consumer_offsets") and is_internal("__share_group_state")
    assert not is_internal("__cluster_metadata") and not is_internal("__my_topic")


@pytest.mark.parametrize(
    ("controller_said", "whole_request", "answered"),
    [
        (ErrorCode.NONE, False, ErrorCode.LEADER_NOT_AVAILABLE),
        (ErrorCode.TOPIC_ALREADY_EXISTS, False, ErrorCode.LEADER_NOT_AVAILABLE),
        (ErrorCode.REQUEST_TIMED_OUT, False, ErrorCode.LEADER_NOT_AVAILABLE),
        (ErrorCode.INVALID_REPLICATION_FACTOR, False, ErrorCode.INVALID_REPLICATION_FACTOR),
        (ErrorCode.TOPIC_AUTHORIZATION_FAILED, False, ErrorCode.TOPIC_AUTHORIZATION_FAILED),
        (ErrorCode.POLICY_VIOLATION, False, ErrorCode.POLICY_VIOLATION),
        (ErrorCode.NOT_CONTROLLER, True, UNKNOWN),  # no controller reachable: ask again
        (ErrorCode.REQUEST_TIMED_OUT, True, ErrorCode.LEADER_NOT_AVAILABLE),
    ],
)
def test_the_answer_while_the_image_does_not_show_the_topic(
    controller_said: ErrorCode, whole_request: bool, answered: ErrorCode
) -> None:
    assert answer_for(controller_said, "why", whole_request).error is answered


def cluster_wide(image: MetadataImage, **values: str) -> MetadataImage:
    records = [
        ConfigRecord(ConfigResourceType.BROKER, "", key.replace("_", "."), value)
        for key, value in values.items()
    ]
    updated, rejected = apply(image, records)
    assert not rejected
    return updated


def test_sizes_a_cluster_wide_value_wins_over_the_node_file() -> None:
    settings = AutoCreateSettings(num_partitions=4, default_replication_factor=2)
    assert settings.sizes(MetadataImage()) == (4, 2)
    assert settings.sizes(cluster_wide(MetadataImage(), num_partitions="6")) == (6, 2)
    image = cluster_wide(MetadataImage(), default_replication_factor="3")
    assert settings.sizes(image) == (4, 3)


def test_node_config_keys_have_kafkas_names_defaults_and_bounds(tmp_path: Path) -> None:
    base = {
        "node.id": 1, "process.roles": "broker", "listeners": "BROKER://127.0.0.1:9092",
        "controller.quorum.voters": "1@127.0.0.1:9093", "log.dirs": str(tmp_path),
    }  # fmt: skip
    config = NodeConfig.model_validate(base)
    assert (config.auto_create_topics_enable, config.num_partitions) == (True, 1)
    assert config.default_replication_factor == 1
    changed = NodeConfig.model_validate(
        {**base, "auto.create.topics.enable": False, "num.partitions": 3,
         "default.replication.factor": 2}
    )  # fmt: skip
    assert not changed.auto_create_topics_enable
    assert (changed.num_partitions, changed.default_replication_factor) == (3, 2)
    for key in ("num.partitions", "default.replication.factor"):
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            NodeConfig.model_validate({**base, key: 0})


# -- the shell ------------------------------------------------------------------------------------
class FakeCluster:
    """The controller and this broker's image: a CreateTopics commits the topics, which the
    image shows at once (``propagate``) or never."""

    def __init__(self, live_brokers: int = 3, propagate: bool = True) -> None:
        self.image = MetadataImage(offset=1)
        self.live_brokers = live_brokers
        self.propagate = propagate
        self.forwarded: list[cpb.CreateTopicsRequest] = []
        self.failure: KafkaError | None = None

    def checked(self, method: str, request: Any, deadline_s: float) -> Any:
        assert method == "CreateTopics" and deadline_s > 0
        self.forwarded.append(request)
        if self.failure is not None:
            raise self.failure
        results = []
        for topic in request.topics:
            if topic.replication_factor > self.live_brokers:
                results.append(cpb.CreatableTopicResult(
                    name=topic.name, error_code=ErrorCode.INVALID_REPLICATION_FACTOR.code,
                    error_message="replication factor 5 > 3 live brokers",
                ))  # fmt: skip
                continue
            topic_id = uuid.uuid4()
            if self.propagate:
                self.commit(
                    TopicRecord(topic.name, topic_id),
                    *(PartitionRecord(topic_id, p, (1,), (1,), 1)
                      for p in range(topic.num_partitions)),
                )  # fmt: skip
            results.append(cpb.CreatableTopicResult(name=topic.name, topic_id=topic_id.bytes))
        return cpb.CreateTopicsResponse(topics=results)

    def commit(self, *records: Any) -> None:
        self.image, rejected = apply(self.image, list(records))
        assert not rejected

    def wait_for_image(self, done: Any, timeout_s: float) -> MetadataImage:
        assert timeout_s >= 0
        return self.image

    def describe(self, names: list[str]) -> pb.MetadataResponse:
        response = pb.MetadataResponse()
        for name in names:
            topic = self.image.topic(name)
            out = response.topics.add(name=name)
            if topic is None:
                out.error_code = UNKNOWN.code
                continue
            for p, reg in sorted(topic.partitions.items()):
                out.partitions.add(partition=p, leader_id=reg.leader)
        return response


def creation(
    fake: FakeCluster,
    settings: AutoCreateSettings | None = None,
    access: AccessControl | None = None,
) -> AutoTopicCreation:
    return AutoTopicCreation(
        settings or AutoCreateSettings(num_partitions=2), fake,  # type: ignore[arg-type]
        lambda: fake.image, fake.wait_for_image, access or ALLOW_ALL,
    )  # fmt: skip


def answered(fake: FakeCluster, shell: AutoTopicCreation, names: list[str], allowed: bool = True
             ) -> dict[str, tuple[int, int]]:  # fmt: skip
    """(error code, partitions) per topic of a Metadata answer for ``names``."""
    response = fake.describe(names)
    shell.fill_in(response, allowed, fake.describe)
    return {t.name: (t.error_code, len(t.partitions)) for t in response.topics}


def test_a_missing_topic_is_created_and_described_with_its_leaders() -> None:
    fake = FakeCluster()
    shell = creation(fake)
    assert answered(fake, shell, ["new", "__consumer_offsets", "bad name"]) == {
        "new": (0, 2), "__consumer_offsets": (UNKNOWN.code, 0), "bad name": (INVALID.code, 0),
    }  # fmt: skip
    [request] = fake.forwarded
    assert [(t.name, t.num_partitions, t.replication_factor) for t in request.topics] == [
        ("new", 2, 1)
    ]


def test_nothing_is_created_when_the_request_or_the_broker_says_no() -> None:
    fake = FakeCluster()
    assert answered(fake, creation(fake), ["t"], allowed=False) == {"t": (UNKNOWN.code, 0)}
    off = creation(fake, AutoCreateSettings(enabled=False))
    assert answered(fake, off, ["t"]) == {"t": (UNKNOWN.code, 0)}
    assert fake.forwarded == [] and "t" not in fake.image.topic_ids


def test_a_replication_factor_above_the_live_brokers_is_answered_so() -> None:
    fake = FakeCluster(live_brokers=3)
    shell = creation(fake, AutoCreateSettings(default_replication_factor=5))
    code = ErrorCode.INVALID_REPLICATION_FACTOR.code
    assert answered(fake, shell, ["wide"]) == {"wide": (code, 0)}


def test_a_topic_the_image_does_not_show_yet_is_leader_not_available() -> None:
    fake = FakeCluster(propagate=False)
    code = ErrorCode.LEADER_NOT_AVAILABLE.code
    assert answered(fake, creation(fake), ["slow"]) == {"slow": (code, 0)}


def test_no_controller_leaves_the_topic_unknown_for_the_client_to_ask_again() -> None:
    fake = FakeCluster()
    fake.failure = KafkaError(ErrorCode.NOT_CONTROLLER, "CreateTopics: no controller answered")
    assert answered(fake, creation(fake), ["t"]) == {"t": (UNKNOWN.code, 0)}


def test_creating_needs_create_on_the_cluster_or_the_topic() -> None:
    fake = FakeCluster()
    bob = KafkaPrincipal.user("bob")

    def allow(resource: ResourceType, name: str, operation: AclOperation) -> None:
        binding = AclBinding(
            resource, name, PatternType.LITERAL, str(bob), "*", operation, PermissionType.ALLOW
        )
        fake.commit(AccessControlEntryRecord(binding))

    allow(ResourceType.TOPIC, "*", AclOperation.DESCRIBE)
    allow(ResourceType.TOPIC, "mine", AclOperation.CREATE)
    shell = creation(fake, access=AccessControl(lambda: fake.image, AuthorizerSettings()))
    with acting_as(Session(bob, "127.0.0.1", "KAFKA")):
        answer = answered(fake, shell, ["mine", "theirs"])
    denied = ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
    assert answer == {"mine": (0, 2), "theirs": (denied, 0)}
    assert [t.name for t in fake.forwarded[0].topics] == ["mine"]


def test_a_topic_being_created_for_another_request_is_not_sent_twice() -> None:
    fake = FakeCluster()
    shell = creation(fake)
    entered, release = threading.Event(), threading.Event()
    checked = fake.checked

    def slow(method: str, request: Any, deadline_s: float) -> Any:
        entered.set()
        assert release.wait(10)
        return checked(method, request, deadline_s)

    fake.checked = slow  # type: ignore[method-assign]
    first: dict[str, tuple[int, int]] = {}
    thread = threading.Thread(target=lambda: first.update(answered(fake, shell, ["t"])))
    thread.start()
    try:
        assert entered.wait(10)
        assert answered(fake, shell, ["t"]) == {"t": (UNKNOWN.code, 0)}
    finally:
        release.set()
        thread.join(10)
    assert first == {"t": (0, 2)} and len(fake.forwarded) == 1


# -- admin answers wait for the broker's image ----------------------------------------------------
class Waits:
    """wait_for_image that records each condition and evaluates it on the images given."""

    def __init__(self) -> None:
        self.conditions: list[tuple[Any, float]] = []

    def __call__(self, done: Any, timeout_s: float) -> MetadataImage:
        self.conditions.append((done, timeout_s))
        return MetadataImage()


class Controller:
    def __init__(self, response: Any) -> None:
        self.response = response

    def checked(self, method: str, request: Any, deadline_s: float) -> Any:
        return self.response


def admin_with(response: Any, image: MetadataImage, waits: Waits) -> KafkaAdmin:
    return KafkaAdmin(
        Controller(response), lambda: image, 1, "test", "KAFKA",  # type: ignore[arg-type]
        wait_for_image=waits,
    )  # fmt: skip


def topic_image(name: str, topic_id: uuid.UUID, partitions: int) -> MetadataImage:
    image, rejected = apply(
        MetadataImage(),
        [TopicRecord(name, topic_id)]
        + [PartitionRecord(topic_id, p, (1,), (1,), 1) for p in range(partitions)],
    )
    assert not rejected
    return image


def request(**body: Any) -> Any:
    return SimpleNamespace(api_version=5, body=SimpleNamespace(**body))


def test_create_topics_is_answered_once_the_image_shows_the_topic_with_its_id() -> None:
    topic_id = uuid.uuid4()
    waits = Waits()
    answer = cpb.CreateTopicsResponse(
        topics=[cpb.CreatableTopicResult(name="t", topic_id=topic_id.bytes, num_partitions=1)]
    )
    topic = SimpleNamespace(
        name="t", num_partitions=1, replication_factor=1, assignments=(), configs=()
    )
    admin_with(answer, MetadataImage(), waits).create_topics(
        request(topics=[topic], timeout=0, validate_only=False)
    )
    [(done, timeout_s)] = waits.conditions
    assert 0 < timeout_s <= PROPAGATION_WAIT_MIN_S  # a timeout of 0 still waits a moment
    assert not done(MetadataImage())
    assert not done(topic_image("t", uuid.uuid4(), 1))  # an older topic of the same name
    assert done(topic_image("t", topic_id, 1))
    waits.conditions.clear()
    admin_with(answer, MetadataImage(), waits).create_topics(
        request(topics=[topic], timeout=0, validate_only=True)
    )
    assert waits.conditions == []  # nothing was created


def test_create_partitions_is_answered_once_the_image_shows_the_new_count() -> None:
    topic_id = uuid.uuid4()
    waits = Waits()
    answer = cpb.CreatePartitionsResponse(topics=[cpb.TopicResult(name="t")])
    before = topic_image("t", topic_id, 1)
    admin_with(answer, before, waits).create_partitions(
        request(
            topics=[SimpleNamespace(name="t", count=3, assignments=None)], timeout=30_000,
            validate_only=False,
        )
    )  # fmt: skip
    [(done, timeout_s)] = waits.conditions
    assert timeout_s > PROPAGATION_WAIT_MIN_S  # the request's own timeout
    assert not done(before) and done(topic_image("t", topic_id, 3))


def test_delete_topics_is_answered_once_the_image_lost_the_topic() -> None:
    topic_id = uuid.uuid4()
    waits = Waits()
    answer = cpb.DeleteTopicsResponse(
        topics=[cpb.DeletableTopicResult(name="t", topic_id=topic_id.bytes)]
    )
    before = topic_image("t", topic_id, 1)
    admin_with(answer, before, waits).delete_topics(request(topic_names=["t"], timeout=5_000))
    [(done, _)] = waits.conditions
    gone, rejected = apply(before, [RemoveTopic(topic_id)])
    assert not rejected
    assert not done(before) and done(gone) and done(topic_image("t", uuid.uuid4(), 1))


def test_the_replica_manager_wakes_a_waiter_with_each_image(tmp_path: Path) -> None:
    def alter(change: IsrChange) -> None:
        pass

    def failed(directory: Path, error: OSError) -> None:
        raise AssertionError(f"{directory}: {error}")

    manager = ReplicaManager(1, tmp_path, ReplicaManagerConfig(), Clock(), alter, failed)
    try:
        later = threading.Timer(0.05, lambda: manager.apply_image(MetadataImage(offset=5), True))
        later.start()
        shown = manager.wait_for_image(lambda image: image.offset >= 5, 30.0)
        later.join()
        assert shown.offset == 5
        # the condition never holds: the newest image once the time is up
        assert manager.wait_for_image(lambda image: False, 0.01).offset == 5
    finally:
        manager.close()
