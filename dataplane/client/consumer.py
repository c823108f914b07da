"""The consumer: ``subscribe`` (a consumer group) or ``assign``, ``poll``, commits, offsets.

Kafka's settings (``group.id``, ``enable.auto.commit``, ``auto.commit.interval.ms``,
``max.poll.interval.ms``, ``fetch.min.bytes``, ``fetch.max.wait.ms``, ``fetch.max.bytes``,
``max.partition.fetch.bytes``, ``max.poll.records``, ``auto.offset.reset``,
``request.timeout.ms``) with underscores. Not thread-safe, like Kafka's: one thread polls.

**Groups** (KIP-848). ``subscribe(topics | pattern, listener)`` joins ``group_id``; a background
thread heartbeats (see :mod:`dataplane.client._group`) and ``poll`` reconciles the assignment
towards what the coordinator says: revoked partitions first (their positions committed when
auto-commit is on, then ``on_partitions_revoked``), then new ones (starting at their committed
offsets, else ``auto.offset.reset``, then ``on_partitions_assigned``). Partitions that do not
move are fetched throughout. A fenced member gets ``on_partitions_lost`` and rejoins. Commits
carry the member id and epoch; with ``assign`` and a ``group_id`` they are administrative
commits (epoch -1), accepted while the group has no members. ``close`` commits (auto-commit),
revokes and leaves the group. With ``group_instance_id`` (KIP-345) the member is static: its
leave (epoch -2) only says it is away, the coordinator keeps its partitions for it until
``group.consumer.session.timeout.ms`` runs out, and a consumer started again with the same
instance id within that time takes them back without a rebalance.

``poll`` sends one Fetch per leader broker covering all its assigned partitions (concurrently,
as asynchronous unary calls), decodes the returned RecordBatch v2 bytes, drops records below
the fetch position (a batch can start before it) and keeps what exceeds ``max.poll.records``
for the next poll. A partition with buffered records is not fetched again until they are
returned. The position is the offset of the next record ``poll`` returns.

Transactions: ``isolation_level="read_committed"`` fetches up to the last stable offset (the
first offset of the earliest open transaction) and drops the records of aborted transactions
(see ``_read_committed``); ``end_offsets``, the "latest" reset and :meth:`Consumer.current_lag`
use the last stable offset too. The default, "read_uncommitted" (Kafka's), reads up to the high
watermark, aborted records included. Control batches (transaction markers) are never returned
as records, at either level; they still take offsets, so positions skip them.
``group_metadata()`` is what ``Producer.send_offsets_to_transaction`` takes.

Errors per partition: OFFSET_OUT_OF_RANGE applies ``auto.offset.reset`` (``"none"`` raises);
NOT_LEADER_OR_FOLLOWER, UNKNOWN_LEADER_EPOCH, FENCED_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION,
LEADER_NOT_AVAILABLE and network failures refresh metadata and fetch again (from the new
leader, with its epoch as ``current_leader_epoch``); other non-retriable errors raise
``KafkaError`` from ``poll``. After a leader change a position is validated with the new leader
before it is fetched again (KIP-320, see ``_validation``): a log truncated below it moves it back
to the divergence, or raises :class:`LogTruncationError` with ``auto.offset.reset`` none.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, TypeVar

import grpc

from dataplane.client._closing import Closing
from dataplane.client._cluster import Cluster, ClusterSnapshot, SecuritySetting, rpc_error
from dataplane.client._config import ConsumerConfig
from dataplane.client._group import GroupClient, Membership, commit_request
from dataplane.client._read_committed import drop_aborted
from dataplane.client._types import (
    ConsumerGroupMetadata,
    ConsumerRebalanceListener,
    ConsumerRecord,
    OffsetAndMetadata,
    TopicPartition,
)
from dataplane.client._validation import LogTruncationError, ValidationRequest, validate
from protos import broker_pb2 as pb
from protos import group_pb2 as gpb
from protos.wire import FetchAnswer, Records, each_partition
from raftlog.batch import HEADER_SIZE, BatchHeader, check_header, read_header
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import ParsedRecord, RecordsBuilder, decode_batch_as

__all__ = ["Consumer", "FetchedBatches", "LogTruncationError"]
log = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
CONSUMER_REPLICA_ID = -1
LEADER_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.REPLICA_NOT_AVAILABLE,
    }
)
Reset = Literal["earliest", "latest"]
PartitionLike = TopicPartition | tuple[str, int]


@dataclass
class _PartitionState:
    position: int | None  # None = to be reset with `reset`
    reset: Reset | None
    buffer: deque[ConsumerRecord] = field(default_factory=deque)
    buffer_end: int = -1  # the position once the buffer is returned (-1: nothing decoded)
    high_watermark: int = -1
    last_stable_offset: int = -1  # from the last fetch answer (-1: none yet)
    paused: bool = False
    from_committed: bool = False  # assigned with a group: start at the committed offset
    # fetched, not yet decoded (poll) or returned (poll_batches); at most one per partition
    fetched: FetchedBatches | None = None
    # KIP-320 (see _validation): the leader epoch of the record before the position (-1:
    # none, e.g. after a seek: not validated), of the record before buffer_end, and the
    # partition's leader epoch the position was last fetched or validated under
    offset_epoch: int = -1
    buffer_end_epoch: int = -1
    leader_epoch: int = -1

    def fetch_offset(self) -> int | None:
        """Where the next fetch starts: after what is held (fetched, decoded), else the
        position; None while the position is to be reset."""
        if self.position is None:
            return None
        if self.fetched is not None:
            return self.fetched.next_offset
        return max(self.position, self.buffer_end)

    def clear(self) -> None:
        """Drop what is held (a seek or a reset)."""
        self.buffer.clear()
        self.buffer_end = -1
        self.buffer_end_epoch = -1
        self.fetched = None

    def needs_validation(self, leader_epoch: int) -> bool:
        """KIP-320: the leader changed since the position was fetched, and the position has
        an epoch to validate against the new leader's log."""
        return (
            self.offset_epoch >= 0
            and leader_epoch >= 0
            and leader_epoch != self.leader_epoch
            and self.position is not None
        )


@dataclass(slots=True)
class _InFlightFetch:
    """A Fetch sent to one leader and not yet handled (at most one per leader, as Kafka)."""

    offsets: dict[TopicPartition, int]  # the partitions asked for, at these positions
    call: grpc.Future


class FetchedBatches(NamedTuple):
    """What :meth:`Consumer.poll_batches` returns for one partition: the whole RecordBatch v2
    batches of one fetch, not decoded (nor CRC-checked: the decoder does that). Records below
    ``fetch_offset`` are the caller's to drop (a batch can start before it), and so are control
    batches; ``next_offset`` is where the next fetch starts. With read_committed the batches of
    aborted transactions are already left out."""

    tp: TopicPartition
    data: bytes
    fetch_offset: int
    next_offset: int
    last_epoch: int = -1  # the partitionLeaderEpoch of the last batch (-1: no batch)


_Drained = TypeVar("_Drained", dict[TopicPartition, list[ConsumerRecord]], list[FetchedBatches])


def whole_batches(tp: TopicPartition, data: bytes, fetch_offset: int) -> FetchedBatches:
    """The whole batches at the start of ``data`` and the offset to fetch next, from the batch
    headers alone. A torn batch at the end (the fetch was cut at its byte limit) is left out;
    a header that breaks the framing rules raises."""
    next_offset = fetch_offset
    last_epoch = -1
    position = 0
    while len(data) - position >= HEADER_SIZE:
        header = read_header(data, position)
        if header.size_bytes > len(data) - position:
            break
        check_header(header, len(data) - position)
        next_offset = max(next_offset, header.next_offset)
        last_epoch = header.partition_leader_epoch
        position += header.size_bytes
    if position == 0 and data:
        raise KafkaError(
            ErrorCode.RECORD_LIST_TOO_LARGE,
            f"{tp}: no whole batch at offset {fetch_offset} in {len(data)} bytes; raise "
            "max.partition.fetch.bytes (brokers should return at least one whole batch)",
        )
    whole = data if position == len(data) else data[:position]
    return FetchedBatches(tp, whole, fetch_offset, next_offset, last_epoch)


def decode_fetched(fetched: FetchedBatches) -> list[ConsumerRecord]:
    """The records at or after the fetch offset in the fetched whole batches (see
    :func:`whole_batches`); a corrupt batch raises. Control batches are skipped."""
    tp, fetch_offset = fetched.tp, fetched.fetch_offset
    records: list[ConsumerRecord] = []
    position = 0
    while position < len(fetched.data):
        header = read_header(fetched.data, position)
        if header.next_offset > fetch_offset and not header.is_control:
            _, batch = decode_batch_as(fetched.data, position, _consumer_record_builder(tp, header))
            if header.base_offset < fetch_offset:  # only a fetch's first batch can start before
                batch = [record for record in batch if record.offset >= fetch_offset]
            records.extend(batch)
        position += header.size_bytes
    return records


def _consumer_record_builder(
    tp: TopicPartition, header: BatchHeader
) -> RecordsBuilder[ConsumerRecord]:
    """Builds a batch's ConsumerRecords, each a tuple made straight from its fields."""
    topic, partition, epoch = tp.topic, tp.partition, header.partition_leader_epoch
    timestamp_type = int(header.timestamp_type)
    new = tuple.__new__

    def build(parsed: Iterator[ParsedRecord]) -> list[ConsumerRecord]:
        return [
            new(
                ConsumerRecord,
                (
                    topic, partition, r.offset, r.timestamp, timestamp_type, r.key, r.value,
                    tuple(h) if (h := r.headers) else (), epoch,
                ),
            )
            for r in parsed
        ]  # fmt: skip

    return build


class Consumer(Closing):
    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        fetch_min_bytes: int = 1,
        fetch_max_wait_ms: int = 500,
        fetch_max_bytes: int = 50 * 1024 * 1024,
        max_partition_fetch_bytes: int = 1024 * 1024,
        max_poll_records: int = 500,
        auto_offset_reset: Literal["latest", "earliest", "none"] = "latest",
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        metadata_max_age_ms: int = 300_000,
        group_id: str | None = None,
        group_instance_id: str | None = None,
        client_id: str = "raftlog-consumer",
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        max_poll_interval_ms: int = 300_000,
        isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted",
        clock: Callable[[], float] = time.monotonic,
        security: SecuritySetting = None,
    ) -> None:
        self.config = ConsumerConfig(
            group_id=group_id,
            group_instance_id=group_instance_id,
            client_id=client_id,
            enable_auto_commit=enable_auto_commit,
            auto_commit_interval_ms=auto_commit_interval_ms,
            max_poll_interval_ms=max_poll_interval_ms,
            fetch_min_bytes=fetch_min_bytes,
            fetch_max_wait_ms=fetch_max_wait_ms,
            fetch_max_bytes=fetch_max_bytes,
            max_partition_fetch_bytes=max_partition_fetch_bytes,
            max_poll_records=max_poll_records,
            auto_offset_reset=auto_offset_reset,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            metadata_max_age_ms=metadata_max_age_ms,
            isolation_level=isolation_level,
        )
        self._clock = clock
        self._cluster = Cluster(
            bootstrap_servers,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            metadata_max_age_ms=metadata_max_age_ms,
            clock=clock,
            security=security,
        )
        self._request_timeout_s = request_timeout_ms / 1000
        self._states: dict[TopicPartition, _PartitionState] = {}
        self._fetches: dict[str, _InFlightFetch] = {}  # by leader address
        self._closed = threading.Event()
        self._group = (
            None if group_id is None else GroupClient(self._cluster, group_id, self._closed, clock)
        )
        self._membership: Membership | None = None
        self._listener = ConsumerRebalanceListener()
        self._subscription: tuple[tuple[str, ...], str] | None = None
        self._next_auto_commit = clock() + auto_commit_interval_ms / 1000
        self._async_commits = ThreadPoolExecutor(1, thread_name_prefix="consumer-commit")

    # -- assignment and positions ----------------------------------------------------------
    def assign(self, partitions: Iterable[PartitionLike]) -> None:
        """Replace the assignment. Kept partitions keep their positions; new ones start at
        ``auto.offset.reset`` unless ``seek`` says otherwise."""
        if self._subscription is not None:
            raise ValueError("assign() after subscribe(): call unsubscribe() first")
        wanted = [TopicPartition(str(t), int(p)) for t, p in partitions]
        previous = self._states
        self._states = {tp: previous.get(tp) or self._new_state() for tp in wanted}
        for tp in set(wanted) - set(previous):
            # With a group, an assigned partition starts at the group's committed offset.
            self._states[tp].from_committed = self._group is not None
        self._cluster.add_topics(tp.topic for tp in wanted)

    def _new_state(self) -> _PartitionState:
        reset = None if self.config.auto_offset_reset == "none" else self.config.auto_offset_reset
        return _PartitionState(position=None, reset=reset)

    # -- groups ----------------------------------------------------------------------------
    def subscribe(
        self,
        topics: Iterable[str] = (),
        *,
        pattern: str | None = None,
        listener: ConsumerRebalanceListener | None = None,
    ) -> None:
        """Join ``group_id`` for ``topics`` or the topics matching ``pattern`` (a regular
        expression over topic names, matched by the coordinator, so new topics join in)."""
        names = tuple(sorted(set(topics)))
        if self._group is None:
            raise ValueError("subscribe() needs a group_id")
        if bool(names) == bool(pattern):
            raise ValueError("subscribe() takes topic names or a pattern, not both or neither")
        if self._subscription is None and self._states:
            raise ValueError("subscribe() after assign(): call unsubscribe() first")
        self._subscription = (names, pattern or "")
        self._listener = listener or ConsumerRebalanceListener()
        if self._membership is None:
            self._membership = Membership(
                self._group,
                client_id=self.config.client_id,
                rebalance_timeout_ms=self.config.max_poll_interval_ms,
                max_poll_interval_ms=self.config.max_poll_interval_ms,
                request_timeout_s=self._request_timeout_s,
                clock=self._clock,
                instance_id=self.config.group_instance_id or "",
            )
        self._cluster.add_topics(names)
        self._membership.subscribe(names, pattern or "")

    def subscription(self) -> set[str]:
        return set() if self._subscription is None else set(self._subscription[0])

    def unsubscribe(self) -> None:
        """Give up every partition (committing first with auto-commit) and leave the group."""
        self._leave_group()
        self._states = {}

    def _leave_group(self) -> None:
        membership = self._membership
        if membership is None:
            return
        owned = set(self._states)
        if owned:
            self._maybe_commit_before_revoking(owned)
            self._listener.on_partitions_revoked(owned)
        membership.leave()
        self._membership = None
        self._subscription = None

    def _reconcile(self) -> None:
        """Move the owned partitions towards the coordinator's target (the poll thread)."""
        membership = self._membership
        if membership is None:
            return
        membership.polled()
        target, number, lost = membership.state()
        owned = frozenset(self._states)
        if lost:
            for tp in owned:
                del self._states[tp]
            self._listener.on_partitions_lost(set(owned))
            membership.owned(frozenset(), reconciled=None, released_all=True)
            return
        if target is None:
            return
        revoked = owned - target
        if revoked:
            # Still owned while the listener runs, so it can commit them.
            self._maybe_commit_before_revoking(revoked)
            self._listener.on_partitions_revoked(set(revoked))
            for tp in revoked:
                del self._states[tp]
        added = target - owned
        if added:
            for tp in added:
                # Starts at the group's committed offset, fetched (stable, KIP-447) before
                # the partition's first fetch, or at a seek the listener makes.
                self._states[tp] = self._new_state()
                self._states[tp].from_committed = True
            self._cluster.add_topics(tp.topic for tp in added)
        # Reported when the partitions changed, and also when only the target did: one that
        # grew and shrank back since the last poll left them as they were, yet the coordinator
        # waits for word that the partitions it took back are not owned here.
        membership.owned(frozenset(self._states), reconciled=number)
        if added:
            self._listener.on_partitions_assigned(set(added))

    def _maybe_commit_before_revoking(self, partitions: Iterable[TopicPartition]) -> None:
        if not self.config.enable_auto_commit or self._group is None:
            return
        offsets = self._positions(partitions)
        if not offsets:
            return
        try:
            self.commit(offsets)
        except KafkaError as error:
            log.warning("commit before giving up %s failed: %s", sorted(partitions), error)

    def _positions(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {
            tp: state.position
            for tp in partitions
            if (state := self._states.get(tp)) is not None and state.position is not None
        }

    # -- commits ---------------------------------------------------------------------------
    def commit(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata]
        | Mapping[tuple[str, int], int | OffsetAndMetadata]
        | None = None,
        *,
        asynchronous: bool = False,
        callback: Callable[[dict[TopicPartition, int], KafkaError | None], None] | None = None,
    ) -> None:
        """Commit ``offsets`` (default: the position of every owned partition, i.e. all that
        ``poll`` returned) for the group. Synchronous unless ``asynchronous``: then it returns
        at once and ``callback(offsets, error)`` runs on the commit thread."""
        group = self._require_group()
        wanted = self._positions(self._states) if offsets is None else offsets
        resolved = {
            TopicPartition(*tp): value if isinstance(value, OffsetAndMetadata)
            else OffsetAndMetadata(value)
            for tp, value in wanted.items()
        }  # fmt: skip
        if not asynchronous:
            self._commit_now(group, resolved)
            return

        def run() -> None:
            error: KafkaError | None = None
            try:
                self._commit_now(group, resolved)
            except KafkaError as failed:
                error = failed
                log.warning("asynchronous commit failed: %s", failed)
            if callback is not None:
                callback({tp: o.offset for tp, o in resolved.items()}, error)

        self._async_commits.submit(run)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This consumer's group membership as a transactional producer's
        ``send_offsets_to_transaction`` needs it: the group id, the generation (the member
        epoch of a KIP-848 group) and the member id; -1 and "" while not a member."""
        group = self._require_group()
        if self._membership is None:
            return ConsumerGroupMetadata(group.group_id)
        member_id, epoch = self._membership.epoch()
        return ConsumerGroupMetadata(group.group_id, epoch, member_id)

    def _require_group(self) -> GroupClient:
        if self._group is None:
            raise ValueError("commits need a group_id")
        return self._group

    def _commit_now(
        self, group: GroupClient, offsets: Mapping[TopicPartition, OffsetAndMetadata]
    ) -> None:
        if not offsets:
            return
        deadline = self._clock() + self._request_timeout_s
        while True:
            member_id, epoch = ("", -1) if self._membership is None else self._membership.epoch()
            request = commit_request(group.group_id, member_id, epoch, offsets)
            response = group.call("OffsetCommit", request, max(0.001, deadline - self._clock()))
            failures = [
                (TopicPartition(t.name, p.partition), ErrorCode.from_code(p.error_code), p)
                for t in response.topics
                for p in t.partitions
                if p.error_code
            ]
            if not failures:
                return
            tp, code, answer = failures[0]
            # STALE_MEMBER_EPOCH races with a heartbeat that moved this member to a new epoch
            # (its answer may still be on the way): while still a member, retry with the
            # epoch the next heartbeat brings.
            stale = code is ErrorCode.STALE_MEMBER_EPOCH
            if not (code.retriable or (stale and self._still_member(member_id))):
                raise KafkaError(code, f"commit {tp}: {answer.error_message}")
            if self._clock() >= deadline:
                raise KafkaError(code, f"commit {tp}: {answer.error_message} (timed out)")
            if stale and self._membership is not None:
                self._membership.heartbeat_now()
            self._closed.wait(self._cluster.backoff_s())

    def _still_member(self, member_id: str) -> bool:
        membership = self._membership
        return membership is not None and membership.is_member(member_id)

    def committed(
        self, partitions: Iterable[PartitionLike], timeout_s: float | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offset of each partition (None where nothing is committed).

        Stable, as Kafka's consumer asks (KIP-447, ``require_stable``): while a transaction's
        offsets for a partition wait for its commit or abort marker, the coordinator answers
        UNSTABLE_OFFSET_COMMIT and the call asks again for up to ``timeout_s`` (the request
        timeout), then raises it. So a partition handed over from a transactional
        consumer-producer starts after what that one's last transaction read."""
        wanted = [TopicPartition(*tp) for tp in partitions]
        found, unstable = self._fetch_committed(wanted, timeout_s)
        if unstable:
            raise KafkaError(
                ErrorCode.UNSTABLE_OFFSET_COMMIT,
                f"group {self._require_group().group_id!r}: the offsets of "
                f"{', '.join(f'{tp.topic}-{tp.partition}' for tp in sorted(unstable))} still "
                "wait for a transaction's marker",
            )
        return found

    def _fetch_committed(
        self, wanted: list[TopicPartition], timeout_s: float | None
    ) -> tuple[dict[TopicPartition, OffsetAndMetadata | None], set[TopicPartition]]:
        """(committed offsets, partitions still UNSTABLE_OFFSET_COMMIT once ``timeout_s`` is
        over). One OffsetFetch at least, repeated while some partitions are unstable."""
        group = self._require_group()
        if not wanted:
            return {}, set()
        request = gpb.OffsetFetchRequest(group_id=group.group_id, require_stable=True)
        for topic in sorted({tp.topic for tp in wanted}):
            request.topics.add(
                topic=topic, partitions=sorted(tp.partition for tp in wanted if tp.topic == topic)
            )
        deadline = self._clock() + (self._request_timeout_s if timeout_s is None else timeout_s)
        while True:
            response = group.call("OffsetFetch", request, self._request_timeout_s)
            if response.error_code:
                raise KafkaError(ErrorCode.from_code(response.error_code), response.error_message)
            unstable: set[TopicPartition] = set()
            for topic in response.topics:
                for p in topic.partitions:
                    code = ErrorCode.from_code(p.error_code)
                    tp = TopicPartition(topic.name, p.partition)
                    if code is ErrorCode.UNSTABLE_OFFSET_COMMIT:
                        unstable.add(tp)
                    elif code is not ErrorCode.NONE:
                        raise KafkaError(code, f"group {group.group_id!r}: offset of {tp}")
            backoff = self._cluster.backoff_s()
            if not unstable or self._clock() + backoff >= deadline:
                break
            self._closed.wait(backoff)
        found: dict[TopicPartition, OffsetAndMetadata | None] = dict.fromkeys(wanted)
        for topic in response.topics:
            for p in topic.partitions:
                if p.committed_offset >= 0:
                    found[TopicPartition(topic.name, p.partition)] = OffsetAndMetadata(
                        p.committed_offset, p.metadata, p.committed_leader_epoch
                    )
        return found, unstable

    def _maybe_auto_commit(self) -> None:
        if self._group is None or not self.config.enable_auto_commit:
            return
        now = self._clock()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self.config.auto_commit_interval_ms / 1000
        offsets = self._positions(self._states)
        if offsets:
            self.commit(offsets, asynchronous=True)

    # -- pausing ---------------------------------------------------------------------------
    def pause(self, *partitions: PartitionLike) -> None:
        """Stop fetching ``partitions`` and returning their records until ``resume``."""
        for tp in partitions:
            self._state(tp).paused = True

    def resume(self, *partitions: PartitionLike) -> None:
        for tp in partitions:
            self._state(tp).paused = False

    def current_lag(self, tp: PartitionLike) -> int | None:
        """Records between the position and the end this consumer reads up to (the high
        watermark, or the last stable offset with read_committed), from the last fetch
        answer; None before one came (Kafka's ``currentLag``)."""
        state = self._state(tp)
        end = (
            state.last_stable_offset
            if self.config.isolation_level == "read_committed"
            else state.high_watermark
        )
        if end < 0 or state.position is None:
            return None
        return max(0, end - state.position)

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, state in self._states.items() if state.paused}

    def assignment(self) -> set[TopicPartition]:
        return set(self._states)

    def _state(self, tp: PartitionLike) -> _PartitionState:
        state = self._states.get(TopicPartition(*tp))
        if state is None:
            raise ValueError(f"{tp} is not assigned to this consumer")
        return state

    def seek(self, tp: PartitionLike, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        state = self._state(tp)
        state.position, state.reset = offset, None
        state.offset_epoch = -1  # not validated (Kafka's seek(offset) neither)
        state.from_committed = False  # a seek replaces the group's committed offset
        state.clear()

    def seek_to_beginning(self, *partitions: PartitionLike) -> None:
        self._seek_to("earliest", partitions)

    def seek_to_end(self, *partitions: PartitionLike) -> None:
        self._seek_to("latest", partitions)

    def _seek_to(self, reset: Reset, partitions: Sequence[PartitionLike]) -> None:
        """Lazily: the offset is looked up at the next ``poll`` or ``position``."""
        for tp in partitions or list(self._states):
            state = self._state(tp)
            state.position, state.reset = None, reset
            # as Kafka's seekToBeginning/End: the reset, not the group's committed offset
            state.from_committed = False
            state.clear()

    def position(self, tp: PartitionLike) -> int:
        """The offset of the next record ``poll`` returns for ``tp``."""
        state = self._state(tp)
        if state.position is None:
            self._reset_positions()
        assert state.position is not None, "_reset_positions sets every position or raises"
        return state.position

    def _reset_positions(self, deadline: float | None = None) -> None:
        """Set every position to be reset: from the group's committed offset, else by
        ``auto.offset.reset``. With ``deadline`` (a poll's), a partition whose offsets a
        transaction still holds pending past it stays without a position (not fetched) until
        a later poll, as Kafka's poll returns without it; without, that raises."""
        pending = {tp: s for tp, s in self._states.items() if s.position is None}
        if not pending:
            return
        from_committed = [tp for tp, s in pending.items() if s.from_committed]
        if from_committed:
            unstable: set[TopicPartition] = set()
            if deadline is None:
                committed = self.committed(from_committed)
            else:
                wait_s = max(0.0, deadline - self._clock())
                committed, unstable = self._fetch_committed(from_committed, wait_s)
            for tp in unstable:
                del pending[tp]  # still from_committed: asked again at the next poll
            for tp, found in committed.items():
                if tp in unstable:
                    continue
                pending[tp].from_committed = False
                if found is not None:
                    pending[tp].position, pending[tp].reset = found.offset, None
                    # validated at its first fetch when the commit carries an epoch
                    pending[tp].offset_epoch, pending[tp].leader_epoch = found.leader_epoch, -1
                    del pending[tp]
        for tp, state in pending.items():
            if state.reset is None:
                raise KafkaError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"{tp} has no position and auto.offset.reset is none",
                )
        timestamps = {
            tp: EARLIEST_TIMESTAMP if s.reset == "earliest" else LATEST_TIMESTAMP
            for tp, s in pending.items()
        }
        for tp, (offset, _) in self._list_offsets(timestamps).items():
            pending[tp].position, pending[tp].reset = offset, None
            pending[tp].offset_epoch = -1  # a reset position is not validated (as Kafka's)

    # -- offsets lookups -------------------------------------------------------------------
    def beginning_offsets(self, partitions: Iterable[PartitionLike]) -> dict[TopicPartition, int]:
        found = self._list_offsets({TopicPartition(*tp): EARLIEST_TIMESTAMP for tp in partitions})
        return {tp: offset for tp, (offset, _) in found.items()}

    def end_offsets(self, partitions: Iterable[PartitionLike]) -> dict[TopicPartition, int]:
        """The high watermark of each partition (the offset the next record will get); with
        read_committed, the last stable offset (what this consumer can read up to)."""
        found = self._list_offsets({TopicPartition(*tp): LATEST_TIMESTAMP for tp in partitions})
        return {tp: offset for tp, (offset, _) in found.items()}

    def offsets_for_times(
        self, timestamps: Mapping[PartitionLike, int]
    ) -> dict[TopicPartition, tuple[int, int] | None]:
        """Per partition, the earliest (offset, timestamp) whose timestamp is at or after the
        given one (ms), None when there is none."""
        for ts in timestamps.values():
            if ts < 0:
                raise ValueError(f"timestamps must be >= 0, got {ts}")
        found = self._list_offsets({TopicPartition(*tp): ts for tp, ts in timestamps.items()})
        return {tp: None if offset < 0 else (offset, ts) for tp, (offset, ts) in found.items()}

    def partitions_for_topic(self, topic: str) -> set[int]:
        info = self._cluster.wait_for_topic(topic, self._request_timeout_s)
        return {p.partition for p in info.partitions}

    def _list_offsets(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets to each partition's leader, following leader changes, within
        ``request.timeout.ms``. Raises the first non-retriable error."""
        deadline = self._clock() + self._request_timeout_s
        for topic in {tp.topic for tp in timestamps}:
            self._cluster.wait_for_topic(topic, max(0.0, deadline - self._clock()))
        pending = dict(timestamps)
        found: dict[TopicPartition, tuple[int, int]] = {}
        last = KafkaError(ErrorCode.REQUEST_TIMED_OUT, "ListOffsets did not complete")
        while pending:
            for leader_tps, address in self._group_by_leader(pending).values():
                try:
                    self._list_offsets_at(address, leader_tps, pending, found)
                except KafkaError as error:
                    if not error.retriable:
                        raise
                    last = error
                    self._cluster.invalidate()
            if not pending:
                break
            if self._clock() >= deadline or self._closed.is_set():
                raise last
            self._closed.wait(min(self._cluster.backoff_s(), max(0.0, deadline - self._clock())))
            self._cluster.maybe_refresh()
        return found

    def _group_by_leader(
        self, pending: Mapping[TopicPartition, int]
    ) -> dict[int, tuple[dict[TopicPartition, int], str]]:
        snapshot = self._cluster.snapshot()
        groups: dict[int, tuple[dict[TopicPartition, int], str]] = {}
        for tp, ts in pending.items():
            leader = snapshot.leader(tp.topic, tp.partition)
            if leader is None:
                self._cluster.invalidate()
                continue
            groups.setdefault(leader.node_id, ({}, leader.address))[0][tp] = ts
        return groups

    def _list_offsets_at(
        self,
        address: str,
        timestamps: Mapping[TopicPartition, int],
        pending: dict[TopicPartition, int],
        found: dict[TopicPartition, tuple[int, int]],
    ) -> None:
        snapshot = self._cluster.snapshot()
        topics: dict[str, list[pb.ListOffsetsPartition]] = {}
        for tp, ts in timestamps.items():
            state = snapshot.partition(tp.topic, tp.partition)
            epoch = state.leader_epoch if state is not None else -1
            topics.setdefault(tp.topic, []).append(
                pb.ListOffsetsPartition(
                    partition=tp.partition, timestamp=ts, current_leader_epoch=epoch
                )
            )
        request = pb.ListOffsetsRequest(
            replica_id=CONSUMER_REPLICA_ID,
            isolation_level=self.config.isolation_code,
            topics=[pb.ListOffsetsTopic(name=t, partitions=ps) for t, ps in topics.items()],
        )
        try:
            response = self._cluster.stub(address).ListOffsets(
                request, timeout=self._request_timeout_s
            )
        except grpc.RpcError as error:
            raise rpc_error(error, f"ListOffsets to {address}") from error
        for topic in response.topics:
            for answer in topic.partitions:
                tp = TopicPartition(topic.name, answer.partition)
                if tp not in pending:
                    continue
                code = ErrorCode.from_code(answer.error_code)
                if code is ErrorCode.NONE:
                    found[tp] = (answer.offset, answer.timestamp)
                    del pending[tp]
                elif not code.retriable:
                    raise KafkaError(code, f"ListOffsets {tp}: {answer.error_message}")
                elif code in LEADER_ERRORS:
                    self._cluster.invalidate()

    # -- polling ---------------------------------------------------------------------------
    def poll(self, timeout_ms: int = 0) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records of the assigned partitions, at most ``max.poll.records``, waiting up to
        ``timeout_ms`` for some to arrive. Empty when none did."""
        return self._poll(timeout_ms, self._drain_buffers)

    def poll_batches(self, timeout_ms: int = 0) -> list[FetchedBatches]:
        """Like :meth:`poll`, but each partition's fetched RecordBatch v2 bytes as they came,
        undecoded: for readers that decode whole batches into columns themselves (the Spark
        data source). Each partition's position moves past the batches returned;
        ``max.poll.records`` does not apply. Use one of ``poll`` and ``poll_batches`` per
        consumer: what one has fetched the other does not return."""
        return self._poll(timeout_ms, self._drain_fetched)

    def _poll(self, timeout_ms: int, drain: Callable[[], _Drained]) -> _Drained:
        if self._closed.is_set():
            raise RuntimeError("poll() after close()")
        deadline = self._clock() + max(0, timeout_ms) / 1000
        self._reconcile()
        self._maybe_auto_commit()
        while True:
            drained = drain()
            if drained:
                # Pipelining, as Kafka's consumer: the next fetch of the partitions just
                # emptied goes now and is served while the caller works on these records.
                self._send_fetches(self.config.fetch_max_wait_ms / 1000)
                return drained
            self._reset_positions(deadline)
            self._validate_positions()
            remaining = deadline - self._clock()
            self._send_fetches(max(0.0, min(self.config.fetch_max_wait_ms / 1000, remaining)))
            answered = self._complete_fetches(max(0.0, remaining))
            if any(
                (s.fetched is not None or s.buffer) and not s.paused for s in self._states.values()
            ):
                continue
            remaining = deadline - self._clock()
            if remaining <= 0:
                return drained
            if answered is False or (answered is None and not self._fetches):
                # nothing could be fetched (no leader, errors): back off
                self._closed.wait(min(self._cluster.backoff_s(), remaining))

    def _drain_buffers(self) -> dict[TopicPartition, list[ConsumerRecord]]:
        decoding = [
            (state, state.fetched)
            for state in self._states.values()
            if state.fetched is not None and not state.buffer and not state.paused
        ]
        if decoding:
            for state, fetched in decoding:
                assert fetched is not None, "only fetched partitions are decoded"
                state.fetched, state.buffer_end = None, fetched.next_offset
                state.buffer_end_epoch = fetched.last_epoch
            # Pipelining: the next fetches go before this decode, which they overlap.
            self._send_fetches(self.config.fetch_max_wait_ms / 1000)
            for state, fetched in decoding:
                assert fetched is not None, "only fetched partitions are decoded"
                state.buffer.extend(decode_fetched(fetched))
                if not state.buffer:
                    state.position, state.offset_epoch = state.buffer_end, state.buffer_end_epoch
        budget = self.config.max_poll_records
        result: dict[TopicPartition, list[ConsumerRecord]] = {}
        for tp, state in self._states.items():
            if budget == 0:
                break
            if not state.buffer or state.paused:
                continue
            if budget >= len(state.buffer):  # the usual case: all of it, at C speed
                taken = list(state.buffer)
                state.buffer.clear()
            else:
                taken = [state.buffer.popleft() for _ in range(budget)]
            budget -= len(taken)
            result[tp] = taken
            if state.buffer:
                state.position, state.offset_epoch = state.buffer[0].offset, taken[-1].leader_epoch
            else:
                state.position, state.offset_epoch = state.buffer_end, state.buffer_end_epoch
        return result

    def _drain_fetched(self) -> list[FetchedBatches]:
        drained: list[FetchedBatches] = []
        for state in self._states.values():
            if state.fetched is None or state.paused:
                continue
            drained.append(state.fetched)
            state.position, state.offset_epoch = state.fetched.next_offset, state.fetched.last_epoch
            state.fetched = None
        return drained

    def _validate_positions(self) -> None:
        """KIP-320: ask each new leader where the epoch of a partition's position ends, for
        the partitions whose leader changed (see ``_validation``). A partition still pending
        (no leader yet, a retriable error) is tried again at the next round; a truncation with
        ``auto.offset.reset`` none raises :class:`LogTruncationError`."""
        snapshot = self._cluster.snapshot()
        by_leader: dict[str, dict[TopicPartition, ValidationRequest]] = {}
        for tp, state in self._states.items():
            if state.offset_epoch < 0 or state.paused or state.position is None:
                continue  # the common case, checked first: once per poll round
            info = snapshot.partition(tp.topic, tp.partition)
            if info is None or not state.needs_validation(info.leader_epoch):
                continue
            leader = snapshot.leader(tp.topic, tp.partition)
            if leader is not None:
                by_leader.setdefault(leader.address, {})[tp] = ValidationRequest(
                    state.position, state.offset_epoch, info.leader_epoch
                )
        for address, requests in by_leader.items():
            outcomes = validate(
                self._cluster, address, requests, self.config.auto_offset_reset,
                self._request_timeout_s,
            )  # fmt: skip
            for tp, outcome in outcomes.items():
                state = self._states[tp]
                if outcome.error is not None:
                    raise outcome.error
                if outcome.kind == "seek":
                    state.position, state.offset_epoch = outcome.offset, outcome.offset_epoch
                    state.clear()
                elif outcome.kind == "reset":
                    assert self.config.auto_offset_reset != "none", "none gives an error"
                    state.position, state.reset = None, self.config.auto_offset_reset
                    state.clear()
                    continue  # validated once reset: the reset position has no epoch
                state.leader_epoch = requests[tp].current_leader_epoch

    def _send_fetches(self, max_wait_s: float) -> None:
        """A Fetch to each leader of fetchable partitions that has none in flight."""
        self._drop_stale_fetches()
        self._cluster.maybe_refresh()
        snapshot = self._cluster.snapshot()
        busy = {tp for fetch in self._fetches.values() for tp in fetch.offsets}
        requests = self._fetch_requests(snapshot, max_wait_s, busy)
        for address, (request, offsets) in requests.items():
            call = self._cluster.fetch_method(address).future(
                request, timeout=max_wait_s + self._request_timeout_s
            )
            self._fetches[address] = _InFlightFetch(offsets, call)

    def _drop_stale_fetches(self) -> None:
        """Cancel fetches none of whose partitions still wants the answer (each was seeked,
        paused, unassigned or filled since), so their partitions can be fetched again."""
        for address, fetch in list(self._fetches.items()):
            if not any(self._wants(tp, offset) for tp, offset in fetch.offsets.items()):
                fetch.call.cancel()
                del self._fetches[address]

    def _wants(self, tp: TopicPartition, offset: int) -> bool:
        state = self._states.get(tp)
        return (
            state is not None
            and state.fetched is None
            and state.fetch_offset() == offset
            and not state.paused
        )

    def _complete_fetches(self, wait_s: float) -> bool | None:
        """Handle the fetches answered within ``wait_s`` seconds (the others stay in flight).
        True when a partition was answered without error, False when answers came but none
        without error (the caller backs off), None when none came."""
        deadline = time.monotonic() + wait_s  # gRPC waits in real time, whatever the clock
        answered: bool | None = None
        for address, fetch in list(self._fetches.items()):
            try:
                # positional: with a client interceptor (a secure cluster's) a call that failed
                # at once is gRPC's _FailureOutcome, whose result() names it ignored_timeout
                answer: FetchAnswer = fetch.call.result(max(0.0, deadline - time.monotonic()))
            except grpc.FutureTimeoutError:
                continue
            except grpc.FutureCancelledError:
                del self._fetches[address]
                continue
            except grpc.RpcError as error:
                del self._fetches[address]
                if not rpc_error(error, address).retriable:
                    raise rpc_error(error, f"Fetch from {address}") from error
                self._cluster.invalidate()
                answered = bool(answered)
                continue
            del self._fetches[address]
            answered = self._handle_fetch(answer, fetch.offsets) or bool(answered)
        return answered

    def _fetch_requests(
        self, snapshot: ClusterSnapshot, max_wait_s: float, busy: set[TopicPartition]
    ) -> dict[str, tuple[pb.FetchRequest, dict[TopicPartition, int]]]:
        by_leader: dict[str, dict[str, list[pb.FetchPartition]]] = {}
        offsets: dict[str, dict[TopicPartition, int]] = {}
        for tp, state in self._states.items():
            offset = state.fetch_offset()
            if state.fetched is not None or offset is None or state.paused or tp in busy:
                continue
            leader = snapshot.leader(tp.topic, tp.partition)
            info = snapshot.partition(tp.topic, tp.partition)
            if leader is None or info is None:
                self._cluster.invalidate()
                continue
            if leader.address in self._fetches:
                continue  # one fetch per leader in flight: this partition goes in the next
            if state.needs_validation(info.leader_epoch):
                continue  # KIP-320: not until the new leader confirmed the position
            state.leader_epoch = info.leader_epoch
            by_leader.setdefault(leader.address, {}).setdefault(tp.topic, []).append(
                pb.FetchPartition(
                    partition=tp.partition,
                    fetch_offset=offset,
                    current_leader_epoch=info.leader_epoch,
                    last_fetched_epoch=-1,
                    partition_max_bytes=self.config.max_partition_fetch_bytes,
                    log_start_offset=-1,
                )
            )
            offsets.setdefault(leader.address, {})[tp] = offset
        return {
            address: (
                pb.FetchRequest(
                    replica_id=CONSUMER_REPLICA_ID,
                    broker_epoch=-1,
                    max_wait_ms=int(max_wait_s * 1000),
                    min_bytes=self.config.fetch_min_bytes,
                    max_bytes=self.config.fetch_max_bytes,
                    isolation_level=self.config.isolation_code,
                    topics=[pb.FetchTopic(name=t, partitions=ps) for t, ps in topics.items()],
                ),
                offsets[address],
            )
            for address, topics in by_leader.items()
        }

    def _handle_fetch(self, fetched: FetchAnswer, offsets: Mapping[TopicPartition, int]) -> bool:
        """Apply each partition's answer; True when any came without error."""
        response, records = fetched
        if response.error_code != ErrorCode.NONE.code:
            code = ErrorCode.from_code(response.error_code)
            if not code.retriable:
                raise KafkaError(code, "Fetch refused")
            self._cluster.invalidate()
            return False
        ok = False
        for topic, answer, data in each_partition(response, records):
            tp = TopicPartition(topic.name, answer.partition)
            state = self._states.get(tp)
            if tp not in offsets or not self._wants(tp, offsets[tp]):
                continue  # unassigned, paused or moved by seek since the request went out
            assert state is not None, "a partition that wants an answer is assigned"
            self._handle_partition(tp, state, answer, data)
            ok = ok or answer.error_code == ErrorCode.NONE.code
        return ok

    def _handle_partition(
        self,
        tp: TopicPartition,
        state: _PartitionState,
        answer: pb.FetchPartitionResponse,
        records: Records,
    ) -> None:
        code = ErrorCode.from_code(answer.error_code)
        if code is ErrorCode.NONE:
            # Only the batch headers are read here (cheap); records are decoded when the
            # buffer before them is drained (poll), after the next fetch has gone.
            offset = state.fetch_offset()
            assert offset is not None, "only partitions with a position are fetched"
            # a copy out of the answer's bytes: the records' keys and values are sliced from
            # it and must be bytes (protobuf's way made two)
            fetched = whole_batches(tp, bytes(records), offset)
            if answer.aborted_transactions and fetched.data:
                kept = drop_aborted(
                    fetched.data,
                    ((a.producer_id, a.first_offset) for a in answer.aborted_transactions),
                )
                fetched = fetched._replace(data=kept)  # next_offset still past what was dropped
            state.high_watermark = answer.high_watermark
            state.last_stable_offset = answer.last_stable_offset
            if fetched.data:
                state.fetched = fetched
            elif fetched.next_offset == offset:
                pass  # nothing new (the fetch waited out max_wait_ms)
            elif state.buffer:  # only aborted or control batches: the next fetch skips them
                state.buffer_end, state.buffer_end_epoch = fetched.next_offset, fetched.last_epoch
            else:
                state.position = state.buffer_end = fetched.next_offset
                state.offset_epoch = state.buffer_end_epoch = fetched.last_epoch
        elif code is ErrorCode.OFFSET_OUT_OF_RANGE:
            if self.config.auto_offset_reset == "none":
                raise KafkaError(code, f"{tp}: offset {state.fetch_offset()} is out of range")
            # The reset starts the partition over: what a pipelined fetch left buffered goes
            # too (with "earliest" it is fetched again if the log still holds it).
            state.position, state.reset = None, self.config.auto_offset_reset
            state.clear()
        elif code in LEADER_ERRORS:
            self._cluster.invalidate()
        elif not code.retriable:
            raise KafkaError(code, f"Fetch {tp}: {answer.error_message}")

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Commit (with auto-commit), give up the partitions and leave the group; then close."""
        if self._closed.is_set():
            return
        try:
            if self._membership is not None:
                self._leave_group()
            elif self._group is not None and self._states:
                self._maybe_commit_before_revoking(set(self._states))
        finally:
            for fetch in self._fetches.values():
                fetch.call.cancel()
            self._fetches.clear()
            self._async_commits.shutdown(wait=True)
            self._closed.set()
            self._cluster.close()
