"""The console's HTML, rendered on the server from the plain data of
:mod:`dataplane.console.reads`: pure functions, no IO. Every text taken from the cluster
(topic names, keys, values, headers, client ids) is escaped; every name in a link is quoted.

Pages marked live carry ``data-live``: a few lines of plain JavaScript fetch the page again every
`LIVE_REFRESH_MS` and swap its ``<main>`` in (polling; no build tools, no libraries). The
records page is not live: it holds a form.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from html import escape
from urllib.parse import quote, urlencode

from dataplane.client import ConsumerRecord
from dataplane.client.admin import GroupListing
from dataplane.client.group_lag import GroupLag
from dataplane.console import history
from dataplane.console.decode import decode
from dataplane.console.history import Sample
from dataplane.console.outside import ConnectorRow, OutsideError, ReportSummary
from dataplane.console.reads import ClusterView, PartitionRow, RecordsView, TopicView

LIVE_REFRESH_MS = 5000

_STYLE = """
body{font-family:system-ui,sans-serif;margin:0;color:#222}
nav{background:#1f3a5f;padding:.6em 1em}nav a{color:#fff;margin-right:1.5em;text-decoration:none}
nav .brand{font-weight:bold}main{padding:1em 1.5em}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:.25em .6em;
text-align:left;vertical-align:top}th{background:#eef2f7}td.n{text-align:right}
tr.warn td{background:#fde2e1}.tag{padding:0 .4em;border-radius:3px;background:#ddd}
.ok{background:#d7f0d8}.bad{background:#fde2e1}pre{margin:0;white-space:pre-wrap;max-width:60em}
.fmt{color:#777;font-size:.8em}.charts svg{margin:0 1em 1em 0;border:1px solid #ddd}
.error{color:#a00}form label{display:block;margin:.3em 0}
nav form.who{display:inline;color:#fff;float:right}nav form.who button{margin-left:.5em}
"""

_LIVE_SCRIPT = """
<script>
if (document.body.dataset.live) {
  setInterval(async () => {
    const answer = await fetch(location.href, {headers: {"X-Console-Live": "1"}});
    if (!answer.ok) return;
    const fresh = new DOMParser().parseFromString(await answer.text(), "text/html");
    document.querySelector("main").innerHTML = fresh.querySelector("main").innerHTML;
  }, LIVE_REFRESH_MS);
}
</script>
""".replace("LIVE_REFRESH_MS", str(LIVE_REFRESH_MS))


@dataclass(frozen=True)
class Viewer:
    """Who the page is rendered for: the logged-in user (None when nobody logs in) and the CSRF
    token every form carries (dataplane/console/sessions.py)."""

    user: str | None
    csrf: str


# set by the server for the request its thread renders (a thread per request)
VIEWER: ContextVar[Viewer | None] = ContextVar("viewer", default=None)
NOBODY = Viewer(None, "")


def viewer() -> Viewer:
    return VIEWER.get() or NOBODY


def csrf_field() -> str:
    return f'<input type="hidden" name="csrf" value="{escape(viewer().csrf)}">'


def page(title: str, body: str, live: bool = False) -> str:
    """A whole document: the navigation, ``body`` in ``<main>``, the live-update script."""
    user = viewer().user
    logout = (
        ""
        if user is None
        else f'<form method="post" action="/logout" id="logout" class="who">{escape(user)} '
        f'{csrf_field()}<button type="submit">Log out</button></form>'
    )
    nav = (
        '<nav><a class="brand" href="/">raftlog console</a><a href="/">Cluster</a>'
        '<a href="/topics">Topics</a><a href="/groups">Consumer groups</a>'
        f'<a href="/connect">Connect</a><a href="/chaos">Chaos reports</a>{logout}</nav>'
    )
    live_attribute = ' data-live="1"' if live else ""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)} - '
        f"raftlog console</title><style>{_STYLE}</style></head><body{live_attribute}>{nav}"
        f"<main><h1>{escape(title)}</h1>{body}</main>{_LIVE_SCRIPT}</body></html>"
    )


def error_page(title: str, message: str) -> str:
    return page(title, f'<p class="error" id="error">{escape(message)}</p>')


def login_page(next_path: str, message: str | None = None) -> str:
    """The login form: a SCRAM user of the cluster and their password."""
    error = "" if message is None else f'<p class="error" id="error">{escape(message)}</p>'
    form = (
        f'{error}<form method="post" action="/login" id="login">'
        f'<input type="hidden" name="next" value="{escape(next_path)}">'
        '<label>User <input name="user" autocomplete="username" required></label>'
        '<label>Password <input name="password" type="password" '
        'autocomplete="current-password" required></label>'
        '<button type="submit">Log in</button></form>'
        "<p>The cluster's own SCRAM users: what you see is what your ACLs let you describe.</p>"
    )
    return page("Log in", form)


def _table(headers: Sequence[str], rows: Iterable[str], table_id: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(rows)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _cell(value: object, numeric: bool = False) -> str:
    text = "-" if value is None else str(value)
    return f'<td class="n">{escape(text)}</td>' if numeric else f"<td>{escape(text)}</td>"


def _bytes(size: int | None) -> str | None:
    """A size as people read it: 1,536 B, 12.0 KiB, 3.4 GiB (None: unknown)."""
    if size is None:
        return None
    if size < 1024:
        return f"{size:,} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def _ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in ids)


def topic_link(name: str) -> str:
    return f'<a href="/topics/{quote(name, safe="")}">{escape(name)}</a>'


def group_link(group_id: str) -> str:
    return f'<a href="/groups/{quote(group_id, safe="")}">{escape(group_id)}</a>'


# -- the cluster ----------------------------------------------------------------------------
def cluster_page(view: ClusterView) -> str:
    brokers = []
    for row in view.brokers:
        b = row.broker
        address = next((f"{e.host}:{e.port}" for e in b.endpoints if e.name == "BROKER"), "")
        state = row.state + (", cordoned" if b.cordoned else "")
        css = "ok" if row.state == "unfenced" and not b.cordoned else "bad"
        brokers.append(
            f'<tr data-broker="{b.broker_id}">{_cell(b.broker_id, True)}{_cell(address)}'
            f'<td><span class="tag {css}">{escape(state)}</span></td>{_cell(b.rack or None)}'
            f"{_cell(row.leaders, True)}{_cell(row.replicas, True)}"
            f"{_cell(_bytes(row.disk_used), True)}{_cell(_bytes(row.disk_free), True)}"
            f"{_cell(b.broker_epoch, True)}</tr>"
        )
    quorum = view.quorum
    voters = []
    for v in sorted(quorum.voters, key=lambda v: v.node_id):
        role = "active" if v.node_id == quorum.leader_id else "standby"
        voters.append(
            f'<tr data-voter="{v.node_id}">{_cell(v.node_id, True)}{_cell(v.address)}{_cell(role)}'
            f"{_cell(v.match_index if v.match_index >= 0 else None, True)}"
            f"{_cell(v.lag if v.lag >= 0 else None, True)}"
            f"{_cell('yes' if v.connected else 'no')}</tr>"
        )
    summary = (
        f'<p>Cluster id <b id="cluster-id">{escape(view.cluster_id)}</b>; active controller '
        f'<b id="active-controller">{quorum.leader_id if quorum.leader_id >= 0 else "none"}</b> '
        f"(epoch {quorum.leader_epoch}, {'has' if quorum.has_quorum else 'no'} quorum); "
        f'metadata offset <b id="metadata-offset">{view.metadata_offset}</b>.</p>'
    )
    body = (
        summary
        + "<h2>Brokers</h2>"
        + _table(
            (
                "ID",
                "ADDRESS",
                "STATE",
                "RACK",
                "PARTITIONS LED",
                "REPLICAS",
                "DISK USED",
                "DISK FREE",
                "EPOCH",
            ),
            brokers,
            "brokers",
        )
        + "<h2>Controllers</h2>"
        + _table(("ID", "ADDRESS", "ROLE", "MATCH INDEX", "LAG", "CONNECTED"), voters, "voters")
        + "<p>Disk used: what the broker's replicas take (DescribeLogDirs); free: what is "
        "left on its log directory's filesystem. Shown as - without DESCRIBE on the cluster.</p>"
    )
    return page("Cluster", body, live=True)


# -- topics -----------------------------------------------------------------------------------
def topics_page(topics: Sequence[TopicView]) -> str:
    rows = []
    for t in topics:
        replication = len(t.partitions[0].description.replicas) if t.partitions else 0
        css = ' class="warn"' if t.under_replicated else ""
        rows.append(
            f'<tr{css} data-topic="{escape(t.name)}"><td>{topic_link(t.name)}</td>'
            f"{_cell(len(t.partitions), True)}{_cell(replication, True)}"
            f"{_cell(t.under_replicated, True)}{_cell(t.records, True)}"
            f"{_cell(_bytes(t.size_bytes), True)}</tr>"
        )
    headers = ("TOPIC", "PARTITIONS", "REPLICATION", "UNDER-REPLICATED", "RECORDS", "SIZE")
    return page("Topics", _table(headers, rows, "topics"), live=True)


def _partition_tr(topic: str, row: PartitionRow) -> str:
    p = row.description
    css = ' class="warn"' if row.under_replicated else ""
    browse = f"/topics/{quote(topic, safe='')}/records?{urlencode({'partition': p.partition})}"
    return (
        f'<tr{css} data-partition="{p.partition}">'
        f'<td><a href="{escape(browse)}">{p.partition}</a></td>'
        f"{_cell(p.leader if p.leader >= 0 else 'none')}{_cell(p.leader_epoch, True)}"
        f"{_cell(_ids(p.replicas))}{_cell(_ids(p.isr))}{_cell(_ids(p.elr) or None)}"
        f"{_cell(row.log_start_offset, True)}{_cell(row.log_end_offset, True)}"
        f"{_cell(row.records, True)}{_cell(_bytes(row.size_bytes), True)}</tr>"
    )


def topic_charts(topic: str, samples: Sequence[Sample]) -> str:
    """Records in and out per second and each partition's ISR size over the sampled hour."""
    rates = {"in": history.records_in(samples, topic), "out": history.records_out(samples, topic)}
    return (
        '<div class="charts">'
        + history.line_chart("Records per second", rates, "chart-throughput")
        + history.line_chart("ISR size", history.isr_sizes(samples, topic), "chart-isr")
        + "</div>"
    )


def topic_page(view: TopicView, samples: Sequence[Sample] = ()) -> str:
    partitions = [_partition_tr(view.name, row) for row in view.partitions]
    configs = [
        f'<tr data-config="{escape(c.name)}">{_cell(c.name)}{_cell(c.value)}{_cell(c.source)}</tr>'
        for c in view.configs
    ]
    records = f"/topics/{quote(view.name, safe='')}/records"
    body = (
        f"<p>Topic id {view.topic_id.hex()}; {len(view.partitions)} partitions, "
        f'<span id="under-replicated">{view.under_replicated}</span> under-replicated; '
        f'<a href="{records}">records</a>. Under-replicated partitions (ISR smaller than the '
        "replicas) are highlighted.</p>"
        + _table(
            (
                "PARTITION",
                "LEADER",
                "LEADER EPOCH",
                "REPLICAS",
                "ISR",
                "ELR",
                "LOG START",
                "LOG END (HW)",
                "RECORDS",
                "SIZE",
            ),
            partitions,
            "partitions",
        )
        + "<h2>Over the last hour</h2>"
        + topic_charts(view.name, samples)
        + "<h2>Configs</h2>"
        + _table(("NAME", "VALUE", "SOURCE"), configs, "configs")
    )
    return page(f"Topic {view.name}", body, live=True)


# -- records ----------------------------------------------------------------------------------
def _payload(data: bytes | None) -> str:
    shown = decode(data)
    if shown.format == "null":
        return '<span class="fmt">null</span>'
    cut = ", cut" if shown.truncated else ""
    return (
        f'<pre data-format="{shown.format}">{escape(shown.text)}</pre>'
        f'<span class="fmt">{shown.format}, {shown.size_bytes} B{cut}</span>'
    )


def _header(name: str, value: bytes | None) -> str:
    """One header on one line: its value decoded inline (a header value is short)."""
    shown = decode(value)
    text = "null" if shown.format == "null" else shown.text
    return (
        f'<div class="header">{escape(name)}: <code data-format="{shown.format}">'
        f"{escape(text)}</code></div>"
    )


def _record_tr(record: ConsumerRecord) -> str:
    stamp = dt.datetime.fromtimestamp(record.timestamp / 1000, dt.UTC).isoformat(
        timespec="milliseconds"
    )
    headers = "".join(_header(name, value) for name, value in record.headers)
    return (
        f'<tr data-offset="{record.offset}">{_cell(record.offset, True)}{_cell(stamp)}'
        f'<td class="key">{_payload(record.key)}</td>'
        f'<td class="value">{_payload(record.value)}</td>'
        f"<td>{headers or '-'}</td></tr>"
    )


def records_page(view: RecordsView, produced: str | None = None) -> str:
    base = f"/topics/{quote(view.topic, safe='')}/records"
    options = "".join(
        f'<option value="{p}"{" selected" if p == view.partition else ""}>{p}</option>'
        for p in view.partitions
    )
    browse = (
        f'<form method="get" action="{base}" id="browse">Partition <select name="partition">'
        f'{options}</select> from offset <input name="offset" size="8" value="{view.from_offset}">'
        ' or time (ms since the epoch) <input name="timestamp" size="14"> '
        '<button type="submit">Show</button></form>'
    )
    note = f'<p id="produced">{escape(produced)}</p>' if produced else ""
    summary = (
        f"<p>Partition {view.partition}: log start offset {view.log_start_offset}, log end "
        f"offset {view.log_end_offset}; showing {len(view.records)} from offset "
        f"{view.from_offset}.</p>"
    )
    rows = [_record_tr(r) for r in view.records]
    table = _table(("OFFSET", "TIMESTAMP", "KEY", "VALUE", "HEADERS"), rows, "records")
    produce = (
        f'<h2>Produce a record</h2><form method="post" action="/topics/'
        f'{quote(view.topic, safe="")}/produce" id="produce">{csrf_field()}'
        f'<label>Partition <select name="partition"><option value="">by key</option>{options}'
        '</select></label><label>Key <input name="key" size="40"></label>'
        '<label>Value <textarea name="value" rows="4" cols="60"></textarea></label>'
        '<label>Headers (one name=value a line) <textarea name="headers" rows="2" cols="60">'
        '</textarea></label><button type="submit">Produce</button></form>'
    )
    return page(f"Records of {view.topic}", note + browse + summary + table + produce)


# -- consumer groups --------------------------------------------------------------------------
def groups_page(groups: Sequence[GroupListing]) -> str:
    rows = [
        f'<tr data-group="{escape(g.group_id)}"><td>{group_link(g.group_id)}</td>'
        f"{_cell(g.state)}{_cell(g.group_type)}</tr>"
        for g in groups
    ]
    return page("Consumer groups", _table(("GROUP", "STATE", "TYPE"), rows, "groups"), live=True)


def group_page(lag: GroupLag, samples: Sequence[Sample] = ()) -> str:
    d = lag.description
    members = [
        f'<tr data-member="{escape(m.member_id)}">{_cell(m.member_id)}{_cell(m.client_id)}'
        f"{_cell(m.member_epoch, True)}"
        f"{_cell(', '.join(m.subscribed_topics) or m.subscribed_pattern)}"
        f"{_cell(', '.join(f'{tp.topic}-{tp.partition}' for tp in sorted(m.assignment)))}</tr>"
        for m in d.members
    ]
    rows = [
        f'<tr data-tp="{escape(r.topic)}-{r.partition}"><td>{topic_link(r.topic)}</td>'
        f"{_cell(r.partition, True)}{_cell(r.current_offset, True)}"
        f'{_cell(r.log_end_offset, True)}<td class="n lag">{"-" if r.lag is None else r.lag}</td>'
        f"{_cell(r.member_id)}{_cell(r.client_id)}</tr>"
        for r in lag.rows
    ]
    epoch = "generation" if d.group_type == "classic" else "epoch"
    total = sum(r.lag or 0 for r in lag.rows)
    body = (
        f'<p>{escape(d.group_type)} group, state <b id="state">{escape(d.state)}</b>, {epoch} '
        f"{d.group_epoch}, coordinator {d.coordinator_id}, {len(d.members)} members; total lag "
        f'<b id="total-lag">{total}</b>.</p><h2>Members</h2>'
        + _table(
            ("MEMBER-ID", "CLIENT-ID", "EPOCH", "SUBSCRIBED", "ASSIGNMENT"), members, "members"
        )
        + "<h2>Offsets and lag</h2>"
        + _table(
            (
                "TOPIC",
                "PARTITION",
                "CURRENT-OFFSET",
                "LOG-END-OFFSET",
                "LAG",
                "MEMBER-ID",
                "CLIENT-ID",
            ),
            rows,
            "lag",
        )
        + '<h2>Lag over the last hour</h2><div class="charts">'
        + history.line_chart(
            "Total lag (records)", {"lag": history.group_lag(samples, d.group_id)}, "chart-lag"
        )
        + "</div>"
    )
    return page(f"Consumer group {d.group_id}", body, live=True)


# -- Kafka Connect ----------------------------------------------------------------------------
def connector_link(name: str) -> str:
    return f'<a href="/connect/{quote(name, safe="")}">{escape(name)}</a>'


def _state(state: str) -> str:
    css = "ok" if state == "RUNNING" else "bad"
    return f'<td><span class="tag {css}">{escape(state)}</span></td>'


def _connector_tr(c: ConnectorRow) -> str:
    running = sum(t.state == "RUNNING" for t in c.tasks)
    lag = f"<td>{group_link(c.group)}</td>" if c.group is not None else _cell(c.lag, numeric=True)
    return (
        f'<tr data-connector="{escape(c.name)}"><td>{connector_link(c.name)}</td>'
        f"{_cell(c.connector_class)}{_cell(c.type)}{_state(c.state)}"
        f"{_cell(f'{running}/{len(c.tasks)}', True)}{lag}</tr>"
    )


def connect_page(connect_url: str | None, connectors: Sequence[ConnectorRow]) -> str:
    """Connectors and mirrors (MirrorMaker-like connectors) of one Connect worker."""
    if connect_url is None:
        body = (
            '<p id="not-configured">No Connect worker: start the console with '
            "<code>--connect-url http://host:8083</code> (a node: "
            "<code>console.connect.url</code>).</p>"
        )
        return page("Connect", body)
    headers = ("CONNECTOR", "CLASS", "TYPE", "STATE", "TASKS RUNNING", "LAG (RECORDS / GROUP)")
    mirrors = [c for c in connectors if c.mirror]
    others = [c for c in connectors if not c.mirror]
    body = (
        f"<p>Worker {escape(connect_url)}: {len(connectors)} connectors. A sink connector's lag "
        "is its consumer group's; a mirror's is its source end offsets minus what it mirrored."
        "</p><h2>Connectors</h2>"
        + _table(headers, [_connector_tr(c) for c in others], "connectors")
        + "<h2>Mirrors</h2>"
        + _table(headers, [_connector_tr(c) for c in mirrors], "mirrors")
    )
    return page("Connect", body, live=True)


def connector_page(c: ConnectorRow) -> str:
    tasks = [
        f'<tr data-task="{t.task}">{_cell(t.task, True)}{_state(t.state)}{_cell(t.worker_id)}'
        f"{_cell(t.lag, True)}<td><pre>{escape(t.trace or '')}</pre></td></tr>"
        for t in c.tasks
    ]
    lags = [
        f'<tr data-tp="{escape(r.topic)}-{r.partition}">{_cell(r.topic)}'
        f"{_cell(r.partition, True)}{_cell(r.target_topic)}{_cell(r.source_end_offset, True)}"
        f'{_cell(r.mirrored_offset, True)}<td class="n lag">{r.lag_records}</td>'
        f"{_cell(r.task, True)}</tr>"
        for r in c.mirror_lag
    ]
    group = f"; its lag is group {group_link(c.group)}'s" if c.group is not None else ""
    body = (
        f"<p>{escape(c.connector_class)}, {escape(c.type)}, state {escape(c.state)} on "
        f"{escape(c.worker_id)}{group}.</p><h2>Tasks</h2>"
        + _table(("TASK", "STATE", "WORKER", "LAG", "TRACE"), tasks, "tasks")
    )
    if c.mirror:
        body += (
            f'<h2>Mirrored partitions</h2><p>Total lag <b id="total-lag">{c.lag or 0}</b>.</p>'
            + _table(
                (
                    "SOURCE TOPIC",
                    "PARTITION",
                    "TARGET TOPIC",
                    "SOURCE END",
                    "MIRRORED",
                    "LAG",
                    "TASK",
                ),
                lags,
                "mirror-lag",
            )
        )
    return page(f"Connector {c.name}", body, live=True)


# -- chaos reports ----------------------------------------------------------------------------
def _report_tr(r: ReportSummary | OutsideError) -> str:
    if isinstance(r, OutsideError):
        return f'<tr class="warn"><td colspan="8">{escape(str(r))}</td></tr>'
    verdict = f'<span class="tag {"ok" if r.ok else "bad"}">{"PASS" if r.ok else "FAIL"}</span>'
    link = (
        f'<a href="/chaos/{quote(r.name, safe="")}">{escape(r.name)}</a>'
        if r.has_html
        else escape(r.name)
    )
    faults = ", ".join(f"{kind} {n}" for kind, n in sorted(r.faults_by_kind.items()))
    availability = None if r.availability is None else f"{r.availability:.1%}"
    return (
        f'<tr data-report="{escape(r.name)}"><td>{link}</td><td class="verdict">{verdict}</td>'
        f"{_cell(r.started_at)}{_cell(r.duration_s, True)}{_cell(r.seed, True)}"
        f"{_cell(faults or None)}{_cell(r.findings, True)}"
        f"{_cell(f'{r.acknowledged_writes} / {r.lost_writes} / {r.duplicated_values}', True)}"
        f"{_cell(availability, True)}</tr>"
    )


def chaos_page(directory: str | None, reports: Sequence[ReportSummary | OutsideError]) -> str:
    if directory is None:
        body = (
            '<p id="not-configured">No reports directory: start the console with '
            "<code>--chaos-reports DIR</code> (where <code>raftlog chaos run --report</code> "
            "wrote).</p>"
        )
        return page("Chaos reports", body)
    headers = ("REPORT", "VERDICT", "STARTED", "SECONDS", "SEED", "FAULTS", "FINDINGS",
               "ACKED / LOST / DUPLICATED", "AVAILABILITY")  # fmt: skip
    body = f"<p>The newest reports under {escape(directory)}, newest first.</p>" + _table(
        headers, [_report_tr(r) for r in reports], "reports"
    )
    return page("Chaos reports", body, live=True)
