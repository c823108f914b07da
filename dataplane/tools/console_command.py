"""``raftlog console``: the web console on its own, for a cluster whose nodes serve none (a
secure one, say) or from another machine: it reads through ``--bootstrap-server`` with the
client settings of ``--command-config`` (or RAFTLOG_COMMAND_CONFIG), so the cluster's ACLs
decide what it shows, and runs until Ctrl-C."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated

import typer

from dataplane.console.server import Console, ConsoleServer
from dataplane.tools.client_commands import DEFAULT_BOOTSTRAP, BootstrapOption, console, servers
from dataplane.tools.command_config import command_security


def console_command(
    listen: Annotated[
        str, typer.Option("--listen", help="host:port the console serves HTTP on (port 0: any)")
    ] = "127.0.0.1:8080",
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    sample_interval_ms: Annotated[
        int,
        typer.Option(
            "--sample-interval-ms",
            min=100,
            max=600_000,
            help="how often the charts' data is sampled (the last hour is kept)",
        ),
    ] = 10_000,
    connect_url: Annotated[
        str | None,
        typer.Option(
            "--connect-url", help="a Connect worker's REST API, e.g. http://127.0.0.1:8083"
        ),
    ] = None,
    chaos_reports: Annotated[
        Path | None,
        typer.Option("--chaos-reports", help="a directory of chaos reports (report.json)"),
    ] = None,
) -> None:
    """Serve the web console of the cluster at --bootstrap-server until Ctrl-C."""
    host, colon, port = listen.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise typer.BadParameter(f"{listen!r} is not host:port", param_hint="--listen")
    reader = Console(
        servers(bootstrap), command_security(), sample_interval_ms / 1000, connect_url,
        chaos_reports,
    )  # fmt: skip
    server = ConsoleServer(reader, host, int(port))
    server.start()
    console.print(f"console: {server.url}/ (Ctrl-C stops it)", highlight=False)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        console.print("console stopped")
    finally:
        server.stop()
