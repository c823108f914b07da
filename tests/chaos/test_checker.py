"""The chaos checker on hand-made histories: a clean run, then each anomaly and its near misses.

`Run` builds a history the way a run unfolds: faults, writes (each acknowledged write lands at the
end of its partition's final log unless the story says otherwise), consumption, commits, admin
operations. Replicas and controller images are derived from the final logs, so they agree unless
a test changes them.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.checker import (
    FINDINGS_PER_KIND_MAX,
    OFFSETS_TOPIC,
    OFFSETS_TOPIC_PARTITIONS,
    check,
    faults_at,
)
from chaos.history import (
    AdminOp,
    BatchEntry,
    Commit,
    CommittedObservation,
    Consumed,
    ControllerImage,
    DataCheck,
    FaultKind,
    FaultWindow,
    FinalPartition,
    Finding,
    FindingKind,
    History,
    PartitionImage,
    ReplicaLog,
    TopicImage,
    UncleanElection,
    Write,
)
from raftlog.coordinator_key import partition_for

TOPIC = "events"
NODES = [1, 2, 3]
LATENCY_S = 0.1  # every write's outcome is known this long after it started


@dataclass
class Run:
    """A chaos run told step by step; `history()` is what the runner would have recorded."""

    partitions: int = 2
    workload_s: float = 10.0
    writes: list[Write] = field(default_factory=list)
    consumed: list[Consumed] = field(default_factory=list)
    commits: list[Commit] = field(default_factory=list)
    committed: list[CommittedObservation] = field(default_factory=list)
    admin: list[AdminOp] = field(default_factory=list)
    faults: list[FaultWindow] = field(default_factory=list)
    logs: dict[int, dict[int, str]] = field(default_factory=dict)  # partition -> offset -> value
    log_start: dict[int, int] = field(default_factory=dict)
    unread: set[int] = field(default_factory=set)  # partitions whose final state was not read
    final_topics: list[str] | None = None  # None: the topics the admin ops should have left
    final_topics_unread: bool = False
    problems: list[str] = field(default_factory=list)
    seqs: Counter[str] = field(default_factory=Counter)

    def fault(self, start_s: float, end_s: float, kind: FaultKind = "kill") -> int:
        fault_id = len(self.faults) + 1
        self.faults.append(
            FaultWindow(id=fault_id, kind=kind, nodes=[2], start_s=start_s, end_s=end_s)
        )
        return fault_id

    def next_offset(self, partition: int) -> int:
        log = self.logs.get(partition, {})
        return max(log, default=self.log_start.get(partition, 0) - 1) + 1

    def store(self, value: str, partition: int = 0, offset: int | None = None) -> int:
        """Put a record into the final log (at the end unless `offset` says where)."""
        offset = self.next_offset(partition) if offset is None else offset
        self.logs.setdefault(partition, {})[offset] = value
        return offset

    def ack(
        self,
        value: str,
        partition: int = 0,
        at: float = 1.0,
        *,
        producer: str = "prod",
        seq: int | None = None,
        stored: bool = True,
        acked_offset: int | None = None,
    ) -> int:
        """An acknowledged write; returns the offset the broker answered."""
        offset = self.store(value, partition) if stored else self.next_offset(partition)
        acked = offset if acked_offset is None else acked_offset
        self._write(value, partition, at, producer, seq, ok=True, offset=acked)
        return acked

    def attempt(
        self, value: str, partition: int = 0, at: float = 1.0, *, stored: bool = False
    ) -> None:
        """A write whose outcome is unknown (a timeout); it may or may not have been stored."""
        if stored:
            self.store(value, partition)
        self._write(value, partition, at, "prod", None, ok=False, offset=None)

    def _write(
        self,
        value: str,
        partition: int,
        at: float,
        producer: str,
        seq: int | None,
        *,
        ok: bool,
        offset: int | None,
    ) -> None:
        self.seqs[producer] += 1
        self.writes.append(
            Write(
                producer=producer,
                seq=self.seqs[producer] if seq is None else seq,
                topic=TOPIC,
                partition=partition,
                value=value,
                start_s=at,
                end_s=at + LATENCY_S,
                ok=ok,
                offset=offset if ok else None,
                error="" if ok else "timed out",
            )
        )

    def retain_from(self, partition: int, log_start_offset: int) -> None:
        """Retention removed every record below `log_start_offset`."""
        self.log_start[partition] = log_start_offset
        log = self.logs.get(partition, {})
        self.logs[partition] = {o: v for o, v in log.items() if o >= log_start_offset}

    def consume(
        self, partition: int, offsets: Iterable[int], at: float, member: str = "m1"
    ) -> None:
        for offset in offsets:
            value = self.logs[partition][offset]
            self.consumed.append(
                Consumed(
                    member=member,
                    topic=TOPIC,
                    partition=partition,
                    offset=offset,
                    value=value,
                    time_s=at,
                )
            )

    def consume_all(self, at: float) -> None:
        for partition, log in sorted(self.logs.items()):
            self.consume(partition, sorted(log), at)

    def commit(self, partition: int, offset: int, at: float) -> None:
        """An ok commit, then an OffsetFetch that sees it."""
        self.commits.append(
            Commit(
                member="m1",
                topic=TOPIC,
                partition=partition,
                offset=offset,
                start_s=at,
                end_s=at + LATENCY_S,
                ok=True,
            )
        )
        self.observe(partition, offset, at + LATENCY_S)

    def observe(self, partition: int, offset: int, at: float) -> None:
        self.committed.append(
            CommittedObservation(topic=TOPIC, partition=partition, offset=offset, time_s=at)
        )

    def create(self, topic: str, at: float, ok: bool = True) -> None:
        self.admin.append(AdminOp(op="create", topic=topic, start_s=at, end_s=at + 0.1, ok=ok))

    def delete(self, topic: str, at: float, ok: bool = True) -> None:
        self.admin.append(AdminOp(op="delete", topic=topic, start_s=at, end_s=at + 0.1, ok=ok))

    def history(self) -> History:
        return History(
            seed=7,
            nodes=NODES,
            faults_requested=sorted({fault.kind for fault in self.faults}),
            duration_s=self.workload_s,
            topic=TOPIC,
            partitions=self.partitions,
            group="g",
            started_at="2025-01-01T00:00:00Z",
            workload_s=self.workload_s,
            end_s=self.workload_s + 5,
            writes=self.writes,
            consumed=self.consumed,
            commits=self.commits,
            committed=self.committed,
            admin=self.admin,
            faults=self.faults,
            final=[self._final(p) for p in range(self.partitions) if p not in self.unread],
            final_topics=None if self.final_topics_unread else self._final_topics(),
            controllers=[ControllerImage(node_id=n, topics=[self._topic_image()]) for n in NODES],
            problems=self.problems,
        )

    def _final(self, partition: int) -> FinalPartition:
        records = sorted(self.logs.get(partition, {}).items())
        return FinalPartition(
            topic=TOPIC,
            partition=partition,
            leader=1,
            isr=NODES,
            log_start_offset=self.log_start.get(partition, 0),
            high_watermark=self.next_offset(partition),
            records=records,
            replicas=[ReplicaLog(node_id=n, batches=batches(records)) for n in NODES],
        )

    def _final_topics(self) -> list[str]:
        if self.final_topics is not None:
            return self.final_topics
        topics = {TOPIC}
        for op in self.admin:
            if op.ok and op.op == "create":
                topics.add(op.topic)
            elif op.ok:
                topics.discard(op.topic)
        return sorted(topics)

    def _topic_image(self) -> TopicImage:
        partitions = [
            PartitionImage(
                partition=p, leader=1, leader_epoch=3, partition_epoch=5, replicas=NODES, isr=NODES
            )
            for p in range(self.partitions)
        ]
        return TopicImage(name=TOPIC, topic_id="AAAAAAAAAAAAAAAAAAAAAA", partitions=partitions)


def batches(records: Iterable[tuple[int, str]]) -> list[BatchEntry]:
    """One batch per record, as a replica would hold them."""
    return [
        BatchEntry(base_offset=o, last_offset=o, crc=zlib.crc32(v.encode()), leader_epoch=1)
        for o, v in records
    ]


def with_final(history: History, partition: int, **update: object) -> History:
    """`history` with one final partition's fields replaced."""
    final = [
        part.model_copy(update=update) if part.partition == partition else part
        for part in history.final
    ]
    return history.model_copy(update={"final": final})


def with_replica(history: History, partition: int, node_id: int, *batch: BatchEntry) -> History:
    part = next(p for p in history.final if p.partition == partition)
    replicas = [
        ReplicaLog(node_id=node_id, batches=list(batch)) if r.node_id == node_id else r
        for r in part.replicas
    ]
    return with_final(history, partition, replicas=replicas)


def findings(history: History, kind: FindingKind | None = None) -> list[Finding]:
    return [f for f in check(history).findings if kind is None or f.kind == kind]


def only(history: History, kind: FindingKind) -> Finding:
    """The one finding the history yields, which must be of `kind`."""
    found = findings(history)
    assert [f.kind for f in found] == [kind], found
    return found[0]


def written(run: Run, count: int, partition: int = 0, start_s: float = 0.5) -> list[int]:
    """`count` acknowledged writes, one every 0.5 s; returns their offsets."""
    return [run.ack(f"v{partition}-{i}", partition, at=start_s + i / 2) for i in range(count)]


# A clean run


def clean_run() -> Run:
    run = Run(partitions=2, workload_s=10.0)
    run.observe(0, -1, at=0.1)
    for at in (0.5, 1.5):
        run.ack(f"a{at}", 0, at)
    run.ack("b0.8", 1, 0.8)
    kill = run.fault(2.0, 4.0, kind="kill")
    run.attempt("lost-in-the-kill", 0, at=2.5)  # never stored: fine, it was not acknowledged
    run.attempt("stored-in-the-kill", 1, at=3.0, stored=True)  # stored once: fine
    run.create("t-a", at=3.5)
    for at in (4.5, 5.5):
        run.ack(f"a{at}", 0, at)
    run.ack("b4.8", 1, 4.8)
    run.delete("t-a", at=5.0)
    run.create("t-b", at=5.2)
    run.create("t-c", at=5.4, ok=False)  # failed and absent: fine
    pause = run.fault(6.0, 7.0, kind="pause")
    for at in (7.5, 8.5, 9.5):
        run.ack(f"a{at}", 0, at)
    run.ack("b7.8", 1, 7.8)
    run.consume_all(at=9.7)
    run.commit(0, run.next_offset(0), at=9.8)
    run.commit(1, run.next_offset(1), at=9.8)
    run.observe(0, run.next_offset(0), at=9.95)  # the same offset again: fine
    assert (kill, pause) == (1, 2)
    return run


def test_a_clean_run_is_ok_and_its_figures_add_up() -> None:
    verdict = check(clean_run().history())

    assert verdict.findings == []
    assert verdict.ok
    summary = verdict.summary
    assert (summary.attempted_writes, summary.acknowledged_writes) == (12, 10)
    assert summary.indeterminate_writes == 2
    assert (summary.lost_writes, summary.duplicated_values) == (0, 0)
    # acknowledged in seconds 0, 1, 4, 5, 7, 8, 9; nothing in 2, 3 (kill) and 6 (pause)
    assert summary.availability == pytest.approx(0.7)
    assert summary.faults_by_kind == {"kill": 1, "pause": 1}
    # after the kill (2.0): partition 0 at 4.6, partition 1 at 4.9; after the pause (6.0):
    # partition 0 at 7.6, partition 1 at 7.9
    assert [(r.fault_id, r.kind) for r in summary.recoveries] == [(1, "kill"), (2, "pause")]
    assert [r.recovery_s for r in summary.recoveries] == [pytest.approx(2.9), pytest.approx(1.9)]
    assert (summary.consumed_records, summary.commits_ok, summary.admin_ops_ok) == (11, 2, 3)


def test_recovery_is_unknown_when_a_partition_never_acknowledges_again() -> None:
    run = Run(partitions=2)
    run.ack("p0-before", 0, at=0.5)
    run.ack("p1-before", 1, at=0.5)
    run.fault(2.0, 3.0)
    run.ack("p0-after", 0, at=3.5)

    (recovery,) = check(run.history()).summary.recoveries
    assert recovery.recovery_s is None


def test_recovery_counts_from_when_a_fault_took_hold() -> None:
    run = Run(partitions=1)
    run.fault(2.0, 6.0, kind="disk-full")
    run.faults[0] = run.faults[0].model_copy(update={"effect_s": 3.0})  # the node halted at 3.0
    run.ack("written-before-the-halt", 0, at=2.5)  # acknowledged, but from before it took hold
    run.ack("after", 0, at=4.2)

    (recovery,) = check(run.history()).summary.recoveries
    assert recovery.recovery_s == pytest.approx(4.2 + LATENCY_S - 3.0)


def test_availability_counts_at_least_one_second() -> None:
    run = Run(partitions=1, workload_s=0.4)
    assert check(run.history()).summary.availability == 0.0
    run.ack("quick", 0, at=0.2)
    assert check(run.history()).summary.availability == 1.0


def test_availability_counts_the_workloads_whole_seconds() -> None:
    run = Run(partitions=1, workload_s=3.7)
    for at in (0.5, 2.5, 3.3):  # the last one ends in the unfinished fourth second
        run.ack(f"v{at}", 0, at)

    assert check(run.history()).summary.availability == pytest.approx(2 / 3)


# Fault attribution


def test_faults_at_names_the_active_windows_else_the_last_one_that_ended() -> None:
    run = Run()
    run.fault(2.0, 4.0)
    run.fault(3.0, 6.0, kind="partition")
    run.fault(8.0, 9.0, kind="pause")
    history = run.history()

    assert faults_at(history, 1.0) == []
    assert faults_at(history, 2.0) == [1]
    assert faults_at(history, 3.5) == [1, 2]
    assert faults_at(history, 7.0) == [2]
    assert faults_at(history, 9.5) == [3]
    assert faults_at(history, None) == []


# lost-write


def test_an_acknowledged_write_stored_nowhere_is_lost_in_the_window_it_was_written() -> None:
    run = Run(partitions=1)
    written(run, 2)
    kill = run.fault(2.0, 4.0)
    offset = run.ack("gone", 0, at=2.5, stored=False)
    run.ack("next", 0, at=4.5)  # the log moved on: "next" is stored where "gone" was acked

    lost = only(run.history(), "lost-write")
    assert (lost.partition, lost.offset, lost.value) == (0, offset, "gone")
    assert lost.time_s == pytest.approx(2.6)
    assert lost.faults == [kill]
    assert check(run.history()).summary.lost_writes == 1


def test_a_lost_write_after_a_fault_is_attributed_to_the_fault_before_it() -> None:
    run = Run(partitions=1)
    kill = run.fault(2.0, 4.0)
    run.ack("gone", 0, at=5.0, stored=False)

    assert only(run.history(), "lost-write").faults == [kill]


def test_a_lost_write_before_any_fault_is_attributed_to_none() -> None:
    run = Run(partitions=1)
    run.ack("gone", 0, at=1.0, stored=False)
    run.fault(2.0, 4.0)

    assert only(run.history(), "lost-write").faults == []


def test_missing_indeterminate_writes_and_retention_are_not_losses() -> None:
    run = Run(partitions=1)
    written(run, 4)
    run.attempt("maybe", 0, at=3.0)
    run.retain_from(0, 2)  # offsets 0 and 1 removed by retention

    assert findings(run.history()) == []


def test_a_partition_without_final_state_is_a_harness_finding_not_a_loss() -> None:
    run = Run(partitions=2)
    written(run, 3, partition=1)
    run.unread.add(1)

    harness = only(run.history(), "harness")
    assert (harness.topic, harness.partition) == (TOPIC, 1)
    assert "no final state" in harness.message


# moved-write


def test_an_acknowledged_write_stored_at_another_offset_moved() -> None:
    run = Run(partitions=1)
    written(run, 2)
    run.ack("wanderer", 0, at=3.0, acked_offset=7)  # stored at offset 2

    moved = only(run.history(), "moved-write")
    assert (moved.partition, moved.offset, moved.value) == (0, 7, "wanderer")
    assert f"{TOPIC}-0@2" in moved.message


def test_an_acknowledged_write_stored_also_elsewhere_moved_and_is_duplicated() -> None:
    run = Run(partitions=2)
    written(run, 2)
    run.ack("twin", 0, at=3.0)
    run.store("twin", partition=1)

    kinds = sorted(f.kind for f in findings(run.history()))
    assert kinds == ["duplicate", "moved-write"]


# duplicate


def test_a_value_stored_twice_is_one_duplicate() -> None:
    run = Run(partitions=2)
    written(run, 2)
    kill = run.fault(2.0, 3.0)
    run.attempt("retried", 0, at=2.5, stored=True)
    run.store("retried", partition=1)

    duplicate = only(run.history(), "duplicate")
    assert (duplicate.partition, duplicate.offset, duplicate.value) == (1, 0, "retried")
    assert f"{TOPIC}-0@2, {TOPIC}-1@0" in duplicate.message
    assert duplicate.faults == [kill]
    assert check(run.history()).summary.duplicated_values == 1


def test_an_indeterminate_write_stored_once_is_fine() -> None:
    run = Run(partitions=1)
    run.attempt("maybe", 0, at=1.0, stored=True)

    assert findings(run.history()) == []


def test_a_record_stored_twice_in_one_partition_is_also_out_of_order() -> None:
    run = Run(partitions=1)
    run.attempt("retried", 0, at=1.0, stored=True)
    run.store("retried")

    kinds = [(f.kind, f.offset) for f in findings(run.history())]
    assert kinds == [("duplicate", 1), ("order", 1)]


# unknown-value


def test_a_value_no_producer_sent_is_unknown() -> None:
    run = Run(partitions=1)
    written(run, 2)
    offset = run.store("ghost")

    unknown = only(run.history(), "unknown-value")
    assert (unknown.partition, unknown.offset, unknown.value) == (0, offset, "ghost")
    assert unknown.faults == []


# order


def test_a_producer_whose_records_are_stored_out_of_send_order_is_an_order_finding() -> None:
    run = Run(partitions=1)
    run.ack("second", 0, at=1.0, seq=2)  # stored at 0
    run.ack("third", 0, at=1.1, seq=3)  # stored at 1
    run.ack("first", 0, at=1.2, seq=1)  # stored at 2: follows seq 3

    order = only(run.history(), "order")
    assert (order.partition, order.offset, order.value) == (0, 2, "first")
    assert "offset 1" in order.message


def test_interleaved_producers_each_in_order_are_fine() -> None:
    run = Run(partitions=1)
    for i in range(3):
        run.ack(f"x{i}", 0, at=1.0 + i, producer="x")
        run.ack(f"y{i}", 0, at=1.5 + i, producer="y")

    assert findings(run.history()) == []


# replica-divergence and replica-missing


def test_replicas_that_differ_below_the_high_watermark_diverge() -> None:
    run = Run(partitions=1)
    written(run, 4)
    history = run.history()
    good = history.final[0].replicas[0].batches
    forked = BatchEntry(base_offset=2, last_offset=2, crc=0xDEAD, leader_epoch=2)
    history = with_replica(history, 0, 3, *good[:2], forked, good[3])

    divergence = only(history, "replica-divergence")
    assert (divergence.partition, divergence.offset) == (0, 2)
    assert "node 3" in divergence.message
    assert "node 1" in divergence.message


def test_a_replica_outside_the_isr_may_still_hold_a_deposed_leaders_batches() -> None:
    run = Run(partitions=1)
    written(run, 4)
    history = with_final(run.history(), 0, isr=[1, 2])
    good = history.final[0].replicas[0].batches
    deposed = BatchEntry(base_offset=2, last_offset=2, crc=0xDEAD, leader_epoch=0)
    history = with_replica(history, 0, 3, *good[:2], deposed)

    assert findings(history) == []


def test_different_batch_boundaries_diverge() -> None:
    run = Run(partitions=1)
    written(run, 4)
    history = run.history()
    good = history.final[0].replicas[0].batches
    merged = BatchEntry(base_offset=2, last_offset=3, crc=good[2].crc, leader_epoch=1)

    assert only(with_replica(history, 0, 2, *good[:2], merged), "replica-divergence").offset == 2


def test_the_reference_is_the_leaders_replica() -> None:
    run = Run(partitions=1)
    written(run, 2)
    history = with_final(run.history(), 0, leader=2)
    good = history.final[0].replicas[0].batches
    history = with_replica(history, 0, 1, good[0], good[1].model_copy(update={"crc": 1}))

    divergence = only(history, "replica-divergence")
    assert divergence.message.startswith(f"{TOPIC}-0: node 1 differs from node 2")


def test_the_reference_is_the_first_isr_member_when_the_leader_has_no_log() -> None:
    run = Run(partitions=1)
    written(run, 2)
    history = with_final(run.history(), 0, leader=9, isr=[3, 1, 2])
    good = history.final[0].replicas[0].batches
    history = with_replica(history, 0, 1, good[0], good[1].model_copy(update={"crc": 1}))

    divergence = only(history, "replica-divergence")
    assert divergence.message.startswith(f"{TOPIC}-0: node 1 differs from node 3")


def test_replicas_may_differ_above_the_high_watermark_and_in_retention() -> None:
    run = Run(partitions=1)
    written(run, 4)
    history = run.history()
    good = history.final[0].replicas[0].batches
    for node_id, crc in ((1, 7), (2, 8)):  # above HW 4: not committed, may differ
        uncommitted = BatchEntry(base_offset=4, last_offset=4, crc=crc, leader_epoch=2)
        history = with_replica(history, 0, node_id, *good, uncommitted)
    history = with_replica(history, 0, 3, *good[2:])  # retention removed 0 and 1 already

    assert findings(history) == []


def test_an_isr_member_short_of_the_high_watermark_is_missing_and_others_are_fine() -> None:
    run = Run(partitions=1)
    written(run, 4)
    history = with_final(run.history(), 0, isr=[1, 2])
    good = history.final[0].replicas[0].batches
    history = with_replica(history, 0, 2, *good[:3])
    history = with_replica(history, 0, 3, *good[:1])  # not in the ISR: may lag

    missing = only(history, "replica-missing")
    assert (missing.partition, missing.offset) == (0, 3)
    assert "ISR member 2" in missing.message


def test_an_isr_member_with_no_batches_of_a_non_empty_partition_is_missing() -> None:
    run = Run(partitions=1)
    written(run, 2)
    history = with_replica(run.history(), 0, 3)

    missing = only(history, "replica-missing")
    assert "no batches" in missing.message


def test_an_isr_member_whose_log_was_not_read_is_a_harness_finding() -> None:
    run = Run(partitions=1)
    written(run, 2)
    history = run.history()
    replicas = [r for r in history.final[0].replicas if r.node_id != 2]

    harness = only(with_final(history, 0, replicas=replicas), "harness")
    assert "ISR member 2" in harness.message
    assert findings(with_final(history, 0, replicas=[])) == []  # no replicas read: no judgement


# committed-backwards


def test_a_committed_offset_going_down_is_backwards_at_that_time() -> None:
    run = Run(partitions=1)
    written(run, 6)
    run.consume_all(at=3.0)
    run.commit(0, 5, at=3.0)
    controller_kill = run.fault(4.0, 5.0, kind="controller-kill")
    run.observe(0, 3, at=4.5)
    run.observe(0, -1, at=4.6)
    run.commit(0, 6, at=5.5)

    backwards = findings(run.history(), "committed-backwards")
    assert [(f.offset, f.time_s) for f in backwards] == [(3, 4.5), (-1, 4.6)]
    assert all(f.faults == [controller_kill] for f in backwards)


def test_observations_are_judged_in_time_order_and_equal_offsets_are_fine() -> None:
    run = Run(partitions=1)
    written(run, 6)
    run.consume_all(at=3.0)
    run.observe(0, 6, at=5.0)
    run.observe(0, 6, at=4.9)
    run.observe(0, 2, at=1.0)  # recorded late, observed early

    assert findings(run.history()) == []


# skipped-after-commit


def test_records_below_the_commit_no_member_received_are_skipped_in_runs() -> None:
    run = Run(partitions=1)
    written(run, 8)
    run.consume(0, [0, 1, 4, 6], at=4.0)
    run.commit(0, 2, at=4.1)
    pause = run.fault(4.5, 5.5, kind="pause")
    run.commit(0, 7, at=5.0)  # offsets 2..3 and 5 never received; 7 is past the commit

    skipped = findings(run.history(), "skipped-after-commit")
    assert [(f.partition, f.offset) for f in skipped] == [(0, 2), (0, 5)]
    assert "2..3 (2 records)" in skipped[0].message
    assert skipped[0].time_s == pytest.approx(5.1)
    assert skipped[0].faults == [pause]
    assert [f.kind for f in findings(run.history())] == ["skipped-after-commit"] * 2


def test_records_below_log_start_or_past_the_commit_need_not_be_received() -> None:
    run = Run(partitions=2)
    written(run, 6)
    written(run, 3, partition=1)
    run.retain_from(0, 2)
    run.consume(0, [2, 3], at=4.0)
    run.commit(0, 4, at=4.1)  # 0 and 1 were removed by retention; 4 and 5 are not committed
    run.observe(1, -1, at=4.2)  # nothing committed on partition 1: nothing required

    assert findings(run.history()) == []


# consumed-then-lost


def test_a_received_record_the_final_log_does_not_hold_there_was_lost() -> None:
    run = Run(partitions=1)
    written(run, 3)
    run.consume_all(at=2.0)
    leader_kill = run.fault(2.5, 3.0, kind="leader-kill")
    run.logs[0][2] = "overwritten"  # the new leader's log, as if the record had been truncated
    run.attempt("overwritten", 0, at=2.6)
    run.attempt("beyond", 0, at=2.6)  # a record read past the final high watermark
    run.consumed.append(
        Consumed(member="m2", topic=TOPIC, partition=0, offset=5, value="beyond", time_s=2.7)
    )

    lost = findings(run.history(), "consumed-then-lost")
    assert [(f.offset, f.value) for f in lost] == [(2, "v0-2"), (5, "beyond")]
    assert lost[1].faults == [leader_kill]
    assert {f.kind for f in findings(run.history())} == {"consumed-then-lost", "lost-write"}


def test_a_record_received_twice_is_judged_once_and_retention_is_not_loss() -> None:
    run = Run(partitions=1)
    written(run, 4)
    run.consume_all(at=3.0)
    run.consume_all(at=3.5)  # a rebalance delivered everything again
    run.retain_from(0, 2)
    run.logs[0][3] = "other"
    run.attempt("other", 0, at=4.0)

    lost = findings(run.history(), "consumed-then-lost")
    assert [(f.offset, f.time_s) for f in lost] == [(3, 3.0)]


# admin-lost-topic and admin-resurrected-topic


def test_a_created_topic_that_vanished_without_a_delete_is_lost() -> None:
    run = Run()
    controller_kill = run.fault(1.5, 2.5, kind="controller-kill")
    run.create("t-a", at=2.0)
    run.final_topics = [TOPIC]

    lost = only(run.history(), "admin-lost-topic")
    assert (lost.topic, lost.time_s, lost.faults) == ("t-a", 2.1, [controller_kill])


def test_a_vanished_topic_is_no_anomaly_once_a_delete_was_attempted() -> None:
    run = Run()
    run.create("t-a", at=1.0)
    run.delete("t-a", at=3.0, ok=False)  # the outcome is unknown: the topic may be gone
    run.final_topics = [TOPIC]

    assert findings(run.history()) == []


def test_a_deleted_topic_that_still_exists_is_resurrected() -> None:
    run = Run()
    run.create("t-a", at=1.0)
    run.delete("t-a", at=2.0)
    run.delete("t-a", at=2.5, ok=False)  # failed: no claim
    run.final_topics = [TOPIC, "t-a"]

    resurrected = only(run.history(), "admin-resurrected-topic")
    assert (resurrected.topic, resurrected.time_s) == ("t-a", 2.1)


def test_admin_ops_without_a_final_topic_list_are_a_harness_finding() -> None:
    run = Run()
    run.create("t-a", at=1.0)
    run.final_topics_unread = True

    assert "final topic list" in only(run.history(), "harness").message


# metadata-divergence


def controllers_with(history: History, node_id: int, topics: list[TopicImage] | None) -> History:
    controllers = [
        ControllerImage(node_id=c.node_id, topics=topics) if c.node_id == node_id else c
        for c in history.controllers
    ]
    return history.model_copy(update={"controllers": controllers})


def test_a_controller_with_another_leader_diverges_at_that_partition() -> None:
    history = Run(partitions=3).history()
    (topic,) = history.controllers[0].topics or []
    partitions = [
        p.model_copy(update={"leader": 2}) if p.partition == 1 else p for p in topic.partitions
    ]
    history = controllers_with(history, 3, [topic.model_copy(update={"partitions": partitions})])

    divergence = only(history, "metadata-divergence")
    assert (divergence.topic, divergence.partition) == (TOPIC, 1)
    assert "controller 3" in divergence.message
    assert "controller 1" in divergence.message


def test_a_topic_only_one_controller_holds_diverges() -> None:
    history = Run().history()
    (topic,) = history.controllers[0].topics or []
    extra = TopicImage(name="t-z", topic_id="BBBBBBBBBBBBBBBBBBBBBB", partitions=[])
    history = controllers_with(history, 2, [extra, topic])

    divergence = only(history, "metadata-divergence")
    assert (divergence.topic, divergence.partition) == ("t-z", None)


def test_isr_order_and_listing_order_do_not_matter_but_replica_order_does() -> None:
    history = Run(partitions=2).history()
    (topic,) = history.controllers[0].topics or []
    shuffled = [p.model_copy(update={"isr": [3, 2, 1]}) for p in reversed(topic.partitions)]
    history = controllers_with(history, 2, [topic.model_copy(update={"partitions": shuffled})])
    assert findings(history) == []

    reordered = [p.model_copy(update={"replicas": [2, 1, 3]}) for p in topic.partitions]
    history = controllers_with(history, 3, [topic.model_copy(update={"partitions": reordered})])
    assert only(history, "metadata-divergence").partition == 0


def test_a_controller_that_did_not_answer_is_a_harness_finding() -> None:
    history = controllers_with(Run().history(), 2, None)

    assert only(history, "harness").message == "controller 2 did not answer after recovery"


# harness problems and the cap


def test_each_harness_problem_is_a_finding() -> None:
    run = Run()
    run.problems += ["node 3 did not restart", "could not read replica logs"]

    assert [f.message for f in findings(run.history())] == run.problems


def test_a_value_two_writes_carry_is_a_harness_finding() -> None:
    run = Run(partitions=1)
    run.ack("same", 0, at=1.0)
    run.attempt("same", 0, at=1.5)

    assert only(run.history(), "harness").value == "same"


def test_findings_are_capped_per_kind_but_counted_exactly() -> None:
    run = Run(partitions=1)
    extra = 5
    for i in range(FINDINGS_PER_KIND_MAX + extra):
        run.ack(f"gone-{i}", 0, at=1.0, stored=False, acked_offset=i)
    run.store("ghost")

    verdict = check(run.history())
    kinds = Counter(f.kind for f in verdict.findings)
    assert kinds == {"lost-write": FINDINGS_PER_KIND_MAX + 1, "unknown-value": 1}
    last = [f for f in verdict.findings if f.kind == "lost-write"][-1]
    assert last.message == f"... and {extra} more lost-write findings"
    assert verdict.summary.lost_writes == FINDINGS_PER_KIND_MAX + extra


# A property: a faithful run is clean


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(min_value=0.01, max_value=1.0), max_size=12), min_size=1, max_size=4
    ),
    st.lists(st.integers(min_value=0, max_value=12), max_size=5),
    st.integers(min_value=0, max_value=3),
)
def test_acknowledged_consecutive_writes_all_read_back_check_clean(
    gaps_s: list[list[float]], commits: list[int], faults: int
) -> None:
    run = Run(partitions=len(gaps_s), workload_s=15.0)
    for i in range(faults):
        run.fault(1.0 + 3 * i, 2.0 + 3 * i)
    for partition, gaps in enumerate(gaps_s):
        at = 0.0
        for i, gap_s in enumerate(gaps):
            at += gap_s
            assert run.ack(f"p{partition}-{i}", partition, at=at) == i
    run.consume_all(at=14.0)
    for partition in range(run.partitions):
        for t, offset in enumerate(sorted(commits)):
            run.commit(partition, min(offset, run.next_offset(partition)), at=14.0 + t / 10)

    verdict = check(run.history())
    assert verdict.findings == []
    assert verdict.ok
    assert verdict.summary.acknowledged_writes == sum(map(len, gaps_s))


# Power loss of every node: reported with Kafka's default durability, failed with fsync


def power_loss_all_run() -> tuple[Run, int]:
    """a0, a1 survive; a2, a3 (acknowledged before the cut) are on no disk; after the cut b0 is
    stored at a2's offset, which the group had received and committed past."""
    run = Run(partitions=1)
    run.ack("a0", at=1.0)
    run.ack("a1", at=1.5)
    run.ack("a2", at=2.0, stored=False, acked_offset=2)
    run.ack("a3", at=2.5, stored=False, acked_offset=3)
    run.consumed.append(
        Consumed(member="m1", topic=TOPIC, partition=0, offset=2, value="a2", time_s=3.0)
    )
    run.commit(0, 4, at=3.5)
    cut = run.fault(5.0, 6.0, kind="power-loss-all")
    run.observe(0, 2, at=7.0)  # the committed offsets were under the same durability
    run.ack("b0", at=8.0)
    run.consume(0, [0, 1], at=8.5)
    return run, cut


def test_a_tail_lost_to_power_loss_all_is_reported_with_the_default_durability() -> None:
    run, cut = power_loss_all_run()
    verdict = check(run.history())
    assert verdict.ok, verdict.findings
    assert verdict.summary.lost_writes == 0
    assert verdict.summary.lost_to_power_loss == 2
    (loss,) = verdict.summary.power_loss_losses
    assert (loss.fault_id, loss.partition, loss.count) == (cut, 0, 2)
    assert (loss.first_offset, loss.last_offset) == (2, 3)
    assert Counter(f.kind for f in verdict.reported) == {
        "lost-write": 2, "consumed-then-lost": 1, "committed-backwards": 1,
    }  # fmt: skip


def test_the_same_loss_fails_with_the_fsync_durability() -> None:
    run, _ = power_loss_all_run()
    verdict = check(run.history().model_copy(update={"durability": "fsync"}))
    assert not verdict.ok
    assert verdict.summary.lost_writes == 2 and verdict.summary.durability == "fsync"
    assert verdict.reported == [] and verdict.summary.power_loss_losses == []


def test_a_hole_below_a_surviving_write_fails_even_with_the_default_durability() -> None:
    run = Run(partitions=1)
    run.ack("a0", at=1.0)
    run.ack("a1", at=1.5, stored=False, acked_offset=1)
    run.ack("a2", at=2.0, acked_offset=2)
    run.store("a2", offset=2)  # survived the cut that took a1 below it
    run.logs[0] = {0: "a0", 2: "a2"}
    run.fault(5.0, 6.0, kind="power-loss-all")
    verdict = check(run.history())
    assert [f.kind for f in verdict.findings] == ["lost-write"]
    assert verdict.summary.power_loss_losses == []


def test_a_loss_without_a_later_power_loss_all_fails() -> None:
    run = Run(partitions=1)
    run.fault(1.0, 2.0, kind="power-loss-all")
    run.fault(3.0, 4.0, kind="power-loss")  # one node: the others hold what it lost
    run.ack("a0", at=3.5, stored=False)
    verdict = check(run.history())
    assert [f.kind for f in verdict.findings] == ["lost-write"]


def test_each_problem_of_a_nodes_files_is_a_crash_consistency_finding() -> None:
    run = Run(partitions=1)
    run.ack("a0")
    checks = [
        DataCheck(node_id=1, problems=[]),
        DataCheck(node_id=2, problems=["events-0/00000000000000000000.log@0: bad CRC"]),
    ]
    verdict = check(run.history().model_copy(update={"data_checks": checks}))
    assert [(f.kind, f.message) for f in verdict.findings] == [
        ("crash-consistency", "node 2: events-0/00000000000000000000.log@0: bad CRC")
    ]


# KIP-966 left a partition offline; the harness elected a leader uncleanly after the workload


def unclean_election_run() -> Run:
    """a0, a1 survive on the replica elected uncleanly at 12 s; a2, a3 were acknowledged before,
    on replicas that restarted uncleanly (power cuts, one at a time: no power-loss-all)."""
    run = Run(partitions=1)
    run.ack("a0", at=1.0)
    run.ack("a1", at=1.5)
    run.ack("a2", at=2.0, stored=False, acked_offset=2)
    run.ack("a3", at=2.5, stored=False, acked_offset=3)
    run.consumed.append(
        Consumed(member="m1", topic=TOPIC, partition=0, offset=2, value="a2", time_s=3.0)
    )
    run.fault(5.0, 6.0, kind="power-loss")
    return run


def elected(history: History, at: float = 12.0) -> History:
    elections = [UncleanElection(topic=TOPIC, partition=0, time_s=at)]
    return history.model_copy(update={"unclean_elections": elections})


def test_a_tail_lost_to_an_unclean_election_is_reported_with_the_default_durability() -> None:
    verdict = check(elected(unclean_election_run().history()))
    assert verdict.ok, verdict.findings
    assert verdict.summary.lost_writes == 0
    assert (verdict.summary.unclean_elections, verdict.summary.lost_to_unclean_election) == (1, 2)
    assert Counter(f.kind for f in verdict.reported) == {
        "lost-write": 2, "consumed-then-lost": 1,
    }  # fmt: skip


def test_without_the_election_or_with_fsync_the_same_loss_fails() -> None:
    history = unclean_election_run().history()
    assert check(history).summary.lost_writes == 2, "lost with no unclean election: fails"
    fsync = check(elected(history).model_copy(update={"durability": "fsync"}))
    assert not fsync.ok and fsync.summary.lost_writes == 2 and fsync.reported == []


def test_a_hole_or_a_write_after_the_election_is_not_excused() -> None:
    run = Run(partitions=1)
    run.ack("a0", at=1.0)
    run.ack("a1", at=1.5, stored=False, acked_offset=1)
    run.ack("a2", at=2.0, acked_offset=2)
    run.store("a2", offset=2)  # survived while a1 below it did not: a hole
    run.logs[0] = {0: "a0", 2: "a2"}
    verdict = check(elected(run.history()))
    assert [f.kind for f in verdict.findings] == ["lost-write"]
    late = unclean_election_run()
    assert not check(elected(late.history(), at=2.2)).ok, "a3 was acknowledged after it"


def test_commits_taken_back_by_an_unclean_election_of_the_groups_offsets_partition() -> None:
    """__consumer_offsets has min.insync.replicas 1 (the cluster default, as in Kafka): an
    unclean election of the partition that holds the group's offsets can take commits back on
    every partition of the topic. Reported with the default durability from that election on;
    before it, or with fsync, it fails."""
    run = Run(partitions=1)
    written(run, 2)
    run.consume_all(at=1.5)
    run.commit(0, 2, at=2.0)
    run.observe(0, 1, at=9.0)  # taken back
    history = run.history()
    offsets = (OFFSETS_TOPIC, partition_for(history.group, OFFSETS_TOPIC_PARTITIONS))
    at = 8.0
    elections = [UncleanElection(topic=offsets[0], partition=offsets[1], time_s=at)]
    verdict = check(history.model_copy(update={"unclean_elections": elections}))
    assert verdict.ok, verdict.findings
    assert [f.kind for f in verdict.reported] == ["committed-backwards"]
    late = [UncleanElection(topic=offsets[0], partition=offsets[1], time_s=9.5)]
    assert not check(history.model_copy(update={"unclean_elections": late})).ok
    fsync = history.model_copy(update={"unclean_elections": elections, "durability": "fsync"})
    assert not check(fsync).ok
