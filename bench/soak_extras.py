"""The parts of a soak run's workload beyond the chaos harness's own (bench/soak.py).

The chaos harness already runs idempotent acks=all producers, a consumer group of steady
members, a topic created or deleted every 2 s and the samplers its checker needs. A soak adds:

- `GroupChurn`: members that join the same group and leave it again, one every ``every_s``
  (a few minutes), at most ``members_max`` at a time; they record what they consume into the
  harness's recorder, so the checker judges them too (a rebalance that skips a record is a
  ``skipped-after-commit`` finding).
- `Supervised`: a process of its own kept running: started again when it exits, with the count
  of restarts; stopped by its pid (SIGTERM, then SIGKILL), its children too (the Spark driver's
  JVM). It is started owned (dataplane/tools/owned_process.py), so it dies with the soak even
  when the soak is SIGKILLed.
- The Spark streaming job (bench/soak_spark.py, the reference pipeline's job) fed by
  `ClickFeed`, click events at a steady rate whose event time is the wall clock; at the end
  ``soak-page-counts`` is read committed and every window must be there once (`SparkOutcome`).
- A mirror (``raftlog mirror``, MirrorMaker 2's dedicated mode) of ``soak-mirror-src`` to
  ``src.soak-mirror-src`` on the same cluster (raftlog's mirror takes any two bootstrap lists,
  the same one included), fed by `Feed`; at the end every record must have been mirrored (at
  least once: the target's end offsets reach the source's).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from chaos.workloads import CLIENT_ERRORS, GroupMember, Recorder
from dataplane.client import Consumer, Producer, TopicPartition
from dataplane.tools.local_cluster import wait_for
from dataplane.tools.owned_process import popen_owned
from spark.pipeline.checker import read_results
from spark.pipeline.events import EventTime, generate

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 60.0
KILL_TIMEOUT_S = 10.0
MEMBER_JOIN_TIMEOUT_S = 30.0


class GroupChurn(threading.Thread):
    """Every ``every_s`` a new member joins ``group``; beyond ``members_max`` the oldest
    leaves (commits, closes). Every member still in the group leaves when the run stops."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        group: str,
        topic: str,
        recorder: Recorder,
        every_s: float,
        members_max: int = 2,
    ) -> None:
        super().__init__(name="soak-group-churn", daemon=True)
        self._servers, self._group, self._topic = list(bootstrap), group, topic
        self._recorder, self.every_s, self._members_max = recorder, every_s, members_max
        self.stop = threading.Event()
        self._members: list[tuple[GroupMember, threading.Event]] = []
        self.joined = self.left = 0

    def run(self) -> None:
        serial = 0
        while not self.stop.wait(self.every_s):
            serial += 1
            leave = threading.Event()
            try:
                member = GroupMember(
                    f"churn{serial}", self._servers, self._group, self._topic,
                    self._recorder, leave,
                )  # fmt: skip
            except CLIENT_ERRORS as error:  # no broker answers now: try again next turn
                log.warning("churn member %d not created: %s", serial, error)
                continue
            member.start()
            self._members.append((member, leave))
            self.joined += 1
            if len(self._members) > self._members_max:
                self._leave(*self._members.pop(0))
        while self._members:
            self._leave(*self._members.pop(0))

    def _leave(self, member: GroupMember, leave: threading.Event) -> None:
        leave.set()
        member.join(MEMBER_JOIN_TIMEOUT_S)
        self.left += 1


class Supervised:
    """One owned process, started again whenever it exits (`watch`), until `stop`."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, cwd: Path) -> None:
        self.name, self._argv, self._log_path, self._cwd = name, list(argv), log_path, cwd
        self._proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.exits: list[int] = []  # each exit status it had on its own

    @property
    def pid(self) -> int | None:
        return None if self._proc is None or self._proc.poll() is not None else self._proc.pid

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(self._cwd)}
        with self._log_path.open("ab") as out:
            self._proc = popen_owned(
                self._argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self._cwd, env=env, death_signal=signal.SIGTERM,
            )  # fmt: skip

    def watch(self) -> None:
        """Start it again if it exited."""
        if self._proc is None or (code := self._proc.poll()) is None:
            return
        log.warning("%s exited (%s); starting it again", self.name, code)
        self.exits.append(code)
        self.restarts += 1
        self.start()

    def stop(self) -> None:
        """SIGTERM, wait, SIGKILL; then its children still alive (a JVM), by their pids."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        children = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(KILL_TIMEOUT_S)
        try:  # a JVM leaves when its driver's pipe closes: give it a moment
            wait_for(f"{self.name}'s children to exit", lambda: not _alive(children), 15)
        except TimeoutError:
            for pid in children:
                _kill_if_alive(pid)


def _children(pid: int) -> list[int]:
    """The child pids of ``pid`` (every thread's), from /proc."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except FileNotFoundError:
            continue
    return found


def _alive(pids: Sequence[int]) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists()]


def _kill_if_alive(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    log.warning("pid %d outlived its parent: killed", pid)


class Feed(threading.Thread):
    """Sends ``rate`` records a second to ``topic`` (acks=all, idempotent), values from
    ``value(n)``; counts what was acknowledged and what failed."""

    def __init__(
        self,
        name: str,
        bootstrap: Sequence[str],
        topic: str,
        rate: float,
        value: Callable[[int], tuple[bytes | None, bytes]] | None = None,
    ) -> None:
        super().__init__(name=f"soak-{name}", daemon=True)
        self.topic, self.interval_s = topic, 1.0 / rate
        self._value = value or (lambda n: (None, f"{name}-{n}".encode()))
        self.stop = threading.Event()
        self.acked = self.failed = 0
        self._count_lock = threading.Lock()
        self.producer = Producer(
            list(bootstrap), acks="all", enable_idempotence=True, linger_ms=5,
            request_timeout_ms=5_000, delivery_timeout_ms=60_000, max_block_ms=5_000,
        )  # fmt: skip

    def run(self) -> None:
        n, next_send = 0, time.monotonic()
        while not self.stop.is_set():
            key, value = self._value(n)
            try:
                future = self.producer.send(self.topic, value, key=key)
                future.add_done_callback(lambda f: self._count(f.exception() is None))
            except CLIENT_ERRORS as error:  # max.block.ms: counted, not fatal
                log.info("%s: send: %s", self.name, error)
                self._count(False)
            n += 1
            next_send += self.interval_s
            delay = next_send - time.monotonic()
            if delay > 0:
                self.stop.wait(delay)  # pacing the load, not waiting for a condition
            else:
                next_send = time.monotonic()

    def _count(self, ok: bool) -> None:
        with self._count_lock:
            if ok:
                self.acked += 1
            else:
                self.failed += 1

    def finish(self, timeout_s: float) -> None:
        self.stop.set()
        if self.ident is not None:
            self.join(timeout_s)
        try:
            self.producer.flush(timeout=timeout_s)
        except CLIENT_ERRORS as error:
            log.warning("%s: flush: %s", self.name, error)
        self.producer.close(timeout=5.0)


def click_values(
    seed: int, rate: float, start_ms: int, schema_id: int
) -> Callable[[int], tuple[bytes, bytes]]:
    """Click event ``n`` (the reference pipeline's generator) at ``n / rate`` s after
    ``start_ms`` of event time, less its seeded lateness: event time follows the wall clock.
    In Avro, the clicks' schema registered as ``schema_id`` (as the pipeline's)."""
    clock = EventTime(start_ms, max(1, round(1000 / rate)), 1_000)

    def value(n: int) -> tuple[bytes, bytes]:
        (event,) = generate(seed, n, 1, clock)
        return event.page.encode(), event.to_avro(schema_id)

    return value


@dataclass(frozen=True)
class SparkOutcome:
    restarts: int
    clicks_acked: int
    windows_written: int
    duplicated_windows: int


def spark_outcome(
    bootstrap: Sequence[str], topic: str, supervised: Supervised, feed: Feed
) -> SparkOutcome:
    """What the job wrote (read committed): windows, and windows written more than once."""
    written = read_results(bootstrap, topic)
    counts = Counter(w.key for w in written)
    return SparkOutcome(
        restarts=supervised.restarts,
        clicks_acked=feed.acked,
        windows_written=len(written),
        duplicated_windows=sum(1 for n in counts.values() if n > 1),
    )


@dataclass(frozen=True)
class MirrorOutcome:
    restarts: int
    source_records: int  # the source topic's end offsets, summed
    mirrored_records: int  # the mirror topic's
    caught_up: bool


def mirror_outcome(
    bootstrap: Sequence[str],
    source: str,
    target: str,
    partitions: int,
    supervised: Supervised,
    timeout_s: float,
) -> MirrorOutcome:
    """Wait (bounded) until the mirror topic's end offsets reach the source's: every record
    acknowledged at the source is on the target (at least once)."""
    ends: dict[str, int] = {}
    with Consumer(list(bootstrap), request_timeout_ms=10_000) as probe:

        def caught_up() -> bool:
            supervised.watch()
            try:
                for topic in (source, target):
                    tps = [TopicPartition(topic, p) for p in range(partitions)]
                    ends[topic] = sum(probe.end_offsets(tps).values())
            except CLIENT_ERRORS as error:  # the target topic not there yet, a leader moving
                log.info("mirror end offsets: %s", error)
                return False
            return ends[target] >= ends[source]

        try:
            done = wait_for(f"{target} to catch up with {source}", caught_up, timeout_s)
        except TimeoutError:
            done = False
    return MirrorOutcome(
        restarts=supervised.restarts,
        source_records=ends.get(source, 0),
        mirrored_records=ends.get(target, 0),
        caught_up=done,
    )
