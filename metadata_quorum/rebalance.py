"""A balanced reassignment plan that moves as little as it can: what
``raftlog partitions reassign --generate`` proposes (pure; no image, no IO). And the plan that
drains one broker (:func:`plan_drain`), what ``raftlog cluster remove-node`` carries out.

Kafka's kafka-reassign-partitions ``--generate`` places every partition afresh, so nearly every
replica moves. This planner keeps every replica it can: each broker ends with ``floor(total / n)``
or one more replicas (``total mod n`` brokers get the extra one), a replica stays where it is
while its broker is under that quota, and the missing replicas go to the least-loaded brokers
that do not hold the partition yet. Then preferred leaders (the first replica) are balanced the
same way: a partition keeps its preferred leader while that broker is under its leader quota,
else the least-loaded member of its replicas takes the lead. Replication factors do not change.

Cordoned brokers (``raftlog cluster cordon``) take no new replica in either plan: one may keep
replicas it holds (within its quota) and the leaderships of those, never gain one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence

from raftlog.errors import ErrorCode, KafkaError

Partition = tuple[str, int]


def plan_reassignment(
    current: Mapping[Partition, Sequence[int]],
    brokers: Sequence[int],
    cordoned: Collection[int] = (),
) -> dict[Partition, tuple[int, ...]]:
    """Target replicas for every partition of ``current``, on ``brokers`` only; those of
    ``brokers`` that are ``cordoned`` may keep replicas, never gain one."""
    targets = sorted(set(brokers))
    if not set(targets) - set(cordoned):
        raise KafkaError(ErrorCode.INVALID_REQUEST, "no uncordoned brokers to place replicas on")
    widest = max((len(r) for r in current.values()), default=0)
    if widest > len(targets):
        raise KafkaError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"a replication factor of {widest} needs at least {widest} brokers, not {len(targets)}",
        )
    kept = _keep(current, targets)
    placed = _fill(current, kept, targets, frozenset(cordoned))
    _even_out(current, placed, targets, frozenset(cordoned))
    return _balance_leaders(_order_leaders(current, placed, targets), targets)


def plan_drain(
    current: Mapping[Partition, Sequence[int]],
    leaving: int,
    brokers: Sequence[int],
    cordoned: Collection[int] = (),
) -> dict[Partition, tuple[int, ...]]:
    """Targets that move every replica off ``leaving`` and nothing else (``raftlog cluster
    remove-node``): in each partition of ``current`` that has one, the replica on ``leaving`` is
    replaced by the broker of ``brokers`` holding the fewest replicas that does not hold the
    partition yet (the lowest id on a tie); where ``leaving`` was the preferred leader, the
    member that is the preferred leader of the fewest partitions takes its place (the
    replicas already there first on a tie). Partitions without a replica on it are left out.
    A ``cordoned`` broker receives none of them."""
    remaining = sorted(set(brokers) - {leaving} - set(cordoned))
    replicas = Counter(b for r in current.values() for b in r if b != leaving)
    leaders = Counter(r[0] for r in current.values() if r and r[0] != leaving)
    plan: dict[Partition, tuple[int, ...]] = {}
    for tp in sorted(current):
        members = tuple(current[tp])
        if leaving not in members:
            continue
        free = [b for b in remaining if b not in members]
        if not free:
            raise KafkaError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"{tp[0]}-{tp[1]} has {len(members)} replicas: moving the one on broker "
                f"{leaving} needs another broker, and only {remaining} remain",
            )
        new = min(free, key=lambda b: (replicas[b], b))
        replicas[new] += 1
        if members[0] != leaving:
            plan[tp] = tuple(new if b == leaving else b for b in members)
            continue
        candidates = [*(b for b in members if b != leaving), new]
        leader = min(candidates, key=lambda b: (leaders[b], candidates.index(b)))
        leaders[leader] += 1
        plan[tp] = (leader, *(b for b in candidates if b != leader))
    return plan


def _quotas(total: int, brokers: Sequence[int]) -> tuple[int, int]:
    """(floor, number of brokers that may hold one more)."""
    return total // len(brokers), total % len(brokers)


def _keep(
    current: Mapping[Partition, Sequence[int]], targets: Sequence[int]
) -> dict[Partition, list[int]]:
    """The replicas that stay: up to the floor per broker, then the extra ones for the brokers
    that would otherwise move the most."""
    floor, extra = _quotas(sum(len(r) for r in current.values()), targets)
    allowed = set(targets)
    count: Counter[int] = Counter()
    kept: dict[Partition, list[int]] = {tp: [] for tp in current}
    over: dict[int, list[Partition]] = {}
    for tp in sorted(current):
        for broker in current[tp]:
            if broker not in allowed:
                continue
            if count[broker] < floor:
                kept[tp].append(broker)
                count[broker] += 1
            else:
                over.setdefault(broker, []).append(tp)
    # each broker may keep one more replica, for ``extra`` brokers: those with candidates
    for broker in sorted(over, key=lambda b: (-len(over[b]), b))[:extra]:
        kept[over[broker][0]].append(broker)
    return kept


def _fill(
    current: Mapping[Partition, Sequence[int]],
    kept: Mapping[Partition, list[int]],
    targets: Sequence[int],
    cordoned: frozenset[int],
) -> dict[Partition, list[int]]:
    """Each partition's missing replicas on the least-loaded uncordoned brokers it does not
    use yet."""
    floor, extra = _quotas(sum(len(r) for r in current.values()), targets)
    count = Counter(b for replicas in kept.values() for b in replicas)
    placed = {tp: list(replicas) for tp, replicas in kept.items()}
    for tp in sorted(current):
        while len(placed[tp]) < len(current[tp]):
            at_extra = sum(1 for b in targets if count[b] > floor)
            cap = floor + 1 if at_extra < extra else floor
            free = [b for b in targets if b not in placed[tp] and b not in cordoned]
            if not free:
                raise KafkaError(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"{tp[0]}-{tp[1]} needs {len(current[tp])} replicas: too few uncordoned "
                    f"brokers among {list(targets)} (cordoned: {sorted(cordoned)})",
                )
            under = [b for b in free if count[b] < cap] or free
            broker = min(under, key=lambda b: (count[b], b))
            placed[tp].append(broker)
            count[broker] += 1
    return placed


def _even_out(
    current: Mapping[Partition, Sequence[int]],
    placed: dict[Partition, list[int]],
    targets: Sequence[int],
    cordoned: frozenset[int],
) -> None:
    """Where filling could not stay within one of even (the brokers with room already held the
    partition), move a replica from the fullest broker to the emptiest uncordoned one,
    preferring one that was placed, not kept. Each step narrows the spread, so this ends."""
    count = Counter(b for replicas in placed.values() for b in replicas)
    open_targets = [b for b in targets if b not in cordoned]
    while True:
        high = max(targets, key=lambda b: (count[b], -b))
        low = min(open_targets, key=lambda b: (count[b], b))
        if count[high] - count[low] <= 1:
            return
        movable = [tp for tp in sorted(placed) if high in placed[tp] and low not in placed[tp]]
        tp = min(movable, key=lambda t: (high in current[t], t))  # pigeonhole: never empty
        placed[tp][placed[tp].index(high)] = low
        count[high] -= 1
        count[low] += 1


def _balance_leaders(
    plan: dict[Partition, tuple[int, ...]], targets: Sequence[int]
) -> dict[Partition, tuple[int, ...]]:
    """Preferred leaders within one of even where the replica sets allow: shift leadership
    along a chain of partitions (a leads one that b replicates, b leads one that c
    replicates...) from the broker that leads the most to one that leads at least two fewer."""
    leaders = Counter(replicas[0] for replicas in plan.values())
    while True:
        path = None
        for start in sorted(targets, key=lambda b: (-leaders[b], b)):
            path = _leader_path(plan, leaders, start)
            if path is not None:
                break
        if path is None:
            return plan
        for tp, new_leader in path:
            replicas = plan[tp]
            plan[tp] = (new_leader, *[b for b in replicas if b != new_leader])
        leaders[start] -= 1
        leaders[path[-1][1]] += 1


def _leader_path(
    plan: Mapping[Partition, tuple[int, ...]], leaders: Counter[int], start: int
) -> list[tuple[Partition, int]] | None:
    """The shortest chain of leadership moves from ``start`` to a broker leading at least two
    fewer partitions (breadth first), or None."""
    led: dict[int, list[Partition]] = {}
    for tp in sorted(plan):
        led.setdefault(plan[tp][0], []).append(tp)
    came: dict[int, tuple[int, Partition] | None] = {start: None}
    frontier = [start]
    while frontier:
        following: list[int] = []
        for broker in frontier:
            for tp in led.get(broker, []):
                for other in plan[tp][1:]:
                    if other in came:
                        continue
                    came[other] = (broker, tp)
                    if leaders[other] <= leaders[start] - 2:
                        return _path_to(came, other)
                    following.append(other)
        frontier = following
    return None


def _path_to(
    came: Mapping[int, tuple[int, Partition] | None], end: int
) -> list[tuple[Partition, int]]:
    path: list[tuple[Partition, int]] = []
    broker = end
    while (step := came[broker]) is not None:
        previous, tp = step
        path.append((tp, broker))
        broker = previous
    return path[::-1]


def _order_leaders(
    current: Mapping[Partition, Sequence[int]],
    placed: Mapping[Partition, list[int]],
    targets: Sequence[int],
) -> dict[Partition, tuple[int, ...]]:
    """The first replica is the preferred leader: keep the current one while its broker is
    under the leader quota, else the least-loaded member leads. The rest keep their order."""
    floor, extra = _quotas(len(placed), targets)
    leaders: Counter[int] = Counter()
    out: dict[Partition, tuple[int, ...]] = {}
    for tp in sorted(placed):
        members = placed[tp]
        at_extra = sum(1 for b in targets if leaders[b] > floor)
        cap = floor + 1 if at_extra < extra else floor
        was = current[tp][0] if current[tp] else None
        if was in members and leaders[was] < cap:
            leader = was
        else:
            leader = min(members, key=lambda b: (leaders[b], members.index(b)))
        leaders[leader] += 1
        previous = [b for b in current[tp] if b in members and b != leader]
        added = [b for b in members if b not in previous and b != leader]
        out[tp] = (leader, *previous, *added)
    return out
