"""``raftlog configs`` as users run it (kafka-configs.sh's job): real processes against a real
one-node cluster on the CLI range (after test_cli_cluster.py's, in the same xdist group):
a topic's, a broker's, the cluster default's and a group's configs described and altered, and a
broker config only a node's file sets refused as Kafka refuses it."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dataplane.tools.entry import COMMAND as RAFTLOG
from dataplane.tools.local_cluster import LocalCluster
from tests.dataplane.cluster_support import running_cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("dataplane-cli")]

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("configs"), "cli", nodes=1) as running:
        yield running


@pytest.fixture(scope="module")
def raftlog(cluster: LocalCluster) -> Run:
    bootstrap = ",".join(cluster.bootstrap_servers)
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "PYTHONPATH": str(repo)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*RAFTLOG, *args, "--bootstrap-server", bootstrap],
            input="", env=env, capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip

    return run


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a refused command (exit 1, no traceback)."""
    assert result.returncode == 1, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def configs(raftlog: Run, *entity: str, every: bool = False) -> dict[str, dict[str, Any]]:
    args = ["configs", "describe", *entity, "--json", *(["--all"] if every else [])]
    described = json.loads(ok(raftlog(*args)))
    assert len(described) == 1
    return {c["name"]: c for c in described[0]["configs"]}


def test_a_topics_configs(raftlog: Run) -> None:
    ok(raftlog("topic", "create", "cfg-topic", "--partitions", "1", "--replication-factor", "1"))
    topic = ("--entity-type", "topics", "--entity-name", "cfg-topic")
    assert configs(raftlog, *topic) == {}
    added = "retention.ms=60000,cleanup.policy=[compact,delete]"
    out = ok(raftlog("configs", "alter", *topic, "--add-config", added))
    assert out.splitlines() == [
        "Completed updating config for topic cfg-topic.",
        "  cleanup.policy: (unset) -> compact,delete",
        "  retention.ms: (unset) -> 60000",
    ]
    overrides = configs(raftlog, *topic)
    assert {k: v["value"] for k, v in overrides.items()} == {
        "cleanup.policy": "compact,delete",
        "retention.ms": "60000",
    }
    assert overrides["retention.ms"]["synonyms"][0] == {
        "name": "retention.ms", "value": "60000", "source": "DYNAMIC_TOPIC_CONFIG",
    }  # fmt: skip
    every = configs(raftlog, *topic, every=True)
    assert every["segment.bytes"]["source"] == "DEFAULT_CONFIG"
    assert every["retention.ms"]["source"] == "DYNAMIC_TOPIC_CONFIG"
    text = ok(raftlog("configs", "describe", *topic))
    assert text.splitlines()[0] == "Dynamic configs for topic cfg-topic are:"
    assert (
        "  retention.ms=60000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=60000"
        in text
    )
    out = ok(raftlog("configs", "alter", *topic, "--delete-config", "cleanup.policy"))
    assert out.splitlines()[1:] == ["  cleanup.policy: compact,delete -> (unset)"]
    assert set(configs(raftlog, *topic)) == {"retention.ms"}
    line = refused(raftlog("configs", "alter", *topic, "--delete-config", "segment.ms"))
    assert line == "error: INVALID_CONFIG (40): Invalid config(s): segment.ms"
    line = refused(raftlog("configs", "alter", *topic, "--add-config", "retention.ms=soon"))
    assert line.startswith("error: INVALID_CONFIG (40): ") and "retention.ms" in line


def test_the_cluster_default_and_one_broker(raftlog: Run, cluster: LocalCluster) -> None:
    default = ("--entity-type", "brokers", "--entity-default")
    out = ok(raftlog("configs", "alter", *default, "--add-config", "log.retention.ms=7200000"))
    assert out.splitlines() == [
        "Completed updating default config for brokers in the cluster.",
        "  log.retention.ms: (unset) -> 7200000",
    ]
    assert configs(raftlog, *default)["log.retention.ms"]["value"] == "7200000"
    text = ok(raftlog("configs", "describe", *default))
    assert text.splitlines()[0] == "Default configs for brokers in the cluster are:"
    broker = ("--entity-type", "brokers", "--entity-name", str(cluster.specs[0].node_id))
    rate = "leader.replication.throttled.rate"
    assert configs(raftlog, *broker, every=True)[rate]["source"] == "DEFAULT_CONFIG"
    ok(raftlog("configs", "alter", *broker, "--add-config", f"{rate}=1048576"))
    own = configs(raftlog, *broker)
    assert own[rate]["value"] == "1048576" and own[rate]["source"] == "DYNAMIC_BROKER_CONFIG"
    # the cluster default shows under the broker with its source
    every = configs(raftlog, *broker, every=True)
    assert every["log.retention.ms"]["source"] == "DYNAMIC_DEFAULT_BROKER_CONFIG"
    ok(raftlog("configs", "alter", *broker, "--delete-config", rate))
    ok(raftlog("configs", "alter", *default, "--delete-config", "log.retention.ms"))
    assert configs(raftlog, *broker) == {} and configs(raftlog, *default) == {}


def test_a_read_only_broker_config_is_refused(raftlog: Run, cluster: LocalCluster) -> None:
    node_id = cluster.specs[0].node_id
    broker = ("--entity-type", "brokers", "--entity-name", str(node_id))
    line = refused(raftlog("configs", "alter", *broker, "--add-config", "log.dirs=/elsewhere"))
    assert line == (
        f"error: INVALID_REQUEST (42): broker {node_id}: Cannot update these configs dynamically: "
        "Set(log.dirs)"
    )
    default = ("--entity-type", "brokers", "--entity-default")
    line = refused(raftlog("configs", "alter", *default, "--add-config", "node.id=7"))
    assert "Cannot update these configs dynamically: Set(node.id)" in line
    assert configs(raftlog, *broker) == {}


def test_a_groups_configs(raftlog: Run) -> None:
    group = ("--entity-type", "groups", "--entity-name", "cfg-group")
    out = ok(raftlog("configs", "alter", *group,
                     "--add-config", "consumer.session.timeout.ms=50000"))  # fmt: skip
    assert out.splitlines() == [
        "Completed updating config for group cfg-group.",
        "  consumer.session.timeout.ms: (unset) -> 50000",
    ]
    own = configs(raftlog, *group)
    assert own["consumer.session.timeout.ms"]["value"] == "50000"
    assert own["consumer.session.timeout.ms"]["source"] == "DYNAMIC_GROUP_CONFIG"
    every = configs(raftlog, *group, every=True)
    assert every["consumer.heartbeat.interval.ms"]["source"] in {
        "DEFAULT_CONFIG", "STATIC_BROKER_CONFIG",
    }  # fmt: skip
    line = refused(raftlog("configs", "alter", *group, "--add-config", "retention.ms=1"))
    assert line.startswith("error: INVALID_CONFIG (40): ") and "retention.ms" in line
