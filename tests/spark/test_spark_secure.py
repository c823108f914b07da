"""Spark's source and sink against a secure cluster (TLS + SCRAM + ACLs, 127.0.0.160-161), with
the ``kafka.``-prefixed security options Spark's Kafka connector takes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from dataplane.client import AdminClient, NewTopic
from dataplane.tools.local_cluster import LocalCluster
from tests.dataplane.cluster_support import running_cluster
from tests.spark.support import session_for

pytestmark = [pytest.mark.timeout(400), pytest.mark.xdist_group("spark-secure"), pytest.mark.slow]
TWO_NODES: dict[str, str | int] = {
    "offsets.topic.replication.factor": 2,
    "transaction.state.log.replication.factor": 2,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("spark-secure")
    with running_cluster(root, "spark_secure", TWO_NODES, nodes=2, secure=True) as running:
        yield running


@pytest.fixture(scope="module")
def session() -> Iterator[SparkSession]:
    yield from session_for("secure")


def kafka_options(cluster: LocalCluster) -> dict[str, str]:
    """As a Spark Kafka job would set them: Java's names, PEM truststore, JAAS line."""
    settings = cluster.client_settings
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{settings["sasl.username"]}" password="{settings["sasl.password"]}";'
    )
    return {
        "kafka.bootstrap.servers": ",".join(cluster.bootstrap_servers),
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": jaas,
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": settings["ssl.ca.location"],
    }


def test_spark_writes_and_reads_a_secure_cluster(
    session: SparkSession, cluster: LocalCluster
) -> None:
    with AdminClient(cluster.bootstrap_servers, security=cluster.client_settings) as admin:
        assert admin.create_topics([NewTopic("secure-events", 2, 2)])["secure-events"] is None
    options = kafka_options(cluster)
    rows = [(b"k-%d" % (n % 7), b"v-%d" % n) for n in range(200)]
    frame = session.createDataFrame(rows, "key binary, value binary").repartition(2)
    frame.write.format("raftlog").options(**options).option("topic", "secure-events").mode(
        "append"
    ).save()  # exactly-once: transactions, committed by the driver, all over SASL_SSL
    read = (
        session.read.format("raftlog").options(**options)
        .option("subscribe", "secure-events").option("kafka.isolation.level", "read_committed")
        .load()
    )  # fmt: skip
    got = sorted((bytes(r.key), bytes(r.value)) for r in read.collect())
    assert got == sorted(rows)


def test_without_the_security_options_spark_gets_nothing(
    session: SparkSession, cluster: LocalCluster
) -> None:
    plaintext = {"kafka.bootstrap.servers": ",".join(cluster.bootstrap_servers)}
    with pytest.raises((PySparkException, Py4JJavaError)):
        session.read.format("raftlog").options(**plaintext).option(
            "subscribe", "secure-events"
        ).option("kafkaConsumer.pollTimeoutMs", "5000").load().collect()
