"""What a newcomer's Kafka clients ask of a one-node cluster (127.0.0.221, the kafka_configs
range, in turn with test_kafka_configs.py) and Kafka 4 answers: kafka-python 3's
``list_partition_offsets`` with KIP-405's EARLIEST_LOCAL and KIP-1005's LATEST_TIERED specs
(ListOffsets v8 and v9: the log start offset, and -1 as nothing is tiered), and its
``describe_topic_partitions`` (DescribeTopicPartitions, KIP-966): every partition, a page at a
time by the partition limit and the cursor, unknown and invalid names, all topics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer, TopicPartition
from kafka.admin import NewTopic, OffsetSpec

from dataplane.tools.local_cluster import LocalCluster
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import running_cluster

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("kafka-configs")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("newcomer"), "kafka_configs", nodes=1) as running:
        yield running


@pytest.fixture(scope="module")
def kp(cluster: LocalCluster) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
    try:
        client.create_topics([NewTopic("newcomer-a", 3, 1), NewTopic("newcomer-b", 2, 1)])
        client.wait_for_topics(["newcomer-a", "newcomer-b"], timeout_ms=30_000)
        yield client
    finally:
        client.close()


def test_list_offsets_local_start_and_tiered_end(
    cluster: LocalCluster, kp: KafkaAdminClient
) -> None:
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap_servers, acks="all")
    try:
        for n in range(5):
            producer.send("newcomer-a", f"r{n}".encode(), partition=0)
        producer.flush(timeout=30)
    finally:
        producer.close()
    tp = TopicPartition("newcomer-a", 0)
    kp.delete_records({tp: 2})

    def listed(spec: Any) -> tuple[int, int | None]:
        found = kp.list_partition_offsets({tp: spec})[tp]
        return found.offset, found.leader_epoch

    assert listed(OffsetSpec.EARLIEST) == (2, 0)
    assert listed(OffsetSpec.EARLIEST_LOCAL) == (2, 0), "nothing tiered: the local log is all"
    assert listed(OffsetSpec.LATEST) == (5, 0)
    assert listed(OffsetSpec.LATEST_TIERED) == (-1, None), "no offset in remote storage"


def partitions(answer: dict[str, Any]) -> dict[str, list[int]]:
    return {t["name"]: [p["partition_index"] for p in t["partitions"]] for t in answer["topics"]}


def test_describe_topic_partitions_pages(kp: KafkaAdminClient) -> None:
    whole = kp.describe_topic_partitions(["newcomer-b", "newcomer-a", "missing", "bad/name"])
    errors = {t["name"]: t["error_code"] for t in whole["topics"]}
    assert errors == {
        "bad/name": ErrorCode.INVALID_TOPIC_EXCEPTION.code,
        "missing": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code,
        "newcomer-a": 0,
        "newcomer-b": 0,
    }
    assert partitions(whole)["newcomer-a"] == [0, 1, 2] and whole["next_cursor"] is None
    found = {t["name"]: t for t in whole["topics"]}["newcomer-a"]
    assert found["partitions"][0]["leader_id"] == 1 and found["partitions"][0]["isr_nodes"] == [1]
    assert str(found["topic_id"]) == str(kp.describe_topics(["newcomer-a"])[0]["topic_id"])

    first = kp.describe_topic_partitions(["newcomer-a", "newcomer-b"], response_partition_limit=2)
    assert partitions(first) == {"newcomer-a": [0, 1]}
    assert first["next_cursor"] == {"topic_name": "newcomer-a", "partition_index": 2}
    second = kp.describe_topic_partitions(
        ["newcomer-a", "newcomer-b"], response_partition_limit=2, cursor=first["next_cursor"]
    )
    assert partitions(second) == {"newcomer-a": [2], "newcomer-b": [0]}
    assert second["next_cursor"] == {"topic_name": "newcomer-b", "partition_index": 1}

    everything = partitions(kp.describe_topic_partitions([]))
    assert everything["newcomer-a"] == [0, 1, 2] and everything["newcomer-b"] == [0, 1]
    assert "missing" not in everything

    outside = kp.describe_topic_partitions(
        ["newcomer-b"], cursor={"topic_name": "newcomer-a", "partition_index": 0}
    )
    assert [(t["name"], t["error_code"]) for t in outside["topics"]] == [
        ("newcomer-b", ErrorCode.INVALID_REQUEST.code)
    ], "a cursor outside the named topics"
