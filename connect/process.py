"""A worker process: the herder of its mode and the REST server, started and stopped in order.

The worker's id is its REST address (``host:port``), as in Kafka Connect; the REST socket is bound
first, so with port 0 in ``listeners`` the id names the port the system picked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import typer

from connect.cli import load_connector
from connect.distributed import DistributedHerder
from connect.herder import ConnectError
from connect.rest import RestServer, bind, url_of
from connect.standalone import StandaloneHerder
from connect.worker_config import WorkerConfig

log = logging.getLogger(__name__)


def start_standalone(worker: Path, connectors: list[Path]) -> Callable[[], None]:
    config = WorkerConfig.load(worker)
    sock = bind(config.rest_host, config.rest_port)
    url = url_of(sock, config.rest_host)
    try:
        herder = StandaloneHerder(config, url.removeprefix("http://"))
        rest = RestServer(herder, sock)
    except BaseException:
        sock.close()
        raise
    rest.start()
    log.info("standalone worker %s listening on %s", herder.runtime.worker_id, url)

    def stop() -> None:
        rest.stop()
        herder.stop()

    try:
        for path in connectors:
            name, values = load_connector(path)
            herder.put_config(name, values)
    except (ConnectError, ValueError, typer.BadParameter):
        stop()
        raise
    return stop


def start_distributed(worker: Path) -> Callable[[], None]:
    return start_distributed_worker(WorkerConfig.load(worker))[1]


def start_distributed_worker(
    config: WorkerConfig,
) -> tuple[DistributedHerder, Callable[[], None]]:
    """A distributed worker with its REST API, running; the herder and the stop function."""
    sock = bind(config.rest_host, config.rest_port)
    url = url_of(sock, config.rest_host)
    try:
        herder = DistributedHerder(config, url.removeprefix("http://"), url)
        rest = RestServer(herder, sock)
    except BaseException:
        sock.close()
        raise
    herder.start()
    rest.start()
    log.info("distributed worker %s of group %s listening on %s", herder.worker_id,
             config.group_id, url)  # fmt: skip

    def stop() -> None:
        rest.stop()
        herder.stop()

    return herder, stop
