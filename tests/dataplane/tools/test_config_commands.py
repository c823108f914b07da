"""``raftlog configs``' argument syntax: kafka-configs.sh's ``--add-config`` (commas outside
square brackets separate pairs; a bracketed LIST keeps its commas) and ``--delete-config``."""

from __future__ import annotations

import pytest

from dataplane.tools.config_commands import parse_add_config, parse_delete_config
from raftlog.errors import ErrorCode, KafkaError


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("retention.ms=60000", {"retention.ms": "60000"}),
        ("a=1,b=2", {"a": "1", "b": "2"}),
        ("cleanup.policy=[compact,delete],retention.ms=1",
         {"cleanup.policy": "compact,delete", "retention.ms": "1"}),
        ("x=[0:1,1:2]", {"x": "0:1,1:2"}),
        (" a = 1 , b=[ c , d ] ", {"a": "1", "b": "c , d"}),
        ("ssl.endpoint.identification.algorithm=", {"ssl.endpoint.identification.algorithm": ""}),
        ("a=1,a=2", {"a": "2"}),  # the last wins, as in a Properties object
    ],
)  # fmt: skip
def test_add_config_splits_as_kafka_configs_does(text: str, parsed: dict[str, str]) -> None:
    assert parse_add_config(text) == parsed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("retention.ms", "key=val"),
        ("a=1,b", "key=val"),
        ("a=b=c", "key=val"),
        ("bad key=1", "Invalid character found for config key: bad key"),
    ],
)
def test_bad_add_config_is_invalid_config(text: str, message: str) -> None:
    with pytest.raises(KafkaError) as raised:
        parse_add_config(text)
    assert raised.value.error is ErrorCode.INVALID_CONFIG
    assert message in raised.value.message


def test_delete_config_takes_commas_and_repeats() -> None:
    assert parse_delete_config(["a,b", " c ", "a", ""]) == ["a", "b", "c"]
    assert parse_delete_config(None) == []
