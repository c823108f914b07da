"""Exactly-once mirroring (``raftlog mirror --exactly-once``, KIP-618) between two real 3-node
clusters (source 127.0.0.37-39, target .44-46), the mirror process on 127.0.0.40.

The scenario runs twice on the same clusters, with and without ``--exactly-once``: a producer
writes ``orders`` (3 partitions, acks=all) while the mirror is SIGKILLed and restarted three
times. Exactly-once: the target, read read_committed, holds every source record exactly once and
in order per partition; a zombie holding an open transaction with the source task's
transactional id is fenced when the mirror restarts (its commit fails, its record never
visible); a source topic written transactionally with aborted transactions is mirrored with
only its committed records (read_uncommitted sees no aborted record either); every offset sync
names a committed target record holding the synced source record; a group's offsets translate.
At-least-once, the same run duplicates records: what the exactly-once run asserts would fail.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

from dataplane.client import AdminClient, Consumer, ConsumerRecord, Producer, TopicPartition
from dataplane.tools.local_cluster import LocalCluster, free_port, wait_for
from raftlog.errors import ErrorCode, KafkaError
from tests.connect.support import CLUSTER_OVERRIDES, MirrorProcess
from tests.dataplane.cluster_support import create_topic, running_cluster

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("mirror_eos")]
MIRROR_HOST = "127.0.0.40"
OVERRIDES: dict[str, str | int] = {**CLUSTER_OVERRIDES, "transaction.state.log.num.partitions": 5}
PARTITIONS = 3
RATE_PER_S = 300  # records a second, over the partitions
KILLS = 3
PROGRESS = 600  # records mirrored (target end offsets) before each SIGKILL
PER_PARTITION_MAX = 20_000
GROUP = "billing"
Isolation = Literal["read_uncommitted", "read_committed"]


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, ...]]:
    root = tmp_path_factory.mktemp("mirror-eos")
    with ExitStack() as stack:
        source = stack.enter_context(running_cluster(root / "s", "mirror_eos_source", OVERRIDES))
        target = stack.enter_context(running_cluster(root / "t", "mirror_eos_target", OVERRIDES))
        yield source, target


class Mirror(MirrorProcess):
    """One ``raftlog mirror`` process, stopped by its pid."""

    def __init__(self, root: Path, source: LocalCluster, target: LocalCluster, alias: str,
                 topics: str, exactly_once: bool) -> None:  # fmt: skip
        url = f"http://{MIRROR_HOST}:{free_port(MIRROR_HOST)}"
        super().__init__(url, root / f"mirror-{alias}.log", [
            "--source-bootstrap", ",".join(source.bootstrap_servers),
            "--target-bootstrap", ",".join(target.bootstrap_servers),
            "--source-alias", alias, "--topics", topics, "--groups", GROUP, "--tasks-max", "2",
            "--set", "refresh.topics.interval.ms=1000", "--set", "offset.lag.max=10",
            "--set", "emit.checkpoints.interval.ms=500",
            "--set", "sync.group.offsets.interval.ms=500",
            "--set", "request.timeout.ms=10000",
            "--worker", "offset.flush.interval.ms=2000", "--worker", "session.timeout.ms=3000",
            "--worker", "heartbeat.interval.ms=300", "--worker", "status.metrics.interval.ms=500",
            *(["--exactly-once"] if exactly_once else []),
        ])  # fmt: skip

    def source_tasks(self) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.url}/connectors/MirrorSourceConnector/status", timeout=10)
        tasks: list[dict[str, Any]] = answer.json()["tasks"]
        return tasks


def produce(cluster: LocalCluster, topic: str, stop: threading.Event) -> None:
    """Values ``<partition>-<n>`` (n = the source offset: the topic's only writer), acks=all,
    until ``stop``."""
    with Producer(cluster.bootstrap_servers, acks="all", linger_ms=5) as producer:
        for n in range(PER_PARTITION_MAX):
            for p in range(PARTITIONS):
                producer.send(topic, f"{p}-{n}".encode(), f"k{n}".encode(), partition=p)
            if stop.wait(PARTITIONS / RATE_PER_S):
                return


def end_offsets(cluster: LocalCluster, topic: str, partitions: int,
                isolation: Isolation = "read_uncommitted") -> dict[int, int]:  # fmt: skip
    consumer = Consumer(cluster.bootstrap_servers, isolation_level=isolation)
    try:
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        consumer.close()


def read(cluster: LocalCluster, topic: str, partitions: int, isolation: Isolation,
         enough: dict[int, int] | None = None,
         until: dict[int, bytes] | None = None) -> dict[int, list[ConsumerRecord]]:  # fmt: skip
    """Every record of ``topic`` up to its end offsets (the last stable offsets with
    read_committed), by partition; with ``enough``, until each partition gave that many; with
    ``until``, until each partition gave a record with that value."""
    consumer = Consumer(cluster.bootstrap_servers, enable_auto_commit=False,
                        fetch_max_wait_ms=100, isolation_level=isolation)  # fmt: skip
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        found: dict[int, list[ConsumerRecord]] = {p: [] for p in range(partitions)}
        ends = consumer.end_offsets(tps)

        def done() -> bool:
            for tp, records in consumer.poll(200).items():
                found[tp.partition] += records
            if enough is not None:
                return all(len(found[p]) >= n for p, n in enough.items())
            if until is not None:
                return all(value in values(found[p]) for p, value in until.items())
            return all(consumer.position(tp) >= ends[tp] for tp in tps)

        wait_for(f"{topic} read ({isolation})", done, 120)
        return found
    finally:
        consumer.close()


def write_transactions(cluster: LocalCluster, topic: str) -> dict[int, list[bytes]]:
    """Committed and aborted transactions on ``topic`` (2 partitions), interleaved with
    non-transactional records; the values a read_committed reader sees, by partition."""
    committed: dict[int, list[bytes]] = {0: [], 1: []}
    with Producer(cluster.bootstrap_servers, transactional_id="eos-source-writer") as txn, \
            Producer(cluster.bootstrap_servers) as plain:  # fmt: skip
        txn.init_transactions(30)
        for n in range(6):
            txn.begin_transaction()
            commit = n % 3 != 1
            for p in (0, 1):
                for i in range(5):
                    value = f"{'c' if commit else 'a'}{n}-{p}-{i}".encode()
                    txn.send(topic, value, partition=p)
                    if commit:
                        committed[p].append(value)
            (txn.commit_transaction if commit else txn.abort_transaction)(30)
            value = f"plain-{n}".encode()
            plain.send(topic, value, partition=n % 2).result(30)
            committed[n % 2].append(value)
    return committed


def open_zombie(target: LocalCluster, tid: str, remote: str) -> tuple[Producer, int]:
    """A producer with a source task's transactional id, holding an open transaction with a
    record on partition 0 of ``remote``; the record's offset."""
    zombie = Producer(target.bootstrap_servers, transactional_id=tid)
    zombie.init_transactions(30)
    zombie.begin_transaction()
    return zombie, zombie.send(remote, b"zombie", partition=0).result(30).offset


def check_fenced(target: LocalCluster, remote: str, zombie: Producer, at: int) -> None:
    """The partition's last stable offset passes the zombie's open transaction only once the
    restarted task 0 fenced it (aborting it); its commit then fails."""
    wait_for("the zombie fenced", lambda: end_offsets(
        target, remote, 1, "read_committed")[0] > at, 90)  # fmt: skip
    with pytest.raises(KafkaError) as fenced:
        zombie.commit_transaction(30)
    assert fenced.value.error in {ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH}


def wait_progress(target: LocalCluster, remote: str, isolation: Isolation) -> None:
    """Until ``PROGRESS`` more records were mirrored (committed ones, under exactly-once: a
    SIGKILL then lands after some commits, not always inside a restarted task's first
    transaction)."""
    mark = sum(end_offsets(target, remote, PARTITIONS, isolation).values()) + PROGRESS
    wait_for(f"{PROGRESS} more records mirrored", lambda: (
        sum(end_offsets(target, remote, PARTITIONS, isolation).values()) >= mark), 120)  # fmt: skip


def values(records: list[ConsumerRecord]) -> list[bytes]:
    return [r.value for r in records if r.value is not None]


def numbers(p: int, records: list[ConsumerRecord]) -> list[int]:
    found = [r.value.decode() for r in records if r.value is not None]
    assert all(v.startswith(f"{p}-") for v in found), f"partition {p}: foreign records"
    return [int(v.split("-")[1]) for v in found]


@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
def test_mirror_through_sigkills(
    clusters: tuple[LocalCluster, LocalCluster], tmp_path: Path, exactly_once: bool
) -> None:
    source, target = clusters
    alias = "E" if exactly_once else "L"
    orders = f"orders-{alias.lower()}"
    create_topic(source, orders, PARTITIONS)
    topics = orders
    if exactly_once:
        create_topic(source, "txns", 2)
        committed = write_transactions(source, "txns")
        topics += ",txns"
    remote = f"{alias}.{orders}"
    mirror = Mirror(tmp_path, source, target, alias, topics, exactly_once)
    stop = threading.Event()
    writer = threading.Thread(target=produce, args=(source, orders, stop))
    zombie: Producer | None = None
    at = -1
    isolation: Isolation = "read_committed" if exactly_once else "read_uncommitted"
    try:
        mirror.start()
        writer.start()
        wait_for(remote, lambda: remote in AdminClient(target.bootstrap_servers).list_topics(),
                 60)  # fmt: skip
        for kill in range(KILLS):
            wait_progress(target, remote, isolation)
            mirror.kill()
            if exactly_once and kill == 1:  # a zombie of task 0 with an open transaction
                zombie, at = open_zombie(target, f"{alias}-mm2-MirrorSourceConnector-0", remote)
            mirror.start()
            if zombie is not None and kill == 1:
                check_fenced(target, remote, zombie, at)
        wait_progress(target, remote, isolation)
        stop.set()
        writer.join(60)
        assert not writer.is_alive()
        expected = end_offsets(source, orders, PARTITIONS)
        last = {p: f"{p}-{n - 1}".encode() for p, n in expected.items()}
        mirrored = read(target, remote, PARTITIONS, isolation, until=last)
        duplicates = 0
        for p, records in mirrored.items():
            seen = numbers(p, records)
            assert list(dict.fromkeys(seen)) == list(range(expected[p])), f"p{p} in order, whole"
            duplicates += len(seen) - expected[p]
        print(f"{'exactly' if exactly_once else 'at-least'}-once: {sum(expected.values())} "
              f"records through {KILLS} SIGKILLs, {duplicates} duplicates")  # fmt: skip
        if not exactly_once:
            assert duplicates > 0, "at-least-once re-sends what was mirrored since its last commit"
            return
        assert duplicates == 0
        assert [r for r in mirrored[0] if r.value == b"zombie"] == []
        check_transactional_source(target, alias, committed)
        check_offset_syncs(target, alias, orders, remote)
        check_group_translation(source, target, orders, remote, expected)
        tasks = mirror.source_tasks()
        assert tasks and all(t["state"] == "RUNNING" for t in tasks), tasks
    finally:
        stop.set()
        writer.join(60)
        mirror.stop()
        if zombie is not None:
            zombie.close(5)
        print(mirror.log_path.read_text()[-3000:] if mirror.log_path.exists() else "")


def check_transactional_source(
    target: LocalCluster, alias: str, committed: dict[int, list[bytes]]
) -> None:
    """Only the committed records, in order, no control record copied as a record; not even
    read_uncommitted sees a record of an aborted source transaction (the mirror read the source
    read_committed: its own aborted transactions may hold copies of committed ones)."""
    remote = f"{alias}.txns"
    enough = {p: len(v) for p, v in committed.items()}
    got = read(target, remote, 2, "read_committed", enough=enough)
    assert {p: values(r) for p, r in got.items()} == committed
    raw = read(target, remote, 2, "read_uncommitted")
    for p, records in raw.items():
        assert set(values(records)) == set(committed[p]), f"p{p}: aborted source records"


def check_offset_syncs(target: LocalCluster, alias: str, orders: str, remote: str) -> None:
    """Every sync (read_committed) names a committed target record that holds its source
    record: translation never points past committed data."""
    syncs = [json.loads(r.value) for r in read(target, "mm2-offset-syncs.target.internal", 1,
             "read_committed")[0] if r.value is not None]  # fmt: skip
    mine = [s for s in syncs if s["topic"] == orders]
    assert mine, "offset syncs written"
    by_offset = {
        (p, r.offset): r.value for p, rs in read(target, remote, PARTITIONS,
                                                 "read_committed").items() for r in rs
    }  # fmt: skip
    for sync in mine:
        key = (sync["partition"], sync["downstream_offset"])
        assert by_offset.get(key) == f"{sync['partition']}-{sync['upstream_offset']}".encode(), sync


def check_group_translation(source: LocalCluster, target: LocalCluster, orders: str,
                            remote: str, expected: dict[int, int]) -> None:  # fmt: skip
    committed = {p: expected[p] // 2 for p in range(PARTITIONS)}
    consumer = Consumer(source.bootstrap_servers, group_id=GROUP, enable_auto_commit=False)
    try:
        consumer.commit({TopicPartition(orders, p): o for p, o in committed.items()})
    finally:
        consumer.close()
    admin = AdminClient(target.bootstrap_servers)
    try:
        found = wait_for("the group's offsets on the target", lambda: (
            o if len(o := {tp.partition: m.offset for tp, m in admin.list_group_offsets(
                GROUP).items() if tp.topic == remote}) == PARTITIONS else None), 60)  # fmt: skip
    finally:
        admin.close()
    mirrored = read(target, remote, PARTITIONS, "read_committed")
    for p, offset in found.items():
        after = [r for r in mirrored[p] if r.offset >= offset]
        assert after, f"p{p}: translated to {offset}, past the mirrored records"
        first = numbers(p, after[:1])[0]
        assert first <= committed[p], f"p{p}: resumes at {first}, after {committed[p]}"
