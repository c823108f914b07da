"""kafkajs 2 (Node.js, an implementation of Kafka's protocol independent of librdkafka and the
Python clients; tests/js/, pinned by its package-lock.json) against a 3-node cluster
(127.0.0.221-223, the kafka_configs range, in turn with test_kafka_configs.py and
test_newcomer_clients.py). Each scenario is a script under tests/js/ run with ``node``; it prints
what kafkajs saw as one JSON line, which is judged here against what raftlog stores, read with
the gRPC client: the admin round trip, an idempotent gzip producer and a consumer group of
kafkajs members resuming from each other's commits, and transactions read committed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from dataplane.client import AdminClient, Consumer, TopicPartition
from dataplane.tools.local_cluster import LocalCluster, wait_for
from raftlog.batch import HEADER_SIZE, Compression, read_header
from tests.dataplane.cluster_support import fetch, running_cluster, wait_for_leaders

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("kafka-configs")]
JS_DIR = Path(__file__).resolve().parents[2] / "js"
SCENARIO_TIMEOUT_S = 90  # a scenario takes a few seconds; a stuck one is killed by its pid
Row = tuple[int, int, str, str]  # partition, offset, key, value


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Kafka's own test brokers set no initial rebalance delay: a new group forms at once.
    with running_cluster(
        tmp_path_factory.mktemp("kafkajs"),
        "kafka_configs",
        overrides={"group.initial.rebalance.delay.ms": 0},
    ) as running:
        yield running


def run_scenario(cluster: LocalCluster, script: str) -> dict[str, Any]:
    """Run ``tests/js/<script>`` against the cluster; its one JSON result line."""
    node = shutil.which("node")
    assert node is not None, "node is not installed (make deps installs nodejs)"
    assert (JS_DIR / "node_modules" / "kafkajs").is_dir(), (
        "kafkajs is not installed: npm ci --prefix tests/js (make test does)"
    )
    env = {**os.environ, "RAFTLOG_KAFKA_BOOTSTRAP": ",".join(cluster.kafka_bootstrap_servers)}
    process = subprocess.Popen(
        [node, script], cwd=JS_DIR, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=SCENARIO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"{script} ran over {SCENARIO_TIMEOUT_S} s\n{stdout}\n{stderr[-6000:]}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, f"{script} failed:\n{stdout}\n{stderr[-6000:]}"
    lines = stdout.splitlines()
    assert len(lines) == 1, f"{script} printed {len(lines)} lines:\n{stdout}"
    result: dict[str, Any] = json.loads(lines[0])
    return result


def grpc_rows(
    cluster: LocalCluster,
    topic: str,
    partitions: int,
    isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted",
) -> list[Row]:
    """Every record of the topic as raftlog's gRPC client reads it."""
    rows: list[Row] = []
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(cluster.bootstrap_servers, isolation_level=isolation_level) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)

        def done() -> bool:
            for records in consumer.poll(timeout_ms=200).values():
                rows.extend(
                    (r.partition, r.offset, (r.key or b"").decode(), (r.value or b"").decode())
                    for r in records
                )
            return all(consumer.position(tp) >= ends[tp] for tp in tps)

        wait_for(f"the gRPC client's read of {topic}", done, 30)
    return sorted(rows)


def batch_headers(cluster: LocalCluster, topic: str, partitions: int) -> list[Any]:
    """The header of every stored batch of the topic (from its leaders, over gRPC)."""
    headers = []
    for partition, leader in wait_for_leaders(cluster, topic, partitions).items():
        answer = fetch(cluster.broker_address(leader.leader_id), topic, partition, 0)
        assert answer.error_code == 0, answer.error_message
        position = 0
        while position + HEADER_SIZE <= len(answer.records):
            header = read_header(answer.records, position)
            headers.append(header)
            position += header.size_bytes
    return headers


def test_admin_round_trip(cluster: LocalCluster) -> None:
    result = run_scenario(cluster, "admin.js")
    assert result["cluster"]["brokers"] == [1, 2, 3]
    assert result["cluster"]["controller"] in (1, 2, 3)
    assert result["cluster"]["clusterId"] == "raftlog-local"
    assert (result["created"], result["createdAgain"]) == (True, False), "already exists: false"
    for partition in result["metadata"]:
        assert partition["replicas"] == [1, 2, 3] and partition["isr"] == [1, 2, 3]
        assert partition["leader"] in (1, 2, 3)
    assert [p["partition"] for p in result["metadata"]] == [0, 1]
    assert result["offsets"] == {"0": ["0", "6"], "1": ["0", "1"]}
    # partition 0's records are 1 s apart; partition 1 has none at or after the times asked,
    # which Kafka answers -1 and kafkajs turns into the high watermark
    assert result["offsetsByTimestamp"] == {
        "exact": {"0": "2", "1": "1"},
        "between": {"0": "3", "1": "1"},
        "after": {"0": "6", "1": "1"},
    }
    assert result["retention"] == {
        "before": {"value": "86400000", "readOnly": False},
        "after": {"value": "3600000", "readOnly": False},
    }
    assert result["brokerConfig"]["name"] == "1" and result["brokerConfig"]["entries"] > 0
    # as a Kafka 4.1 broker describes itself: log.retention.ms has no default (null) and is
    # dynamic; log.retention.hours is 168 and read-only
    assert result["brokerConfig"]["logRetentionMs"] == {"value": None, "readOnly": False}
    assert result["brokerConfig"]["logRetentionHours"] == {"value": "168", "readOnly": True}
    assert result["partitionsAfterCreate"] == [0, 1, 2]
    assert result["offsetsAfterDeleteRecords"] == {
        "0": ["2", "6"],
        "1": ["0", "1"],
        "2": ["0", "0"],
    }
    assert result["deleted"] is True
    admin = AdminClient(cluster.bootstrap_servers)
    try:
        assert "kafkajs-admin" not in admin.list_topics()
    finally:
        admin.close()


def test_idempotent_producer_and_consumer_group(cluster: LocalCluster) -> None:
    result = run_scenario(cluster, "group.js")
    topic = "kafkajs-group"
    assert result["created"] is True
    a, b = result["assignments"]["a"], result["assignments"]["b"]
    assert sorted(a + b) == [0, 1, 2, 3] and len(a) == len(b) == 2, result["assignments"]
    assert result["stable"] == {
        "state": "Stable", "protocolType": "consumer", "protocol": "RoundRobinAssigner",
        "members": 2,
    }  # fmt: skip

    stored = grpc_rows(cluster, topic, 4)
    ends = {str(p): sum(1 for row in stored if row[0] == p) for p in range(4)}
    assert result["ends"] == ends and result["committedAfterThird"] == ends
    rows = {name: [tuple(row) for row in found] for name, found in result["rows"].items()}
    everything = rows["a"] + rows["b"] + rows["c"]
    assert sorted(everything) == stored, "every stored record read once by the group's members"
    assert sorted(key for _, _, key, _ in everything) == sorted(f"k{n}" for n in range(240))
    assert {p for p, *_ in rows["a"]} <= set(a) and {p for p, *_ in rows["b"]} <= set(b)
    first = {str(p): sum(1 for row in rows["a"] + rows["b"] if row[0] == p) for p in range(4)}
    assert result["committedAfterTwo"] == first, "the first two members' commits"
    assert all(offset >= first[str(p)] for p, offset, *_ in rows["c"]), "c resumed at the commits"
    assert sorted(key for _, _, key, _ in rows["c"]) == sorted(f"k{n}" for n in range(200, 240))

    assert result["paused"] == [{"topic": topic, "partitions": [0]}]
    assert result["pausedRows"] == 0 and result["readWhilePaused"] == sum(
        ends[str(p)] - first[str(p)] for p in (1, 2, 3)
    )

    headers = batch_headers(cluster, topic, 4)
    assert headers and all(h.producer_id >= 0 and h.base_sequence >= 0 for h in headers)
    assert len({h.producer_id for h in headers}) == 1, "one idempotent producer"
    assert {h.compression for h in headers} == {Compression.GZIP}

    admin = result["admin"]
    assert admin["listed"] == [{"groupId": "kafkajs-group-g", "protocolType": "consumer"}]
    assert admin["empty"] == {"state": "Empty", "protocolType": "consumer", "protocol": "",
                              "members": 0}  # fmt: skip
    assert admin["afterSet"] == {"0": 1, "1": 2, "2": 3, "3": 4}
    assert sorted(tuple(row) for row in admin["rows"]) == [
        row for row in stored if row[1] >= row[0] + 1
    ], "the fourth member resumed at the offsets set"
    assert admin["deleted"] == [{"groupId": "kafkajs-group-g", "errorCode": 0}]
    assert admin["listedAfterDelete"] == []


def test_transactions_read_committed(cluster: LocalCluster) -> None:
    result = run_scenario(cluster, "txn.js")
    topic = "kafkajs-txn-out"
    assert result["committedInput"] == {"afterCommit": 5, "afterAbort": 5, "afterSecondCommit": 10}

    def values(rows: list[list[Any]]) -> list[str]:
        return sorted(row[-1] for row in rows)

    committed = [f"c{n}" for n in range(6)] + [f"d{n}" for n in range(6)]
    aborted = [f"a{n}" for n in range(6)]
    assert values(result["firstRead"]) == sorted(committed)
    assert values(result["readUncommitted"]) == sorted(committed + aborted)
    again = result["readCommitted"][len(result["firstRead"]) :]
    assert sorted(again) == sorted(row for row in result["firstRead"] if row[0] == 0), "seek to 0"
    # each transaction: 3 records and a marker per partition
    assert result["ends"] == {"0": 12, "1": 12}

    def without_keys(rows: list[Row]) -> list[list[Any]]:
        return [[p, offset, value] for p, offset, _, value in rows]

    assert without_keys(grpc_rows(cluster, topic, 2, "read_committed")) == sorted(
        result["firstRead"]
    )
    assert without_keys(grpc_rows(cluster, topic, 2)) == sorted(result["readUncommitted"])
