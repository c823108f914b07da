"""Fuzz target: the Connect REST API's request handling (connect/rest.py).

The first byte picks the method, the second a route (or a raw path from the input), then a
connector name and a JSON body (bytes after the first NUL), sent to the FastAPI app of a
standalone herder (whose runtime starts nothing: the REST layer and the herder's validation and
config state are under test). A malformed request must be answered 4xx as Kafka Connect answers
it; an exception or a 5xx is a crash.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi.testclient import TestClient

from connect.rest import create_app
from connect.standalone import StandaloneHerder
from connect.worker_config import WorkerConfig

METHODS = ("GET", "POST", "PUT", "DELETE")
ROUTES = (
    "/", "/connectors", "/connectors/{}", "/connectors/{}/config", "/connectors/{}/status",
    "/connectors/{}/tasks", "/connectors/{}/pause", "/connectors/{}/resume",
    "/connectors/{}/restart", "/connector-plugins", "/metrics", None,
)  # fmt: skip
CONNECTORS_MAX = 64  # a fresh herder past this many connectors


class InertRuntime:
    """The runtime's surface the herder calls; it runs nothing."""

    def start_connector(self, name: str, config: dict[str, Any], target: str) -> list[Any]:
        return [dict(config)]

    def stop_connector(self, name: str) -> None:
        pass

    def set_target_state(self, name: str, state: str) -> None:
        pass

    def start_task(self, *args: Any, **kwargs: Any) -> None:
        pass

    def stop_tasks(self, ids: Any, *, unassigned: bool = False) -> None:
        pass

    def stop_all(self) -> None:
        pass


def _client() -> tuple[StandaloneHerder, TestClient]:
    offsets = Path(tempfile.mkdtemp(prefix="raftlog-fuzz-connect-")) / "offsets"
    config = WorkerConfig.model_validate(
        {"bootstrap.servers": "127.0.0.212:1", "offset.storage.file.filename": str(offsets)}
    )
    herder = StandaloneHerder(config, "fuzz")
    herder.runtime = InertRuntime()  # type: ignore[assignment]
    return herder, TestClient(create_app(herder), raise_server_exceptions=True)


_state: tuple[StandaloneHerder, TestClient] | None = None


def fuzz_one(data: bytes) -> None:
    global _state  # noqa: PLW0603  (one app per fuzzing process)
    if len(data) < 2:
        return
    if _state is None or len(_state[0].connectors()) > CONNECTORS_MAX:
        _state = _client()
    client = _state[1]
    head, _, body = data[2:].partition(b"\0")
    route = ROUTES[data[1] % len(ROUTES)]
    name = head.decode("utf-8", "replace")
    # a free path: httpx, the test client, refuses to send one that starts with "//"
    free = "/" + quote(name.lstrip("/"), safe="/")
    path = free if route is None else route.format(quote(name, safe=""))
    response = client.request(
        METHODS[data[0] % len(METHODS)], path, content=body,
        headers={"content-type": "application/json"},
    )  # fmt: skip
    assert response.status_code < 500, f"{path}: {response.status_code} {response.text}"


if __name__ == "__main__":
    from tests.fuzz.runner import main

    main(fuzz_one)
