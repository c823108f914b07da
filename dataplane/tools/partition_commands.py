"""``raftlog partitions reassign``: move partitions between brokers, as Kafka's
kafka-reassign-partitions does, with the same JSON plan.

- ``--generate --brokers 1,2,3,4 --topics t1,t2`` prints the current assignment and a proposed
  one, balanced over the brokers and moving as few replicas as it can
  (:mod:`metadata_quorum.rebalance`; Kafka's tool places every partition afresh);
- ``--execute --plan FILE`` starts the moves and prints the current assignment to keep for a
  rollback;
- ``--verify --plan FILE`` shows each partition's progress (exit 0 once all are done);
- ``--cancel --plan FILE`` reverts the moves still in progress to their original replicas.

The plan: ``{"version": 1, "partitions": [{"topic": "t1", "partition": 0, "replicas": [1, 2, 3],
"log_dirs": ["any", "any", "any"]}]}`` (``log_dirs`` is accepted and must be "any": raftlog
brokers have one log directory).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from dataplane.client import AdminClient, TopicPartition
from dataplane.tools.client_commands import (
    DEFAULT_BOOTSTRAP,
    BootstrapOption,
    JsonOption,
    console,
    err_console,
    error_line,
    kafka_errors,
    print_json,
    servers,
)
from metadata_quorum.rebalance import plan_reassignment

__all__ = ["partitions_app"]

PLAN_VERSION = 1
partitions_app = typer.Typer(
    help="Move partitions between brokers (kafka-reassign-partitions).", no_args_is_help=True
)
Assignment = dict[tuple[str, int], tuple[int, ...]]


def _ids(value: str, option: str) -> list[int]:
    try:
        found = [int(part) for part in value.split(",") if part.strip()]
    except ValueError as error:
        raise typer.BadParameter(
            f"expected broker ids like 1,2,3: {value!r}", param_hint=option
        ) from error
    if not found:
        raise typer.BadParameter("no broker ids", param_hint=option)
    return found


def plan_document(assignment: Mapping[tuple[str, int], Sequence[int]]) -> dict[str, Any]:
    return {
        "version": PLAN_VERSION,
        "partitions": [
            {
                "topic": topic,
                "partition": partition,
                "replicas": list(replicas),
                "log_dirs": ["any"] * len(replicas),
            }
            for (topic, partition), replicas in sorted(assignment.items())
        ],
    }


def read_plan(path: Path) -> Assignment:
    """The plan file, checked: a clear error naming what is wrong, never a trace."""
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise typer.BadParameter(f"{path}: {error}", param_hint="--plan") from error
    if not isinstance(document, dict) or document.get("version") != PLAN_VERSION:
        raise typer.BadParameter(f"{path}: not a version {PLAN_VERSION} plan", param_hint="--plan")
    plan: Assignment = {}
    for entry in document.get("partitions") or []:
        try:
            key = (str(entry["topic"]), int(entry["partition"]))
            replicas = tuple(int(b) for b in entry["replicas"])
        except (KeyError, TypeError, ValueError) as error:
            raise typer.BadParameter(
                f"{path}: each partition needs topic, partition and replicas: {entry!r}",
                param_hint="--plan",
            ) from error
        if any(d != "any" for d in entry.get("log_dirs") or ()):
            raise typer.BadParameter(
                f'{path}: {key[0]}-{key[1]}: log_dirs must be "any"', param_hint="--plan"
            )
        if key in plan:
            raise typer.BadParameter(
                f"{path}: {key[0]}-{key[1]} is listed twice", param_hint="--plan"
            )
        plan[key] = replicas
    if not plan:
        raise typer.BadParameter(f"{path}: the plan names no partition", param_hint="--plan")
    return plan


def current_assignment(admin: AdminClient, topics: Sequence[str] | None) -> Assignment:
    described = admin.describe_topics(topics)
    return {
        (name, p.partition): p.replicas
        for name, topic in described.items()
        if topics is not None or not name.startswith("__")
        for p in topic.partitions
    }


@partitions_app.command("reassign")
def reassign(
    generate: Annotated[bool, typer.Option("--generate", help="propose a balanced plan")] = False,
    execute: Annotated[bool, typer.Option("--execute", help="start the plan's moves")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="the plan's progress")] = False,
    cancel: Annotated[bool, typer.Option("--cancel", help="revert moves in progress")] = False,
    plan_file: Annotated[Path | None, typer.Option("--plan", help="a plan (JSON)")] = None,
    brokers: Annotated[
        str | None, typer.Option("--brokers", help="with --generate: broker ids, e.g. 1,2,3,4")
    ] = None,
    topics: Annotated[
        str | None, typer.Option("--topics", help="with --generate: topics (default: all)")
    ] = None,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Generate, execute, verify or cancel a reassignment plan."""
    chosen = [name for name, on in
              (("--generate", generate), ("--execute", execute), ("--verify", verify),
               ("--cancel", cancel)) if on]  # fmt: skip
    if len(chosen) != 1:
        raise typer.BadParameter("give exactly one of --generate, --execute, --verify, --cancel")
    with kafka_errors(), AdminClient(servers(bootstrap)) as admin:
        if generate:
            if brokers is None:
                raise typer.BadParameter("--generate needs --brokers", param_hint="--brokers")
            names = [t.strip() for t in topics.split(",") if t.strip()] if topics else None
            _generate(admin, _ids(brokers, "--brokers"), names, as_json)
            return
        if plan_file is None:
            raise typer.BadParameter(f"{chosen[0]} needs --plan FILE", param_hint="--plan")
        plan = read_plan(plan_file)
        if execute:
            _execute(admin, plan, as_json)
        elif verify:
            _verify(admin, plan, as_json)
        else:
            _cancel(admin, plan, as_json)


def _generate(
    admin: AdminClient, brokers: list[int], topics: list[str] | None, as_json: bool
) -> None:
    current = current_assignment(admin, topics)
    proposed = plan_reassignment(current, brokers)
    if as_json:
        print_json({"current": plan_document(current), "proposed": plan_document(proposed)})
        return
    moved = sum(len(set(proposed[tp]) - set(current[tp])) for tp in current)
    console.print("Current partition replica assignment")
    print(json.dumps(plan_document(current)))
    console.print(f"\nProposed partition reassignment configuration ({moved} replicas move)")
    print(json.dumps(plan_document(proposed)))


def _execute(admin: AdminClient, plan: Assignment, as_json: bool) -> None:
    current = current_assignment(admin, sorted({t for t, _ in plan}))
    missing = sorted(tp for tp in plan if tp not in current)
    errors = admin.alter_partition_reassignments(
        {tp: replicas for tp, replicas in plan.items() if tp not in missing}
    )
    failed = {tp: e for tp, e in errors.items() if e is not None}
    rollback = {tp: current[tp] for tp in plan if tp in current}
    if as_json:
        print_json({
            "rollback": plan_document(rollback),
            "errors": {f"{tp.topic}-{tp.partition}": error_line(e) for tp, e in failed.items()},
            "missing": [f"{t}-{p}" for t, p in missing],
        })  # fmt: skip
    else:
        console.print("Current partition replica assignment (save it for a rollback)")
        print(json.dumps(plan_document(rollback)))
        started = len(plan) - len(failed) - len(missing)
        console.print(f"\nSuccessfully started the reassignment of {started} partitions.")
    for topic, partition in missing:
        err_console.print(f"{topic}-{partition}: no such topic or partition")
    for tp, error in sorted(failed.items()):
        err_console.print(f"{tp.topic}-{tp.partition}: {error_line(error)}")
    if failed or missing:
        raise typer.Exit(1)


def _verify(admin: AdminClient, plan: Assignment, as_json: bool) -> None:
    ongoing = admin.list_partition_reassignments([TopicPartition(t, p) for t, p in plan])
    current = current_assignment(admin, sorted({t for t, _ in plan}))
    rows: list[dict[str, Any]] = []
    for tp, target in sorted(plan.items()):
        moving = ongoing.get(TopicPartition(*tp))
        if moving is not None:
            state = "in progress"
        elif current.get(tp) == target:
            state = "complete"
        else:
            state = "not started" if tp in current else "no such partition"
        rows.append({
            "topic": tp[0], "partition": tp[1], "state": state,
            "replicas": list(current.get(tp, ())), "target": list(target),
            "adding": list(moving.adding_replicas) if moving else [],
            "removing": list(moving.removing_replicas) if moving else [],
        })  # fmt: skip
    if as_json:
        print_json(rows)
    else:
        table = Table("TOPIC", "PARTITION", "STATE", "REPLICAS", "TARGET", "ADDING", "REMOVING")
        for row in rows:
            table.add_row(
                row["topic"], str(row["partition"]), row["state"],
                *(",".join(map(str, row[k])) for k in ("replicas", "target", "adding", "removing")),
            )  # fmt: skip
        console.print(table)
    if any(row["state"] != "complete" for row in rows):
        raise typer.Exit(1)


def _cancel(admin: AdminClient, plan: Assignment, as_json: bool) -> None:
    ongoing = admin.list_partition_reassignments([TopicPartition(t, p) for t, p in plan])
    errors = admin.alter_partition_reassignments({tp: None for tp in ongoing})
    failed = {tp: e for tp, e in errors.items() if e is not None}
    cancelled = sorted(tp for tp in errors if tp not in failed)
    if as_json:
        print_json({
            "cancelled": [f"{tp.topic}-{tp.partition}" for tp in cancelled],
            "errors": {f"{tp.topic}-{tp.partition}": error_line(e) for tp, e in failed.items()},
        })  # fmt: skip
    else:
        console.print(f"Cancelled the reassignment of {len(cancelled)} partitions.")
    for tp, error in sorted(failed.items()):
        err_console.print(f"{tp.topic}-{tp.partition}: {error_line(error)}")
    if failed:
        raise typer.Exit(1)
