"""What ``python -m bench.peer_bench`` prints: the comparison with JetStream against the
machine's limits, and where the CPU went in each produce run (the burst and the sustained one).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from bench.cpu_profile import CATEGORIES
from bench.cpu_profile import OTHER as OTHER_ROLE
from bench.performance_page import (
    PEER_SUSTAINED_OF_DIRECT_WRITE_MIN as SUSTAINED_OF_DIRECT_WRITE_MIN,
)


def _ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs else "-"


def print_report(console: Console, figures: dict[str, Any]) -> None:
    ours, peer = figures["raftlog"], figures["jetstream"]
    disk, network = figures["limits"]["disk"], figures["limits"]["network"]
    copies = figures["replication_factor"]
    table = Table(title="raftlog vs NATS JetStream: 1 KiB records, RF 3, Python clients")
    for column in ("measure", "raftlog", "JetStream", "raftlog ÷ JetStream", "limit", "÷ limit"):
        table.add_column(column, justify="right")
    for name, key in (("produce records/s", "produce"), ("consume records/s", "consume")):
        a, b = ours[key]["records_per_s"], peer[key]["records_per_s"]
        table.add_row(name, f"{a:,}", f"{b:,}", _ratio(a, b), "", "")
    produce_mb, peer_mb = ours["produce"]["mb_per_s"], peer["produce"]["mb_per_s"]
    for limit_name, limit in (
        (f"fio direct write ÷ {copies}", disk["direct_write_mb_per_s"] / copies),
        (f"fio fdatasync ÷ {copies}", disk["fdatasync_mb_per_s"] / copies),
        (f"fio buffered ÷ {copies}, a figure", disk["buffered_mb_per_s"] / copies),
    ):
        table.add_row(
            "produce MB/s", str(produce_mb), str(peer_mb), _ratio(produce_mb, peer_mb),
            f"{limit:.0f} ({limit_name})", _ratio(produce_mb, limit),
        )  # fmt: skip
    _sustained_rows(table, ours["sustained"], peer["sustained"], disk, copies)
    loopback = network["loopback_mb_per_s"]
    table.add_row(
        "consume MB/s", str(ours["consume"]["mb_per_s"]), "", "",
        f"{loopback:,.0f} (iperf3)", _ratio(ours["consume"]["mb_per_s"], loopback),
    )  # fmt: skip
    table.add_row("", "", "", "", f"{disk['direct_read_mb_per_s']:,.0f} (fio direct read)", "")
    ours_latency = ours["latency_at_half_saturation"]
    peer_latency = peer["latency_at_half_saturation"]
    for quantile in ("p50", "p99", "p999"):
        a, b = ours_latency["latency_ms"][quantile], peer_latency["latency_ms"][quantile]
        table.add_row(
            f"produce latency {quantile} ms at ½ saturation", f"{a:.1f}", f"{b:.1f}",
            _ratio(a, b), "", "",
        )  # fmt: skip
    worst_ours, worst_peer = max(ours["failover_s"]), max(peer["failover_s"])
    table.add_row(
        "leader failover s (worst)", f"{worst_ours:.2f}", f"{worst_peer:.2f}",
        _ratio(worst_ours, worst_peer), "", "",
    )  # fmt: skip
    console.print(table)
    for run, title in (("produce", "the burst"), ("sustained", "the sustained run")):
        console.print(_cpu_table(title, ours[run]["cpu"], peer[run]["cpu"]))
    for name, profile in ours["broker_profiles"].items():
        top = ", ".join(f"{f['function']} {f['percent']}%" for f in profile["top_own"][:3])
        console.print(
            f"py-spy {name}: {profile['busy_samples']} busy samples, "
            f"{profile['per_record_codec_percent']}% under the per-record codec; top: {top}"
        )


def _sustained_rows(
    table: Table, ours: dict[str, Any], peer: dict[str, Any], disk: dict[str, Any], copies: int
) -> None:
    """The sustained runs' figures: their last window's rate and p99, against the disk."""
    window = f"last {ours['last']['window_s']:.0f} s of {ours['seconds']:.0f}"
    a, b = ours["last"]["records_per_s"], peer["last"]["records_per_s"]
    table.add_row(f"sustained records/s ({window})", f"{a:,}", f"{b:,}", _ratio(a, b), "", "")
    limit = disk["direct_write_mb_per_s"] / copies
    target = "met" if ours["mb_per_s"] >= SUSTAINED_OF_DIRECT_WRITE_MIN * limit else "NOT met"
    table.add_row(
        "sustained MB/s", str(ours["mb_per_s"]), str(peer["mb_per_s"]),
        _ratio(ours["mb_per_s"], peer["mb_per_s"]),
        f"{limit:.0f} (fio direct write ÷ {copies})",
        f"{_ratio(ours['mb_per_s'], limit)} (≥ {SUSTAINED_OF_DIRECT_WRITE_MIN:.0%}: {target})",
    )  # fmt: skip
    p99, peer_p99 = ours["last"]["latency_ms"]["p99"], peer["last"]["latency_ms"]["p99"]
    table.add_row(
        "sustained p99 ms (same window)", f"{p99:.1f}", f"{peer_p99:.1f}", _ratio(p99, peer_p99),
        "", "",
    )  # fmt: skip
    for system in (ours, peer):
        if not system["reached_disk_bytes_min"]:
            table.caption = "a sustained run stopped at its time bound short of its bytes"


def _cpu_table(run: str, ours: dict[str, Any], peer: dict[str, Any]) -> Table:
    """CPU µs per record in each system's ``run``, by what ran (rows) and which process
    (columns)."""
    table = Table(title=f"where the CPU went in {run}: µs per record (perf record -a)")
    table.add_column("what ran")
    columns = [
        (f"{system} {role}", figures)
        for system, cpu in (("raftlog", ours), ("JetStream", peer))
        for role, figures in cpu["roles"].items()
        if role != OTHER_ROLE
    ]
    for name, _ in columns:
        table.add_column(name, justify="right")
    for cat in CATEGORIES:
        cells = [figures["us_per_record_by_category"].get(cat) for _, figures in columns]
        if any(cells):
            table.add_row(cat, *(f"{cell:.1f}" if cell else "" for cell in cells))
    table.add_row("all", *(f"{figures['us_per_record']:.1f}" for _, figures in columns))
    table.caption = (
        "page-cache writes: "
        f"{ours['page_cache_mb_per_cpu_second'] or 0:,} MB per CPU second in raftlog's run, "
        f"{peer['page_cache_mb_per_cpu_second'] or 0:,} in JetStream's"
    )
    return table
