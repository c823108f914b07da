"""The group coordinator of a broker: the consumer groups of the ``__consumer_offsets`` partitions
it leads, served over GroupCoordinatorService.

Group ``g`` lives in partition ``partition_for(g, N)`` of the compacted internal topic
``__consumer_offsets`` (N = ``offsets.topic.num.partitions``, created on the first
FindCoordinator, replication ``offsets.topic.replication.factor``); its coordinator is that
partition's leader. Loading, writing and answering once replicated are the shared machinery of
:mod:`dataplane.coordinator.runtime`: each partition this broker leads is replayed into a
:class:`~dataplane.coordinator.group_state.GroupShard`, which every request runs against.

**Timers.** A thread expires members whose session (``group.consumer.session.timeout.ms``) or
revocation (their rebalance timeout) ran out, and every ``offsets.retention.check.interval.ms``
(or at once when a topic was deleted) removes expired offsets and offsets of deleted topics.

**Commits** store whatever offset a member commits, as Kafka's coordinator does (a client
commits a position after a seek, beyond the log end or -1): only partitions that do not exist
(UNKNOWN_TOPIC_OR_PARTITION) and metadata over ``offset.metadata.max.bytes``
(OFFSET_METADATA_TOO_LARGE) are refused.

**Transactional commits** (TxnOffsetCommit) are checked the same way, then verified with the
transaction coordinator (KIP-890, through ``verify_transaction``, which the broker server sets)
and written as the producer's transactional batch; they stay pending until WriteTxnMarkers
brings the transaction's marker to the group's partition (:meth:`GroupCoordinator.write_marker`,
the ``__consumer_offsets`` marker writer of the BrokerService). See
:mod:`dataplane.coordinator.txn_offsets`.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dataplane.broker import authorization as authz
from dataplane.broker.producer_state import SENTINEL, VerificationGuard
from dataplane.broker.replica_manager import ReplicaManager
from dataplane.coordinator import classic_group as cg
from dataplane.coordinator import consumer_protocol, share_assignor
from dataplane.coordinator import group_state as gs
from dataplane.coordinator import share_group as sg
from dataplane.coordinator.classic_group import ClassicLimits
from dataplane.coordinator.classic_rpc import ClassicGroupRpcs
from dataplane.coordinator.runtime import CoordinatorRuntime, InternalTopic, Shard
from dataplane.coordinator.topic_partitions import to_topic_partitions
from metadata_quorum.features import CONSUMER_GROUP_PROTOCOL, SHARE_GROUPS, check_enabled
from metadata_quorum.group_configs import GroupConfigs
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import ConfigResourceType
from metadata_quorum.security.acl import AclOperation
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl
from protos import group_pb2 as gpb
from protos import group_pb2_grpc as gpb_grpc
from raftlog.coordinator_key import partition_for
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
OFFSETS_TOPIC = "__consumer_offsets"
TIMER_TICK_S = 0.1
GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE, SHARE_KEY_TYPE = 0, 1, 2  # FindCoordinator's (Kafka's)
CLASSIC_WAIT_MARGIN_S = 5.0  # a waiting JoinGroup gives up this long after its phase should end
T = TypeVar("T")


@dataclass(frozen=True)
class GroupConfig:
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    max_size: int = 2**31 - 1
    offsets_topic_num_partitions: int = 50
    offsets_topic_replication_factor: int = 3
    offsets_topic_segment_bytes: int = 100 * 1024 * 1024
    offsets_retention_minutes: int = 10_080
    offsets_retention_check_interval_ms: int = 600_000
    offset_metadata_max_bytes: int = 4096
    offsets_commit_timeout_ms: int = 5_000
    classic: ClassicLimits = field(default_factory=ClassicLimits)
    share: sg.ShareLimits = field(default_factory=sg.ShareLimits)
    share_heartbeat_interval_ms: int = 5_000  # group.share.heartbeat.interval.ms


def topics_view(image: MetadataImage) -> gs.TopicsView:
    return gs.TopicsView(
        {t.name: len(t.partitions) for t in image.topics.values() if t.name != OFFSETS_TOPIC}
    )


# A deleted share group's share state (DeleteShareGroupState at each key's share coordinator):
# (group id, [(topic id, partition)]) -> an error per key (None: deleted)
ShareStateDeleter = Callable[[str, list[tuple[bytes, int]]], list[KafkaError | None]]


class GroupCoordinator:
    # Set by the broker server (dataplane.coordinator.share_manager.CoordinatorPersister.delete);
    # None: a deleted share group leaves its share state.
    delete_share_state: ShareStateDeleter | None = None

    def __init__(
        self,
        broker_id: int,
        config: GroupConfig,
        replicas: ReplicaManager,
        create_topic: Callable[[str, int, int, Mapping[str, str]], None],
        clock_ms: Callable[[], int],
    ) -> None:
        self.broker_id = broker_id
        self.config = config
        self.replicas = replicas
        self.clock_ms = clock_ms
        offsets_topic = InternalTopic(
            OFFSETS_TOPIC,
            config.offsets_topic_num_partitions,
            config.offsets_topic_replication_factor,
            {"cleanup.policy": "compact", "segment.bytes": str(config.offsets_topic_segment_bytes)},
            config_prefix="offsets.topic",
        )
        self.runtime: CoordinatorRuntime[gs.GroupShard] = CoordinatorRuntime(
            broker_id, offsets_topic, replicas, self._new_state, create_topic, clock_ms,
            config.offsets_commit_timeout_ms,
        )  # fmt: skip
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._topics: frozenset[str] = frozenset()
        self._sweep_offsets = threading.Event()  # a topic was deleted: drop its offsets now
        self._view: tuple[MetadataImage, gs.TopicsView] | None = None
        self._timers = threading.Thread(target=self._timer_loop, name="group-timers", daemon=True)
        # Set by the broker server: (transactional id, producer id, epoch, topic, partition) ->
        # NONE if the transaction holds the partition (the transaction coordinator's answer).
        self.verify_transaction: Callable[[str, int, int, str, int], ErrorCode] | None = None
        # Set by the broker server: who may do what (READ on a group to be a member of it and
        # commit, DESCRIBE to describe it, DELETE to delete it; see
        # dataplane.broker.authorization), asked by every request, from either listener.
        self.access: AccessControl = ALLOW_ALL

    def start(self) -> None:
        self.runtime.start()
        self._timers.start()

    def close(self) -> None:
        self._stop.set()
        if self._timers.is_alive():
            self._timers.join(timeout=5)
        self.runtime.close()

    def _new_state(self) -> gs.GroupShard:
        shard = gs.GroupShard(
            session_timeout_ms=self.config.session_timeout_ms,
            max_group_size=self.config.max_size,
            offset_metadata_max_bytes=self.config.offset_metadata_max_bytes,
            classic_limits=self.config.classic,
            share_limits=self.config.share,
        )
        shard.session_timeout_of = lambda g: self.group_configs(g).consumer_session_timeout_ms
        shard.share.session_timeout_of = lambda g: self.group_configs(g).share_session_timeout_ms
        return shard

    def group_configs(self, group_id: str) -> GroupConfigs:
        """``group_id``'s group configs (Kafka 4): its overrides in this broker's metadata
        image laid over this broker's settings, read at each heartbeat, so a change applies
        from the member's next one."""
        overrides = self.replicas.image.configs.get((ConfigResourceType.GROUP, group_id))
        defaults = GroupConfigs(
            consumer_session_timeout_ms=self.config.session_timeout_ms,
            consumer_heartbeat_interval_ms=self.config.heartbeat_interval_ms,
            share_session_timeout_ms=self.config.share.session_timeout_ms,
            share_heartbeat_interval_ms=self.config.share_heartbeat_interval_ms,
        )
        return defaults.with_overrides(overrides) if overrides else defaults

    # -- leadership --------------------------------------------------------------------------------
    def on_image(self, image: MetadataImage) -> None:
        """After the replica manager applied ``image``: load the ``__consumer_offsets``
        partitions this broker now leads, drop the ones it no longer leads."""
        topics = frozenset(image.topic_ids)
        if self._topics - topics:
            self._sweep_offsets.set()
        self._topics = topics
        self.runtime.on_image()

    # -- finding the coordinator -------------------------------------------------------------------
    def find_coordinator(self, group_id: str) -> tuple[int, str, int]:
        if not group_id:
            raise KafkaError(ErrorCode.INVALID_GROUP_ID, "the group id must not be empty")
        return self.runtime.coordinator(lambda count: partition_for(group_id, count))

    # -- running requests --------------------------------------------------------------------------
    def _shard(self, group_id: str) -> Shard[gs.GroupShard]:
        if not group_id:
            raise KafkaError(ErrorCode.INVALID_GROUP_ID, "the group id must not be empty")
        return self.runtime.shard(
            lambda count: partition_for(group_id, count), f"group {group_id!r}"
        )

    def _run(self, shard: Shard[gs.GroupShard], action: Callable[[gs.GroupShard], T]) -> T:
        return self.runtime.run(shard, action)

    # -- requests ----------------------------------------------------------------------------------
    def _topics_view(self) -> gs.TopicsView:
        """The partition counts of the current image (built once per image)."""
        image, cached = self.replicas.image, self._view
        if cached is None or cached[0] is not image:
            cached = self._view = (image, topics_view(image))
        return cached[1]

    def heartbeat(self, request: gpb.ConsumerGroupHeartbeatRequest) -> gs.HeartbeatResult:
        """ConsumerGroupHeartbeat (KIP-848): UNSUPPORTED_VERSION while group.version is 0, as
        Kafka's broker answers; READ on the group, DESCRIBE on every subscribed topic."""
        check_enabled(self.replicas.image, *CONSUMER_GROUP_PROTOCOL)
        authz.check_group(self.access, request.group_id)
        if request.HasField("subscribed_topic_names"):
            # Kafka 4: a member may not subscribe to (and so learn of) topics it may not
            # DESCRIBE; the whole heartbeat is refused, naming no topic
            names = request.subscribed_topic_names.names
            if authz.denied_topics(self.access, AclOperation.DESCRIBE, names):
                raise KafkaError(
                    ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    "not authorized to DESCRIBE every subscribed topic",
                )
        shard = self._shard(request.group_id)
        view = self._topics_view()
        return self._run(shard, lambda s: s.heartbeat(request, view, self.clock_ms()))

    def share_heartbeat(self, request: gpb.ShareGroupHeartbeatRequest) -> sg.ShareHeartbeatResult:
        """ShareGroupHeartbeat (KIP-932): READ on the group, and (Kafka 4) DESCRIBE on every
        subscribed topic, else the whole heartbeat is TOPIC_AUTHORIZATION_FAILED.
        UNSUPPORTED_VERSION while share.version is 0."""
        check_enabled(self.replicas.image, *SHARE_GROUPS)
        authz.check_group(self.access, request.group_id)
        if request.HasField("subscribed_topic_names"):
            names = request.subscribed_topic_names.names
            if authz.denied_topics(self.access, AclOperation.DESCRIBE, names):
                raise KafkaError(
                    ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    "not authorized to DESCRIBE every subscribed topic",
                )
        shard = self._shard(request.group_id)
        view = self._topics_view()
        return self._run(shard, lambda s: s.share_heartbeat(request, view, self.clock_ms()))

    def describe_share_group(self, group_id: str) -> sg.ShareGroup:
        """ShareGroupDescribe of one group: DESCRIBE on it; GROUP_ID_NOT_FOUND for an
        unknown group or one of another type (Kafka's "Group x is not a share group.")."""
        authz.check_group(self.access, group_id, AclOperation.DESCRIBE)
        shard = self._shard(group_id)

        def describe(state: gs.GroupShard) -> sg.ShareGroup:
            group = state.share.groups.get(group_id)
            if group is None:
                known = group_id in set(state.group_ids())
                kind = "is not a share group" if known else "not found"
                raise KafkaError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} {kind}.")
            return copy.deepcopy(group)

        return self._run(shard, describe)

    def commit(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        items: list[gs.OffsetCommitItem],
        instance_id: str | None = None,
    ) -> dict[tuple[str, int], KafkaError | None]:
        authz.check_group(self.access, group_id)
        shard = self._shard(group_id)
        with shard.lock:
            shard.state.validate_commit(group_id, member_id, member_epoch, instance_id)
        refused, items = self._readable(items)
        results, valid = self._check_offsets(items)
        results.update(refused)

        def commit(state: gs.GroupShard) -> dict[tuple[str, int], KafkaError | None]:
            # Checked again under the lock: the member may have been fenced meanwhile.
            state.validate_commit(group_id, member_id, member_epoch, instance_id)
            return state.commit(group_id, valid, self.clock_ms())

        if valid:
            results.update(self._run(shard, commit))
        return results

    def txn_commit(
        self, request: gpb.TxnOffsetCommitRequest
    ) -> dict[tuple[str, int], KafkaError | None]:
        """TxnOffsetCommit: the offsets, pending in the producer's transaction until its
        marker. Group-level refusals are raised; per-partition ones returned."""
        group_id, generation_id, member_id = (
            request.group_id, request.generation_id, request.member_id,
        )  # fmt: skip
        instance_id = request.group_instance_id or None
        refused_id = authz.transactional_id_denied(self.access, request.transactional_id)
        if refused_id is not None:
            raise refused_id
        authz.check_group(self.access, group_id)
        if request.producer_id < 0 or request.producer_epoch < 0:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                "a transactional offset commit needs the producer's id and epoch",
            )
        shard = self._shard(group_id)
        with shard.lock:
            shard.state.validate_txn_commit(group_id, generation_id, member_id, instance_id)
        refused, items = self._readable(_commit_items(request.topics))
        results, valid = self._check_offsets(items)
        results.update(refused)
        if not valid:
            return results
        verification = self._verify(shard, request)

        def commit(
            state: gs.GroupShard,
        ) -> tuple[list[tuple[bytes, bytes | None]], dict[tuple[str, int], KafkaError | None]]:
            # Checked again under the lock: the member may have been fenced meanwhile.
            state.validate_txn_commit(group_id, generation_id, member_id, instance_id)
            return state.txn_commit_records(group_id, valid, self.clock_ms())

        results.update(
            self.runtime.run_transactional(
                shard, request.producer_id, request.producer_epoch, verification, commit
            )
        )
        return results

    def _verify(
        self, shard: Shard[gs.GroupShard], request: gpb.TxnOffsetCommitRequest
    ) -> VerificationGuard | None:
        """KIP-890 for the group's partition, as for any partition a transaction writes: if the
        producer has no open transaction there, ask its coordinator whether the transaction
        holds the partition; the guard makes the append fail if a marker ended it meanwhile."""
        verify = self.verify_transaction
        if verify is None:
            return None
        partition = shard.partition
        guard = partition.start_verification(request.producer_id, request.producer_epoch)
        if guard is SENTINEL:
            return guard
        code = verify(
            request.transactional_id, request.producer_id, request.producer_epoch,
            OFFSETS_TOPIC, partition.partition,
        )  # fmt: skip
        if code is ErrorCode.NOT_ENOUGH_REPLICAS:  # the coordinator could not say: retriable
            raise KafkaError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"the transaction coordinator of {request.transactional_id!r} did not answer",
            )
        if code is not ErrorCode.NONE:
            raise KafkaError(
                code,
                f"the transaction of {request.transactional_id!r} does not hold "
                f"{partition.name} (AddOffsetsToTxn first), or the producer is fenced",
            )
        return guard

    def write_marker(
        self, partition: int, producer_id: int, producer_epoch: int, commit: bool,
        coordinator_epoch: int,
    ) -> None:  # fmt: skip
        """The ``__consumer_offsets`` marker writer of WriteTxnMarkers: the marker is appended
        by the shard (after everything it wrote) and applied to its groups' pending offsets;
        returns once replicated. A shard not loaded here answers NOT_LEADER_OR_FOLLOWER (the
        transaction coordinator retries), as Kafka translates its coordinator errors."""
        topic = self.replicas.image.topic(OFFSETS_TOPIC)
        if topic is None or partition not in topic.partitions:
            raise KafkaError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {OFFSETS_TOPIC}-{partition}"
            )
        try:
            shard = self.runtime.shard(lambda count: partition, f"{OFFSETS_TOPIC}-{partition}")
            self.runtime.write_marker(shard, producer_id, producer_epoch, commit, coordinator_epoch)
        except KafkaError as error:
            if error.error not in _NOT_READY:
                raise
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, error.message) from error

    def _readable(
        self, items: list[gs.OffsetCommitItem]
    ) -> tuple[dict[tuple[str, int], KafkaError | None], list[gs.OffsetCommitItem]]:
        """A commit's partitions of topics the session may not READ (TOPIC_AUTHORIZATION_FAILED,
        not committed), and the others."""
        denied = authz.denied_topics(self.access, AclOperation.READ, (i.topic for i in items))
        if not denied:
            return {}, items
        refused: dict[tuple[str, int], KafkaError | None] = {
            (i.topic, i.partition): authz.topic_denied(AclOperation.READ, i.topic)
            for i in items
            if i.topic in denied
        }
        return refused, [i for i in items if i.topic not in denied]

    def _check_offsets(
        self, items: list[gs.OffsetCommitItem]
    ) -> tuple[dict[tuple[str, int], KafkaError | None], list[gs.OffsetCommitItem]]:
        """A commit's partitions that do not exist (UNKNOWN_TOPIC_OR_PARTITION), and the
        others. The offset itself is not checked: Kafka's coordinator stores whatever a member
        commits (a position after a seek past the end, -1), only its metadata is bounded."""
        image = self.replicas.image
        results: dict[tuple[str, int], KafkaError | None] = {}
        valid: list[gs.OffsetCommitItem] = []
        for item in items:
            topic = image.topic(item.topic)
            if topic is None or item.partition not in topic.partitions:
                results[(item.topic, item.partition)] = KafkaError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"no partition {item.topic}-{item.partition}",
                )
            else:
                valid.append(item)
        return results, valid

    def fetch_offsets(
        self,
        group_id: str,
        partitions: Iterable[tuple[str, int]] | None,
        require_stable: bool = False,
    ) -> dict[tuple[str, int], gs.CommittedOffset | KafkaError | None]:
        """The committed offsets; with ``require_stable`` (KIP-447) UNSTABLE_OFFSET_COMMIT for
        a partition a transaction holds pending offsets of. Kafka's authorization: DESCRIBE on
        the group; a named partition of a topic not described is refused
        (TOPIC_AUTHORIZATION_FAILED), and left out of an answer for all partitions."""
        authz.check_group(self.access, group_id, AclOperation.DESCRIBE)
        wanted = None if partitions is None else list(partitions)
        names = (t for t, _ in wanted or ())
        denied = authz.denied_topics(self.access, AclOperation.DESCRIBE, names)
        partitions = None if wanted is None else [tp for tp in wanted if tp[0] not in denied]
        shard = self._shard(group_id)

        def fetch(state: gs.GroupShard) -> dict[tuple[str, int], Any]:
            state.refuse_share(group_id)
            found: dict[tuple[str, int], Any] = dict(state.committed(group_id, partitions))
            if require_stable:
                for tp in state.unstable(group_id) & found.keys():
                    found[tp] = KafkaError(
                        ErrorCode.UNSTABLE_OFFSET_COMMIT,
                        f"a transaction's offset of {tp[0]}-{tp[1]} waits for its marker",
                    )
            return found

        found = self._run(shard, fetch)
        if wanted is None and self.access.enabled:
            topics = {t for t, _ in found}
            shown = set(self.access.filter(AclOperation.DESCRIBE, authz.TOPIC, topics))
            found = {tp: v for tp, v in found.items() if tp[0] in shown}
        for topic, partition in wanted or ():
            if topic in denied:
                found[(topic, partition)] = authz.topic_denied(AclOperation.DESCRIBE, topic)
        return found

    def list_groups(self) -> list[tuple[str, str, str, str]]:
        """(group id, state, type, protocol type) of every group this broker coordinates that
        the session may DESCRIBE (all with DESCRIBE on the cluster)."""
        shards = list(self.runtime.loaded_shards())
        found: list[tuple[str, str, str, str]] = []
        for shard in shards:
            with shard.lock:
                state = shard.state
                found += [
                    (g, state.group_state(g), state.group_type(g), state.protocol_type(g))
                    for g in state.group_ids()
                ]
        shown = set(authz.described_groups(self.access, (entry[0] for entry in found)))
        return sorted(entry for entry in found if entry[0] in shown)

    def describe_group(
        self, group_id: str
    ) -> gs.Group | cg.DescribedClassicGroup | sg.ShareGroup | None:
        authz.check_group(self.access, group_id, AclOperation.DESCRIBE)
        shard = self._shard(group_id)

        def describe(
            state: gs.GroupShard,
        ) -> gs.Group | cg.DescribedClassicGroup | sg.ShareGroup | None:
            share = state.share.groups.get(group_id)
            if share is not None:
                return copy.deepcopy(share)
            classic = state.classic.groups.get(group_id)
            if classic is not None:
                return classic.describe()
            group = state.groups.get(group_id)
            known = group_id in state.offsets or state.pending.has_open(group_id)
            if group is None and not known:
                return None
            return group or gs.Group(group_id)

        return self._run(shard, describe)

    # -- classic groups ----------------------------------------------------------------------------
    def join_group(self, request: cg.JoinRequest) -> cg.JoinAnswer:
        """JoinGroup: returns when the join phase ends (or at once with an error)."""
        authz.check_group(self.access, request.group_id)
        shard = self._shard(request.group_id)
        future = self._run(shard, lambda s: s.join_group(request, self.clock_ms()))
        delay_ms = self.config.classic.initial_rebalance_delay_ms
        wait_s = (request.rebalance_timeout_ms + delay_ms) / 1000 + CLASSIC_WAIT_MARGIN_S
        answer = _wait_answer(future, wait_s)
        if answer is None:
            return cg.JoinAnswer(ErrorCode.REBALANCE_IN_PROGRESS, request.member_id)
        assert isinstance(answer, cg.JoinAnswer)
        return answer

    def sync_group(self, request: cg.SyncRequest) -> cg.SyncAnswer:
        """SyncGroup: returns once the leader's assignment is stored (or with an error)."""
        authz.check_group(self.access, request.group_id)
        shard = self._shard(request.group_id)
        future = self._run(shard, lambda s: s.classic.sync(request, self.clock_ms()))
        answer = _wait_answer(future, gs.DEFAULT_REBALANCE_TIMEOUT_MS / 1000)
        if answer is None:
            return cg.SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS, message="no assignment in time")
        assert isinstance(answer, cg.SyncAnswer)
        return answer

    def classic_heartbeat(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> None:
        authz.check_group(self.access, group_id)
        shard = self._shard(group_id)
        self._run(
            shard,
            lambda s: s.classic.heartbeat(
                group_id, generation_id, member_id, group_instance_id, self.clock_ms()
            ),
        )

    def leave_group(
        self, group_id: str, members: list[tuple[str, str | None]]
    ) -> list[KafkaError | None]:
        authz.check_group(self.access, group_id)
        shard = self._shard(group_id)
        return self._run(shard, lambda s: s.classic.leave(group_id, members, self.clock_ms()))

    def delete_group(self, group_id: str) -> None:
        """DeleteGroups of one group. A share group's state in ``__share_group_state`` goes
        first (as Kafka's ``GroupCoordinatorService.deleteShareGroups``): the partitions its
        members were ever assigned (its ShareGroupStatePartitionMetadata) are deleted at their
        share coordinators; a failure there fails the deletion, the group stays."""
        authz.check_group(self.access, group_id, AclOperation.DELETE)
        shard = self._shard(group_id)
        partitions = self._run(
            shard, lambda s: s.share.deletable(group_id) if group_id in s.share.groups else None
        )
        if partitions and self.delete_share_state is not None:
            self._delete_share_state(group_id, partitions)
        self._run(shard, lambda s: s.delete_group(group_id, self.clock_ms()))

    def _delete_share_state(self, group_id: str, partitions: Iterable[tuple[str, int]]) -> None:
        assert self.delete_share_state is not None
        ids = self.replicas.image.topic_ids
        keys = sorted(
            (ids[topic].bytes, partition) for topic, partition in partitions if topic in ids
        )  # a deleted topic's partitions: nothing to read any more
        for (topic_id, partition), error in zip(
            keys, self.delete_share_state(group_id, keys), strict=True
        ):
            if error is not None:
                raise KafkaError(
                    error.error,
                    f"share group {group_id!r}: the share state of partition {partition} of "
                    f"topic id {topic_id.hex()} was not deleted: {error.message}",
                )

    def delete_offsets(
        self, group_id: str, partitions: list[tuple[str, int]]
    ) -> dict[tuple[str, int], KafkaError | None]:
        """OffsetDelete: DELETE on the group (raised: GROUP_AUTHORIZATION_FAILED), READ on each
        topic (TOPIC_AUTHORIZATION_FAILED), partitions that do not exist
        UNKNOWN_TOPIC_OR_PARTITION; the others per ``GroupShard.delete_offsets``."""
        authz.check_group(self.access, group_id, AclOperation.DELETE)
        items = [gs.OffsetCommitItem(t, p, 0, -1, "") for t, p in partitions]
        refused, items = self._readable(items)
        results, valid = self._check_offsets(items)
        results.update(refused)
        shard = self._shard(group_id)
        view = self._topics_view()
        wanted = [(item.topic, item.partition) for item in valid]
        deleted = self._run(shard, lambda s: s.delete_offsets(group_id, wanted, view.names()))
        results.update(deleted)
        return results

    # -- timers ------------------------------------------------------------------------------------
    def _timer_loop(self) -> None:
        next_sweep = self.clock_ms() + self.config.offsets_retention_check_interval_ms
        while not self._stop.wait(TIMER_TICK_S):
            now_ms = self.clock_ms()
            sweep = now_ms >= next_sweep or self._sweep_offsets.is_set()
            if sweep:
                self._sweep_offsets.clear()
                next_sweep = now_ms + self.config.offsets_retention_check_interval_ms
            for shard in self.runtime.loaded_shards():
                try:
                    self._expire(shard, now_ms, sweep)
                except KafkaError as error:
                    log.info("%s: expiry not written: %s", shard.partition.name, error)

    def _expire(self, shard: Shard[gs.GroupShard], now_ms: int, sweep: bool) -> None:
        with shard.lock:
            if not shard.active:
                return
            removed = shard.state.expire_members(now_ms)
            counts = self._topics_view().partition_counts
            for group_id, member_id in shard.state.share.expire(now_ms, counts):
                removed.append((group_id, member_id, "share group session timeout"))
            expired: list[tuple[str, tuple[str, int], str]] = []
            if sweep:
                retention_ms = self.config.offsets_retention_minutes * 60_000
                view = self._topics_view()
                expired = shard.state.expire_offsets(now_ms, retention_ms, view)
            answers, required = self.runtime.append_locked(shard)
        if answers:
            self.runtime.answer_once_replicated(shard, required, answers)
        for group_id, member_id, why in removed:
            log.info("group %s: member %s removed: %s", group_id, member_id, why)
        for group_id, (topic, partition), why in expired:
            log.info("group %s: offset of %s-%d removed: %s", group_id, topic, partition, why)


# What Kafka answers WriteTxnMarkers with when the group coordinator is not ready: the
# transaction coordinator retries NOT_LEADER_OR_FOLLOWER.
_NOT_READY = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    }
)


def _commit_items(topics: Iterable[gpb.OffsetCommitTopic]) -> list[gs.OffsetCommitItem]:
    return [
        gs.OffsetCommitItem(
            t.name, p.partition, p.committed_offset, p.committed_leader_epoch, p.metadata
        )
        for t in topics
        for p in t.partitions
    ]


def _wait_answer(future: Any, timeout_s: float) -> cg.Answer | None:
    try:
        answer: cg.Answer = future.result(timeout=timeout_s)
    except TimeoutError:
        return None
    return answer


# -- the gRPC service ------------------------------------------------------------------------------
def _set_error(message: Any, error: KafkaError) -> None:
    message.error_code = error.error.code
    message.error_message = error.message


class GroupServicer(ClassicGroupRpcs, gpb_grpc.GroupCoordinatorServiceServicer):
    # Set by the broker server: FindCoordinator with key type 1 (a transactional id) asks the
    # transaction coordinator (dataplane.coordinator.transaction_coordinator).
    find_transaction_coordinator: Callable[[str], tuple[int, str, int]] | None = None
    # ... and key type 2 (a share-partition key, "group:topicId:partition", which partition
    # leaders look up) the share coordinator (dataplane.coordinator.share_coordinator)
    find_share_coordinator: Callable[[str], tuple[int, str, int]] | None = None

    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator

    def FindCoordinator(
        self, request: gpb.FindCoordinatorRequest, context: Any
    ) -> gpb.FindCoordinatorResponse:
        response = gpb.FindCoordinatorResponse()
        find = self._finder(request.key_type)
        for key in request.group_ids:
            out = response.coordinators.add(group_id=key, node_id=-1)
            try:
                self._check_find(request.key_type, key)
                out.node_id, out.host, out.port = find(key)
            except KafkaError as error:
                _set_error(out, error)
        return response

    def _check_find(self, key_type: int, key: str) -> None:
        """Kafka's FindCoordinator: DESCRIBE on the group or the transactional id."""
        access = self.coordinator.access
        if key_type == GROUP_KEY_TYPE:
            authz.check_group(access, key, AclOperation.DESCRIBE)
        elif key_type == TRANSACTION_KEY_TYPE:
            refused = authz.transactional_id_denied(access, key, AclOperation.DESCRIBE)
            if refused is not None:
                raise refused
        elif key_type == SHARE_KEY_TYPE:
            refused = authz.cluster_action_denied(access, "FindCoordinator for a share key")
            if refused is not None:
                raise refused
            parts = key.rsplit(":", 2)  # a group id may hold colons; the last two are not
            if len(parts) != 3 or not all(parts) or not parts[2].isdigit():
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST,
                    f"share key {key!r} is not groupId:topicId:partition",
                )

    def _finder(self, key_type: int) -> Callable[[str], tuple[int, str, int]]:
        if key_type == GROUP_KEY_TYPE:
            groups: Callable[[str], tuple[int, str, int]] = self.coordinator.find_coordinator
            return groups
        transactions = self.find_transaction_coordinator
        if key_type == TRANSACTION_KEY_TYPE and transactions is not None:
            return transactions
        shares = self.find_share_coordinator
        if key_type == SHARE_KEY_TYPE and shares is not None:
            return shares

        def refuse(key: str) -> tuple[int, str, int]:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"unknown coordinator key type {key_type}")

        return refuse

    def ConsumerGroupHeartbeat(
        self, request: gpb.ConsumerGroupHeartbeatRequest, context: Any
    ) -> gpb.ConsumerGroupHeartbeatResponse:
        response = gpb.ConsumerGroupHeartbeatResponse(
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            heartbeat_interval_ms=self.coordinator.group_configs(
                request.group_id
            ).consumer_heartbeat_interval_ms,
        )
        try:
            result = self.coordinator.heartbeat(request)
        except KafkaError as error:
            _set_error(response, error)
            return response
        response.member_id = result.member_id
        response.member_epoch = result.member_epoch
        response.assignment.topics.extend(to_topic_partitions(result.assignment))
        return response

    def OffsetCommit(
        self, request: gpb.OffsetCommitRequest, context: Any
    ) -> gpb.OffsetCommitResponse:
        items = _commit_items(request.topics)
        response = gpb.OffsetCommitResponse()
        group_error: KafkaError | None = None
        results: dict[tuple[str, int], KafkaError | None] = {}
        try:
            results = self.coordinator.commit(
                request.group_id, request.member_id, request.member_epoch, items,
                request.group_instance_id or None,
            )  # fmt: skip
        except KafkaError as error:
            group_error = error
            _set_error(response, error)
        _commit_response(response, request.topics, results, group_error)
        return response

    def TxnOffsetCommit(
        self, request: gpb.TxnOffsetCommitRequest, context: Any
    ) -> gpb.OffsetCommitResponse:
        response = gpb.OffsetCommitResponse()
        group_error: KafkaError | None = None
        results: dict[tuple[str, int], KafkaError | None] = {}
        try:
            results = self.coordinator.txn_commit(request)
        except KafkaError as error:
            group_error = error
            _set_error(response, error)
        _commit_response(response, request.topics, results, group_error)
        return response

    def OffsetFetch(self, request: gpb.OffsetFetchRequest, context: Any) -> gpb.OffsetFetchResponse:
        response = gpb.OffsetFetchResponse()
        wanted = [(t.topic, p) for t in request.topics for p in t.partitions] or None
        try:
            found = self.coordinator.fetch_offsets(request.group_id, wanted, request.require_stable)
        except KafkaError as error:
            _set_error(response, error)
            return response
        by_topic: dict[str, list[gpb.OffsetFetchPartitionResponse]] = {}
        for (topic, partition), committed in sorted(found.items()):
            by_topic.setdefault(topic, []).append(_fetched(partition, committed))
        for topic, partitions in by_topic.items():
            response.topics.add(name=topic, partitions=partitions)
        return response

    def ListGroups(self, request: gpb.ListGroupsRequest, context: Any) -> gpb.ListGroupsResponse:
        wanted = {s.lower() for s in request.states_filter}
        response = gpb.ListGroupsResponse()
        for group_id, state, group_type, _ in self.coordinator.list_groups():
            if not wanted or state.lower() in wanted:
                response.groups.add(group_id=group_id, state=state, group_type=group_type)
        return response

    def DescribeGroups(
        self, request: gpb.DescribeGroupsRequest, context: Any
    ) -> gpb.DescribeGroupsResponse:
        response = gpb.DescribeGroupsResponse()
        for group_id in request.group_ids:
            out = response.groups.add(group_id=group_id, coordinator_id=self.coordinator.broker_id)
            try:
                group = self.coordinator.describe_group(group_id)
            except KafkaError as error:
                _set_error(out, error)
                continue
            if group is None:
                out.state = "Dead"
                _set_error(out, KafkaError(ErrorCode.GROUP_ID_NOT_FOUND, f"no group {group_id!r}"))
                continue
            if isinstance(group, cg.DescribedClassicGroup):
                _describe_classic(group, out)
            elif isinstance(group, sg.ShareGroup):
                _describe_share(group, out)
            else:
                _describe(group, out)
        return response

    def ShareGroupHeartbeat(
        self, request: gpb.ShareGroupHeartbeatRequest, context: Any
    ) -> gpb.ShareGroupHeartbeatResponse:
        response = gpb.ShareGroupHeartbeatResponse(
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            heartbeat_interval_ms=self.coordinator.group_configs(
                request.group_id
            ).share_heartbeat_interval_ms,
        )
        try:
            result = self.coordinator.share_heartbeat(request)
        except KafkaError as error:
            _set_error(response, error)
            return response
        response.member_epoch = result.member_epoch
        if result.assignment is not None:
            response.has_assignment = True
            response.assignment.topics.extend(to_topic_partitions(result.assignment))
        return response

    def ShareGroupDescribe(
        self, request: gpb.ShareGroupDescribeRequest, context: Any
    ) -> gpb.ShareGroupDescribeResponse:
        response = gpb.ShareGroupDescribeResponse()
        for group_id in request.group_ids:
            out = response.groups.add(group_id=group_id)
            try:
                group = self.coordinator.describe_share_group(group_id)
            except KafkaError as error:
                out.state = "Dead"
                _set_error(out, error)
                continue
            out.state = group.state
            out.group_epoch = group.epoch
            out.assignment_epoch = group.assignment_epoch
            out.assignor = share_assignor.NAME
            for member in sorted(group.members.values(), key=lambda m: m.member_id):
                out.members.add(
                    member_id=member.member_id,
                    rack_id=member.rack_id,
                    member_epoch=member.member_epoch,
                    client_id=member.client_id,
                    client_host=member.client_host,
                    subscribed_topic_names=member.subscribed_topic_names,
                    assignment=to_topic_partitions(member.assigned),
                )
        return response

    def DeleteGroups(
        self, request: gpb.DeleteGroupsRequest, context: Any
    ) -> gpb.DeleteGroupsResponse:
        response = gpb.DeleteGroupsResponse()
        for group_id in request.group_ids:
            out = response.results.add(group_id=group_id)
            try:
                self.coordinator.delete_group(group_id)
            except KafkaError as error:
                _set_error(out, error)
        return response

    def OffsetDelete(
        self, request: gpb.OffsetDeleteRequest, context: Any
    ) -> gpb.OffsetDeleteResponse:
        response = gpb.OffsetDeleteResponse()
        wanted = [(t.topic, p) for t in request.topics for p in t.partitions]
        try:
            results = self.coordinator.delete_offsets(request.group_id, wanted)
        except KafkaError as error:
            _set_error(response, error)
            return response
        by_topic: dict[str, gpb.OffsetDeleteTopicResponse] = {}
        for topic, partition in wanted:
            out = by_topic.get(topic)
            if out is None:
                out = by_topic[topic] = response.topics.add(name=topic)
            item = out.partitions.add(partition=partition)
            refused = results.get((topic, partition))
            if refused is not None:
                _set_error(item, refused)
        return response


def _fetched(
    partition: int, committed: gs.CommittedOffset | KafkaError | None
) -> gpb.OffsetFetchPartitionResponse:
    if committed is None:
        return gpb.OffsetFetchPartitionResponse(
            partition=partition, committed_offset=-1, committed_leader_epoch=-1
        )
    if isinstance(committed, KafkaError):  # UNSTABLE_OFFSET_COMMIT, as Kafka: no offset
        return gpb.OffsetFetchPartitionResponse(
            partition=partition, committed_offset=-1, committed_leader_epoch=-1,
            error_code=committed.error.code,
        )  # fmt: skip
    return gpb.OffsetFetchPartitionResponse(
        partition=partition,
        committed_offset=committed.offset,
        committed_leader_epoch=committed.leader_epoch,
        metadata=committed.metadata,
        commit_timestamp_ms=committed.commit_timestamp_ms,
    )


def _commit_response(
    response: gpb.OffsetCommitResponse,
    topics: Iterable[gpb.OffsetCommitTopic],
    results: Mapping[tuple[str, int], KafkaError | None],
    group_error: KafkaError | None,
) -> None:
    """Every partition asked for, with its refusal (a group-level one copied into each)."""
    for topic in topics:
        out = response.topics.add(name=topic.name)
        for item in topic.partitions:
            answer = out.partitions.add(partition=item.partition)
            refused = group_error or results.get((topic.name, item.partition))
            if refused is not None:
                _set_error(answer, refused)


def _describe_classic(group: cg.DescribedClassicGroup, out: gpb.DescribedGroup) -> None:
    out.group_type = "classic"
    out.state = group.state
    out.group_epoch = group.generation
    out.assignor = group.protocol_name or ""
    for member in group.members:
        try:
            assigned = consumer_protocol.assigned_partitions(member.assignment)
        except KafkaError:  # not the consumer protocol: nothing to show
            assigned = []
        out.members.add(
            member_id=member.member_id,
            client_id=member.client_id,
            client_host=member.client_host,
            group_instance_id=member.group_instance_id or "",
            member_epoch=group.generation,
            state="stable" if group.state == "Stable" else "rebalancing",
            assignment=to_topic_partitions(assigned),
        )


def _describe_share(group: sg.ShareGroup, out: gpb.DescribedGroup) -> None:
    out.group_type = "share"
    out.state = group.state
    out.group_epoch = group.epoch
    out.assignment_epoch = group.assignment_epoch
    out.assignor = share_assignor.NAME
    for member in sorted(group.members.values(), key=lambda m: m.member_id):
        out.members.add(
            member_id=member.member_id,
            client_id=member.client_id,
            client_host=member.client_host,
            member_epoch=member.member_epoch,
            state="stable",
            subscribed_topic_names=member.subscribed_topic_names,
            assignment=to_topic_partitions(member.assigned),
            target_assignment=to_topic_partitions(group.target.get(member.member_id, ())),
        )


def _describe(group: gs.Group, out: gpb.DescribedGroup) -> None:
    out.group_type = "consumer"
    out.state = group.state
    out.group_epoch = group.epoch
    out.assignment_epoch = group.assignment_epoch
    out.assignor = "uniform"
    for member in sorted(group.members.values(), key=lambda m: m.member_id):
        out.members.add(
            member_id=member.member_id,
            client_id=member.client_id,
            member_epoch=member.member_epoch,
            group_instance_id=member.instance_id,
            state=member.state.name.lower(),
            subscribed_topic_names=member.subscribed_topic_names,
            subscribed_topic_regex=member.subscribed_topic_regex,
            assignment=to_topic_partitions(member.assigned),
            target_assignment=to_topic_partitions(group.target.get(member.member_id, ())),
            pending_revocation=to_topic_partitions(member.pending_revocation),
        )
