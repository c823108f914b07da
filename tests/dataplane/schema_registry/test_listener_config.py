"""``schema.registry.listener``: off when unset, ``HTTP://host:port`` when set, else refused."""

from __future__ import annotations

import pytest

from dataplane.server.config import NodeConfig
from raftlog.config import ConfigError
from tests.dataplane.server.test_config import BASE


def test_off_unless_set() -> None:
    assert NodeConfig.parse(BASE).schema_registry_address() is None
    config = NodeConfig.parse({**BASE, "schema.registry.listener": "HTTP://127.0.0.11:8081"})
    assert config.schema_registry_address() == ("127.0.0.11", 8081)


@pytest.mark.parametrize("value", ["127.0.0.11:8081", "HTTPS://127.0.0.11:8081", "HTTP://h"])
def test_anything_else_is_refused(value: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=r"listener"):
        NodeConfig.parse({**BASE, "schema.registry.listener": value})
