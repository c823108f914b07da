"""Dynamic config arithmetic at the controller: Kafka's precedence for a broker's configs (its
own dynamic value > the cluster-wide dynamic default > its config file > Kafka's default) with
the source DescribeConfigs names, and AlterConfigs / IncrementalAlterConfigs (SET, DELETE,
APPEND, SUBTRACT; the legacy request replaces the whole set) with Kafka's error codes."""

from __future__ import annotations

import uuid

import pytest

from metadata_quorum import configs
from metadata_quorum.cluster import BrokerSessions, generate_register_broker
from metadata_quorum.configs import AlterOp, ConfigSource
from metadata_quorum.image import MetadataImage, apply
from metadata_quorum.records import (
    ConfigRecord,
    ConfigResourceType,
    Endpoint,
    MetadataRecord,
    RegisterBroker,
    TopicRecord,
)
from metadata_quorum.service import _config_changes, _describe_configs
from protos import controller_pb2 as pb
from protos import metadata_pb2 as mpb
from raftlog.config import ConfigError
from raftlog.errors import ErrorCode, KafkaError

UNTHROTTLED = str(2**63 - 1)
LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
LEADER_REPLICAS = "leader.replication.throttled.replicas"
TOPIC, BROKER = ConfigResourceType.TOPIC, ConfigResourceType.BROKER
ENDPOINTS = (Endpoint("BROKER", "127.0.0.11", 9092),)


def image_of(*records: MetadataRecord) -> MetadataImage:
    image, rejected = apply(MetadataImage(), records)
    assert not rejected
    return image


def registered(broker_id: int, **static: str) -> RegisterBroker:
    statics = tuple(sorted((k.replace("_", "."), v) for k, v in static.items()))
    return RegisterBroker(broker_id, f"inc-{broker_id}", ENDPOINTS, None, statics)


def sources(image: MetadataImage, broker_id: int) -> dict[str, tuple[str, ConfigSource]]:
    return {row.name: (row.value, row.source) for row in configs.describe_broker(image, broker_id)}


# -- precedence -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("layers", "expected"),
    [
        ((), (UNTHROTTLED, ConfigSource.DEFAULT_CONFIG)),
        (("static",), ("100", ConfigSource.STATIC_BROKER_CONFIG)),
        (("static", "cluster"), ("200", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)),
        (("cluster",), ("200", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)),
        (("static", "broker"), ("300", ConfigSource.DYNAMIC_BROKER_CONFIG)),
        (("static", "cluster", "broker"), ("300", ConfigSource.DYNAMIC_BROKER_CONFIG)),
        (("cluster", "broker"), ("300", ConfigSource.DYNAMIC_BROKER_CONFIG)),
    ],
)
def test_kafkas_precedence_of_a_broker_config(
    layers: tuple[str, ...], expected: tuple[str, ConfigSource]
) -> None:
    records: list[MetadataRecord] = [registered(1, **({"leader_replication_throttled_rate": "100"}
                                              if "static" in layers else {}))]  # fmt: skip
    if "cluster" in layers:
        records.append(ConfigRecord(BROKER, "", LEADER_RATE, "200"))
    if "broker" in layers:
        records.append(ConfigRecord(BROKER, "1", LEADER_RATE, "300"))
    image = image_of(*records)
    assert sources(image, 1)[LEADER_RATE] == expected
    assert configs.broker_config(image, 1).leader_replication_throttled_rate == int(expected[0])
    assert sources(image, 1)[FOLLOWER_RATE] == (UNTHROTTLED, ConfigSource.DEFAULT_CONFIG)


def test_a_broker_uses_its_own_file_before_it_has_registered_it() -> None:
    image = image_of(ConfigRecord(BROKER, "", FOLLOWER_RATE, "200"))
    config = configs.broker_config(image, 1, {LEADER_RATE: "100", FOLLOWER_RATE: "5"})
    assert config.leader_replication_throttled_rate == 100, "its file's"
    assert config.follower_replication_throttled_rate == 200, "the dynamic default's"


def test_a_re_registration_replaces_the_static_configs() -> None:
    image = image_of(registered(1, leader_replication_throttled_rate="100"))
    image, _ = apply(image, [RegisterBroker(1, "inc-again", ENDPOINTS, None)])
    assert sources(image, 1)[LEADER_RATE] == (UNTHROTTLED, ConfigSource.DEFAULT_CONFIG)


def test_describe_configs_names_each_source() -> None:
    image = image_of(
        registered(2, follower_replication_throttled_rate="100"),
        ConfigRecord(BROKER, "", "retention.ms", "1000"),
        ConfigRecord(BROKER, "", LEADER_RATE, "7"),
    )
    image, _ = apply(image, [_topic_record(), ConfigRecord(TOPIC, "t", "segment.ms", "5000")])
    broker = pb.ConfigResource(resource_type=mpb.CONFIG_RESOURCE_BROKER, resource_name="2")
    described = {
        e.name: (e.value, e.source, e.is_default)
        for e in _describe_configs(image, broker, None)
        if e.name in (LEADER_RATE, FOLLOWER_RATE)
    }
    assert described == {
        FOLLOWER_RATE: ("100", pb.STATIC_BROKER_CONFIG, False),
        LEADER_RATE: ("7", pb.DYNAMIC_DEFAULT_BROKER_CONFIG, False),
    }
    topic = pb.ConfigResource(resource_type=mpb.CONFIG_RESOURCE_TOPIC, resource_name="t")
    entries = {e.name: (e.value, e.source) for e in _describe_configs(image, topic, None)}
    assert entries["segment.ms"] == ("5000", pb.DYNAMIC_TOPIC_CONFIG)
    assert entries["retention.ms"] == ("1000", pb.DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert entries["cleanup.policy"] == ("delete", pb.DEFAULT_CONFIG)
    cluster = pb.ConfigResource(resource_type=mpb.CONFIG_RESOURCE_BROKER, resource_name="")
    entries = {e.name: (e.value, e.source) for e in _describe_configs(image, cluster, None)}
    assert entries[LEADER_RATE] == ("7", pb.DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert entries[FOLLOWER_RATE] == (UNTHROTTLED, pb.DEFAULT_CONFIG)  # not broker 2's file


def _topic_record() -> TopicRecord:
    return TopicRecord("t", uuid.UUID(int=7))


def test_a_bad_static_config_is_refused_at_registration() -> None:
    sessions = BrokerSessions(session_timeout_ms=9000)
    with pytest.raises(ConfigError, match=LEADER_RATE):
        generate_register_broker(
            MetadataImage(), sessions, 0, 1, "inc", ENDPOINTS, None, {LEADER_RATE: "-1"}
        )
    with pytest.raises(ConfigError, match=r"retention\.ms"):
        generate_register_broker(
            MetadataImage(), sessions, 0, 1, "inc", ENDPOINTS, None, {"retention.ms": "1"}
        )
    records = generate_register_broker(
        MetadataImage(), sessions, 0, 1, "inc", ENDPOINTS, None, {LEADER_RATE: "10"}
    )
    assert records[0] == RegisterBroker(1, "inc", ENDPOINTS, None, ((LEADER_RATE, "10"),))


# -- AlterConfigs / IncrementalAlterConfigs -------------------------------------------------------
def alter(
    current: dict[str, str],
    *ops: tuple[AlterOp, str, str | None],
    kind: ConfigResourceType = TOPIC,
    name: str = "t",
    replace: bool = False,
) -> dict[str, str]:
    return configs.alter_dynamic_configs(kind, name, current, ops, replace=replace)


def test_set_and_delete() -> None:
    current = {"retention.ms": "1000", "segment.ms": "5000"}
    ops = (AlterOp.SET, "retention.ms", "2000"), (AlterOp.DELETE, "segment.ms", None)
    assert alter(current, *ops) == {"retention.ms": "2000"}
    assert alter({}, (AlterOp.DELETE, "retention.ms", None)) == {}, "deleting nothing is fine"
    assert current == {"retention.ms": "1000", "segment.ms": "5000"}, "the input is not changed"


@pytest.mark.parametrize(
    ("current", "op", "value", "expected"),
    [
        (None, AlterOp.APPEND, "0:1", "0:1"),
        ("0:1", AlterOp.APPEND, "0:2,1:1", "0:1,0:2,1:1"),
        ("0:1,0:2", AlterOp.APPEND, "0:2, 0:3,0:3", "0:1,0:2,0:3"),  # listed once
        ("0:1,0:2,1:1", AlterOp.SUBTRACT, "0:2,9:9", "0:1,1:1"),  # absent entries: no error
        ("0:1", AlterOp.SUBTRACT, "0:1", ""),
        (None, AlterOp.SUBTRACT, "0:1", ""),
    ],
)
def test_append_and_subtract_on_a_list_config(
    current: str | None, op: AlterOp, value: str, expected: str
) -> None:
    values = {} if current is None else {LEADER_REPLICAS: current}
    assert alter(values, (op, LEADER_REPLICAS, value)) == {LEADER_REPLICAS: expected}


def test_append_starts_from_kafkas_default() -> None:
    assert alter({}, (AlterOp.APPEND, "cleanup.policy", "compact")) == {
        "cleanup.policy": "delete,compact"
    }


BAD = ErrorCode.INVALID_CONFIG
SET, DELETE, APPEND, SUBTRACT = AlterOp.SET, AlterOp.DELETE, AlterOp.APPEND, AlterOp.SUBTRACT


@pytest.mark.parametrize(
    ("ops", "kind", "name", "code", "named"),
    [
        ([(APPEND, "retention.ms", "5")], TOPIC, "t", BAD, "retention.ms"),
        ([(SUBTRACT, LEADER_RATE, "5")], BROKER, "1", BAD, LEADER_RATE),
        ([(SET, "no.such.key", "1")], TOPIC, "t", BAD, "no.such.key"),
        ([(DELETE, "no.such.key", None)], TOPIC, "t", BAD, "no.such.key"),
        ([(SET, "retention.ms", "soon")], TOPIC, "t", BAD, "retention.ms"),
        ([(SET, LEADER_RATE, "-1")], BROKER, "", BAD, LEADER_RATE),
        ([(SET, "retention.ms", "1")], BROKER, "1", BAD, "retention.ms"),  # cluster-wide only
        ([(SET, "retention.ms", None)], TOPIC, "t", BAD, "retention.ms"),
        ([(APPEND, LEADER_REPLICAS, "x")], TOPIC, "t", BAD, "partitionId"),
        ([(SUBTRACT, "cleanup.policy", "delete")], TOPIC, "t", BAD, "cleanup.policy"),
        ([(SET, "retention.ms", "1"), (DELETE, "retention.ms", None)], TOPIC, "t",
         ErrorCode.INVALID_REQUEST, "retention.ms"),
    ],
)  # fmt: skip
def test_bad_alterations_are_refused_with_kafkas_code(
    ops: list[tuple[AlterOp, str, str | None]],
    kind: ConfigResourceType,
    name: str,
    code: ErrorCode,
    named: str,
) -> None:
    with pytest.raises(KafkaError) as raised:
        alter({}, *ops, kind=kind, name=name)
    assert raised.value.error is code
    assert named in raised.value.message


def test_the_legacy_request_replaces_the_whole_set() -> None:
    current = {"retention.ms": "1000", LEADER_REPLICAS: "0:1"}
    assert alter(current, (AlterOp.SET, "segment.ms", "5000"), replace=True) == {
        "segment.ms": "5000"
    }
    assert alter(current, replace=True) == {}


def _resource(name: str, *configs_: pb.AlterableConfig) -> pb.AlterConfigsResource:
    return pb.AlterConfigsResource(
        resource=pb.ConfigResource(resource_type=mpb.CONFIG_RESOURCE_TOPIC, resource_name=name),
        configs=list(configs_),
    )


def test_the_controller_writes_one_record_per_changed_key() -> None:
    image = image_of(_topic_record(), ConfigRecord(TOPIC, "t", "retention.ms", "1000"),
                     ConfigRecord(TOPIC, "t", LEADER_REPLICAS, "0:1"))  # fmt: skip
    appended = _resource("t", pb.AlterableConfig(name=LEADER_REPLICAS, value="0:2", op=pb.APPEND))
    error, _, records = _config_changes(image, appended)
    assert (error, records) == (
        ErrorCode.NONE,
        [ConfigRecord(TOPIC, "t", LEADER_REPLICAS, "0:1,0:2")],
    )
    replaced = _resource("t", pb.AlterableConfig(name="segment.ms", value="5000"))
    error, _, records = _config_changes(image, replaced, replace=True)
    assert error is ErrorCode.NONE
    assert records == [
        ConfigRecord(TOPIC, "t", LEADER_REPLICAS, None),
        ConfigRecord(TOPIC, "t", "retention.ms", None),
        ConfigRecord(TOPIC, "t", "segment.ms", "5000"),
    ]
    error, message, records = _config_changes(image, _resource("nope"))
    assert (error, records) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, []) and "nope" in message
    unknown_op = _resource("t", pb.AlterableConfig(name="segment.ms", value="1", op=7))  # type: ignore[arg-type]
    error, _, records = _config_changes(image, unknown_op)
    assert (error, records) == (ErrorCode.INVALID_REQUEST, [])


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("1", "log.dirs"),
        ("1", "node.id"),
        ("", "security.inter.broker.protocol"),
        ("", "log.retention.hours"),  # only the first synonym (log.retention.ms) is dynamic
        ("1", "num.partitions"),  # raftlog's cluster-wide key: not per broker
    ],
)
def test_a_read_only_broker_config_is_refused_as_kafka_does(name: str, key: str) -> None:
    with pytest.raises(KafkaError) as raised:
        alter({}, (SET, key, "1"), kind=BROKER, name=name)
    assert raised.value.error is ErrorCode.INVALID_REQUEST
    assert raised.value.message == f"Cannot update these configs dynamically: Set({key})"


def test_read_only_keys_are_named_together_and_dynamic_ones_still_pass() -> None:
    with pytest.raises(KafkaError) as raised:
        alter({}, (SET, "node.id", "2"), (SET, "log.dirs", "/x"), (SET, LEADER_RATE, "1"),
              kind=BROKER, name="1")  # fmt: skip
    assert raised.value.message == "Cannot update these configs dynamically: Set(log.dirs, node.id)"
    assert alter({}, (SET, "num.partitions", "3"), kind=BROKER, name="") == {"num.partitions": "3"}
    assert alter({}, (SET, "log.retention.ms", "5"), kind=BROKER, name="1") == {
        "log.retention.ms": "5"
    }
    # deleting is no update: a key nobody set is unknown, as before
    with pytest.raises(ConfigError):
        alter({}, (DELETE, "log.dirs", None), kind=BROKER, name="1")
