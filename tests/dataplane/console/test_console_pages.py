"""The console's pure parts: how payloads are shown, what the pages render from plain data, the
lag rows `raftlog group describe` and the console share, and the console.listener setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dataplane.client import ConsumerRecord, TopicPartition
from dataplane.client.admin import (
    GroupDescription,
    MemberDescription,
    PartitionDescription,
)
from dataplane.client.group_lag import GroupLag, LagRow, lag_rows
from dataplane.console import pages
from dataplane.console.decode import SHOWN_BYTES_MAX, decode
from dataplane.console.reads import PartitionRow, RecordsView, TopicView
from dataplane.server.config import NodeConfig
from dataplane.tools.certificates import make_ca, make_cert
from raftlog.config import ConfigError


@pytest.mark.parametrize(
    ("data", "shown"),
    [
        (None, ("null", "", -1, False)),
        (b'{"a": [1, 2]}', ("json", '{\n  "a": [\n    1,\n    2\n  ]\n}', 13, False)),
        (b"[1", ("utf-8", "[1", 2, False)),  # starts like JSON, is not: text
        ("héllo\nworld".encode(), ("utf-8", "héllo\nworld", 12, False)),
        (b"\x00\x01\xff", ("hex", "00 01 ff", 3, False)),  # not UTF-8
        (b"a\x00b", ("hex", "61 00 62", 3, False)),  # UTF-8 with a control character
        (b"x" * (SHOWN_BYTES_MAX + 1), ("utf-8", "x" * SHOWN_BYTES_MAX, SHOWN_BYTES_MAX + 1, True)),
    ],
)
def test_decode(data: bytes | None, shown: tuple[Any, ...]) -> None:
    assert tuple(decode(data)) == shown


def _partition(n: int, replicas: tuple[int, ...], isr: tuple[int, ...]) -> PartitionRow:
    return PartitionRow(PartitionDescription(n, replicas[0], 3, replicas, isr), 2, 10)


def test_topic_page_highlights_under_replicated_partitions_and_escapes_names() -> None:
    view = TopicView(
        "<b>x</b>", b"\x01", (_partition(0, (1, 2), (1, 2)), _partition(1, (1, 2), (1,))), ()
    )
    html = pages.topic_page(view)
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert '<tr data-partition="0">' in html
    assert '<tr class="warn" data-partition="1">' in html
    assert '<span id="under-replicated">1</span>' in html
    assert view.records == 16  # (10 - 2) per partition


def test_records_page_decodes_payloads_and_escapes_them() -> None:
    record = ConsumerRecord(
        "t", 0, 7, 1_700_000_000_000, 0, b"<k>", b'{"v": 1}', (("h", b"\xff"),), 1
    )
    view = RecordsView("t", (0, 1), 0, 0, 8, 7, (record,))
    html = pages.records_page(view, "Produced at offset 7.")
    assert '<tr data-offset="7">' in html
    assert '<pre data-format="utf-8">&lt;k&gt;</pre>' in html
    assert '<pre data-format="json">{\n  &quot;v&quot;: 1\n}</pre>' in html
    assert 'h: <code data-format="hex">ff</code>' in html
    assert 'id="produce"' in html and "data-live" not in html  # a form: not refreshed
    assert "2023-11-14T22:13:20.000+00:00" in html


def _member(member_id: str, *tps: TopicPartition) -> MemberDescription:
    return MemberDescription(member_id, "c-" + member_id, 4, "STABLE", ("t",), "",
                             frozenset(tps), frozenset(tps))  # fmt: skip


def test_lag_rows_and_the_group_page_show_the_same_numbers() -> None:
    t0, t1, t2 = (TopicPartition("t", p) for p in range(3))
    description = GroupDescription("g", "Stable", 4, 4, "uniform", 1, (_member("m", t0, t1),))
    committed = {t0: 5, t2: 9}
    ends = {t0: 8, t1: 3, t2: 7}
    rows = lag_rows(description, committed, ends)
    assert rows == [
        LagRow("t", 0, 5, 8, 3, "m", "c-m"),
        LagRow("t", 1, None, 3, None, "m", "c-m"),  # owned, nothing committed
        LagRow("t", 2, 9, 7, 0, None, None),  # committed past the end: never negative
    ]
    html = pages.group_page(GroupLag(description, "read_uncommitted", tuple(rows)))
    assert '<tr data-tp="t-0">' in html and '<td class="n lag">3</td>' in html
    assert '<b id="total-lag">3</b>' in html


BASE: dict[str, Any] = {
    "node.id": 1,
    "process.roles": "controller,broker",
    "controller.quorum.voters": "1@127.0.0.11:9093",
    "listeners": "CONTROLLER://127.0.0.11:9093,BROKER://127.0.0.11:9092",
    "log.dirs": "/tmp/node-1",
}


def test_console_listener() -> None:
    assert NodeConfig.parse(BASE).console_address is None
    config = NodeConfig.parse(BASE | {"console.listener": "HTTP://127.0.0.11:9097"})
    assert config.console_address == ("127.0.0.11", 9097)


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"console.listener": "FTP://127.0.0.11:9097"}, "is not HTTP:// or HTTPS://host:port"),
        ({"console.listener": "HTTPS://127.0.0.11:9097"}, "HTTPS:// needs ssl.keystore.location"),
        ({"console.listener": "127.0.0.11:9097"}, "is not NAME://host:port"),
        (
            {"console.listener": "HTTP://127.0.0.11:9097", "process.roles": "controller",
             "listeners": "CONTROLLER://127.0.0.11:9093"},
            "needs the broker role",
        ),
    ],
)  # fmt: skip
def test_console_listener_refused(settings: dict[str, Any], refusal: str) -> None:
    with pytest.raises(ConfigError, match=refusal):
        NodeConfig.parse(BASE | settings)


def test_a_secure_broker_listener_needs_a_login_over_https(tmp_path: Path) -> None:
    """On SASL_SSL users log in with their passwords: only over HTTPS. On SSL (certificates
    only) there is no password to log in with: no console on the node."""
    ca = make_ca(tmp_path)
    keystore = make_cert(ca, tmp_path, "node-1", ips=("127.0.0.11",))
    tls = {"ssl.keystore.location": str(keystore), "ssl.truststore.location": str(ca.cert)}
    sasl = tls | {"listener.security.protocol.map": "BROKER:SASL_SSL"}
    with pytest.raises(ConfigError, match="must be HTTPS://host:port"):
        NodeConfig.parse(BASE | sasl | {"console.listener": "HTTP://127.0.0.11:9097"})
    config = NodeConfig.parse(BASE | sasl | {"console.listener": "HTTPS://127.0.0.11:9097"})
    assert config.console_tls and config.console_address == ("127.0.0.11", 9097)
    ssl_only = tls | {"listener.security.protocol.map": "BROKER:SSL"}
    with pytest.raises(ConfigError, match="an SSL BROKER listener"):
        NodeConfig.parse(BASE | ssl_only | {"console.listener": "HTTPS://127.0.0.11:9097"})
    plain = NodeConfig.parse(BASE | tls | {"console.listener": "HTTPS://127.0.0.11:9097"})
    assert plain.console_tls  # no login on PLAINTEXT, but HTTPS all the same
