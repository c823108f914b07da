"""The client commands of the ``raftlog`` CLI (topic, produce, consume, perf) as users run
them: real processes against one real 3-node cluster for the whole module."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dataplane.tools.entry import COMMAND as RAFTLOG
from dataplane.tools.local_cluster import LocalCluster, wait_for
from dataplane.tools.perf import LatencySummary, latency_summary
from tests.dataplane.cluster_support import running_cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-cli")]

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("cli"), "cli") as running:
        yield running


@pytest.fixture(scope="module")
def raftlog(cluster: LocalCluster) -> Run:
    bootstrap = ",".join(cluster.bootstrap_servers)
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "PYTHONPATH": str(repo)}

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*RAFTLOG, *args, "--bootstrap-server", bootstrap],
            input=stdin if stdin is not None else "",
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )

    return run


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def ok_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result))


def describe(raftlog: Run, topic: str) -> dict[str, Any]:
    described: list[dict[str, Any]] = ok_json(raftlog("topic", "describe", topic, "--json"))
    assert [d["name"] for d in described] == [topic]
    return described[0]


def create(raftlog: Run, topic: str, partitions: int, *extra: str) -> None:
    """Create the topic and wait until every partition has a leader in its ISR."""
    args = ["--partitions", str(partitions), "--replication-factor", "3", *extra]
    assert ok_json(raftlog("topic", "create", topic, *args, "--json")) == {
        "topic": topic,
        "created": True,
    }

    def led() -> bool:
        parts = describe(raftlog, topic)["partitions"]
        return len(parts) == partitions and all(p["leader"] in p["isr"] for p in parts)

    wait_for(f"leaders of {topic}", led)


def test_topic_create_list_describe_alter_delete(raftlog: Run) -> None:
    create(raftlog, "cli-life", 2, "--config", "retention.ms=60000")
    assert "cli-life" in ok_json(raftlog("topic", "list", "--json"))
    described = describe(raftlog, "cli-life")
    assert described["configs"] == {"retention.ms": "60000"}
    assert len(described["topic_id"]) == 32
    for partition in described["partitions"]:
        assert sorted(partition["replicas"]) == [1, 2, 3]
        assert partition["leader"] in partition["replicas"]
        assert partition["leader_epoch"] >= 0
    table = ok(raftlog("topic", "describe", "cli-life"))
    assert "leader epoch" in table and "Configs: retention.ms=60000" in table

    altered = raftlog(
        "topic", "alter", "cli-life", "--partitions", "4",
        "--config", "segment.bytes=1048576", "--delete-config", "retention.ms",
    )  # fmt: skip
    ok(altered)
    described = describe(raftlog, "cli-life")
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2, 3]
    assert described["configs"] == {"segment.bytes": "1048576"}

    assert ok_json(raftlog("topic", "delete", "cli-life", "--json")) == {"cli-life": None}
    wait_for(
        "cli-life gone",
        lambda: "cli-life" not in ok_json(raftlog("topic", "list", "--json")),
    )


def test_produce_keyed_lines_then_consume_them_as_json(raftlog: Run) -> None:
    create(raftlog, "cli-keyed", 1)
    lines = [f"key-{n}:value {n}: with colon" for n in range(50)]
    produced = ok_json(
        raftlog("produce", "cli-keyed", "--key-separator", ":", "--json", stdin="\n".join(lines))
    )
    assert produced == {"acknowledged": 50, "errors": 0}

    args = ["--from-beginning", "--max", "50", "--timeout-ms", "20000", "--json"]
    consumed = ok(raftlog("consume", "cli-keyed", *args))
    records = [json.loads(line) for line in consumed.splitlines()]
    assert [(r["key"], r["value"]) for r in records] == [
        (f"key-{n}", f"value {n}: with colon") for n in range(50)
    ]
    assert [r["offset"] for r in records] == list(range(50))
    assert {(r["topic"], r["partition"]) for r in records} == {("cli-keyed", 0)}


def test_produce_count_then_consume_with_offsets_and_idle_timeout(raftlog: Run) -> None:
    create(raftlog, "cli-count", 3)
    produced = raftlog(
        "produce", "cli-count", "--count", "300", "--record-size", "16",
        "--acks", "1", "--compression", "gzip",
    )  # fmt: skip
    assert "300 records acknowledged, 0 errors" in ok(produced)

    consumed = raftlog(
        "consume", "cli-count", "--from-beginning", "--max", "300", "--timeout-ms", "20000",
        "--print-key", "--print-offset",
    )  # fmt: skip
    lines = ok(consumed).splitlines()
    assert len(lines) == 300, consumed.stderr
    assert "Processed a total of 300 messages" in consumed.stderr
    positions = set()
    for line in lines:
        position, key, value = line.split("\t")
        positions.add(position)
        assert key == "null"
        assert len(value) == 16 and value.startswith("record-")
    assert len(positions) == 300

    partition, offset = lines[-1].split("\t")[0].split(":")
    again = raftlog(
        "consume", "cli-count", "--partition", partition, "--offset", offset, "--max", "1",
        "--print-key", "--print-offset",
    )  # fmt: skip
    assert ok(again).splitlines() == [lines[-1]]

    idle = raftlog("consume", "cli-count", "--timeout-ms", "300")  # from the end: nothing new
    assert ok(idle) == ""
    assert "Processed a total of 0 messages" in idle.stderr


def test_perf_produce_and_consume_report_figures(raftlog: Run) -> None:
    create(raftlog, "cli-perf", 3)
    args = ["--topic", "cli-perf", "--num-records", "2000", "--record-size", "100", "--json"]
    produced = ok_json(raftlog("perf", "produce", *args))
    assert produced["records"] == 2000 and produced["errors"] == 0
    assert produced["seconds"] > 0 and produced["records_per_s"] > 0 and produced["mb_per_s"] > 0
    latency = produced["latency_ms"]
    assert 0 < latency["p50"] <= latency["p99"] <= latency["p999"] <= latency["max"]
    assert latency["avg"] > 0

    consumed = ok_json(raftlog("perf", "consume", "--topic", "cli-perf", "--json"))
    assert consumed["records"] == 2000 and consumed["payload_bytes"] == 2000 * 100
    assert consumed["records_per_s"] > 0 and consumed["mb_per_s"] > 0
    assert consumed["timed_out"] is False


def assert_fails(result: subprocess.CompletedProcess[str], error: str) -> None:
    assert result.returncode == 1, f"{result.stdout}\n{result.stderr}"
    assert result.stderr.startswith(f"error: {error} ("), result.stderr
    assert "Traceback" not in result.stderr


def test_kafka_errors_exit_1_with_one_line(raftlog: Run) -> None:
    create(raftlog, "cli-twice", 1)
    assert_fails(raftlog("topic", "create", "cli-twice"), "TOPIC_ALREADY_EXISTS")
    assert_fails(raftlog("consume", "cli-nope", "--max", "1"), "UNKNOWN_TOPIC_OR_PARTITION")
    assert_fails(
        raftlog("produce", "cli-twice", "--partition", "5", stdin="x\n"),
        "UNKNOWN_TOPIC_OR_PARTITION",
    )
    assert_fails(raftlog("topic", "describe", "cli-nope"), "UNKNOWN_TOPIC_OR_PARTITION")
    bad_line = raftlog("produce", "cli-twice", "--key-separator", ":", stdin="k:v\nno key\n")
    assert bad_line.returncode == 1
    assert "1 records acknowledged, 1 errors" in bad_line.stdout
    assert "error: line 2 has no key separator ':'" in bad_line.stderr


def test_latency_summary_is_nearest_rank() -> None:
    samples_ms = [float(n) for n in range(1, 1001)]
    summary = latency_summary(samples_ms, total_ms=sum(samples_ms), count=1000, max_ms=1000.0)
    assert (summary.avg, summary.p50, summary.p99, summary.p999, summary.max) == (
        500.5, 500.0, 990.0, 999.0, 1000.0,
    )  # fmt: skip
    assert latency_summary([], 0.0, 0, 0.0) == LatencySummary(0.0, 0.0, 0.0, 0.0, 0.0)
