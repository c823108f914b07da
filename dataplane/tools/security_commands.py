"""``raftlog acl`` and ``raftlog user``: ACLs and SCRAM credentials (docs/security.md).

``acl add|list|remove`` take kafka-acls.sh's options: ``--allow-principal``/``--deny-principal``
with ``--allow-host``/``--deny-host`` (default ``*``), ``--operation`` (repeatable, default All),
the resources ``--topic``, ``--group``, ``--transactional-id`` (each repeatable) and
``--cluster``, ``--resource-pattern-type`` and the ``--producer``/``--consumer`` conveniences.
``user set-password|list|delete`` manage SCRAM credentials as kafka-configs.sh's
``--entity-type users --alter --add-config 'SCRAM-SHA-512=[...]'`` does; the password is read
from a prompt (not echoed), ``--password-file`` or standard input, and only its salted hash
leaves this process.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dataplane.client.admin import (
    AclBinding,
    AclFilter,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from dataplane.tools.client_commands import (
    DEFAULT_BOOTSTRAP,
    BootstrapOption,
    JsonOption,
    admin_client,
    console,
    kafka_errors,
    print_json,
)
from metadata_quorum.security.acl import (
    CLUSTER_NAME,
    WILDCARD,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from metadata_quorum.security.principal import KafkaPrincipal
from metadata_quorum.security.scram import ScramMechanism

__all__ = ["acl_app", "user_app"]

acl_app = typer.Typer(help="Add, list and remove ACLs (kafka-acls.sh).", no_args_is_help=True)
user_app = typer.Typer(help="SCRAM credentials of users.", no_args_is_help=True)

Names = list[str] | None
TopicOption = Annotated[Names, typer.Option("--topic", help="a topic, repeatable")]
GroupOption = Annotated[Names, typer.Option("--group", help="a consumer group, repeatable")]
TxnOption = Annotated[
    Names, typer.Option("--transactional-id", help="a transactional id, repeatable")
]
ClusterOption = Annotated[bool, typer.Option("--cluster", help="the cluster resource")]
PatternOption = Annotated[
    str,
    typer.Option(
        "--resource-pattern-type",
        help="literal | prefixed (add); also any | match (list, remove)",
    ),
]
OperationOption = Annotated[
    Names, typer.Option("--operation", help="Read, Write, Describe, All, ... (repeatable)")
]


def _operation(name: str) -> AclOperation:
    wanted = name.replace("_", "").replace("-", "").lower()
    for op in AclOperation:
        if op not in (AclOperation.UNKNOWN, AclOperation.ANY) and (
            op.name.replace("_", "").lower() == wanted
        ):
            return op
    raise typer.BadParameter(f"unknown operation {name!r}", param_hint="--operation")


def _pattern(name: str, filters: bool) -> PatternType:
    allowed = ("literal", "prefixed", "any", "match") if filters else ("literal", "prefixed")
    if name.lower() not in allowed:
        raise typer.BadParameter(
            f"use one of {', '.join(allowed)}", param_hint="--resource-pattern-type"
        )
    return PatternType[name.upper()]


def _principal(text: str) -> str:
    try:
        return str(KafkaPrincipal.parse(text))
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--allow-principal") from None


def _resources(
    topics: Names, groups: Names, transactional_ids: Names, cluster: bool
) -> list[tuple[ResourceType, str]]:
    found = [(ResourceType.TOPIC, t) for t in topics or ()]
    found += [(ResourceType.GROUP, g) for g in groups or ()]
    found += [(ResourceType.TRANSACTIONAL_ID, t) for t in transactional_ids or ()]
    if cluster:
        found.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return found


def _operations_by_resource(
    resources: list[tuple[ResourceType, str]], operations: Names, producer: bool, consumer: bool
) -> list[tuple[ResourceType, str, AclOperation]]:
    """kafka-acls.sh's --producer (WRITE, DESCRIBE, CREATE on topics; WRITE, DESCRIBE on
    transactional ids) and --consumer (READ, DESCRIBE on topics; READ on groups)."""
    if not (producer or consumer):
        ops = [_operation(o) for o in operations or ["All"]]
        return [(t, n, op) for (t, n), op in itertools.product(resources, ops)]
    if operations:
        raise typer.BadParameter("--producer and --consumer name their own operations")
    if consumer and not any(t == ResourceType.GROUP for t, _ in resources):
        raise typer.BadParameter("--consumer needs --group", param_hint="--consumer")
    by_type: dict[ResourceType, list[AclOperation]] = {}
    if producer:
        by_type[ResourceType.TOPIC] = [
            AclOperation.WRITE,
            AclOperation.DESCRIBE,
            AclOperation.CREATE,
        ]
        by_type[ResourceType.TRANSACTIONAL_ID] = [AclOperation.WRITE, AclOperation.DESCRIBE]
    if consumer:
        for op in (AclOperation.READ, AclOperation.DESCRIBE):
            if op not in by_type.setdefault(ResourceType.TOPIC, []):
                by_type[ResourceType.TOPIC].append(op)
        by_type[ResourceType.GROUP] = [AclOperation.READ]
    return [(t, n, op) for t, n in resources for op in by_type.get(t, [])]


def _entries(
    allow_principals: Names, deny_principals: Names, allow_hosts: Names, deny_hosts: Names
) -> list[tuple[str, str, PermissionType]]:
    if allow_hosts and not allow_principals:
        raise typer.BadParameter("--allow-host needs --allow-principal")
    if deny_hosts and not deny_principals:
        raise typer.BadParameter("--deny-host needs --deny-principal")
    entries = [
        (_principal(p), h, PermissionType.ALLOW)
        for p in allow_principals or ()
        for h in allow_hosts or [WILDCARD]
    ]
    entries += [
        (_principal(p), h, PermissionType.DENY)
        for p in deny_principals or ()
        for h in deny_hosts or [WILDCARD]
    ]
    return entries


def _row(b: AclBinding) -> dict[str, str]:
    return {
        "principal": b.principal,
        "host": b.host,
        "operation": b.operation.name,
        "permission": b.permission.name,
        "resource_type": b.resource_type.name,
        "resource_name": b.resource_name,
        "pattern_type": b.pattern_type.name,
    }


def _print_acls(bindings: list[AclBinding], as_json: bool) -> None:
    if as_json:
        print_json([_row(b) for b in bindings])
        return
    table = Table(
        "PRINCIPAL", "HOST", "OPERATION", "PERMISSION", "RESOURCE-TYPE", "RESOURCE-NAME",
        "PATTERN-TYPE",
    )  # fmt: skip
    for b in bindings:
        table.add_row(*_row(b).values())
    console.print(table)


@acl_app.command("add")
def acl_add(
    allow_principal: Annotated[
        Names, typer.Option("--allow-principal", help="User:NAME, repeatable")
    ] = None,
    deny_principal: Annotated[
        Names, typer.Option("--deny-principal", help="User:NAME, repeatable")
    ] = None,
    allow_host: Annotated[Names, typer.Option("--allow-host", help="default *")] = None,
    deny_host: Annotated[Names, typer.Option("--deny-host", help="default *")] = None,
    operation: OperationOption = None,
    topic: TopicOption = None,
    group: GroupOption = None,
    transactional_id: TxnOption = None,
    cluster: ClusterOption = False,
    resource_pattern_type: PatternOption = "literal",
    producer: Annotated[bool, typer.Option("--producer", help="WRITE, DESCRIBE, CREATE")] = False,
    consumer: Annotated[
        bool, typer.Option("--consumer", help="READ, DESCRIBE; group READ")
    ] = False,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Add ACLs: every principal x host x operation x resource given."""
    pattern = _pattern(resource_pattern_type, filters=False)
    entries = _entries(allow_principal, deny_principal, allow_host, deny_host)
    if not entries:
        raise typer.BadParameter("give --allow-principal or --deny-principal")
    resources = _resources(topic, group, transactional_id, cluster)
    if not resources:
        raise typer.BadParameter("give a resource: --topic, --group, --transactional-id, --cluster")
    bindings = [
        AclBinding(rtype, name, pattern, principal, host, op, permission)
        for rtype, name, op in _operations_by_resource(resources, operation, producer, consumer)
        for principal, host, permission in entries
    ]
    with kafka_errors(), admin_client(bootstrap) as admin:
        results = admin.create_acls(bindings)
    failed = {b: e for b, e in results.items() if e is not None}
    for binding, error in failed.items():
        print(f"{binding}: {error.error.name}: {error.message}", file=sys.stderr)
    created = [b for b in bindings if results.get(b) is None]
    if created or as_json or not failed:
        _print_acls(list(dict.fromkeys(created)), as_json)
    if failed:
        raise typer.Exit(1)


def _filters(
    principal: Names, topics: Names, groups: Names, transactional_ids: Names, cluster: bool,
    pattern: PatternType, operations: Names,
) -> list[AclFilter]:  # fmt: skip
    resources = _resources(topics, groups, transactional_ids, cluster)
    ops = [_operation(o) for o in operations or ()] or [AclOperation.ANY]
    principals: list[str | None] = [_principal(p) for p in principal or ()] or [None]
    if not resources:
        return [AclFilter(principal=p, operation=op) for p in principals for op in ops]
    return [
        AclFilter(rtype, name, pattern, p, None, op)
        for rtype, name in resources
        for p in principals
        for op in ops
    ]


@acl_app.command("list")
def acl_list(
    principal: Annotated[Names, typer.Option("--principal", help="only this principal")] = None,
    topic: TopicOption = None,
    group: GroupOption = None,
    transactional_id: TxnOption = None,
    cluster: ClusterOption = False,
    resource_pattern_type: PatternOption = "literal",
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """The ACLs of the resources given (every ACL without one); with
    ``--resource-pattern-type match``, every ACL that applies to them (prefixes, wildcards)."""
    pattern = _pattern(resource_pattern_type, filters=True)
    filters = _filters(principal, topic, group, transactional_id, cluster, pattern, None)
    found: dict[AclBinding, None] = {}
    with kafka_errors(), admin_client(bootstrap) as admin:
        for acl_filter in filters:
            found.update(dict.fromkeys(admin.describe_acls(acl_filter)))
    _print_acls(sorted(found), as_json)


@acl_app.command("remove")
def acl_remove(
    allow_principal: Annotated[Names, typer.Option("--allow-principal")] = None,
    deny_principal: Annotated[Names, typer.Option("--deny-principal")] = None,
    allow_host: Annotated[Names, typer.Option("--allow-host")] = None,
    deny_host: Annotated[Names, typer.Option("--deny-host")] = None,
    operation: OperationOption = None,
    topic: TopicOption = None,
    group: GroupOption = None,
    transactional_id: TxnOption = None,
    cluster: ClusterOption = False,
    resource_pattern_type: PatternOption = "literal",
    force: Annotated[bool, typer.Option("--force", help="do not ask for confirmation")] = False,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Remove the ACLs matching the options (no principal: every principal's)."""
    pattern = _pattern(resource_pattern_type, filters=True)
    if not _resources(topic, group, transactional_id, cluster):
        raise typer.BadParameter("give a resource: --topic, --group, --transactional-id, --cluster")
    ops = [_operation(o) for o in operation or ()] or [AclOperation.ANY]
    # as kafka-acls.sh: a principal without --allow-host/--deny-host means host *
    entries: list[tuple[str | None, str | None, PermissionType]] = [
        *_entries(allow_principal, deny_principal, allow_host, deny_host)
    ] or [(None, None, PermissionType.ANY)]
    filters = [
        AclFilter(rtype, name, pattern, principal, host, op, permission)
        for rtype, name in _resources(topic, group, transactional_id, cluster)
        for principal, host, permission in entries
        for op in ops
    ]
    if not force and not typer.confirm("Remove the matching ACLs?", default=False):
        raise typer.Exit(1)
    with kafka_errors(), admin_client(bootstrap) as admin:
        results = admin.delete_acls(filters)
    removed: dict[AclBinding, None] = {}
    failed = False
    for result in results.values():
        if result.error is not None:
            print(f"{result.error.error.name}: {result.error.message}", file=sys.stderr)
            failed = True
        removed.update(dict.fromkeys(result.deleted))
    _print_acls(sorted(removed), as_json)
    if failed:
        raise typer.Exit(1)


# -- users -----------------------------------------------------------------------------------------
def _mechanism(name: str) -> ScramMechanism:
    if name.upper() not in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        raise typer.BadParameter("SCRAM-SHA-256 or SCRAM-SHA-512", param_hint="--mechanism")
    return ScramMechanism.from_name(name)


def _read_password(password_file: Path | None) -> str:
    """From the file ('-': standard input), else a prompt when standard input is a terminal,
    else standard input's first line."""
    if password_file is not None and str(password_file) != "-":
        text = password_file.read_text().splitlines()
        password = text[0] if text else ""
    elif password_file is None and sys.stdin.isatty():
        password = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise typer.BadParameter("the password is empty")
    return password


@user_app.command("set-password")
def user_set_password(
    name: Annotated[str, typer.Argument(help="the user (its principal is User:NAME)")],
    mechanism: Annotated[
        str, typer.Option("--mechanism", help="SCRAM-SHA-256 | SCRAM-SHA-512")
    ] = "SCRAM-SHA-512",
    iterations: Annotated[int, typer.Option("--iterations", min=4096, max=16384)] = 4096,
    password_file: Annotated[
        Path | None,
        typer.Option("--password-file", help="first line is the password; - = standard input"),
    ] = None,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Set (or replace) a user's SCRAM credential; only the salted hash is sent."""
    scram = _mechanism(mechanism)
    upsertion = UserScramCredentialUpsertion(name, scram, _read_password(password_file), iterations)
    with kafka_errors(), admin_client(bootstrap) as admin:
        error = admin.alter_user_scram_credentials([upsertion]).get(name)
    if error is not None:
        print(f"user {name}: {error.error.name}: {error.message}", file=sys.stderr)
        raise typer.Exit(1)
    if as_json:
        print_json({"user": name, "mechanism": scram.mechanism_name, "iterations": iterations})
        return
    console.print(
        f"set the {scram.mechanism_name} credential of user {name} ({iterations} iterations)"
    )


@user_app.command("list")
def user_list(
    names: Annotated[list[str] | None, typer.Argument(help="users (default: every user)")] = None,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Users with SCRAM credentials: mechanisms and iterations (never keys)."""
    with kafka_errors(), admin_client(bootstrap) as admin:
        described = admin.describe_user_scram_credentials(names or None)
    rows = [
        {"user": user, "mechanism": info.mechanism.mechanism_name, "iterations": info.iterations}
        for user, infos in sorted(described.items())
        for info in infos
    ]
    if as_json:
        print_json(rows)
        return
    table = Table("USER", "MECHANISM", "ITERATIONS")
    for row in rows:
        table.add_row(str(row["user"]), str(row["mechanism"]), str(row["iterations"]))
    console.print(table)


@user_app.command("delete")
def user_delete(
    name: Annotated[str, typer.Argument(help="the user")],
    mechanism: Annotated[list[str], typer.Option("--mechanism", help="repeatable")],
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
) -> None:
    """Delete a user's credential for each mechanism given (one request each: a request
    names a user once, KIP-554)."""
    mechanisms = list(dict.fromkeys(_mechanism(m) for m in mechanism))
    with kafka_errors(), admin_client(bootstrap) as admin:
        for scram in mechanisms:
            deletion = UserScramCredentialDeletion(name, scram)
            error = admin.alter_user_scram_credentials(deletions=[deletion]).get(name)
            if error is not None:
                print(f"user {name}: {error.error.name}: {error.message}", file=sys.stderr)
                raise typer.Exit(1)
            console.print(f"deleted the {scram.mechanism_name} credential of user {name}")
