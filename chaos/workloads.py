"""The load a chaos run puts on the cluster, each part recording what it did and saw.

- `ProducerWorkload`: unique values (``<name>-<seq>``) with acks=all and idempotence, spread
  round-robin over the topic's partitions at a steady rate; every send is recorded with its
  outcome (acknowledged offset, or the error).
- `GroupMember`: one member of a consumer group reading the topic from the earliest offset and
  committing what it consumed every second and before it gives a partition up.
- `CommittedWatcher`: reads the group's committed offsets (OffsetFetch) every second.
- `AdminWorkload`: creates a fresh topic and deletes the oldest it created, in turns.
- `MetadataSampler`: leader, epoch and ISR of every partition, every second.

Against a secure cluster each part connects as the run's workload user (`security`; the admin
workload's and the watchers' through the AdminClient they are given: chaos/secure.py).

Each part is a thread that runs until the run's stop event is set; errors are part of what is
recorded (faults cause them), never a reason to stop. Pacing uses `Event.wait`, so stopping
interrupts it at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from chaos.history import (
    AdminOp,
    Commit,
    CommittedObservation,
    Consumed,
    MetadataSample,
    UncleanElection,
    Write,
)
from dataplane.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from dataplane.client._types import ConsumerRebalanceListener, RecordMetadata
from dataplane.client.producer import RecordFuture
from metadata_quorum.security.channels import ClientSecurity
from raftlog.errors import KafkaError

log = logging.getLogger(__name__)
T = TypeVar("T")
# What a client call raises when the cluster misbehaves: recorded as the operation's outcome.
CLIENT_ERRORS = (KafkaError, grpc.RpcError, TimeoutError, OSError)


class Recorder:
    """The run's clock (seconds since start) and its thread-safe record lists."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.Lock()
        self.writes: list[Write] = []
        self.consumed: list[Consumed] = []
        self.commits: list[Commit] = []
        self.committed: list[CommittedObservation] = []
        self.admin: list[AdminOp] = []
        self.samples: list[MetadataSample] = []
        self.problems: list[str] = []

    def start(self) -> None:
        """Time zero of the run: when the workloads start (the cluster is up)."""
        self._t0 = self._clock()

    def now(self) -> float:
        return round(self._clock() - self._t0, 4)

    def add(self, items: list[T], *new: T) -> None:
        with self._lock:
            items.extend(new)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


class _Worker(threading.Thread):
    def __init__(self, name: str, recorder: Recorder, stop: threading.Event) -> None:
        super().__init__(name=f"chaos-{name}", daemon=True)
        self.recorder = recorder
        self.stop = stop

    def run(self) -> None:
        try:
            self.work()
        except CLIENT_ERRORS as error:
            log.exception("%s stopped", self.name)
            self.recorder.add(self.recorder.problems, f"{self.name} stopped: {_describe(error)}")

    def work(self) -> None:
        raise NotImplementedError


class ProducerWorkload(_Worker):
    """Sends ``rate`` records a second, at most ``max_outstanding`` unanswered at a time."""

    def __init__(
        self,
        name: str,
        bootstrap: Sequence[str],
        topic: str,
        partitions: int,
        rate: float,
        recorder: Recorder,
        stop: threading.Event,
        max_outstanding: int = 1_000,
        security: ClientSecurity | None = None,
    ) -> None:
        super().__init__(name, recorder, stop)
        self.producer_name = name
        self.topic = topic
        self.partitions = partitions
        self.interval_s = 1.0 / rate
        self._slots = threading.BoundedSemaphore(max_outstanding)
        self._pending: dict[int, tuple[int, str, float]] = {}  # seq -> partition, value, start
        self._pending_lock = threading.Lock()
        self.producer = Producer(
            list(bootstrap),
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            request_timeout_ms=5_000,
            delivery_timeout_ms=60_000,
            max_block_ms=5_000,
            metadata_max_age_ms=5_000,
            security=security,
        )

    def work(self) -> None:
        seq = 0
        next_send = time.monotonic()
        while not self.stop.is_set():
            if not self._slots.acquire(timeout=0.2):
                continue
            self._send(seq)
            seq += 1
            next_send += self.interval_s
            delay = next_send - time.monotonic()
            if delay > 0:
                self.stop.wait(delay)  # pacing the load, not waiting for a condition
            else:
                next_send = time.monotonic()  # behind (a slow send): do not burst to catch up

    def _send(self, seq: int) -> None:
        partition = seq % self.partitions
        value = f"{self.producer_name}-{seq}"
        start = self.recorder.now()
        with self._pending_lock:
            self._pending[seq] = (partition, value, start)
        try:
            future = self.producer.send(self.topic, value.encode(), partition=partition)
        except CLIENT_ERRORS as error:  # max.block.ms: the send failed
            self._done(seq, None, error)
            return
        future.add_done_callback(lambda f: self._completed(seq, f))

    def _completed(self, seq: int, future: RecordFuture) -> None:
        error = future.exception()
        self._done(seq, None if error is not None else future.result(), error)

    def _done(self, seq: int, metadata: RecordMetadata | None, error: BaseException | None) -> None:
        with self._pending_lock:
            pending = self._pending.pop(seq, None)
        self._slots.release()
        if pending is None:
            return
        self.recorder.add(
            self.recorder.writes,
            self._write(
                seq, pending, end_s=self.recorder.now(), ok=error is None,
                offset=None if metadata is None else metadata.offset,
                error="" if error is None else _describe(error),
            ),
        )  # fmt: skip

    def _write(self, seq: int, pending: tuple[int, str, float], **outcome: Any) -> Write:
        partition, value, start = pending
        return Write(
            producer=self.producer_name, seq=seq, topic=self.topic, partition=partition,
            value=value, start_s=start, **outcome,
        )  # fmt: skip

    def finish(self, timeout_s: float) -> None:
        """Wait (bounded) for the outcomes still due, close the producer, and record every send
        still unanswered as indeterminate."""
        try:
            self.producer.flush(timeout=timeout_s)
        except CLIENT_ERRORS as error:
            log.warning("%s: flush: %s", self.name, error)
        self.producer.close(timeout=5.0)
        with self._pending_lock:
            left = sorted(self._pending.items())
            self._pending.clear()
        self.recorder.add(
            self.recorder.writes,
            *(
                self._write(seq, pending, error="no outcome before the run ended")
                for seq, pending in left
            ),
        )


class GroupMember(_Worker, ConsumerRebalanceListener):
    """A consumer-group member: consumes, records every record, commits what it consumed."""

    COMMIT_EVERY_S = 1.0

    def __init__(
        self,
        name: str,
        bootstrap: Sequence[str],
        group: str,
        topic: str,
        recorder: Recorder,
        stop: threading.Event,
        security: ClientSecurity | None = None,
    ) -> None:
        super().__init__(name, recorder, stop)
        self.member = name
        self.topic = topic
        self.consumer = Consumer(
            list(bootstrap),
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            request_timeout_ms=5_000,
            fetch_max_wait_ms=200,
            metadata_max_age_ms=5_000,
            security=security,
        )
        self._next: dict[TopicPartition, int] = {}  # next offset to commit, owned partitions
        self.positions: dict[TopicPartition, int] = {}  # everything consumed so far

    def work(self) -> None:
        self.consumer.subscribe([self.topic], listener=self)
        next_commit = time.monotonic() + self.COMMIT_EVERY_S
        try:
            while not self.stop.is_set():
                self.poll_once()
                if time.monotonic() >= next_commit:
                    self.commit(set(self._next))
                    next_commit = time.monotonic() + self.COMMIT_EVERY_S
        finally:
            self.commit(set(self._next))
            self.consumer.close()

    def poll_once(self) -> None:
        try:
            polled = self.consumer.poll(200)
        except KafkaError as error:
            log.info("%s: poll: %s", self.member, error)
            self.stop.wait(0.2)  # back off after a failed poll
            return
        now = self.recorder.now()
        batch = [
            Consumed(
                member=self.member,
                topic=r.topic,
                partition=r.partition,
                offset=r.offset,
                value=(r.value or b"").decode(),
                time_s=now,
            )
            for records in polled.values()
            for r in records
        ]
        for tp, records in polled.items():
            if records:
                self._next[tp] = records[-1].offset + 1
                self.positions[tp] = records[-1].offset + 1
        if batch:
            self.recorder.add(self.recorder.consumed, *batch)

    def commit(self, partitions: set[TopicPartition]) -> None:
        offsets = {tp: self._next[tp] for tp in partitions if tp in self._next}
        if not offsets:
            return
        start = self.recorder.now()
        error = ""
        try:
            self.consumer.commit(offsets)
        except CLIENT_ERRORS as failure:  # fenced, coordinator moving: recorded, not fatal
            error = _describe(failure)
        end = self.recorder.now()
        self.recorder.add(
            self.recorder.commits,
            *(
                Commit(
                    member=self.member,
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=offset,
                    start_s=start,
                    end_s=end,
                    ok=not error,
                    error=error,
                )
                for tp, offset in sorted(offsets.items())
            ),
        )

    # ConsumerRebalanceListener: commit before giving a partition up, forget lost ones.
    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.commit(revoked)
        for tp in revoked:
            self._next.pop(tp, None)

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        for tp in assigned:
            self._next.pop(tp, None)  # the position restarts from the committed offset

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        for tp in lost:
            self._next.pop(tp, None)


class CommittedWatcher(_Worker):
    """The group's committed offsets, read every `every_s` (a partition seen once and then
    missing is recorded as -1: a commit that was lost)."""

    def __init__(
        self,
        admin: AdminClient,
        group: str,
        topic: str,
        recorder: Recorder,
        stop: threading.Event,
        every_s: float = 1.0,
    ) -> None:
        super().__init__("committed-watcher", recorder, stop)
        self.admin, self.group, self.topic, self.every_s = admin, group, topic, every_s
        self._seen: set[int] = set()

    def work(self) -> None:
        while not self.stop.wait(self.every_s):
            self.observe()

    def observe(self) -> None:
        try:
            offsets = self.admin.list_group_offsets(self.group)
        except CLIENT_ERRORS as error:
            log.info("OffsetFetch: %s", error)
            return
        now = self.recorder.now()
        found = {tp.partition: o.offset for tp, o in offsets.items() if tp.topic == self.topic}
        self._seen |= set(found)
        self.recorder.add(
            self.recorder.committed,
            *(
                CommittedObservation(
                    topic=self.topic, partition=p, offset=found.get(p, -1), time_s=now
                )
                for p in sorted(self._seen)
            ),
        )


class AdminWorkload(_Worker):
    """Every `every_s`: create a fresh topic, or delete the oldest one it created."""

    def __init__(
        self,
        admin: AdminClient,
        prefix: str,
        replication_factor: int,
        recorder: Recorder,
        stop: threading.Event,
        every_s: float = 2.0,
    ) -> None:
        super().__init__("admin", recorder, stop)
        self.admin, self.prefix, self.rf, self.every_s = admin, prefix, replication_factor, every_s
        self._created: list[str] = []

    def work(self) -> None:
        serial = 0
        while not self.stop.wait(self.every_s):
            if len(self._created) >= 2 and serial % 2:
                self._run("delete", self._created.pop(0))
            else:
                name = f"{self.prefix}-{serial}"
                if self._run("create", name):
                    self._created.append(name)
            serial += 1

    def _run(self, op: str, topic: str) -> bool:
        start = self.recorder.now()
        try:
            if op == "create":
                results = self.admin.create_topics([NewTopic(topic, 1, self.rf)])
            else:
                results = self.admin.delete_topics([topic])
            failure = results.get(topic)
            error = "" if failure is None else _describe(failure)
        except CLIENT_ERRORS as exc:  # no controller, a timeout: indeterminate
            error = _describe(exc)
        self.recorder.add(
            self.recorder.admin,
            AdminOp(
                op="create" if op == "create" else "delete",
                topic=topic,
                start_s=start,
                end_s=self.recorder.now(),
                ok=not error,
                error=error,
            ),
        )
        return not error


class MetadataSampler(_Worker):
    """Leader, leader epoch and ISR of every partition of `topic`, every `every_s`."""

    def __init__(
        self,
        admin: AdminClient,
        topic: str,
        recorder: Recorder,
        stop: threading.Event,
        every_s: float = 1.0,
    ) -> None:
        super().__init__("metadata-sampler", recorder, stop)
        self.admin, self.topic, self.every_s = admin, topic, every_s

    def work(self) -> None:
        while not self.stop.wait(self.every_s):
            try:
                described = self.admin.describe_topics([self.topic])[self.topic]
            except CLIENT_ERRORS as error:
                log.info("DescribeTopics: %s", error)
                continue
            now = self.recorder.now()
            self.recorder.add(
                self.recorder.samples,
                *(
                    MetadataSample(
                        time_s=now,
                        topic=self.topic,
                        partition=p.partition,
                        leader=p.leader,
                        leader_epoch=p.leader_epoch,
                        isr=sorted(p.isr),
                    )
                    for p in described.partitions
                ),
            )


class OfflineElector(_Worker):
    """The operator on call: every `every_s`, :func:`elect_offline_partitions`, each election
    handed to `on_elected`. Waiting longer brings no such partition back (its replicas stay in
    the last known ELR, which is never elected), so the run's availability and its reported
    losses are what a watched cluster would have, not what one left alone until the end has."""

    def __init__(
        self,
        admin: AdminClient,
        recorder: Recorder,
        stop: threading.Event,
        on_elected: Callable[[UncleanElection], None],
        every_s: float = 5.0,
    ) -> None:
        super().__init__("offline-elector", recorder, stop)
        self.admin, self.on_elected, self.every_s = admin, on_elected, every_s

    def work(self) -> None:
        while not self.stop.wait(self.every_s):
            try:
                elected = elect_offline_partitions(self.admin, self.recorder.now())
            except CLIENT_ERRORS as error:
                log.info("offline elector: %s", error)
                continue
            for election in elected:
                self.on_elected(election)


def elect_offline_partitions(control: AdminClient, now_s: float) -> list[UncleanElection]:
    """What an operator does when KIP-966 leaves a partition offline for good (no leader, ISR
    and ELR empty: every replica that held its committed records restarted without proof that
    it lost nothing, and none can be elected without losing acknowledged records): an unclean
    election, for every such partition of any topic, once it can take the best replica there
    is. The controller prefers a replica of the last known ELR (it held the committed records
    once), so the operator waits until one of those is back, or until every replica is (a
    partition whose last known ELR is empty or gone for good). The ones elected; the others are
    left for the next poll."""
    offline = [
        (name, p)
        for name, topic in sorted(control.describe_topics(None).items())
        for p in topic.partitions
        if p.leader < 0 and not p.isr and not p.elr
    ]
    if not offline:
        return []
    usable = {
        b.broker_id
        for b in control.describe_cluster().brokers
        if not b.fenced and not b.in_controlled_shutdown
    }
    ready = [
        (name, p.partition)
        for name, p in offline
        if usable & set(p.last_known_elr) or set(p.replicas) <= usable
    ]
    if not ready:
        return []
    return [
        UncleanElection(topic=tp.topic, partition=tp.partition, time_s=now_s)
        for tp, error in sorted(control.elect_leaders("unclean", ready).items())
        if error is None
    ]
