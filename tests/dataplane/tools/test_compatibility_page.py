"""docs/compatibility.md is generated from the code that decides, and what it says holds."""

from __future__ import annotations

from kio.schema.index import api_key_map, schema_name_map

from dataplane.kafka.codec import SUPPORTED
from dataplane.tools import compatibility_page as page


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
