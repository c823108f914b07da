"""The controller shell: the replicated metadata state, the write path, timers.

:class:`MetadataState` is the Raft state machine on every controller: it decodes each committed
batch, replays it into the image and keeps a bounded history of recent records for brokers that
follow the metadata as deltas. :class:`QuorumController` is the writer: on the active controller
(the Raft leader) it turns requests into records with the pure ``generate_*`` functions, against
a *speculative* image (committed + proposed, so pipelined requests see each other), proposes them
as one Raft entry and answers when they commit. A newly active controller first commits a
``LeaderChange`` record, so its image holds everything earlier leaders committed, and grants every
broker a full session before fencing anyone.

The speculative image is only right while it is the committed image plus this controller's
proposals still in flight, in order. A write that fails (it timed out, the log refused it, a
record came back rejected at replay) or a Raft term that moved on breaks that: the entry may still
commit, or may be gone, or committed differently. The controller then stops serving writes and
activates again (Kafka's ``renounce`` and reload, without giving up the leadership): it commits a
new ``LeaderChange`` and starts from the committed image, which then holds every entry before it.
Generating on a diverged image loses acknowledged records (tests/metadata_quorum/
test_controller_resync.py): an ISR change timed out but committed after the controller had dropped
it from its image; the next change, computed on the old ISR, was rejected at replay but stayed in
the image; the one after passed the partition-epoch check (the epochs coincided) with an ISR
computed on that image, and made a replica that lacked the acknowledged records the leader (the
likely cause of 110 acknowledged records a CI chaos run lost after 72 rejections at replay).
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Protocol, TypeVar

from metadata_quorum.cluster import (
    BrokerSessions,
    generate_session_expiry,
    note_standby_heartbeat,
)
from metadata_quorum.codec import decode_batch, decode_snapshot, encode_batch, encode_snapshot
from metadata_quorum.configs import cluster_config
from metadata_quorum.features import check_voter_change_supported, generate_bootstrap_features
from metadata_quorum.image import MetadataDelta, MetadataImage, Rejected
from metadata_quorum.raft import MembershipChangeError, MetadataLogError, QuorumStatus
from metadata_quorum.records import ControllerVoter, LeaderChange, MetadataRecord
from metadata_quorum.replication import generate_preferred_rebalance
from metadata_quorum.voters import (
    current_voters,
    generate_add_voter,
    generate_remove_voter,
    reconcile_voters,
)
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

T = TypeVar("T")
# A hard cap on the history; what bounds it in practice is the compaction (`MetadataState`).
HISTORY_RECORDS_MAX = 100_000
WRITE_TIMEOUT_S = 10.0
TERM_MOVED_ON = "the Raft term moved on"


class NotControllerError(KafkaError):
    """NOT_CONTROLLER: this node is not the active controller (``leader_id`` if known)."""

    def __init__(self, leader_id: int) -> None:
        super().__init__(ErrorCode.NOT_CONTROLLER, f"the active controller is {leader_id}")
        self.leader_id = leader_id


@dataclass(frozen=True)
class AppliedBatch:
    """What replaying one Raft entry did: its first record's offset and the rejections."""

    first_offset: int
    rejected: tuple[Rejected, ...]


class MetadataState:
    """The replicated state machine: committed image + bounded history, on every controller.

    The history is the in-memory tail of the metadata log that FetchMetadata serves as deltas;
    a follower from before its oldest record gets the whole image instead. Kafka's metadata log
    may delete what its latest snapshot covers (its log start offset moves up to the snapshot)
    and a fetcher from before then fetches the snapshot (FetchSnapshot); the history follows the
    journal the same way: each compaction (`snapshot`, after which the journal is cut) drops the
    records the *previous* snapshot covers, so followers keep one compaction interval of deltas
    to catch up from. ``history_max`` is only a hard cap: alone, it let the history grow for as
    long as 100,000 records take to commit (10-17 hours at the soak's 100-175 records a minute
    from topic churn and ISR changes: ~0.6 MiB every 10 minutes in every controller,
    docs/soak.md#heap-profile).
    """

    def __init__(self, history_max: int = HISTORY_RECORDS_MAX) -> None:
        self._lock = threading.Condition()
        self._image = MetadataImage()
        self._history: collections.deque[tuple[int, MetadataRecord]] = collections.deque(
            maxlen=history_max
        )
        self._snapshot_offset = -1  # the image offset of the last snapshot taken or restored
        self._listeners: list[Callable[[MetadataImage], None]] = []
        self._closed = False  # the node is stopping: followers' waits end at once

    @property
    def image(self) -> MetadataImage:
        return self._image

    def close(self) -> None:
        """End every follower's wait in `updates_since` now. A FetchMetadata stream blocked
        there holds a thread of the server's pool until its max wait passes, and the process
        cannot exit before (the interpreter joins the pool's threads): seconds per stopping
        node."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def add_listener(self, listener: Callable[[MetadataImage], None]) -> None:
        self._listeners.append(listener)

    # -- StateMachine (called by the Raft log, in commit order) ------------------------------
    def apply(self, payload: bytes, index: int) -> object:
        records = decode_batch(payload)
        with self._lock:
            delta = MetadataDelta(self._image)
            first = self._image.offset + 1
            for record in records:
                delta.replay(record)
                self._history.append((delta.offset, record))
            self._image = delta.image()
            self._lock.notify_all()
            image = self._image
        for rejected in delta.rejected:
            log.info("metadata record at offset %d rejected: %s", rejected.offset, rejected.reason)
        for listener in self._listeners:
            listener(image)
        return AppliedBatch(first, tuple(delta.rejected))

    def snapshot(self) -> bytes:
        """The image as a snapshot; called by the compaction, which then cuts the journal. The
        history drops what the previous snapshot covers (class docstring)."""
        with self._lock:
            history = self._history
            while history and history[0][0] <= self._snapshot_offset:
                history.popleft()
            self._snapshot_offset = self._image.offset
            return encode_snapshot(self._image)

    def restore(self, data: bytes) -> None:
        image = decode_snapshot(data)
        with self._lock:
            self._image = image
            self._history.clear()
            self._snapshot_offset = image.offset
            self._lock.notify_all()

    def on_leader_change(self, leader: str | None, is_self: bool) -> None:
        """The controller polls leadership itself; nothing to do on the Raft thread."""

    # -- followers of the metadata -----------------------------------------------------------
    def updates_since(
        self, from_offset: int, wait_s: float
    ) -> tuple[MetadataImage | None, list[tuple[int, MetadataRecord]], int]:
        """Records at offsets >= ``from_offset`` (waiting up to ``wait_s`` for one), or the whole
        image when the history no longer reaches back that far. Returns (image or None, records,
        high offset)."""
        with self._lock:
            self._lock.wait_for(
                lambda: self._closed or self._image.offset >= from_offset, timeout=wait_s
            )
            high = self._image.offset
            if from_offset > high:
                return None, [], high
            oldest = self._history[0][0] if self._history else high + 1
            if from_offset < oldest:
                return self._image, [], high
            start = from_offset - oldest
            records = [self._history[i] for i in range(start, len(self._history))]
            return None, records, high


class MetadataLogLike(Protocol):
    def append(self, payload: bytes) -> Future[object]: ...
    def add_voter(self, address: str) -> Future[object]: ...
    def remove_voter(self, address: str) -> Future[object]: ...
    def transfer_leadership(self, address: str | None = None) -> None: ...
    def voters(self) -> frozenset[str]: ...
    def is_leader(self) -> bool: ...
    def leader(self) -> str | None: ...
    def status(self) -> QuorumStatus: ...
    def term(self) -> int: ...
    def close(self) -> None: ...


class QuorumController:
    """The write path and timers of one controller node."""

    def __init__(
        self,
        node_id: int,
        state: MetadataState,
        metadata_log: MetadataLogLike,
        leader_id_of: Callable[[str | None], int],
        session_timeout_ms: int = 9000,
        rebalance_interval_ms: int = 30_000,
        clock_ms: Callable[[], int] | None = None,
        rng: random.Random | None = None,
        static_voters: Sequence[ControllerVoter] = (),
    ) -> None:
        """``static_voters``: controller.quorum.voters, the set until the image records one."""
        self.node_id = node_id
        self.static_voters = tuple(static_voters)
        self._membership = threading.Lock()  # one voter change at a time, and no reconcile
        self.state = state
        self.log = metadata_log
        self._leader_id_of = leader_id_of
        self._clock_ms = clock_ms or (lambda: time.monotonic_ns() // 1_000_000)
        self.rng = rng or random.Random()
        self.sessions = BrokerSessions(session_timeout_ms)
        self._rebalance_interval_ms = rebalance_interval_ms
        self._write_lock = threading.Lock()
        self._speculative: MetadataImage | None = None  # set while active
        self._active_term = -1
        self._activation = 0  # bumped at each activation: a write's failure resyncs only its own
        self._stop = threading.Event()
        self._next_rebalance_ms = 0
        self._thread = threading.Thread(target=self._run, name=f"controller-{node_id}", daemon=True)
        # told every tick whether this controller serves: see `in_serving_quorum`
        self.on_serving: Callable[[bool], None] | None = None

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    # -- state -----------------------------------------------------------------------------
    def now_ms(self) -> int:
        return self._clock_ms()

    def note_standby_heartbeat(self, broker_id: int, broker_epoch: int, now_ms: int) -> bool:
        """As a standby, remember a broker's heartbeat for when this node becomes active."""
        with self._write_lock:
            if self._speculative is not None:
                return False  # active: heartbeats go through write()
            return note_standby_heartbeat(
                self.state.image, self.sessions, now_ms, broker_id, broker_epoch
            )

    @property
    def is_active(self) -> bool:
        return self._speculative is not None and self.log.is_leader()

    def quorum_status(self) -> QuorumStatus:
        return self.log.status()

    def active_controller_id(self) -> int:
        if self.is_active:
            return self.node_id
        return self._leader_id_of(self.log.leader())

    # -- the write path ----------------------------------------------------------------------
    def write(
        self, generate: Callable[[MetadataImage], tuple[Sequence[MetadataRecord], T]]
    ) -> tuple[T, int]:
        """Generate records against the speculative image, propose them, wait for the commit.
        Returns the generated response and the offset of the first record (-1 if none)."""
        with self._write_lock:
            image = self._speculative
            if image is None or not self.log.is_leader():
                raise NotControllerError(self._leader_id_of(self.log.leader()))
            if self.log.term() != self._active_term:
                self._drop_image(TERM_MOVED_ON, logging.INFO)  # a handover, an election
                raise NotControllerError(self._leader_id_of(self.log.leader()))
            records, response = generate(image)
            if not records:
                return response, -1
            delta = MetadataDelta(image)
            for record in records:
                delta.replay(record)
            if delta.rejected:
                raise AssertionError(f"generated a record that replays with: {delta.rejected[0]}")
            self._speculative = delta.image()
            activation = self._activation
            future = self.log.append(encode_batch(records))
        applied = self._wait(future, activation)
        if applied.rejected:
            reason = applied.rejected[0].reason
            self._resync(activation, f"a record it proposed was rejected at replay: {reason}")
            message = f"a concurrent change won: {reason}; retry"
            raise KafkaError(ErrorCode.REQUEST_TIMED_OUT, message)
        return response, applied.first_offset

    def _wait(self, future: Future[object], activation: int | None) -> AppliedBatch:
        """The applied batch of ``future``; a failure resyncs ``activation`` (None: none)."""
        try:
            result = future.result(timeout=WRITE_TIMEOUT_S)
        except FutureTimeout as error:
            self._resync(activation, "a write did not commit in time")
            raise KafkaError(ErrorCode.REQUEST_TIMED_OUT, "the write did not commit") from error
        except KafkaError as error:
            self._resync(activation, f"a write failed: {error}")
            raise
        except MetadataLogError as error:  # NotLeaderError, CommitTimeoutError, ...
            self._resync(activation, f"a write failed: {error!r}")
            if not self.log.is_leader():
                raise NotControllerError(self._leader_id_of(self.log.leader())) from error
            raise KafkaError(ErrorCode.REQUEST_TIMED_OUT, f"the write failed: {error}") from error
        if not isinstance(result, AppliedBatch):
            raise AssertionError(f"the state machine returns AppliedBatch, got {result!r}")
        return result

    def _resync(self, activation: int | None, why: str, level: int = logging.WARNING) -> None:
        """Stop serving writes on a speculative image that may no longer be the committed one
        plus the writes in flight (module docstring); the tick activates again. Only the
        activation that proposed the failed write: a later one's LeaderChange committed after
        that write, so its image already holds the write's outcome. ``level``: WARNING for a
        failure, INFO for a term change (every handover makes one)."""
        with self._write_lock:
            if activation == self._activation:
                self._drop_image(why, level)

    def _drop_image(self, why: str, level: int = logging.WARNING) -> None:
        """Under the write lock: no writes until the tick has activated this node again."""
        if self._speculative is not None:
            self._speculative = None
            log.log(level, "node %d activates again from the committed metadata: %s",
                    self.node_id, why)  # fmt: skip

    # -- leadership and timers ---------------------------------------------------------------
    def in_serving_quorum(self) -> bool:
        """What the CONTROLLER listener's health service says: SERVING while this node is a
        voter connected to a majority of the voters (itself included) and the quorum has a
        leader: its reads are current and its writes reach the active controller (here, or
        by its NOT_CONTROLLER hint). An observer, a node cut off from the majority, or a quorum
        in an election is NOT_SERVING, and so is a controller still replaying (see caught_up)."""
        status = self.log.status()
        voter = any(v.address == status.self_address for v in status.voters)
        return voter and status.has_quorum and status.leader is not None and status.caught_up

    def caught_up(self) -> bool:
        """Whether this controller's image may answer reads: the active controller's always; a
        standby's once it has applied the commit index a leader told it. A controller started
        again replays its journal for a while (Kafka's loader publishes nothing before this
        initial catch-up): a broker registered since the last persisted commit index is not in
        its image yet."""
        return self.is_active or self.log.status().caught_up

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            if self.on_serving is not None:
                self.on_serving(self.in_serving_quorum())
            try:
                self._tick()
            except KafkaError as error:
                log.info("controller tick: %s", error)

    def _tick(self) -> None:
        leading = self.log.is_leader()
        moved_on = self._speculative is not None and self.log.term() != self._active_term
        if leading and moved_on:
            self._resync(self._activation, TERM_MOVED_ON, logging.INFO)
        if leading and self._speculative is None:
            self._activate()
        elif not leading and self._speculative is not None:
            log.info("node %d is no longer the active controller", self.node_id)
            with self._write_lock:
                self._speculative = None
        if self._speculative is None:
            return
        self._reconcile_if_idle()
        # the bootstrap feature levels, once (Kafka writes them when it formats the log)
        self.write(lambda image: (generate_bootstrap_features(image), None))
        now = self.now_ms()
        expired = self.sessions.expired(self.state.image, now)
        if expired:
            silent = {b: now - self.sessions.last_contact_ms[b] for b in expired}
            log.warning("fencing brokers %s: no heartbeat for %s ms", expired, silent)
        self.write(lambda image: (generate_session_expiry(image, self.sessions, now), None))
        if now >= self._next_rebalance_ms:
            self._next_rebalance_ms = now + self._rebalance_interval_ms
            if cluster_config(self.state.image).auto_leader_rebalance_enable:
                self.write(lambda image: (generate_preferred_rebalance(image), None))

    def _activate(self) -> None:
        """Commit a LeaderChange so the image holds every earlier commit, then serve writes.
        Activated again within its term (a resync), the controller keeps the brokers' sessions
        and its rebalance timer."""
        term = self.log.status().term
        future = self.log.append(encode_batch([LeaderChange(self.node_id, term)]))
        try:
            self._wait(future, None)
        except KafkaError as error:
            log.info("activation in term %d failed: %s", term, error)
            return
        now = self.now_ms()
        with self._write_lock:
            if term != self._active_term:
                self.sessions.grant_all(list(self.state.image.brokers), now)
                self._next_rebalance_ms = now + self._rebalance_interval_ms
            self._speculative = self.state.image
            self._active_term = term
            self._activation += 1
        log.info("node %d is the active controller (term %d)", self.node_id, term)

    # -- controller membership (KIP-853; the decisions are in metadata_quorum.voters) -------
    def voters(self) -> tuple[ControllerVoter, ...]:
        return current_voters(self.state.image, self.static_voters)

    def add_voter(self, new: ControllerVoter) -> tuple[ControllerVoter, ...]:
        """AddRaftVoter: record the new voter in the image, then add it to the Raft
        configuration; the voters after the change."""
        with self._membership:
            self._require_active()
            self._require_kraft_version("adding")
            self._reconcile()
            record = generate_add_voter(self.voters(), new, self._live_raft())
            self.write(lambda image: ([record], None))
            self._await_membership(self.log.add_voter(new.raft_address))
            log.info("controller %d added voter %s", self.node_id, new)
            return self.voters()

    def remove_voter(self, node_id: int) -> tuple[ControllerVoter, ...]:
        """RemoveRaftVoter: take the voter out of the Raft configuration, then out of the
        image. The active controller does not remove itself: it hands leadership over and
        answers NOT_CONTROLLER, and the client retries on the new active controller."""
        with self._membership:
            self._require_active()
            self._require_kraft_version("removing")
            self._reconcile()
            leaving, _ = generate_remove_voter(self.voters(), node_id, self._live_raft())
            if leaving.raft_address == self.log.status().self_address:
                self.log.transfer_leadership()
                raise NotControllerError(self.node_id)
            self._await_membership(self.log.remove_voter(leaving.raft_address))
            self._reconcile()
            log.info("controller %d removed voter %s", self.node_id, leaving)
            return self.voters()

    def _require_active(self) -> None:
        if not self.is_active:
            raise NotControllerError(self.active_controller_id())

    def _require_kraft_version(self, change: str) -> None:
        """kraft.version 1 or UNSUPPORTED_VERSION (KIP-853). A new cluster's bootstrap levels
        (kraft.version 1) are written first, so a change asked for right after the first
        election is not refused for a level the cluster is about to have."""
        self.write(lambda image: (generate_bootstrap_features(image), None))
        with self._write_lock:
            image = self._speculative
        if image is None:
            raise NotControllerError(self._leader_id_of(self.log.leader()))
        check_voter_change_supported(image, change)

    def _live_raft(self) -> list[str]:
        return [v.address for v in self.log.status().voters if v.connected]

    def _await_membership(self, future: Future[object]) -> None:
        try:
            future.result(timeout=WRITE_TIMEOUT_S)
        except FutureTimeout as error:
            raise KafkaError(
                ErrorCode.REQUEST_TIMED_OUT, "the voter change did not commit in time"
            ) from error
        except MembershipChangeError as error:
            raise KafkaError(
                ErrorCode.REQUEST_TIMED_OUT, "another voter change is not committed yet; retry"
            ) from error
        except MetadataLogError as error:
            raise NotControllerError(self._leader_id_of(self.log.leader())) from error

    def _reconcile(self) -> None:
        """Make the image's voters the Raft configuration (see metadata_quorum.voters)."""
        raft = self.log.voters()
        self.write(lambda image: _as_records(reconcile_voters(image, self.static_voters, raft)))

    def _reconcile_if_idle(self) -> None:
        if self._membership.acquire(blocking=False):
            try:
                self._reconcile()
            finally:
                self._membership.release()


def _as_records(record: MetadataRecord | None) -> tuple[list[MetadataRecord], None]:
    return ([record] if record is not None else []), None
