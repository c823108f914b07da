"""A worker process: the herder of its mode and the REST server, started and stopped in order.

The worker's id is its REST address (``host:port``), as in Kafka Connect; with port 0 in
``listeners`` the REST server picks a free port and the id names it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from connect.cli import load_connector
from connect.distributed import DistributedHerder
from connect.herder import ConnectError
from connect.rest import RestServer
from connect.standalone import StandaloneHerder
from connect.worker_config import WorkerConfig

log = logging.getLogger(__name__)


def start_standalone(worker: Path, connectors: list[Path]) -> Callable[[], None]:
    config = WorkerConfig.load(worker)
    herder_box: list[StandaloneHerder] = []
    rest = RestServer(_Late(herder_box), config.rest_host, config.rest_port)  # type: ignore[arg-type]
    url = rest.start()
    herder = StandaloneHerder(config, url.removeprefix("http://"))
    herder_box.append(herder)
    log.info("standalone worker %s listening on %s", herder.runtime.worker_id, url)
    try:
        for path in connectors:
            name, values = load_connector(path)
            herder.put_config(name, values)
    except (ConnectError, ValueError, typer.BadParameter):
        rest.stop()
        herder.stop()
        raise

    def stop() -> None:
        rest.stop()
        herder.stop()

    return stop


def start_distributed(worker: Path) -> Callable[[], None]:
    config = WorkerConfig.load(worker)
    herder_box: list[DistributedHerder] = []
    rest = RestServer(_Late(herder_box), config.rest_host, config.rest_port)  # type: ignore[arg-type]
    url = rest.start()
    try:
        herder = DistributedHerder(config, url.removeprefix("http://"), url)
    except BaseException:
        rest.stop()
        raise
    herder_box.append(herder)
    herder.start()
    log.info("distributed worker %s of group %s listening on %s", herder.worker_id,
             config.group_id, url)  # fmt: skip

    def stop() -> None:
        rest.stop()
        herder.stop()

    return stop


class _Late:
    """The herder for the REST server before it exists: the server starts first so the worker
    knows its own address (its id); until the herder is there, every call answers 409."""

    def __init__(self, box: list[Any]) -> None:
        self._box = box

    def __getattr__(self, name: str) -> Any:
        if not self._box:
            raise ConnectError(409, "the worker is starting")
        return getattr(self._box[0], name)
