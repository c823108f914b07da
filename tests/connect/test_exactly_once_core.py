"""Exactly-once source settings (KIP-618) without a cluster: which worker and connector
configurations are accepted, the transactional ids, and what ``raftlog mirror --exactly-once``
configures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connect.exactly_once import exactly_once_errors, transactional_id
from connect.herder import ConnectError, _validated
from connect.mirror_cli import mirror_configs, worker_settings
from connect.plugins import ConfigInvalid, validate
from connect.standalone import StandaloneHerder
from connect.worker_config import WorkerConfig

MIRROR: dict[str, Any] = {
    "connector.class": "MirrorSourceConnector",
    "source.cluster.alias": "A",
    "source.cluster.bootstrap.servers": "127.0.0.1:1",
    "target.cluster.bootstrap.servers": "127.0.0.1:2",
}
FILE: dict[str, Any] = {"connector.class": "FileStreamSource", "file": "/x", "topic": "t"}


def worker(enabled: bool) -> WorkerConfig:
    return WorkerConfig.model_validate({
        "bootstrap.servers": "127.0.0.1:1", "group.id": "g",
        "exactly.once.source.support": "enabled" if enabled else "disabled",
    })  # fmt: skip


def test_transactional_id_is_kip_618s() -> None:
    assert transactional_id("A-mm2", "MirrorSourceConnector", 3) == "A-mm2-MirrorSourceConnector-3"


def test_required_needs_an_enabled_worker_and_a_connector_that_supports_it() -> None:
    required = {**MIRROR, "exactly.once.support": "required"}
    assert exactly_once_errors(validate("m", required), worker(True)) == []
    assert exactly_once_errors(validate("m", MIRROR), worker(False)) == []  # requested
    (disabled,) = exactly_once_errors(validate("m", required), worker(False))
    assert "exactly.once.source.support is disabled" in disabled
    uncommitted = {**required, "consumer.isolation.level": "read_uncommitted"}
    (unsupported,) = exactly_once_errors(validate("m", uncommitted), worker(True))
    assert "MirrorSourceConnector does not support exactly-once" in unsupported
    file_required = {**FILE, "exactly.once.support": "required"}
    (unknown,) = exactly_once_errors(validate("f", file_required), worker(True))
    assert "FileStreamSource does not support exactly-once" in unknown
    assert exactly_once_errors(validate("f", FILE), worker(True)) == []


def test_the_rest_api_answers_400_for_an_unmet_requirement() -> None:
    with pytest.raises(ConnectError) as raised:
        _validated("m", {**MIRROR, "exactly.once.support": "required"}, worker(False))
    assert raised.value.status == 400
    assert "exactly.once.support: required" in str(raised.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("transaction.boundary", "connector"),
        ("transaction.boundary", "sometimes"),
        ("exactly.once.support", "maybe"),
        ("transaction.boundary.interval.ms", 0),
    ],
)
def test_bad_exactly_once_settings_are_refused(key: str, value: Any) -> None:
    with pytest.raises(ConfigInvalid) as raised:
        validate("m", {**MIRROR, key: value})
    assert raised.value.errors[0].startswith(f"{key}:")


def test_the_interval_boundary_is_accepted() -> None:
    config = validate("m", {**MIRROR, "transaction.boundary": "interval",
                            "transaction.boundary.interval.ms": 500}).config  # fmt: skip
    assert (config.transaction_boundary, config.transaction_boundary_interval_ms) == (  # type: ignore[attr-defined]
        "interval", 500)  # fmt: skip


def test_a_sink_takes_no_exactly_once_settings() -> None:
    sink = {"connector.class": "FileStreamSink", "file": "/x", "topics": "t"}
    with pytest.raises(ConfigInvalid):
        validate("s", {**sink, "exactly.once.support": "required"})


def test_standalone_refuses_exactly_once(tmp_path: Path) -> None:
    config = WorkerConfig.model_validate({
        "bootstrap.servers": "127.0.0.1:1", "offset.storage.file.filename": str(tmp_path / "o"),
        "exactly.once.source.support": "enabled",
    })  # fmt: skip
    with pytest.raises(ValueError, match="distributed mode"):
        StandaloneHerder(config, "w")


def test_mirror_exactly_once_configures_worker_and_source_connector() -> None:
    source, checkpoint = mirror_configs(
        source_bootstrap="s:1", target_bootstrap="t:1", source_alias="A", target_alias="B",
        topics="orders", groups=".*", tasks_max=2, sync_group_offsets=True,
        settings={"transaction.boundary": "interval", "consumer.isolation.level": "read_committed"},
        exactly_once=True,
    )  # fmt: skip
    assert source["exactly.once.support"] == "required"
    assert "exactly.once.support" not in checkpoint  # its support is unknown: requested
    assert source["transaction.boundary"] == checkpoint["transaction.boundary"] == "interval"
    assert "consumer.isolation.level" not in checkpoint
    validate("MirrorSourceConnector", source)
    validate("MirrorCheckpointConnector", checkpoint)
    settings = worker_settings("t:1", "A", "http://127.0.0.1:8083", {}, exactly_once=True)
    assert WorkerConfig.model_validate(settings).exactly_once
    assert "exactly.once.source.support" not in worker_settings("t:1", "A", "http://h:1", {})
