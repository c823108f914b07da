"""Share sessions (KIP-932's share session cache, Kafka's ``ShareSessionCache``): pure, the
clock passed in. One cache per broker (the :class:`SharePartitionManager` holds it, as Kafka's
does), served through both doors: the Kafka listener's and BrokerService's ShareFetch and
ShareAcknowledge.

A share consumer keeps one share session per broker it fetches from, keyed by (group id,
member id). ShareFetch with epoch 0 opens it with the partitions to fetch (replacing the
member's earlier session, whose records the caller releases); each later request carries the
session's next epoch (1, 2, ... wrapping to 1) and adds partitions or forgets some; epoch -1
closes it (the caller releases the member's records on its partitions). A request for a
session the cache does not hold gets SHARE_SESSION_NOT_FOUND, one with another epoch
INVALID_SHARE_SESSION_EPOCH. ShareAcknowledge cannot open a session (epoch 0:
INVALID_SHARE_SESSION_EPOCH).

A session opened on a Kafka connection belongs to it: when the connection closes (the client
died, its socket dropped) the session ends and its member's records are released at once
(Kafka's ``SharePartitionManager`` connection-disconnect listener and
``ShareSessionCache.removeConnection``), not at the expiry of their locks.

The cache holds at most ``max_sessions`` (``group.share.max.share.sessions``): a new session
when it is full evicts the least recently used session idle for ``evict_idle_ms``, else gets
SHARE_SESSION_LIMIT_REACHED.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from raftlog.errors import ErrorCode, KafkaError

INITIAL_EPOCH, FINAL_EPOCH = 0, -1
EPOCH_MAX = 2**31 - 1
SessionKey = tuple[str, str]  # (group id, member id)
PartitionId = tuple[bytes, int]  # (topic id, partition)


def next_epoch(epoch: int) -> int:
    """Kafka's ``ShareRequestMetadata.nextEpoch``: 0 -> 1, ... , MAX -> 1 (never 0 or -1)."""
    return 1 if epoch >= EPOCH_MAX or epoch < 0 else epoch + 1


@dataclass
class ShareSession:
    group_id: str
    member_id: str
    epoch: int  # the epoch the next request must carry
    last_used_ms: int
    partitions: dict[PartitionId, None] = field(default_factory=dict)  # ordered set
    connection_id: str = ""  # the connection that opened it ("": none, e.g. gRPC)

    @property
    def key(self) -> SessionKey:
        return self.group_id, self.member_id


class ShareSessionCache:
    def __init__(self, max_sessions: int, evict_idle_ms: int) -> None:
        assert max_sessions >= 1, "a share session cache holds at least one session"
        self.max_sessions = max_sessions
        self.evict_idle_ms = evict_idle_ms
        self._sessions: OrderedDict[SessionKey, ShareSession] = OrderedDict()  # LRU first

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, group_id: str, member_id: str) -> ShareSession | None:
        return self._sessions.get((group_id, member_id))

    def open(
        self,
        group_id: str,
        member_id: str,
        partitions: Iterable[PartitionId],
        now_ms: int,
        connection_id: str = "",
    ) -> tuple[ShareSession, list[ShareSession]]:
        """ShareFetch epoch 0: a new session (bound to ``connection_id``, if any); and the
        sessions it ends (the member's earlier one, an evicted idle one), whose records the
        caller releases."""
        ended: list[ShareSession] = []
        earlier = self._sessions.pop((group_id, member_id), None)
        if earlier is not None:
            ended.append(earlier)
        if len(self._sessions) >= self.max_sessions:
            _, oldest = next(iter(self._sessions.items()))
            if now_ms - oldest.last_used_ms < self.evict_idle_ms:
                raise KafkaError(
                    ErrorCode.SHARE_SESSION_LIMIT_REACHED,
                    f"the broker holds {len(self._sessions)} share sessions, its maximum "
                    "(group.share.max.share.sessions)",
                )
            ended.append(self._sessions.pop(oldest.key))
        session = ShareSession(
            group_id, member_id, next_epoch(INITIAL_EPOCH), now_ms, connection_id=connection_id
        )
        session.partitions.update(dict.fromkeys(partitions))
        self._sessions[session.key] = session
        return session, ended

    def advance(
        self,
        group_id: str,
        member_id: str,
        epoch: int,
        now_ms: int,
        added: Iterable[PartitionId] = (),
        forgotten: Iterable[PartitionId] = (),
    ) -> ShareSession:
        """A request at the session's epoch (ShareFetch or ShareAcknowledge, epoch > 0): the
        session with its partitions updated and its epoch moved on."""
        session = self._existing(group_id, member_id)
        if epoch != session.epoch:
            raise KafkaError(
                ErrorCode.INVALID_SHARE_SESSION_EPOCH,
                f"share session of member {member_id!r} expects epoch {session.epoch}, got {epoch}",
            )
        for partition in forgotten:
            session.partitions.pop(partition, None)
        for partition in added:
            session.partitions.setdefault(partition, None)
        session.epoch = next_epoch(session.epoch)
        self._touch(session, now_ms)
        return session

    def close(self, group_id: str, member_id: str) -> ShareSession:
        """Epoch -1: the session is removed; the caller releases its member's records."""
        session = self._existing(group_id, member_id)
        del self._sessions[session.key]
        return session

    def remove_connection(self, connection_id: str) -> list[ShareSession]:
        """A connection closed: the sessions it opened are removed (the caller releases their
        members' records). A member that opened a new session on another connection since
        keeps it (the new one is bound to the new connection)."""
        if not connection_id:
            return []
        gone = [s for s in self._sessions.values() if s.connection_id == connection_id]
        for session in gone:
            del self._sessions[session.key]
        return gone

    def covers(self, group_id: str, partition: PartitionId) -> bool:
        """Whether a session of the group fetches ``partition`` (else its share partition may
        be unloaded: nobody here holds its records)."""
        return any(
            s.group_id == group_id and partition in s.partitions for s in self._sessions.values()
        )

    def _existing(self, group_id: str, member_id: str) -> ShareSession:
        session = self._sessions.get((group_id, member_id))
        if session is None:
            raise KafkaError(
                ErrorCode.SHARE_SESSION_NOT_FOUND,
                f"no share session of member {member_id!r} of group {group_id!r} on this broker",
            )
        return session

    def _touch(self, session: ShareSession, now_ms: int) -> None:
        session.last_used_ms = now_ms
        self._sessions.move_to_end(session.key)
