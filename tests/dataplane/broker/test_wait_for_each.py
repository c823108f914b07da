"""``wait_for_each``: an acks=all produce to many partitions asks each partition again only when
that partition woke it. Asking every pending partition at each wake-up was quadratic: with
1,000 partitions a produce request took ~1 s of it on an idle cluster."""

from __future__ import annotations

import threading
import time

from dataplane.broker.partition import Waker
from dataplane.broker.service import wait_for_each


class FakePartition:
    """A partition's waiter registry, as Partition keeps it."""

    def __init__(self) -> None:
        self.waiters: dict[Waker, int | None] = {}

    def add_waiter(self, event: Waker, high_watermark: int | None = None) -> None:
        self.waiters[event] = high_watermark

    def remove_waiter(self, event: Waker) -> None:
        self.waiters.pop(event, None)

    def wake(self) -> None:
        for waker in list(self.waiters):
            waker.set()


def test_each_partition_is_asked_at_first_then_only_when_it_woke_the_waiter() -> None:
    partitions = [FakePartition() for _ in range(100)]
    done: set[int] = set()
    asked: list[int] = []
    lock = threading.Lock()

    def settled(index: int) -> bool:
        with lock:
            asked.append(index)
            return index in done

    def replicate() -> None:
        deadline = time.monotonic() + 5
        for index, partition in enumerate(partitions):
            while not partition.waiters:  # the waiter's registration, polled with a deadline
                assert time.monotonic() < deadline, "the waiter never registered"
                time.sleep(0.001)
            with lock:
                done.add(index)
            partition.wake()

    replicator = threading.Thread(target=replicate)
    replicator.start()
    pending = wait_for_each(
        partitions,  # type: ignore[arg-type]
        time.monotonic() + 10,
        settled,
        [1] * len(partitions),
    )
    replicator.join()
    assert pending == set()
    assert sorted(set(asked)) == list(range(100))
    assert len(asked) <= 2 * len(partitions), f"{len(asked)} askings for 100 partitions"
    assert all(not p.waiters for p in partitions)  # every waker removed


def test_the_ones_not_settled_by_the_deadline_are_returned() -> None:
    partitions = [FakePartition() for _ in range(3)]
    pending = wait_for_each(
        partitions,  # type: ignore[arg-type]
        time.monotonic() + 0.05,
        lambda index: index == 1,
        [1, 1, 1],
    )
    assert pending == {0, 2}
    assert all(not p.waiters for p in partitions)
