"""``raftlog console``: the web console on its own, for a cluster whose nodes serve none or from
another machine: it reads through ``--bootstrap-server`` with the client settings of
``--command-config`` (or RAFTLOG_COMMAND_CONFIG), so the cluster's ACLs decide what it shows,
and runs until Ctrl-C. With ``--login`` (a SASL cluster) each user logs in with their own SCRAM
name and password and sees what their ACLs allow; the command config's user only samples the
charts. ``--tls-keystore`` (a PEM with key and certificate) serves it over HTTPS."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from dataplane.console.server import Console, ConsoleServer
from dataplane.console.sessions import Sessions
from dataplane.tools.client_commands import DEFAULT_BOOTSTRAP, BootstrapOption, console, servers
from dataplane.tools.command_config import command_security
from metadata_quorum.security.channels import ClientSecurity
from metadata_quorum.security.tls import TlsError, TlsSettings


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
    login: Annotated[
        bool,
        typer.Option(
            "--login/--no-login",
            help="each user logs in with their SCRAM name and password (a SASL cluster)",
        ),
    ] = False,
    tls_keystore: Annotated[
        Path | None,
        typer.Option("--tls-keystore", help="serve HTTPS with this PEM (private key, certificate)"),
    ] = None,
) -> None:
    """Serve the web console of the cluster at --bootstrap-server until Ctrl-C."""
    host, colon, port = listen.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise typer.BadParameter(f"{listen!r} is not host:port", param_hint="--listen")
    security = command_security()
    sessions = None
    if login:
        sessions = Sessions(servers(bootstrap), _user_security(security))
    tls = None
    if tls_keystore is not None:
        try:
            tls = TlsSettings(tls_keystore, None).server_context()
        except TlsError as error:
            raise typer.BadParameter(str(error), param_hint="--tls-keystore") from None
    reader = Console(
        servers(bootstrap), security, sample_interval_ms / 1000, connect_url, chaos_reports,
        sessions,
    )  # fmt: skip
    server = ConsoleServer(reader, host, int(port), tls)
    server.start()
    console.print(f"console: {server.url}/ (Ctrl-C stops it)", highlight=False)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        console.print("console stopped")
    finally:
        server.stop()


def _user_security(security: ClientSecurity | None) -> Callable[[str, str], ClientSecurity]:
    """How a user who logs in reaches the cluster: the command config's, with their name and
    password (its listener must take SASL)."""
    if security is None or not security.uses_sasl:
        raise typer.BadParameter(
            "--login needs a SASL cluster: a --command-config (or RAFTLOG_COMMAND_CONFIG) with "
            "security.protocol SASL_SSL or SASL_PLAINTEXT",
            param_hint="--login",
        )

    def security_for(user: str, password: str) -> ClientSecurity:
        return security.model_copy(update={"sasl_username": user, "sasl_password": password})

    return security_for
