"""Brokers that come and go: what ``raftlog cluster remove-node`` and ``rebalance-leaders`` do.

- :func:`drain_broker` moves every replica off a broker with reassignments
  (:func:`metadata_quorum.rebalance.plan_drain`: only the replicas on it move, onto brokers
  that are not cordoned) and waits until none is left;
- :func:`decommission` cordons a local cluster's broker-only node (so that no new partition is
  placed on it while it drains: a drain would otherwise chase new topics), drains it, stops it
  (SIGTERM: its controlled shutdown moves any leadership away and fences it) and unregisters
  it. A drain that fails leaves the cordon in place: ``raftlog cluster uncordon N`` lifts it;
- :func:`rebalance_leaders` runs a preferred election of every partition (Kafka's
  ``kafka-leader-election --election-type PREFERRED --all-topic-partitions``) and says what moved.

Each waits by polling the cluster with a deadline.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dataplane.client import AdminClient, TopicPartition
from dataplane.client.admin import TopicDescription
from dataplane.tools.local_cluster import LocalCluster, wait_for
from metadata_quorum.rebalance import plan_drain
from raftlog.errors import ErrorCode, KafkaError

__all__ = [
    "Decommissioned",
    "LeaderMove",
    "LeaderRebalance",
    "decommission",
    "drain_broker",
    "rebalance_leaders",
]

DRAIN_POLL_S = 0.2
# after the node stopped: its controlled shutdown fenced it, else its session ends
FENCED_TIMEOUT_S = 30.0
Moves = dict[TopicPartition, tuple[tuple[int, ...], tuple[int, ...]]]  # (replicas, target)


def _targets(described: Mapping[str, TopicDescription]) -> dict[tuple[str, int], tuple[int, ...]]:
    """Where every partition is going: its replicas without those a move is taking away."""
    return {
        (name, p.partition): tuple(b for b in p.replicas if b not in p.removing_replicas)
        for name, topic in described.items()
        for p in topic.partitions
    }


def _hosted(described: Mapping[str, TopicDescription], broker_id: int) -> list[str]:
    return [
        f"{name}-{p.partition}"
        for name, topic in sorted(described.items())
        for p in topic.partitions
        if broker_id in p.replicas
    ]


def drain_broker(
    admin: AdminClient,
    broker_id: int,
    timeout_s: float,
    on_start: Callable[[Moves], None] = lambda moves: None,
) -> Moves:
    """Move every replica off ``broker_id`` onto the other usable, uncordoned brokers and
    return once no partition has one there (every topic, internal ones too). Partitions created
    on it while it drains (it was not cordoned first) are moved as well. Returns the moves
    started, ``on_start`` hears of each round's.
    Raises the first refused move (KafkaError) or TimeoutError naming what is left."""
    deadline = time.monotonic() + timeout_s
    started: Moves = {}
    while True:
        described = admin.describe_topics()
        hosted = _hosted(described, broker_id)
        if not hosted:
            return started
        targets = _targets(described)
        if any(broker_id in target for target in targets.values()):
            brokers = admin.describe_cluster().brokers
            usable = [b.broker_id for b in brokers if not b.fenced and not b.in_controlled_shutdown]
            cordoned = [b.broker_id for b in brokers if b.cordoned]
            plan = plan_drain(targets, broker_id, usable, cordoned)
            errors = admin.alter_partition_reassignments(plan)
            for tp, error in sorted(errors.items()):
                if error is not None:
                    raise KafkaError(error.error, f"{tp.topic}-{tp.partition}: {error.message}")
            moves = {TopicPartition(*tp): (targets[tp], plan[tp]) for tp in plan}
            started.update(moves)
            on_start(moves)
        if time.monotonic() > deadline:
            shown = ", ".join(hosted[:10]) + (", ..." if len(hosted) > 10 else "")
            raise TimeoutError(
                f"after {timeout_s:g} s {len(hosted)} partitions still have a replica on broker "
                f"{broker_id} ({shown}): see raftlog partitions reassign --verify"
            )
        time.sleep(DRAIN_POLL_S)  # polling a condition with a deadline


@dataclass(frozen=True)
class Decommissioned:
    node_id: int
    moves: Moves
    drain_s: float
    drained: bool  # False: forced on after the drain failed
    unregistered: bool  # False: the broker was not registered (never started, or already gone)


def decommission(
    cluster: LocalCluster,
    node_id: int,
    timeout_s: float,
    force: bool = False,
    on_start: Callable[[Moves], None] = lambda moves: None,
    report: Callable[[str], None] = lambda line: None,
) -> Decommissioned:
    """Drain a local cluster's broker-only node, stop it (controlled shutdown), unregister its
    broker and forget the node. With ``force`` a drain that fails or times out is reported and
    the rest goes on (the replicas left on it are lost to their partitions, and the
    unregistration is forced)."""
    spec = cluster.spec(node_id)
    if spec in cluster.controller_specs:
        raise ValueError(
            f"node {node_id} is a controller (a voter of the metadata quorum): only broker-only "
            "nodes are removed this way"
        )
    others = [cluster.broker_address(s.node_id) for s in cluster.specs if s.node_id != node_id]
    started = time.monotonic()
    with AdminClient(others, security=cluster.admin_security) as admin:
        registered = any(b.broker_id == node_id for b in admin.describe_cluster().brokers)
        moves: Moves = {}
        drained = True
        if registered:
            admin.cordon_broker(node_id)
            report(f"broker {node_id} cordoned: no new replicas are placed on it")
            try:
                moves = drain_broker(admin, node_id, timeout_s, on_start)
            except (KafkaError, TimeoutError) as error:
                if not force:
                    raise
                report(f"the drain failed ({error}); forced on")
                drained = False
        drain_s = time.monotonic() - started
        cluster.stop_node(node_id)
        if registered:
            wait_for(
                f"broker {node_id} to be fenced", lambda: _fenced(admin, node_id), FENCED_TIMEOUT_S
            )
            admin.unregister_broker(node_id, force=force)
    cluster.forget_node(node_id)
    return Decommissioned(node_id, moves, drain_s, drained, registered)


def _fenced(admin: AdminClient, broker_id: int) -> bool:
    brokers = {b.broker_id: b for b in admin.describe_cluster().brokers}
    broker = brokers.get(broker_id)
    return broker is None or broker.fenced


@dataclass(frozen=True)
class LeaderMove:
    topic: str
    partition: int
    leader_before: int
    leader: int


@dataclass(frozen=True)
class LeaderRebalance:
    moved: list[LeaderMove]
    not_available: list[TopicPartition]  # the preferred replica is not in the ISR or not usable
    failed: dict[TopicPartition, KafkaError]
    leaders: dict[int, int]  # broker id -> partitions it leads, afterwards


def rebalance_leaders(admin: AdminClient) -> LeaderRebalance:
    """A preferred election of every partition: leadership goes back to each partition's first
    replica where it is in the ISR. What moved, what could not, and the leaders afterwards."""
    before = {
        TopicPartition(name, p.partition): p
        for name, topic in admin.describe_topics().items()
        for p in topic.partitions
    }
    results = admin.elect_leaders("preferred")
    moved, not_available, failed = [], [], {}
    for tp, error in sorted(results.items()):
        if error is None:
            was = before.get(tp)
            if was is not None:
                moved.append(LeaderMove(tp.topic, tp.partition, was.leader, was.replicas[0]))
        elif error.error is ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE:
            not_available.append(tp)
        elif error.error is not ErrorCode.ELECTION_NOT_NEEDED:
            failed[tp] = error
    leaders = Counter(
        p.leader for topic in admin.describe_topics().values() for p in topic.partitions
    )
    leaders.pop(-1, None)
    return LeaderRebalance(moved, not_available, failed, dict(sorted(leaders.items())))
