"""The membership fault on real node processes (chaos/membership.py): a new controller joins
the quorum and the heal takes it out and stops it; a voter (the active controller) leaves and
the heal adds it back; each time the quorum ends on the voters it started with, caught up.

Three combined nodes on 127.0.0.131-133 (as root) and the new controller on 127.0.0.137 as its
node user: the addresses of tests/chaos/test_chaos_run.py, so both modules share an xdist group
and never run at once. Every process is stopped by its pid in a ``finally``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from chaos.membership import VoterChanges
from chaos.network import ensure_node_identity, node_user_name, prepare_runtime
from chaos.runner import NODE_MODULES, REPO
from chaos.schedule import PlannedFault
from dataplane.client import AdminClient, NewTopic
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.xdist_group("chaos_run"),
    pytest.mark.skipif(os.geteuid() != 0, reason="node users need root"),
]
FIRST_HOST, SPARE_HOST = 131, 137


def voter_ids(admin: AdminClient) -> list[int]:
    return sorted(v.node_id for v in admin.describe_quorum().voters)


def test_membership_faults_change_one_voter_and_heal_to_the_first_voters(tmp_path: Path) -> None:
    hosts = [f"127.0.0.{h}" for h in (FIRST_HOST, FIRST_HOST + 1, FIRST_HOST + 2, SPARE_HOST)]
    local = LocalCluster(
        tmp_path / "cluster", nodes=3, first_host=FIRST_HOST, port=pick_cluster_port(hosts)
    )
    identity = ensure_node_identity(node_user_name(SPARE_HOST), [hosts[-1]])
    prepare_runtime(identity, Path(sys.executable), REPO, NODE_MODULES)
    changes: VoterChanges | None = None
    admin = AdminClient(bootstrap_controllers=local.controller_addresses)
    try:
        local.up(timeout_s=60)
        changes = VoterChanges(local, identity, tmp_path, REPO, sys.executable)

        add = PlannedFault(id=1, kind="membership", at_s=0, length_s=5, change="add")
        hit, detail, heal = changes.inject(add)
        assert hit == [4] and "caught up in" in detail, detail
        assert voter_ids(admin) == [1, 2, 3, 4]
        assert changes.spare_pid is not None
        heal()
        assert voter_ids(admin) == [1, 2, 3]
        assert changes.spare_pid is None, "the new controller was stopped"

        leader = admin.describe_quorum().leader_id
        remove = PlannedFault(
            id=2, kind="membership", at_s=0, length_s=5, node=leader - 1, change="remove"
        )
        hit, detail, heal = changes.inject(remove)
        assert hit == [leader] and "(the active controller)" in detail, detail
        assert leader not in voter_ids(admin)
        assert admin.create_topics([NewTopic("while-out", 1, 1)]) == {"while-out": None}
        heal()
        assert voter_ids(admin) == [1, 2, 3]
        assert all(0 <= v.lag <= 5 for v in admin.describe_quorum().voters)
        assert admin.create_topics([NewTopic("after", 1, 1)]) == {"after": None}
    finally:
        admin.close()
        if changes is not None:
            changes.close()
        local.down()
