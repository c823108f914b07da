"""A node's configuration: TOML with Kafka's dotted names, RAFTLOG_* overrides, every error naming
its key (INVALID_CONFIG), and a round trip through to_toml."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dataplane.server.config import NodeConfig, parse_listeners, parse_voters
from raftlog.config import ConfigError
from raftlog.errors import ErrorCode

BASE: dict[str, Any] = {
    "node.id": 1,
    "process.roles": "controller,broker",
    "controller.quorum.voters": "1@127.0.0.11:9093,2@127.0.0.12:9093",
    "listeners": "CONTROLLER://127.0.0.11:9093,BROKER://127.0.0.11:9092",
    "log.dirs": "/tmp/node-1",
}


def test_a_combined_node() -> None:
    config = NodeConfig.parse(BASE)
    assert config.is_controller and config.is_broker
    assert config.broker_listener() == ("127.0.0.11", 9092)
    voter = config.controller_voter()
    assert (voter.node_id, voter.address, voter.raft_port) == (1, "127.0.0.11:9093", 9094)
    assert config.offsets_topic_num_partitions == 50  # Kafka's defaults where unset


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"replica.lag.time.max.ms": 1}, "replica.lag.time.max.ms"),  # below its bound
        ({"no.such.key": 1}, "no.such.key"),  # unknown keys are refused
        ({"process.roles": "controller,gateway"}, "gateway"),
        ({"listeners": "BROKER://127.0.0.11"}, "listeners"),
        ({"controller.quorum.voters": "1@127.0.0.11:9093,1@127.0.0.12:9093"}, "twice"),
        (
            {"group.consumer.heartbeat.interval.ms": 50_000},
            "group.consumer.heartbeat.interval.ms",
        ),
        ({"gil.switch.interval.us": 50}, "gil.switch.interval.us"),
        (  # Kafka's rule: not below the follower's long poll
            {"replica.socket.timeout.ms": 2_000, "replica.fetch.wait.max.ms": 3_000},
            "replica.socket.timeout.ms 2000 must be at least replica.fetch.wait.max.ms 3000",
        ),
    ],
)
def test_a_bad_value_is_refused_naming_its_key(change: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as refused:
        NodeConfig.parse({**BASE, **change})
    assert refused.value.error is ErrorCode.INVALID_CONFIG
    assert named in refused.value.message


def test_the_controller_listener_must_match_the_voters() -> None:
    config = NodeConfig.parse({**BASE, "listeners": "CONTROLLER://127.0.0.11:9999"})
    with pytest.raises(ConfigError, match=re.escape("CONTROLLER must be 127.0.0.11:9093")):
        config.controller_voter()
    with pytest.raises(ConfigError, match=re.escape("CONTROLLER 127.0.0.11:9093 is voter 1's")):
        NodeConfig.parse({**BASE, "node.id": 7}).controller_voter()  # joins on a taken address
    with pytest.raises(ConfigError, match=re.escape("not in controller.quorum.voters")):
        NodeConfig.parse(
            {**BASE, "node.id": 7, "listeners": "BROKER://127.0.0.17:9092"}
        ).controller_voter()


def test_a_controller_not_among_the_voters_joins_with_its_controller_listener() -> None:
    config = NodeConfig.parse({**BASE, "node.id": 7, "listeners": "CONTROLLER://127.0.0.17:9093"})
    voter = config.controller_voter()
    assert (voter.node_id, voter.address, voter.raft_address) == (
        7,
        "127.0.0.17:9093",
        "127.0.0.17:9094",
    )
    assert [v.node_id for v in config.voters] == [1, 2]  # the quorum it asks to join
    with pytest.raises(ConfigError, match="BROKER"):
        NodeConfig.parse({**BASE, "listeners": "CONTROLLER://127.0.0.11:9093"}).broker_listener()


def test_the_environment_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(NodeConfig.parse(BASE).to_toml())
    env = {"RAFTLOG_NODE_ID": "2", "RAFTLOG_REPLICA_FETCH_WAIT_MAX_MS": "100", "OTHER": "x"}
    config = NodeConfig.load(path, env)
    assert (config.node_id, config.replica_fetch_wait_max_ms) == (2, 100)
    assert NodeConfig.load(path, {}) == NodeConfig.parse(BASE)  # the round trip


def test_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    broken = tmp_path / "node.toml"
    broken.write_text('"node.id" = ')
    with pytest.raises(ConfigError, match=re.escape(str(broken))):
        NodeConfig.load(broken, {})
    with pytest.raises(ConfigError, match="missing"):
        NodeConfig.load(tmp_path / "missing.toml", {})


def test_listeners_and_voters_parse() -> None:
    assert parse_listeners("controller://h:1, BROKER://h:2") == {
        "CONTROLLER": ("h", 1),
        "BROKER": ("h", 2),
    }
    assert [v.node_id for v in parse_voters("3@h:1,1@h:2", 5)] == [1, 3]
    assert parse_voters("1@h:2", 5)[0].raft_port == 7
    for bad in ("BROKER://h:0", "BROKER:/h:1", "B://h:1,B://h:2"):
        with pytest.raises(ValueError):
            parse_listeners(bad)
    for bad in ("", "x@h:1", "1@h"):
        with pytest.raises(ValueError):
            parse_voters(bad, 1)


BOOTSTRAP: dict[str, Any] = {
    **{k: v for k, v in BASE.items() if k != "controller.quorum.voters"},
    "controller.quorum.bootstrap.servers": "127.0.0.11:9093, 127.0.0.12:9093",
}


def test_bootstrap_servers_instead_of_voters() -> None:
    broker = NodeConfig.parse(
        {**BOOTSTRAP, "node.id": 4, "process.roles": "broker",
         "listeners": "BROKER://127.0.0.14:9092"}
    )  # fmt: skip
    assert broker.voters == []
    assert broker.bootstrap_servers == ["127.0.0.11:9093", "127.0.0.12:9093"]
    assert broker.controller_addresses == broker.bootstrap_servers
    assert NodeConfig.parse(BASE).controller_addresses == ["127.0.0.11:9093", "127.0.0.12:9093"]
    # a controller with bootstrap servers joins with its CONTROLLER listener (an observer first)
    joining = NodeConfig.parse(
        {**BOOTSTRAP, "node.id": 5, "listeners": "CONTROLLER://127.0.0.15:9093"}
    ).controller_voter()
    assert (joining.node_id, joining.address, joining.raft_address) == (
        5, "127.0.0.15:9093", "127.0.0.15:9094",
    )  # fmt: skip
    path_config = NodeConfig.parse(BOOTSTRAP)
    assert (
        NodeConfig.parse(
            {k: v for k, v in path_config.model_dump(by_alias=True).items() if v is not None}
        )
        == path_config
    ), "the round trip keeps bootstrap servers and no voters"
    assert '"controller.quorum.voters"' not in path_config.to_toml()


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({**BASE, "controller.quorum.bootstrap.servers": "127.0.0.11:9093"}, "not both"),
        ({k: v for k, v in BASE.items() if k != "controller.quorum.voters"}, "give one"),
        ({**BOOTSTRAP, "controller.quorum.bootstrap.servers": "127.0.0.11"}, "not host:port"),
        ({**BOOTSTRAP, "controller.quorum.bootstrap.servers": "h:1,h:1"}, "twice"),
        ({**BOOTSTRAP, "controller.quorum.bootstrap.servers": "h:70000"}, "not host:port"),
        ({**BOOTSTRAP, "controller.quorum.bootstrap.servers": " , "}, "at least one"),
    ],
)
def test_bad_bootstrap_servers_are_refused(values: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as refused:
        NodeConfig.parse(values)
    assert refused.value.error is ErrorCode.INVALID_CONFIG
    assert named in refused.value.message
    assert "controller.quorum" in refused.value.message


TUNE = (
    "import json, sys; from dataplane.server.config import NodeConfig; "
    "from dataplane.server.node import tune_interpreter; "
    "tune_interpreter(NodeConfig.parse(json.loads(sys.argv[1]))); print(sys.getswitchinterval())"
)


@pytest.mark.parametrize(
    ("given", "interval_s"), [({}, 0.001), ({"gil.switch.interval.us": 250}, 0.00025)]
)
def test_a_node_sets_the_switch_interval_of_its_interpreter(
    given: dict[str, Any], interval_s: float
) -> None:
    """In a fresh interpreter: the setting changes the process for good."""
    done = subprocess.run(
        [sys.executable, "-c", TUNE, json.dumps({**BASE, **given})],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert float(done.stdout) == pytest.approx(interval_s)
