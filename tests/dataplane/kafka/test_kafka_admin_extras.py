"""DescribeLogDirs, AlterReplicaLogDirs, ElectLeaders, feature levels (ApiVersions and
UpdateFeatures) and the refused deletion of internal topics, through Kafka's own admin clients
(confluent-kafka, kafka-python) against a real 3-node cluster on the "kafka" range
(127.0.0.171-173, shared with test_protocol.py: the xdist group runs them one after the other).
The rules themselves are tested pure in tests/metadata_quorum/test_features.py and
tests/dataplane/kafka/test_admin_extras_rules.py."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ElectionType, KafkaException
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient as RdAdminClient
from confluent_kafka.cimpl import NewPartitions as RdNewPartitions
from kafka import KafkaAdminClient, KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from kafka import errors as kafka_errors
from kafka.structs import OffsetAndMetadata

from dataplane.client import AdminClient
from dataplane.tools.entry import COMMAND as RAFTLOG
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.errors import ErrorCode
from tests.dataplane.cluster_support import create_topic, running_cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("kafka-protocol")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("kafka-extras"), "kafka") as running:
        yield running


def rd_admin(cluster: LocalCluster) -> RdAdminClient:
    return RdAdminClient({"bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers)})


def kp_partition(admin: KafkaAdminClient, topic: str, partition: int) -> dict[str, Any]:
    (described,) = admin.describe_topics([topic])
    return next(p for p in described["partitions"] if p["partition_index"] == partition)


def data_dir(cluster: LocalCluster, node_id: int) -> str:
    spec = next(s for s in cluster.specs if s.node_id == node_id)
    return str((spec.directory / "data").absolute())


# -- DescribeLogDirs / AlterReplicaLogDirs ------------------------------------------------------
def test_describe_log_dirs_lists_each_brokers_one_directory(
    cluster: LocalCluster, kp_admin: KafkaAdminClient
) -> None:
    create_topic(cluster, "dirs", 2)
    producer = RdProducer({"bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers)})
    for n in range(200):
        producer.produce("dirs", key=str(n).encode(), value=b"x" * 100)
    assert producer.flush(60) == 0
    del producer  # librdkafka's handle closes with its last reference
    data_dirs = {str((spec.directory / "data").absolute()) for spec in cluster.specs}

    def sizes() -> dict[tuple[str, int], int] | None:
        found: dict[tuple[str, int], int] = {}
        for broker in kp_admin.describe_log_dirs(["dirs"]):
            (log_dir,) = broker["log_dirs"]
            assert log_dir["error_code"] == 0 and log_dir["log_dir"] in data_dirs
            assert log_dir["total_bytes"] >= log_dir["usable_bytes"] > 0
            for topic in log_dir["topics"]:
                assert topic["name"] == "dirs"  # only the asked topic
                for p in topic["partitions"]:
                    assert p["offset_lag"] == 0 and p["is_future_key"] is False
                    found[f"node-{broker['broker']}", p["partition_index"]] = p["partition_size"]
        total = sum(found.values())
        return found if len(found) == 6 and min(found.values()) > 0 and total > 200 * 100 else None

    assert wait_for("every replica of dirs has its bytes", sizes, 60)


def test_alter_replica_log_dirs_with_one_directory_per_broker(
    cluster: LocalCluster, kp_admin: KafkaAdminClient
) -> None:
    leaders = create_topic(cluster, "dirs-single", 1, rf=1)
    host = leaders[0].leader_id
    other = next(spec.node_id for spec in cluster.specs if spec.node_id != host)
    result = kp_admin.alter_replica_log_dirs({
        ("dirs-single", 0, host): data_dir(cluster, host),  # where it is: nothing to move
        ("dirs-single", 0, other): data_dir(cluster, other),
    })  # fmt: skip
    by_broker = {tpr.broker_id: error for tpr, error in result.items()}
    assert by_broker[host] is kafka_errors.NoError
    assert by_broker[other] is kafka_errors.ReplicaNotAvailableError  # hosts no replica
    elsewhere = kp_admin.alter_replica_log_dirs({("dirs-single", 0, host): "/tmp/not-a-log-dir"})
    assert list(elsewhere.values()) == [kafka_errors.LogDirNotFoundError]


# -- ElectLeaders ---------------------------------------------------------------------------
def test_preferred_and_unclean_elections_with_confluent_admin(
    cluster: LocalCluster, kp_admin: KafkaAdminClient
) -> None:
    create_topic(cluster, "elect-me", 1)
    before = kp_partition(kp_admin, "elect-me", 0)
    leader, replicas = before["leader_id"], before["replica_nodes"]
    assert replicas[0] == leader
    # make another replica the preferred one; the leader stays where it is
    reordered = [replicas[1], replicas[0], replicas[2]]
    kp_admin.alter_partition_reassignments({KpTopicPartition("elect-me", 0): reordered})
    wait_for(
        "the new replica order",
        lambda: kp_partition(kp_admin, "elect-me", 0)["replica_nodes"] == reordered,
        60,
    )
    assert kp_partition(kp_admin, "elect-me", 0)["leader_id"] == leader
    admin = rd_admin(cluster)
    tp = RdTopicPartition("elect-me", 0)
    elected = admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(timeout=60)
    assert elected == {tp: None}
    wait_for(
        "the preferred replica leads",
        lambda: kp_partition(kp_admin, "elect-me", 0)["leader_id"] == reordered[0],
        60,
    )
    again = admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(timeout=60)
    assert again[tp].code() == ErrorCode.ELECTION_NOT_NEEDED.code
    unclean = admin.elect_leaders(ElectionType.UNCLEAN, [tp]).result(timeout=60)
    assert unclean[tp].code() == ErrorCode.ELECTION_NOT_NEEDED.code  # it has a leader
    missing = RdTopicPartition("elect-me", 7)
    unknown = admin.elect_leaders(ElectionType.PREFERRED, [missing]).result(timeout=60)
    assert unknown[missing].code() == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code


def test_election_of_every_partition_leaves_out_those_not_needed(
    cluster: LocalCluster, kp_admin: KafkaAdminClient
) -> None:
    create_topic(cluster, "elect-all", 3)
    # librdkafka sends null partitions: every partition, those already led by their preferred
    # replica left out of the answer (Kafka's controller)
    admin = rd_admin(cluster)  # held: the future fails if its handle is collected
    everything = admin.elect_leaders(ElectionType.PREFERRED, None).result(timeout=60)
    assert not [tp for tp in everything if tp.topic == "elect-all"], everything
    assert all(
        error is None or error.code() != ErrorCode.ELECTION_NOT_NEEDED.code
        for error in everything.values()
    ), everything
    # kafka-python lists every partition itself: each is answered, ELECTION_NOT_NEEDED included
    listed = kp_admin.elect_leaders(0, {"elect-all": [0, 1, 2]}, raise_errors=False)
    assert listed.error_code == 0
    (topic,) = listed.replica_election_results
    assert sorted((p.partition_id, p.error_code) for p in topic.partition_result) == [
        (p, ErrorCode.ELECTION_NOT_NEEDED.code) for p in range(3)
    ]


# -- internal topics ------------------------------------------------------------------------
def test_internal_topics_are_neither_deleted_nor_grown(
    cluster: LocalCluster, kp_admin: KafkaAdminClient
) -> None:
    create_topic(cluster, "offsets-user", 1)
    consumer = KafkaConsumer(  # a commit makes the group coordinator's topic exist
        bootstrap_servers=cluster.kafka_bootstrap_servers, group_id="extras-group",
        enable_auto_commit=False,
    )  # fmt: skip
    try:
        consumer.assign([KpTopicPartition("offsets-user", 0)])
        consumer.commit({KpTopicPartition("offsets-user", 0): OffsetAndMetadata(0, "", -1)})
    finally:
        consumer.close()
    (described,) = kp_admin.describe_topics(["__consumer_offsets"])
    count = len(described["partitions"])
    admin = rd_admin(cluster)
    code = ErrorCode.INVALID_TOPIC_EXCEPTION.code
    with pytest.raises(KafkaException) as deleted:
        admin.delete_topics(["__consumer_offsets"])["__consumer_offsets"].result(timeout=60)
    assert deleted.value.args[0].code() == code
    grow = RdNewPartitions("__consumer_offsets", count + 1)
    with pytest.raises(KafkaException) as grown:
        admin.create_partitions([grow])["__consumer_offsets"].result(timeout=60)
    assert grown.value.args[0].code() == code
    with AdminClient(cluster.bootstrap_servers) as grpc_admin:  # the native admin client
        refused = grpc_admin.delete_topics(["__consumer_offsets"])["__consumer_offsets"]
    assert refused is not None and refused.error is ErrorCode.INVALID_TOPIC_EXCEPTION
    assert "is an internal topic" in refused.message
    cli = subprocess.run(
        [*RAFTLOG, "topic", "delete", "__consumer_offsets", "--bootstrap-server",
         ",".join(cluster.bootstrap_servers)],
        capture_output=True, text=True, timeout=90, check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )  # fmt: skip
    assert cli.returncode != 0 and "internal topic" in cli.stdout + cli.stderr
    (after,) = kp_admin.describe_topics(["__consumer_offsets"])
    assert after["error_code"] == 0 and len(after["partitions"]) == count


# -- feature levels ---------------------------------------------------------------------------
FINALIZED = {"metadata.version": 23, "kraft.version": 1, "group.version": 1,
             "share.version": 1, "transaction.version": 1,
             "eligible.leader.replicas.version": 1}  # fmt: skip


def finalized(admin: KafkaAdminClient) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, levels in admin.describe_features().items():
        if "finalized" in levels:
            low, high = levels["finalized"]
            assert low == high
            out[name] = high
    return out


def test_api_versions_report_the_finalized_features(
    cluster: LocalCluster, kp_admin: KafkaAdminClient
) -> None:
    wait_for("the bootstrap levels", lambda: finalized(kp_admin) == FINALIZED, 60)
    described = kp_admin.describe_features()
    assert described["metadata.version"]["supported"] == (7, 23)
    assert described["eligible.leader.replicas.version"]["supported"] == (0, 1)
    assert described["metadata.version"]["finalized_epoch"] >= 0


def refused(admin: KafkaAdminClient, updates: dict[str, Any]) -> str:
    """The message of an update the controller refuses (all or nothing: the top-level error)."""
    with pytest.raises(kafka_errors.InvalidUpdateVersionError) as error:
        admin.update_features(updates)
    message = str(error.value)
    assert "The update failed for all features" in message
    return message


def test_update_features_downgrades_and_upgrades_with_kafkas_rules(
    cluster: LocalCluster, kp_admin: KafkaAdminClient
) -> None:
    wait_for("the bootstrap levels", lambda: finalized(kp_admin) == FINALIZED, 60)
    assert "without setting the upgrade type" in refused(kp_admin, {"transaction.version": 0})
    assert "only supports versions 0-1" in refused(kp_admin, {"transaction.version": 2})
    assert "only supports versions 7-23" in refused(kp_admin, {"metadata.version": 24})
    # 23's partition records carry KIP-966's ELR: Kafka's didMetadataChange refuses going below
    downgrade = {"metadata.version": ("SAFE_DOWNGRADE", 22)}
    assert "might delete metadata information" in refused(kp_admin, downgrade)
    kraft = {"kraft.version": ("SAFE_DOWNGRADE", 0)}
    assert "Downgrading kraft.version is not supported" in refused(kp_admin, kraft)
    checked = kp_admin.update_features(
        {"transaction.version": ("SAFE_DOWNGRADE", 0)}, validate_only=True
    )
    assert checked == {"transaction.version": "OK"}
    assert finalized(kp_admin) == FINALIZED  # nothing written

    down = kp_admin.update_features({"transaction.version": ("SAFE_DOWNGRADE", 0)})
    assert down == {"transaction.version": "OK"}
    lowered = {k: v for k, v in FINALIZED.items() if k != "transaction.version"}
    wait_for("transaction.version 0 (not listed)", lambda: finalized(kp_admin) == lowered, 60)
    up = kp_admin.update_features({"transaction.version": 1})
    assert up == {"transaction.version": "OK"}
    wait_for("transaction.version 1 again", lambda: finalized(kp_admin) == FINALIZED, 60)
