"""``make soak``'s machinery: its pass rules (pure) and, in miniature, its sampling, group
churn, supervised mirror process, rules and report against a real cluster.

The miniature runs 3 nodes on 127.0.0.67-69 and the mirror's REST API on .70 (RANGES["soak"],
the addresses `make soak` uses: a soak and the suite do not run at once), in its own xdist group.
It is not a chaos run (that lasts 30 s at least, tests/chaos/test_chaos_run.py runs one): the
soak's own parts, for a few sampling rounds of 1 s.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from bench.soak import (
    BROKER_DEFAULT,
    RETENTION_OVERRIDES,
    SOAK_FAULTS,
    SoakExtras,
    SoakSettings,
    soak_schedule,
)
from bench.soak_report import SAMPLES_JSONL, plot, read_samples, summary
from bench.soak_rules import (
    GROWTH_MAX,
    PARTITION_FILES_ALLOWANCE_BYTES,
    SEGMENT_FILES_ALLOWANCE_BYTES,
    NodeSample,
    TopicRetention,
    disk_check,
    growth,
    growth_windows,
    judge,
    metadata_check,
    partition_bound_bytes,
)
from chaos.workloads import Recorder
from dataplane.tools.local_cluster import wait_for
from tests.dataplane.cluster_support import running_cluster

MIB = 1024 * 1024


def sample(time_s: float, node_id: int = 1, **fields: int | bool) -> NodeSample:
    base: dict[str, int | bool] = {"up": True, "rss_bytes": 100 * MIB, "fds": 100}
    return NodeSample(time_s=time_s, node_id=node_id, **{**base, **fields})  # type: ignore[arg-type]


# -- the windows of the growth rules -----------------------------------------------------------


@pytest.mark.parametrize(
    ("minutes", "baseline", "final"),
    [
        (120, (600, 1200), (6600, 7200)),  # minutes 10-20 against 110-120
        (20, (600, 900), (900, 1200)),  # half of what follows the warm-up each
        (30, (600, 1200), (1200, 1800)),
    ],
)
def test_growth_windows(
    minutes: int, baseline: tuple[float, float], final: tuple[float, float]
) -> None:
    windows = growth_windows(minutes * 60.0)
    assert windows is not None
    assert (windows.baseline, windows.final) == (baseline, final)


def test_a_run_no_longer_than_the_warm_up_judges_no_growth() -> None:
    assert growth_windows(600.0) is None
    assert judge([sample(10)], duration_s=600, controllers=[1], retention_deleted=True,
                 checker_ok=True).growth == []  # fmt: skip


# -- growth ------------------------------------------------------------------------------------


def run_of(rss_at: dict[float, int], step_s: float = 10.0) -> list[NodeSample]:
    """Samples every `step_s` for 20 minutes, RSS by the window they fall in (start -> MiB)."""
    out = []
    for i in range(int(1200 / step_s)):
        t = i * step_s
        rss = next(v for start, v in sorted(rss_at.items(), reverse=True) if t >= start)
        out.append(sample(t, rss_bytes=rss * MIB))
    return out


def test_growth_compares_the_medians_of_the_two_windows() -> None:
    windows = growth_windows(1200.0)
    assert windows is not None
    flat = growth(run_of({0: 100}), 1, "rss_bytes", windows)
    assert flat.ok and flat.fraction == 0.0
    grown = growth(run_of({0: 100, 900: 106}), 1, "rss_bytes", windows)
    assert not grown.ok and grown.fraction == pytest.approx(0.06)
    within = growth(run_of({0: 100, 900: 100 + int(100 * GROWTH_MAX)}), 1, "rss_bytes", windows)
    assert within.ok  # exactly 5 % is allowed


def test_a_spike_in_the_final_window_does_not_fail_growth() -> None:
    samples = run_of({0: 100})
    samples[-3] = replace(samples[-3], rss_bytes=1000 * MIB)  # a catch-up's burst
    windows = growth_windows(1200.0)
    assert windows is not None
    assert growth(samples, 1, "rss_bytes", windows).ok


def test_samples_of_a_node_that_is_down_do_not_count() -> None:
    samples = [*run_of({0: 100}), *(sample(t, up=False, rss_bytes=0) for t in (905, 915))]
    windows = growth_windows(1200.0)
    assert windows is not None
    assert growth(samples, 1, "rss_bytes", windows).final == 100 * MIB
    assert growth([s for s in samples if s.time_s < 900], 1, "rss_bytes", windows).ok  # no final


def test_a_process_restarted_between_the_windows_is_not_judged() -> None:
    windows = growth_windows(1200.0)
    assert windows is not None
    samples = [sample(t, pid=10 if t < 950 else 11, rss_bytes=(50 if t < 950 else 200) * MIB)
               for t in range(0, 1200, 10)]  # fmt: skip
    restarted = growth(samples, 1, "rss_bytes", windows)
    assert restarted.pid == 11 and not restarted.judged and restarted.ok
    verdict = judge(samples, duration_s=1200, controllers=[], retention_deleted=True,
                    checker_ok=True)  # fmt: skip
    assert verdict.failures == [
        "rss_bytes: no node's process lived through both growth windows: nothing judged",
        "fds: no node's process lived through both growth windows: nothing judged",
    ]
    witness = [sample(t, node_id=2, pid=20) for t in range(0, 1200, 10)]
    assert judge([*samples, *witness], duration_s=1200, controllers=[], retention_deleted=True,
                 checker_ok=True).ok  # fmt: skip


def test_growth_of_descriptors_fails_the_verdict_with_a_line_saying_so() -> None:
    samples = [sample(t, fds=100 if t < 900 else 120) for t in range(0, 1200, 10)]
    verdict = judge(samples, duration_s=1200, controllers=[], retention_deleted=True,
                    checker_ok=True)  # fmt: skip
    assert not verdict.ok
    assert verdict.failures == ["node 1: fds grew +20.0% (median 100 -> 120; at most 5%)"]


# -- disk --------------------------------------------------------------------------------------


def test_the_partition_bound_follows_the_topic_configs() -> None:
    topic = TopicRetention(True, 64 * 1024, 16 * 1024, 4 * 1024)
    segments = 64 // 16 + 3  # the retained ones, one filling between passes, one being deleted
    assert partition_bound_bytes(topic) == (
        64 * 1024 + 3 * 16 * 1024
        + segments * (2 * 4 * 1024 + SEGMENT_FILES_ALLOWANCE_BYTES)
        + PARTITION_FILES_ALLOWANCE_BYTES
    )  # fmt: skip
    assert partition_bound_bytes(replace(topic, delete=False)) is None  # compacted
    assert partition_bound_bytes(replace(topic, retention_bytes=-1)) is None  # unbounded
    assert partition_bound_bytes(BROKER_DEFAULT) is not None


def test_disk_over_its_bound_after_the_warm_up_fails() -> None:
    bound = 1000
    samples = [
        sample(100, retained_bytes=5000, retained_bound_bytes=bound),  # warm-up: not judged
        sample(700, retained_bytes=900, retained_bound_bytes=bound),
        sample(710, retained_bytes=1100, retained_bound_bytes=bound),
    ]
    check = disk_check(samples, 1, warm_up_s=600)
    assert not check.ok and check.over == [710] and check.peak_fraction == 1.1
    assert disk_check(samples[:2], 1, warm_up_s=600).ok


# -- the metadata log --------------------------------------------------------------------------


def test_the_metadata_log_must_be_snapshotted_and_cut_after_the_warm_up() -> None:
    windows = growth_windows(1200.0)
    saw = [
        sample(t, snapshot_index=100 * (t // 300), journal_bytes=1000 + 10 * (t % 300))
        for t in range(0, 1200, 10)
    ]
    check = metadata_check(saw, 1, 600, windows)
    assert check.ok and check.snapshot_advances == 2 and check.journal_cuts == 2
    never_cut = [
        sample(t, snapshot_index=5, journal_bytes=1000 + 1000 * t) for t in range(0, 1200, 10)
    ]
    stuck = metadata_check(never_cut, 1, 600, windows)
    assert not stuck.ok and stuck.snapshot_advances == 0 and stuck.journal_cuts == 0


def test_the_verdict_names_every_failed_rule() -> None:
    verdict = judge([sample(0)], duration_s=1200, controllers=[1], retention_deleted=False,
                    checker_ok=False, extras_problems=["the mirror did not catch up"])  # fmt: skip
    assert verdict.failures[-3:] == [
        "retention deleted nothing: the workload topic's log start never moved",
        "the chaos checker found anomalies (see the chaos report)",
        "the mirror did not catch up",
    ]
    assert verdict.failures[-4].startswith("node 1: metadata log not compacted")


# -- the schedule ------------------------------------------------------------------------------


def test_the_soak_schedule_spaces_its_faults_minutes_apart() -> None:
    faults = soak_schedule(7, 7200.0, SOAK_FAULTS, 3, 6, every_s=180.0)
    assert faults == soak_schedule(7, 7200.0, SOAK_FAULTS, 3, 6, every_s=180.0)  # the seed's
    assert 30 <= len(faults) <= 40
    assert faults[0].at_s >= 180.0
    assert faults[-1].end_s <= 7200.0 - 120.0
    assert all(b.at_s - a.end_s >= 180.0 / 3 - 10 for a, b in itertools.pairwise(faults))
    assert {f.kind for f in faults} == set(SOAK_FAULTS)
    assert all(f.node != 0 for f in faults if f.kind == "kill")  # node 1, the witness, lives


# -- the machinery in miniature ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.xdist_group("soak")
def test_the_soak_machinery_in_miniature(tmp_path: Path) -> None:
    """Sampling every second, a member joining and leaving, the mirror restarted after a SIGKILL
    and caught up, a node down for a moment; then the rules, the summary and the plots."""
    settings = replace(
        SoakSettings(), sample_every_s=1.0, churn_every_s=1.0, spark=False, mirror=True,
        feed_rate=20.0, results=tmp_path / "results", work_dir=tmp_path / "work",
    )  # fmt: skip
    out_dir = tmp_path / "report"
    out_dir.mkdir()
    lines: list[str] = []
    with running_cluster(tmp_path / "cluster", "soak", overrides=RETENTION_OVERRIDES) as cluster:
        recorder = Recorder()
        extras = SoakExtras(settings, cluster, recorder, "soak-events", out_dir,
                            lines.append)  # fmt: skip
        try:
            extras.start()
            mirror = extras.processes["mirror"]
            wait_for("three sampling rounds", lambda: len(extras.sampler.samples) >= 9, 30)
            pid = mirror.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            wait_for("the mirror restarted", lambda: mirror.restarts == 1 and mirror.pid, 30)
            cluster.stop_node(3, kill=True)

            def node_3_down() -> bool:
                return any(not s.up for s in extras.sampler.samples if s.node_id == 3)

            wait_for("a sample of node 3 down", node_3_down, 30)
            cluster.start_node(3)
            wait_for("a member to join and one to leave", lambda: extras.churn.left >= 1, 30)
        finally:
            outcome = extras.finish()
    assert not outcome.problems, outcome.problems
    mirrored = outcome.figures["mirror"]
    assert mirrored["caught_up"] and mirrored["restarts"] == 1
    assert mirrored["mirrored_records"] >= mirrored["source_records"] > 0
    samples = read_samples(out_dir / SAMPLES_JSONL)
    assert samples == extras.sampler.samples
    up = [s for s in samples if s.up]
    assert {s.node_id for s in up} == {1, 2, 3}
    assert all(s.rss_bytes > 0 and s.fds > 0 and s.threads > 0 and s.disk_bytes > 0 for s in up)
    assert all(s.retained_bytes <= s.retained_bound_bytes for s in samples)
    assert max(s.journal_bytes for s in samples) > 0
    verdict = judge(samples, duration_s=samples[-1].time_s, controllers=[1, 2, 3],
                    retention_deleted=True, checker_ok=True, warm_up_s=0, window_s=5)  # fmt: skip
    data = summary(verdict, samples, outcome.figures)
    assert json.loads(json.dumps(data))["nodes"]["3"]["samples_down"] >= 1
    paths = plot(samples, [], growth_windows(samples[-1].time_s, 0, 5), out_dir)
    assert [p.name for p in paths] == [
        "rss.png",
        "fds.png",
        "threads.png",
        "disk.png",
        "retained.png",
        "metadata.png",
    ]
    assert all(p.stat().st_size > 10_000 for p in paths)
