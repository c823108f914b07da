"""The CI chaos run against a secure cluster: ``raftlog chaos run --secure`` for 45 s, fixed
seed, 3 nodes, the transactions workload (one transformer on raftlog's client, one on
librdkafka), a node cut off, a partition reassignment, a controller added to the quorum (with
a certificate of its own, the Raft transport being TLS between node certificates) and a
transaction coordinator's node killed (it restarts, and every client authenticates again), and
not one finding.

The cluster runs TLS, SCRAM and the StandardAuthorizer on every listener (chaos/secure.py); the
producers, the group members, the admin workload, the watchers and the transformers connect as
the SCRAM user ``chaos``, which holds only the ACLs of `chaos.secure.workload_acls`, so beyond
the checker's verdict the test checks that the nodes really ran secure (their configurations)
and that the authorizer refused the workload user nothing (no DENIED line for it in the nodes'
audit log), and that the nodes' users could read their own keystores but not the CA's key.

The run is the real command in its own process (`running_chaos`, which stops it and its nodes
whatever happens): its cluster on 127.0.0.198-200 and a membership fault's new controller on
127.0.0.210, as node users (the addresses reserved for this module).
"""

from __future__ import annotations

import os
import pwd
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.network import node_user_name
from chaos.report import load_report
from chaos.secure import PROPERTIES_NAME, WORKLOAD_USER
from tests.chaos.test_chaos_run import running_chaos

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("chaos_secure"),  # 127.0.0.198-200 and 210
    pytest.mark.skipif(os.geteuid() != 0, reason="iptables and node users need root"),
]
SEED = 20261128
FIRST_HOST, SPARE_HOST = 198, 210
FAULTS = ("partition", "reassign", "membership", "txn-coordinator-kill")
RUN_TIMEOUT_S = 420


@pytest.fixture
def chaos_run(tmp_path: Path) -> Iterator[tuple[subprocess.CompletedProcess[str], Path, Path]]:
    args = [
        "--seed", str(SEED), "--duration", "45s", "--faults", ",".join(FAULTS), "--nodes", "3",
        "--first-host", str(FIRST_HOST), "--spare-host", str(SPARE_HOST), "--secure",
        "--workload", "transactions", "--transformers", "2",
        "--transformer-clients", "ours,confluent",
    ]  # fmt: skip
    with running_chaos(args, tmp_path, RUN_TIMEOUT_S) as (result, report):
        yield result, report, tmp_path / "cluster"


def test_a_chaos_run_against_a_secure_cluster_finds_nothing(
    chaos_run: tuple[subprocess.CompletedProcess[str], Path, Path],
) -> None:
    result, report, work_dir = chaos_run
    assert (report / "report.json").exists(), f"no report: the run failed\n{result.stdout[-5000:]}"
    history, verdict = load_report(report)
    findings = "\n".join(f"{f.kind}: {f.message}" for f in verdict.findings[:20])
    assert result.returncode == 0 and verdict.ok, f"{findings}\n\n{result.stdout[-5000:]}"
    assert f"the workloads connect as {WORKLOAD_USER}" in result.stdout
    assert {f.kind for f in history.faults} == set(FAULTS)
    summary = verdict.summary
    assert summary.acknowledged_writes > 1_000
    assert summary.lost_writes == 0 and summary.duplicated_values == 0
    assert summary.consumed_records >= summary.acknowledged_writes
    final = history.txn_final
    assert final is not None and final.drained
    inputs = sum(len(p.records) for p in history.final)
    assert sum(len(p.committed) for p in final.outputs) == inputs  # exactly once
    transactions = summary.transactions
    assert transactions is not None
    assert {c: n > 5 for c, n in transactions.committed_by_client.items()} == {
        "ours": True, "confluent": True,
    }, transactions.committed_by_client  # fmt: skip

    # the nodes ran secure: SASL_SSL listeners and the authorizer, the spare controller too
    spare = [p for p in work_dir.glob("spare-*/node.toml")]
    assert spare, "the membership fault started no controller"
    for config_path in [*sorted(work_dir.glob("node-*/node.toml")), *spare]:
        config = tomllib.loads(config_path.read_text())
        protocols = dict(
            pair.split(":") for pair in config["listener.security.protocol.map"].split(",")
        )
        assert {protocols[n] for n in ("CONTROLLER", "BROKER", "KAFKA")} == {"SASL_SSL"}
        assert config["authorizer.class.name"].endswith("StandardAuthorizer"), config_path
        assert "controller.quorum.raft.secret.file" not in config, config_path  # Raft over TLS
    # the workload user was refused nothing: no DENIED line for it in any node's audit log
    logs = [*work_dir.glob("node-*/node.log"), *work_dir.glob("spare-*/node.log")]
    # every node, the spare controller too, was admitted as a Raft peer (its certificate's
    # principal a super user): a refusal of one would be a line naming why
    not_nodes = [p for p in logs if "is not a node: not in super.users" in p.read_text()]
    assert not_nodes == [], not_nodes
    denied = [
        line
        for path in logs
        for line in path.read_text(errors="replace").splitlines()
        if "DENIED" in line and f"User:{WORKLOAD_USER}" in line
    ]
    assert denied == [], "\n".join(denied[:20])

    # each node's keystore is its own user's; the CA's key and the passwords stay root's
    secrets = work_dir / "secrets"
    for n in (1, 2, 3):
        owner = pwd.getpwuid((secrets / f"node-{n}.pem").stat().st_uid).pw_name
        assert owner == node_user_name(FIRST_HOST + n - 1)
    for private in ("raftlog-ca.key", "admin.pem", "admin.password.json", PROPERTIES_NAME):
        stat = (secrets / private).stat()
        assert (stat.st_uid, stat.st_mode & 0o077) == (0, 0), private
