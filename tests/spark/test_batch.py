"""Batch reads and writes of the raftlog data source, the RDD reader and failOnDataLoss,
against a real 3-node cluster and Spark local[2]."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

from dataplane.client import Consumer, Producer, TopicPartition
from dataplane.client.partitioner import partition_for_key
from dataplane.tools.local_cluster import LocalCluster, wait_for
from spark.rdd import offset_ranges_between, topic_rdd
from tests.dataplane.cluster_support import running_cluster
from tests.spark.support import consume_all, create, produce, read, servers, session_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("spark-batch"), pytest.mark.slow]
SPARK_ERRORS = (PySparkException, Py4JJavaError)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides: dict[str, str | int] = {"log.retention.check.interval.ms": 200}
    with running_cluster(tmp_path_factory.mktemp("spark"), "spark", overrides) as running:
        yield running


@pytest.fixture(scope="module")
def session() -> Iterator[SparkSession]:
    yield from session_for("batch")


@pytest.fixture(scope="module")
def clicks(cluster: LocalCluster) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    """Topic ``clicks``: 3 partitions, 600 keyed records; (partition, offset) -> (key, value)."""
    create(cluster, "clicks", 3)
    keys = [b"user-%d" % (n % 17) for n in range(600)]
    values = [b"click-%d" % n for n in range(600)]
    acked = produce(cluster, "clicks", values, keys)
    return {(m.partition, m.offset): (keys[n], values[n]) for n, m in enumerate(acked)}


def test_batch_read_equals_what_was_produced(
    session: SparkSession, cluster: LocalCluster, clicks: dict[tuple[int, int], tuple[bytes, bytes]]
) -> None:
    df = read(session, cluster, subscribe="clicks")
    assert [f.name for f in df.schema.fields] == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType"
    ]  # fmt: skip
    assert df.rdd.getNumPartitions() == 3  # one input partition per topic-partition
    rows = df.collect()
    assert len(rows) == 600
    got = {(r.partition, r.offset): (bytes(r.key), bytes(r.value)) for r in rows}
    assert got == clicks
    assert {r.topic for r in rows} == {"clicks"} and {r.timestampType for r in rows} == {0}
    by_key = {bytes(r.key): r["count"] for r in df.groupBy("key").count().collect()}
    assert by_key == {b"user-%d" % k: len(range(k, 600, 17)) for k in range(17)}


def test_starting_and_ending_offsets_json_and_min_partitions(
    session: SparkSession, cluster: LocalCluster, clicks: dict[tuple[int, int], tuple[bytes, bytes]]
) -> None:
    df = read(
        session,
        cluster,
        subscribe="clicks",
        startingOffsets='{"clicks": {"0": 10, "1": -2, "2": 5}}',
        endingOffsets='{"clicks": {"0": 30, "1": 3, "2": -1}}',
        minPartitions="8",
    )
    ends = {p: 1 + max(o for q, o in clicks if q == p) for p in range(3)}
    wanted = {
        (p, o)
        for (p, o) in clicks
        if (p, o) in {(0, x) for x in range(10, 30)} | {(1, 0), (1, 1), (1, 2)}
        or (p == 2 and 5 <= o < ends[2])
    }
    assert df.rdd.getNumPartitions() >= 8  # big ranges split for minPartitions
    assert {(r.partition, r.offset) for r in df.collect()} == wanted
    assigned = read(
        session, cluster, assign='{"clicks": [1]}', endingOffsets='{"clicks": {"1": 4}}'
    )
    assert sorted(r.offset for r in assigned.collect()) == [0, 1, 2, 3]


def test_headers_are_read_when_asked(session: SparkSession, cluster: LocalCluster) -> None:
    create(cluster, "with-headers", 1)
    with Producer(cluster.bootstrap_servers) as producer:
        producer.send("with-headers", b"v", headers=[("a", b"1"), ("b", None)]).result(30)
    row = read(session, cluster, subscribe="with-headers", includeHeaders="true").collect()[0]
    assert [(h.key, None if h.value is None else bytes(h.value)) for h in row.headers] == [
        ("a", b"1"), ("b", None)
    ]  # fmt: skip


def test_batch_write_lands_in_the_partition_of_each_key(
    session: SparkSession, cluster: LocalCluster
) -> None:
    create(cluster, "written", 3)
    # keys of 0 to 10 bytes (every tail length of murmur2's words), and some null ones
    rows = [
        (None if n % 10 == 0 else b"k" * (n % 9) + b"%d" % (n % 3), b"value-%d" % n)
        for n in range(400)
    ]
    df = session.createDataFrame(rows, "key binary, value binary").repartition(2)
    df.write.format("raftlog").option("raftlog.bootstrap.servers", servers(cluster)).option(
        "topic", "written"
    ).mode("append").save()
    seen = consume_all(cluster, "written")
    assert {v: k for _, _, k, v in seen} == {v: k for k, v in rows}
    assert len(seen) == len(rows)
    assert all(p == partition_for_key(k, 3) for p, _, k, _ in seen if k is not None)
    # explicit topic and partition columns, string values
    schema = StructType([
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("value", StringType()), StructField("key", BinaryType()),
    ])  # fmt: skip
    explicit = session.createDataFrame([("written", 2, "pinned", b"key-0")], schema)
    explicit.write.format("raftlog").option("kafka.bootstrap.servers", servers(cluster)).mode(
        "append"
    ).save()
    assert (2, b"pinned") in {(p, v) for p, _, _, v in consume_all(cluster, "written")}


def test_rdd_reader_has_one_partition_per_range(
    session: SparkSession, cluster: LocalCluster, clicks: dict[tuple[int, int], tuple[bytes, bytes]]
) -> None:
    ranges = offset_ranges_between(servers(cluster), "clicks", '{"clicks": {"0": 4}}', "latest")
    assert [(r.partition, r.from_offset) for r in ranges] == [(0, 4), (1, 0), (2, 0)]
    rdd = topic_rdd(session.sparkContext, servers(cluster), ranges)
    assert rdd.getNumPartitions() == 3
    records = rdd.collect()
    assert {(p, o): (k, v) for k, v, _, p, o, _ in records} == {
        po: kv for po, kv in clicks.items() if po[0] != 0 or po[1] >= 4
    }
    sizes = rdd.glom().map(len).collect()
    assert sizes == [r.size for r in ranges]


def test_clear_errors(session: SparkSession, cluster: LocalCluster) -> None:
    with pytest.raises(SPARK_ERRORS, match=r"UnknownTopicError.*no-such-topic"):
        read(session, cluster, subscribe="no-such-topic").collect()
    with pytest.raises(SPARK_ERRORS, match=r"OptionError.*startingOffsets.*not valid JSON"):
        read(session, cluster, subscribe="clicks", startingOffsets='{"clicks": ').collect()
    with pytest.raises(SPARK_ERRORS, match=r"OptionError.*assign"):
        read(session, cluster, assign="[1, 2]").collect()
    no_value = session.createDataFrame([(b"k",)], "key binary")
    with pytest.raises(SPARK_ERRORS, match=r"MissingColumnError.*'value' column"):
        no_value.write.format("raftlog").option(
            "raftlog.bootstrap.servers", servers(cluster)
        ).option("topic", "clicks").mode("append").save()


@pytest.mark.parametrize("fail", [True, False])
def test_fail_on_data_loss(session: SparkSession, cluster: LocalCluster, fail: bool) -> None:
    topic = f"retained-{str(fail).lower()}"
    create(cluster, topic, 1, **{"segment.bytes": "1024", "retention.bytes": "2048"})
    # Small batches: a segment holds whole batches, and retention never deletes the active one;
    # one 1 MB batch (the client's default) would leave nothing to delete.
    produce(cluster, topic, [b"%04d" % n + b"x" * 100 for n in range(300)], batch_size=1024)
    with Consumer(cluster.bootstrap_servers) as consumer:
        tp = TopicPartition(topic, 0)
        log_start = wait_for("retention to delete segments", lambda: (
            consumer.beginning_offsets([tp])[tp] or None))  # fmt: skip
    df = read(
        session, cluster, subscribe=topic, startingOffsets=f'{{"{topic}": {{"0": 0}}}}',
        failOnDataLoss=str(fail).lower(),
    )  # fmt: skip
    if fail:
        with pytest.raises(SPARK_ERRORS, match=r"DataLossError.*deleted"):
            df.collect()
        return
    offsets = sorted(r.offset for r in df.collect())
    assert offsets and offsets[0] >= log_start and offsets[-1] == 299
    assert offsets == list(range(offsets[0], 300))  # the rest, each record once


def test_kafka_client_records_read_by_spark_and_spark_writes_read_by_librdkafka(
    session: SparkSession, cluster: LocalCluster
) -> None:
    """Across the two front doors: what librdkafka produces over the Kafka protocol (idempotent,
    lz4, headers) is what the Spark source reads, record for record, and what Spark writes is
    what librdkafka reads."""
    kafka = ",".join(cluster.kafka_bootstrap_servers)
    create(cluster, "from-kafka", 2)
    producer = RdProducer({
        "bootstrap.servers": kafka, "enable.idempotence": True, "compression.type": "lz4",
        "linger.ms": 5,
    })  # fmt: skip
    delivered: dict[tuple[int, int], tuple[bytes, bytes, int, list[tuple[str, bytes]]]] = {}

    def report(error: object, message: Any) -> None:
        assert error is None, error
        value = message.value()
        sent_headers = [("n", value[1:])]  # (delivery reports carry no headers)
        stored = (message.key(), value, message.timestamp()[1], sent_headers)
        delivered[(message.partition(), message.offset())] = stored

    for n in range(300):
        producer.produce(
            "from-kafka", key=b"k%d" % (n % 7), value=b"v%d" % n, headers=[("n", b"%d" % n)],
            on_delivery=report,
        )  # fmt: skip
    assert producer.flush(30) == 0
    df = read(session, cluster, subscribe="from-kafka", includeHeaders="true")
    rows = df.selectExpr(
        "partition", "offset", "key", "value", "unix_millis(timestamp) AS ts", "headers"
    ).collect()
    got = {
        (r.partition, r.offset): (
            bytes(r.key),
            bytes(r.value),
            r.ts,
            [(h.key, bytes(h.value)) for h in r.headers],
        )
        for r in rows
    }
    assert got == delivered

    create(cluster, "from-spark", 2)
    written = [(b"key-%d" % (n % 5), b"value-%d" % n) for n in range(200)]
    session.createDataFrame(written, "key binary, value binary").write.format("raftlog").option(
        "raftlog.bootstrap.servers", servers(cluster)
    ).option("topic", "from-spark").mode("append").save()
    consumer = RdConsumer({
        "bootstrap.servers": kafka, "group.id": "from-spark-reader", "enable.auto.commit": False,
    })  # fmt: skip
    seen: list[tuple[bytes, bytes]] = []
    try:
        consumer.assign([RdTopicPartition("from-spark", p, OFFSET_BEGINNING) for p in (0, 1)])

        def done() -> bool:
            for message in consumer.consume(num_messages=500, timeout=0.5):
                assert message.error() is None, message.error()
                seen.append((message.key() or b"", message.value() or b""))
            return len(seen) >= len(written)

        wait_for("Spark's records through librdkafka", done, 60)
    finally:
        consumer.close()
    assert sorted(seen) == sorted(written)
