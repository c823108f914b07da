"""Broker sessions across a controller election: standbys remember brokers' heartbeats, so a
newly active controller fences a broker that died before the election when its own session
ends, and still gives a broker it never heard from Kafka's whole-session grace."""

from __future__ import annotations

from metadata_quorum.cluster import (
    BrokerSessions,
    generate_register_broker,
    generate_session_expiry,
    note_standby_heartbeat,
)
from metadata_quorum.image import MetadataImage, apply
from metadata_quorum.records import Endpoint, FenceBroker, UnfenceBroker

SESSION_MS = 2_000


def registered(broker_ids: list[int]) -> MetadataImage:
    """An image with the brokers registered and unfenced."""
    image, sessions = MetadataImage(), BrokerSessions(SESSION_MS)
    for broker_id in broker_ids:
        endpoints = (Endpoint("BROKER", "127.0.0.1", 9000 + broker_id),)
        records = generate_register_broker(
            image, sessions, 0, broker_id, f"i{broker_id}", endpoints, None
        )
        image, rejected = apply(image, records)
        assert not rejected
        epoch = image.brokers[broker_id].broker_epoch
        image, rejected = apply(image, [UnfenceBroker(broker_id, epoch)])
        assert not rejected
    return image


def fenced_by_expiry(image: MetadataImage, sessions: BrokerSessions, now_ms: int) -> set[int]:
    return {
        r.broker_id
        for r in generate_session_expiry(image, sessions, now_ms)
        if isinstance(r, FenceBroker)
    }


def test_a_broker_silent_since_before_the_election_is_fenced_when_its_own_session_ends() -> None:
    image = registered([1, 2, 3])
    standby = BrokerSessions(SESSION_MS)
    for broker_id in (1, 2, 3):  # every broker heard at t=1000 ...
        assert note_standby_heartbeat(
            image, standby, 1_000, broker_id, image.brokers[broker_id].broker_epoch
        )
    for broker_id in (1, 2):  # ... then 3 dies; 1 and 2 go on
        note_standby_heartbeat(
            image, standby, 1_900, broker_id, image.brokers[broker_id].broker_epoch
        )
    standby.grant_all([1, 2, 3], now_ms=1_950)  # the election: this standby becomes active
    assert fenced_by_expiry(image, standby, 2_900) == set()
    assert fenced_by_expiry(image, standby, 3_001) == {3}  # 1000 + 2000, not 1950 + 2000


def test_a_broker_never_heard_or_heard_too_long_ago_gets_a_whole_session() -> None:
    image = registered([1, 2])
    standby = BrokerSessions(SESSION_MS)
    note_standby_heartbeat(image, standby, 100, 1, image.brokers[1].broker_epoch)  # long ago
    standby.grant_all([1, 2], now_ms=10_000)
    assert fenced_by_expiry(image, standby, 11_999) == set()
    assert fenced_by_expiry(image, standby, 12_001) == {1, 2}


def test_a_standby_ignores_a_heartbeat_of_another_incarnation_or_an_unknown_broker() -> None:
    image = registered([1])
    standby = BrokerSessions(SESSION_MS)
    stale_epoch = image.brokers[1].broker_epoch - 1
    assert not note_standby_heartbeat(image, standby, 500, 1, stale_epoch)
    assert not note_standby_heartbeat(image, standby, 500, 7, 0)
    assert standby.last_contact_ms == {}
