"""``raftlog connect ...``: run a worker, or call a worker's REST API.

The ``raftlog`` command finds this group through the ``raftlog.cli`` entry point. This module
imports only typer, rich and httpx's light top level at load time (every ``raftlog`` invocation,
node processes included, loads it); the runtime is imported when a worker starts.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from rich.console import Console

connect_app = typer.Typer(
    help="Kafka Connect-style connectors: run workers, manage connectors over REST.",
    no_args_is_help=True,
)
console = Console()
DEFAULT_URL = "http://127.0.0.1:8083"
HTTP_TIMEOUT_S = 60.0
UrlOption = Annotated[str, typer.Option("--url", help="a worker's REST API")]
NameArgument = Annotated[str, typer.Argument(help="the connector's name")]


def _serve_until_signalled(start: Any) -> None:
    """Run ``start()`` (returns a stop function) until SIGTERM or SIGINT."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    stopped = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    stop = start()
    try:
        while not stopped.wait(1.0):
            pass
    finally:
        stop()


@connect_app.command("standalone")
def standalone(
    worker: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="worker.json")],
    connectors: Annotated[
        list[Path] | None,
        typer.Argument(exists=True, dir_okay=False, help="connector JSON files to start"),
    ] = None,
) -> None:
    """One worker running every connector; source offsets in a local file."""
    from connect.process import start_standalone  # noqa: PLC0415 - the runtime loads on use

    _serve_until_signalled(lambda: start_standalone(worker, connectors or []))


@connect_app.command("distributed")
def distributed(
    worker: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="worker.json")],
) -> None:
    """A worker of the group ``group.id``: shares connectors and tasks with the others."""
    from connect.process import start_distributed  # noqa: PLC0415 - the runtime loads on use

    _serve_until_signalled(lambda: start_distributed(worker))


# -- the REST client -----------------------------------------------------------------------------
def _call(method: str, url: str, path: str, body: Any = None) -> Any:
    import httpx  # noqa: PLC0415 - only the client commands need it

    try:
        response = httpx.request(method, url.rstrip("/") + path, json=body,
                                 timeout=HTTP_TIMEOUT_S)  # fmt: skip
    except httpx.HTTPError as error:
        console.print(f"[red]{method} {url}{path}: {error}[/red]")
        raise typer.Exit(2) from error
    answer = response.json() if response.content else None
    if response.status_code >= 400:
        message = answer.get("message") if isinstance(answer, dict) else response.text
        console.print(f"[red]{response.status_code}: {message}[/red]")
        raise typer.Exit(1)
    return answer


def _show(value: Any) -> None:
    if value is not None:
        print(json.dumps(value, indent=2, sort_keys=True))


def load_connector(path: Path) -> tuple[str, dict[str, Any]]:
    """``{"name": ..., "config": {...}}`` or a flat config naming itself."""
    value = json.loads(path.read_text())
    if isinstance(value, dict) and isinstance(value.get("config"), dict):
        return str(value["name"]), dict(value["config"])
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        return value["name"], dict(value)
    raise typer.BadParameter(f"{path}: a connector file holds a name and a config")


@connect_app.command("list")
def list_connectors(url: UrlOption = DEFAULT_URL) -> None:
    """The connectors' names."""
    _show(_call("GET", url, "/connectors"))


@connect_app.command("create")
def create(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="connector JSON")],
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Create a connector from a JSON file ({"name": ..., "config": {...}})."""
    name, config = load_connector(file)
    _show(_call("POST", url, "/connectors", {"name": name, "config": config}))


@connect_app.command("get")
def get(name: NameArgument, url: UrlOption = DEFAULT_URL) -> None:
    """A connector: config and tasks."""
    _show(_call("GET", url, f"/connectors/{name}"))


@connect_app.command("config")
def config(
    name: NameArgument,
    file: Annotated[
        Path | None, typer.Option("--set", exists=True, dir_okay=False, help="new config JSON")
    ] = None,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Show a connector's config, or replace it (``--set file.json``)."""
    if file is None:
        _show(_call("GET", url, f"/connectors/{name}/config"))
        return
    value = json.loads(file.read_text())
    values = value["config"] if isinstance(value.get("config"), dict) else value
    _show(_call("PUT", url, f"/connectors/{name}/config", values))


@connect_app.command("status")
def status(name: NameArgument, url: UrlOption = DEFAULT_URL) -> None:
    """The state of a connector and its tasks, and which worker runs each."""
    _show(_call("GET", url, f"/connectors/{name}/status"))


@connect_app.command("tasks")
def tasks(name: NameArgument, url: UrlOption = DEFAULT_URL) -> None:
    """A connector's task configs."""
    _show(_call("GET", url, f"/connectors/{name}/tasks"))


@connect_app.command("pause")
def pause(name: NameArgument, url: UrlOption = DEFAULT_URL) -> None:
    _call("PUT", url, f"/connectors/{name}/pause")


@connect_app.command("resume")
def resume(name: NameArgument, url: UrlOption = DEFAULT_URL) -> None:
    _call("PUT", url, f"/connectors/{name}/resume")


@connect_app.command("restart")
def restart(name: NameArgument, url: UrlOption = DEFAULT_URL) -> None:
    """Restart a connector and its tasks."""
    _call("POST", url, f"/connectors/{name}/restart")


@connect_app.command("delete")
def delete(name: NameArgument, url: UrlOption = DEFAULT_URL) -> None:
    _call("DELETE", url, f"/connectors/{name}")


@connect_app.command("plugins")
def connector_plugins(url: UrlOption = DEFAULT_URL) -> None:
    """The connector classes a worker knows."""
    _show(_call("GET", url, "/connector-plugins"))
