"""LogConfig: Kafka's names, defaults and bounds; bad input names the key."""

import re

import pytest

from raftlog.config import ConfigError, LogConfig
from raftlog.errors import ErrorCode


def test_defaults_are_kafkas() -> None:
    config = LogConfig()
    assert config.segment_bytes == 1024**3
    assert config.index_interval_bytes == 4096
    assert config.retention_ms == 7 * 24 * 3600 * 1000
    assert config.retention_bytes == -1
    assert config.cleanup_policy == frozenset({"delete"})
    assert config.max_message_bytes == 1048588
    assert not config.flush_on_ack


def test_parse_takes_kafka_style_strings() -> None:
    config = LogConfig.parse(
        {"segment.bytes": "1048576", "cleanup.policy": "compact,delete", "flush.on.ack": "true"}
    )
    assert config.segment_bytes == 1048576
    assert config.compact and config.delete
    assert config.flush_on_ack
    assert config.to_properties()["cleanup.policy"] == "compact,delete"


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"segment.bytes": 10}, "segment.bytes"),
        ({"segment.bytes": "lots"}, "segment.bytes"),
        ({"retention.ms": -5}, "retention.ms"),
        ({"min.cleanable.dirty.ratio": 1.5}, "min.cleanable.dirty.ratio"),
        ({"cleanup.policy": "shred"}, "cleanup.policy"),
        ({"retention.msec": 1}, "retention.msec: unknown configuration key"),
        ({"message.timestamp.type": "WallTime"}, "message.timestamp.type"),
    ],
)
def test_bad_values_name_the_key(values: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)) as caught:
        LogConfig.parse(values)
    assert caught.value.error is ErrorCode.INVALID_CONFIG


def test_overrides_are_validated() -> None:
    config = LogConfig().with_overrides({"retention.bytes": "100"})
    assert config.retention_bytes == 100
    with pytest.raises(ConfigError, match=re.escape("retention.bytes")):
        config.with_overrides({"retention.bytes": -7})
