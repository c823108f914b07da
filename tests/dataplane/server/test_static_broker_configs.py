"""The replication throttle rates in a node's config file (Kafka's STATIC_BROKER_CONFIG): parsed
with bounds, overridable from the environment, registered with the controller, and applied by the
broker's replica manager from start, below any dynamic value (per broker or cluster-wide) and
back again when the dynamic value is deleted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dataplane.broker.partition import IsrChange
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from dataplane.broker.replication_quota import UNTHROTTLED_BYTES_PER_S
from dataplane.server.config import NodeConfig
from metadata_quorum.image import MetadataImage, apply
from metadata_quorum.records import ConfigRecord, ConfigResourceType
from raftlog.config import ConfigError

LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
BASE: dict[str, Any] = {
    "node.id": 1,
    "process.roles": "broker",
    "controller.quorum.voters": "1@127.0.0.11:9093",
    "listeners": "BROKER://127.0.0.12:9092",
    "log.dirs": "/tmp/node-1",
}


def test_the_file_sets_the_rates_it_names_only() -> None:
    assert NodeConfig.parse(BASE).static_broker_configs == {}
    config = NodeConfig.parse({**BASE, LEADER_RATE: 1048576})
    assert config.static_broker_configs == {LEADER_RATE: "1048576"}
    assert config.leader_replication_throttled_rate == 1048576
    assert config.follower_replication_throttled_rate is None


@pytest.mark.parametrize("value", [-1, 2**63, "fast"])
def test_a_bad_rate_in_the_file_is_refused_naming_its_key(value: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        NodeConfig.parse({**BASE, FOLLOWER_RATE: value})
    assert raised.value.message.startswith(f"{FOLLOWER_RATE}: ")


def test_the_environment_sets_a_rate_and_the_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(NodeConfig.parse({**BASE, LEADER_RATE: 5000}).to_toml())
    assert NodeConfig.load(path, {}).static_broker_configs == {LEADER_RATE: "5000"}
    config = NodeConfig.load(path, {"RAFTLOG_FOLLOWER_REPLICATION_THROTTLED_RATE": "7"})
    assert config.static_broker_configs == {LEADER_RATE: "5000", FOLLOWER_RATE: "7"}


def manager(tmp_path: Path, static: dict[str, str]) -> ReplicaManager:
    def alter(change: IsrChange) -> None:
        raise AssertionError("no ISR change expected")

    def failed(directory: Path, error: OSError) -> None:
        raise AssertionError(f"no log dir failure expected: {directory}: {error}")

    config = ReplicaManagerConfig(static_broker_configs=tuple(sorted(static.items())))
    return ReplicaManager(1, tmp_path, config, lambda: 0, alter, failed)


def rates(replicas: ReplicaManager) -> tuple[int, int]:
    return replicas.leader_quota.rate_bytes_per_s, replicas.follower_quota.rate_bytes_per_s


def broker(name: str, key: str, value: str | None) -> ConfigRecord:
    return ConfigRecord(ConfigResourceType.BROKER, name, key, value)


def test_the_file_applies_from_start_below_every_dynamic_value(tmp_path: Path) -> None:
    replicas = manager(tmp_path, {LEADER_RATE: "1000"})
    static_only = (1000, UNTHROTTLED_BYTES_PER_S)
    assert rates(replicas) == static_only, "before any image"
    image = MetadataImage()
    for records, expected in [
        ([], static_only),
        ([broker("", LEADER_RATE, "2000"), broker("", FOLLOWER_RATE, "50")], (2000, 50)),
        ([broker("1", LEADER_RATE, "3000")], (3000, 50)),
        ([broker("2", LEADER_RATE, "9")], (3000, 50)),  # another broker's
        ([broker("1", LEADER_RATE, None)], (2000, 50)),
        ([broker("", LEADER_RATE, None), broker("", FOLLOWER_RATE, None)], static_only),
    ]:  # fmt: skip
        image, rejected = apply(image, records)
        assert not rejected
        replicas.apply_image(image, caught_up=True)
        assert rates(replicas) == expected, records
