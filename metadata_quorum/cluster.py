"""Cluster control: broker registration, heartbeats, sessions, fencing, cordons, producer-id
blocks.

Sessions live only in the controllers' memory (:class:`BrokerSessions`); everything they decide
becomes records. Brokers heartbeat the active controller and also tell the standbys they are
alive (:func:`note_standby_heartbeat`), so a newly active controller knows when it last heard
from each broker: a broker that died shortly before the old controller did is fenced when its
own session ends, not a whole session after the election (Kafka's new controller grants every
broker a fresh session, which a combined node's death pays twice). Time is a number passed in
(monotonic milliseconds of the controller's own clock), never read here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from metadata_quorum import configs
from metadata_quorum.features import elr_enabled
from metadata_quorum.image import PRODUCER_ID_BLOCK_SIZE, MetadataImage
from metadata_quorum.records import (
    BrokerRegistrationChange,
    CordonBroker,
    Endpoint,
    FenceBroker,
    MetadataRecord,
    ProducerIdsRecord,
    RegisterBroker,
    UnfenceBroker,
    UnregisterBroker,
)
from metadata_quorum.replication import generate_leadership_changes
from raftlog.errors import ErrorCode, KafkaError

_log = logging.getLogger(__name__)


@dataclass
class BrokerSessions:
    """Last heartbeat per broker; a broker silent for ``session_timeout_ms`` is expired."""

    session_timeout_ms: int
    last_contact_ms: dict[int, int] = field(default_factory=dict)
    metadata_offset: dict[int, int] = field(default_factory=dict)

    def touch(self, broker_id: int, now_ms: int, metadata_offset: int | None = None) -> None:
        self.last_contact_ms[broker_id] = now_ms
        if metadata_offset is not None:
            self.metadata_offset[broker_id] = metadata_offset

    def grant_all(self, broker_ids: list[int], now_ms: int) -> None:
        """A newly active controller gives every broker it has not heard from within a session
        a full session before fencing it (Kafka's grace); a broker it heard from as a standby
        keeps that contact time, so its session runs on across the election."""
        heard = {
            broker_id: last
            for broker_id, last in self.last_contact_ms.items()
            if now_ms - self.session_timeout_ms <= last <= now_ms
        }
        self.last_contact_ms = {b: heard.get(b, now_ms) for b in broker_ids}
        self.metadata_offset = {}

    def expired(self, image: MetadataImage, now_ms: int) -> list[int]:
        """Unfenced brokers whose session lapsed (a broker never heard from counts from now)."""
        out = []
        for broker in image.brokers.values():
            last = self.last_contact_ms.setdefault(broker.broker_id, now_ms)
            if not broker.fenced and now_ms - last > self.session_timeout_ms:
                out.append(broker.broker_id)
        return sorted(out)


@dataclass(frozen=True)
class HeartbeatResult:
    records: list[MetadataRecord]
    is_caught_up: bool
    is_fenced: bool
    should_shut_down: bool


def generate_register_broker(
    image: MetadataImage,
    sessions: BrokerSessions,
    now_ms: int,
    broker_id: int,
    incarnation_id: str,
    endpoints: tuple[Endpoint, ...],
    rack: str | None,
    static_configs: Mapping[str, str] | None = None,
    previous_broker_epoch: int = -1,
) -> list[MetadataRecord]:
    """Records for a (re)registration; empty when this incarnation is already registered
    (a retried request). A different incarnation is refused while the old one's session lives.
    ``static_configs`` (the dynamic broker configs the broker's config file sets) are validated
    as a broker's own overrides are: INVALID_CONFIG names a bad one.

    KIP-966: a new incarnation shut down cleanly only if ``previous_broker_epoch`` (from the
    clean-shutdown marker its log dirs hold, -1 without one) is the registered broker epoch
    (Kafka's ``ClusterControlManager.registerBroker``). Otherwise, with
    eligible.leader.replicas.version 1, it may have lost its unflushed tail: it leaves every
    ISR and ELR and cannot be elected until it has caught up (Kafka's
    ``handleBrokerUncleanShutdown``). A clean one is handled as a fence: ISR only."""
    if broker_id < 0:
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"broker id {broker_id} must be >= 0")
    if not endpoints:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "a broker must register at least one listener")
    current = image.brokers.get(broker_id)
    if current is not None and current.incarnation_id == incarnation_id:
        return []
    if current is not None and not current.fenced:
        last = sessions.last_contact_ms.get(broker_id, now_ms)
        if now_ms - last <= sessions.session_timeout_ms:
            raise KafkaError(
                ErrorCode.DUPLICATE_BROKER_REGISTRATION,
                f"broker {broker_id} is registered by another incarnation whose session is live "
                f"(expires within {sessions.session_timeout_ms} ms)",
            )
    statics = dict(static_configs or {})
    configs.validate_static_broker_configs(statics)
    records: list[MetadataRecord] = [
        RegisterBroker(broker_id, incarnation_id, endpoints, rack, tuple(sorted(statics.items())))
    ]
    # The new incarnation starts fenced: move leadership and ISR membership off the old one.
    usable = image.usable_broker_ids() - {broker_id}
    unclean = current is not None and not clean_shutdown(
        current.broker_epoch, previous_broker_epoch
    )
    changes = generate_leadership_changes(
        image, usable, {broker_id}, unclean_shutdown={broker_id} if unclean else ()
    )
    if unclean and elr_enabled(image):
        _log.info(
            "broker %d registered after an unclean shutdown (previous epoch %d, registered %d): "
            "removed from the ISR/ELR of %d partitions",
            broker_id, previous_broker_epoch, current.broker_epoch if current else -1, len(changes),
        )  # fmt: skip
    records.extend(changes)
    sessions.touch(broker_id, now_ms)
    return records


def clean_shutdown(registered_epoch: int, previous_broker_epoch: int) -> bool:
    """The new incarnation proves the old one shut down cleanly (Kafka: ``storedBrokerEpoch ==
    request.previousBrokerEpoch()``; -1, no marker, never matches a registered epoch)."""
    return previous_broker_epoch >= 0 and previous_broker_epoch == registered_epoch


def _check_epoch(image: MetadataImage, broker_id: int, broker_epoch: int) -> None:
    broker = image.brokers.get(broker_id)
    if broker is None:
        raise KafkaError(ErrorCode.BROKER_ID_NOT_REGISTERED, f"broker {broker_id} not registered")
    if broker.broker_epoch != broker_epoch:
        raise KafkaError(
            ErrorCode.STALE_BROKER_EPOCH,
            f"broker {broker_id} epoch is {broker.broker_epoch}, not {broker_epoch}",
        )


def note_standby_heartbeat(
    image: MetadataImage, sessions: BrokerSessions, now_ms: int, broker_id: int, broker_epoch: int
) -> bool:
    """A standby controller heard a broker's heartbeat: remember the contact (nothing else:
    only the active controller decides). Only for the registered incarnation; True if noted."""
    broker = image.brokers.get(broker_id)
    if broker is None or broker.broker_epoch != broker_epoch:
        return False
    sessions.touch(broker_id, now_ms)
    return True


def generate_heartbeat(
    image: MetadataImage,
    sessions: BrokerSessions,
    now_ms: int,
    broker_id: int,
    broker_epoch: int,
    metadata_offset: int,
    want_fence: bool,
    want_shutdown: bool,
) -> HeartbeatResult:
    _check_epoch(image, broker_id, broker_epoch)
    sessions.touch(broker_id, now_ms, metadata_offset)
    broker = image.brokers[broker_id]
    caught_up = metadata_offset >= broker.broker_epoch
    usable = image.usable_broker_ids()
    if want_fence or (want_shutdown and broker.fenced):
        if broker.fenced:
            return HeartbeatResult([], caught_up, True, want_shutdown)
        records: list[MetadataRecord] = [FenceBroker(broker_id, broker_epoch)]
        records += generate_leadership_changes(image, usable - {broker_id}, {broker_id})
        return HeartbeatResult(records, caught_up, True, want_shutdown)
    if want_shutdown:
        return _controlled_shutdown(image, broker_id, broker_epoch, caught_up)
    if broker.fenced and caught_up:
        records = [UnfenceBroker(broker_id, broker_epoch)]
        records += generate_leadership_changes(image, usable | {broker_id}, {broker_id})
        return HeartbeatResult(records, True, False, False)
    return HeartbeatResult([], caught_up, broker.fenced, False)


def _controlled_shutdown(
    image: MetadataImage, broker_id: int, broker_epoch: int, caught_up: bool
) -> HeartbeatResult:
    """Move leadership away first; once the broker leads nothing, fence it and let it stop."""
    broker = image.brokers[broker_id]
    records: list[MetadataRecord] = []
    if not broker.in_controlled_shutdown:
        records.append(BrokerRegistrationChange(broker_id, broker_epoch, True))
        usable = image.usable_broker_ids() - {broker_id}
        records += generate_leadership_changes(image, usable, {broker_id})
        return HeartbeatResult(records, caught_up, False, False)
    leads = any(p.leader == broker_id for t in image.topics.values() for p in t.partitions.values())
    if leads:
        # Leadership it still holds (granted while the shutdown record was in flight) moves now;
        # a partition with no other live ISR member goes offline, as in Kafka.
        usable = image.usable_broker_ids() - {broker_id}
        records = generate_leadership_changes(image, usable, {broker_id})
        return HeartbeatResult(records, caught_up, False, not records)
    return HeartbeatResult([FenceBroker(broker_id, broker_epoch)], caught_up, True, True)


def generate_session_expiry(
    image: MetadataImage, sessions: BrokerSessions, now_ms: int
) -> list[MetadataRecord]:
    """Fence every broker whose session lapsed and re-elect its partitions."""
    expired = sessions.expired(image, now_ms)
    if not expired:
        return []
    records: list[MetadataRecord] = [FenceBroker(b, image.brokers[b].broker_epoch) for b in expired]
    usable = image.usable_broker_ids() - set(expired)
    records += generate_leadership_changes(image, usable, set(expired))
    return records


HOSTED_SHOWN_MAX = 5  # partitions named in the refusal of a broker that still hosts replicas


def hosted_partitions(image: MetadataImage, broker_id: int) -> list[str]:
    """``topic-partition`` of every partition with a replica on the broker (moving ones too)."""
    return [
        f"{topic.name}-{p}"
        for topic in sorted(image.topics.values(), key=lambda t: t.name)
        for p, current in sorted(topic.partitions.items())
        if broker_id in current.replicas
    ]


def generate_unregister_broker(
    image: MetadataImage, broker_id: int, force: bool
) -> list[MetadataRecord]:
    """UnregisterBroker: the broker leaves the cluster's metadata. Refused for an unknown broker
    (BROKER_ID_NOT_REGISTERED) and, unless ``force``, for one that still hosts replicas (move
    them off first) or is unfenced (still running: it would register again at its next
    heartbeat; a controlled shutdown fences it). Forced, it first leaves every ISR and
    leadership it holds, as a fenced broker does (Kafka's unregister does that and refuses
    nothing but an unknown broker)."""
    broker = image.brokers.get(broker_id)
    if broker is None:
        raise KafkaError(ErrorCode.BROKER_ID_NOT_REGISTERED, f"broker {broker_id} not registered")
    if not force:
        hosted = hosted_partitions(image, broker_id)
        if hosted:
            more = ", ..." if len(hosted) > HOSTED_SHOWN_MAX else ""
            shown = ", ".join(hosted[:HOSTED_SHOWN_MAX]) + more
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"broker {broker_id} still hosts {len(hosted)} replicas ({shown}): move them "
                "off first (raftlog cluster remove-node drains it), or force",
            )
        if not broker.fenced:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"broker {broker_id} is running (unfenced): shut it down first (controlled "
                "shutdown), or force",
            )
    usable = image.usable_broker_ids() - {broker_id}
    # it leaves every ISR and ELR (Kafka's handleBrokerUnregistered)
    records = generate_leadership_changes(image, usable, {broker_id}, unclean_shutdown={broker_id})
    records.append(UnregisterBroker(broker_id, broker.broker_epoch))
    return records


def generate_cordon_broker(
    image: MetadataImage, broker_id: int, cordoned: bool
) -> list[MetadataRecord]:
    """Cordon a broker (no new replicas on it) or lift its cordon; nothing when it already is
    so. Refused for an unknown broker (BROKER_ID_NOT_REGISTERED). A fenced broker may be
    cordoned: one that is down is typically the one about to be drained."""
    broker = image.brokers.get(broker_id)
    if broker is None:
        raise KafkaError(ErrorCode.BROKER_ID_NOT_REGISTERED, f"broker {broker_id} not registered")
    if broker.cordoned == cordoned:
        return []
    return [CordonBroker(broker_id, cordoned)]


def generate_allocate_producer_ids(
    image: MetadataImage, broker_id: int, broker_epoch: int
) -> tuple[ProducerIdsRecord, int, int]:
    """The next block of producer ids: (record, first id, block length)."""
    _check_epoch(image, broker_id, broker_epoch)
    start = image.next_producer_id
    end = start + PRODUCER_ID_BLOCK_SIZE
    return ProducerIdsRecord(broker_id, broker_epoch, end), start, PRODUCER_ID_BLOCK_SIZE
