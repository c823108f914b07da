"""The console's charts: the bounded history, the series computed from samples (records in and
out per topic, lag per group, ISR sizes), the SVG they are drawn as, and the sampler thread."""

from __future__ import annotations

import threading
import xml.etree.ElementTree as ET

import pytest

from dataplane.client import TopicPartition
from dataplane.console import history, pages
from dataplane.console.history import History, Sample, Sampler
from dataplane.tools.local_cluster import wait_for

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def _sample(at: float, a0: int, a1: int, committed: dict[str, dict[TopicPartition, int]]) -> Sample:
    return Sample(at, {A0: a0, A1: a1, B0: 7}, {A0: 3, A1: 2 if at > 10 else 3, B0: 1}, committed)


SAMPLES = (
    _sample(0.0, 0, 0, {"g": {A0: 0}}),
    _sample(10.0, 50, 50, {"g": {A0: 20}, "h": {A1: 5}}),
    _sample(20.0, 100, 150, {"g": {A0: 60}, "h": {A1: 25}}),
)


def test_records_in_is_the_end_offsets_growth_per_second() -> None:
    assert history.records_in(SAMPLES, "a") == [(10.0, 10.0), (20.0, 15.0)]
    assert history.records_in(SAMPLES, "b") == [(10.0, 0.0), (20.0, 0.0)]
    assert history.records_in(SAMPLES[:1], "a") == []


def test_records_out_sums_the_groups_committed_offsets_growth() -> None:
    # 0->10 s: g moved 20 (h had no sample before); 10->20 s: g 40 and h 20
    assert history.records_out(SAMPLES, "a") == [(10.0, 2.0), (20.0, 6.0)]


def test_a_counter_that_goes_back_gives_no_rate() -> None:
    recreated = (*SAMPLES, _sample(30.0, 0, 0, {"g": {A0: 0}}))
    assert history.records_in(recreated, "a")[-1] == (20.0, 15.0)
    assert history.records_out(recreated, "a")[-1] == (20.0, 6.0)


def test_group_lag_is_what_group_describe_computes() -> None:
    # max(0, end - committed) summed: g on a-0 only; h appears at 10 s
    assert history.group_lag(SAMPLES, "g") == [(0.0, 0.0), (10.0, 30.0), (20.0, 40.0)]
    assert history.group_lag(SAMPLES, "h") == [(10.0, 45.0), (20.0, 125.0)]


def test_isr_sizes_per_partition() -> None:
    assert history.isr_sizes(SAMPLES, "a") == {
        "p0": [(0.0, 3.0), (10.0, 3.0), (20.0, 3.0)],
        "p1": [(0.0, 3.0), (10.0, 3.0), (20.0, 2.0)],
    }


def test_history_keeps_the_last_window_only() -> None:
    kept = History(interval_s=1.0, window_s=5.0)
    for at in range(20):
        kept.add(Sample(float(at), {}, {}, {}))
    assert [s.at for s in kept.samples()] == [14.0, 15.0, 16.0, 17.0, 18.0, 19.0]
    jumping = History(interval_s=1.0, window_s=5.0)  # a clock stuck still: bounded by count
    for _ in range(100):
        jumping.add(Sample(0.0, {}, {}, {}))
    assert len(jumping.samples()) == 6


def test_line_chart_is_svg_with_a_line_per_series_and_escapes_names() -> None:
    svg = history.line_chart(
        "Records <per> second", {"in": [(0.0, 1.0), (60.0, 4.0)], "<out>": [(0.0, 2.0)]}, "c"
    )
    root = ET.fromstring(svg)  # well-formed: names escaped
    ns = "{http://www.w3.org/2000/svg}"
    lines = root.findall(f"{ns}polyline")
    assert {line.get("data-series") for line in lines} == {"in", "<out>"}
    by_name = {line.get("data-series"): line.get("points") or "" for line in lines}
    (x0, y0), (x1, y1) = (tuple(map(float, p.split(","))) for p in by_name["in"].split())
    assert x0 == history._PAD_LEFT and x1 == history.CHART_WIDTH - history._PAD_RIGHT
    assert y1 == history._PAD_TOP and y0 > y1  # 4 is the top, 1 lower down
    assert "-60 s" in svg and "now" in svg


def test_line_chart_without_samples_says_so() -> None:
    assert "no samples yet" in history.line_chart("Lag", {"lag": []}, "c")
    ET.fromstring(history.line_chart("Lag", {"lag": [(1.0, 1.0)]}, "c"))


def test_topic_and_group_pages_carry_the_charts() -> None:
    charts = pages.topic_charts("a", SAMPLES)
    assert 'id="chart-throughput"' in charts and 'id="chart-isr"' in charts
    assert charts.count("<polyline") == 4  # in, out, p0, p1


def test_sampler_samples_until_stopped_and_a_failed_read_is_a_gap() -> None:
    reads = iter(range(1000))
    closed = threading.Event()

    def read() -> Sample:
        n = next(reads)
        if n == 1:
            raise ConnectionError("the broker is not serving yet")
        return Sample(float(n), {}, {}, {})

    sampler = Sampler(read, 0.01, closed.set).start()
    wait_for("three samples", lambda: len(sampler.history.samples()) >= 3 or None, 10)
    sampler.stop()
    assert closed.is_set()
    assert 1.0 not in [s.at for s in sampler.history.samples()]
    count = len(sampler.history.samples())
    assert not any(t.name == "console-sampler" and t.is_alive() for t in threading.enumerate())
    assert len(sampler.history.samples()) == count


@pytest.mark.parametrize("value", [5.0, 1500.0, 2.5e6])
def test_axis_numbers_are_short(value: float) -> None:
    assert len(history._number(value)) <= 5
