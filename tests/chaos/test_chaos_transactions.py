"""The CI chaos run of the transactions workload: ``raftlog chaos run --workload transactions``
for 60 s, fixed seed, 3 nodes, each transaction fault kind (the leader of a transformer's
transaction coordinator killed, an output partition's leader killed, a transformer process
killed and started again) beside a node kill, a pause and a partition, with two transformers,
one on raftlog's client and one on librdkafka (confluent-kafka, through the KAFKA listener), in
the same group, and not one finding:
every input record transformed exactly once into the read_committed output, no aborted record
visible, every committed transaction whole, a marker ending each transaction on every output
partition it wrote, and the group's offsets where the committed transactions left them.

The run is the real command in its own process: it starts its own cluster on 127.0.0.177-179
as node users (the addresses reserved for this module; 127.0.0.180, which a membership fault
would use, only takes part in picking the cluster's port) and its transformer processes, cuts
the network with real iptables rules and stops everything it started. If the test times out
or fails, the run is interrupted (SIGINT: the harness heals and stops its nodes and
transformers) and, as a last resort, the run and every node process it recorded are killed by
pid; the transformers die with the run (`popen_owned`'s death signal).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.history import TXN_FAULT_KINDS
from chaos.report import load_report
from tests.chaos.test_chaos_run import running_chaos

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("chaos_transactions"),  # 127.0.0.177-180
    pytest.mark.skipif(os.geteuid() != 0, reason="iptables and node users need root"),
]
SEED = 20261126  # its plan injects all six kinds below within the 60 s
FAULTS = (*TXN_FAULT_KINDS, "kill", "pause", "partition")
RUN_TIMEOUT_S = 420


@pytest.fixture
def chaos_run(tmp_path: Path) -> Iterator[tuple[subprocess.CompletedProcess[str], Path]]:
    args = [
        "--seed", str(SEED), "--duration", "60s", "--faults", ",".join(FAULTS), "--nodes", "3",
        "--first-host", "177", "--spare-host", "180", "--workload", "transactions",
        "--transformers", "2", "--transformer-clients", "ours,confluent",
    ]  # fmt: skip
    with running_chaos(args, tmp_path, RUN_TIMEOUT_S) as run:
        yield run


def test_a_transactional_pipeline_under_faults_is_exactly_once(
    chaos_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    result, report = chaos_run
    assert (report / "report.json").exists(), f"no report: the run failed\n{result.stdout[-5000:]}"
    history, verdict = load_report(report)
    findings = "\n".join(f"{f.kind}: {f.message}" for f in verdict.findings[:20])
    assert result.returncode == 0 and verdict.ok, f"{findings}\n\n{result.stdout[-5000:]}"
    assert {f.kind for f in history.faults} == set(FAULTS)
    hit = {f.kind: f for f in history.faults}
    assert all(hit[kind].detail.startswith("SIGKILL") for kind in TXN_FAULT_KINDS), hit
    final = history.txn_final
    assert final is not None and final.drained
    inputs = sum(len(p.records) for p in history.final)
    assert inputs > 1_000
    assert sum(len(p.committed) for p in final.outputs) == inputs  # exactly once, read_committed
    assert all(p.batches for p in final.outputs)  # the markers were judged
    assert final.group_offsets == {p.partition: p.high_watermark for p in history.final}
    summary = verdict.summary.transactions
    assert summary is not None
    assert summary.committed > 20 and summary.aborted_on_purpose >= 1
    # one transformer per client, both in the group throughout the faults
    assert {c: n > 10 for c, n in summary.committed_by_client.items()} == {
        "ours": True, "confluent": True,
    }, summary.committed_by_client  # fmt: skip
    # this seed kills librdkafka's transformer and the coordinator of ours (node and pause and
    # partition and the output leader's kill hit the cluster both use)
    clients = {txn.transformer: txn.client for txn in history.transactions}
    assert clients == {"chaos-transformer-1": "ours", "chaos-transformer-2": "confluent"}
    assert hit["transformer-kill"].detail == "SIGKILL transformer chaos-transformer-2"
    assert summary.transformer_restarts >= 1
    aborted_stored = {
        value
        for txn in history.transactions
        if txn.outcome == "aborted"
        for value in (o.value for o in txn.outputs if o.offset is not None)
    }
    uncommitted = {value for p in final.outputs for _, value in p.uncommitted}
    assert aborted_stored and aborted_stored <= uncommitted  # read_uncommitted sees aborts
    assert "PASS" in result.stdout and "transactions committed" in result.stdout
