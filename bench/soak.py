"""``make soak`` (``python -m bench.soak --minutes N``): a cluster run for hours under a mixed
workload and faults, sampled every 10 s, judged by bench/soak_rules.py.

1. A chaos run (chaos/runner.py: 3 nodes on 127.0.0.67-69, each as its own system user so
   iptables can cut it off) with the soak's broker configs: retention small enough that every
   topic reaches its bound within minutes (`RETENTION_OVERRIDES`), so disk usage must level off.
   The harness's workloads run throughout: 2 idempotent acks=all producers at a steady 25
   records/s each, a group of 2 steady consumers, a topic created or deleted every 2 s.
2. Beside them (bench/soak_extras.py): members joining and leaving a group of their own on
   that topic every few minutes; the Spark streaming job (restarted if it dies) fed clicks; a
   mirror (``raftlog mirror``) of one topic to another on the same cluster, its REST API on
   127.0.0.70; and the sampler (bench/soak_sampler.py): each node's RSS, descriptors, threads,
   disk usage and metadata log, every 10 s, as JSON lines.
3. A fault every few minutes (`soak_schedule`), drawn from the chaos harness's kinds (kill,
   healed by a restart; pause; partition), each healed before the next; node 1 is never killed
   (`WITNESS`).
4. At the end: the chaos checker over the whole history; the Spark job's output read committed
   (every window once); the mirror caught up; every stopped node's files through
   ``dataplane.tools.check_data.check_node_dir`` (when the tree has it); the soak's pass rules.
   Report in ``bench/results/soak/<timestamp>/``: ``samples.jsonl``, ``summary.json``, the plots,
   and the chaos report (``chaos/report.html``).

Every process it starts dies with it, also on Ctrl-C or SIGTERM (unwound as Ctrl-C): nodes are
stopped by pid by the chaos runner, the mirror and the Spark driver (and its JVM) by
`Supervised.stop`; all are started owned (they get a death signal if the soak is SIGKILLed).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import logging
import math
import random
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console

from bench import REPO_ROOT
from bench.soak_extras import (
    Feed,
    GroupChurn,
    Supervised,
    click_values,
    mirror_outcome,
    spark_outcome,
)
from bench.soak_report import SAMPLES_JSONL, plot, summary, write_summary
from bench.soak_rules import WARM_UP_S, WINDOW_S, TopicRetention, growth_windows
from bench.soak_rules import judge as judge_samples
from bench.soak_sampler import Sampler, TopicConfigs
from bench.soak_spark import CLICKS, PAGE_COUNTS
from chaos.checker import check
from chaos.faults import FaultInjector
from chaos.history import FaultKind, History, Verdict
from chaos.report import write_report
from chaos.runner import Run, RunConfig, _Cluster
from chaos.schedule import LENGTH_S, PartitionShape, PlannedFault
from chaos.workloads import CLIENT_ERRORS, Recorder
from dataplane.client import AdminClient, NewTopic
from dataplane.client.admin import raise_for_errors
from dataplane.tools.entry import COMMAND
from dataplane.tools.local_cluster import LocalCluster, free_port, wait_for
from spark.pipeline.events import CLICK_SCHEMA, value_subject
from spark.registry import register

log = logging.getLogger(__name__)
FIRST_HOST = 67  # nodes on 127.0.0.67-69; the mirror's REST API on .70
NODES = 3
RESULTS = REPO_ROOT / "bench" / "results" / "soak"
WORK_DIR = REPO_ROOT / ".raftlog" / "soak"
# Small enough that a busy topic reaches its size bound in a minute or two.
RETENTION_BYTES = 64 * 1024
SEGMENT_BYTES = 16 * 1024
INDEX_BYTES = 4 * 1024
# And a time bound for the slow ones (the Spark job's page counts, the mirror's topics: tens of
# bytes a second per partition, which took ~35 minutes to fill 64 KiB, past the warm-up, so the
# judged windows saw their segments still accumulating): a segment rolls after a minute and goes
# 4 minutes after its last record, so every topic, whatever its rate, holds at most ~6 segments
# a partition from minute ~5 on, well inside the 10-minute warm-up.
ROLL_MS = 60_000
RETENTION_MS = 240_000
# The Spark job's input keeps more: the job starts (a JVM, a session, its first micro-batch)
# minutes after the clicks begin on a loaded machine, and starts again after a crash; at the
# brokers' 64 KiB (~100 s of clicks on the busiest partition) retention deleted clicks the
# job had not read yet, and its query failed on the data loss for good. 8 minutes (the size
# bound, 1 MiB, is not reached before: ~1.3 KB/s on that partition) still levels off inside
# the warm-up.
CLICKS_RETENTION: dict[str, str] = {
    "retention.ms": str(8 * 60_000), "retention.bytes": str(1024 * 1024),
}  # fmt: skip
# Broker defaults every topic the soak does not configure itself inherits (Kafka's names).
RETENTION_OVERRIDES: dict[str, str | int] = {
    "log.retention.bytes": RETENTION_BYTES,
    "log.segment.bytes": SEGMENT_BYTES,
    "log.index.size.max.bytes": INDEX_BYTES,
    "log.retention.check.interval.ms": 10_000,
    "log.roll.ms": ROLL_MS,
    "log.retention.ms": RETENTION_MS,
    # a deleted segment's files wait this long (Kafka's default: a minute); below the check
    # interval, at most one segment per partition waits (bench/soak_rules.py's bound)
    "log.segment.delete.delay.ms": 1_000,
    # compacted internal topics roll small segments too, so their cleaner has work to do
    "offsets.topic.segment.bytes": SEGMENT_BYTES,
    "transaction.state.log.segment.bytes": SEGMENT_BYTES,
    # A compacted partition keeps each tombstone for this long (Kafka's default: a day): the
    # churning members' leaving, the offsets of the deleted topics. With a day's horizon the
    # compacted internal topics grow for a day, as Kafka's do, before they reach their steady
    # state; five minutes puts it inside the warm-up, as the small retention.bytes does for
    # the retention-governed topics, so the judged windows see the steady state.
    "log.cleaner.delete.retention.ms": 300_000,
}
BROKER_DEFAULT = TopicRetention(True, RETENTION_BYTES, SEGMENT_BYTES, INDEX_BYTES)
# A node is killed and restarted (Kafka's restart after a crash), paused, or cut off. Not
# leader-kill or controller-kill: their victim is whoever leads, and node 1 (position `WITNESS`)
# must never be killed: its one process lives through the run, so its memory and descriptors
# are judged over the whole of it (bench/soak_rules.py).
SOAK_FAULTS: tuple[FaultKind, ...] = ("kill", "pause", "partition")
WITNESS = 0
# The churning members' group, on the workload topic. Not the chaos group: the chaos run waits,
# at the end, until its own members have consumed everything, which they never record for a
# partition another member consumed to its end and committed.
CHURN_GROUP = "soak-churn"
MIRROR_SOURCE = "soak-mirror-src"
MIRROR_ALIAS = "src"
EXTRA_PARTITIONS = 3
END_TIMEOUT_S = 120.0
WATCH_EVERY_S = 2.0
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_SUMMARY = "make soak: hours of mixed workload and faults on 3 nodes, sampled and judged"


@dataclass(frozen=True)
class SoakSettings:
    minutes: float = 120.0
    seed: int = 1
    first_host: int = FIRST_HOST
    sample_every_s: float = 10.0
    fault_every_s: float = 180.0  # a fault every few minutes
    churn_every_s: float = 120.0  # a member joins (and, beyond two, the oldest leaves)
    faults: tuple[FaultKind, ...] = SOAK_FAULTS
    producer_rate: float = 25.0  # records/s, per producer (2)
    feed_rate: float = 10.0  # click events/s to Spark; records/s to the mirrored topic
    spark: bool = True
    mirror: bool = True
    warm_up_s: float = WARM_UP_S
    window_s: float = WINDOW_S
    results: Path = RESULTS
    work_dir: Path = WORK_DIR

    @property
    def duration_s(self) -> float:
        return self.minutes * 60

    @property
    def spare_host(self) -> str:
        return f"127.0.0.{self.first_host + NODES}"


def soak_schedule(
    seed: int,
    duration_s: float,
    kinds: Sequence[FaultKind],
    nodes: int,
    partitions: int,
    every_s: float,
) -> list[PlannedFault]:
    """A fault every ``every_s`` (each at a seeded moment in the first two thirds of its slot,
    lasting as long as the chaos harness's faults of its kind do), kinds in turn from a seeded
    shuffle; none in the first slot (the cluster settles) nor in the last two minutes (it
    recovers before the workloads stop). Targets are positions, as in chaos/schedule.py."""
    if not kinds:
        return []
    rng = random.Random(seed)
    order = list(dict.fromkeys(kinds))
    rng.shuffle(order)
    faults: list[PlannedFault] = []
    for slot in range(1, math.ceil(duration_s / every_s)):
        kind = order[len(faults) % len(order)]
        low, high = LENGTH_S[kind]
        at = round(slot * every_s + rng.uniform(0, every_s * 2 / 3), 3)
        length = round(rng.uniform(low, high), 3)
        if at + length > duration_s - min(120.0, duration_s / 4):
            break
        node, peer = rng.sample(range(nodes), 2)
        if kind == "kill" and node == WITNESS:  # the witness lives through the run
            node = rng.randrange(1, nodes)
        shape: PartitionShape = rng.choice(["isolate", "one-way"])
        faults.append(
            PlannedFault(
                id=len(faults) + 1, kind=kind, at_s=at, length_s=length, node=node, peer=peer,
                shape=shape, partition=rng.randrange(partitions),
            )
        )  # fmt: skip
    return faults


@dataclass
class ExtrasOutcome:
    """What the extras did, for the summary; ``problems`` fail the run."""

    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


class SoakExtras:
    """Sampler, group churn, Spark job and mirror beside a cluster (module doc, step 2)."""

    def __init__(
        self,
        settings: SoakSettings,
        local: LocalCluster,
        recorder: Recorder,
        topic: str,
        out_dir: Path,
        say: Callable[[str], None],
    ) -> None:
        self.settings, self.local, self.recorder = settings, local, recorder
        self.topic, self.out_dir, self.say = topic, out_dir, say
        bootstrap = local.bootstrap_servers
        self.admin = AdminClient(bootstrap, request_timeout_ms=10_000)
        self._samples_file = (out_dir / SAMPLES_JSONL).open("a")
        self.sampler = Sampler(
            self._nodes, TopicConfigs(self.admin, BROKER_DEFAULT), recorder.now,
            self._samples_file, settings.sample_every_s,
        )  # fmt: skip
        self.churn = GroupChurn(bootstrap, CHURN_GROUP, topic, recorder, settings.churn_every_s)
        self.feeds: list[Feed] = []
        self.processes: dict[str, Supervised] = {}
        self._stop_watch = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="soak-watch", daemon=True)
        self.outcome = ExtrasOutcome()

    def _nodes(self) -> list[tuple[int, int | None, Path]]:
        local = self.local
        return [(s.node_id, local.pid(s.node_id), s.directory / "data") for s in local.specs]

    def start(self) -> None:
        s, bootstrap = self.settings, self.local.bootstrap_servers
        self.sampler.start()
        self.churn.start()
        topics = ([CLICKS, PAGE_COUNTS] if s.spark else []) + ([MIRROR_SOURCE] if s.mirror else [])
        if topics:
            self._create_topics(topics)
        work = s.work_dir / "extras"
        work.mkdir(parents=True, exist_ok=True)
        if s.spark:
            start_ms = int(datetime.datetime.now(datetime.UTC).timestamp() * 1000)
            registry = ",".join(self.local.schema_registry_urls)
            schema_id = register(registry, value_subject(CLICKS), CLICK_SCHEMA)
            values = click_values(s.seed, s.feed_rate, start_ms - start_ms % 10_000, schema_id)
            self.feeds.append(Feed("clicks", bootstrap, CLICKS, s.feed_rate, values))
            argv = [sys.executable, "-m", "bench.soak_spark", "--bootstrap", ",".join(bootstrap),
                    "--schema-registry-url", registry,
                    "--checkpoint", str(work / "spark-checkpoint")]  # fmt: skip
            self.processes["spark"] = Supervised("spark job", argv, work / "spark.log", REPO_ROOT)
        if s.mirror:
            self.feeds.append(Feed("mirror-feed", bootstrap, MIRROR_SOURCE, s.feed_rate))
            self.processes["mirror"] = Supervised(
                "mirror", self._mirror_argv(bootstrap), work / "mirror.log", REPO_ROOT
            )
        for process in self.processes.values():
            process.start()
        for feed in self.feeds:
            feed.start()
        self._watcher.start()
        running = ", ".join(self.processes) or "no processes"
        self.say(
            f"soak extras: sampling every {s.sample_every_s:.0f} s, churn every "
            f"{s.churn_every_s:.0f} s, {running}"
        )

    def _mirror_argv(self, bootstrap: Sequence[str]) -> list[str]:
        servers = ",".join(bootstrap)
        host = self.settings.spare_host
        return [
            *COMMAND, "mirror",
            "--source-bootstrap", servers, "--target-bootstrap", servers,
            "--source-alias", MIRROR_ALIAS, "--topics", MIRROR_SOURCE,
            "--listeners", f"http://{host}:{free_port(host)}",
            "--set", "refresh.topics.interval.ms=5000",
        ]  # fmt: skip

    def _create_topics(self, names: Sequence[str]) -> None:
        rf = min(3, len(self.local.specs))
        configs = {"min.insync.replicas": str(min(2, rf))}
        raise_for_errors(
            self.admin.create_topics(
                [
                    NewTopic(
                        n, EXTRA_PARTITIONS, rf, configs | (CLICKS_RETENTION if n == CLICKS else {})
                    )
                    for n in names
                ]
            )
        )

        def led() -> bool:
            described = self.admin.describe_topics(list(names)).values()
            return all(p.leader >= 0 for t in described for p in t.partitions)

        wait_for(f"leaders of {', '.join(names)}", led, 60)

    def _watch(self) -> None:
        while not self._stop_watch.wait(WATCH_EVERY_S):
            for process in self.processes.values():
                process.watch()

    def stop_churn(self) -> None:
        """Every churning member leaves the group (bounded)."""
        self.churn.stop.set()
        if self.churn.ident is not None:
            self.churn.join(60)

    def finish(self, measure: bool = True) -> ExtrasOutcome:
        """Stop everything (bounded) and, with ``measure``, read the outcomes first (not when
        the run is being interrupted: then only stop); safe after a failed `start`."""
        figures, problems = self.outcome.figures, self.outcome.problems
        self.stop_churn()
        for feed in self.feeds:
            feed.finish(30.0)
        figures["churn"] = {"joined": self.churn.joined, "left": self.churn.left}
        self._stop_watch.set()
        if self._watcher.is_alive():
            self._watcher.join(10)
        try:
            if measure:
                self._outcomes(figures, problems)
        finally:
            for process in self.processes.values():
                process.stop()
            self.sampler.stop.set()
            if self.sampler.is_alive():
                self.sampler.join(30)
            self._samples_file.close()
            self.admin.close()
        return self.outcome

    def _outcomes(self, figures: dict[str, Any], problems: list[str]) -> None:
        bootstrap = self.local.bootstrap_servers
        mirror = self.processes.get("mirror")
        if mirror is not None:
            feed = next(f for f in self.feeds if f.topic == MIRROR_SOURCE)
            m = mirror_outcome(bootstrap, MIRROR_SOURCE, f"{MIRROR_ALIAS}.{MIRROR_SOURCE}",
                               EXTRA_PARTITIONS, mirror, END_TIMEOUT_S)  # fmt: skip
            figures["mirror"] = {**m.__dict__, "feed_acked": feed.acked,
                                 "feed_failed": feed.failed}  # fmt: skip
            if not m.caught_up:
                problems.append(f"the mirror did not catch up: {m.mirrored_records:,} of "
                                f"{m.source_records:,} records mirrored")  # fmt: skip
        spark = self.processes.get("spark")
        if spark is not None:
            spark.stop()  # between micro-batches: its last windows are committed
            feed = next(f for f in self.feeds if f.topic == CLICKS)
            try:
                o = spark_outcome(bootstrap, PAGE_COUNTS, spark, feed)
            except (*CLIENT_ERRORS, ValueError) as error:
                problems.append(f"the Spark job's output could not be read: {error}")
            else:
                figures["spark"] = {**o.__dict__, "exits": spark.exits}
                if o.duplicated_windows:
                    problems.append(f"the Spark job wrote {o.duplicated_windows} windows twice")
                if not o.windows_written:
                    problems.append("the Spark job wrote no window")


class SoakRun(Run):
    """A chaos run with the soak's schedule, extras around its workloads, and its verdict."""

    def __init__(
        self, config: RunConfig, settings: SoakSettings, out_dir: Path, say: Callable[[str], None]
    ) -> None:
        super().__init__(config, say)
        self.settings, self.out_dir = settings, out_dir
        self.schedule = soak_schedule(
            config.seed, config.duration_s, config.faults, config.nodes, config.partitions,
            settings.fault_every_s,
        )  # fmt: skip
        self.extras: SoakExtras | None = None

    def _run_cluster(self, cluster: _Cluster, injector: FaultInjector) -> None:
        try:
            super()._run_cluster(cluster, injector)
        except BaseException:  # Ctrl-C, SIGTERM, a failure: stop the extras, measure nothing
            if self.extras is not None:
                self.extras.finish(measure=False)
            raise
        if self.extras is not None:
            self.extras.finish()

    def _wait_for_recovery(self, control: AdminClient) -> None:
        """The producers have stopped: the churning members leave now, before the run reads
        its final state."""
        if self.extras is not None:
            self.extras.stop_churn()
        super()._wait_for_recovery(control)

    def _inject_faults(
        self, cluster: _Cluster, injector: FaultInjector, control: AdminClient
    ) -> None:
        """The workloads have just started (the run's clock is at 0): start the extras."""
        self.extras = SoakExtras(
            self.settings, cluster.local, self.recorder, self.config.topic,
            self.out_dir, self.say,
        )  # fmt: skip
        self.extras.start()
        super()._inject_faults(cluster, injector, control)


def check_data_dirs(local: LocalCluster) -> tuple[bool, list[str]]:
    """Every stopped node's files through ``check_node_dir`` (dataplane/tools/check_data.py);
    (whether the checker exists in this tree, its problems)."""
    try:
        module = importlib.import_module("dataplane.tools.check_data")
    except ModuleNotFoundError:
        return False, []
    problems = []
    for spec in local.specs:
        report = module.check_node_dir(spec.directory / "data")
        problems += [f"node {spec.node_id}: {p}" for p in report.problems]
    return True, problems


def run_soak(settings: SoakSettings, say: Callable[[str], None]) -> tuple[Path, dict[str, Any]]:
    """The whole soak (module doc); (report directory, summary)."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = settings.results / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    # A cluster left by an earlier run has another port in its metadata log's voter set.
    shutil.rmtree(settings.work_dir, ignore_errors=True)
    config = RunConfig(
        seed=settings.seed, duration_s=settings.duration_s, faults=list(settings.faults),
        work_dir=settings.work_dir / "cluster", report_dir=out_dir / "chaos", nodes=NODES,
        first_host=settings.first_host, rate=settings.producer_rate,
        overrides=dict(RETENTION_OVERRIDES),
    )  # fmt: skip
    run = SoakRun(config, settings, out_dir, say)
    history = run.execute()
    verdict = check(history)
    write_report(history, verdict, config.report_dir)
    extras = run.extras.outcome if run.extras is not None else ExtrasOutcome()
    checked, data_problems = False, list[str]()
    if run.cluster is not None:
        checked, data_problems = check_data_dirs(run.cluster.local)
    samples = run.extras.sampler.samples if run.extras is not None else []
    soak_verdict = judge_samples(
        samples,
        duration_s=history.workload_s,
        controllers=history.nodes,
        retention_deleted=any(p.log_start_offset > 0 for p in history.final),
        checker_ok=verdict.ok,
        extras_problems=[*extras.problems, *data_problems],
        warm_up_s=settings.warm_up_s,
        window_s=settings.window_s,
    )
    figures = _figures(settings, history, verdict, extras, checked)
    data = summary(soak_verdict, samples, figures)
    write_summary(out_dir, data)
    windows = growth_windows(history.workload_s, settings.warm_up_s, settings.window_s)
    plot(samples, history.faults, windows, out_dir)
    return out_dir, data


def _figures(
    settings: SoakSettings, history: History, verdict: Verdict, extras: ExtrasOutcome, checked: bool
) -> dict[str, Any]:
    s = verdict.summary
    return {
        "minutes": settings.minutes,
        "seed": settings.seed,
        "workload_s": history.workload_s,
        "faults": [
            {"id": f.id, "kind": f.kind, "start_s": f.start_s, "end_s": f.end_s, "detail": f.detail}
            for f in history.faults
        ],
        "checker": {
            "ok": verdict.ok,
            "findings": len(verdict.findings),
            "acknowledged_writes": s.acknowledged_writes,
            "lost_writes": s.lost_writes,
            "duplicated_values": s.duplicated_values,
            "consumed_records": s.consumed_records,
            "admin_ops_ok": s.admin_ops_ok,
            "availability": s.availability,
        },
        "log_start_offsets": {str(p.partition): p.log_start_offset for p in history.final},
        "data_check": "not in this tree" if not checked else "run",
        "retention": dict(RETENTION_OVERRIDES),
        **extras.figures,
    }


def _print(console: Console, out_dir: Path, data: dict[str, Any]) -> None:
    checker = data["checker"]
    console.print(f"checker: {checker['acknowledged_writes']:,} acknowledged, "
                  f"{checker['lost_writes']} lost, {checker['duplicated_values']} duplicated, "
                  f"{checker['findings']} findings")  # fmt: skip
    for g in data["growth"]:
        console.print(f"node {g['node']} {g['metric']}: median {g['baseline_median']} -> "
                      f"{g['final_median']} ({'ok' if g['ok'] else 'FAIL'})")  # fmt: skip
    for d in data["disk"]:
        console.print(f"node {d['node']} retained peak {d['retained_bytes_peak']:,} bytes = "
                      f"{d['peak_fraction_of_bound']:.0%} of the bound")  # fmt: skip
    for m in data["metadata"]:
        console.print(f"node {m['node']} metadata: {m['snapshot_advances']} snapshots, "
                      f"{m['journal_cuts']} journal cuts")  # fmt: skip
    for key in ("spark", "mirror", "churn"):
        if key in data:
            console.print(f"{key}: {data[key]}")
    for line in data["failures"]:
        console.print(f"[red]FAIL[/red] {line}")
    console.print(f"soak {'passed' if data['ok'] else 'FAILED'}; report in {out_dir}")


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every cleanup (`finally`, contexts) runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=SoakSettings.minutes)
    parser.add_argument("--seed", type=int, default=SoakSettings.seed)
    parser.add_argument("--no-spark", action="store_true", help="without the Spark job")
    parser.add_argument("--no-mirror", action="store_true", help="without the mirror")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = replace(SoakSettings(), minutes=args.minutes, seed=args.seed,
                       spark=not args.no_spark, mirror=not args.no_mirror)  # fmt: skip
    console = Console()
    with _sigterm_unwinds():
        out_dir, data = run_soak(settings, lambda line: console.print(line, highlight=False))
    _print(console, out_dir, data)
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
