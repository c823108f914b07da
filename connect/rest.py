"""The REST API, in Kafka Connect's shape, served with FastAPI by uvicorn on the worker's
``listeners`` address (any address; it has no authentication, so a non-loopback one is
warned about in the log).

``GET /metrics`` serves Prometheus text: the replication lag of the mirror tasks whose status
this worker knows (``raftlog_mirror_replication_lag_records`` per source partition).

Errors are answered as Kafka Connect answers them: ``{"error_code": 404, "message":
"Connector x not found"}``; 400 for an invalid config (the message names each invalid field) or
a malformed request; 409 for a name that exists or a rebalance in progress.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import Body, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from connect.config_state import PAUSED, STARTED
from connect.herder import ConnectError, Herder

log = logging.getLogger(__name__)
STARTUP_TIMEOUT_S = 10.0
STARTUP_POLL_S = 0.02


def create_app(herder: Herder) -> FastAPI:
    app = FastAPI(title="raftlog Connect", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ConnectError)
    def _connect_error(request: Request, error: ConnectError) -> JSONResponse:
        return JSONResponse({"error_code": error.status, "message": error.message}, error.status)

    @app.exception_handler(RequestValidationError)
    def _bad_request(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error_code": 400, "message": str(error.errors())}, 400)

    @app.get("/")
    def root() -> dict[str, Any]:
        return {"version": "0.1.0", "commit": "", "kafka_cluster_id": ""}

    @app.get("/connectors")
    def list_connectors() -> list[str]:
        return herder.connectors()

    @app.post("/connectors", status_code=201)
    def create(body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        name, config = body.get("name"), body.get("config")
        if not isinstance(name, str) or not name or not isinstance(config, dict):
            raise ConnectError(400, 'a connector is {"name": "...", "config": {...}}')
        return herder.create(name, config)

    @app.get("/connectors/{name}")
    def info(name: str) -> dict[str, Any]:
        return herder.connector_info(name)

    @app.get("/connectors/{name}/config")
    def get_config(name: str) -> dict[str, Any]:
        return herder.connector_config(name)

    @app.put("/connectors/{name}/config")
    def put_config(name: str, config: dict[str, Any] = Body(...)) -> JSONResponse:  # noqa: B008
        created, answer = herder.put_config(name, config)
        return JSONResponse(answer, 201 if created else 200)

    @app.get("/connectors/{name}/status")
    def status(name: str) -> dict[str, Any]:
        return herder.status(name)

    @app.get("/connectors/{name}/tasks")
    def tasks(name: str) -> list[dict[str, Any]]:
        return herder.task_infos(name)

    @app.put("/connectors/{name}/pause", status_code=202)
    def pause(name: str) -> Response:
        herder.set_target_state(name, PAUSED)
        return Response(status_code=202)

    @app.put("/connectors/{name}/resume", status_code=202)
    def resume(name: str) -> Response:
        herder.set_target_state(name, STARTED)
        return Response(status_code=202)

    @app.post("/connectors/{name}/restart", status_code=204)
    def restart(name: str) -> Response:
        herder.restart(name)
        return Response(status_code=204)

    @app.delete("/connectors/{name}", status_code=204)
    def delete(name: str) -> Response:
        herder.delete(name)
        return Response(status_code=204)

    @app.get("/connector-plugins")
    def connector_plugins() -> list[dict[str, Any]]:
        return herder.plugins()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_LagCollector(herder))

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


class _LagCollector(Collector):
    """The mirror tasks' lag, read from the statuses at scrape time."""

    def __init__(self, herder: Herder) -> None:
        self.herder = herder

    def collect(self) -> Iterator[GaugeMetricFamily]:
        lag = GaugeMetricFamily(
            "raftlog_mirror_replication_lag_records",
            "source end offset minus the mirrored position, per source partition",
            labels=["connector", "task", "topic", "partition", "target_topic"],
        )
        for connector, task, figures in self.herder.task_metrics():
            partitions = figures.get("partitions", [])
            for row in partitions if isinstance(partitions, list) else []:
                labels = [connector, task, str(row["topic"]), str(row["partition"]),
                          str(row["target_topic"])]  # fmt: skip
                lag.add_metric(labels, float(row["lag_records"]))
        yield lag


def warn_if_exposed(host: str) -> bool:
    """Log a warning when the REST API (no authentication) listens beyond loopback; whether
    it did."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        log.warning(
            "the REST API listens on %s without authentication: anyone who can reach it can "
            "create, change and delete connectors; restrict access to it (firewall, proxy)",
            host,
        )
    return not loopback


def bind(host: str, port: int) -> socket.socket:
    """The REST API's listening socket, bound before the worker starts so it knows its own
    address (its id) even with port 0."""
    warn_if_exposed(host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket, host: str) -> str:
    return f"http://{host}:{sock.getsockname()[1]}"


class RestServer:
    """uvicorn on its own thread, serving ``sock``; :meth:`start` returns once it listens."""

    def __init__(self, herder: Herder, sock: socket.socket) -> None:
        config = uvicorn.Config(
            create_app(herder), log_level="warning", access_log=False,
            timeout_graceful_shutdown=5, lifespan="off",
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.sock = sock
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, name="connect-rest", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.server.started and self._thread.is_alive() and time.monotonic() < deadline:
            self._thread.join(STARTUP_POLL_S)  # uvicorn signals nothing: poll its flag
        if not self.server.started:
            raise OSError(f"the REST server did not start on {self.sock.getsockname()}")

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(10)
        self.sock.close()
