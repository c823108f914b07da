"""Standalone mode against a real 3-node cluster: file → topic → file through a worker restart,
the REST API's answers (errors as Kafka Connect gives them), and the CLI."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from dataplane.tools.entry import COMMAND as RAFTLOG
from dataplane.tools.local_cluster import LocalCluster, wait_for
from tests.connect.support import (
    CLUSTER_OVERRIDES,
    Worker,
    lines,
    worker_config,
)
from tests.dataplane.cluster_support import create_topic, running_cluster

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("connect")]
WORKER_HOST = "127.0.0.187"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("connect")
    with running_cluster(root, "connect", CLUSTER_OVERRIDES) as running:
        yield running


def standalone(cluster: LocalCluster, root: Path, connectors: list[Path]) -> Worker:
    config = worker_config(
        cluster,
        **{"offset.storage.file.filename": str(root / "offsets.json"),
           "offset.flush.interval.ms": 200},
    )  # fmt: skip
    return Worker(root, "standalone", WORKER_HOST, ["standalone", *map(str, connectors)], config)


def connector_file(root: Path, name: str, config: Mapping[str, object]) -> Path:
    path = root / f"{name}.connector.json"
    path.write_text(json.dumps({"name": name, "config": config}))
    return path


def test_file_source_to_topic_to_file_sink_through_a_restart(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    create_topic(cluster, "lines", 1)
    source, sink = tmp_path / "in.txt", tmp_path / "out.txt"
    first = [f"line-{i:04d}" for i in range(50)]
    source.write_text("".join(f"{line}\n" for line in first) + "partial-li")
    files = [
        connector_file(tmp_path, "src", {"connector.class": "FileStreamSource",
                                         "file": str(source), "topic": "lines"}),
        connector_file(tmp_path, "snk", {"connector.class": "FileStreamSink",
                                         "file": str(sink), "topics": "lines"}),
    ]  # fmt: skip
    worker = standalone(cluster, tmp_path, files)
    try:
        worker.start()
        wait_for("the first lines in the sink file", lambda: len(lines(sink)) >= 50, 60)
        worker.stop()
        assert worker.process is not None and worker.process.returncode == 0
        offsets = json.loads((tmp_path / "offsets.json").read_text())
        committed = offsets[json.dumps(["src", {"filename": str(source)}], separators=(",", ":"))]
        assert committed == {"position": sum(len(line) + 1 for line in first)}, (
            "the committed position is right after the last complete line"
        )
        assert lines(sink) == first, "the partial line was not emitted"

        second = [f"line-{i:04d}" for i in range(50, 100)]
        with source.open("a") as f:
            f.write("ne\n" + "".join(f"{line}\n" for line in second))
        worker.start()
        expected = [*first, "partial-line", *second]
        wait_for("every line in the sink file", lambda: len(lines(sink)) >= len(expected), 60)
        status = json.loads(
            subprocess.run(
                [*RAFTLOG, "connect", "status", "src", "--url", worker.url],
                check=True, capture_output=True, timeout=60,
            ).stdout
        )  # fmt: skip
        assert status["connector"]["state"] == "RUNNING"
        assert [t["state"] for t in status["tasks"]] == ["RUNNING"]
        worker.stop()
        assert lines(sink) == expected, "every line once, in order, across the restart"
    finally:
        worker.stop()


def test_rest_api_answers_and_errors(cluster: LocalCluster, tmp_path: Path) -> None:
    create_topic(cluster, "rest-lines", 1)
    source = tmp_path / "in.txt"
    source.write_text("a\nb\n")
    worker = standalone(cluster, tmp_path, [])
    config = {"connector.class": "FileStreamSource", "file": str(source), "topic": "rest-lines"}
    try:
        worker.start()
        for method, path in [("GET", "/connectors/nope"), ("GET", "/connectors/nope/status"),
                             ("GET", "/connectors/nope/config"), ("DELETE", "/connectors/nope"),
                             ("PUT", "/connectors/nope/pause"), ("GET", "/connectors/nope/tasks"),
                             ("POST", "/connectors/nope/restart")]:  # fmt: skip
            answer = worker.call(method, path)
            assert answer.status_code == 404, (method, path)
            assert answer.json() == {"error_code": 404, "message": "Connector nope not found"}

        bad = {**config, "tasks.max": 0, "batch.size": "x", "colour": "red"}
        answer = worker.call("POST", "/connectors", {"name": "src", "config": bad})
        assert answer.status_code == 400
        body = answer.json()
        assert body["error_code"] == 400
        for field in ("tasks.max", "batch.size", "colour"):
            assert field in body["message"]
        assert worker.call("PUT", "/connectors/src/config", bad).status_code == 400
        assert worker.call("POST", "/connectors", {"config": config}).status_code == 400
        assert worker.call("GET", "/connectors").json() == []

        created = worker.call("POST", "/connectors", {"name": "src", "config": config})
        assert created.status_code == 201
        assert created.json()["name"] == "src" and created.json()["type"] == "source"
        duplicate = worker.call("POST", "/connectors", {"name": "src", "config": config})
        assert duplicate.status_code == 409
        assert duplicate.json() == {"error_code": 409, "message": "Connector src already exists"}

        def state() -> dict[str, object]:
            return dict(worker.call("GET", "/connectors/src/status").json())

        wait_for("src running", lambda: state()["tasks"] == [
            {"id": 0, "state": "RUNNING", "worker_id": worker.url.removeprefix("http://")}
        ], 30)  # fmt: skip
        assert worker.call("GET", "/connectors/src/config").json() == {**config, "name": "src"}
        tasks = worker.call("GET", "/connectors/src/tasks").json()
        assert tasks[0]["id"] == {"connector": "src", "task": 0}
        assert worker.call("PUT", "/connectors/src/pause").status_code == 202
        wait_for("src paused", lambda: state()["connector"]["state"] == "PAUSED", 30)  # type: ignore[index]
        assert worker.call("PUT", "/connectors/src/resume").status_code == 202
        wait_for("src resumed", lambda: state()["connector"]["state"] == "RUNNING", 30)  # type: ignore[index]
        assert worker.call("POST", "/connectors/src/restart").status_code == 204
        updated = worker.call("PUT", "/connectors/src/config", {**config, "batch.size": 5})
        assert updated.status_code == 200 and updated.json()["config"]["batch.size"] == 5
        plugins = worker.call("GET", "/connector-plugins").json()
        assert {p["class"] for p in plugins} >= {"connect.file.FileStreamSource",
                                                 "connect.file.FileStreamSink"}  # fmt: skip
        assert worker.call("DELETE", "/connectors/src").status_code == 204
        assert worker.call("GET", "/connectors").json() == []
        assert worker.call("GET", "/connectors/src").status_code == 404

        cli_file = connector_file(tmp_path, "from-cli", config)
        cli = [*RAFTLOG, "connect"]
        created_by_cli = subprocess.run([*cli, "create", str(cli_file), "--url", worker.url],
                                        check=False, capture_output=True, timeout=60)  # fmt: skip
        assert created_by_cli.returncode == 0, created_by_cli.stderr
        listed = subprocess.run([*cli, "list", "--url", worker.url], capture_output=True,
                                timeout=60, check=True)  # fmt: skip
        assert json.loads(listed.stdout) == ["from-cli"]
        missing = subprocess.run([*cli, "get", "nope", "--url", worker.url], check=False,
                                 capture_output=True, timeout=60)  # fmt: skip
        assert missing.returncode == 1 and b"Connector nope not found" in missing.stdout
    finally:
        worker.stop()
