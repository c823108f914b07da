"""``raftlog chaos run|report|sweep``: the chaos harness on the command line.

The ``raftlog`` command finds this group through the ``raftlog.cli`` entry point. This module
imports only typer and rich at load time (every ``raftlog`` invocation, node processes
included, loads it); the harness itself is imported when a command runs.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console

chaos_app = typer.Typer(
    help="Kill, pause and partition a real cluster under load; check nothing acknowledged is lost.",
    no_args_is_help=True,
)
console = Console()


def _interrupt_on_signals() -> None:
    """SIGTERM unwinds like Ctrl-C, so every cleanup (`finally`, contexts) runs; and so does
    SIGINT in a run started in the background, which inherits SIGINT ignored (Python then
    leaves it so): a harness that interrupts its run with SIGINT still gets its rules removed
    and its nodes stopped."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


@chaos_app.command("run")
def run_command(
    seed: Annotated[int, typer.Option(help="the schedule's seed: the same seed, the same run")] = 1,
    duration: Annotated[str, typer.Option(help="how long the workloads run: 90s, 10m")] = "10m",
    faults: Annotated[
        str,
        typer.Option(
            help="comma-separated: kill,pause,partition,controller-kill,leader-kill,disk-full,"
            "reassign,membership,power-loss; also power-loss-all (every node at once); with "
            "--workload transactions also txn-coordinator-kill,output-leader-kill,"
            "transformer-kill"
        ),
    ] = "kill,pause,partition,controller-kill,leader-kill,disk-full,reassign,membership,power-loss",
    nodes: Annotated[int, typer.Option(min=3, max=9, help="nodes in the cluster")] = 3,
    report: Annotated[Path, typer.Option(help="where report.json and report.html go")] = Path(
        ".raftlog/chaos/report"
    ),
    work_dir: Annotated[Path, typer.Option(help="the cluster's data and logs")] = Path(
        ".raftlog/chaos/cluster"
    ),
    first_host: Annotated[
        int, typer.Option(min=2, max=245, help="nodes bind 127.0.0.N, N+1, ...")
    ] = 41,
    spare_host: Annotated[
        int | None,
        typer.Option(
            min=2,
            max=254,
            help="a membership fault's new controller binds 127.0.0.N (default: after the nodes)",
        ),
    ] = None,
    partitions: Annotated[int, typer.Option(min=1, help="partitions of the workload topic")] = 6,
    rate: Annotated[float, typer.Option(min=1, help="records a second per producer")] = 150.0,
    disk_mib: Annotated[
        int, typer.Option(min=16, help="each node's disk (a tmpfs) when disk-full is a fault")
    ] = 512,
    workload: Annotated[
        str,
        typer.Option(
            help="plain, or transactions: also a consume-transform-produce loop in transactions"
        ),
    ] = "plain",
    transformers: Annotated[
        int, typer.Option(min=1, max=8, help="transformer processes (--workload transactions)")
    ] = 2,
    transformer_clients: Annotated[
        str,
        typer.Option(
            help="comma-separated Kafka clients of the transformers, assigned round-robin: "
            "ours (raftlog's, gRPC), confluent (librdkafka, the KAFKA listener); "
            "default: ours,confluent with two or more transformers, else ours"
        ),
    ] = "",
    durability: Annotated[
        str,
        typer.Option(
            help="default: Kafka's (acks=all once the ISR has a record, fsync in the "
            "background); fsync: every replica fsyncs before it counts towards the "
            "acknowledgement (log.flush.interval.messages=1)"
        ),
    ] = "default",
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="TLS, SCRAM and ACLs (raftlog cluster up --secure); the workloads connect as "
            "the SCRAM user chaos with least-privilege ACLs",
        ),
    ] = False,
) -> None:
    """Start a cluster, run the workloads under the seed's faults, heal, check, report, stop.

    Exits 0 when the checker finds nothing, 1 when it finds anomalies."""
    from chaos.history import ALL_FAULT_KINDS, FaultKind  # noqa: PLC0415 - loaded when the command runs
    from chaos.report import print_summary  # noqa: PLC0415 - loaded when the command runs
    from chaos.runner import RunConfig, parse_duration, run  # noqa: PLC0415 - loaded when the command runs
    from chaos.txn_history import TXN_CLIENTS, TxnClient  # noqa: PLC0415 - loaded when the command runs

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    kinds: list[FaultKind] = []
    for name in (k.strip() for k in faults.split(",") if k.strip()):
        kind = next((k for k in ALL_FAULT_KINDS if k == name), None)
        if kind is None:
            raise typer.BadParameter(f"unknown fault {name!r}; known: {', '.join(ALL_FAULT_KINDS)}")
        kinds.append(kind)
    clients: list[TxnClient] = []
    for name in (c.strip() for c in transformer_clients.split(",") if c.strip()):
        client = next((c for c in TXN_CLIENTS if c == name), None)
        if client is None:
            raise typer.BadParameter(
                f"unknown transformer client {name!r}; known: {', '.join(TXN_CLIENTS)}"
            )
        clients.append(client)
    if workload not in ("plain", "transactions"):
        raise typer.BadParameter(f"unknown workload {workload!r}; known: plain, transactions")
    if durability not in ("default", "fsync"):
        raise typer.BadParameter(f"unknown durability {durability!r}; known: default, fsync")
    try:
        duration_s = parse_duration(duration)
        config = RunConfig(
            seed=seed,
            duration_s=duration_s,
            faults=kinds,
            work_dir=work_dir,
            report_dir=report,
            nodes=nodes,
            first_host=first_host,
            spare_host=spare_host,
            partitions=partitions,
            rate=rate,
            disk_bytes=disk_mib << 20,
            workload="transactions" if workload == "transactions" else "plain",
            transformers=transformers,
            transformer_clients=tuple(clients),
            secure=secure,
            durability="fsync" if durability == "fsync" else "default",
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    _interrupt_on_signals()
    history, verdict = run(config, lambda line: console.print(line, highlight=False))
    print_summary(history, verdict, console)
    console.print(f"report: {(report / 'report.html').resolve()}")
    sys.exit(0 if verdict.ok else 1)


@chaos_app.command("report")
def report_command(
    report: Annotated[Path, typer.Argument(help="a report directory or its report.json")],
) -> None:
    """Print the summary of an earlier run's report again."""
    from chaos.report import load_report, print_summary  # noqa: PLC0415 - loaded when the command runs

    history, verdict = load_report(report)
    print_summary(history, verdict, console)


@chaos_app.command("sweep")
def sweep_command() -> None:
    """Remove the iptables rules, disks and forgetful filesystems a crashed run left behind."""
    from chaos.disk import sweep_mounts  # noqa: PLC0415 - loaded when the command runs
    from chaos.network import stale_run_ids, sweep  # noqa: PLC0415 - loaded when the command runs
    from chaos.power import sweep_mounts as sweep_forgetful_mounts  # noqa: PLC0415 - loaded when the command runs

    stale = stale_run_ids()
    for run_id in stale:
        sweep(run_id)
    console.print(f"removed the rules of {len(stale)} crashed run(s): {', '.join(stale) or '-'}")
    mounts = sweep_mounts()
    console.print(f"unmounted {len(mounts)} disk(s): {', '.join(map(str, mounts)) or '-'}")
    forgetful = sweep_forgetful_mounts()
    console.print(
        f"unmounted {len(forgetful)} forgetful filesystem(s) whose process is gone: "
        f"{', '.join(map(str, forgetful)) or '-'}"
    )
