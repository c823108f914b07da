"""Follower fetching (KIP-392): which replica a consumer should read a partition from.

A consumer that sends its rack (``client.rack``; Fetch v11+'s ``rack_id``) to a partition's
leader may be answered, instead of records, a *preferred read replica*: a broker in its rack
that holds the offset it asks for. It then fetches from that follower, which serves consumers
up to its own high watermark. The leader asks the broker's ``replica.selector.class``; unset
(Kafka's default) means the leader always serves. Kafka ships one selector,
``RackAwareReplicaSelector``, and so does this module (:func:`rack_aware_select`), with Kafka's
rules (``ReplicaManager.findPreferredReadReplica``):

- candidates are the leader and the followers *in the ISR* whose log holds the fetch offset
  (log start offset <= fetch offset <= log end offset) and that are reachable on the client's
  listener (registered, unfenced, with an endpoint there);
- with no client rack, or the leader in the client's rack, or no candidate in it: the leader
  (no preferred replica is answered);
- else the most caught-up candidate of the client's rack: the largest log end offset, then the
  shortest time since it was last caught up, then the largest broker id.

Pure: the caller gives the leader's view of its followers and the racks of the brokers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

RACK_AWARE_REPLICA_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
REPLICA_SELECTORS = frozenset({RACK_AWARE_REPLICA_SELECTOR})  # replica.selector.class values


class ReplicaView(NamedTuple):
    """One replica as the leader sees it (Kafka's ``ReplicaView``)."""

    broker_id: int
    rack: str | None
    log_end_offset: int
    time_since_last_caught_up_ms: int


def _most_caught_up(replica: ReplicaView) -> tuple[int, int, int]:
    """Kafka's ``ReplicaView.comparator``, as a key for max()."""
    return (replica.log_end_offset, -replica.time_since_last_caught_up_ms, replica.broker_id)


def rack_aware_select(
    client_rack: str, leader: ReplicaView, candidates: Iterable[ReplicaView]
) -> ReplicaView:
    """Kafka's ``RackAwareReplicaSelector.select``: the replica of the client's rack to read
    from (the leader when it is in that rack, when none is, or when the client names none).
    ``candidates`` are the followers that may serve (see the module docstring)."""
    if not client_rack:
        return leader
    if leader.rack == client_rack:
        return leader
    same_rack = [replica for replica in candidates if replica.rack == client_rack]
    if not same_rack:
        return leader
    return max(same_rack, key=_most_caught_up)


def preferred_read_replica(
    selector: str | None,
    client_rack: str,
    leader: ReplicaView,
    candidates: Iterable[ReplicaView],
) -> int | None:
    """The broker the consumer should fetch from instead of the leader, or None (the leader
    serves). ``selector``: ``replica.selector.class`` (None: Kafka's default, none)."""
    if selector is None:
        return None
    assert selector in REPLICA_SELECTORS, f"replica.selector.class {selector} was not validated"
    chosen = rack_aware_select(client_rack, leader, candidates)
    return None if chosen.broker_id == leader.broker_id else chosen.broker_id
