"""The transactions rules of the chaos checker (chaos/txn_checker.py) on hand-made histories: a
clean consume-transform-produce story with commits, aborts on purpose and a transformer that
died mid-transaction, then each anomaly alone; and the transformers' history lines.

`Story` builds what a run of the transactions workload records: input records (acknowledged
writes of the plain producers), transactions (each placed in the output's final logs as one
transactional batch per partition followed by its marker, visible to read_committed when it
committed), and the group's final offsets (what the committed transactions consumed)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from chaos.checker import check
from chaos.history import FinalPartition, Finding, FindingKind, History, Write
from chaos.transactions import read_transactions, state_partition
from chaos.txn_checker import check_transactions
from chaos.txn_history import (
    ControlType,
    OutputPartition,
    Transaction,
    TxnBatch,
    TxnFinal,
    TxnInput,
    TxnOutcome,
    TxnOutput,
    output_value,
    split_output,
    transaction_name,
)
from raftlog.coordinator_key import partition_for

INPUT, OUTPUT, GROUP = "events", "events-out", "transformers"


@dataclass
class _Log:
    """One output partition being written: its records, batches, what read_committed sees."""

    records: list[tuple[int, str]] = field(default_factory=list)
    committed: list[tuple[int, str]] = field(default_factory=list)
    batches: list[TxnBatch] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.batches[-1].last_offset + 1 if self.batches else 0


@dataclass
class Story:
    inputs: int = 6  # input records p1-0 .. p1-5 in input partition 0
    transactions: list[Transaction] = field(default_factory=list)
    logs: dict[int, _Log] = field(default_factory=dict)
    group_offsets: dict[int, int] | None = None  # None: from the committed transactions
    drained: bool = True

    def txn(
        self,
        first: int,
        last: int,
        outcome: TxnOutcome = "committed",
        *,
        transformer: str = "t1",
        incarnation: int = 0,
        visible: bool | None = None,  # default: committed
        marker: ControlType | bool | None = True,  # True: the one its visibility implies
        intent: str = "commit",
        shown: int | None = None,  # only the first `shown` records visible (a broken commit)
    ) -> Transaction:
        serial = sum(t.transformer == transformer for t in self.transactions)
        name = transaction_name(transformer, incarnation, serial)
        visible = outcome == "committed" if visible is None else visible
        log = self.logs.setdefault(0, _Log())
        producer_id = 1000 + int(transformer[1:])
        base = log.end
        outputs = []
        for n, value in enumerate(f"p1-{i}" for i in range(first, last + 1)):
            out = output_value(value, name)
            offset = base + n
            log.records.append((offset, out))
            if visible and (shown is None or n < shown):
                log.committed.append((offset, out))
            outputs.append(TxnOutput(partition=0, value=out, offset=offset))
        log.batches.append(TxnBatch(base_offset=base, last_offset=base + last - first,
                                    producer_id=producer_id, producer_epoch=incarnation,
                                    transactional=True))  # fmt: skip
        if marker is not None and marker is not False:
            control: ControlType = ("commit" if visible else "abort") if marker is True else marker
            at = log.end
            log.batches.append(TxnBatch(base_offset=at, last_offset=at, producer_id=producer_id,
                                        producer_epoch=incarnation, transactional=True,
                                        control=control))  # fmt: skip
        txn = Transaction(
            transformer=transformer, incarnation=incarnation, serial=serial,
            inputs=[TxnInput(partition=0, first_offset=first, last_offset=last)],
            outputs=outputs, intent="abort" if intent == "abort" else "commit", outcome=outcome,
            start_s=float(len(self.transactions)), end_s=None if outcome == "unknown" else 0.5,
        )  # fmt: skip
        self.transactions.append(txn)
        return txn

    def history(self) -> History:
        values = [f"p1-{i}" for i in range(self.inputs)]
        writes = [
            Write(producer="p1", seq=i, topic=INPUT, partition=0, value=v, start_s=i * 0.1,
                  end_s=i * 0.1 + 0.05, ok=True, offset=i)
            for i, v in enumerate(values)
        ]  # fmt: skip
        final = [
            FinalPartition(topic=INPUT, partition=0, leader=1, isr=[1, 2, 3], log_start_offset=0,
                           high_watermark=len(values), records=list(enumerate(values)))
        ]  # fmt: skip
        offsets = self.group_offsets
        if offsets is None:
            visible = {v for log in self.logs.values() for _, v in log.committed}
            ends = [
                s.last_offset + 1
                for t in self.transactions
                if any(o.value in visible for o in t.outputs)
                for s in t.inputs
            ]
            offsets = {0: max(ends)} if ends else {}
        outputs = [
            OutputPartition(partition=p, log_start_offset=0, last_stable_offset=log.end,
                            high_watermark=log.end, committed=log.committed,
                            uncommitted=log.records, batches=log.batches, batches_node=1)
            for p, log in sorted(self.logs.items())
        ]  # fmt: skip
        return History(
            seed=1, nodes=[1, 2, 3], faults_requested=["transformer-kill"], duration_s=60,
            topic=INPUT, partitions=1, group="chaos-group", started_at="", workload_s=10,
            end_s=20, writes=writes, final=final, workload="transactions",
            transactions=self.transactions,
            txn_final=TxnFinal(input_topic=INPUT, output_topic=OUTPUT, group=GROUP,
                               outputs=outputs, group_offsets=offsets, drained=self.drained,
                               incarnations={"t1": 2, "t2": 1}),
        )  # fmt: skip


def kinds(findings: list[Finding]) -> list[FindingKind]:
    return sorted(f.kind for f in findings)


def clean_story() -> Story:
    """t1 commits 0..1, aborts 2..3 on purpose and commits them again; t1 dies mid-commit of
    4..5 (unknown, it did not commit: aborted by the next incarnation) and its next incarnation
    commits them."""
    story = Story()
    story.txn(0, 1)
    story.txn(2, 3, "aborted", intent="abort")
    story.txn(2, 3)
    story.txn(4, 5, "unknown")
    story.txn(4, 5, incarnation=1)
    return story


def test_a_clean_story_has_no_findings_and_counts_its_transactions() -> None:
    history = clean_story().history()
    assert check_transactions(history) == []
    verdict = check(history)
    assert verdict.ok, verdict.findings
    summary = verdict.summary.transactions
    assert summary is not None
    assert (summary.committed, summary.aborted, summary.aborted_on_purpose, summary.unknown) == (
        3, 1, 1, 1,
    )  # fmt: skip
    assert summary.output_records == 6 and summary.transformer_restarts == 1


def test_an_unknown_transaction_that_committed_is_judged_committed() -> None:
    story = Story(inputs=2)
    story.txn(0, 1, "unknown", visible=True)
    assert check_transactions(story.history()) == []


def test_a_plain_run_is_not_judged_by_the_transaction_rules() -> None:
    history = clean_story().history().model_copy(update={"workload": "plain"})
    assert check_transactions(history) == []
    assert check(history).summary.transactions is None


def test_an_input_record_nobody_transformed_is_missing() -> None:
    story = Story()
    story.txn(0, 3)
    findings = check_transactions(story.history())
    assert kinds(findings) == ["txn-missing", "txn-missing"]
    assert [f.offset for f in findings] == [4, 5] and findings[0].value == "p1-4"


def test_missing_records_are_not_judged_when_the_input_was_not_drained() -> None:
    story = Story(drained=False)
    story.txn(0, 3)
    assert kinds(check_transactions(story.history())) == ["harness"]


def test_an_input_transformed_twice_is_a_duplicate() -> None:
    story = Story()
    story.txn(0, 3)
    story.txn(2, 5, transformer="t2")  # a second member re-read 2..3: both committed
    findings = check_transactions(story.history())
    assert kinds(findings) == ["txn-duplicate", "txn-duplicate"]
    assert findings[0].value == "p1-2" and "visible 2 times" in findings[0].message


def test_a_visible_record_of_an_aborted_transaction_is_found() -> None:
    story = Story()
    story.txn(0, 1, "aborted", visible=True, marker="abort")
    story.txn(0, 5)
    found = [f for f in check_transactions(story.history()) if f.kind == "txn-aborted-visible"]
    assert len(found) == 1 and "t1.0.0" in found[0].message


def test_a_committed_transaction_whose_records_are_not_visible_is_found() -> None:
    story = Story()
    story.txn(0, 5, visible=False, marker="commit")
    assert set(kinds(check_transactions(story.history()))) == {
        "txn-committed-invisible", "txn-missing", "txn-offsets",
    }  # fmt: skip


def test_an_unknown_transaction_partly_visible_is_partial() -> None:
    story = Story()
    story.txn(0, 5, "unknown", visible=True, shown=3)
    assert set(kinds(check_transactions(story.history()))) == {"txn-partial", "txn-missing"}


def test_a_marker_missing_or_of_the_wrong_type_is_found() -> None:
    story = Story()
    story.txn(0, 1, marker=None)
    story.txn(2, 3, "aborted", marker="commit")
    story.txn(2, 5)
    findings = [f for f in check_transactions(story.history()) if f.kind == "txn-marker"]
    assert len(findings) == 2
    assert "next batch, at 2, is data, not a marker (expected commit)" in findings[0].message
    assert "is commit, expected abort" in findings[1].message


def test_a_marker_after_another_producers_batch_still_counts() -> None:
    story = Story()
    story.txn(0, 2, marker=None)
    story.txn(3, 5, transformer="t2")
    log = story.logs[0]
    at = log.end
    marker = TxnBatch(base_offset=at, last_offset=at, producer_id=1001, producer_epoch=0,
                      transactional=True, control="commit")  # fmt: skip
    log.batches.append(marker)
    assert check_transactions(story.history()) == []


def test_group_offsets_that_differ_from_the_committed_transactions_are_found() -> None:
    story = Story(group_offsets={0: 4})
    story.txn(0, 5)
    findings = check_transactions(story.history())
    assert kinds(findings) == ["txn-offsets"]
    assert findings[0].offset == 4 and "consumed up to 5" in findings[0].message


def test_a_visible_record_no_transaction_sent_is_unknown_output() -> None:
    story = Story()
    story.txn(0, 5)
    story.logs[0].committed.append((99, output_value("p1-0", "t9.0.0")))
    story.logs[0].committed.append((100, "garbage"))
    found = kinds(check_transactions(story.history()))
    assert found.count("txn-unknown-output") == 2 and "txn-duplicate" in found


def test_no_final_state_and_unread_batches_are_harness_findings() -> None:
    history = clean_story().history()
    assert kinds(check_transactions(history.model_copy(update={"txn_final": None}))) == ["harness"]
    final = history.txn_final
    assert final is not None
    unread = final.model_copy(
        update={
            "outputs": [o.model_copy(update={"batches": None}) for o in final.outputs],
            "group_offsets": None,
        }
    )
    found = check_transactions(history.model_copy(update={"txn_final": unread}))
    assert kinds(found) == ["harness", "harness"]


def test_a_history_with_transactions_round_trips_through_json() -> None:
    history = clean_story().history()
    assert History.model_validate_json(history.model_dump_json()) == history


def test_read_transactions_pairs_lines_and_leaves_a_dead_transaction_unknown() -> None:
    def line(**fields: object) -> str:
        return json.dumps(fields)

    common = {"transformer": "t1", "incarnation": 0}
    prepared = {
        "event": "prepared", **common, "start_s": 1.0, "intent": "commit",
        "inputs": [{"partition": 0, "first_offset": 0, "last_offset": 1}],
        "outputs": [{"partition": 0, "value": "a|t1.0.0"}, {"partition": 0, "value": "b|t1.0.0"}],
    }  # fmt: skip
    lines = [
        line(**prepared, serial=0),
        line(event="ended", **common, serial=0, outcome="committed", end_s=1.5, offsets=[7, 8]),
        line(**prepared, serial=1),
        '{"event": "ended", "transf',  # torn by a SIGKILL
    ]
    first, second = read_transactions(lines)
    assert first.outcome == "committed" and [o.offset for o in first.outputs] == [7, 8]
    assert first.name == "t1.0.0" and first.end_s == 1.5
    assert second.outcome == "unknown" and second.end_s is None
    assert [o.offset for o in second.outputs] == [None, None]


def test_output_values_name_their_input_and_transaction() -> None:
    value = output_value("p1-7", transaction_name("chaos-transformer-1", 2, 9))
    assert split_output(value) == ("p1-7", "chaos-transformer-1.2.9")
    assert split_output("p1-7") is None and split_output("|x") is None


def test_the_coordinator_partition_is_kafkas_hash() -> None:
    for transactional_id in ("chaos-transformer-1", "chaos-transformer-2", "", "ünïcode", "a" * 99):
        for partitions in (1, 5, 50):
            assert state_partition(transactional_id, partitions) == partition_for(
                transactional_id, partitions
            )
