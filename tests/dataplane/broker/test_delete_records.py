"""DeleteRecords, OffsetDelete and commits past the log end with Kafka's own clients, our
AdminClient and the CLI, on a real 2-node cluster (127.0.0.201-202: the range of
test_transactions_cluster.py here, in turn with it in one xdist group; node 1 is also the one
controller, so either node's restart leaves the metadata quorum able to come back).

DeleteRecords moves a partition's log start offset on its leader; the follower takes it from
the fetch answers, so after the leader's controlled shutdown the new leader serves from it;
the whole cluster's restart keeps it (the log-start-offset checkpoint). An offset past the
high watermark is refused with OFFSET_OUT_OF_RANGE and changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaException
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient as RdAdmin
from kafka import KafkaAdminClient
from kafka import TopicPartition as KpTopicPartition

from dataplane.client import AdminClient, TopicPartition
from dataplane.tools.entry import COMMAND as RAFTLOG
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.cluster_support import create_topic, running_cluster, wait_for_leaders

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-transactions-broker")]

OVERRIDES: dict[str, str | int] = {
    "offsets.topic.replication.factor": 2,
    "offsets.topic.num.partitions": 3,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("delete-records")
    with running_cluster(root, "transactions_broker", OVERRIDES, nodes=2, controllers=1) as running:
        yield running


def servers(cluster: LocalCluster) -> str:
    return ",".join(cluster.kafka_bootstrap_servers)


def produce(cluster: LocalCluster, topic: str, partition: int, count: int) -> None:
    producer = RdProducer({"bootstrap.servers": servers(cluster), "linger.ms": 5})
    for n in range(count):
        producer.produce(topic, value=str(n).encode(), partition=partition)
    assert producer.flush(60) == 0


def first_offset(cluster: LocalCluster, topic: str, partition: int) -> int:
    """Where a consumer reading from the beginning starts (librdkafka: ListOffsets earliest)."""
    consumer = RdConsumer({"bootstrap.servers": servers(cluster), "group.id": "readers",
                           "enable.auto.commit": False})  # fmt: skip
    try:
        consumer.assign([RdTopicPartition(topic, partition, OFFSET_BEGINNING)])

        def polled() -> int | None:
            message = consumer.poll(0.5)
            if message is None or message.error():
                return None
            return message.offset()

        return wait_for(f"a record of {topic}-{partition}", polled, 60)
    finally:
        consumer.close()


def watermarks(cluster: LocalCluster, topic: str, partition: int) -> tuple[int, int]:
    consumer = RdConsumer({"bootstrap.servers": servers(cluster), "group.id": "readers"})
    try:
        low, high = consumer.get_watermark_offsets(RdTopicPartition(topic, partition), 30)
        return low, high
    finally:
        consumer.close()


def test_librdkafka_deletes_records_and_the_follower_and_a_restart_keep_them(
    cluster: LocalCluster,
) -> None:
    leaders = create_topic(cluster, "dr", 2, rf=2)
    # the partition node 2 leads: node 1, the controller, stays up when it stops
    partition = next(p for p, m in leaders.items() if m.leader_id == 2)
    produce(cluster, "dr", partition, 100)
    admin = RdAdmin({"bootstrap.servers": servers(cluster)})
    tp = RdTopicPartition("dr", partition, 40)
    deleted = admin.delete_records([tp], operation_timeout=30)[tp].result(60)
    assert deleted.low_watermark == 40
    past = RdTopicPartition("dr", partition, 1000)
    with pytest.raises(KafkaException) as refused:
        admin.delete_records([past], operation_timeout=30)[past].result(60)
    assert refused.value.args[0].code() == RdKafkaError.OFFSET_OUT_OF_RANGE
    assert watermarks(cluster, "dr", partition) == (40, 100)  # nothing changed by the refusal
    assert first_offset(cluster, "dr", partition) == 40
    # The leader's controlled shutdown: node 1, which followed, leads from offset 40.
    cluster.stop_node(2)
    wait_for("node 1 leading", lambda: _leader(cluster, "dr", partition) == 1, 60)
    assert first_offset(cluster, "dr", partition) == 40
    # Both replicas restart: the log start offset comes from disk.
    cluster.stop_node(1)
    cluster.start_node(1)
    cluster.start_node(2)
    wait_for_leaders(cluster, "dr", 2, timeout_s=90)
    assert watermarks(cluster, "dr", partition) == (40, 100)
    assert first_offset(cluster, "dr", partition) == 40


def _leader(cluster: LocalCluster, topic: str, partition: int) -> int:
    return wait_for_leaders(cluster, topic, 2, timeout_s=60)[partition].leader_id


def test_our_admin_client_kafka_python_and_the_cli(cluster: LocalCluster, tmp_path: Path) -> None:
    create_topic(cluster, "dr-admin", 2, rf=2)
    for partition in (0, 1):
        produce(cluster, "dr-admin", partition, 30)
    admin = AdminClient(cluster.bootstrap_servers)
    try:
        outcome = admin.delete_records({TopicPartition("dr-admin", 0): 10,
                                        ("dr-admin", 1): 1000, ("nope", 0): 1})  # fmt: skip
        assert outcome[TopicPartition("dr-admin", 0)] == (10, None)
        past = outcome[TopicPartition("dr-admin", 1)].error
        assert past is not None and past.error is ErrorCode.OFFSET_OUT_OF_RANGE
        unknown = outcome[TopicPartition("nope", 0)].error
        assert unknown is not None and unknown.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        high = admin.delete_records({("dr-admin", 1): -1})  # -1: up to the high watermark
        assert high[TopicPartition("dr-admin", 1)] == (30, None)
    finally:
        admin.close()
    kafka_python = KafkaAdminClient(bootstrap_servers=servers(cluster))
    try:
        answer = kafka_python.delete_records({KpTopicPartition("dr-admin", 0): 12})
        assert answer[KpTopicPartition("dr-admin", 0)]["low_watermark"] == 12
    finally:
        kafka_python.close()
    done = _raftlog(cluster, "topic", "delete-records", "dr-admin", "--partition", "0",
                    "--offset", "20", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        {"topic": "dr-admin", "partition": 0, "low_watermark": 20, "error": None}
    ]
    plan = tmp_path / "offsets.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "dr-admin", "partition": 0, "offset": 25}]}))  # fmt: skip
    done = _raftlog(cluster, "topic", "delete-records", "--offset-json-file", str(plan))
    assert done.returncode == 0, done.stderr
    assert "25" in done.stdout
    refused = _raftlog(cluster, "topic", "delete-records", "dr-admin", "--offset", "99")
    assert refused.returncode == 1
    assert "OFFSET_OUT_OF_RANGE" in refused.stderr
    assert watermarks(cluster, "dr-admin", 0) == (25, 30)


def _raftlog(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "PYTHONPATH": str(repo)}
    return subprocess.run(
        [*RAFTLOG, *args, "--bootstrap-server", ",".join(cluster.bootstrap_servers)],
        input="", env=env, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


def test_a_commit_past_the_log_end_is_stored(cluster: LocalCluster) -> None:
    create_topic(cluster, "past-end", 1, rf=2)
    produce(cluster, "past-end", 0, 5)
    consumer = RdConsumer({"bootstrap.servers": servers(cluster), "group.id": "past-end",
                           "enable.auto.commit": False})  # fmt: skip
    try:
        ahead = RdTopicPartition("past-end", 0, 5 + 100)
        consumer.commit(offsets=[ahead], asynchronous=False)
        (committed,) = consumer.committed([RdTopicPartition("past-end", 0)], timeout=30)
        assert committed.offset == 105
    finally:
        consumer.close()


def test_offset_delete(cluster: LocalCluster) -> None:
    create_topic(cluster, "od-a", 2, rf=2)
    create_topic(cluster, "od-b", 1, rf=2)
    produce(cluster, "od-a", 0, 3)
    group = "od-group"
    member = RdConsumer({
        "bootstrap.servers": servers(cluster), "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
    })  # fmt: skip
    closed = False
    kafka_python = KafkaAdminClient(bootstrap_servers=servers(cluster))
    admin = AdminClient(cluster.bootstrap_servers)
    try:
        member.subscribe(["od-a"])
        wait_for("an assignment", lambda: member.poll(0.2) is not None or member.assignment(), 60)
        member.commit(offsets=[RdTopicPartition("od-a", 0, 2), RdTopicPartition("od-a", 1, 0),
                               RdTopicPartition("od-b", 0, 4)], asynchronous=False)  # fmt: skip
        # an active member subscribes to od-a: its offsets stay; od-b's go
        answer = kafka_python.delete_group_offsets(
            group, [KpTopicPartition("od-a", 0), KpTopicPartition("od-b", 0)]
        )
        codes = {tp.topic: error.errno for tp, error in answer.items()}
        assert codes == {"od-a": ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC.code, "od-b": 0}
        internal = admin.delete_records({("__consumer_offsets", 0): 0})  # it exists now
        error = internal[TopicPartition("__consumer_offsets", 0)].error
        assert error is not None and error.error is ErrorCode.INVALID_TOPIC_EXCEPTION
        left = admin.list_group_offsets(group)
        assert set(left) == {TopicPartition("od-a", 0), TopicPartition("od-a", 1)}
        with pytest.raises(KafkaError) as missing:
            admin.delete_consumer_group_offsets("no-such-group", [("od-a", 0)])
        assert missing.value.error is ErrorCode.GROUP_ID_NOT_FOUND
        member.close()
        closed = True
        # the group is empty now: our AdminClient and the CLI delete the rest
        results = admin.delete_consumer_group_offsets(group, [("od-a", 0), ("nope", 0)])
        assert results[TopicPartition("od-a", 0)] is None
        unknown = results[TopicPartition("nope", 0)]
        assert unknown is not None and unknown.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        done = _raftlog(cluster, "group", "delete-offsets", group, "--topic", "od-a")
        assert done.returncode == 0, done.stderr
        assert "od-a-1" in done.stdout
        assert admin.list_group_offsets(group) == {}
    finally:
        admin.close()
        kafka_python.close()
        if not closed:
            member.close()
