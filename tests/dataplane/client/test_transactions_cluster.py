"""Transactions through our client library on a real 3-node cluster: a consume-transform-produce
loop committing its input offsets inside its output transactions (exactly once), an aborted
transaction invisible to read_committed readers and visible to read_uncommitted ones, zombie
fencing of an older producer with the same transactional id, and the ``raftlog transactions``
and ``consume --isolation-level`` commands."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer

from dataplane.client import (
    AbortableTransactionError,
    AdminClient,
    Consumer,
    Producer,
    ProducerFencedError,
    TopicPartition,
)
from dataplane.tools.entry import COMMAND as RAFTLOG
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.cluster_support import create_topic, running_cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-txn-client")]

OVERRIDES: dict[str, str | int] = {
    "transaction.state.log.num.partitions": 5,
    "group.consumer.heartbeat.interval.ms": 300,
}
PARTITIONS = 3
SETTINGS: dict[str, Any] = {"request_timeout_ms": 10_000, "max_block_ms": 60_000}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("txn-client"), "txn_client", OVERRIDES) as running:
        for topic in ("input", "output", "visible", "fenced", "mixed", "handover"):
            create_topic(running, topic, PARTITIONS)
        yield running


def read_values(
    cluster: LocalCluster,
    topic: str,
    isolation: Literal["read_uncommitted", "read_committed"],
    expected: int,
) -> list[bytes]:
    """Every record value of ``topic`` from the start, at ``isolation``, up to its end offsets
    (the last stable offset with read_committed); waits until ``expected`` arrived."""
    with Consumer(cluster.bootstrap_servers, isolation_level=isolation) as consumer:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        seen: list[bytes] = []

        def caught_up() -> bool:
            for records in consumer.poll(500).values():
                seen.extend(r.value or b"" for r in records)
            ends = consumer.end_offsets(tps)
            return len(seen) >= expected and all(consumer.position(tp) >= ends[tp] for tp in tps)

        wait_for(f"{expected} records of {topic} ({isolation})", caught_up, 60)
        return seen


def produce(cluster: LocalCluster, topic: str, values: list[bytes], partitions: int) -> None:
    """``values`` round robin over the first ``partitions`` partitions, plainly."""
    with Producer(cluster.bootstrap_servers, **SETTINGS) as plain:
        for n, value in enumerate(values):
            plain.send(topic, value, partition=n % partitions)
        plain.flush(30)


def transforming_consumer(cluster: LocalCluster, group: str, **settings: Any) -> Consumer:
    """The consumer side of a consume-transform-produce loop: read_committed, no auto-commit."""
    return Consumer(
        cluster.bootstrap_servers, group_id=group, enable_auto_commit=False,
        auto_offset_reset="earliest", isolation_level="read_committed", **settings,
    )  # fmt: skip


def test_consume_transform_produce_is_exactly_once(cluster: LocalCluster) -> None:
    records = [b"record-%03d" % n for n in range(60)]
    produce(cluster, "input", records, PARTITIONS)
    consumer = transforming_consumer(cluster, "transformer", max_poll_records=7)
    with consumer, Producer(cluster.bootstrap_servers, transactional_id="transformer-0",
                            **SETTINGS) as producer:  # fmt: skip
        consumer.subscribe(["input"])
        producer.init_transactions(60)
        transformed = 0

        def step() -> bool:
            nonlocal transformed
            batch = consumer.poll(500)
            if not batch:
                return transformed >= len(records)
            producer.begin_transaction()
            for tp, polled in batch.items():
                for record in polled:
                    producer.send("output", (record.value or b"").upper(), key=record.key,
                                  partition=tp.partition)  # fmt: skip
            positions = {tp: consumer.position(tp) for tp in batch}
            producer.send_offsets_to_transaction(positions, consumer.group_metadata(), 30)
            producer.commit_transaction(30)
            transformed += sum(len(polled) for polled in batch.values())
            return transformed >= len(records)

        wait_for("every input record transformed", step, 120)
        assert consumer.group_metadata().generation_id > 0  # a member: checked by the group
    output = read_values(cluster, "output", "read_committed", len(records))
    assert sorted(output) == sorted(v.upper() for v in records)  # each exactly once
    with AdminClient(cluster.bootstrap_servers) as admin:
        committed = admin.list_group_offsets("transformer")
        described = admin.describe_transactions(["transformer-0"])["transformer-0"]
    assert {tp.partition: o.offset for tp, o in committed.items()} == {
        p: len(records) // PARTITIONS for p in range(PARTITIONS)
    }
    assert described.state == "CompleteCommit" and not described.topic_partitions


def test_an_aborted_transaction_is_seen_only_by_read_uncommitted(cluster: LocalCluster) -> None:
    with Producer(cluster.bootstrap_servers, transactional_id="visibility", **SETTINGS) as p:
        p.init_transactions(60)
        for name, commit in (("a", True), ("b", False), ("c", True)):
            p.begin_transaction()
            for n in range(6):
                p.send("visible", b"%s%d" % (name.encode(), n), partition=n % PARTITIONS)
            p.flush(30)  # in the log before the transaction ends
            if commit:
                p.commit_transaction(30)
            else:
                p.abort_transaction(30)
    committed = read_values(cluster, "visible", "read_committed", 12)
    everything = read_values(cluster, "visible", "read_uncommitted", 18)
    assert sorted(committed) == sorted(b"%s%d" % (x, n) for x in (b"a", b"c") for n in range(6))
    assert sorted(everything) == sorted(
        b"%s%d" % (x, n) for x in (b"a", b"b", b"c") for n in range(6)
    )


def test_an_open_transaction_holds_read_committed_back(cluster: LocalCluster) -> None:
    tp = TopicPartition("visible", 0)
    with Producer(cluster.bootstrap_servers, transactional_id="holding", **SETTINGS) as p:
        p.init_transactions(60)
        p.begin_transaction()
        p.send("visible", b"pending", partition=0)
        p.flush(30)
        with (
            Consumer(cluster.bootstrap_servers, isolation_level="read_committed") as committed,
            Consumer(cluster.bootstrap_servers) as uncommitted,
        ):
            stable, high = committed.end_offsets([tp])[tp], uncommitted.end_offsets([tp])[tp]
            assert stable < high  # the LSO stops at the open transaction's first offset
            p.commit_transaction(30)
            wait_for(
                "the LSO to pass the commit", lambda: committed.end_offsets([tp])[tp] > high, 30
            )


def test_a_partition_handed_over_mid_commit_starts_after_the_transactions_offsets(
    cluster: LocalCluster,
) -> None:
    """KIP-447: a member given a partition whose offsets a transaction holds pending (its
    commit returned, the marker not yet at the group coordinator; here the transaction still
    open) waits for them (``require_stable``) instead of starting from the last stable commit
    (here none: ``auto.offset.reset`` would re-read what the transaction consumed)."""
    tp = TopicPartition("handover", 0)
    produce(cluster, "handover", [b"in-%d" % n for n in range(10)], 1)
    consumer = transforming_consumer(cluster, "handover", request_timeout_ms=2_000)
    with consumer, Producer(cluster.bootstrap_servers, transactional_id="handover-0",
                            **SETTINGS) as producer:  # fmt: skip
        producer.init_transactions(60)
        producer.begin_transaction()
        producer.send("output", b"out", partition=0)
        producer.send_offsets_to_transaction({tp: 5}, "handover", 30)
        with pytest.raises(KafkaError) as unstable:
            consumer.committed([tp])
        assert unstable.value.error is ErrorCode.UNSTABLE_OFFSET_COMMIT
        consumer.subscribe(["handover"])
        seen: list[int] = []

        def poll() -> None:  # no records of the partition while its offsets are pending
            seen.extend(r.offset for rs in consumer.poll(200).values() for r in rs)

        def assigned() -> bool:
            poll()
            return tp in consumer.assignment()

        wait_for("the partition assigned", assigned, 60)
        poll()
        assert seen == []  # nothing read while the offsets are pending
        producer.commit_transaction(30)

        def read_five() -> bool:
            poll()
            return len(seen) >= 5

        wait_for("the records after the offsets", read_five, 60)
        assert seen == [5, 6, 7, 8, 9]
        assert consumer.committed([tp])[tp] is not None


def test_a_zombie_is_fenced_and_never_visible(cluster: LocalCluster) -> None:
    zombie = Producer(cluster.bootstrap_servers, transactional_id="fenced-id", **SETTINGS)
    newer = Producer(cluster.bootstrap_servers, transactional_id="fenced-id", **SETTINGS)
    with zombie, newer:
        zombie.init_transactions(60)
        zombie.begin_transaction()
        zombie.send("fenced", b"zombie-before", partition=0)
        zombie.flush(30)  # stored, in its open transaction
        newer.init_transactions(60)  # a new epoch: the zombie's transaction is aborted
        late = [zombie.send("fenced", b"zombie-after", partition=p) for p in range(PARTITIONS)]
        with pytest.raises((ProducerFencedError, AbortableTransactionError)) as raised:
            zombie.commit_transaction(30)
        assert raised.value.error in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH)
        assert all(future.exception(30) is not None for future in late)
        with pytest.raises(ProducerFencedError):
            zombie.abort_transaction(30)  # fenced at the coordinator too
        with pytest.raises(ProducerFencedError):
            zombie.begin_transaction()
        newer.begin_transaction()
        for p in range(PARTITIONS):
            newer.send("fenced", b"newer-%d" % p, partition=p)
        newer.commit_transaction(30)
    values = read_values(cluster, "fenced", "read_committed", PARTITIONS)
    assert sorted(values) == [b"newer-%d" % p for p in range(PARTITIONS)]


def test_librdkafka_and_this_client_agree_on_what_committed(cluster: LocalCluster) -> None:
    """librdkafka (the judge) writes transactions through the KAFKA listener and this client
    reads them read_committed; this client writes and librdkafka reads read_committed."""
    kafka = ",".join(cluster.kafka_bootstrap_servers)
    rd = RdProducer({"bootstrap.servers": kafka, "transactional.id": "rd-writer", "linger.ms": 5})
    rd.init_transactions(60)
    for name, commit in (("rd-a", True), ("rd-b", False)):
        rd.begin_transaction()
        for n in range(PARTITIONS):
            rd.produce("mixed", b"%s-%d" % (name.encode(), n), partition=n)
        rd.flush(30)
        if commit:
            rd.commit_transaction(30)
        else:
            rd.abort_transaction(30)
    with Producer(cluster.bootstrap_servers, transactional_id="ours-writer", **SETTINGS) as ours:
        ours.init_transactions(60)
        for name, commit in (("ours-a", False), ("ours-b", True)):
            ours.begin_transaction()
            for n in range(PARTITIONS):
                ours.send("mixed", b"%s-%d" % (name.encode(), n), partition=n)
            ours.flush(30)
            if commit:
                ours.commit_transaction(30)
            else:
                ours.abort_transaction(30)
    wanted = sorted(b"%s-%d" % (name, n) for name in (b"rd-a", b"ours-b") for n in range(3))
    assert sorted(read_values(cluster, "mixed", "read_committed", len(wanted))) == wanted
    reader = RdConsumer({
        "bootstrap.servers": kafka, "group.id": "rd-reader", "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "isolation.level": "read_committed",
    })  # fmt: skip
    try:
        reader.subscribe(["mixed"])
        seen: list[bytes] = []

        def read() -> bool:
            for message in reader.consume(num_messages=100, timeout=0.5):
                if message.error() is None:
                    seen.append(message.value() or b"")
            return len(seen) >= len(wanted)

        wait_for("librdkafka's read_committed records", read, 90)
        read()  # one more round: nothing aborted may come after
    finally:
        reader.close()
    assert sorted(seen) == wanted


# -- the CLI ---------------------------------------------------------------------------------
def raftlog(cluster: LocalCluster, *args: str) -> str:
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "PYTHONPATH": str(repo)}
    result = subprocess.run(
        [*RAFTLOG, *args, "--bootstrap-server", ",".join(cluster.bootstrap_servers)],
        env=env, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def test_the_transactions_commands(cluster: LocalCluster) -> None:
    with Producer(cluster.bootstrap_servers, transactional_id="cli-open", **SETTINGS) as p:
        p.init_transactions(60)
        p.begin_transaction()
        p.send("visible", b"cli-open", partition=1)
        p.flush(30)
        described = json.loads(raftlog(cluster, "transactions", "describe", "cli-open", "--json"))
        producer_id = described["producer_id"]
        assert described["state"] == "Ongoing"
        assert described["topic_partitions"] == [["visible", 1]]
        assert described["transaction_duration_ms"] >= 0
        table = raftlog(cluster, "transactions", "describe", "cli-open")
        assert "TRANSACTIONAL-ID" in table and "Ongoing" in table and "visible-1" in table
        listed = json.loads(raftlog(cluster, "transactions", "list", "--json"))
        assert {"transactional_id": "cli-open", "producer_id": producer_id,
                "state": "Ongoing"}.items() <= next(
            t for t in listed if t["transactional_id"] == "cli-open"
        ).items()  # fmt: skip
        ongoing = json.loads(
            raftlog(cluster, "transactions", "list", "--state", "Ongoing", "--json")
        )
        assert "cli-open" in [t["transactional_id"] for t in ongoing]
        assert {t["state"] for t in ongoing} == {"Ongoing"}
        producers = json.loads(raftlog(
            cluster, "transactions", "describe-producers", "--topic", "visible", "--partition",
            "1", "--json",
        ))  # fmt: skip
        mine = next(r for r in producers if r["producer_id"] == producer_id)
        assert mine["current_transaction_start_offset"] is not None
        assert "CURRENT-TRANSACTION-START-OFFSET" in raftlog(
            cluster, "transactions", "describe-producers", "--topic", "visible", "--partition", "1"
        )
        p.abort_transaction(30)
    committed = raftlog(cluster, "consume", "visible", "--from-beginning", "--timeout-ms", "3000",
                        "--isolation-level", "read_committed")  # fmt: skip
    uncommitted = raftlog(cluster, "consume", "visible", "--from-beginning", "--timeout-ms", "3000")
    assert "cli-open" in uncommitted.split() and "cli-open" not in committed.split()
