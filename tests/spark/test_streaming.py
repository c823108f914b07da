"""Streaming reads and writes of the raftlog data source: availableNow, a processing-time
trigger, restart from a checkpoint, maxOffsetsPerTrigger, writes by key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from dataplane.client.partitioner import partition_for_key
from dataplane.tools.local_cluster import LocalCluster, wait_for
from tests.dataplane.cluster_support import running_cluster
from tests.spark.support import consume_all, create, produce, servers, session_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("spark-stream"), pytest.mark.slow]
QUERY_DEADLINE_S = 120


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("stream"), "spark_stream") as running:
        yield running


@pytest.fixture(scope="module")
def session() -> Iterator[SparkSession]:
    yield from session_for("stream")


def stream(session: SparkSession, cluster: LocalCluster, **options: str) -> DataFrame:
    reader = session.readStream.format("raftlog").option(
        "raftlog.bootstrap.servers", servers(cluster)
    )
    for name, value in {"startingOffsets": "earliest", **options}.items():
        reader = reader.option(name, value)
    return reader.load()


def to_memory(df: DataFrame, name: str, checkpoint: Path, **trigger: object) -> StreamingQuery:
    writer = df.writeStream.format("memory").queryName(name)
    writer = writer.option("checkpointLocation", str(checkpoint))
    query: StreamingQuery = writer.trigger(**trigger).start()  # type: ignore[call-overload]
    return query


def offsets_in(session: SparkSession, table: str) -> list[tuple[int, int]]:
    return sorted((r.partition, r.offset) for r in session.table(table).collect())


def test_available_now_with_max_offsets_per_trigger(
    session: SparkSession, cluster: LocalCluster, tmp_path: Path
) -> None:
    create(cluster, "s-bounded", 3)
    acked = produce(
        cluster, "s-bounded", [b"v%d" % n for n in range(500)], [b"k%d" % n for n in range(500)]
    )
    df = stream(session, cluster, subscribe="s-bounded", maxOffsetsPerTrigger="120")
    query = to_memory(df, "bounded", tmp_path / "ck", availableNow=True)
    assert query.awaitTermination(QUERY_DEADLINE_S)
    assert query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [120, 120, 120, 120, 20]  # each micro-batch bounded, nothing left over
    assert offsets_in(session, "bounded") == sorted((m.partition, m.offset) for m in acked)


def test_processing_time_trigger_and_restart_from_checkpoint(
    session: SparkSession, cluster: LocalCluster, tmp_path: Path
) -> None:
    create(cluster, "s-live", 2)
    checkpoint, out = tmp_path / "ck", tmp_path / "out"
    df = stream(session, cluster, subscribe="s-live").select("partition", "offset")

    def to_files(**trigger: object) -> StreamingQuery:  # a sink that recovers from checkpoints
        writer = df.writeStream.format("parquet").option("path", str(out))
        writer = writer.option("checkpointLocation", str(checkpoint))
        return writer.trigger(**trigger).start()  # type: ignore[call-overload,no-any-return]

    def rows() -> list[tuple[int, int]]:
        return sorted(
            (r.partition, r.offset)
            for r in session.read.schema("partition int, offset long").parquet(str(out)).collect()
        )

    first = produce(cluster, "s-live", [b"a%d" % n for n in range(100)])
    query = to_files(processingTime="500 milliseconds")
    try:
        wait_for("first 100 rows", lambda: out.exists() and len(rows()) == 100, QUERY_DEADLINE_S)
        second = produce(cluster, "s-live", [b"b%d" % n for n in range(50)])
        wait_for("next 50 rows", lambda: len(rows()) == 150, QUERY_DEADLINE_S)
    finally:
        query.stop()
    assert query.exception() is None
    third = produce(cluster, "s-live", [b"c%d" % n for n in range(70)])
    restarted = to_files(availableNow=True)
    assert restarted.awaitTermination(QUERY_DEADLINE_S) and restarted.exception() is None
    # the restarted query resumed where its checkpoint said: only what came after, once
    assert sum(p["numInputRows"] for p in restarted.recentProgress) == 70
    assert rows() == sorted((m.partition, m.offset) for m in first + second + third)


def test_streaming_write_lands_in_the_partition_of_each_key(
    session: SparkSession, cluster: LocalCluster, tmp_path: Path
) -> None:
    create(cluster, "s-in", 2)
    create(cluster, "s-out", 3)
    keys = [b"user-%d" % (n % 11) for n in range(300)]
    produce(cluster, "s-in", [b"e%d" % n for n in range(300)], keys)
    query = (
        stream(session, cluster, subscribe="s-in")
        .select("key", "value")
        .writeStream.format("raftlog")
        .option("raftlog.bootstrap.servers", servers(cluster))
        .option("topic", "s-out")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_DEADLINE_S) and query.exception() is None
    seen = consume_all(cluster, "s-out")
    assert sorted(v for *_, v in seen) == sorted(b"e%d" % n for n in range(300))
    assert all(p == partition_for_key(k or b"", 3) for p, _, k, _ in seen)
