"""``raftlog group``: list, describe, reset the offsets of, delete the offsets of and delete
consumer groups.

Like Kafka's kafka-consumer-groups: ``describe`` shows per partition the committed offset, the
log end offset (the high watermark), the lag and the owning member; with ``--isolation-level
read_committed`` the end is the last stable offset instead (what a read_committed member can
read up to: the first offset of the earliest open transaction), so a group that reads
read_committed shows no lag for records it cannot see yet; ``reset-offsets`` prints
its plan and applies it only with ``--execute``, and only while the group has no members.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Annotated, Any

import typer
from rich.table import Table

from dataplane.client import AdminClient, Consumer, TopicPartition
from dataplane.client.group_lag import IsolationLevel, describe_group_lag
from dataplane.tools.client_commands import (
    DEFAULT_BOOTSTRAP,
    BootstrapOption,
    JsonOption,
    admin_client,
    console,
    err_console,
    error_line,
    kafka_errors,
    print_json,
    servers,
)
from dataplane.tools.command_config import command_security
from raftlog.errors import ErrorCode, KafkaError

__all__ = ["group_app"]

group_app = typer.Typer(
    help="List, describe, reset or delete offsets of and delete consumer groups.",
    no_args_is_help=True,
)


@group_app.command("list")
def group_list(
    state: Annotated[
        list[str] | None, typer.Option("--state", help="only groups in this state, repeatable")
    ] = None,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Every consumer group, with its state."""
    with kafka_errors(), admin_client(bootstrap) as admin:
        groups = admin.list_groups(state or ())
    if as_json:
        print_json([{"group": g.group_id, "state": g.state, "type": g.group_type} for g in groups])
        return
    table = Table("GROUP", "STATE", "TYPE")
    for group in groups:
        table.add_row(group.group_id, group.state, group.group_type)
    console.print(table)


@group_app.command("describe")
def group_describe(
    group: Annotated[str, typer.Argument(help="the group id")],
    isolation_level: Annotated[
        IsolationLevel,
        typer.Option(
            "--isolation-level",
            help="read_committed: lag to the last stable offset (a read_committed group's end)",
        ),
    ] = "read_uncommitted",
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Members, assignment, committed offset, log end (or last stable offset) and lag per
    partition."""
    with kafka_errors(), admin_client(bootstrap) as admin:
        lag = describe_group_lag(
            admin, servers(bootstrap), group, isolation_level, security=command_security()
        )
    description = lag.description
    rows = [dataclasses.asdict(row) for row in lag.rows]
    if as_json:
        print_json(
            {
                "group": group,
                "isolation_level": isolation_level,
                "state": description.state,
                "type": description.group_type,
                "group_epoch": description.group_epoch,
                "coordinator": description.coordinator_id,
                "members": [
                    {
                        "member_id": m.member_id,
                        "client_id": m.client_id,
                        "member_epoch": m.member_epoch,
                        "subscribed_topics": list(m.subscribed_topics),
                        "subscribed_pattern": m.subscribed_pattern,
                        "assignment": [list(tp) for tp in sorted(m.assignment)],
                    }
                    for m in description.members
                ],
                "partitions": rows,
            }
        )
        return
    console.print(
        f"Group [bold]{group}[/bold] ({description.group_type}): {description.state}, "
        f"{'generation' if description.group_type == 'classic' else 'epoch'} "
        f"{description.group_epoch}, "
        f"{len(description.members)} members, coordinator {description.coordinator_id}"
    )
    end = "LAST-STABLE-OFFSET" if isolation_level == "read_committed" else "LOG-END-OFFSET"
    table = Table("TOPIC", "PARTITION", "CURRENT-OFFSET", end, "LAG", "MEMBER-ID", "CLIENT-ID")
    for row in rows:
        table.add_row(*("-" if v is None else str(v) for v in row.values()))
    console.print(table)


def _partitions(
    admin: AdminClient, consumer: Consumer, group: str, topics: list[str], all_topics: bool
) -> list[TopicPartition]:
    """``--topic NAME`` (every partition) or ``NAME:0,1``; ``--all-topics``: every partition
    the group has an offset for."""
    if all_topics:
        return sorted(admin.list_group_offsets(group))
    chosen: list[TopicPartition] = []
    for spec in topics:
        name, _, numbers = spec.partition(":")
        ids = (
            [int(n) for n in numbers.split(",")]
            if numbers
            else sorted(consumer.partitions_for_topic(name))
        )
        chosen += [TopicPartition(name, p) for p in ids]
    return chosen


def _targets(
    consumer: Consumer,
    partitions: list[TopicPartition],
    to_earliest: bool,
    to_latest: bool,
    to_offset: int | None,
    to_datetime: str | None,
) -> dict[TopicPartition, int]:
    if to_earliest:
        return consumer.beginning_offsets(partitions)
    if to_latest:
        return consumer.end_offsets(partitions)
    if to_offset is not None:
        # Kafka's tool clamps an offset outside the log to its nearest end.
        starts = consumer.beginning_offsets(partitions)
        ends = consumer.end_offsets(partitions)
        return {tp: min(max(to_offset, starts[tp]), ends[tp]) for tp in partitions}
    assert to_datetime is not None, "one target is given"
    try:
        moment = dt.datetime.fromisoformat(to_datetime)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--to-datetime") from error
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    stamp = int(moment.timestamp() * 1000)
    found = consumer.offsets_for_times(dict.fromkeys(partitions, stamp))
    ends = consumer.end_offsets(partitions)
    targets: dict[TopicPartition, int] = {}
    for tp in partitions:
        hit = found[tp]
        targets[tp] = ends[tp] if hit is None else hit[0]  # none at or after: the end
    return targets


def _plan_json(tp: TopicPartition, offset: int, error: KafkaError | None) -> dict[str, Any]:
    return {
        "topic": tp.topic,
        "partition": tp.partition,
        "new_offset": offset,
        "error": None if error is None else error_line(error),
    }


@group_app.command("reset-offsets")
def group_reset_offsets(
    group: Annotated[str, typer.Argument(help="the group id (it must have no members)")],
    topic: Annotated[
        list[str] | None, typer.Option("--topic", help="NAME or NAME:0,1, repeatable")
    ] = None,
    all_topics: Annotated[bool, typer.Option("--all-topics")] = False,
    to_earliest: Annotated[bool, typer.Option("--to-earliest")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest")] = False,
    to_offset: Annotated[int | None, typer.Option("--to-offset", min=0)] = None,
    to_datetime: Annotated[
        str | None, typer.Option("--to-datetime", help="ISO 8601, e.g. 2026-11-23T10:00:00Z")
    ] = None,
    execute: Annotated[bool, typer.Option("--execute", help="apply (default: dry run)")] = False,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Move a group's committed offsets; prints the plan, applies it with --execute."""
    chosen = [to_earliest, to_latest, to_offset is not None, to_datetime is not None]
    if sum(chosen) != 1:
        raise typer.BadParameter(
            "give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime"
        )
    if bool(topic) == all_topics:
        raise typer.BadParameter("give --topic or --all-topics")
    with kafka_errors(), admin_client(bootstrap) as admin:
        try:
            state = admin.describe_groups([group])[group].state
        except KafkaError as error:
            if error.error is not ErrorCode.GROUP_ID_NOT_FOUND:
                raise
            state = "Empty"
        if state != "Empty":
            raise KafkaError(
                ErrorCode.NON_EMPTY_GROUP,
                f"offsets of {group!r} can only be reset while it has no members; it is {state}",
            )
        with Consumer(servers(bootstrap), security=command_security()) as consumer:
            partitions = _partitions(admin, consumer, group, topic or [], all_topics)
            plan = _targets(consumer, partitions, to_earliest, to_latest, to_offset, to_datetime)
        errors = admin.alter_group_offsets(group, plan) if execute else {}
    if as_json:
        print_json([_plan_json(tp, offset, errors.get(tp)) for tp, offset in sorted(plan.items())])
    else:
        table = Table("TOPIC", "PARTITION", "NEW-OFFSET")
        for tp, offset in sorted(plan.items()):
            table.add_row(tp.topic, str(tp.partition), str(offset))
        console.print(table)
        if not execute:
            console.print("Dry run: add --execute to apply.")
    failed = [e for e in errors.values() if e is not None]
    for refused in failed:
        err_console.print(error_line(refused))
    if failed:
        raise typer.Exit(1)


@group_app.command("delete")
def group_delete(
    groups: Annotated[list[str], typer.Argument(help="groups to delete (they must be empty)")],
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
) -> None:
    """Delete empty groups and their committed offsets."""
    with kafka_errors(), admin_client(bootstrap) as admin:
        results = admin.delete_groups(groups)
    failed = False
    for group, error in results.items():
        if error is None:
            console.print(f"Deleted group {group}.")
        else:
            err_console.print(f"{group}: {error_line(error)}")
            failed = True
    if failed:
        raise typer.Exit(1)


@group_app.command("delete-offsets")
def group_delete_offsets(
    group: Annotated[str, typer.Argument(help="the group id")],
    topic: Annotated[
        list[str], typer.Option("--topic", help="NAME (every partition) or NAME:0,1, repeatable")
    ],
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Delete a group's committed offsets of some partitions (Kafka's --delete-offsets): not
    those of topics its members subscribe to (GROUP_SUBSCRIBED_TO_TOPIC)."""
    with kafka_errors(), admin_client(bootstrap) as admin:
        partitions: list[TopicPartition] = []
        for spec in topic:
            name, _, numbers = spec.partition(":")
            if numbers:
                partitions += [TopicPartition(name, int(n)) for n in numbers.split(",")]
            else:
                described = admin.describe_topics([name])[name]
                partitions += [TopicPartition(name, p.partition) for p in described.partitions]
        results = admin.delete_consumer_group_offsets(group, partitions)
    ordered = sorted(results.items())
    if as_json:
        print_json([
            {"topic": tp.topic, "partition": tp.partition,
             "error": None if error is None else error_line(error)}
            for tp, error in ordered
        ])  # fmt: skip
    for tp, error in ordered:
        if error is None and not as_json:
            console.print(f"Deleted the offset of {tp.topic}-{tp.partition} for group {group}.")
        elif error is not None:
            err_console.print(f"{tp.topic}-{tp.partition}: {error_line(error)}")
    if any(error is not None for _, error in ordered):
        raise typer.Exit(1)
