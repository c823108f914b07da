"""The leaders' ISR changes on their way to the controller: Kafka's ``AlterPartitionManager``
(what is sent, when) and ``Partition.handleAlterPartitionError`` (what a refusal means to the
leader), as plain data the broker's AlterPartition thread drives.

- **One change per partition on the way.** A change for a partition that still has one unsent
  or in flight is not queued: the leader hears OPERATION_NOT_ATTEMPTED, drops its pending state
  and proposes again on a later fetch (Kafka's ``unsentIsrUpdates.putIfAbsent``).
- **Batched, one request at a time.** Every unsent change (up to ``max_items``) goes in the next
  AlterPartition request; a change leaves only once the controller answered for it, so a
  request that failed as a whole (no controller, a deadline) is sent again, with the changes
  proposed since, and a change the answer does not mention goes again too.
- **A stale leader waits for the metadata.** A refusal that says the leader's view of the
  partition is behind the controller's (INVALID_UPDATE_VERSION: the partition epoch moved;
  FENCED_LEADER_EPOCH, an unknown topic or partition, a leader the controller no longer knows)
  keeps the change pending: no new proposal, no shrink, the high watermark waiting on the larger
  set, until the broker's metadata brings the partition's newer epoch (or a new leadership),
  which resets the state. Retrying on a timer instead proposed against the same stale epoch
  again and again while the metadata that would fix it was still on its way: at 10,000
  partitions one broker had 339,575 such refusals, and a restarted broker never got back into
  its leaders' ISRs. The controller's other refusals (OPERATION_NOT_ATTEMPTED,
  INELIGIBLE_REPLICA: the partition epoch is right, the change was not applied) reset the
  pending state; the next proposal waits a short backoff (Kafka proposes again on the next
  fetch; the backoff keeps a leader whose view of the fenced brokers lags from proposing on
  every fetch).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Hashable
from typing import Generic, TypeVar

from raftlog.errors import ErrorCode


class Refusal(enum.Enum):
    AWAIT_METADATA = "await-metadata"  # keep the change pending until newer metadata resets it
    RESET = "reset"  # back to the committed state; propose again after a backoff


# Kafka's handleAlterPartitionError answers these with "awaiting new the latest metadata";
# NOT_LEADER_OR_FOLLOWER is ours for a leader the controller moved (Kafka: INVALID_REQUEST).
AWAIT_METADATA_ERRORS = frozenset(
    {
        ErrorCode.INVALID_UPDATE_VERSION,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.NEW_LEADER_ELECTED,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
    }
)


def refusal(error: ErrorCode) -> Refusal:
    """What the leader does with its pending ISR change when the controller refused it."""
    return Refusal.AWAIT_METADATA if error in AWAIT_METADATA_ERRORS else Refusal.RESET


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class PendingChanges(Generic[K, V]):
    """The unsent and in-flight changes, one per key (a partition), in submission order.

    Bounded by the partitions the broker leads: a key holds at most one change."""

    def __init__(self) -> None:
        self._changes: dict[K, V] = {}
        self._added = threading.Condition()

    def __len__(self) -> int:
        with self._added:
            return len(self._changes)

    def submit(self, key: K, change: V) -> bool:
        """Queue ``change``; False if ``key`` already has one unsent or in flight."""
        with self._added:
            if key in self._changes:
                return False
            self._changes[key] = change
            self._added.notify()
            return True

    def take(self, max_items: int, timeout_s: float) -> list[tuple[K, V]]:
        """The changes to send next (they stay until ``done``); waits up to ``timeout_s`` for
        one, and returns nothing if none came."""
        with self._added:
            if not self._changes:
                self._added.wait(timeout_s)
            taken: list[tuple[K, V]] = []
            for item in self._changes.items():
                if len(taken) >= max_items:
                    break
                taken.append(item)
            return taken

    def done(self, key: K, change: V) -> None:
        """The controller answered for ``change`` (or it is no longer wanted): it leaves."""
        with self._added:
            if self._changes.get(key) is change:
                del self._changes[key]
