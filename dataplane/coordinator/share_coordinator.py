"""The share coordinator of a broker (KIP-932): the state of the share partitions that hash to
the ``__share_group_state`` partitions it leads, served over ShareCoordinatorService.

A *share partition* is one topic partition as one share group reads it; what survives its
leader is a snapshot (:meth:`~dataplane.coordinator.share_partition.SharePartition.snapshot`):
the share-partition start offset and the state and delivery count of the in-flight records.
Partition leaders (:mod:`dataplane.coordinator.share_manager`) read it when they first serve
the share partition and write what changed after each change that matters; the coordinator
stores each write as an update record over the share partition's last snapshot, and a new
snapshot every ``share.coordinator.snapshot.update.records.per.snapshot`` updates
(:class:`ShareStateShard`), so a write costs what it changed, not the whole state.

The key of a share partition is Kafka's ``"group:topicId:partition"`` (the topic id as Kafka
prints a ``Uuid``); its coordinator is the leader of partition ``hash(key) mod N`` of
``__share_group_state`` (N = ``share.coordinator.state.topic.num.partitions``, created on the
first lookup with ``share.coordinator.state.topic.replication.factor``). Loading, writing and
answering once replicated are the shared machinery of :mod:`dataplane.coordinator.runtime`.

**State epoch.** Each read (a leader loading the share partition: a new leader, or the same one
after a leadership change) bumps the share partition's *state epoch*, written before the answer;
a write carrying an older state epoch is refused with FENCED_STATE_EPOCH, so a deposed leader
can no longer overwrite what its successor loaded. A read or write with a leader epoch older
than the stored one is refused with FENCED_LEADER_EPOCH. A write of a share partition with no
state (deleted with its share group: DeleteShareGroupState) is refused with FENCED_STATE_EPOCH
too, so a leader's memory does not bring a deleted group's state back.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dataplane.broker import authorization as authz
from dataplane.broker.replica_manager import ReplicaManager
from dataplane.coordinator.runtime import (
    Answers,
    CoordinatorRecord,
    CoordinatorRuntime,
    InternalTopic,
    Shard,
)
from dataplane.coordinator.share_batches import merged
from dataplane.coordinator.share_partition import RecordState, StateBatch
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl
from protos import share_pb2 as spb
from protos import share_pb2_grpc as spb_grpc
from raftlog.coordinator_key import partition_for
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
SHARE_STATE_TOPIC = "__share_group_state"
NO_START_OFFSET = -1  # a share partition read before any leader initialized it


@dataclass(frozen=True)
class ShareCoordinatorConfig:
    """The coordinator's settings (Kafka's names in the comments)."""

    state_topic_num_partitions: int = 50  # share.coordinator.state.topic.num.partitions
    state_topic_replication_factor: int = 3  # share.coordinator.state.topic.replication.factor
    state_topic_min_isr: int = 2  # share.coordinator.state.topic.min.isr
    state_topic_segment_bytes: int = (
        100 * 1024 * 1024
    )  # share.coordinator.state.topic.segment.bytes
    write_timeout_ms: int = 5_000  # share.coordinator.write.timeout.ms
    # share.coordinator.snapshot.update.records.per.snapshot
    snapshot_update_records_per_snapshot: int = 500


@dataclass(frozen=True)
class ShareState:
    """The stored state of one share partition; as a write, the leader's start offset and the
    batches that changed since its last write (laid over the stored state)."""

    state_epoch: int
    leader_epoch: int
    start_offset: int
    batches: tuple[StateBatch, ...] = ()


def kafka_uuid(raw: bytes) -> str:
    """A topic id as Kafka's ``Uuid.toString()`` prints it (URL-safe base64, no padding)."""
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def share_key(group_id: str, topic_id: bytes, partition: int) -> str:
    """Kafka's ``SharePartitionKey.asCoordinatorKey()``: ``group:topicId:partition``."""
    return f"{group_id}:{kafka_uuid(topic_id)}:{partition}"


def key_bytes(group_id: str, topic_id: bytes, partition: int) -> bytes:
    return spb.ShareSnapshotKey(
        group_id=group_id, topic_id=topic_id, partition=partition
    ).SerializeToString()


def batches_to_proto(batches: Iterable[StateBatch]) -> list[spb.StateBatch]:
    return [
        spb.StateBatch(
            first_offset=b.first_offset,
            last_offset=b.last_offset,
            delivery_state=b.state.value,
            delivery_count=b.delivery_count,
        )
        for b in batches
    ]


def batches_from_proto(batches: Iterable[spb.StateBatch]) -> tuple[StateBatch, ...]:
    out = []
    for b in batches:
        try:
            state = RecordState(b.delivery_state)
        except ValueError as error:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST, f"unknown delivery state {b.delivery_state}"
            ) from error
        if b.last_offset < b.first_offset or b.delivery_count < 0:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"state batch {b.first_offset}..{b.last_offset} (count {b.delivery_count})",
            )
        out.append(StateBatch(b.first_offset, b.last_offset, state, b.delivery_count))
    return tuple(out)


def encode(state: ShareState, snapshot_epoch: int = 0) -> bytes:
    """A ShareSnapshotValue: the whole state."""
    return spb.ShareSnapshotValue(
        state_epoch=state.state_epoch, leader_epoch=state.leader_epoch,
        start_offset=state.start_offset, state_batches=batches_to_proto(state.batches),
        snapshot_epoch=snapshot_epoch,
    ).SerializeToString()  # fmt: skip


def decode(value: bytes) -> ShareState:
    parsed = spb.ShareSnapshotValue.FromString(value)
    return ShareState(
        parsed.state_epoch, parsed.leader_epoch, parsed.start_offset,
        batches_from_proto(parsed.state_batches),
    )  # fmt: skip


ShareKey = tuple[str, bytes, int]  # (group id, topic id, partition)
SNAPSHOT = 0  # the update number of a share partition's snapshot key


@dataclass
class _Stored:
    """A share partition at its coordinator: its last snapshot and the updates written since
    (start offset, changed batches), in order; the epochs as the latest record left them."""

    snapshot: ShareState
    snapshot_epoch: int
    leader_epoch: int
    updates: list[tuple[int, tuple[StateBatch, ...]]] = field(default_factory=list)

    def state(self) -> ShareState:
        """The state: the updates laid over the snapshot. O(window + updates)."""
        base = self.snapshot
        start, batches = merged(base.start_offset, base.batches, self.updates)
        return ShareState(base.state_epoch, self.leader_epoch, start, batches)


class ShareStateShard:
    """The share partitions of one ``__share_group_state`` partition: pure, records in,
    records out (a :class:`~dataplane.coordinator.runtime.ShardState`).

    **Snapshots and updates** (Kafka's ``ShareCoordinatorShard``). A write carries the changes
    since the leader's last one; it is stored as a ShareUpdate record (key update number n, the
    n-th since the snapshot), or as a new ShareSnapshot of the whole state once
    ``updates_per_snapshot`` updates follow the last one
    (``share.coordinator.snapshot.update.records.per.snapshot``; 0: every write a snapshot). A
    write thus costs what it changed, plus the whole state once every that many writes. A read
    (a leader loading) writes a snapshot with the state epoch bumped. Replay: a snapshot
    replaces the share partition's state; an update is kept when it is the next one of the
    current snapshot (its snapshot epoch, its number), and ignored otherwise (an update before
    the latest snapshot that compaction kept: the snapshot replaces it). Records written before
    updates existed (snapshots with no number) read as snapshots."""

    def __init__(self, updates_per_snapshot: int = 500) -> None:
        self.updates_per_snapshot = updates_per_snapshot
        self._stored: dict[ShareKey, _Stored] = {}
        self._numbers: dict[ShareKey, int] = {}  # the highest update number in the log
        self._emitted: list[CoordinatorRecord] = []

    @property
    def states(self) -> dict[ShareKey, ShareState]:
        """Every share partition's state (each O(window): for observation and tests)."""
        return {share: stored.state() for share, stored in self._stored.items()}

    # -- ShardState ------------------------------------------------------------------------------
    def replay(self, key: bytes, value: bytes | None) -> None:
        parsed = spb.ShareSnapshotKey.FromString(key)
        share = (parsed.group_id, parsed.topic_id, parsed.partition)
        number = parsed.update_number
        if number != SNAPSHOT:
            self._numbers[share] = max(self._numbers.get(share, 0), number)
            if value is not None:
                self._replay_update(share, number, spb.ShareUpdateValue.FromString(value))
        elif value is None:
            self._stored.pop(share, None)
        else:
            snapshot_epoch = spb.ShareSnapshotValue.FromString(value).snapshot_epoch
            state = decode(value)
            self._stored[share] = _Stored(state, snapshot_epoch, state.leader_epoch)

    def _replay_update(self, share: ShareKey, number: int, value: spb.ShareUpdateValue) -> None:
        stored = self._stored.get(share)
        if (
            stored is None
            or stored.snapshot_epoch != value.snapshot_epoch
            or len(stored.updates) + 1 != number
        ):
            return  # not an update of the current snapshot: one a later snapshot replaced
        stored.updates.append((value.start_offset, batches_from_proto(value.state_batches)))
        stored.leader_epoch = max(stored.leader_epoch, value.leader_epoch)

    def take_emitted(self) -> list[CoordinatorRecord]:
        emitted, self._emitted = self._emitted, []
        return emitted

    def take_answers(self) -> Answers:
        return []  # every request is answered once its own record is replicated

    def fail_answers(self, answers: Answers, error: KafkaError) -> None:
        assert not answers, "the share coordinator holds no requests back"

    def on_loaded(self, now_ms: int) -> None:
        """No timers: the state changes only when leaders write."""

    def abandon(self, error: ErrorCode, message: str) -> None:
        """Nothing is held back."""

    def _emit(self, key: bytes, value: bytes | None) -> None:
        self.replay(key, value)
        self._emitted.append((key, value))

    def _emit_snapshot(self, share: ShareKey, state: ShareState, snapshot_epoch: int) -> None:
        self._emit(key_bytes(*share), encode(state, snapshot_epoch))

    # -- requests --------------------------------------------------------------------------------
    def read(self, share: ShareKey, leader_epoch: int) -> ShareState:
        """A leader loads the share partition: its state with the state epoch bumped (written
        as a snapshot)."""
        stored = self._stored.get(share)
        current = ShareState(0, -1, NO_START_OFFSET) if stored is None else stored.state()
        _check_leader_epoch(share, current, leader_epoch)
        bumped = ShareState(
            current.state_epoch + 1, max(leader_epoch, current.leader_epoch),
            current.start_offset, current.batches,
        )  # fmt: skip
        self._emit_snapshot(share, bumped, 0 if stored is None else stored.snapshot_epoch + 1)
        return bumped

    def write(self, share: ShareKey, written: ShareState) -> None:
        """A leader's new start offset and changed state batches, merged over the state."""
        stored = self._stored.get(share)
        if stored is None:
            # Every leader reads (which stores the state) before it writes: no state means it
            # was deleted since (DeleteGroups of its share group); a leader still holding it in
            # memory must not bring it back, it loads it again (and starts afresh).
            raise KafkaError(
                ErrorCode.FENCED_STATE_EPOCH,
                f"the state of {_name(share)} was deleted (its share group was deleted)",
            )
        current = ShareState(stored.snapshot.state_epoch, stored.leader_epoch, NO_START_OFFSET)
        if written.state_epoch < current.state_epoch:
            raise KafkaError(
                ErrorCode.FENCED_STATE_EPOCH,
                f"state epoch {written.state_epoch} of {_name(share)} is older than "
                f"{current.state_epoch}",
            )
        _check_leader_epoch(share, current, written.leader_epoch)
        if written.start_offset < 0:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"start offset {written.start_offset}")
        if len(stored.updates) >= self.updates_per_snapshot:
            base = stored.snapshot
            start, batches = merged(
                base.start_offset, base.batches,
                [*stored.updates, (written.start_offset, written.batches)],
            )  # fmt: skip
            state = ShareState(base.state_epoch, written.leader_epoch, start, batches)
            self._emit_snapshot(share, state, stored.snapshot_epoch + 1)
            return
        number = len(stored.updates) + 1
        key = spb.ShareSnapshotKey(
            group_id=share[0], topic_id=share[1], partition=share[2], update_number=number
        )
        value = spb.ShareUpdateValue(
            snapshot_epoch=stored.snapshot_epoch, leader_epoch=written.leader_epoch,
            start_offset=written.start_offset, state_batches=batches_to_proto(written.batches),
        )  # fmt: skip
        self._emit(key.SerializeToString(), value.SerializeToString())

    def delete(self, share: ShareKey) -> None:
        """Tombstones for the share partition's snapshot and every update key it used."""
        if share not in self._stored:
            return
        self._emit(key_bytes(*share), None)
        for number in range(1, self._numbers.pop(share, 0) + 1):
            key = spb.ShareSnapshotKey(
                group_id=share[0], topic_id=share[1], partition=share[2], update_number=number
            )
            self._emit(key.SerializeToString(), None)
        self._numbers.pop(share, None)


def _check_leader_epoch(share: ShareKey, current: ShareState, leader_epoch: int) -> None:
    if leader_epoch < current.leader_epoch:
        raise KafkaError(
            ErrorCode.FENCED_LEADER_EPOCH,
            f"leader epoch {leader_epoch} of {_name(share)} is older than {current.leader_epoch}",
        )


def _name(share: ShareKey) -> str:
    return share_key(*share)


class ShareCoordinator:
    """The ``__share_group_state`` partitions this broker leads (see the module docstring)."""

    def __init__(
        self,
        broker_id: int,
        config: ShareCoordinatorConfig,
        replicas: ReplicaManager,
        create_topic: Callable[[str, int, int, Mapping[str, str]], None],
        clock_ms: Callable[[], int],
    ) -> None:
        self.broker_id = broker_id
        self.config = config
        topic = InternalTopic(
            SHARE_STATE_TOPIC,
            config.state_topic_num_partitions,
            config.state_topic_replication_factor,
            {
                "cleanup.policy": "compact",
                "segment.bytes": str(config.state_topic_segment_bytes),
                "min.insync.replicas": str(config.state_topic_min_isr),
            },
            config_prefix="share.coordinator.state.topic",
        )
        updates = config.snapshot_update_records_per_snapshot
        self.runtime: CoordinatorRuntime[ShareStateShard] = CoordinatorRuntime(
            broker_id, topic, replicas, lambda: ShareStateShard(updates), create_topic,
            clock_ms, config.write_timeout_ms,
        )  # fmt: skip

    def start(self) -> None:
        self.runtime.start()

    def close(self) -> None:
        self.runtime.close()

    def on_image(self) -> None:
        self.runtime.on_image()

    def find_coordinator(self, key: str) -> tuple[int, str, int]:
        """(node id, host, port) of the coordinator of a share key (creates the topic)."""
        return self.runtime.coordinator(lambda count: partition_for(key, count))

    def _shard(self, share: ShareKey) -> Shard[ShareStateShard]:
        key = share_key(*share)
        return self.runtime.shard(lambda count: partition_for(key, count), f"share key {key!r}")

    def read(self, share: ShareKey, leader_epoch: int) -> ShareState:
        return self.runtime.run(self._shard(share), lambda state: state.read(share, leader_epoch))

    def write(self, share: ShareKey, written: ShareState) -> None:
        self.runtime.run(self._shard(share), lambda state: state.write(share, written))

    def delete(self, group_id: str, partitions: Sequence[tuple[bytes, int]]) -> list[ErrorCode]:
        """Tombstones for a deleted group's share partitions; an error per partition."""
        out = []
        for topic_id, partition in partitions:
            share: ShareKey = (group_id, topic_id, partition)
            try:
                self.runtime.run(self._shard(share), _deleter(share))
                out.append(ErrorCode.NONE)
            except KafkaError as error:
                out.append(error.error)
        return out


def _deleter(share: ShareKey) -> Callable[[ShareStateShard], None]:
    return lambda state: state.delete(share)


class ShareCoordinatorServicer(spb_grpc.ShareCoordinatorServiceServicer):
    """ShareCoordinatorService: partition leaders of other brokers read and write here (an
    inter-broker API, as Kafka's ReadShareGroupState / WriteShareGroupState: CLUSTER_ACTION)."""

    def __init__(self, coordinator: ShareCoordinator, access: AccessControl = ALLOW_ALL) -> None:
        self.coordinator = coordinator
        self.access = access

    def _refused(self, what: str) -> KafkaError | None:
        return authz.cluster_action_denied(self.access, what)

    def ReadShareGroupState(
        self, request: spb.ReadShareGroupStateRequest, context: Any
    ) -> spb.ReadShareGroupStateResponse:
        response = spb.ReadShareGroupStateResponse(start_offset=NO_START_OFFSET)
        share = (request.group_id, request.topic_id, request.partition)
        try:
            refused = self._refused("ReadShareGroupState")
            if refused is not None:
                raise refused
            state = self.coordinator.read(share, request.leader_epoch)
        except KafkaError as error:
            response.error_code, response.error_message = error.error.code, error.message
            return response
        response.state_epoch = state.state_epoch
        response.start_offset = state.start_offset
        response.state_batches.extend(batches_to_proto(state.batches))
        return response

    def WriteShareGroupState(
        self, request: spb.WriteShareGroupStateRequest, context: Any
    ) -> spb.WriteShareGroupStateResponse:
        response = spb.WriteShareGroupStateResponse()
        share = (request.group_id, request.topic_id, request.partition)
        try:
            refused = self._refused("WriteShareGroupState")
            if refused is not None:
                raise refused
            written = ShareState(
                request.state_epoch, request.leader_epoch, request.start_offset,
                batches_from_proto(request.state_batches),
            )  # fmt: skip
            self.coordinator.write(share, written)
        except KafkaError as error:
            response.error_code, response.error_message = error.error.code, error.message
        return response

    def DeleteShareGroupState(
        self, request: spb.DeleteShareGroupStateRequest, context: Any
    ) -> spb.DeleteShareGroupStateResponse:
        keys = [(p.topic_id, p.partition) for p in request.partitions]
        refused = self._refused("DeleteShareGroupState")
        if refused is None:
            errors = self.coordinator.delete(request.group_id, keys)
        else:
            errors = [refused.error] * len(keys)
        return spb.DeleteShareGroupStateResponse(
            results=[
                spb.DeleteShareGroupStateResult(
                    topic_id=topic_id, partition=partition, error_code=error.code
                )
                for (topic_id, partition), error in zip(keys, errors, strict=True)
            ]
        )
