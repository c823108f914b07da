"""``python -m spark.pipeline`` (``make pipeline``): the reference pipeline on a local 3-node
cluster on 127.0.0.11-13, or on a running cluster with ``--bootstrap-server``. Prints a table
and exits 1 when the checker finds a problem (or the run fails)."""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port
from raftlog.errors import KafkaError
from spark.pipeline.run import PipelineResult, PipelineSettings, run_pipeline
from spark.session import local_session

FIRST_HOST = 11  # the local cluster's 127.0.0.11-13
NODES = 3
CLUSTER_UP_S = 60.0


def _run(
    settings: PipelineSettings,
    workdir: Path,
    bootstrap: str | None,
    registry_url: str | None,
    console: Console,
) -> PipelineResult:
    cluster = None
    if bootstrap is not None:
        servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
        if registry_url is None:
            raise ValueError("--bootstrap-server needs --schema-registry-url (the clicks are Avro)")
    else:
        hosts = [f"127.0.0.{FIRST_HOST + n}" for n in range(NODES)]
        cluster = LocalCluster(
            workdir / "cluster", nodes=NODES, first_host=FIRST_HOST, port=pick_cluster_port(hosts)
        )
        servers = cluster.bootstrap_servers
        registry_url = ",".join(cluster.schema_registry_urls)
    try:
        if cluster is not None:
            console.print(f"starting {NODES} nodes on {', '.join(servers)}")
            cluster.up(timeout_s=CLUSTER_UP_S)
        console.print("starting Spark local[2]")
        session = local_session("raftlog-pipeline")
        try:
            return run_pipeline(session, servers, registry_url, workdir, settings, console.print)
        finally:
            session.stop()
    finally:
        if cluster is not None:
            cluster.down()


def print_result(result: PipelineResult, console: Console) -> None:
    report = result.report
    table = Table(title="raftlog reference pipeline")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("click events produced (acknowledged, logged)", f"{result.events:,}"),
        ("  of which while the job was stopped", f"{result.produced_while_stopped:,}"),
        ("micro-batches with input: first run / after restart",
         f"{result.first_run_batches} / {result.second_run_batches}"),
        ("job down (stop to restart)", f"{result.downtime_s:.1f} s"),
        ("streaming (job start to final stop)", f"{result.streaming_s:.1f} s"),
        ("windows expected (window x page)", f"{report.expected_windows:,}"),
        ("records in page-counts", f"{report.written_records:,}"),
        ("duplicated windows", f"{len(report.duplicated):,}"),
        ("missing windows", f"{len(report.missing):,}"),
        ("windows with a wrong count", f"{len(report.wrong_count):,}"),
        ("unexpected windows", f"{len(report.unexpected):,}"),
    ]  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    for line in report.problems():
        console.print(f"[red]{line}[/red]")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark.pipeline", description=__doc__)
    parser.add_argument("--events", type=int, default=PipelineSettings.events)
    parser.add_argument("--workdir", type=Path, default=Path(".raftlog/pipeline"))
    parser.add_argument(
        "--bootstrap-server", help="host:port,... of a running cluster (default: start one)"
    )
    parser.add_argument(
        "--schema-registry-url",
        help="http://host:port,... of the running cluster's schema registry (schema.registry.url)",
    )
    args = parser.parse_args(argv)
    console = Console()
    workdir: Path = args.workdir.resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    try:
        result = _run(
            PipelineSettings(events=args.events), workdir, args.bootstrap_server,
            args.schema_registry_url, console,
        )  # fmt: skip
    except (KafkaError, TimeoutError, OSError, RuntimeError, ValueError) as error:
        console.print(f"[red]pipeline failed:[/red] {error}; see {workdir}")
        return 1
    print_result(result, console)
    if not result.report.ok:
        console.print(f"[red]the checker found problems[/red]; see {workdir}")
        return 1
    console.print("every window was written once, with the count the generator's log gives")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
