"""Mirroring between two real 3-node clusters (source 127.0.0.191-193, target .194-196), the
``raftlog mirror`` process on 127.0.0.197.

One scenario, in order: a 3-partition topic is mirrored while a producer writes to it; the
mirror is SIGKILLed mid-way and restarted; every source record reaches the target in order per
partition, the duplicates (at-least-once) are listed and bounded below what a restart from the
beginning would give; the target topic has the source's partition count and configs; a group's
committed offsets on the source are translated onto the target and a consumer of that group on
the target resumes without skipping; a topic created later that the regex selects is mirrored,
and grows when the source grows; the lag report reaches zero.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from dataplane.client import AdminClient, Consumer, Producer, TopicPartition
from dataplane.client.admin import ConfigResource, ResourceType
from dataplane.tools.entry import COMMAND as RAFTLOG
from dataplane.tools.local_cluster import LocalCluster, free_port, wait_for
from tests.connect.support import CLUSTER_OVERRIDES, MirrorProcess
from tests.dataplane.cluster_support import create_topic, running_cluster

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("mirror")]
MIRROR_HOST = "127.0.0.197"
ALIAS = "A"
PARTITIONS = 3
RECORDS = 6000  # 2,000 a partition
RATE_PER_S = 1000
KILL_AFTER = 2500  # mirrored records on the target when the mirror is SIGKILLed
DUPLICATES_MAX = 1200  # ~1 s of traffic (offsets commit every 0.5 s); measured: 409
TOPIC_CONFIGS = {"retention.ms": "3600000", "segment.bytes": "1048576"}
GROUP = "billing"
BASE_TIMESTAMP_MS = 1_700_000_000_000
COMMITTED = {0: 1234, 1: 1500, 2: 1999}  # the group's committed offsets on the source


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, ...]]:
    root = tmp_path_factory.mktemp("mirror")
    with ExitStack() as stack:
        source = stack.enter_context(running_cluster(root / "s", "mirror_source",
                                                     CLUSTER_OVERRIDES))  # fmt: skip
        target = stack.enter_context(running_cluster(root / "t", "mirror_target",
                                                     CLUSTER_OVERRIDES))  # fmt: skip
        yield source, target


class Mirror(MirrorProcess):
    """One ``raftlog mirror`` process, stopped by its pid."""

    def __init__(self, root: Path, source: LocalCluster, target: LocalCluster) -> None:
        url = f"http://{MIRROR_HOST}:{free_port(MIRROR_HOST)}"
        super().__init__(url, root / "mirror.log", [
            "--source-bootstrap", ",".join(source.bootstrap_servers),
            "--target-bootstrap", ",".join(target.bootstrap_servers),
            "--source-alias", ALIAS, "--topics", "orders", "--topics-regex", "late-.*",
            "--groups", GROUP, "--tasks-max", "2",
            "--set", "refresh.topics.interval.ms=1000", "--set", "offset.lag.max=10",
            "--set", "emit.checkpoints.interval.ms=500",
            "--set", "sync.group.offsets.interval.ms=500",
            "--set", "request.timeout.ms=10000",
            "--worker", "offset.flush.interval.ms=500", "--worker", "session.timeout.ms=3000",
            "--worker", "heartbeat.interval.ms=300", "--worker", "status.metrics.interval.ms=500",
        ])  # fmt: skip

    def status(self) -> dict[str, Any]:
        done = subprocess.run([*RAFTLOG, "mirror", "status", "--url", self.url, "--json"],
                              check=True, capture_output=True, timeout=60)  # fmt: skip
        parsed: dict[str, Any] = json.loads(done.stdout)
        return parsed


def produce(cluster: LocalCluster, topic: str, partitions: int, per_partition: int,
            rate_per_s: float, stop: threading.Event) -> None:  # fmt: skip
    """Values ``<partition>-<n>`` (n = the source offset: this is the topic's only writer),
    with a key, a header and a timestamp to be mirrored."""
    with Producer(cluster.bootstrap_servers, linger_ms=5) as producer:
        for n in range(per_partition):
            for p in range(partitions):
                producer.send(
                    topic, f"{p}-{n}".encode(), f"k{n}".encode(), partition=p,
                    timestamp_ms=BASE_TIMESTAMP_MS + n, headers=[("n", str(n).encode())],
                )  # fmt: skip
            if rate_per_s and stop.wait(partitions / rate_per_s):
                return
        producer.flush(60)


def read_all(cluster: LocalCluster, topic: str, partitions: int, group: str | None = None
             ) -> dict[int, list[Any]]:  # fmt: skip
    """Every record of ``topic`` up to its end offsets now, by partition."""
    consumer = Consumer(cluster.bootstrap_servers, group_id=group, enable_auto_commit=False,
                        auto_offset_reset="earliest", fetch_max_wait_ms=100)  # fmt: skip
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        if group is None:
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
        else:
            consumer.subscribe([topic])
        ends = consumer.end_offsets(tps)
        found: dict[int, list[Any]] = {p: [] for p in range(partitions)}

        def done() -> bool:
            for tp, records in consumer.poll(200).items():
                found[tp.partition] += records
            owned = consumer.assignment()
            return len(owned) == partitions and all(consumer.position(tp) >= ends[tp]
                                                    for tp in owned)  # fmt: skip

        wait_for(f"{topic} read to its end", done, 60)
        return found
    finally:
        consumer.close()


def end_offsets(cluster: LocalCluster, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's end offset (its high watermark)."""
    consumer = Consumer(cluster.bootstrap_servers)
    try:
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return {tp.partition: end for tp, end in ends.items()}
    finally:
        consumer.close()


def end_total(cluster: LocalCluster, topic: str, partitions: int) -> int:
    return sum(end_offsets(cluster, topic, partitions).values())


def running_tasks(mirror: Mirror) -> int:
    states = [
        task["state"]
        for name in ("MirrorSourceConnector", "MirrorCheckpointConnector")
        for task in httpx.get(f"{mirror.url}/connectors/{name}/status", timeout=10).json()["tasks"]
    ]
    return sum(state == "RUNNING" for state in states)


def caught_up(mirror: Mirror, remote: str) -> bool:
    """The lag report shows every source record of ``orders`` mirrored."""
    rows = [r for r in mirror.status()["partitions"] if r["target_topic"] == remote]
    return len(rows) == PARTITIONS and all(
        r["mirrored_offset"] == RECORDS // PARTITIONS == r["source_end_offset"] for r in rows
    )


def target_partitions(admin: AdminClient, topic: str) -> int | None:
    described = admin.describe_topics()
    return len(described[topic].partitions) if topic in described else None


def test_mirror_through_sigkill_with_group_offsets_and_new_topics(
    clusters: tuple[LocalCluster, LocalCluster], tmp_path: Path
) -> None:
    source, target = clusters
    create_topic(source, "orders", PARTITIONS, configs=TOPIC_CONFIGS)
    mirror = Mirror(tmp_path, source, target)
    stop = threading.Event()
    writer = threading.Thread(target=produce, args=(source, "orders", PARTITIONS,
                              RECORDS // PARTITIONS, RATE_PER_S, stop))  # fmt: skip
    target_admin = AdminClient(target.bootstrap_servers)
    remote = f"{ALIAS}.orders"
    try:
        mirror.start()
        wait_for("the mirror's tasks running", lambda: running_tasks(mirror) == 3, 60)
        writer.start()
        wait_for("the target topic", lambda: target_partitions(target_admin, remote), 60)
        at_kill = wait_for(f"{KILL_AFTER} records mirrored", lambda: (
            n if (n := end_total(target, remote, PARTITIONS)) >= KILL_AFTER else None),
            60)  # fmt: skip
        mirror.kill()
        mirror.start()
        writer.join(60)
        assert not writer.is_alive()
        try:
            wait_for("every record mirrored", lambda: caught_up(mirror, remote), 90)
        except TimeoutError:  # which partitions are behind, whose report is missing, where the
            # target's high watermarks stand (acks=all answers wait for them) and what each of
            # the mirror's threads is doing
            print("the mirror's status:", json.dumps(mirror.status(), indent=1))
            print("the target's high watermarks:", end_offsets(target, remote, PARTITIONS))
            print("the mirror's threads:", mirror.threads())
            raise

        # every record, in order per partition; duplicates listed and bounded
        mirrored = read_all(target, remote, PARTITIONS)
        duplicates: dict[int, list[int]] = {}
        for p, records in mirrored.items():
            seen = [int(r.value.decode().split("-")[1]) for r in records]
            assert all(r.value.decode().startswith(f"{p}-") for r in records)
            first = list(dict.fromkeys(seen))
            assert first == list(range(RECORDS // PARTITIONS)), f"partition {p} in order"
            again = sorted(n for n, c in Counter(seen).items() for _ in range(c - 1))
            duplicates[p] = again
            for r in records:
                n = int(r.value.decode().split("-")[1])
                assert (r.key, r.timestamp, tuple(r.headers)) == (
                    f"k{n}".encode(),
                    BASE_TIMESTAMP_MS + n,
                    (("n", str(n).encode()),),
                )
        total = sum(len(d) for d in duplicates.values())
        print(f"mirrored {at_kill} before SIGKILL; duplicates after the restart: {total} "
              + ", ".join(f"p{p}: {d[0]}..{d[-1]} ({len(d)})" for p, d in duplicates.items()
                          if d))  # fmt: skip
        assert total <= min(DUPLICATES_MAX, at_kill - 1), "a restart from the beginning would "
        "duplicate everything mirrored before the SIGKILL"

        # the same partition count and configs
        resource = ConfigResource(ResourceType.TOPIC, remote)
        configs = target_admin.describe_configs([resource])[resource]
        assert {k: configs[k].value for k in TOPIC_CONFIGS} == TOPIC_CONFIGS
        assert target_partitions(target_admin, remote) == PARTITIONS

        check_group_translation(source, target, target_admin, remote)
        check_new_topic_by_regex(source, target, target_admin)
        # every task's report in (a task restarted for the new topic reports after its first
        # poll: under load a report without it came first) and each at zero
        expected = {(remote, p) for p in range(PARTITIONS)}

        def at_zero() -> bool:
            rows = mirror.status()["partitions"]
            reported = {(r["target_topic"], r["partition"]) for r in rows}
            return reported >= expected and all(r["lag_records"] == 0 for r in rows)

        wait_for("the lag report at zero", at_zero, 60)
        metrics = httpx.get(mirror.url + "/metrics", timeout=10).text
        assert 'raftlog_mirror_replication_lag_records{connector="MirrorSourceConnector"' in metrics
    finally:
        stop.set()
        writer.join(60)
        mirror.stop()
        target_admin.close()
        print(mirror.log_path.read_text()[-3000:] if mirror.log_path.exists() else "")


def check_group_translation(
    source: LocalCluster, target: LocalCluster, target_admin: AdminClient, remote: str
) -> None:
    consumer = Consumer(source.bootstrap_servers, group_id=GROUP, enable_auto_commit=False)
    try:
        consumer.commit({TopicPartition("orders", p): o for p, o in COMMITTED.items()})
    finally:
        consumer.close()

    def translated() -> dict[int, int] | None:
        found = {tp.partition: o.offset for tp, o in target_admin.list_group_offsets(GROUP).items()
                 if tp.topic == remote}  # fmt: skip
        return found if len(found) == PARTITIONS else None

    offsets = wait_for("the group's offsets on the target", translated, 60)
    ends = {p: len(records) for p, records in read_all(target, remote, PARTITIONS).items()}
    resumed = read_all(target, remote, PARTITIONS, group=GROUP)
    for p, committed in COMMITTED.items():
        assert 0 < offsets[p] <= ends[p], "never past what was mirrored"
        seen = [int(r.value.decode().split("-")[1]) for r in resumed[p]]
        assert seen and seen[0] <= committed, f"partition {p}: resumed after {committed}"
        assert set(range(committed, RECORDS // PARTITIONS)) <= set(seen), "nothing skipped"
    checkpoints = read_all(target, f"{ALIAS}.checkpoints.internal", 1)[0]
    assert any(json.loads(r.key)["group"] == GROUP for r in checkpoints)


def check_new_topic_by_regex(
    source: LocalCluster, target: LocalCluster, target_admin: AdminClient
) -> None:
    create_topic(source, "late-1", 2)
    produce(source, "late-1", 2, 50, 0, threading.Event())
    wait_for("A.late-1 created", lambda: target_partitions(target_admin, "A.late-1") == 2, 60)
    wait_for("A.late-1 mirrored", lambda: end_total(target, "A.late-1", 2) >= 100, 60)
    source_admin = AdminClient(source.bootstrap_servers)
    try:
        assert source_admin.create_partitions({"late-1": 3})["late-1"] is None
    finally:
        source_admin.close()
    wait_for("A.late-1 grown", lambda: target_partitions(target_admin, "A.late-1") == 3, 60)
