"""The chaos report: report.json round-trips, report.html is self-contained and shows everything,
the terminal summary prints the verdict and figures. Histories are made by hand."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from rich.console import Console

from chaos.history import (
    ALL_FAULT_KINDS,
    BatchEntry,
    Commit,
    CommittedObservation,
    Consumed,
    FaultRecovery,
    FaultWindow,
    FinalPartition,
    Finding,
    History,
    MetadataSample,
    PowerLossLoss,
    ReplicaLog,
    Summary,
    Verdict,
    Write,
)
from chaos.report import (
    FINDINGS_SHOWN_MAX,
    KIND_COLOURS,
    REPORT_JSON,
    _by_partition,
    _fault_kind_rows,
    _leader_changes,
    _per_second,
    load_report,
    print_summary,
    write_report,
)

TOPIC = "chaos-events"
PARTITIONS = 3
KILL = FaultWindow(id=1, kind="kill", nodes=[2], start_s=8.0, end_s=12.0)
CUT = FaultWindow(id=2, kind="partition", nodes=[3], start_s=18.0, end_s=23.0, detail="isolate 3")
LOST_MESSAGE = "acknowledged value v-17 at offset 5 is missing from the final log <gone>"
DUPLICATE_MESSAGE = "value v-42 stored twice, at offsets 14 and 15"
IMAGE = "data:image/png;base64,"


def _in_fault(time_s: float) -> bool:
    return any(f.start_s <= time_s < f.end_s for f in (KILL, CUT))


def _writes(rng: random.Random) -> list[Write]:
    """300 writes, 10 a second for 30 s; some fail or never finish during the faults."""
    writes, offsets = [], [0] * PARTITIONS
    for seq in range(300):
        start_s, partition = seq / 10, seq % PARTITIONS
        end_s = start_s + rng.uniform(0.002, 0.030) * (20 if _in_fault(start_s) else 1)
        ok = not (_in_fault(start_s) and seq % 2 == 0)
        offset = offsets[partition] if ok else None
        offsets[partition] += ok
        writes.append(
            Write(
                producer="p0", seq=seq, topic=TOPIC, partition=partition, value=f"v-{seq}",
                start_s=start_s, end_s=None if seq == 299 else end_s, ok=ok and seq != 299,
                offset=offset, error="" if ok else "REQUEST_TIMED_OUT",
            )
        )  # fmt: skip
    return writes


def _samples() -> list[MetadataSample]:
    """Every 0.5 s: partition 0 loses leader 2 at 8 s (no leader until 9 s, then 1); node 3
    leaves every ISR during the partition fault."""
    samples = []
    for tick in range(64):
        time_s = tick / 2
        for partition in range(PARTITIONS):
            leader, epoch = 2 if partition == 0 else 1, 0
            if partition == 0 and time_s >= 8.0:
                leader, epoch = (-1, 0) if time_s < 9.0 else (1, 1)
            isr = [1, 2, 3]
            if partition == 0 and 8.0 <= time_s < 13.0:
                isr = [1, 3]
            if 19.0 <= time_s < 24.0:
                isr = [n for n in isr if n != 3]
            samples.append(
                MetadataSample(
                    time_s=time_s, topic=TOPIC, partition=partition, leader=leader,
                    leader_epoch=epoch, isr=isr,
                )
            )  # fmt: skip
    return samples


def _history() -> History:
    writes = _writes(random.Random(7))
    acked = [w for w in writes if w.ok]
    consumed = [
        Consumed(member="m0", topic=TOPIC, partition=w.partition, offset=w.offset or 0,
                 value=w.value, time_s=(w.end_s or 0.0) + 0.2)
        for w in acked
    ]  # fmt: skip
    commits = [
        Commit(member="m0", topic=TOPIC, partition=p, offset=t * 3, start_s=t, end_s=t + 0.01,
               ok=not _in_fault(t))
        for t in range(0, 30, 2)
        for p in range(PARTITIONS)
    ]  # fmt: skip
    committed = [
        CommittedObservation(topic=TOPIC, partition=p, offset=-1 if t == 0 else t * 3 - p,
                             time_s=t + 0.5)
        for t in range(30)
        for p in range(PARTITIONS)
    ]  # fmt: skip
    final = [
        FinalPartition(
            topic=TOPIC, partition=p, leader=1, isr=[1, 2, 3], log_start_offset=0,
            high_watermark=sum(1 for w in acked if w.partition == p),
            records=[(w.offset or 0, w.value) for w in acked if w.partition == p],
            replicas=[
                ReplicaLog(node_id=n, batches=[
                    BatchEntry(base_offset=0, last_offset=9, crc=1234, leader_epoch=0),
                    BatchEntry(base_offset=10, last_offset=19, crc=5678, leader_epoch=1),
                ])
                for n in (1, 2, 3)
            ],
        )
        for p in range(PARTITIONS)
    ]  # fmt: skip
    return History(
        seed=7, nodes=[1, 2, 3], faults_requested=["kill", "partition"], duration_s=30.0,
        topic=TOPIC, partitions=PARTITIONS, group="chaos-group",
        started_at="2025-01-01T12:00:00+00:00", workload_s=30.0, end_s=33.5, writes=writes,
        consumed=consumed, commits=commits, committed=committed, faults=[KILL, CUT],
        samples=_samples(), final=final, final_topics=[TOPIC],
        problems=["could not read node 3's segment files: <permission denied>"],
    )  # fmt: skip


def _summary(history: History, recoveries: list[FaultRecovery]) -> Summary:
    acked = sum(1 for w in history.writes if w.ok)
    return Summary(
        attempted_writes=len(history.writes), acknowledged_writes=acked,
        indeterminate_writes=len(history.writes) - acked, lost_writes=1, duplicated_values=1,
        availability=0.935, faults_by_kind={f.kind: 1 for f in history.faults},
        recoveries=recoveries, consumed_records=len(history.consumed),
        commits_ok=sum(1 for c in history.commits if c.ok), admin_ops_ok=0,
    )  # fmt: skip


def _failing_verdict(history: History) -> Verdict:
    findings = [
        Finding(kind="lost-write", message=LOST_MESSAGE, topic=TOPIC, partition=2, offset=5,
                value="v-17", time_s=9.1, faults=[1]),
        Finding(kind="duplicate", message=DUPLICATE_MESSAGE, topic=TOPIC, partition=0,
                offset=14, value="v-42", time_s=19.5, faults=[2]),
    ]  # fmt: skip
    recoveries = [
        FaultRecovery(fault_id=1, kind="kill", recovery_s=1.25),
        FaultRecovery(fault_id=2, kind="partition", recovery_s=None),
    ]
    return Verdict(ok=False, findings=findings, summary=_summary(history, recoveries))


def _empty_history() -> History:
    return History(
        seed=11, nodes=[1, 2, 3], faults_requested=[], duration_s=0.0, topic=TOPIC,
        partitions=PARTITIONS, group="chaos-group", started_at="2025-01-01T12:00:00+00:00",
        workload_s=0.0, end_s=0.0,
    )  # fmt: skip


def _passing_verdict(history: History) -> Verdict:
    return Verdict(ok=True, findings=[], summary=_summary(history, []))


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> tuple[History, Verdict, Path]:
    history = _history()
    verdict = _failing_verdict(history)
    return history, verdict, write_report(history, verdict, tmp_path_factory.mktemp("failing"))


@pytest.fixture(scope="module")
def empty(tmp_path_factory: pytest.TempPathFactory) -> tuple[History, Verdict, Path]:
    history = _empty_history()
    verdict = _passing_verdict(history)
    return history, verdict, write_report(history, verdict, tmp_path_factory.mktemp("empty"))


def test_write_report_creates_json_and_html(failing: tuple[History, Verdict, Path]) -> None:
    _, _, html_path = failing
    assert html_path.name == "report.html"
    assert html_path.is_file()
    assert (html_path.parent / REPORT_JSON).is_file()


def test_load_report_round_trips_from_file_or_directory(
    failing: tuple[History, Verdict, Path],
) -> None:
    history, verdict, html_path = failing
    assert load_report(html_path.parent) == (history, verdict)
    assert load_report(html_path.parent / REPORT_JSON) == (history, verdict)


def test_html_shows_verdict_faults_findings_and_problems(
    failing: tuple[History, Verdict, Path],
) -> None:
    _, _, html_path = failing
    page = html_path.read_text(encoding="utf-8")
    assert "<title>raftlog chaos run — seed 7</title>" in page
    assert '<div class="banner fail">FAIL — 2 findings' in page
    for fault in (KILL, CUT):
        assert f'<td class="num">{fault.id}</td><td>{fault.kind}</td>' in page
    assert "isolate 3" in page
    assert LOST_MESSAGE.replace("<", "&lt;").replace(">", "&gt;") in page
    assert "<gone>" not in page
    assert DUPLICATE_MESSAGE in page
    assert "&lt;permission denied&gt;" in page  # the harness's problems, escaped
    assert ">never<" in page  # fault 2 never recovered
    assert "2 → none → 1" in page  # partition 0's leaders in the leader changes table
    assert "node 3: 2 batches to offset 19" in page  # the final partitions table


def test_html_is_self_contained(failing: tuple[History, Verdict, Path]) -> None:
    _, _, html_path = failing
    page = html_path.read_text(encoding="utf-8")
    assert page.count(IMAGE) >= 5
    assert "http://" not in page
    assert "https://" not in page
    assert "<script" not in page
    assert re.search(r"<link\b", page) is None


def test_empty_history_renders(empty: tuple[History, Verdict, Path]) -> None:
    history, verdict, html_path = empty
    page = html_path.read_text(encoding="utf-8")
    assert '<div class="banner pass">PASS — no findings</div>' in page
    assert page.count(IMAGE) >= 5
    assert "no faults injected" in page
    assert "no final state was read" in page
    assert load_report(html_path.parent) == (history, verdict)


def test_findings_table_is_capped_with_a_note(tmp_path: Path) -> None:
    history = _empty_history()
    extra = 37
    findings = [
        Finding(kind="order", message=f"finding number {i}", time_s=float(i))
        for i in range(FINDINGS_SHOWN_MAX + extra)
    ]
    verdict = Verdict(ok=False, findings=findings, summary=_summary(history, []))
    page = write_report(history, verdict, tmp_path).read_text(encoding="utf-8")
    assert f"finding number {FINDINGS_SHOWN_MAX - 1}<" in page
    assert f"finding number {FINDINGS_SHOWN_MAX}<" not in page
    assert f"{extra} more findings are in report.json" in page
    assert len(load_report(tmp_path)[1].findings) == FINDINGS_SHOWN_MAX + extra


def test_print_summary_fail(failing: tuple[History, Verdict, Path]) -> None:
    history, verdict, _ = failing
    console = Console(record=True, width=120)
    print_summary(history, verdict, console)
    text = console.export_text()
    assert text.splitlines()[0] == "FAIL  seed 7, 2 findings"
    summary = verdict.summary
    for name, value in (
        ("attempted writes", summary.attempted_writes),
        ("acknowledged writes", summary.acknowledged_writes),
        ("indeterminate writes", summary.indeterminate_writes),
        ("consumed records", summary.consumed_records),
        ("commits ok", summary.commits_ok),
    ):
        assert re.search(rf"{name}\s+│\s+{value}\b", text), name
    assert "93.5%" in text
    assert re.search(r"kill\s+│\s+1\s+│\s+1/1\s+│\s+1\.25 s\s+│\s+1\.25 s", text)
    assert re.search(r"partition\s+│\s+1\s+│\s+0/1\s+│\s+never\s+│\s+never", text)
    assert "lost-write" in text
    assert "duplicate" in text
    assert "<gone>" in text  # the terminal shows messages as they are


def test_print_summary_pass_without_findings(empty: tuple[History, Verdict, Path]) -> None:
    history, verdict, _ = empty
    console = Console(record=True, width=120)
    print_summary(history, verdict, console)
    text = console.export_text()
    assert text.splitlines()[0] == "PASS  seed 11, 0 findings"
    assert "no faults injected" in text
    assert "findings by kind" not in text


def test_fault_kind_rows() -> None:
    recoveries = [
        FaultRecovery(fault_id=1, kind="pause", recovery_s=1.0),
        FaultRecovery(fault_id=2, kind="pause", recovery_s=3.0),
        FaultRecovery(fault_id=3, kind="kill", recovery_s=2.0),
        FaultRecovery(fault_id=4, kind="kill", recovery_s=None),
        FaultRecovery(fault_id=5, kind="partition", recovery_s=None),
    ]
    summary = _summary(_empty_history(), recoveries).model_copy(
        update={"faults_by_kind": {"pause": 2, "kill": 2, "partition": 1, "disk-full": 0}}
    )
    assert _fault_kind_rows(summary) == [
        ("kill", 2, "1/2", "2.00 s", "never"),
        ("pause", 2, "2/2", "2.00 s", "3.00 s"),
        ("partition", 1, "0/1", "never", "never"),
        ("disk-full", 0, "0/0", "—", "—"),
    ]


@pytest.mark.parametrize(
    ("times", "seconds", "expected"),
    [
        ([], 3, [0, 0, 0]),
        ([0.0, 0.99, 1.0, 2.5], 3, [2, 1, 1]),
        ([-0.1, 7.2], 3, [1, 0, 1]),  # clipped into the run
    ],
)
def test_per_second(times: list[float], seconds: int, expected: list[int]) -> None:
    assert _per_second(times, seconds).tolist() == expected


def test_leader_changes_per_partition() -> None:
    groups = _by_partition(_samples())
    assert list(groups) == [(TOPIC, 0), (TOPIC, 1), (TOPIC, 2)]
    changes = _leader_changes(groups[(TOPIC, 0)])
    assert [(s.time_s, s.leader) for s in changes] == [(8.0, -1), (9.0, 1)]
    assert _leader_changes(groups[(TOPIC, 1)]) == []
    assert _leader_changes([]) == []


def test_every_fault_kind_has_its_own_colour() -> None:
    colours = [KIND_COLOURS.get(kind) for kind in ALL_FAULT_KINDS]
    assert None not in colours
    assert len(set(colours)) == len(colours)


def test_what_power_loss_all_lost_is_shown_beside_a_pass(tmp_path: Path) -> None:
    history = _empty_history().model_copy(update={"durability": "default"})
    losses = [
        PowerLossLoss(fault_id=3, topic=TOPIC, partition=1, count=12, first_offset=40,
                      last_offset=51),
    ]  # fmt: skip
    reported = [Finding(kind="lost-write", message="write 'v-40' acknowledged at 40", faults=[3])]
    summary = _summary(history, []).model_copy(
        update={"lost_to_power_loss": 12, "power_loss_losses": losses}
    )
    verdict = Verdict(ok=True, findings=[], summary=summary, reported=reported)
    console = Console(record=True, width=120)
    print_summary(history, verdict, console)
    text = console.export_text()
    assert text.splitlines()[0].startswith("PASS")
    assert re.search(r"lost to power-loss-all \(reported\)\s+│\s+12\b", text)
    assert re.search(r"3\s+│\s+chaos-events-1\s+│\s+12\s+│\s+40-51", text)
    page = write_report(history, verdict, tmp_path).read_text(encoding="utf-8")
    assert "Lost to power-loss-all" in page and "40-51" in page and "v-40" in page
    assert load_report(tmp_path) == (history, verdict)
