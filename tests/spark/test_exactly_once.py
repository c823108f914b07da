"""The exactly-once raftlog sink (spark/_writer.py) against a real 3-node cluster and Spark
``local[2,4]`` (two cores, a task may fail three times): write tasks that fail after their
transaction was prepared, a driver killed between two of a micro-batch's commits and restarted
from its checkpoint, a batch job with failing task attempts. Each time the output, read
read_committed, holds every input record exactly once; read_uncommitted shows the aborted
attempts were really written. Also the options, pure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from dataplane.client import AdminClient, Consumer
from dataplane.tools.local_cluster import LocalCluster, wait_for
from spark._options import parse_read_options, parse_write_options
from spark._writer import batch_record, names_batch
from spark.errors import OptionError
from spark.session import local_session
from tests.dataplane.cluster_support import running_cluster
from tests.spark.support import create, produce, servers

pytestmark = [pytest.mark.timeout(420), pytest.mark.xdist_group("spark-eos")]
REPO = Path(__file__).resolve().parents[2]
QUERY_DEADLINE_S = 180
DRIVER_DEADLINE_S = 240
READ_DEADLINE_S = 60.0
RECORDS = 300
PARTITIONS = 3


# -- options (pure) ---------------------------------------------------------------------------
def test_write_options_default_to_exactly_once_with_a_prefix_per_topic() -> None:
    options = parse_write_options({"raftlog.bootstrap.servers": "h:1", "topic": "out"})
    assert options.exactly_once and options.transaction_timeout_ms == 900_000
    assert options.transactional_id_prefix == "raftlog-spark-out"
    multi = parse_write_options({"kafka.bootstrap.servers": "h:1", "exactlyOnce": "FALSE"})
    assert not multi.exactly_once and multi.transactional_id_prefix == "raftlog-spark-multi"
    given = parse_write_options(
        {
            "raftlog.bootstrap.servers": "h:1",
            "TransactionalIdPrefix": "q1",
            "transactionTimeoutMs": "5000",
        }
    )
    assert (given.transactional_id_prefix, given.transaction_timeout_ms) == ("q1", 5000)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("exactlyOnce", "maybe", "must be true or false"),
        ("transactionTimeoutMs", "0", r"must be in \[1, "),
        ("transactionalIdPrefix", " ", "1 to 200 characters"),
        ("raftlog.test.killDriverAfterCommits", "1", "<commits>:<process group>"),
    ],
)
def test_bad_write_options(name: str, value: str, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_write_options({"raftlog.bootstrap.servers": "h:1", "topic": "t", name: value})


def test_isolation_level_option_defaults_to_kafkas() -> None:
    base = {"raftlog.bootstrap.servers": "h:1", "subscribe": "t"}
    assert parse_read_options(base, streaming=True).isolation_level == "read_uncommitted"
    for name in ("isolationLevel", "kafka.isolation.level"):
        read = parse_read_options({**base, name: "read_committed"}, streaming=False)
        assert read.isolation_level == "read_committed"
    with pytest.raises(OptionError, match="read_committed or read_uncommitted"):
        parse_read_options({**base, "isolationLevel": "serializable"}, streaming=False)


def test_the_batch_record_names_one_batch_of_one_query() -> None:
    record = batch_record("q", 7)
    assert names_batch(record, "q", 7)
    assert not names_batch(record, "q", 8) and not names_batch(record, "other", 7)
    assert not names_batch("", "q", 7) and not names_batch("[7]", "q", 7)


# -- on a cluster -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("eos"), "spark_eos") as running:
        yield running


@pytest.fixture(scope="module")
def session() -> Iterator[SparkSession]:
    # local[2,4]: Spark's local mode retries a failed task only with maxFailures in the master
    session = local_session("tests-eos", conf={"spark.master": "local[2,4]"})
    try:
        yield session
    finally:
        session.stop()


def source_records(cluster: LocalCluster, topic: str) -> set[bytes]:
    create(cluster, topic, PARTITIONS)
    values = [b"%s-%d" % (topic.encode(), n) for n in range(RECORDS)]
    produce(cluster, topic, values, [b"k%d" % n for n in range(RECORDS)])
    return set(values)


def read_values(cluster: LocalCluster, topic: str, isolation: str) -> list[bytes]:
    """Every value of ``topic`` up to the ends its isolation level reads to."""
    seen: list[bytes] = []
    with Consumer(
        cluster.bootstrap_servers,
        auto_offset_reset="earliest",
        isolation_level=isolation,  # type: ignore[arg-type]
    ) as consumer:
        tps = [(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)

        def done() -> bool:
            for records in consumer.poll(timeout_ms=200).values():
                seen.extend(r.value or b"" for r in records)
            return all(consumer.position(tp) >= end for tp, end in ends.items())

        wait_for(f"{topic} {isolation}", done, READ_DEADLINE_S)
    return seen


def wait_until_stable(cluster: LocalCluster, topic: str) -> None:
    """Until no transaction is open on ``topic``: the last stable offsets reach the high
    watermarks. The driver's commit returns once the coordinator accepted it (as Kafka's
    EndTxn); the markers that make the records readable follow."""
    with (
        Consumer(cluster.bootstrap_servers, isolation_level="read_committed") as committed,
        Consumer(cluster.bootstrap_servers) as uncommitted,
    ):
        tps = [(topic, p) for p in sorted(committed.partitions_for_topic(topic))]
        wait_for(
            f"the markers of {topic}'s transactions",
            lambda: committed.end_offsets(tps) == uncommitted.end_offsets(tps),
            READ_DEADLINE_S,
        )


def assert_exactly_once(cluster: LocalCluster, topic: str, expected: set[bytes]) -> list[bytes]:
    wait_until_stable(cluster, topic)
    committed = read_values(cluster, topic, "read_committed")
    duplicated = sorted({v for v in committed if committed.count(v) > 1})
    assert not duplicated, f"{len(duplicated)} values written twice, e.g. {duplicated[:3]}"
    assert set(committed) == expected, f"missing {sorted(expected - set(committed))[:5]}"
    return read_values(cluster, topic, "read_uncommitted")


def stream_of(session: SparkSession, cluster: LocalCluster, topic: str) -> DataFrame:
    return (
        session.readStream.format("raftlog")
        .option("raftlog.bootstrap.servers", servers(cluster))
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .select("key", "value")
    )


@pytest.mark.slow
def test_tasks_failing_after_their_transaction_was_prepared_write_exactly_once(
    session: SparkSession, cluster: LocalCluster, tmp_path: Path
) -> None:
    expected = source_records(cluster, "eos-in")
    create(cluster, "eos-out", PARTITIONS)
    marker = tmp_path / "failed"
    query = (
        stream_of(session, cluster, "eos-in")
        .writeStream.format("raftlog")
        .option("raftlog.bootstrap.servers", servers(cluster))
        .option("topic", "eos-out")
        .option("transactionalIdPrefix", "eos-tasks")
        .option("raftlog.test.failTaskOnceMarker", str(marker))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_DEADLINE_S)
    assert query.exception() is None
    assert sorted(p.name for p in tmp_path.glob("failed.*")) == [
        f"failed.{n}" for n in range(PARTITIONS)
    ]  # every task's first attempt failed
    uncommitted = assert_exactly_once(cluster, "eos-out", expected)
    # the failed attempts' records are in the log, aborted: twice as many as committed
    assert len(uncommitted) == 2 * RECORDS and set(uncommitted) == expected


@pytest.mark.slow
def test_a_driver_killed_mid_commit_and_restarted_writes_exactly_once(
    session: SparkSession, cluster: LocalCluster, tmp_path: Path
) -> None:
    expected = source_records(cluster, "eos-kill-in")
    create(cluster, "eos-kill-out", PARTITIONS)
    settings = {
        "servers": servers(cluster),
        "source": "eos-kill-in",
        "sink": "eos-kill-out",
        "checkpoint": str(tmp_path / "checkpoint"),
        "prefix": "eos-kill",
        "kill_after_commits": 1,
    }
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.spark.eos_driver", json.dumps(settings)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the hook kills that group
    )
    try:
        out, _ = driver.communicate(timeout=DRIVER_DEADLINE_S)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == -signal.SIGKILL and b"stopped" not in out
    # one task's transaction committed before the kill, the others' stayed prepared (open)
    ids = [f"eos-kill-{n}" for n in range(PARTITIONS)]
    with AdminClient(cluster.bootstrap_servers) as admin:
        states = sorted(d.state for d in admin.describe_transactions(ids).values())
    assert states in (
        ["CompleteCommit", "Ongoing", "Ongoing"],
        ["Ongoing", "Ongoing", "PrepareCommit"],  # its markers still on the way
    )

    # the same query (its checkpoint, its prefix) started again re-runs the batch
    query = (
        stream_of(session, cluster, "eos-kill-in")
        .writeStream.format("raftlog")
        .option("raftlog.bootstrap.servers", servers(cluster))
        .option("topic", "eos-kill-out")
        .option("transactionalIdPrefix", "eos-kill")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_DEADLINE_S)
    assert query.exception() is None
    assert [p["batchId"] for p in query.recentProgress] == [0]  # the batch the kill cut short
    assert_exactly_once(cluster, "eos-kill-out", expected)


@pytest.mark.slow
def test_a_batch_write_with_failing_task_attempts_writes_exactly_once(
    session: SparkSession, cluster: LocalCluster, tmp_path: Path
) -> None:
    create(cluster, "eos-batch", PARTITIONS)
    rows = [(b"k%d" % n, b"batch-%d" % n) for n in range(RECORDS)]
    df = session.createDataFrame(rows, "key binary, value binary").repartition(2)
    (
        df.write.format("raftlog")
        .option("raftlog.bootstrap.servers", servers(cluster))
        .option("topic", "eos-batch")
        .option("raftlog.test.failTaskOnceMarker", str(tmp_path / "failed"))
        .mode("append")
        .save()
    )
    assert len(list(tmp_path.glob("failed.*"))) == 2
    uncommitted = assert_exactly_once(cluster, "eos-batch", {v for _, v in rows})
    assert len(uncommitted) == 2 * RECORDS
