"""The checker's rules for the transactions workload: a pure function of the `History`.

Words (see chaos/txn_history.py). The *input* is the workload topic's final records
(`history.final`); the *output* is `history.txn_final.outputs`; a record is *visible* when the
output read read_committed holds it. Each output value names its input value and the
transaction that wrote it (`split_output`). A transaction's *fate*: its recorded outcome, and
for an ``unknown`` one, ``committed`` if any of its records is visible, else ``aborted``.

Rules, by finding kind (only for a history of the transactions workload):

- ``harness``: no `txn_final` (the output could not be read); the transformers did not consume
  the whole input before the final read (``drained`` false: ``txn-missing`` is then not
  judged); no group offsets read (``txn-offsets`` not judged); an output partition whose
  batches were not read (its markers not judged).
- ``txn-unknown-output``: a visible record whose value is not of the output's shape or names a
  transaction no transformer recorded (a transaction that never reached its commit cannot have
  committed). One finding per record.
- ``txn-missing``: with ``drained``, a stored input record (at or above its log start offset)
  that no visible output record carries. Time: the input write's.
- ``txn-duplicate``: an input value carried by more than one visible output record; one
  finding per input value, naming every place. Time: the second transaction's end.
- ``txn-aborted-visible``: an ``aborted`` transaction with a visible record; one finding per
  transaction, at its first visible record. Time: its end.
- ``txn-committed-invisible``: a ``committed`` transaction with a record not visible; one
  finding per transaction, at its first missing record.
- ``txn-partial``: an ``unknown`` transaction some but not all of whose records are visible.
- ``txn-marker``: for each transaction and each output partition where the offsets of all its
  records are known: in that partition's batches, the batch holding its last record must be
  transactional, and the next batch of the same producer id must be a marker of the
  transaction's fate (commit or abort). A missing or wrong marker is one finding per
  (transaction, partition). Offsets below the first batch read (retention) are not judged.
- ``txn-offsets``: per input partition, the group's committed offset must equal one past the
  greatest input offset a transaction of fate ``committed`` consumed there (absent: nothing
  committed, and the group must hold no offset for it either).
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from chaos.history import Finding, FindingKind, History
from chaos.txn_history import (
    ControlType,
    OutputPartition,
    Transaction,
    TxnBatch,
    TxnFinal,
    TxnSummary,
    split_output,
)

Place = tuple[int, int]  # (output partition, offset)


def check_transactions(history: History) -> list[Finding]:
    """Every finding of the transactions rules (none for a plain run)."""
    if history.workload != "transactions":
        return []
    final = history.txn_final
    if final is None:
        return [Finding(kind="harness", message="the transactions workload's output was not read")]
    by_name = {txn.name: txn for txn in history.transactions}
    visible = _visible(final.outputs)
    fates = _fates(history.transactions, visible)
    return [
        *_harness(final),
        *_unknown_outputs(final.output_topic, visible, by_name),
        *_missing(history, final, visible),
        *_duplicates(final.output_topic, visible, by_name),
        *_visibility(final.output_topic, history.transactions, visible),
        *_markers(final, history.transactions, fates),
        *_offsets(final, history.transactions, fates),
    ]


def txn_summary(history: History) -> TxnSummary | None:
    """The workload's figures (None for a plain run)."""
    if history.workload != "transactions":
        return None
    outcomes = Counter(txn.outcome for txn in history.transactions)
    final = history.txn_final
    return TxnSummary(
        committed=outcomes["committed"],
        aborted=outcomes["aborted"],
        aborted_on_purpose=sum(
            1 for t in history.transactions if t.intent == "abort" and t.outcome == "aborted"
        ),
        unknown=outcomes["unknown"],
        output_records=0 if final is None else sum(len(p.committed) for p in final.outputs),
        transformer_restarts=0
        if final is None
        else sum(final.incarnations.values()) - len(final.incarnations),
        committed_by_client=dict(
            sorted(
                Counter(t.client for t in history.transactions if t.outcome == "committed").items()
            )
        ),
    )


# Indexes


def _visible(outputs: Iterable[OutputPartition]) -> dict[str, Place]:
    """Visible output value -> its place (values are unique: each names its transaction; a
    value read twice would be a duplicate of its input as well, and keeps its first place)."""
    places: dict[str, Place] = {}
    for part in outputs:
        for offset, value in part.committed:
            places.setdefault(value, (part.partition, offset))
    return places


def _fates(transactions: Iterable[Transaction], visible: dict[str, Place]) -> dict[str, str]:
    fates: dict[str, str] = {}
    for txn in transactions:
        fate: str = txn.outcome
        if fate == "unknown":
            seen = any(o.value in visible for o in txn.outputs)
            fate = "committed" if seen else "aborted"
        fates[txn.name] = fate
    return fates


def _name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def _write_time(start_s: float, end_s: float | None) -> float:
    return end_s if end_s is not None else start_s


def _time(txn: Transaction) -> float:
    return txn.end_s if txn.end_s is not None else txn.start_s


# Rules


def _harness(final: TxnFinal) -> list[Finding]:
    findings = []
    if not final.drained:
        findings.append(
            Finding(
                kind="harness",
                message="the transformers did not consume the whole input before the final "
                "read: missing transformations are not judged",
            )
        )
    if final.group_offsets is None:
        findings.append(
            Finding(kind="harness", message=f"the offsets of group {final.group} were not read")
        )
    findings += [
        Finding(
            kind="harness",
            message=f"no batches were read for {_name(final.output_topic, part.partition)}: "
            "its markers are not judged",
            topic=final.output_topic,
            partition=part.partition,
        )
        for part in final.outputs
        if part.batches is None
    ]
    return findings


def _unknown_outputs(
    topic: str, visible: dict[str, Place], by_name: dict[str, Transaction]
) -> list[Finding]:
    findings = []
    for value, (partition, offset) in visible.items():
        parsed = split_output(value)
        if parsed is not None and parsed[1] in by_name:
            continue
        findings.append(
            Finding(
                kind="txn-unknown-output",
                message=f"{_name(topic, partition)}@{offset} holds {value!r}, which no recorded "
                "transaction sent",
                topic=topic,
                partition=partition,
                offset=offset,
                value=value,
            )
        )
    return findings


def _carriers(visible: dict[str, Place]) -> dict[str, list[tuple[str, Place]]]:
    """Input value -> (transaction, place) of each visible output record carrying it."""
    carriers: dict[str, list[tuple[str, Place]]] = defaultdict(list)
    for value, place in sorted(visible.items(), key=lambda item: item[1]):
        parsed = split_output(value)
        if parsed is not None:
            carriers[parsed[0]].append((parsed[1], place))
    return carriers


def _missing(history: History, final: TxnFinal, visible: dict[str, Place]) -> list[Finding]:
    if not final.drained:
        return []
    carried = _carriers(visible)
    written = {w.value: w for w in history.writes}
    findings = []
    for part in history.final:
        if part.topic != final.input_topic:
            continue
        for offset, value in sorted(part.records):
            if offset < part.log_start_offset or value in carried:
                continue
            write = written.get(value)
            findings.append(
                Finding(
                    kind="txn-missing",
                    message=f"input {_name(part.topic, part.partition)}@{offset} ({value!r}) "
                    "was transformed by no committed transaction",
                    topic=part.topic,
                    partition=part.partition,
                    offset=offset,
                    value=value,
                    time_s=None if write is None else _write_time(write.start_s, write.end_s),
                )
            )
    return findings


def _duplicates(
    topic: str, visible: dict[str, Place], by_name: dict[str, Transaction]
) -> list[Finding]:
    findings = []
    for input_value, carriers in _carriers(visible).items():
        if len(carriers) < 2:
            continue
        second, (partition, offset) = carriers[1]
        txn = by_name.get(second)
        places = ", ".join(f"{_name(topic, p)}@{o} by {name}" for name, (p, o) in carriers)
        findings.append(
            Finding(
                kind="txn-duplicate",
                message=f"input {input_value!r} is visible {len(carriers)} times: {places}",
                topic=topic,
                partition=partition,
                offset=offset,
                value=input_value,
                time_s=None if txn is None else _time(txn),
            )
        )
    return findings


def _visibility(
    topic: str, transactions: Iterable[Transaction], visible: dict[str, Place]
) -> list[Finding]:
    findings = []
    for txn in transactions:
        seen = [o for o in txn.outputs if o.value in visible]
        unseen = [o for o in txn.outputs if o.value not in visible]
        kind: FindingKind
        if txn.outcome == "aborted" and seen:
            kind, first, what = "txn-aborted-visible", seen[0], f"{len(seen)} of its records are"
        elif txn.outcome == "committed" and unseen:
            kind, first, what = "txn-committed-invisible", unseen[0], f"{len(unseen)} records not"
        elif txn.outcome == "unknown" and seen and unseen:
            kind, first, what = "txn-partial", unseen[0], f"{len(seen)} records, not the others,"
        else:
            continue
        partition, offset = visible.get(first.value, (first.partition, first.offset))
        findings.append(
            Finding(
                kind=kind,
                message=f"transaction {txn.name} ({txn.outcome}, {len(txn.outputs)} records): "
                f"{what} visible to read_committed",
                topic=topic,
                partition=partition,
                offset=offset,
                value=first.value,
                time_s=_time(txn),
            )
        )
    return findings


def _markers(
    final: TxnFinal, transactions: Iterable[Transaction], fates: dict[str, str]
) -> list[Finding]:
    batches = {p.partition: p.batches for p in final.outputs if p.batches is not None}
    findings = []
    for txn in transactions:
        fate: ControlType = "commit" if fates[txn.name] == "committed" else "abort"
        last_offsets: dict[int, int | None] = {}
        for output in txn.outputs:
            known = last_offsets.get(output.partition, -1)
            last_offsets[output.partition] = (
                None if known is None or output.offset is None else max(known, output.offset)
            )
        for partition, offset in sorted(last_offsets.items()):
            if offset is None:  # a record whose offset is unknown may lie further on
                continue
            stored = batches.get(partition)
            if stored is None or not stored or offset < stored[0].base_offset:
                continue
            problem = _marker_problem(stored, offset, fate)
            if problem is None:
                continue
            findings.append(
                Finding(
                    kind="txn-marker",
                    message=f"transaction {txn.name} ({fates[txn.name]}) on "
                    f"{_name(final.output_topic, partition)}@{offset}: {problem}",
                    topic=final.output_topic,
                    partition=partition,
                    offset=offset,
                    time_s=_time(txn),
                )
            )
    return findings


def _marker_problem(batches: Sequence[TxnBatch], offset: int, fate: ControlType) -> str | None:
    """What is wrong with the marker that should end the transaction whose last record in the
    partition is at `offset`: the producer's next batch must be that marker."""
    index = bisect.bisect_left([b.last_offset for b in batches], offset)
    if index == len(batches) or batches[index].base_offset > offset:
        return "no batch holds the offset"
    batch = batches[index]
    if not batch.transactional or batch.control is not None:
        return f"the batch {batch.base_offset}..{batch.last_offset} is not transactional data"
    marker = next((b for b in batches[index + 1 :] if b.producer_id == batch.producer_id), None)
    if marker is None:
        return f"no marker of producer {batch.producer_id} follows (expected {fate})"
    if marker.control is None:
        return (
            f"producer {batch.producer_id}'s next batch, at {marker.base_offset}, is data, "
            f"not a marker (expected {fate})"
        )
    if marker.control != fate:
        return f"the marker at {marker.base_offset} is {marker.control}, expected {fate}"
    return None


def _offsets(
    final: TxnFinal, transactions: Iterable[Transaction], fates: dict[str, str]
) -> list[Finding]:
    if final.group_offsets is None:
        return []
    expected: dict[int, int] = {}
    for txn in transactions:
        if fates[txn.name] != "committed":
            continue
        for span in txn.inputs:
            expected[span.partition] = max(expected.get(span.partition, 0), span.last_offset + 1)
    findings = []
    for partition in sorted(expected.keys() | final.group_offsets.keys()):
        want, have = expected.get(partition), final.group_offsets.get(partition)
        if want == have:
            continue
        findings.append(
            Finding(
                kind="txn-offsets",
                message=f"group {final.group} committed {have} on "
                f"{_name(final.input_topic, partition)}; its committed transactions consumed "
                f"up to {None if want is None else want - 1}",
                topic=final.input_topic,
                partition=partition,
                offset=have,
            )
        )
    return findings
