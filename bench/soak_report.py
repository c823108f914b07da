"""The soak run's report: ``summary.json`` and one PNG per figure over time, per node, with the
fault windows shaded (bench/soak.py writes ``samples.jsonl`` as it goes).

Plots are drawn on `matplotlib.figure.Figure` objects with an Agg canvas, never through pyplot
(as chaos/report.py draws its own).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bench.soak_rules import NodeSample, SoakVerdict, Windows
from chaos.history import FaultWindow

SUMMARY_JSON = "summary.json"
SAMPLES_JSONL = "samples.jsonl"
MIB = 1024 * 1024
# (file stem, title, y label, value of a sample, up samples only)
PLOTS: tuple[tuple[str, str, str, str, float, bool], ...] = (
    ("rss", "Resident memory (RSS)", "MiB", "rss_bytes", MIB, True),
    ("fds", "Open file descriptors", "descriptors", "fds", 1, True),
    ("threads", "Threads", "threads", "threads", 1, True),
    ("disk", "Data directory on disk (du)", "MiB", "disk_bytes", MIB, False),
    ("retained", "Retention-governed partitions vs their bound", "MiB", "retained_bytes", MIB,
     False),
    ("metadata", "Metadata log: journal and snapshot", "KiB", "journal_bytes", 1024, False),
)  # fmt: skip
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
_FAULT_COLOUR = "#999999"


def _figure() -> tuple[Figure, Any]:
    fig = Figure(figsize=(10, 3.6), dpi=100)
    fig.set_layout_engine("constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def plot(
    samples: Sequence[NodeSample],
    faults: Sequence[FaultWindow],
    windows: Windows | None,
    out_dir: Path,
) -> list[Path]:
    """One PNG per entry of `PLOTS` in ``out_dir``; their paths."""
    nodes = sorted({s.node_id for s in samples})
    paths = []
    for stem, title, unit, field, scale, up_only in PLOTS:
        fig, ax = _figure()
        for i, node in enumerate(nodes):
            mine = [s for s in samples if s.node_id == node and (s.up or not up_only)]
            colour = _COLOURS[i % len(_COLOURS)]
            xs = [s.time_s / 60 for s in mine]
            ax.plot(xs, [getattr(s, field) / scale for s in mine], color=colour,
                    linewidth=1.0, label=f"node {node}")  # fmt: skip
            if stem == "retained":
                ax.plot(xs, [s.retained_bound_bytes / scale for s in mine], color=colour,
                        linewidth=0.8, linestyle="--", label=f"node {node} bound")  # fmt: skip
            if stem == "metadata":
                ax.plot(xs, [s.snapshot_bytes / scale for s in mine], color=colour,
                        linewidth=0.8, linestyle=":", label=f"node {node} snapshot")  # fmt: skip
        for fault in faults:
            ax.axvspan(fault.start_s / 60, fault.end_s / 60, color=_FAULT_COLOUR, alpha=0.25,
                       linewidth=0)  # fmt: skip
            ax.text(fault.start_s / 60, 0.98, fault.kind, transform=ax.get_xaxis_transform(),
                    fontsize=6, rotation=90, va="top", color="#555")  # fmt: skip
        if windows is not None:
            for start, end in (windows.baseline, windows.final):
                ax.axvline(start / 60, color="#444", linestyle=":", linewidth=0.7)
                ax.axvline(end / 60, color="#444", linestyle=":", linewidth=0.7)
        ax.set_title(f"{title} (grey: faults; dotted: the growth windows)", loc="left", fontsize=10)
        ax.set_xlabel("minutes since the workloads started")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, frameon=False)
        path = out_dir / f"{stem}.png"
        fig.savefig(path, format="png", metadata={"Software": None})
        paths.append(path)
    return paths


def summary(
    verdict: SoakVerdict,
    samples: Sequence[NodeSample],
    figures: dict[str, Any],
) -> dict[str, Any]:
    """The run's figures and every rule's outcome, as ``summary.json`` holds them."""
    nodes = sorted({s.node_id for s in samples})
    per_node = {}
    for node in nodes:
        mine = [s for s in samples if s.node_id == node]
        up = [s for s in mine if s.up]
        per_node[str(node)] = {
            "samples": len(mine),
            "samples_down": len(mine) - len(up),
            "pids": sorted({s.pid for s in up}),
            "rss_bytes_max": max((s.rss_bytes for s in up), default=0),
            "fds_max": max((s.fds for s in up), default=0),
            "threads_max": max((s.threads for s in up), default=0),
            "disk_bytes_max": max((s.disk_bytes for s in mine), default=0),
            "compacted_bytes_max": max((s.compacted_bytes for s in mine), default=0),
            "journal_bytes_max": max((s.journal_bytes for s in mine), default=0),
            "snapshot_index_last": max((s.snapshot_index for s in mine), default=-1),
        }
    return {
        "ok": verdict.ok,
        "failures": verdict.failures,
        **figures,
        "nodes": per_node,
        "growth": [
            {
                "node": g.node_id,
                "metric": g.metric,
                "baseline_median": g.baseline,
                "final_median": g.final,
                "growth": g.fraction,
                "ok": g.ok,
            }
            for g in verdict.growth
        ],
        "disk": [
            {
                "node": d.node_id,
                "retained_bytes_peak": d.peak_bytes,
                "peak_fraction_of_bound": d.peak_fraction,
                "samples_over_bound": len(d.over),
                "ok": d.ok,
            }
            for d in verdict.disk
        ],
        "metadata": [
            {
                "node": m.node_id,
                "snapshot_advances": m.snapshot_advances,
                "journal_cuts": m.journal_cuts,
                "journal_max_baseline": m.journal_max_baseline,
                "journal_max_final": m.journal_max_final,
                "ok": m.ok,
            }
            for m in verdict.metadata
        ],
        "retention_deleted": verdict.retention_deleted,
        "checker_ok": verdict.checker_ok,
    }


def write_summary(out_dir: Path, data: dict[str, Any]) -> Path:
    path = out_dir / SUMMARY_JSON
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def read_samples(path: Path) -> list[NodeSample]:
    return [NodeSample.from_json(json.loads(line)) for line in path.read_text().splitlines()]
