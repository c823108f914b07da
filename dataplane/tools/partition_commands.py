"""``raftlog partitions reassign``: move partitions between brokers, as Kafka's
kafka-reassign-partitions does, with the same JSON plan.

- ``--generate --brokers 1,2,3,4 --topics t1,t2`` prints the current assignment and a proposed
  one, balanced over the brokers and moving as few replicas as it can
  (:mod:`metadata_quorum.rebalance`; Kafka's tool places every partition afresh); a cordoned
  broker (``raftlog cluster cordon``) gets no new replica;
- ``--execute --plan FILE`` starts the moves and prints the current assignment to keep for a
  rollback; with ``--throttle BYTES`` it first bounds their catch-up traffic, as Kafka's tool
  does: ``leader.replication.throttled.rate`` and ``follower.replication.throttled.rate`` on
  every broker of a move (its current and its new replicas), and on each topic
  ``leader.replication.throttled.replicas`` (the current replicas of its moving partitions) and
  ``follower.replication.throttled.replicas`` (their new replicas). Run again with another
  ``--throttle`` while the moves go on, it changes the rate;
- ``--verify --plan FILE`` shows each partition's progress (exit 0 once all are done) and, once
  all are done, removes the throttles (unless ``--preserve-throttles``);
- ``--cancel --plan FILE`` reverts the moves still in progress to their original replicas.

The plan: ``{"version": 1, "partitions": [{"topic": "t1", "partition": 0, "replicas": [1, 2, 3],
"log_dirs": ["any", "any", "any"]}]}`` (``log_dirs`` is accepted and must be "any": raftlog
brokers have one log directory).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from dataplane.client import AdminClient, TopicPartition
from dataplane.client.admin import (
    ConfigResource,
    PartitionReassignment,
    ResourceType,
    TopicDescription,
)
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
)
from metadata_quorum.rebalance import plan_reassignment

__all__ = ["partitions_app"]

PLAN_VERSION = 1
RATE_KEYS = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
LEADER_REPLICAS_KEY = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS_KEY = "follower.replication.throttled.replicas"
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


def moving_target(moving: PartitionReassignment) -> tuple[int, ...]:
    """Where a partition being moved is going: its replicas without the ones leaving."""
    return tuple(b for b in moving.replicas if b not in moving.removing_replicas)


@dataclass(frozen=True)
class ThrottlePlan:
    """What ``--execute --throttle`` sets: the rates on ``brokers``, and per topic the
    leader and follower throttled replicas (Kafka's ``partition:broker,...``)."""

    brokers: tuple[int, ...]
    leader: Mapping[str, str]
    follower: Mapping[str, str]


def plan_throttles(described: Mapping[str, TopicDescription], plan: Assignment) -> ThrottlePlan:
    """The throttles of the moves of ``plan`` and of those already under way in its topics
    (Kafka's tool covers both): a move's current replicas send (the leader may be any of
    them), its new replicas fetch. A partition already moving counts from its original
    replicas (``replicas`` less ``adding_replicas``); a partition that gains no replica is
    not throttled."""
    brokers: set[int] = set()
    leader: dict[str, list[str]] = {}
    follower: dict[str, list[str]] = {}
    for name in sorted({topic for topic, _ in plan}):
        topic = described.get(name)
        for p in topic.partitions if topic is not None else ():
            original = [b for b in p.replicas if b not in p.adding_replicas]
            moving_to = [b for b in p.replicas if b not in p.removing_replicas]
            target = plan.get((name, p.partition), moving_to)
            adding = [b for b in target if b not in original]
            if not adding:
                continue
            brokers.update(original, adding)
            leader.setdefault(name, []).extend(f"{p.partition}:{b}" for b in original)
            follower.setdefault(name, []).extend(f"{p.partition}:{b}" for b in adding)
    return ThrottlePlan(
        tuple(sorted(brokers)),
        {name: ",".join(entries) for name, entries in leader.items()},
        {name: ",".join(entries) for name, entries in follower.items()},
    )


def set_throttles(admin: AdminClient, throttles: ThrottlePlan, rate_bytes_per_s: int) -> None:
    """Rates first, then the replicas they apply to."""
    for broker_id in throttles.brokers:
        resource = ConfigResource(ResourceType.BROKER, str(broker_id))
        admin.alter_configs(resource, dict.fromkeys(RATE_KEYS, str(rate_bytes_per_s)))
    for name in sorted(throttles.leader):
        admin.alter_configs(
            ConfigResource(ResourceType.TOPIC, name),
            {
                LEADER_REPLICAS_KEY: throttles.leader[name],
                FOLLOWER_REPLICAS_KEY: throttles.follower[name],
            },
        )


def clear_throttles(
    admin: AdminClient, brokers: Sequence[int], topics: Sequence[str]
) -> tuple[list[int], list[str]]:
    """Delete the brokers' throttled rates and the topics' throttled replicas where they are
    set (Kafka's ``clearAllThrottles``); the brokers and topics that had any."""
    resources = [ConfigResource(ResourceType.BROKER, str(b)) for b in brokers]
    described = admin.describe_configs(resources)
    cleared_brokers = []
    for resource in resources:
        entries = described.get(resource, {})
        keys = [k for k in RATE_KEYS if k in entries and not entries[k].is_default]
        if keys:
            admin.alter_configs(resource, dict.fromkeys(keys))
            cleared_brokers.append(int(resource.name))
    cleared_topics = []
    for name, topic in sorted(admin.describe_topics(topics).items()):
        keys = [k for k in (LEADER_REPLICAS_KEY, FOLLOWER_REPLICAS_KEY) if k in topic.configs]
        if keys:
            admin.alter_configs(ConfigResource(ResourceType.TOPIC, name), dict.fromkeys(keys))
            cleared_topics.append(name)
    return cleared_brokers, cleared_topics


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
    throttle: Annotated[
        int | None,
        typer.Option(
            "--throttle", min=0, help="with --execute: bound the moves' catch-up to BYTES/s"
        ),
    ] = None,
    preserve_throttles: Annotated[
        bool,
        typer.Option("--preserve-throttles", help="with --verify: keep the throttles when done"),
    ] = False,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Generate, execute, verify or cancel a reassignment plan."""
    chosen = [name for name, on in
              (("--generate", generate), ("--execute", execute), ("--verify", verify),
               ("--cancel", cancel)) if on]  # fmt: skip
    if len(chosen) != 1:
        raise typer.BadParameter("give exactly one of --generate, --execute, --verify, --cancel")
    if throttle is not None and not execute:
        raise typer.BadParameter("--throttle goes with --execute", param_hint="--throttle")
    with kafka_errors(), admin_client(bootstrap) as admin:
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
            _execute(admin, plan, as_json, throttle)
        elif verify:
            _verify(admin, plan, as_json, preserve_throttles)
        else:
            _cancel(admin, plan, as_json)


def _generate(
    admin: AdminClient, brokers: list[int], topics: list[str] | None, as_json: bool
) -> None:
    current = current_assignment(admin, topics)
    cordoned = sorted(b.broker_id for b in admin.describe_cluster().brokers if b.cordoned)
    proposed = plan_reassignment(current, brokers, cordoned)
    if as_json:
        print_json({"current": plan_document(current), "proposed": plan_document(proposed)})
        return
    moved = sum(len(set(proposed[tp]) - set(current[tp])) for tp in current)
    console.print("Current partition replica assignment")
    print(json.dumps(plan_document(current)))
    shown = [b for b in cordoned if b in brokers]
    if shown:
        console.print(f"\nBrokers {shown} are cordoned: they keep replicas but get no new one")
    console.print(f"\nProposed partition reassignment configuration ({moved} replicas move)")
    print(json.dumps(plan_document(proposed)))


def _execute(
    admin: AdminClient, plan: Assignment, as_json: bool, throttle_bytes_per_s: int | None
) -> None:
    current = current_assignment(admin, sorted({t for t, _ in plan}))
    missing = sorted(tp for tp in plan if tp not in current)
    throttles = None
    if throttle_bytes_per_s is not None:  # before the moves start: throttled from the first byte
        throttles = plan_throttles(admin.describe_topics(sorted({t for t, _ in plan})), plan)
        set_throttles(admin, throttles, throttle_bytes_per_s)
    ongoing = {
        (tp.topic, tp.partition): moving
        for tp, moving in admin.list_partition_reassignments(
            [TopicPartition(t, p) for t, p in plan]
        ).items()
    }
    # a partition already moving to its target is left as it is (run again, --execute only
    # changes the throttle: a resubmitted target would bump the partition epoch for nothing)
    under_way = sorted(tp for tp, moving in ongoing.items() if plan[tp] == moving_target(moving))
    wanted = {tp: r for tp, r in plan.items() if tp not in missing and tp not in under_way}
    errors = admin.alter_partition_reassignments(wanted) if wanted else {}
    failed = {tp: e for tp, e in errors.items() if e is not None}
    rollback = {  # a partition being moved goes back to where it was before (as --cancel does)
        tp: tuple(b for b in current[tp] if b not in ongoing[tp].adding_replicas)
        if tp in ongoing else current[tp]
        for tp in plan if tp in current
    }  # fmt: skip
    if as_json:
        print_json({
            "rollback": plan_document(rollback),
            "errors": {f"{tp.topic}-{tp.partition}": error_line(e) for tp, e in failed.items()},
            "missing": [f"{t}-{p}" for t, p in missing],
            "already_moving": [f"{t}-{p}" for t, p in under_way],
            "throttle": None if throttles is None else {
                "rate": throttle_bytes_per_s, "brokers": list(throttles.brokers),
                LEADER_REPLICAS_KEY: throttles.leader, FOLLOWER_REPLICAS_KEY: throttles.follower,
            },
        })  # fmt: skip
    else:
        console.print("Current partition replica assignment (save it for a rollback)")
        print(json.dumps(plan_document(rollback)))
        if throttles is not None:
            console.print(
                "\nWarning: run --verify periodically until the reassignment completes, to "
                "remove the throttle."
            )
            brokers = ",".join(map(str, throttles.brokers)) or "none"
            console.print(
                f"The inter-broker throttle limit was set to {throttle_bytes_per_s} B/s "
                f"(brokers {brokers})."
            )
        started = len(wanted) - len(failed)
        console.print(f"\nSuccessfully started the reassignment of {started} partitions.")
        if under_way:
            console.print(f"{len(under_way)} partitions were already moving to their target.")
    for topic, partition in missing:
        err_console.print(f"{topic}-{partition}: no such topic or partition")
    for tp, error in sorted(failed.items()):
        err_console.print(f"{tp.topic}-{tp.partition}: {error_line(error)}")
    if failed or missing:
        raise typer.Exit(1)


def _verify(admin: AdminClient, plan: Assignment, as_json: bool, preserve_throttles: bool) -> None:
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
    if not preserve_throttles:
        brokers = {b.broker_id for b in admin.describe_cluster().brokers}
        brokers.update(b for replicas in plan.values() for b in replicas)
        cleared_brokers, cleared_topics = clear_throttles(
            admin, sorted(brokers), sorted({t for t, _ in plan})
        )
        out = err_console if as_json else console  # --json keeps stdout one document
        if cleared_brokers:
            out.print(
                f"Cleared the throttle rates of brokers {','.join(map(str, cleared_brokers))}."
            )
        if cleared_topics:
            out.print(f"Cleared the throttled replicas of topics {','.join(cleared_topics)}.")


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
