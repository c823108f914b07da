"""The checker of a chaos run: a pure function from a `History` to a `Verdict`.

No IO, no clock, no randomness: `check(history)` reads the plain data the runner recorded and
says what went wrong, where, and in which fault windows. Each rule below is one function.

Words used below. A *place* is (topic, partition, offset). The *final state* is `history.final`:
for each partition its records (offset -> value, log start offset to high watermark, HW) and its
replicas' batches. A value is *stored* at every place the final records hold it. An *ok write* is
a `Write` with ``ok=True`` (acknowledged at ``write.offset``); any other write is indeterminate
and is never required to be stored. A write's *time* is its ``end_s``, or its ``start_s`` when it
has no outcome.

Fault attribution (`faults_at`). A finding at time t falls in the fault windows with
``start_s <= t <= end_s``; if there are none, in the window that ended last before t (the
greater id on a tie); if none ended before t either, in none. A finding without a time falls in
none.

Rules, by finding kind:

- ``harness``: the run could not give the checker what it needs, so the verdict cannot be clean:
  (a) each string in ``history.problems``; (b) a partition that an ok write or a consumed record
  names but that has no `FinalPartition` (one finding per partition; its writes and consumed
  records are not judged); (c) a value carried by more than one `Write` (values must be unique,
  every rule relies on it); (d) an ISR member of a final partition with replicas whose
  `ReplicaLog` is absent; (e) admin ops recorded but ``final_topics`` is None (the admin rules
  are then skipped); (f) a `ControllerImage` whose topics are None.
- ``lost-write``: an ok write whose value is stored nowhere. Not a finding when its offset is
  below its partition's final log start offset (retention may have removed it). Time: the
  write's time.
- ``moved-write``: an ok write whose value is stored, but not only at its acknowledged place
  (elsewhere instead, or elsewhere as well). Time: the write's time.
- ``duplicate``: a value stored at more than one place; one finding per value, located at its
  second place (in the order of ``history.final`` and then offsets), the message lists all.
  Time: the time of the write carrying it, if any.
- ``unknown-value``: a stored record whose value no `Write` carries; one finding per record.
- ``order``: within one final partition, in offset order, the records whose value a `Write`
  carries: each producer's seq must strictly increase. A record whose seq is not greater than
  that of the same producer's previous record is a finding at its offset, naming the offset it
  follows. Time: the time of its write.
- ``replica-divergence``: per final partition with replicas, only batches with ``last_offset <
  HW`` count. The reference replica is the leader's, else the first ISR member's present, else
  the first listed. Every other member of the final ISR is compared with it from the larger of
  their first base offsets, batch by batch, for as long as both have batches: the first pair
  that differs in base offset, last offset, CRC or leader epoch is a finding naming both nodes,
  at the offset where they start to differ. Replicas outside the final ISR are not compared: one
  may still hold a deposed leader's batches that it truncates when it next fetches (a cluster
  that does not get every replica back into the ISR is reported by the harness).
- ``replica-missing``: an ISR member whose batches (below HW) end before ``HW - 1``: its greatest
  last offset is below ``HW - 1``, or it has none. Only when ``HW > log start offset`` (an empty
  partition lacks nothing).
- ``committed-backwards``: per partition, the `CommittedObservation`s in time order: an offset
  below the greatest observed before it (falling back to -1 included). Time: that observation's.
- ``skipped-after-commit``: per partition with observations, C = the offset of the last
  observation in time (none when C < 0). Every stored offset o with
  ``log start <= o < min(C, HW)`` must have been received by some member (a `Consumed` with that
  partition and offset). Missing records that follow each other in the final log form one
  finding located at the first; time: the first observation whose offset passed it.
- ``consumed-then-lost``: a received record whose place does not store its value in the final
  state (absent, or another value there), unless its offset is below the final log start
  offset. One finding per distinct (place, value), at the earliest time it was received.
- ``admin-lost-topic``: an ok ``create`` of topic T, T not in ``final_topics``, and no ``delete``
  of T attempted at all. Time: the create's ``end_s``.
- ``admin-resurrected-topic``: an ok ``delete`` of T, T still in ``final_topics``. Time: the
  delete's ``end_s``.
- ``metadata-divergence``: the controller images that answered, normalised (topics by name,
  partitions by id, ISR as a set, replicas in their order), each compared with the first: a
  differing image gives one finding naming both nodes and the first topic (and partition) that
  differs, or a topic only one of them holds.

- ``crash-consistency``: each problem the check of a node's files found after the run
  (``history.data_checks``, dataplane.tools.check_data: a batch with a bad CRC below the log end,
  an index that does not match its segment, a checkpoint that does not parse).

With the transactions workload, the ``txn-*`` rules of chaos/txn_checker.py apply as well.

Power loss of every node with Kafka's default durability (``history.durability == "default"``
and ``power-loss-all`` faults). Acknowledged records that no replica had fsynced are then lost by
design (Kafka acknowledges once the ISR holds a record in memory), so these findings are
*reported* (`Verdict.reported`, `Summary.power_loss_losses`), not failed:

- the ``lost-write`` findings of a partition attributed to one cut (the first ``power-loss-all``
  window ending at or after the write's time) when they form a *tail*: no acknowledged write of
  that partition attributed to the same cut, at or above the lowest lost offset, survived. A
  hole (a lost write below one that survived the same cut) stays a failure;
- ``consumed-then-lost`` of a value lost that way, or of an indeterminate write (never
  acknowledged), received before the end of a cut;
- ``committed-backwards`` and ``skipped-after-commit`` at or after the start of a cut (the group's
  committed offsets, in ``__consumer_offsets``, are under the same durability).

KIP-966 (eligible leader replicas) keeps a partition offline rather than elect a replica that
restarted without a clean shutdown (it may have lost its unflushed tail). When no eligible
replica is left, the runner elects a leader uncleanly once the workload is over, as an operator
would, and records it (``history.unclean_elections``). With the default durability, the
``lost-write`` findings of such a partition acknowledged before its election that form a tail
(as above) are reported (`Summary.lost_to_unclean_election`), with the ``consumed-then-lost`` of
their values and the partition's ``committed-backwards`` and ``skipped-after-commit`` from the
election on. A loss without an unclean election, or a hole, still fails.

With ``durability == "fsync"`` (every replica fsyncs before the acknowledgement) nothing is
excused: a power-loss-all must lose no acknowledged record, nor an unclean election.

At most `FINDINGS_PER_KIND_MAX` findings of one kind are listed; the rest are folded into one
more finding of that kind saying how many were left out. The summary's counts stay exact.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from chaos.history import (
    ALL_FAULT_KINDS,
    BatchEntry,
    CommittedObservation,
    Consumed,
    ControllerImage,
    FaultRecovery,
    FaultWindow,
    FinalPartition,
    Finding,
    FindingKind,
    History,
    PowerLossLoss,
    Summary,
    TopicImage,
    Verdict,
    Write,
)
from chaos.txn_checker import check_transactions, txn_summary
from raftlog.coordinator_key import partition_for

OFFSETS_TOPIC = "__consumer_offsets"
# the chaos cluster's offsets.topic.num.partitions: Kafka's default, never overridden by a run
OFFSETS_TOPIC_PARTITIONS = 50

FINDINGS_PER_KIND_MAX = 200

PartitionKey = tuple[str, int]  # (topic, partition)
Place = tuple[str, int, int]  # (topic, partition, offset)


@dataclass(frozen=True)
class _FinalIndex:
    """The final state looked up both ways."""

    partitions: dict[PartitionKey, FinalPartition]
    value_at: dict[PartitionKey, dict[int, str]]  # offset -> value
    places_of: dict[str, list[Place]]  # value -> where it is stored


def check(history: History) -> Verdict:
    """Judge a run: every anomaly the rules find, attributed to fault windows, and the figures."""
    index = _index_final(history.final)
    writer_of = _writer_of(history.writes)
    unjudged = _unjudged_partitions(history, index)
    findings = [
        *_harness_problems(history),
        *_missing_final_partitions(unjudged),
        *_ambiguous_write_values(history.writes),
        *_lost_writes(history.writes, index, unjudged),
        *_moved_writes(history.writes, index, unjudged),
        *_duplicates(index, writer_of),
        *_unknown_values(history.final, writer_of),
        *_order_violations(history.final, writer_of),
        *_replica_findings(history.final),
        *_committed_backwards(history.committed),
        *_skipped_after_commit(history, index),
        *_consumed_then_lost(history.consumed, index, unjudged),
        *_admin_unjudged(history),
        *_admin_lost_topics(history),
        *_admin_resurrected_topics(history),
        *_metadata_findings(history.controllers),
        *check_transactions(history),  # the transactions workload's rules (chaos/txn_checker.py)
        *_data_check_findings(history),
    ]
    attributed = [
        finding.model_copy(update={"faults": faults_at(history, finding.time_s)})
        for finding in findings
    ]
    failing, reported, losses = split_power_losses(history, attributed)
    lost_values = {f.value for f in attributed if f.kind == "lost-write" and f.value}
    failing, unclean_reported = split_unclean_election_losses(history, failing, lost_values)
    summary = _summary(history, failing).model_copy(
        update={
            "lost_to_power_loss": sum(1 for f in reported if f.kind == "lost-write"),
            "power_loss_losses": losses,
            "unclean_elections": len(history.unclean_elections),
            "lost_to_unclean_election": sum(1 for f in unclean_reported if f.kind == "lost-write"),
        }
    )
    reported = [*reported, *unclean_reported]
    return Verdict(
        ok=not failing,
        findings=_cap_per_kind(failing, FINDINGS_PER_KIND_MAX),
        summary=summary,
        reported=_cap_per_kind(reported, FINDINGS_PER_KIND_MAX),
    )


def faults_at(history: History, time_s: float | None) -> list[int]:
    """The ids of the fault windows a moment falls in (see the module docstring)."""
    if time_s is None:
        return []
    active = sorted(fault.id for fault in history.faults if fault.start_s <= time_s <= fault.end_s)
    if active:
        return active
    ended = [fault for fault in history.faults if fault.end_s < time_s]
    if not ended:
        return []
    return [max(ended, key=lambda fault: (fault.end_s, fault.id)).id]


# Power loss of every node with the default durability (see the module docstring)

_FOLLOWS_FROM_LOSS = ("committed-backwards", "skipped-after-commit")


def split_power_losses(
    history: History, findings: Sequence[Finding]
) -> tuple[list[Finding], list[Finding], list[PowerLossLoss]]:
    """(failing findings, reported ones, what each power-loss-all took per partition)."""
    cuts = sorted(
        (f for f in history.faults if f.kind == "power-loss-all"), key=lambda f: f.start_s
    )
    if history.durability != "default" or not cuts:
        return list(findings), [], []
    writer_of = _writer_of(history.writes)
    lost_by: dict[tuple[int, str, int], list[Write]] = defaultdict(list)
    for finding in findings:
        write = writer_of.get(finding.value or "") if finding.kind == "lost-write" else None
        cut = _cut_after(cuts, _write_time(write)) if write is not None else None
        if write is not None and cut is not None:
            lost_by[(cut.id, write.topic, write.partition)].append(write)
    excused: set[str] = set()
    losses: list[PowerLossLoss] = []
    for (cut_id, topic, partition), lost in sorted(lost_by.items()):
        if _is_tail(history, cuts, cut_id, lost):
            excused.update(w.value for w in lost)
            offsets = [w.offset for w in lost if w.offset is not None]
            losses.append(
                PowerLossLoss(
                    fault_id=cut_id, topic=topic, partition=partition, count=len(lost),
                    first_offset=min(offsets, default=-1), last_offset=max(offsets, default=-1),
                )
            )  # fmt: skip
    failing: list[Finding] = []
    reported: list[Finding] = []
    for finding in findings:
        allowed = _follows_from_loss(finding, cuts, excused, writer_of)
        (reported if allowed else failing).append(finding)
    return failing, reported, losses


def _cut_after(cuts: Sequence[FaultWindow], time_s: float) -> FaultWindow | None:
    """The first power-loss-all that ends at or after `time_s` (the one that can lose a write
    acknowledged then)."""
    return next((cut for cut in cuts if cut.end_s >= time_s), None)


def _is_tail(
    history: History, cuts: Sequence[FaultWindow], cut_id: int, lost: Sequence[Write]
) -> bool:
    """Whether no acknowledged write of the partition attributed to the same cut, at or above
    the lowest lost offset, survived it."""
    first = min((w.offset for w in lost if w.offset is not None), default=None)
    if first is None:
        return False
    topic, partition = lost[0].topic, lost[0].partition
    lost_values = {w.value for w in lost}
    for write in history.writes:
        if not write.ok or (write.topic, write.partition) != (topic, partition):
            continue
        if write.offset is None or write.offset < first or write.value in lost_values:
            continue
        cut = _cut_after(cuts, _write_time(write))
        if cut is not None and cut.id == cut_id:
            return False  # a hole: it survived the cut that took a write below it
    return True


def _follows_from_loss(
    finding: Finding,
    cuts: Sequence[FaultWindow],
    excused: set[str],
    writer_of: dict[str, Write],
) -> bool:
    if finding.kind == "lost-write":
        return finding.value in excused
    if finding.kind == "consumed-then-lost" and finding.time_s is not None:
        write = writer_of.get(finding.value or "")
        indeterminate = write is not None and not write.ok
        before_cut = _cut_after(cuts, finding.time_s) is not None
        return before_cut and (finding.value in excused or indeterminate)
    if finding.kind in _FOLLOWS_FROM_LOSS and finding.time_s is not None:
        return any(cut.start_s <= finding.time_s for cut in cuts)
    return False


# Unclean elections after KIP-966 left a partition offline (see the module docstring)


def split_unclean_election_losses(
    history: History, findings: Sequence[Finding], lost_values: set[str]
) -> tuple[list[Finding], list[Finding]]:
    """(failing findings, reported ones): with the default durability, the ``lost-write``
    findings of a partition the harness elected uncleanly, acknowledged before that election,
    when they form a tail (no write of the partition acknowledged before the election, at or
    above the lowest lost offset, survived: ``lost_values`` are every lost write's value), and
    what follows from them; and the group's ``committed-backwards``/``skipped-after-commit``
    from an unclean election of its ``__consumer_offsets`` partition on. Anything else still
    fails; with ``fsync`` everything does."""
    if history.durability != "default" or not history.unclean_elections:
        return list(findings), []
    elected_at: dict[PartitionKey, float] = {}
    for election in history.unclean_elections:
        key = (election.topic, election.partition)
        elected_at[key] = min(elected_at.get(key, election.time_s), election.time_s)
    # the group's committed offsets live in one __consumer_offsets partition (min ISR 1, as
    # in Kafka): an unclean election of it can take commits back on every partition
    offsets_at = elected_at.get(
        (OFFSETS_TOPIC, partition_for(history.group, OFFSETS_TOPIC_PARTITIONS))
    )
    writer_of = _writer_of(history.writes)
    lost_by: dict[PartitionKey, list[Write]] = defaultdict(list)
    for finding in findings:
        write = writer_of.get(finding.value or "") if finding.kind == "lost-write" else None
        if write is None:
            continue
        at = elected_at.get((write.topic, write.partition))
        if at is not None and _write_time(write) <= at:
            lost_by[(write.topic, write.partition)].append(write)
    excused = {
        write.value
        for key, lost in lost_by.items()
        if _tail_before(history, key, elected_at[key], lost, lost_values)
        for write in lost
    }
    failing: list[Finding] = []
    reported: list[Finding] = []
    for finding in findings:
        key = (finding.topic or "", finding.partition if finding.partition is not None else -1)
        at = elected_at.get(key)
        allowed = finding.value in excused if finding.kind == "lost-write" else (
            at is not None and finding.time_s is not None and (
                (finding.kind == "consumed-then-lost" and finding.value in excused)
                or (finding.kind in _FOLLOWS_FROM_LOSS and finding.time_s >= at)
            )
        ) or (
            finding.kind in _FOLLOWS_FROM_LOSS and offsets_at is not None
            and finding.time_s is not None and finding.time_s >= offsets_at
        )  # fmt: skip
        (reported if allowed else failing).append(finding)
    return failing, reported


def _tail_before(
    history: History,
    key: PartitionKey,
    elected_s: float,
    lost: Sequence[Write],
    lost_values: set[str],
) -> bool:
    first = min((w.offset for w in lost if w.offset is not None), default=None)
    if first is None:
        return False
    for write in history.writes:
        if not write.ok or (write.topic, write.partition) != key or write.offset is None:
            continue
        survived = write.offset >= first and write.value not in lost_values
        if survived and _write_time(write) <= elected_s:
            return False  # a hole: it survived, a write below it did not
    return True


def _data_check_findings(history: History) -> list[Finding]:
    return [
        Finding(kind="crash-consistency", message=f"node {check.node_id}: {problem}")
        for check in history.data_checks
        for problem in check.problems
    ]


# Indexes and naming


def _index_final(final: Sequence[FinalPartition]) -> _FinalIndex:
    partitions: dict[PartitionKey, FinalPartition] = {}
    value_at: dict[PartitionKey, dict[int, str]] = {}
    places_of: dict[str, list[Place]] = defaultdict(list)
    for part in final:
        key = (part.topic, part.partition)
        partitions[key] = part
        value_at[key] = dict(part.records)
        for offset, value in sorted(part.records):
            places_of[value].append((part.topic, part.partition, offset))
    return _FinalIndex(partitions, value_at, dict(places_of))


def _writer_of(writes: Iterable[Write]) -> dict[str, Write]:
    """Value -> the first write carrying it."""
    writer_of: dict[str, Write] = {}
    for write in writes:
        writer_of.setdefault(write.value, write)
    return writer_of


def _unjudged_partitions(history: History, index: _FinalIndex) -> list[PartitionKey]:
    """Partitions an ok write or a consumed record names that have no final state."""
    named = [(w.topic, w.partition) for w in history.writes if w.ok]
    named += [(c.topic, c.partition) for c in history.consumed]
    return sorted({key for key in named if key not in index.partitions})


def _write_time(write: Write) -> float:
    return write.end_s if write.end_s is not None else write.start_s


def _name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def _place(place: Place) -> str:
    topic, partition, offset = place
    return f"{_name(topic, partition)}@{offset}"


# Rules: the harness


def _harness_problems(history: History) -> list[Finding]:
    return [Finding(kind="harness", message=problem) for problem in history.problems]


def _missing_final_partitions(unjudged: Iterable[PartitionKey]) -> list[Finding]:
    return [
        Finding(
            kind="harness",
            message=f"no final state for partition {_name(topic, partition)}: its writes and "
            "consumed records are not judged",
            topic=topic,
            partition=partition,
        )
        for topic, partition in unjudged
    ]


def _ambiguous_write_values(writes: Iterable[Write]) -> list[Finding]:
    carriers = Counter(write.value for write in writes)
    return [
        Finding(
            kind="harness",
            message=f"value {value!r} is carried by {count} writes; values must be unique",
            value=value,
        )
        for value, count in carriers.items()
        if count > 1
    ]


# Rules: writes against the final state


def _lost_writes(
    writes: Iterable[Write], index: _FinalIndex, unjudged: Sequence[PartitionKey]
) -> list[Finding]:
    findings: list[Finding] = []
    for write in writes:
        key = (write.topic, write.partition)
        if not write.ok or key in unjudged or write.value in index.places_of:
            continue
        log_start_offset = index.partitions[key].log_start_offset
        if write.offset is not None and write.offset < log_start_offset:
            continue
        findings.append(
            _write_finding("lost-write", write, f"{_name(*key)}@{write.offset} is stored nowhere")
        )
    return findings


def _moved_writes(
    writes: Iterable[Write], index: _FinalIndex, unjudged: Sequence[PartitionKey]
) -> list[Finding]:
    findings: list[Finding] = []
    for write in writes:
        key = (write.topic, write.partition)
        if not write.ok or write.offset is None or key in unjudged:
            continue
        acknowledged = (write.topic, write.partition, write.offset)
        places = index.places_of.get(write.value, [])
        if not places or places == [acknowledged]:
            continue
        stored = ", ".join(map(_place, places))
        findings.append(
            _write_finding("moved-write", write, f"{_place(acknowledged)} is stored at {stored}")
        )
    return findings


def _write_finding(kind: FindingKind, write: Write, where: str) -> Finding:
    """A finding about an acknowledged write; `where` goes on from "acknowledged at"."""
    return Finding(
        kind=kind,
        message=f"write {write.value!r} ({write.producer} seq {write.seq}) acknowledged at {where}",
        topic=write.topic,
        partition=write.partition,
        offset=write.offset,
        value=write.value,
        time_s=_write_time(write),
    )


def _duplicates(index: _FinalIndex, writer_of: dict[str, Write]) -> list[Finding]:
    findings: list[Finding] = []
    for value, places in index.places_of.items():
        if len(places) < 2:
            continue
        topic, partition, offset = places[1]
        write = writer_of.get(value)
        findings.append(
            Finding(
                kind="duplicate",
                message=f"value {value!r} is stored {len(places)} times: "
                f"{', '.join(map(_place, places))}",
                topic=topic,
                partition=partition,
                offset=offset,
                value=value,
                time_s=_write_time(write) if write is not None else None,
            )
        )
    return findings


def _unknown_values(final: Iterable[FinalPartition], writer_of: dict[str, Write]) -> list[Finding]:
    return [
        Finding(
            kind="unknown-value",
            message=f"{_name(part.topic, part.partition)}@{offset} stores {value!r}, "
            "which no producer sent",
            topic=part.topic,
            partition=part.partition,
            offset=offset,
            value=value,
        )
        for part in final
        for offset, value in sorted(part.records)
        if value not in writer_of
    ]


def _order_violations(
    final: Iterable[FinalPartition], writer_of: dict[str, Write]
) -> list[Finding]:
    findings: list[Finding] = []
    for part in final:
        previous: dict[str, tuple[int, int]] = {}  # producer -> (seq, offset) of its last record
        for offset, value in sorted(part.records):
            write = writer_of.get(value)
            if write is None:
                continue
            before = previous.get(write.producer)
            previous[write.producer] = (write.seq, offset)
            if before is None or write.seq > before[0]:
                continue
            findings.append(
                Finding(
                    kind="order",
                    message=f"{_name(part.topic, part.partition)}@{offset} holds "
                    f"{write.producer} seq {write.seq} ({value!r}) after seq {before[0]} at "
                    f"offset {before[1]}",
                    topic=part.topic,
                    partition=part.partition,
                    offset=offset,
                    value=value,
                    time_s=_write_time(write),
                )
            )
    return findings


# Rules: replicas


def _replica_findings(final: Iterable[FinalPartition]) -> list[Finding]:
    findings: list[Finding] = []
    for part in final:
        if not part.replicas:
            continue
        below_hw = {
            replica.node_id: sorted(
                (b for b in replica.batches if b.last_offset < part.high_watermark),
                key=lambda b: b.base_offset,
            )
            for replica in part.replicas
        }
        reference = _reference_replica(part)
        for node_id, batches in below_hw.items():
            # Outside the ISR a replica may still hold a deposed leader's batches that it
            # truncates when it next fetches: only ISR members must agree below the HW.
            if node_id != reference and node_id in part.isr:
                findings += _divergence(part, reference, below_hw[reference], node_id, batches)
        for node_id in part.isr:
            findings += _isr_member_missing(part, node_id, below_hw.get(node_id))
    return findings


def _reference_replica(part: FinalPartition) -> int:
    present = [replica.node_id for replica in part.replicas]
    if part.leader in present:
        return part.leader
    return next((node_id for node_id in part.isr if node_id in present), present[0])


def _divergence(
    part: FinalPartition,
    reference: int,
    reference_batches: Sequence[BatchEntry],
    node_id: int,
    batches: Sequence[BatchEntry],
) -> list[Finding]:
    if not reference_batches or not batches:
        return []
    start = max(reference_batches[0].base_offset, batches[0].base_offset)
    ours = [b for b in reference_batches if b.last_offset >= start]
    theirs = [b for b in batches if b.last_offset >= start]
    for mine, other in zip(ours, theirs, strict=False):
        if mine == other:
            continue
        offset = max(start, min(mine.base_offset, other.base_offset))
        return [
            Finding(
                kind="replica-divergence",
                message=f"{_name(part.topic, part.partition)}: node {node_id} differs from "
                f"node {reference} (the reference) at offset {offset}: node {reference} has "
                f"{_batch(mine)}, node {node_id} has {_batch(other)}",
                topic=part.topic,
                partition=part.partition,
                offset=offset,
            )
        ]
    return []


def _batch(batch: BatchEntry) -> str:
    return (
        f"batch {batch.base_offset}..{batch.last_offset} epoch {batch.leader_epoch} "
        f"crc {batch.crc:#010x}"
    )


def _isr_member_missing(
    part: FinalPartition, node_id: int, batches: Sequence[BatchEntry] | None
) -> list[Finding]:
    name = _name(part.topic, part.partition)
    if batches is None:
        message = f"{name}: no replica log was read from ISR member {node_id}"
        return [
            Finding(kind="harness", message=message, topic=part.topic, partition=part.partition)
        ]
    if part.high_watermark <= part.log_start_offset:
        return []
    last_offset = max((b.last_offset for b in batches), default=None)
    if last_offset is not None and last_offset >= part.high_watermark - 1:
        return []
    held = "no batches" if last_offset is None else f"batches up to offset {last_offset}"
    return [
        Finding(
            kind="replica-missing",
            message=f"{name}: ISR member {node_id} holds {held} below the high watermark "
            f"{part.high_watermark}",
            topic=part.topic,
            partition=part.partition,
            offset=part.log_start_offset if last_offset is None else last_offset + 1,
        )
    ]


# Rules: the consumer group


def _observations_by_partition(
    committed: Iterable[CommittedObservation],
) -> dict[PartitionKey, list[CommittedObservation]]:
    """Per partition, its observations in time order (ties keep the recorded order)."""
    grouped: dict[PartitionKey, list[CommittedObservation]] = defaultdict(list)
    for observation in sorted(committed, key=lambda o: o.time_s):
        grouped[(observation.topic, observation.partition)].append(observation)
    return dict(grouped)


def _committed_backwards(committed: Iterable[CommittedObservation]) -> list[Finding]:
    findings: list[Finding] = []
    for (topic, partition), observations in _observations_by_partition(committed).items():
        greatest = observations[0].offset
        for observation in observations[1:]:
            if observation.offset < greatest:
                findings.append(
                    Finding(
                        kind="committed-backwards",
                        message=f"{_name(topic, partition)}: committed offset "
                        f"{observation.offset} after {greatest} had been observed",
                        topic=topic,
                        partition=partition,
                        offset=observation.offset,
                        time_s=observation.time_s,
                    )
                )
            greatest = max(greatest, observation.offset)
    return findings


def _skipped_after_commit(history: History, index: _FinalIndex) -> list[Finding]:
    received: dict[PartitionKey, set[int]] = defaultdict(set)
    for record in history.consumed:
        received[(record.topic, record.partition)].add(record.offset)
    findings: list[Finding] = []
    for key, observations in _observations_by_partition(history.committed).items():
        part = index.partitions.get(key)
        committed = observations[-1].offset
        if part is None or committed < 0:
            continue
        limit = min(committed, part.high_watermark)
        stored = sorted(o for o, _ in part.records if part.log_start_offset <= o < limit)
        for run in _runs_missing(stored, received[key]):
            passed = next(o for o in observations if o.offset > run[0])
            findings.append(
                Finding(
                    kind="skipped-after-commit",
                    message=f"{_name(*key)}: offsets {run[0]}..{run[-1]} ({len(run)} records) "
                    f"were received by no member, yet the group committed {passed.offset} at "
                    f"{passed.time_s:.3f} s (finally {committed})",
                    topic=key[0],
                    partition=key[1],
                    offset=run[0],
                    time_s=passed.time_s,
                )
            )
    return findings


def _runs_missing(stored: Sequence[int], received: set[int]) -> list[list[int]]:
    """The stored offsets nobody received, in runs of neighbours in the log."""
    runs: list[list[int]] = []
    run: list[int] = []
    for offset in stored:
        if offset in received:
            if run:
                runs.append(run)
            run = []
        else:
            run.append(offset)
    if run:
        runs.append(run)
    return runs


def _consumed_then_lost(
    consumed: Iterable[Consumed], index: _FinalIndex, unjudged: Sequence[PartitionKey]
) -> list[Finding]:
    findings: list[Finding] = []
    judged: set[tuple[str, int, int, str]] = set()
    for record in sorted(consumed, key=lambda c: c.time_s):
        key = (record.topic, record.partition)
        identity = (record.topic, record.partition, record.offset, record.value)
        if key in unjudged or identity in judged:
            continue
        judged.add(identity)
        if record.offset < index.partitions[key].log_start_offset:
            continue
        stored = index.value_at[key].get(record.offset)
        if stored == record.value:
            continue
        there = "nothing" if stored is None else repr(stored)
        findings.append(
            Finding(
                kind="consumed-then-lost",
                message=f"{record.member} received {record.value!r} at "
                f"{_name(*key)}@{record.offset}; the final log holds {there} there",
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                value=record.value,
                time_s=record.time_s,
            )
        )
    return findings


# Rules: admin operations


def _admin_unjudged(history: History) -> list[Finding]:
    if not history.admin or history.final_topics is not None:
        return []
    return [Finding(kind="harness", message="the final topic list could not be read")]


def _admin_lost_topics(history: History) -> list[Finding]:
    if history.final_topics is None:
        return []
    final_topics = set(history.final_topics)
    deleted = {op.topic for op in history.admin if op.op == "delete"}
    return [
        Finding(
            kind="admin-lost-topic",
            message=f"topic {op.topic!r} was created at {op.end_s:.3f} s, never deleted, "
            "and is gone",
            topic=op.topic,
            time_s=op.end_s,
        )
        for op in history.admin
        if op.ok and op.op == "create" and op.topic not in final_topics | deleted
    ]


def _admin_resurrected_topics(history: History) -> list[Finding]:
    if history.final_topics is None:
        return []
    final_topics = set(history.final_topics)
    return [
        Finding(
            kind="admin-resurrected-topic",
            message=f"topic {op.topic!r} was deleted at {op.end_s:.3f} s and still exists",
            topic=op.topic,
            time_s=op.end_s,
        )
        for op in history.admin
        if op.ok and op.op == "delete" and op.topic in final_topics
    ]


# Rules: controllers


class _PartitionState(NamedTuple):
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]  # sorted: the ISR is a set


class _TopicState(NamedTuple):
    topic_id: str
    partitions: dict[int, _PartitionState]


def _normalise(topics: Iterable[TopicImage]) -> dict[str, _TopicState]:
    return {
        topic.name: _TopicState(
            topic.topic_id,
            {
                p.partition: _PartitionState(
                    p.leader,
                    p.leader_epoch,
                    p.partition_epoch,
                    tuple(p.replicas),
                    tuple(sorted(p.isr)),
                )
                for p in topic.partitions
            },
        )
        for topic in topics
    }


def _metadata_findings(controllers: Sequence[ControllerImage]) -> list[Finding]:
    findings = [
        Finding(kind="harness", message=f"controller {image.node_id} did not answer after recovery")
        for image in controllers
        if image.topics is None
    ]
    answered = [
        (image.node_id, _normalise(image.topics))
        for image in controllers
        if image.topics is not None
    ]
    if not answered:
        return findings
    first_node, first = answered[0]
    for node_id, image in answered[1:]:
        difference = _first_metadata_difference(first, image)
        if difference is None:
            continue
        topic, partition, what = difference
        where = topic if partition is None else _name(topic, partition)
        findings.append(
            Finding(
                kind="metadata-divergence",
                message=f"controller {node_id}'s image differs from controller {first_node}'s "
                f"at {where}: {what}",
                topic=topic,
                partition=partition,
            )
        )
    return findings


def _first_metadata_difference(
    first: dict[str, _TopicState], other: dict[str, _TopicState]
) -> tuple[str, int | None, str] | None:
    """(topic, partition or None, what differs) of the first difference, in name/id order."""
    for name in sorted(first.keys() | other.keys()):
        if name not in other or name not in first:
            return name, None, "only the first holds it" if name in first else "only it holds it"
        mine, theirs = first[name], other[name]
        if mine.topic_id != theirs.topic_id:
            return name, None, f"topic id {mine.topic_id} vs {theirs.topic_id}"
        for partition in sorted(mine.partitions.keys() | theirs.partitions.keys()):
            ours, its = mine.partitions.get(partition), theirs.partitions.get(partition)
            if ours != its:
                return name, partition, f"{ours} vs {its}"
    return None


# Figures


def _cap_per_kind(findings: Sequence[Finding], limit: int) -> list[Finding]:
    """The first `limit` findings of each kind, then one finding counting the rest."""
    counts: Counter[FindingKind] = Counter()
    kept: list[Finding] = []
    overflow_at: dict[FindingKind, int] = {}
    for finding in findings:
        counts[finding.kind] += 1
        if counts[finding.kind] <= limit:
            kept.append(finding)
        elif finding.kind not in overflow_at:
            overflow_at[finding.kind] = len(kept)
            kept.append(finding)  # a placeholder, replaced below once the count is known
    for kind, position in overflow_at.items():
        more = counts[kind] - limit
        kept[position] = Finding(kind=kind, message=f"... and {more} more {kind} findings")
    return kept


def _summary(history: History, findings: Sequence[Finding]) -> Summary:
    kinds = Counter(finding.kind for finding in findings)
    acknowledged = sum(1 for write in history.writes if write.ok)
    faults_by_kind = Counter(fault.kind for fault in history.faults)
    return Summary(
        attempted_writes=len(history.writes),
        acknowledged_writes=acknowledged,
        indeterminate_writes=len(history.writes) - acknowledged,
        lost_writes=kinds["lost-write"],
        duplicated_values=kinds["duplicate"],
        availability=_availability(history),
        faults_by_kind={
            kind: faults_by_kind[kind] for kind in ALL_FAULT_KINDS if faults_by_kind[kind]
        },
        recoveries=_recoveries(history),
        consumed_records=len(history.consumed),
        commits_ok=sum(1 for commit in history.commits if commit.ok),
        admin_ops_ok=sum(1 for op in history.admin if op.ok),
        transactions=txn_summary(history),
        durability=history.durability,
    )


def _availability(history: History) -> float:
    """The fraction of the workload's whole seconds in which some write was acknowledged."""
    seconds = max(1, math.floor(history.workload_s))
    available = {
        math.floor(write.end_s)
        for write in history.writes
        if write.ok and write.end_s is not None and 0 <= write.end_s < seconds
    }
    return len(available) / seconds


def _recoveries(history: History) -> list[FaultRecovery]:
    resumption = [_resumption(history, partition) for partition in range(history.partitions)]
    recoveries: list[FaultRecovery] = []
    for fault in sorted(history.faults, key=lambda f: f.id):
        origin = fault.start_s if fault.effect_s is None else fault.effect_s
        ends = [_first_end_from(starts, ends, origin) for starts, ends in resumption]
        recovery_s = (
            max(end - origin for end in ends if end is not None)
            if ends and None not in ends
            else None
        )
        recoveries.append(FaultRecovery(fault_id=fault.id, kind=fault.kind, recovery_s=recovery_s))
    return recoveries


def _resumption(history: History, partition: int) -> tuple[list[float], list[float]]:
    """One partition's ok writes: their start times ascending and, from each on, the earliest
    end among it and the writes that started later."""
    writes = sorted(
        (w.start_s, w.end_s)
        for w in history.writes
        if w.ok and w.end_s is not None and (w.topic, w.partition) == (history.topic, partition)
    )
    earliest_ends: list[float] = []
    for _, end_s in reversed(writes):
        earliest_ends.append(min(end_s, earliest_ends[-1]) if earliest_ends else end_s)
    return [start_s for start_s, _ in writes], earliest_ends[::-1]


def _first_end_from(starts: list[float], earliest_ends: list[float], time_s: float) -> float | None:
    """The earliest end of a write that started at or after `time_s`."""
    first = bisect.bisect_left(starts, time_s)
    return earliest_ends[first] if first < len(starts) else None
