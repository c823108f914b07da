"""What the console's charts draw: a bounded history of samples (the last `WINDOW_S`), the series
computed from it, and the charts themselves as inline SVG. Everything here but `Sampler` is
pure; `Sampler` is the thin IO shell, one background thread per console that reads a sample
every ``interval_s`` through a `read` function (:func:`dataplane.console.reads.read_sample`:
the admin client and a consumer, as every page reads) and is stopped with the console.

A sample holds, at one wall-clock time: every partition's log end offset (the high
watermark), its ISR size, and each consumer group's committed offsets. The series follow:

- records in per topic: the growth of its partitions' end offsets over the time between two
  samples, per second (Kafka's ``MessagesInPerSec`` counts records appended; the end offset
  moves by as many, transaction markers aside);
- records out per topic: the growth of every group's committed offsets on its partitions, per
  second (what consumers finished with, as a lag exporter sees it; a consumer without a group
  commits nothing and is not counted);
- lag per group: ``max(0, end - committed)`` summed over its partitions, the formula of
  ``raftlog group describe`` (dataplane.client.group_lag), taken with the sample's ends;
- ISR size per partition.

A counter that goes back (a topic deleted and made again, offsets reset to earlier) gives no
rate for that step rather than a negative one; a partition missing from either sample of a
step is left out of that step.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from itertools import pairwise

from dataplane.client import TopicPartition

log = logging.getLogger(__name__)

WINDOW_S = 3600.0  # the history kept: the last hour (issue 33's lag chart)
SAMPLE_INTERVAL_S = 10.0  # console.sample.interval.ms's default

Point = tuple[float, float]  # (wall-clock seconds, value)


@dataclass(frozen=True)
class Sample:
    at: float  # time.time() when the reads started
    ends: Mapping[TopicPartition, int]
    isr: Mapping[TopicPartition, int]
    committed: Mapping[str, Mapping[TopicPartition, int]]  # by group id


class History:
    """The samples of the last ``window_s``, oldest first; at most ``window_s / interval_s``
    plus one of them, so a clock that jumps cannot make it grow. Safe from any thread."""

    def __init__(self, interval_s: float, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[Sample] = deque(maxlen=math.ceil(window_s / interval_s) + 1)
        self._lock = threading.Lock()

    def add(self, sample: Sample) -> None:
        with self._lock:
            self._samples.append(sample)
            while self._samples and self._samples[0].at < sample.at - self.window_s:
                self._samples.popleft()

    def samples(self) -> tuple[Sample, ...]:
        with self._lock:
            return tuple(self._samples)


# -- series ---------------------------------------------------------------------------------------
def _rate(
    before: Mapping[TopicPartition, int], after: Mapping[TopicPartition, int], topic: str, dt: float
) -> float | None:
    grown = 0
    for tp, offset in after.items():
        if tp.topic != topic or tp not in before:
            continue
        if offset < before[tp]:
            return None  # a counter went back: no rate for this step
        grown += offset - before[tp]
    return grown / dt


def records_in(samples: Sequence[Sample], topic: str) -> list[Point]:
    """Records appended to ``topic`` per second, one point per step between samples (at its end)."""
    points = []
    for a, b in pairwise(samples):
        rate = _rate(a.ends, b.ends, topic, b.at - a.at) if b.at > a.at else None
        if rate is not None:
            points.append((b.at, rate))
    return points


def records_out(samples: Sequence[Sample], topic: str) -> list[Point]:
    """Records of ``topic`` that groups committed past per second, summed over the groups."""
    points = []
    for a, b in pairwise(samples):
        if b.at <= a.at:
            continue
        rates = [
            _rate(a.committed[group], offsets, topic, b.at - a.at)
            for group, offsets in b.committed.items()
            if group in a.committed
        ]
        if None not in rates:
            points.append((b.at, sum(r for r in rates if r is not None)))
    return points


def group_lag(samples: Sequence[Sample], group: str) -> list[Point]:
    """The group's total lag at each sample that has its committed offsets."""
    points = []
    for s in samples:
        committed = s.committed.get(group)
        if committed is None:
            continue
        lag = sum(max(0, s.ends[tp] - offset) for tp, offset in committed.items() if tp in s.ends)
        points.append((s.at, float(lag)))
    return points


def isr_sizes(samples: Sequence[Sample], topic: str) -> dict[str, list[Point]]:
    """Each partition's ISR size over time, keyed by its label ("p0", "p1" ...)."""
    series: dict[int, list[Point]] = {}
    for s in samples:
        for tp, size in s.isr.items():
            if tp.topic == topic:
                series.setdefault(tp.partition, []).append((s.at, float(size)))
    return {f"p{p}": series[p] for p in sorted(series)}


# -- charts ---------------------------------------------------------------------------------------
CHART_WIDTH, CHART_HEIGHT = 420, 140
_PAD_LEFT, _PAD_RIGHT, _PAD_TOP, _PAD_BOTTOM = 48, 8, 20, 20
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
SERIES_SHOWN_MAX = len(COLOURS)  # more lines than colours say nothing: the rest are left out


def _number(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    if value >= 1e3:
        return f"{value / 1e3:.3g}k"
    return f"{value:.3g}"


def _ago(seconds: float) -> str:
    return f"-{seconds / 60:.0f} min" if seconds >= 120 else f"-{seconds:.0f} s"


def line_chart(title: str, series: Mapping[str, Sequence[Point]], chart_id: str) -> str:
    """A small SVG line chart of ``series`` (name -> points, time in seconds): y from 0 to the
    largest value, x from the first point to the last, labelled with how long ago they were.
    A chart with fewer than two points in all says so instead of drawing lines."""
    lines = [(name, points) for name, points in series.items() if points][:SERIES_SHOWN_MAX]
    points_all = [p for _, points in lines for p in points]
    head = (
        f'<svg class="chart" id="{escape(chart_id)}" role="img" width="{CHART_WIDTH}" '
        f'height="{CHART_HEIGHT}" viewBox="0 0 {CHART_WIDTH} {CHART_HEIGHT}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
        f'<text x="{_PAD_LEFT}" y="13" font-size="12" font-weight="bold">{escape(title)}</text>'
    )
    if len(points_all) < 2:
        return (
            head + f'<text x="{_PAD_LEFT}" y="{CHART_HEIGHT // 2}" font-size="12" fill="#777">'
            "no samples yet</text></svg>"
        )
    t0, t1 = min(t for t, _ in points_all), max(t for t, _ in points_all)
    top = max(v for _, v in points_all) or 1.0
    left, right = _PAD_LEFT, CHART_WIDTH - _PAD_RIGHT
    upper, lower = _PAD_TOP, CHART_HEIGHT - _PAD_BOTTOM
    span = (t1 - t0) or 1.0

    def x(t: float) -> float:
        return left + (t - t0) / span * (right - left)

    def y(v: float) -> float:
        return lower - v / top * (lower - upper)

    parts = [
        head,
        f'<line x1="{left}" y1="{lower}" x2="{right}" y2="{lower}" stroke="#999"/>',
        f'<line x1="{left}" y1="{upper}" x2="{left}" y2="{lower}" stroke="#999"/>',
        f'<text x="{left - 4}" y="{upper + 4}" font-size="10" text-anchor="end">'
        f"{_number(top)}</text>",
        f'<text x="{left - 4}" y="{lower}" font-size="10" text-anchor="end">0</text>',
        f'<text x="{left}" y="{CHART_HEIGHT - 5}" font-size="10">{_ago(t1 - t0)}</text>',
        f'<text x="{right}" y="{CHART_HEIGHT - 5}" font-size="10" text-anchor="end">now</text>',
    ]
    legend_x = right
    for index, (name, points) in enumerate(reversed(lines)):
        colour = COLOURS[(len(lines) - 1 - index) % len(COLOURS)]
        coordinates = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
        parts.append(
            f'<polyline data-series="{escape(name)}" fill="none" stroke="{colour}" '
            f'stroke-width="1.5" points="{coordinates}"/>'
        )
        parts.append(
            f'<text x="{legend_x}" y="13" font-size="10" text-anchor="end" fill="{colour}">'
            f"{escape(name)}</text>"
        )
        legend_x -= 7 * len(name) + 10
    parts.append("</svg>")
    return "".join(parts)


# -- the sampler (IO) -----------------------------------------------------------------------------
class Sampler:
    """Calls ``read`` every ``interval_s`` on its own daemon thread and keeps what it returns in
    `history`. A failed read (the node's broker not serving yet, a leader moving) is logged and
    skipped: the chart has a gap, the console keeps serving. `stop` ends the thread and then
    calls ``close`` (the sampler's clients) from the caller's thread."""

    def __init__(
        self,
        read: Callable[[], Sample],
        interval_s: float,
        close: Callable[[], None] = lambda: None,
    ) -> None:
        self.history = History(interval_s)
        self.interval_s = interval_s
        self._read = read
        self._close = close
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-sampler", daemon=True)
        self._starting = threading.Lock()

    def start(self) -> Sampler:
        """Start sampling; again, nothing (the console calls it on every page it serves)."""
        with self._starting:
            if self._thread.ident is None and not self._stop.is_set():
                self._thread.start()  # once: a thread is never started twice
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.history.add(self._read())
            except Exception as error:  # noqa: BLE001 (any failed read is one missing sample)
                log.debug("console sample failed: %s: %s", type(error).__name__, error)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        self._close()
