"""ShareFetch and ShareAcknowledge (KIP-932), whichever door they come through: the Kafka
listener's (API 78 / 79, dataplane/kafka/share.py) or BrokerService's gRPC RPCs
(dataplane/coordinator/share_grpc.py). Each door only translates its wire format to the
:class:`ShareItem` of each partition named (topics by id) and back; the rules are here, as
Kafka's ``KafkaApis.handleShareFetchRequest`` / ``handleShareAcknowledgeRequest``.

Each request first goes through the broker's share session cache
(:mod:`dataplane.coordinator.share_sessions`, held by the :class:`SharePartitionManager`, so a
member's session is the same whichever door it used): epoch 0 opens the member's session with
the request's partitions, later epochs add and forget partitions, -1 closes it. A session error
is answered alone (top-level), nothing read or acknowledged. Then:

- the piggybacked acknowledgements are applied (per partition: its acknowledgement error);
- with epoch -1 the member's records on the session's partitions are released and nothing is
  fetched; otherwise every partition of the session is fetched (``max_records``, ``max_bytes``;
  a fetch with nothing to acquire waits up to ``max_wait_ms``).

A ShareFetch v2 flagged ``IsRenewAck`` (KIP-1222: its acknowledgements include RENEW) only
acknowledges: Kafka's client sends it with every fetch limit 0 (``MaxBytes``, ``MinBytes``,
``MaxRecords``, ``MaxWaitMs``) and Kafka's broker refuses one with any limit set
(INVALID_REQUEST, top-level, nothing done) and fetches nothing for the others.

ShareAcknowledge applies its acknowledgements; with epoch -1 it then closes the session and
releases the member's other records. A session that ends (closed, replaced by the member's new
one, evicted, or its Kafka connection closed: :meth:`ShareRequests.connection_closed`)
releases its member's records; the share partitions no session fetches any more
are unloaded (:meth:`SharePartitionManager.unload`).

Authorization is Kafka's: READ on the group (else the whole request is refused with
GROUP_AUTHORIZATION_FAILED), READ on each topic (else its partitions get
TOPIC_AUTHORIZATION_FAILED). The member id is not checked against the group's membership
(neither does Kafka: a member that left loses its records when its session closes or their
locks expire).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from dataplane.broker import authorization as authz
from dataplane.coordinator.share_manager import Fetched, SharePartitionManager, ShareTarget
from dataplane.coordinator.share_partition import AckBatch
from dataplane.coordinator.share_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    PartitionId,
    ShareSession,
)
from metadata_quorum.image import MetadataImage
from metadata_quorum.security.acl import AclOperation
from metadata_quorum.security.authorization import AccessControl
from raftlog.errors import ErrorCode, KafkaError

MAX_WAIT_MS_MAX = 30_000  # a share fetch holds its caller at most this long


@dataclass
class ShareItem:
    """One partition of a request: what it acknowledged, and the outcome."""

    topic_id: bytes
    index: int
    acks: list[AckBatch] = field(default_factory=list)
    ack_error: KafkaError | None = None  # set by the door for a malformed acknowledgement
    acknowledged: bool = False
    fetched: Fetched | None = None

    def says_something(self) -> bool:
        """Whether the answer names this partition (records, an error or an acknowledgement)."""
        fetched = self.fetched
        if self.acknowledged or fetched is None:
            return self.acknowledged
        return fetched.error is not None or bool(fetched.records)


Named = dict[PartitionId, ShareItem]


@dataclass(frozen=True)
class FetchLimits:
    max_records: int = 500
    max_bytes: int = 64 * 1024 * 1024
    max_wait_ms: int = 0
    min_bytes: int = 0  # Kafka's MinBytes: only checked (a renewal's must be 0)

    def none(self) -> bool:
        """Every limit 0: what a renewal (``IsRenewAck``) fetch carries."""
        return not (self.max_records or self.max_bytes or self.max_wait_ms or self.min_bytes)


class ShareRequests:
    """The share-group data path of one door, around the broker's share partition manager."""

    def __init__(
        self,
        manager: SharePartitionManager,
        image: Callable[[], MetadataImage],
        access: AccessControl,
        clock_ms: Callable[[], int],
    ) -> None:
        self.manager = manager
        self.image = image
        self.access = access
        self.clock_ms = clock_ms

    def lock_duration_ms(self, group_id: str) -> int:
        """ShareFetch's ``AcquisitionLockTimeoutMs``: the group's
        ``share.record.lock.duration.ms`` (its override, else the broker's
        ``group.share.record.lock.duration.ms``), the lock each fetch of the group applies to
        the records it acquires (Kafka's ``ShareFetchUtils.recordLockDurationMsOrDefault``)."""
        return self.manager.group_configs(group_id).share_record_lock_duration_ms

    def fetch(
        self,
        group_id: str,
        member_id: str,
        epoch: int,
        named: Named,
        forgotten: Iterable[PartitionId],
        limits: FetchLimits,
        connection_id: str = "",
        renew_ack: bool = False,
    ) -> KafkaError | None:
        """ShareFetch: fills ``named`` (adding the session's other partitions fetched); the
        request's top-level error, if any (then nothing was done). A session it opens belongs
        to ``connection_id`` (the Kafka listener's connection; "" for gRPC). ``renew_ack``
        (v2's ``IsRenewAck``): acknowledge only, every limit must be 0."""
        has_acks = any(p.acks for p in named.values())
        sessions, manager = self.manager.sessions, self.manager
        try:
            self._check_request(group_id, member_id)
            if renew_ack and not limits.none():
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST,
                    "a ShareFetch with IsRenewAck has MaxBytes, MinBytes, MaxRecords and "
                    "MaxWaitMs 0",
                )
            with manager.sessions_lock:
                if epoch == INITIAL_EPOCH:
                    if has_acks:
                        raise KafkaError(
                            ErrorCode.INVALID_REQUEST, "a ShareFetch opening a session acknowledges"
                        )
                    session, ended = sessions.open(
                        group_id, member_id, named, self.clock_ms(), connection_id
                    )
                elif epoch == FINAL_EPOCH:
                    session, ended = sessions.close(group_id, member_id), []
                else:
                    session = sessions.advance(
                        group_id, member_id, epoch, self.clock_ms(), added=named,
                        forgotten=list(forgotten),
                    )  # fmt: skip
                    ended = []
        except KafkaError as error:
            return error
        names = self.names()
        for old in ended:
            self._release(old, names)
        self._acknowledge(group_id, member_id, named, names)
        if epoch == FINAL_EPOCH:
            self._release(session, names)
        elif not renew_ack:
            self._fetch(group_id, member_id, session, named, names, limits)
        return None

    def acknowledge(
        self, group_id: str, member_id: str, epoch: int, named: Named
    ) -> KafkaError | None:
        """ShareAcknowledge: fills ``named``; the top-level error, if any."""
        sessions = self.manager.sessions
        try:
            self._check_request(group_id, member_id)
            with self.manager.sessions_lock:
                if epoch == INITIAL_EPOCH:
                    raise KafkaError(
                        ErrorCode.INVALID_SHARE_SESSION_EPOCH,
                        "ShareAcknowledge cannot open a session",
                    )
                if epoch == FINAL_EPOCH:
                    session = sessions.close(group_id, member_id)
                else:
                    session = sessions.advance(group_id, member_id, epoch, self.clock_ms())
        except KafkaError as error:
            return error
        names = self.names()
        self._acknowledge(group_id, member_id, named, names)
        if epoch == FINAL_EPOCH:
            self._release(session, names)
        return None

    def connection_closed(self, connection_id: str) -> int:
        """A Kafka connection closed: the share sessions it opened end and their members'
        records are released now (Kafka's connection-disconnect listener); how many sessions."""
        with self.manager.sessions_lock:
            ended = self.manager.sessions.remove_connection(connection_id)
        if ended:
            names = self.names()
            for session in ended:
                self._release(session, names)
        return len(ended)

    # -- what the doors read ---------------------------------------------------------------------
    def names(self) -> dict[bytes, str]:
        return {topic_id.bytes: name for name, topic_id in self.image().topic_ids.items()}

    def leader(self, topic_id: bytes, index: int) -> tuple[int, int] | None:
        """(leader id, leader epoch) of a partition, None when unknown."""
        name = self.names().get(topic_id)
        described = None if name is None else self.image().topic(name)
        if described is None or not 0 <= index < len(described.partitions):
            return None
        registration = described.partitions[index]
        return registration.leader, registration.leader_epoch

    # -- the steps -------------------------------------------------------------------------------
    def _check_request(self, group_id: str, member_id: str) -> None:
        if not group_id or not member_id:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST, "a share request names its group and member"
            )
        authz.check_group(self.access, group_id, AclOperation.READ)

    def _release(self, session: ShareSession, names: dict[bytes, str]) -> None:
        """A session ended: its member's records go back; the share partitions no other session
        of the group fetches are unloaded."""
        targets = _targets(session.partitions, names)
        self.manager.release_member(session.group_id, session.member_id, targets)
        with self.manager.sessions_lock:
            idle = [
                t
                for t in targets
                if not self.manager.sessions.covers(session.group_id, (t.topic_id, t.partition))
            ]
            self.manager.unload(session.group_id, idle)

    def _fetch(
        self,
        group_id: str,
        member_id: str,
        session: ShareSession,
        named: Named,
        names: dict[bytes, str],
        limits: FetchLimits,
    ) -> None:
        wanted: list[ShareItem] = []
        targets: list[ShareTarget] = []
        denied = self._denied_topics(names, session.partitions)
        for pid in session.partitions:
            item = named.setdefault(pid, ShareItem(*pid))
            name = names.get(pid[0])
            if name is None:
                item.fetched = Fetched(error=unknown_topic_id(pid[0]))
            elif name in denied:
                item.fetched = Fetched(error=authz.topic_denied(AclOperation.READ, name))
            else:
                wanted.append(item)
                targets.append(ShareTarget(name, pid[0], pid[1]))
        max_wait_ms = min(max(limits.max_wait_ms, 0), MAX_WAIT_MS_MAX)
        fetched = self.manager.fetch(
            group_id, member_id, targets, limits.max_records, limits.max_bytes, max_wait_ms
        )
        for item, answer in zip(wanted, fetched, strict=True):
            item.fetched = answer

    def _denied_topics(
        self, names: dict[bytes, str], pids: Iterable[PartitionId]
    ) -> frozenset[str]:
        wanted = {names[t] for t, _ in pids if t in names}
        return authz.denied_topics(self.access, AclOperation.READ, wanted)

    def _acknowledge(
        self, group_id: str, member_id: str, named: Named, names: dict[bytes, str]
    ) -> None:
        items = [p for p in named.values() if p.acks or p.ack_error]
        denied = self._denied_topics(names, ((p.topic_id, p.index) for p in items))
        ready: list[ShareItem] = []
        for item in items:
            item.acknowledged = True
            name = names.get(item.topic_id)
            if item.ack_error is not None:
                continue
            if name is None:
                item.ack_error = unknown_topic_id(item.topic_id)
            elif name in denied:
                item.ack_error = authz.topic_denied(AclOperation.READ, name)
            else:
                ready.append(item)
        acks = [(ShareTarget(names[p.topic_id], p.topic_id, p.index), p.acks) for p in ready]
        for item, error in zip(
            ready, self.manager.acknowledge(group_id, member_id, acks), strict=True
        ):
            item.ack_error = error


def _targets(partitions: Iterable[PartitionId], names: dict[bytes, str]) -> list[ShareTarget]:
    return [
        ShareTarget(names[topic_id], topic_id, index)
        for topic_id, index in partitions
        if topic_id in names
    ]


def unknown_topic_id(topic_id: bytes) -> KafkaError:
    return KafkaError(ErrorCode.UNKNOWN_TOPIC_ID, f"no topic has id {uuid.UUID(bytes=topic_id)}")
