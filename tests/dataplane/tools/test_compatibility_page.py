"""docs/compatibility.md is generated from the code that decides, and what it says holds."""

from __future__ import annotations

from kio.schema.index import api_key_map, schema_name_map

from dataplane.kafka.codec import SUPPORTED
from dataplane.tools import compatibility_page as page
from dataplane.tools.kafka_broker_configs import BY_NAME as KAFKA_BY_NAME
from metadata_quorum.configs import BROKER_KEYS, CLUSTER_KEYS, KAFKA_READ_ONLY_BROKER_CONFIGS
from metadata_quorum.kafka_broker_configs import KAFKA_RELEASE
from metadata_quorum.topic_config_defs import (
    BROKER_SYNONYMS,
    KAFKA_TOPIC_CONFIGS,
    NOT_KAFKA_TOPIC_CONFIGS,
)


def test_committed_page_is_what_the_code_gives() -> None:
    assert page.PAGE_PATH.read_text(encoding="utf-8") == page.render_page(), (
        "docs/compatibility.md is stale: run `python -m dataplane.tools.compatibility_page` "
        "(or `make docs`) and commit the page"
    )


def test_every_advertised_version_is_one_kafka_defines() -> None:
    """An advertised version the codec cannot read would close the connection of a client
    that picks it (Kafka 4 removed old versions, KIP-896)."""
    for key, (low, high) in SUPPORTED.items():
        defined = schema_name_map[api_key_map[key]]
        assert low <= high and {low, high} <= set(defined), (key, low, high, sorted(defined))


def test_a_reason_is_given_only_for_what_is_not_served() -> None:
    assert not set(page.NOT_SERVED) & set(SUPPORTED)
    assert set(page.NOT_SERVED) | set(SUPPORTED) == set(api_key_map)


def test_every_node_config_key_is_kafkas_or_listed_as_raftlogs_own() -> None:
    """A NodeConfig key Kafka does not define must be in RAFTLOG_ONLY, so a misspelt Kafka
    name shows instead of passing as raftlog's own; the list names only such keys."""
    node = set(page.node_keys())
    assert node - set(KAFKA_BY_NAME) == set(page.RAFTLOG_ONLY)
    assert set(page.RENAMED) <= set(KAFKA_BY_NAME) and set(page.RENAMED.values()) <= node


def test_a_key_raftlog_takes_is_never_classed_as_refused() -> None:
    classes = {c.config.name: c.cls for c in page.broker_config_classes()}
    taken = set(page.node_keys()) | set(BROKER_SYNONYMS) | CLUSTER_KEYS | BROKER_KEYS
    assert all(classes[name] != page.REFUSED for name in taken & set(classes))
    assert all(classes[name] == page.REFUSED for name in set(classes) - taken - set(page.RENAMED))


def test_the_read_only_broker_configs_the_controller_names_are_kafkas() -> None:
    """AlterConfigs refuses these by Kafka's name: each must be one Kafka defines."""
    assert not KAFKA_READ_ONLY_BROKER_CONFIGS - set(KAFKA_BY_NAME)


def test_the_page_names_the_kafka_release_its_config_lists_come_from() -> None:
    assert f"Kafka {KAFKA_RELEASE}'s, from its released documentation" in page.render_page()


def test_a_topic_config_kafka_does_not_define_is_marked_so() -> None:
    """Kafka 4.1 defines 33 topic configs; raftlog's others say why they are taken."""
    marked = {
        row.split("`")[1]
        for row in page.topic_config_rows()
        if f"not a Kafka {KAFKA_RELEASE} topic config" in row
    }
    assert marked == set(NOT_KAFKA_TOPIC_CONFIGS)
    assert len(KAFKA_TOPIC_CONFIGS) == 33 and not marked & KAFKA_TOPIC_CONFIGS
