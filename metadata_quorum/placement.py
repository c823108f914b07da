"""Replica placement and leader election: pure functions of the image's broker and ISR data.

Placement (Kafka's rack-aware round robin): brokers are interleaved by rack
(rack A's first broker, rack B's first, ..., rack A's second, ...), partition ``p``'s first
replica is broker ``start + p`` of that list, and the followers step through the list with a
per-partition shift, skipping brokers whose rack already holds a replica while other racks
remain. The first replica is the preferred leader; ``start`` is the broker that currently
prefers to lead the fewest partitions, so leaders spread evenly across topics. Never two
replicas of a partition on one broker.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from metadata_quorum.records import NO_LEADER
from raftlog.errors import ErrorCode, KafkaError


@dataclass(frozen=True)
class BrokerSlot:
    broker_id: int
    rack: str | None


def rack_alternated(brokers: Sequence[BrokerSlot]) -> list[int]:
    """Broker ids interleaved by rack; plain id order when no broker declares a rack."""
    by_rack: dict[str, list[int]] = {}
    for broker in sorted(brokers, key=lambda b: b.broker_id):
        by_rack.setdefault(broker.rack or "", []).append(broker.broker_id)
    racks = sorted(by_rack)
    out: list[int] = []
    depth = max((len(ids) for ids in by_rack.values()), default=0)
    for level in range(depth):
        out.extend(by_rack[rack][level] for rack in racks if level < len(by_rack[rack]))
    return out


def place_replicas(
    brokers: Sequence[BrokerSlot],
    partition_count: int,
    replication_factor: int,
    preferred_leader_counts: Mapping[int, int],
    first_partition: int = 0,
    seed: int = 0,
) -> list[tuple[int, ...]]:
    """Replica lists for ``partition_count`` new partitions, numbered from ``first_partition``.

    ``seed`` (random per request, as Kafka's random start index and shift) picks among the
    least-loaded starting brokers and offsets the follower stride, so topics of the same shape
    do not all get the same replica sets (a failed broker's leadership would all land on one
    follower)."""
    if replication_factor < 1:
        raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR, "replication factor must be >= 1")
    if replication_factor > len(brokers):
        raise KafkaError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"replication factor {replication_factor} is larger than the "
            f"{len(brokers)} available brokers",
        )
    order = rack_alternated(brokers)
    racks = {b.broker_id: b.rack for b in brokers}
    rack_count = len({b.rack for b in brokers})
    fewest = min(preferred_leader_counts.get(b, 0) for b in order)
    least_loaded = [i for i, b in enumerate(order) if preferred_leader_counts.get(b, 0) == fewest]
    start = least_loaded[seed % len(least_loaded)]
    shift_offset = seed // len(least_loaded)
    out = []
    for n in range(partition_count):
        p = first_partition + n
        first = (start + n) % len(order)
        shift = 1 + (p // len(order) + shift_offset) % max(1, len(order) - 1)
        out.append(_one_partition(order, racks, rack_count, first, shift, replication_factor))
    return out


def _one_partition(
    order: list[int],
    racks: Mapping[int, str | None],
    rack_count: int,
    first: int,
    shift: int,
    replication_factor: int,
) -> tuple[int, ...]:
    chosen = [order[first]]
    used_racks = {racks[order[first]]}
    step = 0
    while len(chosen) < replication_factor:
        step += 1
        candidate = order[(first + shift * step) % len(order)] if step < len(order) else None
        if candidate is None:
            # The stride cycle is exhausted (the shift shares a factor with the broker count):
            # fill in list order, brokers on a rack not used yet first (always terminates).
            unchosen = [b for b in order if b not in chosen]
            candidate = next((b for b in unchosen if racks[b] not in used_racks), unchosen[0])
        if candidate in chosen:
            continue
        if racks[candidate] in used_racks and len(used_racks) < rack_count and step < len(order):
            continue
        chosen.append(candidate)
        used_racks.add(racks[candidate])
        if len(used_racks) == rack_count:
            used_racks = set()
    return tuple(chosen)


def preferred_leader_counts(replica_lists: Collection[Sequence[int]]) -> Counter[int]:
    return Counter(replicas[0] for replicas in replica_lists if replicas)


def check_assignment(
    replicas: Sequence[int], registered: Collection[int], partition: int
) -> tuple[int, ...]:
    """An explicit assignment: non-empty, distinct, registered brokers."""
    if not replicas:
        raise KafkaError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"partition {partition} has no replicas"
        )
    if len(set(replicas)) != len(replicas):
        raise KafkaError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"partition {partition} lists a broker twice: {list(replicas)}",
        )
    unknown = [b for b in replicas if b not in registered]
    if unknown:
        raise KafkaError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"partition {partition} names unregistered brokers {unknown}",
        )
    return tuple(replicas)


@dataclass(frozen=True)
class Election:
    """The outcome of choosing a leader: the new leader (or -1), the new ISR, and with KIP-966
    the new eligible leader replicas and last known ELR (always empty without it)."""

    leader: int
    isr: tuple[int, ...]
    unclean: bool = False
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()


def elect(
    replicas: Sequence[int],
    isr: Sequence[int],
    current_leader: int,
    usable: Collection[int],
    unclean_allowed: bool,
    prefer_replica_order: bool = False,
) -> Election:
    """Choose a leader among the usable brokers: keep the current one if it is usable and in the
    ISR (unless ``prefer_replica_order``), else the first ISR member in replica order; with no
    usable ISR member, an unclean election picks the first usable replica (ISR = just it), else
    the partition goes offline (-1) and the ISR keeps its last member so that broker can lead
    again when it returns (it holds every committed record)."""
    live_isr = tuple(b for b in isr if b in usable)
    if not prefer_replica_order and current_leader in live_isr:
        return Election(current_leader, _shrink(isr, usable))
    for broker in replicas:
        if broker in live_isr:
            return Election(broker, _shrink(isr, usable))
    if unclean_allowed:
        for broker in replicas:
            if broker in usable:
                return Election(broker, (broker,), unclean=True)
    return Election(NO_LEADER, _shrink(isr, usable))


def _shrink(isr: Sequence[int], usable: Collection[int]) -> tuple[int, ...]:
    """The ISR without unusable brokers, but never empty: the last member stays."""
    kept = tuple(b for b in isr if b in usable)
    if kept:
        return kept
    return tuple(isr[-1:]) if isr else ()


@dataclass(frozen=True)
class ElrPartition:
    """What :func:`elect_with_elr` needs of a partition and its topic."""

    replicas: Sequence[int]
    isr: Sequence[int]
    elr: Sequence[int]
    last_known_elr: Sequence[int]
    leader: int
    min_isr: int


def elect_with_elr(
    partition: ElrPartition,
    usable: Collection[int],
    unclean_allowed: bool,
    unclean_shutdown: Collection[int] = (),
    prefer_replica_order: bool = False,
) -> Election:
    """KIP-966's election (Kafka's ``PartitionChangeBuilder`` with ELR enabled). The ISR keeps
    its usable members, without any broker in ``unclean_shutdown`` (one that registered again
    without proof of a clean shutdown may have lost its unflushed tail), and may become empty:
    no keep-last. While it is below the topic's min ISR, the replicas that left it stay eligible
    (ELR), since the leader's high watermark does not advance under min ISR and so they hold
    every committed record; at min ISR the ELR and last known ELR are cleared. The leader is
    the current one if it stays in the ISR (unless ``prefer_replica_order``), else the first
    ISR member in replica order; only when the ISR is empty, the first usable ELR member, which
    becomes the ISR alone. Else an unclean election (if allowed) picks the first usable replica
    and clears the ELR; else the partition is offline (-1) until an eligible replica returns.
    The last known ELR is never elected: a replica that restarted uncleanly lands there."""
    replicas, unclean = partition.replicas, set(unclean_shutdown)
    isr = tuple(b for b in partition.isr if b in usable and b not in unclean)
    elr, last_known = eligible_replicas(partition, isr, unclean)
    if not prefer_replica_order and partition.leader in isr:
        return Election(partition.leader, isr, elr=elr, last_known_elr=last_known)
    for broker in replicas:
        if broker in isr:
            return Election(broker, isr, elr=elr, last_known_elr=last_known)
    if not isr:
        for broker in replicas:
            if broker in elr and broker in usable:
                rest = tuple(b for b in elr if b != broker)
                return Election(broker, (broker,), elr=rest, last_known_elr=last_known)
    unclean_choice = _elect_uncleanly(partition, usable, last_known) if unclean_allowed else None
    return unclean_choice or Election(NO_LEADER, isr, elr=elr, last_known_elr=last_known)


def _elect_uncleanly(
    partition: ElrPartition, usable: Collection[int], last_known: Sequence[int]
) -> Election | None:
    """An unclean election: the first usable replica, in replica order, that was in the last
    known ELR (it held the committed records once; with fsync on every append it still holds
    them), else the first usable replica (Kafka's ``electAnyLeader``). The ISR is it alone;
    the ELR and last known ELR are cleared. raftlog's one step towards KIP-966's unclean
    recovery, which would compare the survivors' logs."""
    known = set(partition.last_known_elr) | set(last_known)
    for preferred in (True, False):
        for broker in partition.replicas:
            if broker in usable and (broker in known or not preferred):
                return Election(broker, (broker,), unclean=True)
    return None  # no usable replica at all


def eligible_replicas(
    partition: ElrPartition, isr: tuple[int, ...], unclean: Collection[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ELR, last known ELR) for the target ``isr`` (Kafka's ``maybePopulateTargetElr``):
    the ELR is the old ELR and old ISR, less the new ISR and the unclean brokers; the last known
    ELR is the old last known ELR, old ELR and old ISR, less the new ISR and ELR. Both are
    empty once the ISR reaches min ISR. Replica order, replicas only."""
    if len(isr) >= partition.min_isr:
        return (), ()
    candidates = set(partition.elr) | set(partition.isr)
    elr = tuple(
        b for b in partition.replicas if b in candidates and b not in isr and b not in unclean
    )
    known = candidates | set(partition.last_known_elr)
    last_known = tuple(
        b for b in partition.replicas if b in known and b not in isr and b not in elr
    )
    return elr, last_known
