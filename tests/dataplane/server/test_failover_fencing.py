"""A controller failover fences no live broker (127.0.0.228-230, 3 combined nodes).

Seen before the fix, stopping or killing the active controller's node fenced the other, live
brokers in most rounds, and the leadership of their partitions moved: the stopping controller
kept ticking while its node shut down; brokers told the standbys of their heartbeats only after
the active controller had answered (never, while none did); a stale NOT_CONTROLLER hint kept a
broker's client from reaching the new active controller; and gRPC's reconnect backoff left a
restarted controller unreachable for seconds. Each round here stops (SIGTERM) or kills
(SIGKILL) the active controller's node, watches every other broker for the next seconds, then
restarts the node."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from dataplane.client import AdminClient, NewTopic
from dataplane.tools.local_cluster import LocalCluster, wait_for
from tests.dataplane.cluster_support import running_cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("failover-fencing")]
WATCH_S = 5.0  # more than two broker sessions of the local cluster (2 s)
POLL_S = 0.05


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("fencing"), "failover_fencing") as running:
        yield running


def leaders(admin: AdminClient) -> dict[int, tuple[int, int]]:
    return {
        p.partition: (p.leader, p.leader_epoch)
        for p in admin.describe_topics(["t"])["t"].partitions
    }


def test_stopping_or_killing_the_active_controller_fences_no_live_broker(
    cluster: LocalCluster,
) -> None:
    with AdminClient(cluster.bootstrap_servers) as admin:
        assert admin.create_topics([NewTopic("t", 6, 3)]) == {"t": None}
        wait_for("leaders", lambda: all(lead >= 0 for lead, _ in leaders(admin).values()) or None)
        for round_no, kill in enumerate((False, True, False, True)):
            active = cluster.wait_for_leader()
            before = leaders(admin)
            cluster.stop_node(active, kill=kill)
            fenced: set[int] = set()
            deadline = time.monotonic() + WATCH_S
            while time.monotonic() < deadline:  # watching for a condition over a span
                described = admin.describe_cluster()
                fenced |= {b.broker_id for b in described.brokers if b.fenced} - {active}
                time.sleep(POLL_S)
            after = leaders(admin)
            moved = [
                p for p, (lead, _) in before.items() if lead != active and after[p] != before[p]
            ]
            how = "SIGKILL" if kill else "SIGTERM"
            assert not fenced, f"round {round_no} ({how} of {active}): fenced {sorted(fenced)}"
            assert not moved, f"round {round_no} ({how} of {active}): live leaders moved: {moved}"
            cluster.start_node(active)
            cluster.wait_for_brokers(timeout_s=30)
