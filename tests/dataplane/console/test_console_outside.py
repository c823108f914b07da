"""The console's Connect and chaos pages: connectors and mirrors read from a Connect worker's
REST API (a fake worker in-process, answering what connect/rest.py answers), and chaos reports
written by chaos/report.py's own `write_report`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from chaos.history import Finding, History, Summary, Verdict
from chaos.report import write_report
from dataplane.console import outside, pages
from dataplane.console.server import Console, ConsoleError
from tests.http_support import serving

MIRROR_STATUS = {
    "name": "MirrorSourceConnector",
    "connector": {"state": "RUNNING", "worker_id": "127.0.0.1:8083"},
    "tasks": [
        {
            "id": 0,
            "state": "RUNNING",
            "worker_id": "127.0.0.1:8083",
            "metrics": {
                "partitions": [
                    {
                        "topic": "orders",
                        "partition": 1,
                        "target_topic": "src.orders",
                        "source_end_offset": 90,
                        "mirrored_offset": 80,
                        "lag_records": 10,
                    },
                    {
                        "topic": "orders",
                        "partition": 0,
                        "target_topic": "src.orders",
                        "source_end_offset": 50,
                        "mirrored_offset": 48,
                        "lag_records": 2,
                    },
                ]
            },
        },
        {"id": 1, "state": "FAILED", "worker_id": "127.0.0.1:8083", "trace": "Boom <x>"},
    ],
    "type": "source",
}
WORKER: dict[str, Any] = {
    "/connectors": ["lines-out", "MirrorSourceConnector"],
    "/connectors/lines-out": {
        "name": "lines-out",
        "type": "sink",
        "tasks": [],
        "config": {"connector.class": "FileStreamSink"},
    },
    "/connectors/lines-out/status": {
        "name": "lines-out",
        "connector": {"state": "PAUSED", "worker_id": "w1"},
        "tasks": [{"id": 0, "state": "PAUSED", "worker_id": "w1"}],
        "type": "sink",
    },
    "/connectors/MirrorSourceConnector": {
        "name": "MirrorSourceConnector",
        "type": "source",
        "tasks": [],
        "config": {"connector.class": "MirrorSourceConnector"},
    },
    "/connectors/MirrorSourceConnector/status": MIRROR_STATUS,
}


@contextmanager
def fake_connect_worker() -> Iterator[str]:
    """A Connect worker's REST API answering `WORKER`'s paths; its base URL."""

    class FakeWorker(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = WORKER.get(self.path)
            body = json.dumps(
                found
                if found is not None
                else {"error_code": 404, "message": f"Connector {self.path} not found"}
            ).encode()
            self.send_response(HTTPStatus.OK if found is not None else HTTPStatus.NOT_FOUND)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(FakeWorker) as url:
        yield url


@pytest.fixture
def worker() -> Iterator[str]:
    with fake_connect_worker() as url:
        yield url


def test_connector_row_sums_a_mirrors_lag_per_task() -> None:
    row = outside.connector_row(WORKER["/connectors/MirrorSourceConnector"], MIRROR_STATUS)
    assert row.mirror and row.lag == 12 and row.group is None
    assert [(t.task, t.state, t.lag) for t in row.tasks] == [
        (0, "RUNNING", 12),
        (1, "FAILED", None),
    ]
    assert [(r.partition, r.lag_records) for r in row.mirror_lag] == [(0, 2), (1, 10)]


def test_connect_pages_from_a_worker(worker: str) -> None:
    console = Console(["127.0.0.1:1"], connect_url=worker)
    listing = console.get("/connect", {})
    assert 'data-connector="lines-out"' in listing and 'href="/groups/connect-lines-out"' in listing
    mirrors = listing[listing.index('id="mirrors"') :]
    assert 'data-connector="MirrorSourceConnector"' in mirrors and ">12</td>" in mirrors
    mirror = console.get("/connect/MirrorSourceConnector", {})
    assert '<b id="total-lag">12</b>' in mirror and 'data-tp="orders-1"' in mirror
    assert "Boom &lt;x&gt;" in mirror  # a failed task's trace, escaped
    with pytest.raises(ConsoleError) as missing:
        console.get("/connect/nope", {})
    assert missing.value.status == HTTPStatus.NOT_FOUND


def test_connect_page_without_a_worker_or_with_one_down() -> None:
    assert 'id="not-configured"' in Console(["127.0.0.1:1"]).get("/connect", {})
    with pytest.raises(ConsoleError) as down:
        Console(["127.0.0.1:1"], connect_url="http://127.0.0.1:1").get("/connect", {})
    assert down.value.status == HTTPStatus.BAD_GATEWAY


def _report(directory: Path, ok: bool, seed: int) -> None:
    history = History(
        seed=seed, nodes=[1, 2, 3], faults_requested=["kill"], duration_s=30.0, topic="t",
        partitions=3, group="g", started_at="2026-11-27T06:27:25+00:00", workload_s=30.0,
        end_s=35.0,
    )  # fmt: skip
    findings = [] if ok else [Finding(kind="lost-write", message="acknowledged, not stored")]
    summary = Summary(
        attempted_writes=100, acknowledged_writes=99, indeterminate_writes=1,
        lost_writes=0 if ok else 1, duplicated_values=0, availability=0.9,
        faults_by_kind={"kill": 2}, recoveries=[], consumed_records=99, commits_ok=3,
        admin_ops_ok=1,
    )  # fmt: skip
    write_report(history, Verdict(ok=ok, findings=findings, summary=summary), directory)


def test_chaos_reports_list_newest_first_with_their_verdicts(tmp_path: Path) -> None:
    _report(tmp_path / "run-a", ok=True, seed=1)
    _report(tmp_path / "run-b", ok=False, seed=2)
    (tmp_path / "run-c").mkdir()
    (tmp_path / "run-c" / "report.json").write_text("{not json")
    console = Console(["127.0.0.1:1"], chaos_reports=tmp_path)
    listed = console.chaos_reports.list() if console.chaos_reports else []
    summaries = [r for r in listed if isinstance(r, outside.ReportSummary)]
    assert [(r.name, r.ok, r.seed, r.findings, r.lost_writes) for r in summaries] == [
        ("run-b", False, 2, 1, 1),
        ("run-a", True, 1, 0, 0),
    ]
    assert summaries[0].faults_by_kind == {"kill": 2} and summaries[0].duration_s == 30.0
    page = console.get("/chaos", {})
    assert page.count("FAIL") == 1 and page.count(">PASS<") == 1 and "run-c" in page
    assert console.get("/chaos/run-a", {}) == (tmp_path / "run-a" / "report.html").read_text()
    for name in ("run-c", "..", "%2e%2e%2fetc"):  # unlisted or html-less: nothing is read
        with pytest.raises(ConsoleError):
            console.get(f"/chaos/{name}", {})
    assert 'id="not-configured"' in pages.chaos_page(None, [])
