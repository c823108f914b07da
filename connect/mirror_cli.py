"""``raftlog mirror``: mirror topics from a source cluster to a target cluster with one command,
and ``raftlog mirror status``: the replication lag per partition.

``raftlog mirror --source-bootstrap S --target-bootstrap T --source-alias A --topics 'a,b'``
runs a distributed Connect worker on the target cluster, as MirrorMaker 2's dedicated mode:
group ``<A>-mm2``, state in ``mm2-configs|offsets|status.<A>.internal`` on the target, and
creates (or updates) two connectors: ``MirrorSourceConnector`` (the topics) and
``MirrorCheckpointConnector`` (consumer-group offsets). Several processes with the same
arguments share the work; a restarted one resumes from the committed source offsets.
``--exactly-once`` runs the worker with ``exactly.once.source.support=enabled`` and the source
connector with ``exactly.once.support=required`` (KIP-618): records, source offsets and offset
syncs commit in one transaction on the target (``connect.exactly_once``).

Like ``connect.cli``, this module imports only typer and rich at load time (every ``raftlog``
invocation loads it); the runtime is imported when the mirror starts.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from connect.cli import DEFAULT_URL, _call, _serve_until_signalled

mirror_app = typer.Typer(
    help="Mirror topics and consumer-group offsets between clusters (MirrorMaker 2 style).",
    invoke_without_command=True,
)
console = Console()
log = logging.getLogger(__name__)
SOURCE_CONNECTOR = "MirrorSourceConnector"
CHECKPOINT_CONNECTOR = "MirrorCheckpointConnector"
SOURCE_ONLY = {
    "refresh.topics.interval.ms",
    "sync.topic.configs.enabled",
    "replication.factor",
    "sync.topic.configs.interval.ms",
    "offset.lag.max",
    "consumer.max.poll.records",
    "consumer.isolation.level",
    "exactly.once.support",
}
CHECKPOINT_ONLY = {"groups", "groups.exclude", "emit.checkpoints.interval.ms",
                   "sync.group.offsets.enabled", "sync.group.offsets.interval.ms"}  # fmt: skip
JOIN_TIMEOUT_S = 120.0
JOIN_POLL_S = 0.2


def _pairs(values: list[str] | None, what: str) -> dict[str, Any]:
    """``KEY=VALUE`` options; values that parse as JSON (numbers, booleans) are taken so."""
    result: dict[str, Any] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} takes KEY=VALUE, not {item!r}")
        try:
            result[key] = json.loads(value)
        except json.JSONDecodeError:
            result[key] = value
    return result


def topics_setting(names: str | None, regex: str | None) -> str:
    """MM2's ``topics`` (comma-separated regexes) from names (escaped) and/or a regex."""
    parts = [re.escape(n.strip()) for n in (names or "").split(",") if n.strip()]
    if regex:
        parts.append(regex)
    if not parts:
        raise typer.BadParameter("give --topics or --topics-regex")
    return ",".join(parts)


def mirror_configs(
    *,
    source_bootstrap: str,
    target_bootstrap: str,
    source_alias: str,
    target_alias: str,
    topics: str,
    groups: str,
    tasks_max: int,
    sync_group_offsets: bool,
    settings: dict[str, Any],
    exactly_once: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two connectors' configs; ``settings`` (MM2 names) go to the connector that has them.
    ``exactly_once``: the source connector requires it (the worker must enable it)."""
    shared = {
        "source.cluster.alias": source_alias,
        "target.cluster.alias": target_alias,
        "source.cluster.bootstrap.servers": source_bootstrap,
        "target.cluster.bootstrap.servers": target_bootstrap,
        "topics": topics,
    }
    source = {"connector.class": SOURCE_CONNECTOR, "tasks.max": tasks_max, **shared}
    if exactly_once:
        source["exactly.once.support"] = "required"
    checkpoint = {
        "connector.class": CHECKPOINT_CONNECTOR, "tasks.max": 1, **shared, "groups": groups,
        "sync.group.offsets.enabled": sync_group_offsets,
        "emit.checkpoints.interval.ms": 5_000, "sync.group.offsets.interval.ms": 5_000,
    }  # fmt: skip
    for key, value in settings.items():
        if key not in CHECKPOINT_ONLY:
            source[key] = value
        if key not in SOURCE_ONLY:
            checkpoint[key] = value
    return source, checkpoint


def worker_settings(
    target_bootstrap: str,
    source_alias: str,
    listeners: str,
    extra: dict[str, Any],
    exactly_once: bool = False,
) -> dict[str, Any]:
    """The distributed worker of MM2's dedicated mode, its state on the target cluster."""
    return {
        **({"exactly.once.source.support": "enabled"} if exactly_once else {}),
        "bootstrap.servers": target_bootstrap,
        "listeners": listeners,
        "group.id": f"{source_alias}-mm2",
        "config.storage.topic": f"mm2-configs.{source_alias}.internal",
        "offset.storage.topic": f"mm2-offsets.{source_alias}.internal",
        "status.storage.topic": f"mm2-status.{source_alias}.internal",
        **extra,
    }


@mirror_app.callback()
def mirror(
    ctx: typer.Context,
    source_bootstrap: Annotated[str | None, typer.Option(help="source brokers h:p,...")] = None,
    target_bootstrap: Annotated[str | None, typer.Option(help="target brokers h:p,...")] = None,
    source_alias: Annotated[str, typer.Option(help="prefix of the mirrored topics")] = "source",
    target_alias: Annotated[str, typer.Option(help="names the offset-syncs topic")] = "target",
    topics: Annotated[str | None, typer.Option(help="topic names, comma-separated")] = None,
    topics_regex: Annotated[str | None, typer.Option(help="a regex of topic names")] = None,
    groups: Annotated[str | None, typer.Option(help="group names, comma-separated")] = None,
    groups_regex: Annotated[str | None, typer.Option(help="a regex of group names")] = None,
    sync_group_offsets: Annotated[bool, typer.Option(help="commit translated offsets")] = True,
    tasks_max: Annotated[int, typer.Option(min=1, max=1000)] = 1,
    listeners: Annotated[str, typer.Option(help="this worker's REST API")] = DEFAULT_URL,
    setting: Annotated[list[str] | None, typer.Option(
        "--set", help="a connector setting KEY=VALUE (MM2's names)")] = None,
    worker: Annotated[list[str] | None, typer.Option(
        "--worker", help="a worker setting KEY=VALUE")] = None,
    exactly_once: Annotated[bool, typer.Option(
        "--exactly-once", help="records and source offsets in one transaction (KIP-618)")] = False,
) -> None:  # fmt: skip
    """Mirror the selected topics of the source cluster to the target as <alias>.<topic>."""
    if ctx.invoked_subcommand is not None:
        return
    if source_bootstrap is None or target_bootstrap is None:
        raise typer.BadParameter("give --source-bootstrap and --target-bootstrap")
    group_parts = [re.escape(g.strip()) for g in (groups or "").split(",") if g.strip()]
    group_parts += [groups_regex] if groups_regex else []
    source, checkpoint = mirror_configs(
        source_bootstrap=source_bootstrap, target_bootstrap=target_bootstrap,
        source_alias=source_alias, target_alias=target_alias,
        topics=topics_setting(topics, topics_regex), groups=",".join(group_parts) or ".*",
        tasks_max=tasks_max, sync_group_offsets=sync_group_offsets,
        settings=_pairs(setting, "--set"), exactly_once=exactly_once,
    )  # fmt: skip
    settings = worker_settings(
        target_bootstrap, source_alias, listeners, _pairs(worker, "--worker"),
        exactly_once=exactly_once,
    )  # fmt: skip
    connectors = {SOURCE_CONNECTOR: source, CHECKPOINT_CONNECTOR: checkpoint}
    _serve_until_signalled(lambda: _start(settings, connectors))


def _start(settings: dict[str, Any], connectors: dict[str, dict[str, Any]]) -> Any:
    from connect.herder import ConnectError  # noqa: PLC0415 - the runtime loads on use
    from connect.process import start_distributed_worker  # noqa: PLC0415
    from connect.worker_config import WorkerConfig  # noqa: PLC0415

    herder, stop = start_distributed_worker(WorkerConfig.model_validate(settings))
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    try:
        pending = dict(connectors)
        while pending:
            name, config = next(iter(pending.items()))
            try:
                current = herder.connector_config(name)
            except ConnectError as error:
                if error.status != 404:
                    raise
                current = None
            try:
                if current != {**config, "name": name}:
                    herder.put_config(name, config)
                    log.info("mirror: connector %s configured", name)
                del pending[name]
            except ConnectError as error:  # 409 until the worker joined its group
                if error.status != 409 or time.monotonic() > deadline:
                    raise
                time.sleep(JOIN_POLL_S)  # polling the herder's assignment with a deadline
    except BaseException:
        stop()
        raise
    return stop


@mirror_app.command("status")
def status(
    url: Annotated[str, typer.Option("--url", help="a mirror worker's REST API")] = DEFAULT_URL,
    as_json: Annotated[bool, typer.Option("--json", help="the raw lag report")] = False,
) -> None:
    """Replication lag per mirrored partition: source end offset minus mirrored position."""
    answer = _call("GET", url, f"/connectors/{SOURCE_CONNECTOR}/status")
    rows = [
        {**row, "task": task["id"], "state": task["state"]}
        for task in answer.get("tasks", [])
        for row in task.get("metrics", {}).get("partitions", [])
    ]
    if as_json:
        print(json.dumps({"connector": answer.get("connector"), "partitions": rows}, indent=2))
        return
    table = Table("source topic", "partition", "target topic", "source end", "mirrored", "lag",
                  "task")  # fmt: skip
    for row in sorted(rows, key=lambda r: (r["topic"], r["partition"])):
        table.add_row(
            row["topic"], str(row["partition"]), row["target_topic"],
            str(row["source_end_offset"]), str(row["mirrored_offset"]), str(row["lag_records"]),
            f"{row['task']} {row['state']}",
        )  # fmt: skip
    console.print(table)
    console.print(f"total lag: {sum(r['lag_records'] for r in rows)} records")
