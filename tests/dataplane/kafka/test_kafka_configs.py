"""Kafka's config APIs on the KAFKA listener of a real 3-node cluster (127.0.0.221-223), judged by
Kafka's own clients: kafka-python's ``alter_configs`` (AlterConfigs, and IncrementalAlterConfigs
for DELETE) and confluent-kafka's ``incremental_alter_configs`` and ``alter_configs`` set
``leader.replication.throttled.rate`` on a broker and ``leader.replication.throttled.replicas``
on a topic; the change shows in DescribeConfigs from both clients and from the controller's gRPC
API, and in the broker's effective quota (its ``raftlog_replication_throttled_rate_bytes``
metric); deleting it restores what lies below. Every node's config file sets
``follower.replication.throttled.rate`` (STATIC_BROKER_CONFIG), below the dynamic values. Bad
input gets Kafka's error codes and leaves the stored configs as they were."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient as RdAdminClient
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigSource
from confluent_kafka.admin._config import ConfigResource as RdConfigResource
from kafka import KafkaAdminClient
from kafka.admin import AlterConfigOp as KpAlterConfigOp
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType as KpResourceType

from dataplane.client import AdminClient
from dataplane.client.admin import ConfigResource, ResourceType
from dataplane.tools.local_cluster import LocalCluster, wait_for
from protos import controller_pb2 as cpb
from protos import metadata_pb2 as mpb
from raftlog.batch import HEADER_SIZE, Compression, read_header
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import create_topic, running_cluster
from tests.dataplane.kafka.raw_connection import RawKafkaConnection

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("kafka-configs")]
LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
LEADER_REPLICAS = "leader.replication.throttled.replicas"
STATIC_FOLLOWER_RATE = 4096  # every node's config file
UNTHROTTLED = 2**63 - 1
STATIC_ROLL_HOURS = 100  # every node's config file: segment.ms's default (a synonym, in hours)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(
        tmp_path_factory.mktemp("kafka-configs"),
        "kafka_configs",
        overrides={FOLLOWER_RATE: STATIC_FOLLOWER_RATE, "log.roll.hours": STATIC_ROLL_HOURS},
    ) as running:
        yield running


@pytest.fixture
def kp(cluster: LocalCluster) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def rd(cluster: LocalCluster) -> RdAdminClient:
    return RdAdminClient({"bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers)})


def quota_rate(cluster: LocalCluster, node_id: int, side: str) -> float:
    """The broker's effective rate (its metric; +Inf: unthrottled)."""
    url = f"http://{cluster.metrics_address(node_id)}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        lines = response.read().decode().splitlines()
    prefix = f'raftlog_replication_throttled_rate_bytes{{side="{side}"}} '
    found = [float(line[len(prefix) :]) for line in lines if line.startswith(prefix)]
    assert len(found) == 1, f"no {prefix!r} in node {node_id}'s metrics"
    return found[0]


def wait_rate(cluster: LocalCluster, node_id: int, side: str, rate: int) -> None:
    expected = float("inf") if rate == UNTHROTTLED else float(rate)
    wait_for(
        f"broker {node_id}'s {side} quota at {rate} B/s",
        lambda: quota_rate(cluster, node_id, side) == expected or None,
    )


def kp_config(kp: KafkaAdminClient, kind: KpResourceType, name: str, key: str) -> tuple[str, str]:
    """(value, source) as kafka-python's DescribeConfigs shows them."""
    described = kp.describe_configs([KpConfigResource(kind, name)], config_filter="all")
    entry = described[kind.name.lower()][name][key]
    return entry["value"], entry["config_source"]


def rd_config(rd: RdAdminClient, kind: str, name: str, key: str) -> tuple[str, ConfigSource]:
    """(value, source) as librdkafka's DescribeConfigs shows them."""
    resource = RdConfigResource(kind, name)
    entries = rd.describe_configs([resource])[resource].result(timeout=30)
    return entries[key].value, ConfigSource(entries[key].source)


def grpc_config(cluster: LocalCluster, kind: int, name: str, key: str) -> tuple[str, int]:
    """(value, source) as the controller's gRPC DescribeConfigs shows them."""
    client = cluster.client()
    try:
        answer = client.checked(
            "DescribeConfigs",
            cpb.DescribeConfigsRequest(
                resources=[cpb.ConfigResource(resource_type=kind, resource_name=name)]  # type: ignore[arg-type]
            ),
        )
    finally:
        client.close()
    entry = next(e for e in answer.resources[0].entries if e.name == key)
    return entry.value, entry.source


def rd_incremental(rd: RdAdminClient, kind: str, name: str, *entries: ConfigEntry) -> None:
    resource = RdConfigResource(kind, name, incremental_configs=list(entries))
    rd.incremental_alter_configs([resource])[resource].result(timeout=30)


def rd_error(rd: RdAdminClient, resource: RdConfigResource, incremental: bool = True) -> ErrorCode:
    alter = rd.incremental_alter_configs if incremental else rd.alter_configs
    with pytest.raises(KafkaException) as raised:
        alter([resource])[resource].result(timeout=30)
    return ErrorCode.from_code(raised.value.args[0].code())


def test_the_config_files_rate_applies_and_is_described_as_static(
    cluster: LocalCluster, kp: KafkaAdminClient, rd: RdAdminClient
) -> None:
    for node_id in (1, 2, 3):
        wait_rate(cluster, node_id, "follower", STATIC_FOLLOWER_RATE)
        wait_rate(cluster, node_id, "leader", UNTHROTTLED)
    static = str(STATIC_FOLLOWER_RATE)
    assert kp_config(kp, KpResourceType.BROKER, "1", FOLLOWER_RATE) == (
        static, "STATIC_BROKER_CONFIG",
    )  # fmt: skip
    assert kp_config(kp, KpResourceType.BROKER, "1", LEADER_RATE) == (
        str(UNTHROTTLED), "DEFAULT_CONFIG",
    )  # fmt: skip
    assert rd_config(rd, "broker", "2", FOLLOWER_RATE) == (
        static, ConfigSource.STATIC_BROKER_CONFIG,
    )  # fmt: skip
    broker = mpb.CONFIG_RESOURCE_BROKER
    assert grpc_config(cluster, broker, "3", FOLLOWER_RATE) == (static, cpb.STATIC_BROKER_CONFIG)


def test_kafka_python_sets_a_broker_rate_and_a_topics_throttled_replicas(
    cluster: LocalCluster, kp: KafkaAdminClient, rd: RdAdminClient
) -> None:
    create_topic(cluster, "kp-throttled", 2)
    answer = kp.alter_configs(
        [KpConfigResource(KpResourceType.BROKER, "1", {LEADER_RATE: "1048576"}),
         KpConfigResource(KpResourceType.TOPIC, "kp-throttled", {LEADER_REPLICAS: "0:1,1:2"})],
        incremental=False,  # AlterConfigs (key 33)
    )  # fmt: skip
    assert answer == {"broker": {"1": "OK"}, "topic": {"kp-throttled": "OK"}}
    wait_rate(cluster, 1, "leader", 1048576)
    wait_rate(cluster, 2, "leader", UNTHROTTLED)  # broker 1's own value only
    assert kp_config(kp, KpResourceType.BROKER, "1", LEADER_RATE) == (
        "1048576", "DYNAMIC_BROKER_CONFIG",
    )  # fmt: skip
    assert rd_config(rd, "broker", "1", LEADER_RATE) == (
        "1048576", ConfigSource.DYNAMIC_BROKER_CONFIG,
    )  # fmt: skip
    assert grpc_config(cluster, mpb.CONFIG_RESOURCE_BROKER, "1", LEADER_RATE) == (
        "1048576", cpb.DYNAMIC_BROKER_CONFIG,
    )  # fmt: skip
    assert kp_config(kp, KpResourceType.TOPIC, "kp-throttled", LEADER_REPLICAS) == (
        "0:1,1:2", "DYNAMIC_TOPIC_CONFIG",
    )  # fmt: skip
    assert rd_config(rd, "topic", "kp-throttled", LEADER_REPLICAS) == (
        "0:1,1:2", ConfigSource.DYNAMIC_TOPIC_CONFIG,
    )  # fmt: skip

    deleted = ("DELETE", None)  # IncrementalAlterConfigs (key 44)
    answer = kp.alter_configs(
        [KpConfigResource(KpResourceType.BROKER, "1", {LEADER_RATE: deleted}),
         KpConfigResource(KpResourceType.TOPIC, "kp-throttled", {LEADER_REPLICAS: deleted})],
    )  # fmt: skip
    assert answer == {"broker": {"1": "OK"}, "topic": {"kp-throttled": "OK"}}
    wait_rate(cluster, 1, "leader", UNTHROTTLED)
    assert kp_config(kp, KpResourceType.BROKER, "1", LEADER_RATE) == (
        str(UNTHROTTLED), "DEFAULT_CONFIG",
    )  # fmt: skip
    assert rd_config(rd, "topic", "kp-throttled", LEADER_REPLICAS) == (
        "", ConfigSource.DEFAULT_CONFIG,
    )  # fmt: skip


def test_confluent_kafka_incremental_and_legacy_alterations(
    cluster: LocalCluster, kp: KafkaAdminClient, rd: RdAdminClient
) -> None:
    create_topic(cluster, "rd-throttled", 2)
    set_op, append, subtract = (
        AlterConfigOpType.SET, AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT,
    )  # fmt: skip
    rd_incremental(
        rd, "broker", "2", ConfigEntry(LEADER_RATE, "2048", incremental_operation=set_op)
    )
    wait_rate(cluster, 2, "leader", 2048)
    assert kp_config(kp, KpResourceType.BROKER, "2", LEADER_RATE) == (
        "2048", "DYNAMIC_BROKER_CONFIG",
    )  # fmt: skip
    topic = "rd-throttled"
    rd_incremental(
        rd, "topic", topic, ConfigEntry(LEADER_REPLICAS, "0:1,0:2", incremental_operation=append)
    )
    rd_incremental(
        rd, "topic", topic, ConfigEntry(LEADER_REPLICAS, "1:3,0:2", incremental_operation=append)
    )
    rd_incremental(
        rd, "topic", topic, ConfigEntry(LEADER_REPLICAS, "0:1", incremental_operation=subtract)
    )
    assert rd_config(rd, "topic", topic, LEADER_REPLICAS) == (
        "0:2,1:3", ConfigSource.DYNAMIC_TOPIC_CONFIG,
    )  # fmt: skip
    assert kp_config(kp, KpResourceType.TOPIC, topic, LEADER_REPLICAS) == (
        "0:2,1:3", "DYNAMIC_TOPIC_CONFIG",
    )  # fmt: skip

    # The cluster-wide default (broker "") lies between a broker's own value and its file.
    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.alter_configs(ConfigResource(ResourceType.BROKER, ""), {FOLLOWER_RATE: "8192"})
        wait_rate(cluster, 2, "follower", 8192)
        assert rd_config(rd, "broker", "2", FOLLOWER_RATE) == (
            "8192", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
        )  # fmt: skip
        admin.alter_configs(ConfigResource(ResourceType.BROKER, ""), {FOLLOWER_RATE: None})
    wait_rate(cluster, 2, "follower", STATIC_FOLLOWER_RATE)
    assert kp_config(kp, KpResourceType.BROKER, "2", FOLLOWER_RATE) == (
        str(STATIC_FOLLOWER_RATE), "STATIC_BROKER_CONFIG",
    )  # fmt: skip

    # AlterConfigs (key 33) replaces the topic's whole dynamic set.
    legacy = RdConfigResource("topic", topic, set_config={"retention.ms": "600000"})
    rd.alter_configs([legacy])[legacy].result(timeout=30)
    assert rd_config(rd, "topic", topic, "retention.ms") == (
        "600000", ConfigSource.DYNAMIC_TOPIC_CONFIG,
    )  # fmt: skip
    assert rd_config(rd, "topic", topic, LEADER_REPLICAS) == ("", ConfigSource.DEFAULT_CONFIG)

    delete = AlterConfigOpType.DELETE
    rd_incremental(rd, "broker", "2", ConfigEntry(LEADER_RATE, None, incremental_operation=delete))
    rd_incremental(
        rd, "topic", topic, ConfigEntry("retention.ms", None, incremental_operation=delete)
    )
    wait_rate(cluster, 2, "leader", UNTHROTTLED)
    assert rd_config(rd, "broker", "2", LEADER_RATE) == (
        str(UNTHROTTLED), ConfigSource.DEFAULT_CONFIG,
    )  # fmt: skip
    assert rd_config(rd, "topic", topic, "retention.ms")[1] == ConfigSource.DEFAULT_CONFIG


def test_bad_input_gets_kafkas_codes_and_changes_nothing(
    cluster: LocalCluster, kp: KafkaAdminClient, rd: RdAdminClient
) -> None:
    create_topic(cluster, "bad-configs", 1)
    set_op, append = AlterConfigOpType.SET, AlterConfigOpType.APPEND

    def incremental(kind: str, name: str, key: str, value: str, op: AlterConfigOpType) -> ErrorCode:
        entry = ConfigEntry(key, value, incremental_operation=op)
        return rd_error(rd, RdConfigResource(kind, name, incremental_configs=[entry]))

    assert incremental("broker", "1", "no.such.config", "1", set_op) is ErrorCode.INVALID_CONFIG
    assert incremental("broker", "1", LEADER_RATE, "-1", set_op) is ErrorCode.INVALID_CONFIG
    assert incremental("broker", "1", LEADER_RATE, "5", append) is ErrorCode.INVALID_CONFIG
    assert incremental("broker", "1", "retention.ms", "5", set_op) is ErrorCode.INVALID_CONFIG
    assert incremental("topic", "bad-configs", LEADER_REPLICAS, "x:y", set_op) is (
        ErrorCode.INVALID_CONFIG
    )
    assert incremental("topic", "no-such-topic", "retention.ms", "1", set_op) is (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    legacy = RdConfigResource("topic", "bad-configs", set_config={"retention.ms": "soon"})
    assert rd_error(rd, legacy, incremental=False) is ErrorCode.INVALID_CONFIG

    # kafka-python names the code and passes the controller's reason on.
    answer = kp.alter_configs(
        [KpConfigResource(KpResourceType.BROKER, "1", {LEADER_RATE: "fast"})],
        raise_on_unknown=False,
    )
    assert "InvalidConfigurationError" in answer["broker"]["1"], answer
    assert LEADER_RATE in answer["broker"]["1"], answer
    answer = kp.alter_configs(
        [KpConfigResource(KpResourceType.TOPIC, "no-such-topic", {"retention.ms": "1"})],
        raise_on_unknown=False,
    )
    assert "UnknownTopicOrPartitionError" in answer["topic"]["no-such-topic"], answer

    # validate_only checks and stores nothing.
    entry = ConfigEntry(LEADER_RATE, "777", incremental_operation=set_op)
    resource = RdConfigResource("broker", "1", incremental_configs=[entry])
    rd.incremental_alter_configs([resource], validate_only=True)[resource].result(timeout=30)
    assert rd_config(rd, "broker", "1", LEADER_RATE) == (
        str(UNTHROTTLED), ConfigSource.DEFAULT_CONFIG,
    )  # fmt: skip
    assert rd_config(rd, "topic", "bad-configs", LEADER_REPLICAS) == (
        "", ConfigSource.DEFAULT_CONFIG,
    )  # fmt: skip
    assert quota_rate(cluster, 1, "leader") == float("inf")


# -- Kafka 4's topic configs: compression.type, LogAppendTime, synonyms -------------------------
def _stored_codecs(cluster: LocalCluster, topic: str) -> set[int]:
    """The codec of every batch of partition 0 in any replica's segment files."""
    codecs = set()
    for segment in cluster.root.glob(f"node-*/data/{topic}-0/*.log"):
        data = segment.read_bytes()
        position = 0
        while position + HEADER_SIZE <= len(data):
            header = read_header(data, position)
            codecs.add(header.compression)
            position += header.size_bytes
    return codecs


def test_compression_type_and_log_append_time_are_honoured(
    cluster: LocalCluster, rd: RdAdminClient
) -> None:
    topic = "zstd-topic"
    configs = {"compression.type": "zstd", "message.timestamp.type": "LogAppendTime"}
    new = NewTopic(topic, num_partitions=1, replication_factor=1, config=configs)
    rd.create_topics([new])[topic].result(timeout=30)
    producer = Producer({
        "bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers),
        "compression.type": "none", "linger.ms": 50,
    })  # fmt: skip
    for i in range(20):
        producer.produce(topic, key=b"k%d" % i, value=b"value " * 40, timestamp=1_000)
    assert producer.flush(30) == 0
    wait_for("the batches on disk", lambda: _stored_codecs(cluster, topic) or None, timeout_s=30)
    assert _stored_codecs(cluster, topic) == {Compression.ZSTD}
    consumer = Consumer({
        "bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers),
        "group.id": "zstd-reader", "auto.offset.reset": "earliest",
    })  # fmt: skip
    try:
        consumer.subscribe([topic])
        seen: list[tuple[int, int]] = []
        deadline = time.monotonic() + 60
        while len(seen) < 20 and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                seen.append(message.timestamp())
    finally:
        consumer.close()
    assert len(seen) == 20
    assert all(kind == TIMESTAMP_LOG_APPEND_TIME and ts > 1_000 for kind, ts in seen)


def test_describe_configs_shows_synonyms_of_each_source(
    cluster: LocalCluster, rd: RdAdminClient
) -> None:
    topic = "synonyms-topic"
    create_topic(cluster, topic, 1, 1)
    rd_incremental(rd, "topic", topic, ConfigEntry("retention.ms", "123456",
                   incremental_operation=AlterConfigOpType.SET))  # fmt: skip
    resource = RdConfigResource("topic", topic)
    entries = rd.describe_configs([resource])[resource].result(timeout=30)
    segment_ms = entries["segment.ms"]
    assert segment_ms.value == str(STATIC_ROLL_HOURS * 3_600_000)
    assert ConfigSource(segment_ms.source) == ConfigSource.STATIC_BROKER_CONFIG
    assert [(s.name, s.value, ConfigSource(s.source)) for s in segment_ms.synonyms.values()] == [
        ("log.roll.hours", str(STATIC_ROLL_HOURS), ConfigSource.STATIC_BROKER_CONFIG),
        ("log.roll.ms", "604800000", ConfigSource.DEFAULT_CONFIG),
    ]
    retention = entries["retention.ms"]
    assert ConfigSource(retention.source) == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert next(ConfigSource(s.source) for s in retention.synonyms.values()) == (
        ConfigSource.DYNAMIC_TOPIC_CONFIG
    )
    assert entries["compression.type"].value == "producer"


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"no.such.config": "1"}, "no.such.config"),
        ({"compression.type": "brotli"}, "compression.type"),
    ],
)
def test_create_topics_refuses_unknown_keys_and_bad_values(
    rd: RdAdminClient, config: dict[str, str], named: str
) -> None:
    new = NewTopic("refused-topic", num_partitions=1, replication_factor=1, config=config)
    with pytest.raises(KafkaException) as raised:
        rd.create_topics([new])["refused-topic"].result(timeout=30)
    error = raised.value.args[0]
    assert ErrorCode.from_code(error.code()) is ErrorCode.INVALID_CONFIG
    assert named in error.str()


# -- a broker's every config, its loggers, client metrics subscriptions -------------------------
def test_a_broker_describes_every_config_it_has(
    cluster: LocalCluster, kp: KafkaAdminClient, rd: RdAdminClient
) -> None:
    described = kp.describe_configs(
        [KpConfigResource(KpResourceType.BROKER, "1")], include_synonyms=True, config_filter="all"
    )["broker"]["1"]
    assert len(described) > 100  # every node config key, log.* synonym and dynamic key
    node_id = described["node.id"]
    assert (node_id["value"], node_id["config_source"], node_id["read_only"]) == (
        "1", "STATIC_BROKER_CONFIG", True,
    )  # fmt: skip
    assert described["log.roll.hours"]["value"] == str(STATIC_ROLL_HOURS)
    assert (described["log.roll.ms"]["value"], described["log.roll.ms"]["config_source"]) == (
        None, "DEFAULT_CONFIG",
    )  # fmt: skip
    rate = described[FOLLOWER_RATE]
    assert (rate["read_only"], rate["config_type"]) == (False, "LONG")
    assert [(s["name"], s["value"], s["source"]) for s in rate["synonyms"]] == [
        (FOLLOWER_RATE, str(STATIC_FOLLOWER_RATE), "STATIC_BROKER_CONFIG"),
        (FOLLOWER_RATE, str(UNTHROTTLED), "DEFAULT_CONFIG"),
    ]
    retention = described["log.retention.hours"]  # set by no file: Kafka's default
    assert (retention["value"], retention["config_source"]) == ("168", "DEFAULT_CONFIG")
    # librdkafka sends a broker's resource to that broker
    resource = RdConfigResource("broker", "2")
    entries = rd.describe_configs([resource])[resource].result(timeout=30)
    assert entries["node.id"].value == "2" and entries["node.id"].is_read_only
    assert ConfigSource(entries["log.dirs"].source) == ConfigSource.STATIC_BROKER_CONFIG


def test_the_default_broker_lists_only_cluster_wide_values_and_another_id_is_refused(
    cluster: LocalCluster, kp: KafkaAdminClient
) -> None:
    def describe() -> Any:
        connection = RawKafkaConnection(cluster.kafka_bootstrap_servers[0])
        try:
            answer = connection.call(32, 4, {  # DescribeConfigs
                "resources": [
                    {"resource_type": 4, "resource_name": "", "configuration_keys": None},
                    {"resource_type": 4, "resource_name": "2", "configuration_keys": None},
                ],
                "include_synonyms": True, "include_documentation": False,
            })  # fmt: skip
        finally:
            connection.close()
        # the broker answers from its metadata image, which takes the change a moment later
        return answer if answer.results[0].configs else None

    with AdminClient(cluster.bootstrap_servers) as admin:
        admin.alter_configs(ConfigResource(ResourceType.BROKER, ""), {FOLLOWER_RATE: "8192"})
        try:
            answer = wait_for("the cluster-wide value on broker 1", describe)
        finally:
            admin.alter_configs(ConfigResource(ResourceType.BROKER, ""), {FOLLOWER_RATE: None})
    default, other = answer.results
    assert default.error_code == 0 and default.configs
    assert {c.config_source for c in default.configs} == {3}  # DYNAMIC_DEFAULT_BROKER_CONFIG
    assert (FOLLOWER_RATE, "8192") in {(c.name, c.value) for c in default.configs}
    assert ErrorCode.from_code(other.error_code) is ErrorCode.INVALID_REQUEST
    assert other.error_message == "Unexpected broker id, expected 1 or empty string, but received 2"


def _logger_levels(kp: KafkaAdminClient, broker: str) -> dict[str, str]:
    described = kp.describe_configs(
        [KpConfigResource(KpResourceType.BROKER_LOGGER, broker)], config_filter="all"
    )["broker_logger"][broker]
    assert {e["config_source"] for e in described.values()} == {"DYNAMIC_BROKER_LOGGER_CONFIG"}
    return {name: entry["value"] for name, entry in described.items()}


def _alter_loggers(kp: KafkaAdminClient, configs: dict[str, Any], incremental: bool = True) -> str:
    resource = KpConfigResource(KpResourceType.BROKER_LOGGER, "1", configs)
    answer = kp.alter_configs([resource], raise_on_unknown=False, incremental=incremental)
    return str(answer["broker_logger"]["1"])


def test_broker_logger_levels_change_at_run_time(
    cluster: LocalCluster, kp: KafkaAdminClient
) -> None:
    listener = "dataplane.kafka.listener"
    levels = _logger_levels(kp, "1")
    assert levels["root"] == "INFO" and levels[listener] == "INFO"
    log_path = next(spec.log_path for spec in cluster.specs if spec.node_id == 1)
    line = "Completed request: api key 32"  # the listener's DEBUG line of a DescribeConfigs
    assert line not in log_path.read_text()
    assert _alter_loggers(kp, {listener: (KpAlterConfigOp.SET, "DEBUG")}) == "OK"
    assert _logger_levels(kp, "1")[listener] == "DEBUG"
    assert _logger_levels(kp, "2")[listener] == "INFO"  # only broker 1's changed
    wait_for(
        "the listener's debug line in node 1's log",
        lambda: (_logger_levels(kp, "1") and line in log_path.read_text()) or None,
    )
    assert _alter_loggers(kp, {listener: (KpAlterConfigOp.DELETE, None)}) == "OK"
    assert _logger_levels(kp, "1")[listener] == "INFO"  # the root's again
    refusals: dict[str, list[dict[str, Any]]] = {
        "InvalidConfigurationError": [
            {listener: (KpAlterConfigOp.SET, "LOUD")},
            {"no.such.logger": (KpAlterConfigOp.SET, "DEBUG")},
        ],
        "InvalidRequestError": [
            {"root": (KpAlterConfigOp.DELETE, None)}, {listener: (KpAlterConfigOp.APPEND, "X")},
        ],
    }  # fmt: skip
    for error, alterations in refusals.items():
        for alteration in alterations:
            assert f"] {error}:" in _alter_loggers(kp, alteration), alteration
    legacy = _alter_loggers(kp, {listener: "DEBUG"}, incremental=False)
    assert "Unknown resource type 8" in legacy
    assert _logger_levels(kp, "1")[listener] == "INFO"


def _subscription(kp: KafkaAdminClient, name: str) -> dict[str, str]:
    described = kp.describe_configs(
        [KpConfigResource(KpResourceType.CLIENT_METRICS, name)], config_filter="all"
    )["client_metrics"][name]
    assert {e["config_source"] for e in described.values()} <= {"DYNAMIC_CLIENT_METRICS_CONFIG"}
    return {key: entry["value"] for key, entry in described.items()}


def test_client_metrics_subscriptions_are_stored_listed_and_deleted(kp: KafkaAdminClient) -> None:
    name = "producers-latency"
    wanted = {
        "metrics": "org.apache.kafka.producer.partition.queue.,org.apache.kafka.producer.node",
        "interval.ms": "1000",
        "match": "client_software_name=confluent-kafka-python,client_id=app-.*",
    }
    resource = KpConfigResource(KpResourceType.CLIENT_METRICS, name, wanted)
    answer = kp.alter_configs([resource], raise_on_unknown=False, incremental=True)
    assert answer["client_metrics"][name] == "OK"
    wait_for("the subscription", lambda: _subscription(kp, name) == wanted or None)
    assert name in kp.list_config_resources([KpResourceType.CLIENT_METRICS]).get(
        "client_metrics", []
    )
    bad = {
        "interval.ms": ("50", "InvalidRequestError"),
        "no.such.key": ("1", "InvalidRequestError"),
        "match": ("client_colour=red", "InvalidConfigurationError"),
    }
    for key, (value, error) in bad.items():
        refused = KpConfigResource(KpResourceType.CLIENT_METRICS, name, {key: value})
        result = kp.alter_configs([refused], raise_on_unknown=False, incremental=True)
        assert f"] {error}:" in result["client_metrics"][name], (key, result)
    assert _subscription(kp, name) == wanted  # nothing changed
    emptied = KpConfigResource(
        KpResourceType.CLIENT_METRICS, name, dict.fromkeys(wanted, (KpAlterConfigOp.DELETE, None))
    )
    assert (
        kp.alter_configs([emptied], raise_on_unknown=False, incremental=True)["client_metrics"][
            name
        ]
        == "OK"
    )
    wait_for("the subscription gone", lambda: not _subscription(kp, name) or None)
    assert name not in kp.list_config_resources([KpResourceType.CLIENT_METRICS]).get(
        "client_metrics", []
    )
