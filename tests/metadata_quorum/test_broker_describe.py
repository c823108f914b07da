"""The rules of a broker's DescribeConfigs of itself (metadata_quorum/broker_describe.py), client
metrics subscriptions' validation (client_metrics_configs.py) and the BROKER_LOGGER resource's
(dataplane/kafka/broker_loggers.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from dataplane.kafka.broker_loggers import BrokerLoggers, log4j_level, validate
from metadata_quorum import configs
from metadata_quorum.broker_describe import (
    BrokerConfigRow,
    NodeConfigView,
    check_own_broker,
    describe_cluster_default,
    describe_own_broker,
)
from metadata_quorum.configs import AlterOp, ConfigSource
from metadata_quorum.image import MetadataDelta, MetadataImage
from metadata_quorum.records import ConfigRecord, ConfigResourceType
from metadata_quorum.topic_config_defs import ConfigType
from raftlog.config import ConfigError
from raftlog.errors import ErrorCode, KafkaError

BROKER = ConfigResourceType.BROKER
S = ConfigSource


def image_with(*records: ConfigRecord) -> MetadataImage:
    delta = MetadataDelta(MetadataImage())
    for record in records:
        delta.replay(record)
    return delta.image()


VIEW = NodeConfigView(
    static={"node.id": "1", "log.roll.hours": "100", "ssl.key.password": "secret"},
    defaults={"node.id": None, "log.cache.tail.bytes": "67108864", "ssl.key.password": None},
    types={"log.cache.tail.bytes": ConfigType.INT},
)


def rows_of(image: MetadataImage) -> dict[str, BrokerConfigRow]:
    return {r.name: r for r in describe_own_broker(image, 1, VIEW)}


def test_each_value_comes_from_the_first_layer_that_sets_it_with_kafkas_synonyms() -> None:
    image = image_with(
        ConfigRecord(BROKER, "1", "log.roll.ms", "5000"),
        ConfigRecord(BROKER, "", "log.roll.ms", "7000"),
    )
    rows = rows_of(image)
    roll_ms = rows["log.roll.ms"]
    assert (roll_ms.value, roll_ms.source, roll_ms.read_only) == (
        "5000",
        S.DYNAMIC_BROKER_CONFIG,
        False,
    )
    # each layer in turn, every name of the group it sets (Kafka's configSynonyms)
    assert [(s.name, s.value, s.source) for s in roll_ms.synonyms] == [
        ("log.roll.ms", "5000", S.DYNAMIC_BROKER_CONFIG),
        ("log.roll.ms", "7000", S.DYNAMIC_DEFAULT_BROKER_CONFIG),
        ("log.roll.hours", "100", S.STATIC_BROKER_CONFIG),
        ("log.roll.hours", "168", S.DEFAULT_CONFIG),
    ]
    hours = rows["log.roll.hours"]  # the leading log.roll.ms entries dropped
    assert (hours.value, hours.source, hours.read_only) == ("100", S.STATIC_BROKER_CONFIG, True)
    assert [s.source for s in hours.synonyms] == [S.STATIC_BROKER_CONFIG, S.DEFAULT_CONFIG]
    assert (rows["log.retention.ms"].value, rows["log.retention.ms"].synonyms) == (None, ())
    assert rows["log.retention.hours"].value == "168"
    assert rows["node.id"][1:3] == ("1", S.STATIC_BROKER_CONFIG)
    assert rows["log.cache.tail.bytes"][1:3] == ("67108864", S.DEFAULT_CONFIG)
    assert rows["log.cache.tail.bytes"].type is ConfigType.INT
    assert rows["leader.replication.throttled.rate"].type is ConfigType.LONG  # Kafka's type


def test_a_password_is_sensitive_and_never_shown() -> None:
    row = rows_of(MetadataImage())["ssl.key.password"]
    assert (row.value, row.sensitive, row.type) == (None, True, ConfigType.PASSWORD)
    assert [s.value for s in row.synonyms] == [None]


def test_the_default_resource_lists_only_cluster_wide_values() -> None:
    image = image_with(
        ConfigRecord(BROKER, "", "num.partitions", "3"),
        ConfigRecord(BROKER, "1", "log.roll.ms", "5000"),
    )
    (row,) = describe_cluster_default(image, VIEW)
    assert (row.name, row.value, row.source) == (
        "num.partitions",
        "3",
        S.DYNAMIC_DEFAULT_BROKER_CONFIG,
    )
    assert [s.source for s in row.synonyms] == [S.DYNAMIC_DEFAULT_BROKER_CONFIG]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("2", "Unexpected broker id, expected 1 or empty string, but received 2"),
        ("one", "Broker id must be an integer, but it is: one"),
    ],
)
def test_a_broker_describes_no_other_broker(name: str, message: str) -> None:
    check_own_broker("", 1)
    check_own_broker("1", 1)
    with pytest.raises(KafkaError) as raised:
        check_own_broker(name, 1)
    assert (raised.value.error, raised.value.message) == (ErrorCode.INVALID_REQUEST, message)


# -- client metrics --------------------------------------------------------------------------
def alter_subscription(
    current: dict[str, str], *ops: tuple[AlterOp, str, str | None]
) -> dict[str, str]:
    return configs.alter_dynamic_configs(ConfigResourceType.CLIENT_METRICS, "sub", current, ops)


def test_a_subscription_is_set_appended_and_emptied() -> None:
    new = alter_subscription(
        {}, (AlterOp.SET, "interval.ms", "1000"), (AlterOp.APPEND, "metrics", "a.,b."),
        (AlterOp.SET, "match", "client_id=app-.*, client_software_name=librdkafka"),
    )  # fmt: skip
    assert new == {"interval.ms": "1000", "metrics": "a.,b.",
                   "match": "client_id=app-.*, client_software_name=librdkafka"}  # fmt: skip
    assert alter_subscription(new, (AlterOp.SUBTRACT, "metrics", "a."))["metrics"] == "b."
    emptied = alter_subscription(
        new, *((AlterOp.DELETE, key, None) for key in ("interval.ms", "metrics", "match"))
    )
    assert emptied == {}


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        ("interval.ms", "99", ErrorCode.INVALID_REQUEST),
        ("interval.ms", "3600001", ErrorCode.INVALID_REQUEST),
        ("interval.ms", "soon", ErrorCode.INVALID_CONFIG),
        ("colour", "red", ErrorCode.INVALID_REQUEST),
        ("match", "client_colour=red", ErrorCode.INVALID_CONFIG),
        ("match", "client_id=(", ErrorCode.INVALID_CONFIG),
        ("match", "client_id", ErrorCode.INVALID_CONFIG),
    ],
)
def test_bad_subscriptions_get_kafkas_errors(key: str, value: str, error: ErrorCode) -> None:
    with pytest.raises((KafkaError, ConfigError)) as raised:
        alter_subscription({}, (AlterOp.SET, key, value))
    assert raised.value.error is error


# -- BROKER_LOGGER ---------------------------------------------------------------------------
@pytest.fixture
def loggers() -> BrokerLoggers:
    """A logging manager of its own, so the test's levels stay out of the process's."""
    root = logging.RootLogger(logging.INFO)
    manager = logging.Manager(root)
    root.manager = manager
    for name in ("dataplane.kafka.listener", "dataplane.kafka.codec", "urllib3.pool"):
        manager.getLogger(name)
    return BrokerLoggers(root)


def resource(*ops: tuple[int, str, str | None]) -> SimpleNamespace:
    return SimpleNamespace(
        configs=[SimpleNamespace(config_operation=o, name=n, value=v) for o, n, v in ops]
    )


def test_levels_are_described_in_log4j_names_and_set_and_unset(loggers: BrokerLoggers) -> None:
    assert loggers.levels() == {
        "dataplane": "INFO", "dataplane.kafka": "INFO", "dataplane.kafka.codec": "INFO",
        "dataplane.kafka.listener": "INFO", "root": "INFO",
    }  # fmt: skip
    loggers.alter(resource((0, "dataplane.kafka", "TRACE"), (0, "root", "WARN")), False)
    levels = loggers.levels()
    assert (levels["dataplane.kafka.listener"], levels["root"], levels["dataplane"]) == (
        "TRACE", "WARN", "WARN",
    )  # fmt: skip
    loggers.alter(resource((1, "dataplane.kafka", None)), False)
    assert loggers.levels()["dataplane.kafka.listener"] == "WARN"  # the root's again
    loggers.alter(resource((0, "dataplane", "DEBUG")), validate_only=True)
    assert loggers.levels()["dataplane"] == "WARN"
    assert [log4j_level(n) for n in (5, 10, 25, 30, 50, 60)] == [
        "TRACE", "DEBUG", "INFO", "WARN", "FATAL", "OFF",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("ops", "error"),
    [
        ([(0, "dataplane", "LOUD")], ErrorCode.INVALID_CONFIG),
        ([(0, "dataplane", "OFF")], ErrorCode.INVALID_CONFIG),
        ([(0, "urllib3.pool", "DEBUG")], ErrorCode.INVALID_CONFIG),  # not raftlog's
        ([(1, "root", None)], ErrorCode.INVALID_REQUEST),
        ([(2, "dataplane", "DEBUG")], ErrorCode.INVALID_REQUEST),
        ([(3, "dataplane", "DEBUG")], ErrorCode.INVALID_REQUEST),
        ([(0, "dataplane", None)], ErrorCode.INVALID_REQUEST),
        ([(0, "dataplane", "DEBUG"), (1, "dataplane", None)], ErrorCode.INVALID_REQUEST),
    ],
)
def test_bad_level_changes_change_nothing(
    loggers: BrokerLoggers, ops: list[tuple[int, str, str | None]], error: ErrorCode
) -> None:
    before = loggers.levels()
    with pytest.raises(KafkaError) as raised:
        loggers.alter(resource((0, "root", "DEBUG"), *ops), False)
    assert raised.value.error is error
    assert loggers.levels() == before
    with pytest.raises(KafkaError):
        validate(ops, loggers.names())
