"""The share session cache (KIP-932): epoch 0 opens (replacing the member's earlier session),
later requests carry the next epoch, -1 closes; the errors Kafka's ShareSessionCache answers;
and the bound on sessions, with idle ones evicted."""

from __future__ import annotations

import pytest

from dataplane.coordinator.share_sessions import EPOCH_MAX, ShareSessionCache, next_epoch
from raftlog.errors import ErrorCode, KafkaError

T = bytes(16)


def refused(error: ErrorCode) -> pytest.RaisesExc[KafkaError]:
    return pytest.raises(KafkaError, check=lambda e: e.error is error)


def test_a_session_opens_advances_and_closes() -> None:
    cache = ShareSessionCache(10, evict_idle_ms=60_000)
    session, ended = cache.open("g", "m", [(T, 0)], 0)
    assert (session.epoch, list(session.partitions), ended) == (1, [(T, 0)], [])
    session = cache.advance("g", "m", 1, 5, added=[(T, 1)], forgotten=[(T, 0)])
    assert (session.epoch, list(session.partitions)) == (2, [(T, 1)])
    with refused(ErrorCode.INVALID_SHARE_SESSION_EPOCH):
        cache.advance("g", "m", 1, 6)  # a replay of an old epoch
    assert cache.close("g", "m") is session
    with refused(ErrorCode.SHARE_SESSION_NOT_FOUND):
        cache.advance("g", "m", 2, 7)
    with refused(ErrorCode.SHARE_SESSION_NOT_FOUND):
        cache.close("g", "m")


def test_opening_again_ends_the_members_earlier_session() -> None:
    cache = ShareSessionCache(10, evict_idle_ms=60_000)
    first, _ = cache.open("g", "m", [(T, 0)], 0)
    second, ended = cache.open("g", "m", [(T, 1)], 1)
    assert ended == [first] and cache.get("g", "m") is second and len(cache) == 1
    other, _ = cache.open("other-group", "m", [], 2)  # another group: another session
    assert len(cache) == 2 and other is not second


def test_a_full_cache_evicts_an_idle_session_or_refuses() -> None:
    cache = ShareSessionCache(2, evict_idle_ms=1_000)
    idle, _ = cache.open("g", "a", [], 0)
    cache.open("g", "b", [], 500)
    with refused(ErrorCode.SHARE_SESSION_LIMIT_REACHED):
        cache.open("g", "c", [], 900)  # the oldest was used 900 ms ago
    cache.advance("g", "a", 1, 950)  # a is used again: b is now the least recently used
    _, ended = cache.open("g", "c", [], 1_600)
    assert [s.member_id for s in ended] == ["b"] and cache.get("g", "a") is idle


def test_epochs_wrap_to_one_never_to_zero_or_minus_one() -> None:
    assert [next_epoch(e) for e in (0, 1, EPOCH_MAX, -1)] == [1, 2, 1, 1]


def test_a_closed_connection_ends_the_sessions_it_opened_only() -> None:
    """Kafka's ShareSessionCache.removeConnection: the sessions a connection opened end with it;
    a member that reopened its session on another connection keeps the new one."""
    cache = ShareSessionCache(10, evict_idle_ms=60_000)
    gone, _ = cache.open("g", "a", [(T, 0)], 0, connection_id="c1")
    moved, _ = cache.open("g", "b", [(T, 0)], 0, connection_id="c1")
    kept, _ = cache.open("g", "c", [(T, 0)], 0, connection_id="c2")
    reopened, _ = cache.open("g", "b", [(T, 0)], 1, connection_id="c3")  # b reconnected
    assert cache.remove_connection("c1") == [gone]
    assert cache.get("g", "a") is None
    assert cache.get("g", "b") is reopened and cache.get("g", "c") is kept
    assert cache.remove_connection("c1") == [] and cache.remove_connection("") == []
    assert moved is not reopened and len(cache) == 2
