"""The report of a chaos run: report.json, one self-contained report.html, a terminal summary.

`write_report` writes the history and its verdict as one JSON object, which `load_report` reads
back validated, next to an HTML page that opens anywhere: inline CSS, every plot a PNG embedded as
a data URL, no scripts, no external URLs. Every time plot puts seconds since the run started on
the x axis and shades each fault window in the colour of its kind, labelled with its id, so a dip
in throughput or a leader election lines up with the fault that caused it.

Plots are drawn on `matplotlib.figure.Figure` objects given an Agg canvas, never through pyplot:
no global figure registry, safe from any thread. Every plot copes with an empty series (a run
with no samples, no consumption or no faults) by drawing an empty axis that says "no data".
`print_summary` shows the same verdict and figures in a terminal, with rich.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections import defaultdict
from collections.abc import Callable, Container, Iterable, Sequence
from itertools import pairwise
from pathlib import Path
from statistics import fmean

import numpy as np
import numpy.typing as npt
from matplotlib import colormaps
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator
from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.table import Table
from rich.text import Text

from chaos.history import (
    ALL_FAULT_KINDS,
    FaultKind,
    FaultWindow,
    Finding,
    History,
    MetadataSample,
    Summary,
    Verdict,
)

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
FINDINGS_SHOWN_MAX = 500  # rows of the html findings table; report.json holds them all
LEADER_SEQUENCE_SHOWN_MAX = 12  # leaders listed per partition in the leader changes table

KIND_COLOURS: dict[str, str] = {  # by fault kind; a kind without its own colour is drawn grey
    "kill": "#d62728",
    "pause": "#ff7f0e",
    "partition": "#9467bd",
    "controller-kill": "#8c564b",
    "leader-kill": "#e377c2",
    "disk-full": "#17becf",
    "reassign": "#bcbd22",
    "membership": "#2ca02c",
    "power-loss": "#000000",
    "power-loss-all": "#5254a3",
    "txn-coordinator-kill": "#393b79",
    "output-leader-kill": "#843c39",
    "transformer-kill": "#637939",
}

_OTHER_KIND_COLOUR = "#7f7f7f"
_FAULT_ALPHA = 0.16
_FIG_WIDTH_IN = 11.0
_FIG_ROW_HEIGHT_IN = 3.4
_FIG_DPI = 96
_ACKED_COLOUR = "#1f77b4"
_ERROR_COLOUR = "#333333"
_ALARM_COLOUR = "#d62728"
_XLABEL = "seconds since the run started"
_DASHES = ("-", "--", ":", "-.")  # lines that coincide stay visible under each other
_PartitionKey = tuple[str, int]


class _Report(BaseModel):
    """The one object ``report.json`` holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    verdict: Verdict
    history: History


def write_report(history: History, verdict: Verdict, out_dir: Path) -> Path:
    """Write ``report.json`` and ``report.html`` into `out_dir` (created); return the html path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    report = _Report(verdict=verdict, history=history)
    json_text = json.dumps(report.model_dump(mode="json"), separators=(",", ":"))
    (out_dir / REPORT_JSON).write_text(json_text, encoding="utf-8")
    html_path = out_dir / REPORT_HTML
    html_path.write_text(_render_html(history, verdict), encoding="utf-8")
    return html_path


def load_report(path: Path) -> tuple[History, Verdict]:
    """Read a ``report.json`` (or the directory holding one) back, validated."""
    if path.is_dir():
        path = path / REPORT_JSON
    report = _Report.model_validate_json(path.read_bytes())
    return report.history, report.verdict


# -- figures shared by the terminal and the page -----------------------------------------------


def _plural(count: int, noun: str, nouns: str = "") -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {nouns or noun + 's'}"


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def _figure_rows(summary: Summary) -> list[tuple[str, str]]:
    return [
        ("attempted writes", f"{summary.attempted_writes:,}"),
        ("acknowledged writes", f"{summary.acknowledged_writes:,}"),
        ("indeterminate writes", f"{summary.indeterminate_writes:,}"),
        ("lost writes", f"{summary.lost_writes:,}"),
        ("duplicated values", f"{summary.duplicated_values:,}"),
        ("durability", summary.durability),
        *(
            [("lost to power-loss-all (reported)", f"{summary.lost_to_power_loss:,}")]
            if summary.power_loss_losses
            else []
        ),
        *(
            [
                ("unclean elections (KIP-966 offline)", f"{summary.unclean_elections:,}"),
                ("lost to unclean elections (reported)", f"{summary.lost_to_unclean_election:,}"),
            ]
            if summary.unclean_elections
            else []
        ),
        ("availability", f"{summary.availability * 100:.1f}%"),
        ("consumed records", f"{summary.consumed_records:,}"),
        ("commits ok", f"{summary.commits_ok:,}"),
        ("admin ops ok", f"{summary.admin_ops_ok:,}"),
        *_transaction_rows(summary),
    ]


def _transaction_rows(summary: Summary) -> list[tuple[str, str]]:
    """The transactions workload's figures (none for a plain run)."""
    txn = summary.transactions
    if txn is None:
        return []
    return [
        ("transactions committed", f"{txn.committed:,}"),
        *(
            [("  committed by client", ", ".join(f"{c} {n:,}" for c, n in by_client.items()))]
            if (by_client := txn.committed_by_client)
            else []
        ),
        ("transactions aborted (on purpose)", f"{txn.aborted:,} ({txn.aborted_on_purpose:,})"),
        ("transactions unknown", f"{txn.unknown:,}"),
        ("output records (read_committed)", f"{txn.output_records:,}"),
        ("transformer restarts", f"{txn.transformer_restarts:,}"),
    ]


def _fault_kind_rows(summary: Summary) -> list[tuple[str, int, str, str, str]]:
    """Per fault kind: count, recovered/measured, mean and max recovery ("never" if any never)."""
    by_kind: dict[str, list[float | None]] = defaultdict(list)
    for recovery in summary.recoveries:
        by_kind[recovery.kind].append(recovery.recovery_s)
    rows = []
    for kind in sorted(summary.faults_by_kind.keys() | by_kind.keys(), key=_kind_order):
        times = by_kind.get(kind, [])
        recovered = [t for t in times if t is not None]
        mean = _seconds(fmean(recovered)) if recovered else ("never" if times else "—")
        worst = "never" if None in times else (_seconds(max(recovered)) if recovered else "—")
        count = summary.faults_by_kind.get(kind, len(times))
        rows.append((kind, count, f"{len(recovered)}/{len(times)}", mean, worst))
    return rows


def power_loss_rows(summary: Summary) -> list[tuple[int, str, int, str]]:
    """What each power-loss-all took with the default durability: (fault id, partition,
    acknowledged records lost, their offsets)."""
    return [
        (loss.fault_id, f"{loss.topic}-{loss.partition}", loss.count,
         f"{loss.first_offset}-{loss.last_offset}")
        for loss in summary.power_loss_losses
    ]  # fmt: skip


def _finding_kind_rows(findings: Sequence[Finding]) -> list[tuple[str, int, str]]:
    """Per finding kind, in order of first appearance: count and the first message."""
    counts: dict[str, int] = {}
    first: dict[str, str] = {}
    for finding in findings:
        counts[finding.kind] = counts.get(finding.kind, 0) + 1
        first.setdefault(finding.kind, finding.message)
    return [(kind, count, first[kind]) for kind, count in counts.items()]


# -- terminal ----------------------------------------------------------------------------------


def print_summary(history: History, verdict: Verdict, console: Console) -> None:
    """The verdict line, the figures, faults by kind and findings by kind, as rich tables."""
    word, colour = ("PASS", "bold green") if verdict.ok else ("FAIL", "bold red")
    findings = _plural(len(verdict.findings), "finding")
    console.print(Text.assemble((word, colour), (f"  seed {history.seed}, {findings}", "bold")))
    figures = Table(title="figures")
    figures.add_column("figure")
    figures.add_column("value", justify="right")
    for name, value in _figure_rows(verdict.summary):
        alarm = name in ("lost writes", "duplicated values") and value != "0"
        figures.add_row(name, Text(value, style="bold red" if alarm else ""))
    console.print(figures)
    faults = Table(title="faults by kind", caption="recovery: until every partition acks again")
    for column in ("kind", "count", "recovered", "mean recovery", "max recovery"):
        faults.add_column(column, justify="left" if column == "kind" else "right")
    for kind, count, recovered, mean, worst in _fault_kind_rows(verdict.summary):
        faults.add_row(kind, str(count), recovered, mean, worst)
    console.print(faults if faults.row_count else Text("no faults injected"))
    if verdict.findings:
        table = Table(title="findings by kind")
        table.add_column("kind", style="red")
        table.add_column("count", justify="right")
        table.add_column("first message", overflow="fold")
        for kind, count, message in _finding_kind_rows(verdict.findings):
            table.add_row(kind, str(count), message)
        console.print(table)
    if verdict.summary.power_loss_losses:
        losses = Table(
            title="lost to power-loss-all (durability default: reported, not failed)",
            caption="acknowledged records no replica had fsynced when every node lost power",
        )
        for column in ("fault", "partition", "records", "offsets"):
            losses.add_column(column, justify="left" if column == "partition" else "right")
        for fault_id, partition, count, offsets in power_loss_rows(verdict.summary):
            losses.add_row(str(fault_id), partition, str(count), offsets)
        console.print(losses)


# -- series ------------------------------------------------------------------------------------


def _kind_order(kind: str) -> tuple[int, str]:
    """Fault kinds in `ALL_FAULT_KINDS` order, any other after them by name."""
    kinds = ALL_FAULT_KINDS
    return (kinds.index(kind), "") if kind in kinds else (len(kinds), kind)


def _x_end(history: History) -> float:
    """The right edge of every time plot: the last thing recorded, at least one second."""
    return max(1.0, history.end_s, history.workload_s, *(f.end_s for f in history.faults))


def _per_second(times: Iterable[float], seconds: int) -> npt.NDArray[np.intp]:
    """How many of `times` fall in each whole second [i, i + 1) of the run (clipped to it)."""
    index = np.floor(np.fromiter(times, dtype=float)).astype(np.intp)
    return np.bincount(np.clip(index, 0, seconds - 1), minlength=seconds)


def _latency_percentiles(
    history: History, seconds: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """p50 and p99 latency in ms of the acknowledged writes completed in each second (NaN: none)."""
    by_second: dict[int, list[float]] = defaultdict(list)
    for write in history.writes:
        if write.ok and write.end_s is not None:
            second = min(max(int(write.end_s), 0), seconds - 1)
            by_second[second].append((write.end_s - write.start_s) * 1000.0)
    p50 = np.full(seconds, np.nan)
    p99 = np.full(seconds, np.nan)
    for second, latencies_ms in by_second.items():
        p50[second], p99[second] = np.percentile(latencies_ms, [50, 99])
    return p50, p99


def _by_partition(samples: Iterable[MetadataSample]) -> dict[_PartitionKey, list[MetadataSample]]:
    """The samples of each (topic, partition) in time order, partitions sorted."""
    groups: dict[_PartitionKey, list[MetadataSample]] = defaultdict(list)
    for sample in sorted(samples, key=lambda s: s.time_s):
        groups[(sample.topic, sample.partition)].append(sample)
    return dict(sorted(groups.items()))


def _leader_changes(samples: Sequence[MetadataSample]) -> list[MetadataSample]:
    """The samples (of one partition, in time order) whose leader differs from the one before."""
    return [now for before, now in pairwise(samples) if now.leader != before.leader]


# -- plots -------------------------------------------------------------------------------------


def _new_figure(rows: int = 1) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(_FIG_WIDTH_IN, _FIG_ROW_HEIGHT_IN * rows), dpi=_FIG_DPI)
    fig.set_layout_engine("constrained")
    FigureCanvasAgg(fig)  # the Agg backend, explicitly; no pyplot
    axes = list(fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0])
    axes[-1].set_xlabel(_XLABEL)
    return fig, axes


def _png_data_url(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _no_data(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="#888")


def _shade_faults(ax: Axes, faults: Sequence[FaultWindow]) -> list[Artist]:
    """One span per fault window in its kind's colour, its id small at the top; legend handles."""
    kinds: set[FaultKind] = set()
    for fault in faults:
        colour = KIND_COLOURS.get(fault.kind, _OTHER_KIND_COLOUR)
        ax.axvspan(fault.start_s, fault.end_s, color=colour, alpha=_FAULT_ALPHA, linewidth=0)
        ax.text(
            fault.start_s, 0.98, f"#{fault.id}", transform=ax.get_xaxis_transform(),
            fontsize=7, color=colour, ha="left", va="top", clip_on=True,
        )  # fmt: skip
        kinds.add(fault.kind)
    colours = {kind: KIND_COLOURS.get(kind, _OTHER_KIND_COLOUR) for kind in kinds}
    ordered = sorted(kinds, key=_kind_order)
    return [
        Patch(facecolor=colours[k], alpha=2 * _FAULT_ALPHA, label=f"fault: {k}") for k in ordered
    ]


def _finish_time_axis(
    ax: Axes, history: History, title: str, ylabel: str, handles: Sequence[Artist]
) -> None:
    """Title, limits, grid, fault windows, the end of the workloads and one legend outside."""
    ax.set_title(title, loc="left", fontsize=11)
    ax.set_ylabel(ylabel)
    ax.set_xlim(0.0, _x_end(history))
    ax.grid(True, alpha=0.3)
    fault_handles = _shade_faults(ax, history.faults)
    ax.axvline(history.workload_s, color="#555", linestyle="--", linewidth=0.8)
    stop = Line2D([], [], color="#555", linestyle="--", linewidth=0.8, label="workloads stopped")
    every = [*handles, *fault_handles, stop]
    ax.legend(
        handles=every, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
        frameon=False, ncols=1 + len(every) // 16,
    )  # fmt: skip


def _plot_throughput(history: History) -> str:
    seconds = math.ceil(_x_end(history))
    fig, (ax,) = _new_figure()
    handles: list[Artist] = []
    if history.writes:
        edges = np.arange(seconds + 1)
        acked = (w.end_s for w in history.writes if w.ok and w.end_s is not None)
        failed = (w.end_s for w in history.writes if not w.ok and w.end_s is not None)
        unresolved = sum(1 for w in history.writes if w.end_s is None)
        label = "errors and timeouts / s"
        if unresolved:
            label += f"\n({unresolved} without an outcome not shown)"
        counts = _per_second(acked, seconds)
        handles.append(ax.stairs(counts, edges, color=_ACKED_COLOUR, label="acknowledged / s"))
        counts = _per_second(failed, seconds)
        handles.append(ax.stairs(counts, edges, color=_ERROR_COLOUR, label=label))
        ax.set_ylim(bottom=0)
    else:
        _no_data(ax)
    _finish_time_axis(ax, history, "Writes per second (by outcome time)", "writes / s", handles)
    return _png_data_url(fig)


def _plot_latency(history: History) -> str:
    seconds = math.ceil(_x_end(history))
    fig, (ax,) = _new_figure()
    handles: list[Artist] = []
    p50, p99 = _latency_percentiles(history, seconds)
    if np.isfinite(p50).any():
        centres = np.arange(seconds) + 0.5
        floor_ms = 0.01  # a log axis cannot show 0 ms
        for values, label, style in ((p99, "p99", "-"), (p50, "p50", "-.")):
            (line,) = ax.plot(
                centres, np.maximum(values, floor_ms), style, marker=".", markersize=3,
                color=_ACKED_COLOUR, label=f"{label} latency", linewidth=1.1,
            )  # fmt: skip
            handles.append(line)
        ax.set_yscale("log")
    else:
        _no_data(ax)
    title = "Latency of acknowledged writes per second (send to acknowledgement)"
    _finish_time_axis(ax, history, title, "ms (log)", handles)
    return _png_data_url(fig)


def _partition_steps(
    ax: Axes,
    groups: dict[_PartitionKey, list[MetadataSample]],
    value: Callable[[MetadataSample], int],
) -> list[tuple[Line2D, float]]:
    """One step line of `value` per partition, each nudged up or down by its own small offset so
    lines on the same value stay apart; returns each line with its offset."""
    step = min(0.08, 0.5 / max(len(groups), 1))
    colours = colormaps["tab10" if len(groups) <= 10 else "tab20"]
    drawn = []
    for i, ((topic, partition), samples) in enumerate(groups.items()):
        offset = (i - (len(groups) - 1) / 2) * step
        (line,) = ax.plot(
            [s.time_s for s in samples], [value(s) + offset for s in samples],
            drawstyle="steps-post", color=colours(i % colours.N), linewidth=1.3,
            label=f"{topic}-{partition}",
        )  # fmt: skip
        drawn.append((line, offset))
    return drawn


def _plot_isr(history: History) -> str:
    fig, (ax,) = _new_figure()
    groups = _by_partition(history.samples)
    lines = _partition_steps(ax, groups, lambda s: len(s.isr))
    handles: list[Artist] = [line for line, _ in lines]
    leaderless = 0
    for (_, offset), samples in zip(lines, groups.values(), strict=True):
        points = [(s.time_s, len(s.isr) + offset) for s in samples if s.leader == -1]
        leaderless += len(points)
        if points:
            times, sizes = zip(*points, strict=True)
            ax.plot(times, sizes, "x", color=_ALARM_COLOUR, markersize=6, markeredgewidth=1.5)
    if leaderless:
        handles.append(
            Line2D([], [], marker="x", linestyle="", color=_ALARM_COLOUR, label="no leader")
        )
    if groups:
        top = max(len(history.nodes), *(len(s.isr) for s in history.samples))
        ax.set_ylim(-0.5, top + 0.5)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        _no_data(ax)
    title = "ISR size per partition (lines nudged apart)"
    _finish_time_axis(ax, history, title, "replicas in ISR", handles)
    return _png_data_url(fig)


def _plot_leaders(history: History) -> str:
    fig, (ax,) = _new_figure()
    groups = _by_partition(history.samples)
    lines = _partition_steps(ax, groups, lambda s: s.leader)
    handles: list[Artist] = [line for line, _ in lines]
    for (line, offset), samples in zip(lines, groups.values(), strict=True):
        changes = _leader_changes(samples)
        ax.plot(
            [s.time_s for s in changes], [s.leader + offset for s in changes], "o",
            markersize=6, markerfacecolor="none", markeredgecolor=line.get_color(),
        )  # fmt: skip
    if groups:
        handles.append(
            Line2D([], [], marker="o", linestyle="", markerfacecolor="none",
                   markeredgecolor="#444", label="leader change")
        )  # fmt: skip
        leaders = {s.leader for s in history.samples} | set(history.nodes) | {-1}
        ticks = sorted(leaders)
        ax.set_yticks(ticks, ["none" if t == -1 else str(t) for t in ticks])
        ax.set_ylim(ticks[0] - 0.5, ticks[-1] + 0.5)
    else:
        _no_data(ax)
    title = "Leader per partition (node id; lines nudged apart)"
    _finish_time_axis(ax, history, title, "leader node", handles)
    return _png_data_url(fig)


def _plot_consumer(history: History) -> str:
    seconds = math.ceil(_x_end(history))
    fig, (rate_ax, offset_ax) = _new_figure(rows=2)
    handles: list[Artist] = []
    if history.consumed:
        counts = _per_second((c.time_s for c in history.consumed), seconds)
        edges = np.arange(seconds + 1)
        handles.append(rate_ax.stairs(counts, edges, color=_ACKED_COLOUR, label="consumed / s"))
        rate_ax.set_ylim(bottom=0)
    else:
        _no_data(rate_ax)
    title = f"Consumer group {history.group}: records received per second"
    _finish_time_axis(rate_ax, history, title, "records / s", handles)
    groups: dict[_PartitionKey, list[tuple[float, int]]] = defaultdict(list)
    for seen in sorted(history.committed, key=lambda c: c.time_s):
        groups[(seen.topic, seen.partition)].append((seen.time_s, seen.offset))
    colours = colormaps["tab10" if len(groups) <= 10 else "tab20"]
    lines: list[Artist] = []
    for i, ((topic, partition), points) in enumerate(sorted(groups.items())):
        times, offsets = zip(*points, strict=True)
        lines += offset_ax.plot(
            times, offsets, drawstyle="steps-post", marker=".", markersize=3,
            color=colours(i % colours.N), linestyle=_DASHES[i % len(_DASHES)],
            label=f"{topic}-{partition}",
        )  # fmt: skip
    if not groups:
        _no_data(offset_ax)
    title = "Committed offset per partition (OffsetFetch; -1: nothing committed)"
    _finish_time_axis(offset_ax, history, title, "committed offset", lines)
    return _png_data_url(fig)


# -- html --------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       color: #222; max-width: 1240px; margin: 1.5em auto; padding: 0 1em; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: .4em; }
h2 { font-size: 1.2em; border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.8em; }
h3 { font-size: 1em; margin-bottom: .2em; }
table { border-collapse: collapse; margin: .4em 0 1em; font-size: .88em; }
th, td { border: 1px solid #c8c8c8; padding: .22em .6em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
.num { text-align: right; white-space: nowrap;
       font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.banner { color: #fff; font-size: 1.35em; font-weight: bold; padding: .5em .9em;
          border-radius: 4px; }
.pass { background: #2e7d32; }
.fail { background: #c62828; }
.muted { color: #666; }
.problems li { color: #b00020; }
figure { margin: 1.2em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: .88em; }
"""


def _esc(value: object) -> str:
    return html.escape(str(value))


def _cell(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def _table(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    numeric: Container[str] = (),
    empty: str = "none",
) -> str:
    """An html table, every cell escaped; `numeric` columns right aligned in monospace."""
    classes = [' class="num"' if c in numeric else "" for c in columns]
    body = [
        "<tr>" + "".join(f"<td{k}>{_esc(_cell(v))}</td>" for k, v in zip(classes, row, strict=True))
        for row in rows
    ]
    if not body:
        return f'<p class="muted">{_esc(empty)}</p>\n'
    head = "".join(f"<th{k}>{_esc(c)}</th>" for k, c in zip(classes, columns, strict=True))
    return f"<table>\n<tr>{head}</tr>\n" + "</tr>\n".join(body) + "</tr>\n</table>\n"


def _section(title: str, body: str) -> str:
    return f"<h2>{_esc(title)}</h2>\n{body}"


def _banner(verdict: Verdict) -> str:
    if verdict.ok:
        return '<div class="banner pass">PASS — no findings</div>\n'
    kinds = ", ".join(f"{kind} {count}" for kind, count, _ in _finding_kind_rows(verdict.findings))
    text = f"FAIL — {_plural(len(verdict.findings), 'finding')}" + (f": {kinds}" if kinds else "")
    return f'<div class="banner fail">{_esc(text)}</div>\n'


def _facts_html(history: History) -> str:
    facts = [
        ("started at", history.started_at),
        ("seed", history.seed),
        ("nodes", ", ".join(str(n) for n in history.nodes)),
        ("faults requested", ", ".join(history.faults_requested) or "none"),
        ("duration requested", f"{history.duration_s:.1f} s"),
        ("workloads stopped at", f"{history.workload_s:.1f} s"),
        ("final state read at", f"{history.end_s:.1f} s"),
        ("topic", history.topic),
        ("partitions", history.partitions),
        ("consumer group", history.group),
        ("durability", history.durability),
    ]
    return _table(("fact", "value"), facts)


def _faults_html(history: History, summary: Summary) -> str:
    recoveries = {r.fault_id: r.recovery_s for r in summary.recoveries}
    rows = [
        (
            f.id, f.kind, f.nodes, f.start_s, f.end_s, f.end_s - f.start_s, f.detail,
            _seconds(recoveries[f.id]) if f.id in recoveries else None,
        )
        for f in sorted(history.faults, key=lambda f: f.start_s)
    ]  # fmt: skip
    columns = ("id", "kind", "nodes", "start s", "end s", "length s", "detail", "recovery")
    numeric = {"id", "start s", "end s", "length s", "recovery"}
    by_kind = ("kind", "count", "recovered", "mean recovery", "max recovery")
    return (
        _table(columns, rows, numeric, empty="no faults injected")
        + "<h3>By kind</h3>\n"
        + _table(by_kind, _fault_kind_rows(summary), set(by_kind) - {"kind"}, "no faults")
    )


def _findings_html(findings: Sequence[Finding]) -> str:
    if not findings:
        return '<p class="muted">none</p>\n'
    by_kind = _table(("kind", "count", "first message"), _finding_kind_rows(findings), {"count"})
    rows = [
        (f.kind, f.message, None if f.topic is None else f"{f.topic}-{f.partition}", f.offset,
         f.value, f.time_s, f.faults)
        for f in findings[:FINDINGS_SHOWN_MAX]
    ]  # fmt: skip
    columns = ("kind", "message", "partition", "offset", "value", "time s", "faults")
    table = _table(columns, rows, {"offset", "time s", "faults"})
    hidden = len(findings) - FINDINGS_SHOWN_MAX
    more = f'<p class="muted">{hidden:,} more findings are in report.json.</p>\n'
    return by_kind + "<h3>All findings</h3>\n" + table + (more if hidden > 0 else "")


def _power_loss_html(verdict: Verdict) -> str:
    """What power-loss-all took with the default durability, and the findings that follow
    from it (reported, not failed); nothing when there are none."""
    if not verdict.reported and not verdict.summary.power_loss_losses:
        return ""
    columns = ("fault", "partition", "records", "offsets")
    losses = _table(columns, power_loss_rows(verdict.summary), {"fault", "records"}, "none")
    body = (
        '<p class="muted">With Kafka\'s default durability an acknowledged record is in the '
        "ISR's memory, fsynced later: when every node loses power at once the records no "
        "replica had fsynced are lost. Reported, not failed.</p>\n"
        + losses
        + "<h3>Findings that follow from it</h3>\n"
        + _findings_html(verdict.reported)
    )
    return _section("Lost to power-loss-all", body)


def _problems_html(problems: Sequence[str]) -> str:
    if not problems:
        return ""
    items = "".join(f"<li>{_esc(p)}</li>\n" for p in problems)
    return _section("Harness problems", f'<ul class="problems">\n{items}</ul>\n')


def _leader_table(history: History) -> str:
    rows = []
    for (topic, partition), samples in _by_partition(history.samples).items():
        sequence = [samples[0], *_leader_changes(samples)]
        names = ["none" if s.leader == -1 else str(s.leader) for s in sequence]
        if len(names) > LEADER_SEQUENCE_SHOWN_MAX:
            names = [*names[:LEADER_SEQUENCE_SHOWN_MAX], "…"]
        epochs = f"{samples[0].leader_epoch} → {samples[-1].leader_epoch}"
        leaderless = sum(1 for s in samples if s.leader == -1)
        rows.append(
            (f"{topic}-{partition}", len(samples), len(sequence) - 1, epochs, leaderless,
             " → ".join(names))
        )  # fmt: skip
    columns = ("partition", "samples", "leader changes", "leader epoch", "leaderless samples",
               "leaders in order")  # fmt: skip
    numeric = {"samples", "leader changes", "leader epoch", "leaderless samples"}
    return _table(columns, rows, numeric, empty="no metadata samples")


def _plots_html(history: History) -> str:
    plots = [
        (_plot_throughput, "Writes: acknowledged and failed per second, by the time the outcome "
         "was known. Shaded: fault windows, labelled with their ids.", ""),
        (_plot_latency, "Latency percentiles of acknowledged writes, per second.", ""),
        (_plot_isr, "ISR size per partition from metadata samples; x: sampled without a leader.",
         ""),
        (_plot_leaders, "Leader node per partition; circles: the leader changed.",
         "<h3>Leader changes per partition (as sampled)</h3>\n" + _leader_table(history)),
        (_plot_consumer, "Consumer group: records received per second and committed offsets.",
         ""),
    ]  # fmt: skip
    parts = []
    for plot, caption, extra in plots:
        url = plot(history)
        parts.append(
            f'<figure>\n<img src="{url}" alt="{_esc(caption)}">\n'
            f"<figcaption>{_esc(caption)}</figcaption>\n</figure>\n{extra}"
        )
    return "".join(parts)


def _final_html(history: History) -> str:
    rows = []
    for part in sorted(history.final, key=lambda p: (p.topic, p.partition)):
        replicas = "; ".join(
            f"node {r.node_id}: {_plural(len(r.batches), 'batch', 'batches')}"
            + (f" to offset {r.batches[-1].last_offset}" if r.batches else "")
            for r in part.replicas
        )
        rows.append(
            (f"{part.topic}-{part.partition}", part.leader, part.isr, part.log_start_offset,
             part.high_watermark, len(part.records), replicas or None)
        )  # fmt: skip
    columns = ("partition", "leader", "isr", "log start", "high watermark", "records", "replicas")
    numeric = {"leader", "log start", "high watermark", "records"}
    return _table(columns, rows, numeric, empty="no final state was read")


def _render_html(history: History, verdict: Verdict) -> str:
    title = _esc(f"raftlog chaos run — seed {history.seed}")
    summary = verdict.summary
    body = "".join(
        [
            f"<h1>{title}</h1>\n",
            _banner(verdict),
            _section("Run", _facts_html(history)),
            _section("Figures", _table(("figure", "value"), _figure_rows(summary), {"value"})),
            _section("Faults", _faults_html(history, summary)),
            _section("Findings", _findings_html(verdict.findings)),
            _power_loss_html(verdict),
            _problems_html(history.problems),
            _section("Plots", _plots_html(history)),
            _section("Final partitions", _final_html(history)),
        ]
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{title}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n{body}</body>\n</html>\n"
    )
