"""The ``raftlog`` command line."""

from __future__ import annotations

import sys

if __name__ == "__main__":  # a node or a command of its own (``python -m dataplane.tools.cli``)
    from dataplane.tools.entry import keep_hypothesis_out

    keep_hypothesis_out()

import json
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dataplane.client import TopicPartition
from dataplane.tools.broker_membership import decommission, rebalance_leaders
from dataplane.tools.check_data import check_node_dir, format_report
from dataplane.tools.client_commands import (
    DEFAULT_BOOTSTRAP,
    BootstrapOption,
    JsonOption,
    admin_client,
    kafka_errors,
    print_json,
    topic_app,
)
from dataplane.tools.client_commands import register as register_client_commands
from dataplane.tools.cluster_demo import main as cluster_demo
from dataplane.tools.cluster_status import cluster_status_rows
from dataplane.tools.command_config import (
    ENVIRONMENT_VARIABLE,
    CommandConfigError,
    use_command_config,
)
from dataplane.tools.config_commands import configs_app
from dataplane.tools.console_command import console_command
from dataplane.tools.extras import EXTRAS, install_command, missing_extra_message, missing_modules
from dataplane.tools.group_commands import group_app
from dataplane.tools.local_cluster import LocalCluster, detached_launcher
from dataplane.tools.partition_commands import partitions_app
from dataplane.tools.process_tuning import tune_process
from dataplane.tools.quorum_commands import quorum_app
from dataplane.tools.records_commands import topic_delete_records
from dataplane.tools.security_commands import acl_app, user_app
from dataplane.tools.storage_demo import run_demo
from dataplane.tools.transaction_commands import transactions_app
from raftlog.batch import HEADER_SIZE, BatchHeader, read_header
from raftlog.errors import KafkaError
from raftlog.records import decode_batch
from raftlog.txn import read_marker

app = typer.Typer(help="raftlog: a Kafka-style streaming log.", no_args_is_help=True)
demo_app = typer.Typer(help="End-to-end demonstrations.", no_args_is_help=True)
log_app = typer.Typer(help="Inspect log directories on disk.", no_args_is_help=True)
app.add_typer(demo_app, name="demo")
app.add_typer(log_app, name="log")
cluster_app = typer.Typer(help="A local cluster on 127.0.0.11-13.", no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")
app.add_typer(group_app, name="group")
app.add_typer(partitions_app, name="partitions")
app.add_typer(quorum_app, name="quorum")
app.add_typer(transactions_app, name="transactions")
app.add_typer(acl_app, name="acl")
app.add_typer(user_app, name="user")
app.add_typer(configs_app, name="configs")
app.command("console")(console_command)
register_client_commands(app)
topic_app.command("delete-records")(topic_delete_records)
console = Console()


@app.callback()
def root(
    command_config: Annotated[
        Path | None,
        typer.Option(
            "--command-config",
            envvar=ENVIRONMENT_VARIABLE,
            dir_okay=False,
            show_default=False,
            help="client properties (security.protocol, sasl.*, ssl.*) for every command that "
            "connects, as Kafka's tools take them; cluster up --secure writes one",
        ),
    ] = None,
) -> None:
    """raftlog: a Kafka-style streaming log."""
    try:
        use_command_config(command_config)
    except CommandConfigError as error:
        raise typer.BadParameter(str(error), param_hint="--command-config") from None


CLUSTER_ROOT = Path(".raftlog/cluster")

NodesOption = Annotated[
    int | None,
    typer.Option(
        "--nodes", min=1, max=9, show_default=False,
        help="nodes of a new cluster (default 3); an existing one's come from cluster.json",
    ),
]  # fmt: skip
RootOption = Annotated[Path, typer.Option("--root", help="cluster directory")]
DEFAULT_NODES = 3


def local_cluster(nodes: int | None, root: Path, secure: bool | None = None) -> LocalCluster:
    """The ``cluster`` commands' cluster: the one recorded in ``root/cluster.json`` (with the
    nodes added and removed since it started), else a new one of ``nodes`` (3), secure if
    ``secure``. Its nodes outlive the command that starts them."""
    recorded = LocalCluster.from_state(root, launcher=detached_launcher)
    if recorded is None:
        return LocalCluster(
            root, nodes=nodes or DEFAULT_NODES, launcher=detached_launcher, secure=bool(secure)
        )
    if secure is not None and secure != recorded.secure:
        mode = "a secure" if recorded.secure else "a plaintext"
        raise typer.BadParameter(
            f"{root} holds {mode} cluster (cluster.json): a cluster keeps its mode; give "
            "another --root",
            param_hint="--secure",
        )
    ids = [s.node_id for s in recorded.specs]
    if nodes is not None and nodes != len(ids):
        raise typer.BadParameter(
            f"{root} holds a cluster of nodes {','.join(map(str, ids))} (cluster.json): leave "
            "out --nodes, or give another --root",
            param_hint="--nodes",
        )
    return recorded


@app.command("node")
def node(
    config: Annotated[Path, typer.Option("--config", exists=True, dir_okay=False)],
) -> None:
    """Run one node (controller and/or broker) until SIGTERM."""
    # the node's modules (~0.4 s of imports) load for this command only, not for every command
    # (the console script runs ``node --config FILE`` itself: dataplane/tools/node_command.py)
    from dataplane.tools.node_command import run_node  # noqa: PLC0415

    status = run_node(config)
    if status:
        raise typer.Exit(status)


@cluster_app.command("up")
def cluster_up(
    nodes: NodesOption = None,
    root: RootOption = CLUSTER_ROOT,
    secure: Annotated[
        bool | None,
        typer.Option(
            "--secure/--plaintext",
            show_default=False,
            help="a new cluster with TLS (the Raft transport's too), SCRAM and ACLs "
            "(certificates and secrets under ROOT/secrets); default: as recorded, else plaintext",
        ),
    ] = None,
) -> None:
    """Start the nodes (those not running) and wait for an active controller."""
    cluster = local_cluster(nodes, root, secure)
    cluster.up()
    _print_status(cluster)
    consoles = [cluster.console_url(s.node_id) for s in cluster.specs]
    if any(consoles):
        urls = ", ".join(u for u in consoles if u)
        login = " (log in as a SCRAM user, e.g. admin)" if cluster.secure else ""
        console.print(f"web console: {urls}{login}", highlight=False, soft_wrap=True)
    if cluster.schema_registry_urls:
        urls = ",".join(cluster.schema_registry_urls)
        console.print(f"schema registry (schema.registry.url): {urls}", highlight=False,
                      soft_wrap=True)  # fmt: skip
    if cluster.secure:
        _print_client_settings(cluster)


def _print_client_settings(cluster: LocalCluster) -> None:
    """Where the secure cluster's client settings are, and the same as a Python dict."""
    settings = {"bootstrap.servers": ",".join(cluster.bootstrap_servers)}
    settings.update(cluster.client_settings)
    kafka = {**settings, "bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers)}
    properties = cluster.secrets.client_properties
    console.print(
        f"secure cluster: clients log in as SCRAM user admin over TLS\n"
        f"  properties file (librdkafka, Java, raftlog --command-config): {properties}\n"
        f"  raftlog commands: export RAFTLOG_COMMAND_CONFIG={properties}",
        highlight=False, soft_wrap=True,
    )  # fmt: skip
    print(f"  our client: Producer(servers, security=ClientSecurity.from_properties({settings!r}))")
    print(f"  confluent-kafka (KAFKA listener): Producer({kafka!r})")


@cluster_app.command("down")
def cluster_down(nodes: NodesOption = None, root: RootOption = CLUSTER_ROOT) -> None:
    """Stop every node by its pid (SIGTERM, then SIGKILL after 10 s)."""
    local_cluster(nodes, root).down()
    console.print("cluster stopped")


@cluster_app.command("status")
def cluster_status(
    nodes: NodesOption = None,
    root: RootOption = CLUSTER_ROOT,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Nodes, pids, the active controller and each voter's replication lag."""
    _print_status(local_cluster(nodes, root), as_json)


@cluster_app.command("kill")
def cluster_kill(node_id: int, nodes: NodesOption = None, root: RootOption = CLUSTER_ROOT) -> None:
    """SIGKILL one node."""
    local_cluster(nodes, root).stop_node(node_id, kill=True)


@cluster_app.command("restart")
def cluster_restart(
    node_id: int, nodes: NodesOption = None, root: RootOption = CLUSTER_ROOT
) -> None:
    """Stop one node (SIGTERM) and start it again."""
    local_cluster(nodes, root).restart_node(node_id)


def _existing_cluster(root: Path) -> LocalCluster:
    cluster = LocalCluster.from_state(root, launcher=detached_launcher)
    if cluster is None:
        raise typer.BadParameter(
            f"no cluster in {root}: raftlog cluster up first", param_hint="--root"
        )
    return cluster


@cluster_app.command("add-node")
def cluster_add_node(root: RootOption = CLUSTER_ROOT, as_json: JsonOption = False) -> None:
    """Start a broker-only node on the cluster's next address; wait until it is unfenced."""
    cluster = _existing_cluster(root)
    if all(cluster.pid(s.node_id) is None for s in cluster.controller_specs):
        print(f"error: no controller of {root} runs: raftlog cluster up first", file=sys.stderr)
        raise typer.Exit(1)
    try:
        node_id = cluster.add_node()
    except (ValueError, OSError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise typer.Exit(1) from error
    added = {
        "node": node_id, "address": cluster.broker_address(node_id),
        "kafka_address": cluster.kafka_address(node_id), "pid": cluster.pid(node_id),
    }  # fmt: skip
    if as_json:
        print_json(added)
        return
    console.print(
        f"node {node_id} (broker) started on {added['address']} "
        f"(KAFKA {added['kafka_address']}), pid {added['pid']}: registered and unfenced"
    )
    console.print("it hosts no partition yet: move some with raftlog partitions reassign")


@cluster_app.command("remove-node")
def cluster_remove_node(
    node_id: int,
    root: RootOption = CLUSTER_ROOT,
    timeout_s: Annotated[
        float, typer.Option("--timeout-s", min=1, help="how long the moves may take")
    ] = 600.0,
    force: Annotated[
        bool, typer.Option("--force", help="stop and unregister it even if the drain fails")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Cordon a broker-only node, move every replica off it, stop it (controlled shutdown),
    unregister it."""
    cluster = _existing_cluster(root)
    try:
        cluster.spec(node_id)
    except KeyError as error:
        raise typer.BadParameter(str(error.args[0]), param_hint="NODE_ID") from error

    def started(moves: dict[TopicPartition, tuple[tuple[int, ...], tuple[int, ...]]]) -> None:
        if not as_json:
            console.print(f"moving {len(moves)} replicas off broker {node_id}:")
            for tp, (replicas, target) in sorted(moves.items()):
                console.print(f"  {tp.topic}-{tp.partition}: {_ids(replicas)} -> {_ids(target)}")

    def report(line: str) -> None:  # with --json, stdout carries the document alone
        if as_json:
            print(line, file=sys.stderr)
        else:
            console.print(line)

    with kafka_errors():
        try:
            done = decommission(cluster, node_id, timeout_s, force, started, report)
        except (ValueError, TimeoutError) as error:
            print(f"error: {error}", file=sys.stderr)
            raise typer.Exit(1) from error
    if as_json:
        print_json({
            "node": node_id, "drain_s": round(done.drain_s, 3), "drained": done.drained,
            "unregistered": done.unregistered,
            "moves": [
                {"topic": tp.topic, "partition": tp.partition, "replicas": list(r),
                 "target": list(t)}
                for tp, (r, t) in sorted(done.moves.items())
            ],
        })  # fmt: skip
        return
    console.print(
        f"broker {node_id} drained in {done.drain_s:.1f} s ({len(done.moves)} replicas moved), "
        f"node {node_id} stopped (controlled shutdown), "
        + ("broker unregistered" if done.unregistered else "broker was not registered")
        + f"; its directory {cluster.root / f'node-{node_id}'} stays"
    )


def _ids(ids: tuple[int, ...]) -> str:
    return ",".join(map(str, ids))


def _set_cordon(broker_id: int, cordoned: bool, bootstrap: str, as_json: bool) -> None:
    with kafka_errors(), admin_client(bootstrap) as admin:
        admin.cordon_broker(broker_id, cordoned)
        hosted = sum(
            broker_id in p.replicas for t in admin.describe_topics().values() for p in t.partitions
        )
    if as_json:
        print_json({"broker": broker_id, "cordoned": cordoned, "replicas": hosted})
    elif cordoned:
        console.print(
            f"broker {broker_id} cordoned: no new replicas are placed on it; it keeps its "
            f"replicas ({hosted}) and their leaderships"
        )
    else:
        console.print(f"broker {broker_id} uncordoned: new replicas may be placed on it")


@cluster_app.command("cordon")
def cluster_cordon(
    broker_id: int, bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP, as_json: JsonOption = False
) -> None:
    """Place no new replicas on a broker (it keeps its own); remove-node does this first."""
    _set_cordon(broker_id, True, bootstrap, as_json)


@cluster_app.command("uncordon")
def cluster_uncordon(
    broker_id: int, bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP, as_json: JsonOption = False
) -> None:
    """Lift a broker's cordon: placement may put new replicas on it again."""
    _set_cordon(broker_id, False, bootstrap, as_json)


@cluster_app.command("rebalance-leaders")
def cluster_rebalance_leaders(
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP, as_json: JsonOption = False
) -> None:
    """Move leadership back to every partition's preferred replica (ElectLeaders PREFERRED)."""
    with kafka_errors(), admin_client(bootstrap) as admin:
        done = rebalance_leaders(admin)
    if as_json:
        print_json({
            "moved": [
                {"topic": m.topic, "partition": m.partition, "from": m.leader_before,
                 "to": m.leader}
                for m in done.moved
            ],
            "not_available": [f"{tp.topic}-{tp.partition}" for tp in done.not_available],
            "errors": {f"{tp.topic}-{tp.partition}": e.message for tp, e in done.failed.items()},
            "leaders": {str(b): n for b, n in done.leaders.items()},
        })  # fmt: skip
    else:
        table = Table("TOPIC", "PARTITION", "FROM", "TO", title="leadership moved")
        for m in done.moved:
            table.add_row(m.topic, str(m.partition), str(m.leader_before), str(m.leader))
        if done.moved:
            console.print(table)
        console.print(f"{len(done.moved)} leaderships moved to their preferred replicas")
        if done.not_available:
            names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in done.not_available)
            console.print(f"preferred replica not in the ISR: {names}")
        leaders = " ".join(f"{b}={n}" for b, n in done.leaders.items())
        console.print(f"leaders per broker: {leaders}")
    for tp, error in sorted(done.failed.items()):
        print(
            f"{tp.topic}-{tp.partition}: error: {error.error.name}: {error.message}",
            file=sys.stderr,
        )
    if done.failed:
        raise typer.Exit(1)


def _print_status(cluster: LocalCluster, as_json: bool = False) -> None:
    rows = cluster_status_rows(cluster)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    columns = ("node", "address", "pid", "role", "match", "lag", "broker")
    table = Table(
        "node", "controller", "pid", "role", "match index", "lag", "broker", title="cluster"
    )
    for row in rows:
        table.add_row(*(str(row[k]) for k in columns))
    console.print(table)


@demo_app.command("storage")
def demo_storage(
    records: Annotated[int, typer.Option(help="records to write in all")] = 1_000_000,
    partitions: Annotated[int, typer.Option(min=1, max=64)] = 4,
    keep: Annotated[bool, typer.Option(help="keep the data directory afterwards")] = False,
) -> None:
    """Write, SIGKILL mid-way, recover, verify, finish, compact; print what happened."""
    run_demo(Path(".raftlog/demo"), total_records=records, partitions=partitions, keep=keep)


@demo_app.command("cluster")
def demo_cluster(
    records: Annotated[int, typer.Option(help="records to produce", min=1000)] = 200_000,
) -> None:
    """3 nodes, acks=all writes, SIGKILL of a leader half-way; every acknowledged record back."""
    raise typer.Exit(cluster_demo(Path(".raftlog/demo-cluster"), records))


@log_app.command("dump")
def log_dump(
    segment: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="a .log file")],
    records: Annotated[bool, typer.Option(help="also decode every record")] = False,
    limit: Annotated[int, typer.Option(min=1, help="batches to show at most")] = 1000,
) -> None:
    """Print the batches of a segment file, like kafka-dump-log.sh."""
    data = segment.read_bytes()
    table = Table(
        "position",
        "base offset",
        "last offset",
        "count",
        "epoch",
        "size",
        "compression",
        "max timestamp",
        "producer id",
        "producer epoch",
        "transaction",
    )
    position, shown = 0, 0
    while position + HEADER_SIZE <= len(data) and shown < limit:
        header = read_header(data, position)
        table.add_row(
            *(
                str(v)
                for v in (
                    position,
                    header.base_offset,
                    header.last_offset,
                    header.record_count,
                    header.partition_leader_epoch,
                    header.size_bytes,
                    header.compression,
                    header.max_timestamp,
                    header.producer_id,
                    header.producer_epoch,
                    _transaction_column(data, position, header),
                )
            )
        )
        if records and not header.is_control:
            for record in decode_batch(data[position : position + header.size_bytes])[1]:
                table.add_row(
                    "",
                    str(record.offset),
                    "",
                    "",
                    "",
                    "",
                    "",
                    str(record.timestamp),
                    f"key={record.key!r} value={(record.value or b'')[:40]!r}",
                )
        position += header.size_bytes
        shown += 1
    console.print(table)
    if position < len(data) and shown < limit:
        console.print(f"[red]{len(data) - position} trailing bytes do not form a batch[/red]")


def _transaction_column(data: bytes, position: int, header: BatchHeader) -> str:
    """kafka-dump-log.sh's isTransactional / isControl / endTxnMarker, in one column."""
    if not header.is_transactional:
        return ""
    if not header.is_control:
        return "transactional"
    try:
        marker = read_marker(data, position)
    except KafkaError as error:
        return f"control: {error.message}"
    verb = "COMMIT" if marker.commit else "ABORT"
    return f"{verb} marker (coordinator epoch {marker.coordinator_epoch})"


@app.command("check-data")
def check_data(
    data_dir: Annotated[
        Path, typer.Argument(exists=True, file_okay=False, help="a stopped node's log.dirs")
    ],
) -> None:
    """Check a stopped node's files (CRCs below the log end, indexes, checkpoints, the metadata
    journal); exit 1 with each problem printed, like kafka-dump-log --verify for a node."""
    report = check_node_dir(data_dir)
    print(format_report(report, data_dir))
    if not report.ok:
        raise typer.Exit(1)


PLUGIN_GROUP = "raftlog.cli"
# The extra each plugin's commands need (``mirror`` runs on the Connect runtime).
PLUGIN_EXTRAS = {"chaos": "chaos", "connect": "connect", "mirror": "connect"}


def add_plugin_commands() -> None:
    """Add the command groups other installed packages declare under the ``raftlog.cli``
    entry-point group (``chaos`` comes from the chaos package, which sits above dataplane and
    so cannot be imported from here by name). A plugin that fails to load is reported on
    stderr and left out: a broken ``raftlog connect`` must not stop ``raftlog node``. A plugin
    whose extra is not installed gets a stand-in that names the extra (see ``add_stand_in``)."""
    for entry in entry_points(group=PLUGIN_GROUP):
        extra = PLUGIN_EXTRAS.get(entry.name)
        try:
            command_group = entry.load()
        except ModuleNotFoundError as error:
            top = (error.name or "").partition(".")[0]
            if extra is not None and top in EXTRAS[extra]:
                add_stand_in(entry.name, f"The {entry.name} commands.", extra, [top])
            else:
                report_unloaded(entry.name, entry.value, error)
            continue
        except ImportError as error:
            report_unloaded(entry.name, entry.value, error)
            continue
        # The plugins import their extra's modules only when a command runs, so loading
        # succeeds without them: ask whether they are there before offering the commands.
        missing = missing_modules(extra) if extra is not None else []
        if extra is not None and missing:
            about = command_group.info.help if isinstance(command_group, typer.Typer) else None
            if not isinstance(about, str) or not about.strip():
                about = f"The {entry.name} commands."
            add_stand_in(entry.name, about, extra, missing)
        else:
            app.add_typer(command_group, name=entry.name)


def report_unloaded(name: str, value: str, error: ImportError) -> None:
    print(f"raftlog: the {name!r} commands ({value}) did not load: {error}", file=sys.stderr)


def add_stand_in(name: str, about: str, extra: str, missing: list[str]) -> None:
    """A command ``name`` in place of a plugin whose extra is missing: ``raftlog --help`` lists
    it with what it is and the extra it needs; run with any arguments (``--help`` too), it
    prints one line naming the extra on stderr and exits 2, like a usage error."""
    message = missing_extra_message(f"raftlog {name}", extra, missing)
    summary = f"{about.strip().splitlines()[0]} Needs {install_command(extra)}."

    @app.command(
        name,
        help=escape(summary),
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    def stand_in() -> None:
        print(message, file=sys.stderr)
        raise typer.Exit(2)


def main() -> None:
    # produce, consume and perf move megabytes a second, and their records in flight made
    # full collections frequent (a node applies its own settings anyway)
    tune_process()
    add_plugin_commands()
    app()


if __name__ == "__main__":
    main()
