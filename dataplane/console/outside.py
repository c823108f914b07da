"""What the console shows from outside the cluster: the connectors of a Kafka Connect worker
(raftlog's ``connect/``, read over its REST API, ``--connect-url``) and the reports of chaos
runs (``chaos/report.py``'s ``report.json`` files under ``--chaos-reports DIR``). Parsing is
pure (`connector_row`, `report_summary`); `read_connectors` and `ChaosReports` are the thin IO.

A connector's lag: a mirror task (``connect/mirror.py``) reports, in its status's ``metrics``,
per partition the source end offset, the mirrored position and their difference (what
``raftlog mirror status`` prints); a sink connector's lag is its consumer group's,
``connect-<name>`` (Kafka Connect's name), which the group page shows. Other sources report none.

A report.json holds the run's whole history (tens of MB for a few minutes of run) after its
verdict. The list needs the verdict and a few leading fields of the history, so it decodes the
verdict object and then only the history's members up to ``started_at`` (``write_report``
writes them in the models' order), and keeps each summary until the file changes.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

CONNECT_TIMEOUT_S = 5.0
REPORT_JSON = "report.json"  # chaos/report.py's names
REPORT_HTML = "report.html"
REPORTS_SHOWN_MAX = 20  # the newest; older ones stay on disk
MIRROR_CLASSES = ("MirrorSourceConnector", "MirrorCheckpointConnector", "MirrorHeartbeatConnector")


class OutsideError(Exception):
    """A Connect worker that does not answer or answers an error; a report that does not parse."""


# -- Kafka Connect ------------------------------------------------------------------------------
@dataclass(frozen=True)
class MirrorLag:
    topic: str
    partition: int
    target_topic: str
    source_end_offset: int
    mirrored_offset: int
    lag_records: int
    task: int


@dataclass(frozen=True)
class TaskRow:
    task: int
    state: str
    worker_id: str
    trace: str | None
    lag: int | None  # a mirror task's, summed over its partitions


@dataclass(frozen=True)
class ConnectorRow:
    name: str
    connector_class: str
    type: str  # source or sink
    state: str
    worker_id: str
    tasks: tuple[TaskRow, ...]
    mirror_lag: tuple[MirrorLag, ...]

    @property
    def mirror(self) -> bool:
        return self.connector_class.rsplit(".", 1)[-1] in MIRROR_CLASSES

    @property
    def group(self) -> str | None:
        """The consumer group whose lag is a sink connector's (Kafka Connect's name)."""
        return f"connect-{self.name}" if self.type == "sink" else None

    @property
    def lag(self) -> int | None:
        return sum(r.lag_records for r in self.mirror_lag) if self.mirror_lag else None


def connector_row(info: dict[str, Any], status: dict[str, Any]) -> ConnectorRow:
    """One connector from ``GET /connectors/{name}`` and ``GET /connectors/{name}/status``."""
    tasks, lags = [], []
    for task in sorted(status.get("tasks", []), key=lambda t: t.get("id", 0)):
        rows = [
            MirrorLag(
                p["topic"],
                p["partition"],
                p.get("target_topic", ""),
                p["source_end_offset"],
                p["mirrored_offset"],
                p["lag_records"],
                task.get("id", 0),
            )
            for p in (task.get("metrics") or {}).get("partitions", [])
        ]
        lags.extend(rows)
        tasks.append(
            TaskRow(
                task.get("id", 0),
                task.get("state", "UNASSIGNED"),
                task.get("worker_id", ""),
                task.get("trace"),
                sum(r.lag_records for r in rows) if rows else None,
            )
        )
    connector = status.get("connector", {})
    return ConnectorRow(
        info.get("name", status.get("name", "")),
        info.get("config", {}).get("connector.class", ""),
        status.get("type", info.get("type", "")),
        connector.get("state", "UNASSIGNED"),
        connector.get("worker_id", ""),
        tuple(tasks),
        tuple(sorted(lags, key=lambda r: (r.topic, r.partition))),
    )


def _get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=CONNECT_TIMEOUT_S) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as error:
        detail = error.read(500).decode(errors="replace")
        raise OutsideError(f"{url}: HTTP {error.code}: {detail}") from None
    except (OSError, ValueError) as error:
        raise OutsideError(f"{url}: {error}") from None


def read_connectors(connect_url: str, name: str | None = None) -> list[ConnectorRow]:
    """Every connector of the worker at ``connect_url`` (or the one named), sorted by name."""
    base = connect_url.rstrip("/")
    names = [name] if name is not None else sorted(_get_json(f"{base}/connectors"))
    rows = []
    for n in names:
        path = f"{base}/connectors/{quote(n, safe='')}"
        rows.append(connector_row(_get_json(path), _get_json(f"{path}/status")))
    return rows


# -- chaos reports -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReportSummary:
    name: str  # the report's directory, relative to the reports directory ("." for itself)
    ok: bool
    findings: int
    reported: int
    seed: int | None
    started_at: str
    duration_s: float | None
    faults_by_kind: dict[str, int]
    acknowledged_writes: int
    lost_writes: int
    duplicated_values: int
    availability: float | None
    has_html: bool


_HISTORY_FIELDS = ("seed", "duration_s", "started_at")


def _leading_members(text: str, start: int, wanted: tuple[str, ...]) -> dict[str, Any]:
    """The members named ``wanted`` of the JSON object at ``text[start]``, decoding members in
    order and stopping once all are found (the rest of the object is never decoded)."""
    decoder, found = json.JSONDecoder(), dict[str, Any]()
    position = start + 1
    while len(found) < len(wanted):
        while text[position] in " \t\r\n,":
            position += 1
        if text[position] == "}":
            break
        key, position = decoder.raw_decode(text, position)
        while text[position] in " \t\r\n:":
            position += 1
        value, position = decoder.raw_decode(text, position)
        if key in wanted:
            found[key] = value
    return found


def report_summary(name: str, text: str, has_html: bool = False) -> ReportSummary:
    """The verdict and the run's seed, start and duration from a report.json's text."""
    try:
        head = _leading_members(text, text.index("{"), ("verdict",))
        verdict = head["verdict"]
        history_at = text.index("{", text.index('"history"'))
        run = _leading_members(text, history_at, _HISTORY_FIELDS)
        summary = verdict["summary"]
        return ReportSummary(
            name, bool(verdict["ok"]), len(verdict.get("findings", [])),
            len(verdict.get("reported", [])), run.get("seed"), str(run.get("started_at", "")),
            run.get("duration_s"), dict(summary.get("faults_by_kind", {})),
            summary.get("acknowledged_writes", 0), summary.get("lost_writes", 0),
            summary.get("duplicated_values", 0), summary.get("availability"), has_html,
        )  # fmt: skip
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise OutsideError(f"{name}/{REPORT_JSON} is not a chaos report: {error}") from None


class ChaosReports:
    """The chaos reports under ``directory``: its own report.json and those of its
    subdirectories, newest first. Summaries are kept by (path, mtime, size), only for the
    reports listed last, so the cache is bounded by `REPORTS_SHOWN_MAX`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory.resolve()
        self._cache: dict[tuple[Path, int, int], ReportSummary | OutsideError] = {}
        self._lock = threading.Lock()

    def _paths(self) -> list[Path]:
        found = [self.directory / REPORT_JSON, *self.directory.glob(f"*/{REPORT_JSON}")]
        existing = [p for p in found if p.is_file()]
        existing.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
        return existing[:REPORTS_SHOWN_MAX]

    def list(self) -> list[ReportSummary | OutsideError]:
        """The newest reports' summaries; one that does not parse is its error."""
        shown: dict[tuple[Path, int, int], ReportSummary | OutsideError] = {}
        for path in self._paths():
            stat = path.stat()
            key = (path, stat.st_mtime_ns, stat.st_size)
            with self._lock:
                cached = self._cache.get(key)
            if cached is None:
                name = path.parent.relative_to(self.directory).as_posix()
                try:
                    cached = report_summary(
                        name,
                        path.read_text(encoding="utf-8"),
                        (path.parent / REPORT_HTML).is_file(),
                    )
                except (OutsideError, OSError, UnicodeDecodeError) as error:
                    cached = OutsideError(f"{name}: {error}")
            shown[key] = cached
        with self._lock:
            self._cache = shown
        return list(shown.values())

    def html(self, name: str) -> str:
        """A listed report's report.html (a name not listed is not served: no path from the URL
        reaches the filesystem)."""
        for path in self._paths():
            if path.parent.relative_to(self.directory).as_posix() == name:
                page = path.parent / REPORT_HTML
                if page.is_file():
                    return page.read_text(encoding="utf-8")
        raise OutsideError(f"no chaos report {name!r}")
