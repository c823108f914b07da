"""The admin client against a fake controller, bootstrapped from fake brokers or directly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dataplane.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from dataplane.client.admin import ConfigResource, ResourceType, raise_for_errors
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.fake_broker import FakeCluster, bootstrap, fake_brokers
from tests.dataplane.fake_controller import fake_controller


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with fake_brokers(2) as cluster, fake_controller(cluster):
        yield cluster


@pytest.fixture
def admin(cluster: FakeCluster) -> Iterator[AdminClient]:
    with AdminClient(bootstrap(cluster), request_timeout_ms=5000) as client:
        yield client


def test_bootstrap_from_brokers_or_controllers(cluster: FakeCluster) -> None:
    with AdminClient(bootstrap_controllers=list(cluster.controller_addresses)) as client:
        assert client.describe_cluster().cluster_id == "fake-cluster"
    with pytest.raises(ValueError):
        AdminClient()


def test_create_list_describe_delete_topics(admin: AdminClient) -> None:
    results = admin.create_topics(
        [NewTopic("a", 2, 1, configs={"retention.ms": "1000"}), NewTopic("b")]
    )
    assert results == {"a": None, "b": None}
    again = admin.create_topics([NewTopic("a", 2)])
    assert again["a"] is not None and again["a"].error is ErrorCode.TOPIC_ALREADY_EXISTS
    with pytest.raises(KafkaError):
        raise_for_errors(again)
    assert admin.list_topics() == ["a", "b"]
    described = admin.describe_topics(["a"])["a"]
    assert [p.partition for p in described.partitions] == [0, 1]
    assert described.configs == {"retention.ms": "1000"}
    assert described.partitions[0].isr == (described.partitions[0].leader,)
    assert admin.delete_topics(["b"]) == {"b": None}
    with pytest.raises(KafkaError) as info:
        admin.describe_topics(["b"])
    assert info.value.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_create_partitions(admin: AdminClient) -> None:
    admin.create_topics([NewTopic("a", 1)])
    assert admin.create_partitions({"a": 3}) == {"a": None}
    assert len(admin.describe_topics(["a"])["a"].partitions) == 3
    shrink = admin.create_partitions({"a": 2})["a"]
    assert shrink is not None and shrink.error is ErrorCode.INVALID_PARTITIONS


def test_configs(admin: AdminClient) -> None:
    admin.create_topics([NewTopic("a", 1)])
    resource = ConfigResource(ResourceType.TOPIC, "a")
    admin.alter_configs(resource, {"cleanup.policy": "compact", "segment.bytes": "1000"})
    admin.alter_configs(resource, {"segment.bytes": None})
    entries = admin.describe_configs([resource])[resource]
    assert entries["cleanup.policy"].value == "compact" and not entries["cleanup.policy"].is_default
    assert "segment.bytes" not in entries and entries["retention.ms"].is_default
    with pytest.raises(KafkaError) as info:
        admin.alter_configs(resource, {"bogus": "1"})
    assert info.value.error is ErrorCode.INVALID_CONFIG


def test_cluster_quorum_and_elections(admin: AdminClient) -> None:
    described = admin.describe_cluster()
    assert [(b.broker_id, b.fenced) for b in described.brokers] == [(1, False), (2, True)]
    quorum = admin.describe_quorum()
    assert quorum.leader_id == 100 and quorum.leader_epoch == 3 and quorum.has_quorum
    result = admin.elect_leaders("preferred", [("a", 0)])
    error = result[TopicPartition("a", 0)]
    assert error is not None and error.error is ErrorCode.ELECTION_NOT_NEEDED


def test_create_then_produce_then_consume(cluster: FakeCluster, admin: AdminClient) -> None:
    assert admin.create_topics([NewTopic("events", 2)]) == {"events": None}
    with Producer(bootstrap(cluster), linger_ms=0) as producer:
        sent = [producer.send("events", value=b"%d" % i, key=b"%d" % i) for i in range(20)]
        producer.flush(timeout=10)
    with Consumer(
        bootstrap(cluster), auto_offset_reset="earliest", fetch_max_wait_ms=100
    ) as consumer:
        consumer.assign([TopicPartition("events", p) for p in range(2)])
        got: dict[bytes | None, tuple[int, int]] = {}
        for _ in range(50):
            for records in consumer.poll(timeout_ms=200).values():
                got.update({r.value: (r.partition, r.offset) for r in records})
            if len(got) == 20:
                break
    expected = {b"%d" % i: (f.result(0).partition, f.result(0).offset) for i, f in enumerate(sent)}
    assert got == expected
