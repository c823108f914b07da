"""Golden transcripts of the pure controller: steps in, records and images out, as plain text.

A scenario is a list of steps. Each step calls the ``generate_*`` functions against the current
image (as the active controller would), applies the records it got (or holds them back, to apply
later against a newer image and show the stale-precondition rejection), and the transcript shows:

    > the step
      @offset Record ...            every record, at the metadata offset it was applied at
      @offset REJECTED (reason) ... a record whose precondition no longer held
      held Record ...               a record generated now, applied by a later ``apply-held``
      = result                      the per-item answer (error code and message, or state)
      image @offset ...             the whole image afterwards

Time is a plain int (ms) given by the steps; topic ids come from a seeded ``random.Random``.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from metadata_quorum.cluster import (
    BrokerSessions,
    generate_allocate_producer_ids,
    generate_heartbeat,
    generate_register_broker,
    generate_session_expiry,
)
from metadata_quorum.image import MetadataImage, PartitionRegistration, apply
from metadata_quorum.records import (
    NO_LEADER,
    BrokerRegistrationChange,
    ConfigRecord,
    CordonBroker,
    Endpoint,
    FenceBroker,
    LeaderChange,
    MetadataRecord,
    PartitionChange,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBroker,
    RemoveTopic,
    TopicRecord,
    UnfenceBroker,
    UnregisterBroker,
)
from metadata_quorum.replication import (
    Generated,
    IsrRequest,
    ItemResult,
    NewTopic,
    generate_alter_partition,
    generate_create_partitions,
    generate_create_topics,
    generate_delete_topics,
    generate_elect_leaders,
    generate_preferred_rebalance,
)
from raftlog.errors import ErrorCode, KafkaError

SESSION_TIMEOUT_MS = 9000
SEED = 20240601


def _ids(values: Sequence[int]) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"


def _short(topic_id: uuid.UUID) -> str:
    return topic_id.hex[:8]


@dataclass
class Harness:
    """The controller's state as the transcript sees it, and the text written so far."""

    image: MetadataImage = field(default_factory=MetadataImage)
    sessions: BrokerSessions = field(default_factory=lambda: BrokerSessions(SESSION_TIMEOUT_MS))
    rng: random.Random = field(default_factory=lambda: random.Random(SEED))
    now_ms: int = 0
    names: dict[uuid.UUID, str] = field(default_factory=dict)
    held: list[MetadataRecord] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    # -- what steps call -----------------------------------------------------------------
    def propose(self, records: Sequence[MetadataRecord]) -> None:
        """Apply one batch now, as the controller would once it commits."""
        self._learn_names(records)
        first = self.image.offset + 1
        self.image, rejected = apply(self.image, records)
        reasons = {r.offset: r.reason for r in rejected}
        for offset, record in enumerate(records, start=first):
            text = self.record(record)
            if offset in reasons:
                self.lines.append(f"  @{offset} REJECTED ({reasons[offset]}): {text}")
            else:
                self.lines.append(f"  @{offset} {text}")

    def hold(self, records: Sequence[MetadataRecord]) -> None:
        """Generated against this image, applied later (after something else changed it)."""
        self._learn_names(records)
        self.held.extend(records)
        self.lines.extend(f"  held {self.record(r)}" for r in records)

    def result(self, text: str) -> None:
        self.lines.append(f"  = {text}")

    def epoch(self, broker_id: int) -> int:
        return self.image.brokers[broker_id].broker_epoch

    def topic_id(self, name: str) -> uuid.UUID:
        topic = self.image.topic(name)
        assert topic is not None, f"scenario bug: no topic {name}"
        return topic.topic_id

    def _learn_names(self, records: Sequence[MetadataRecord]) -> None:
        for record in records:
            if isinstance(record, TopicRecord):
                self.names[record.topic_id] = record.name

    # -- rendering -----------------------------------------------------------------------
    def partition_name(self, topic_id: uuid.UUID, partition: int) -> str:
        return f"{self.names.get(topic_id, _short(topic_id))}-{partition}"

    def record(self, record: MetadataRecord) -> str:
        match record:
            case RegisterBroker():
                rack = record.rack if record.rack is not None else "-"
                endpoints = ",".join(f"{e.name}://{e.address}" for e in record.endpoints)
                return (
                    f"RegisterBroker broker={record.broker_id} "
                    f"incarnation={record.incarnation_id} rack={rack} endpoints={endpoints}"
                )
            case UnregisterBroker() | FenceBroker() | UnfenceBroker():
                kind = type(record).__name__
                return f"{kind} broker={record.broker_id} broker_epoch={record.broker_epoch}"
            case BrokerRegistrationChange():
                return (
                    f"BrokerRegistrationChange broker={record.broker_id} "
                    f"broker_epoch={record.broker_epoch} "
                    f"in_controlled_shutdown={str(record.in_controlled_shutdown).lower()}"
                )
            case CordonBroker():
                cordoned = str(record.cordoned).lower()
                return f"CordonBroker broker={record.broker_id} cordoned={cordoned}"
            case TopicRecord():
                return f"TopicRecord name={record.name} id={_short(record.topic_id)}"
            case PartitionRecord():
                return (
                    f"PartitionRecord {self.partition_name(record.topic_id, record.partition_id)}"
                    f" {render_partition(record)}"
                )
            case PartitionChange():
                parts = [f"expected_partition_epoch={record.expected_partition_epoch}"]
                if record.leader is not None:
                    parts.append(f"leader={record.leader}")
                if record.isr is not None:
                    parts.append(f"isr={_ids(record.isr)}")
                if record.replicas is not None:
                    parts.append(f"replicas={_ids(record.replicas)}")
                name = self.partition_name(record.topic_id, record.partition_id)
                return f"PartitionChange {name} " + " ".join(parts)
            case RemoveTopic():
                name = self.names.get(record.topic_id, "?")
                return f"RemoveTopic name={name} id={_short(record.topic_id)}"
            case ConfigRecord():
                value = "<deleted>" if record.value is None else record.value
                return (
                    f"ConfigRecord {record.resource_type.name} {record.resource_name!r} "
                    f"{record.name}={value}"
                )
            case ProducerIdsRecord():
                return (
                    f"ProducerIdsRecord broker={record.broker_id} "
                    f"broker_epoch={record.broker_epoch} "
                    f"next_producer_id={record.next_producer_id}"
                )
            case LeaderChange():
                return f"LeaderChange leader={record.leader_id} term={record.term}"
        raise AssertionError(f"unknown record {record!r}")

    def item(self, result: ItemResult) -> str:
        label = result.name if len(result.name) <= 40 else f"{result.name[:8]}..."
        if result.partition >= 0:
            label = f"{result.name or '?'}-{result.partition}"
        text = f"{label}: {result.error.name}"
        if result.message:
            text += f" ({result.message})"
        if result.error is ErrorCode.NONE and result.num_partitions >= 0:
            text += f" partitions={result.num_partitions}"
        if result.error is ErrorCode.NONE and result.replication_factor >= 0:
            text += f" rf={result.replication_factor}"
        if result.error is ErrorCode.NONE and result.topic_id is not None and result.partition < 0:
            text += f" id={_short(result.topic_id)}"
        if result.state is not None:
            text += f" state: {render_partition(result.state)}"
        return text

    def generated(self, generated: Generated, hold: bool = False) -> None:
        if hold:
            self.hold(generated.records)
        else:
            self.propose(generated.records)
        for result in generated.results:
            self.result(self.item(result))

    def image_lines(self) -> list[str]:
        image = self.image
        out = [
            f"  image @{image.offset}: controller={image.controller_id} "
            f"next_producer_id={image.next_producer_id}"
        ]
        for broker_id, b in sorted(image.brokers.items()):
            state = "fenced" if b.fenced else "unfenced"
            if b.in_controlled_shutdown:
                state += " in-controlled-shutdown"
            rack = b.rack if b.rack is not None else "-"
            out.append(f"    broker {broker_id} epoch={b.broker_epoch} rack={rack} {state}")
        for topic in sorted(image.topics.values(), key=lambda t: t.name):
            configs = image.topic_configs(topic.name)
            shown = " ".join(f"{k}={v}" for k, v in sorted(configs.items()))
            out.append(f"    topic {topic.name} id={_short(topic.topic_id)} {shown}".rstrip())
            for p, registration in sorted(topic.partitions.items()):
                out.append(f"      {topic.name}-{p} {render_partition(registration)}")
        if image.topics:
            out.append(f"    leaders: {_leader_counts(image)}")
        return out


def render_partition(p: PartitionRecord | PartitionRegistration) -> str:
    return (
        f"replicas={_ids(p.replicas)} isr={_ids(p.isr)} leader={p.leader} "
        f"leader_epoch={p.leader_epoch} partition_epoch={p.partition_epoch}"
    )


def _leader_counts(image: MetadataImage) -> str:
    leaders = Counter(p.leader for t in image.topics.values() for p in t.partitions.values())
    text = " ".join(f"{b}={n}" for b, n in sorted(leaders.items()) if b != NO_LEADER)
    return f"{text} offline={leaders.get(NO_LEADER, 0)}".strip()


# -- steps ---------------------------------------------------------------------------------
class Step:
    def title(self) -> str:
        raise NotImplementedError

    def run(self, h: Harness) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Register(Step):
    broker_id: int
    rack: str | None = None
    incarnation: str | None = None

    def title(self) -> str:
        rack = f" rack={self.rack}" if self.rack is not None else ""
        return f"register broker={self.broker_id}{rack} incarnation={self._incarnation()}"

    def _incarnation(self) -> str:
        return self.incarnation or f"b{self.broker_id}-1"

    def run(self, h: Harness) -> None:
        endpoints = (Endpoint("BROKER", f"127.0.0.{10 + self.broker_id}", 9092),)
        try:
            records = generate_register_broker(
                h.image,
                h.sessions,
                h.now_ms,
                self.broker_id,
                self._incarnation(),
                endpoints,
                self.rack,
            )
        except KafkaError as error:
            h.result(f"{error.error.name} ({error.message})")
            return
        if not records:
            h.result("already registered (retry): no records")
        h.propose(records)


@dataclass(frozen=True)
class Heartbeat(Step):
    """One heartbeat per broker, in order, at ``now_ms``; each is generated against the image
    the previous one left. ``behind`` = the broker's metadata has not caught up (offset -1)."""

    brokers: tuple[int, ...]
    now_ms: int
    want_fence: bool = False
    want_shutdown: bool = False
    behind: bool = False
    broker_epoch: int | None = None

    def title(self) -> str:
        flags = [
            name
            for name, on in [
                ("want_fence", self.want_fence),
                ("want_shutdown", self.want_shutdown),
                ("behind", self.behind),
            ]
            if on
        ]
        if self.broker_epoch is not None:
            flags.append(f"broker_epoch={self.broker_epoch}")
        brokers = ",".join(str(b) for b in self.brokers)
        return " ".join([f"heartbeat brokers={brokers} now_ms={self.now_ms}", *flags])

    def run(self, h: Harness) -> None:
        h.now_ms = self.now_ms
        for broker_id in self.brokers:
            epoch = self.broker_epoch if self.broker_epoch is not None else h.epoch(broker_id)
            offset = -1 if self.behind else h.image.offset
            try:
                result = generate_heartbeat(
                    h.image,
                    h.sessions,
                    self.now_ms,
                    broker_id,
                    epoch,
                    offset,
                    self.want_fence,
                    self.want_shutdown,
                )
            except KafkaError as error:
                h.result(f"broker {broker_id}: {error.error.name} ({error.message})")
                continue
            h.propose(result.records)
            h.result(
                f"broker {broker_id}: is_caught_up={str(result.is_caught_up).lower()} "
                f"is_fenced={str(result.is_fenced).lower()} "
                f"should_shut_down={str(result.should_shut_down).lower()}"
            )


@dataclass(frozen=True)
class ExpireSessions(Step):
    now_ms: int

    def title(self) -> str:
        return f"expire-sessions now_ms={self.now_ms} (timeout {SESSION_TIMEOUT_MS} ms)"

    def run(self, h: Harness) -> None:
        h.now_ms = self.now_ms
        records = generate_session_expiry(h.image, h.sessions, self.now_ms)
        if not records:
            h.result("no session expired")
        h.propose(records)


def _assignments(assignments: Mapping[int, Sequence[int]]) -> str:
    return "{" + ", ".join(f"{p}:{_ids(r)}" for p, r in sorted(assignments.items())) + "}"


def _render_new_topic(t: NewTopic) -> str:
    text = repr(t.name) if len(t.name) <= 40 else f"'{t.name[:8]}...' ({len(t.name)} chars)"
    if t.num_partitions != -1:
        text += f" partitions={t.num_partitions}"
    if t.replication_factor != -1:
        text += f" rf={t.replication_factor}"
    if t.assignments is not None:
        text += f" assignments={_assignments(t.assignments)}"
    if t.configs:
        text += " configs={" + ", ".join(f"{k}={v}" for k, v in sorted(t.configs.items())) + "}"
    return text


@dataclass(frozen=True)
class CreateTopics(Step):
    topics: tuple[NewTopic, ...]
    validate_only: bool = False

    def title(self) -> str:
        flag = " validate_only" if self.validate_only else ""
        return "create-topics " + "; ".join(_render_new_topic(t) for t in self.topics) + flag

    def run(self, h: Harness) -> None:
        h.generated(generate_create_topics(h.image, self.topics, self.validate_only, h.rng))


@dataclass(frozen=True)
class DeleteTopics(Step):
    names: tuple[str, ...]

    def title(self) -> str:
        return "delete-topics " + " ".join(repr(n) for n in self.names)

    def run(self, h: Harness) -> None:
        h.generated(generate_delete_topics(h.image, self.names))


@dataclass(frozen=True)
class CreatePartitions(Step):
    """``also``: more (topic, total) items in the same request."""

    name: str
    total: int
    assignments: Mapping[int, Sequence[int]] | None = None
    also: tuple[tuple[str, int], ...] = ()

    def title(self) -> str:
        text = f"create-partitions {self.name!r} total={self.total}"
        if self.assignments is not None:
            text += f" assignments={_assignments(self.assignments)}"
        return text + "".join(f"; {name!r} total={total}" for name, total in self.also)

    def run(self, h: Harness) -> None:
        request = [(self.name, self.total, self.assignments)]
        request += [(name, total, None) for name, total in self.also]
        h.generated(generate_create_partitions(h.image, request, validate_only=False))


@dataclass(frozen=True)
class AlterPartition(Step):
    """AlterPartition from ``broker``; epochs default to the image's current ones (plus the
    given deltas, to send stale ones). ``hold`` keeps the records for ``ApplyHeld``."""

    broker: int
    topic: str
    partition: int
    new_isr: tuple[int, ...]
    leader_epoch_delta: int = 0
    partition_epoch_delta: int = 0
    broker_epoch: int | None = None
    hold: bool = False

    def title(self) -> str:
        text = (
            f"alter-partition broker={self.broker} {self.topic}-{self.partition} "
            f"new_isr={_ids(self.new_isr)}"
        )
        if self.leader_epoch_delta:
            text += f" leader_epoch{self.leader_epoch_delta:+d}"
        if self.partition_epoch_delta:
            text += f" partition_epoch{self.partition_epoch_delta:+d}"
        if self.broker_epoch is not None:
            text += f" broker_epoch={self.broker_epoch}"
        return text + (" (held)" if self.hold else "")

    def run(self, h: Harness) -> None:
        topic_id = h.topic_id(self.topic)
        current = h.image.partition(topic_id, self.partition)
        assert current is not None, "scenario bug: no such partition"
        request = IsrRequest(
            topic_id,
            self.partition,
            current.leader_epoch + self.leader_epoch_delta,
            self.new_isr,
            current.partition_epoch + self.partition_epoch_delta,
        )
        epoch = self.broker_epoch if self.broker_epoch is not None else h.epoch(self.broker)
        generated = generate_alter_partition(h.image, self.broker, epoch, [request])
        h.generated(generated, hold=self.hold)


@dataclass(frozen=True)
class AlterPartitions(Step):
    """One AlterPartition request with several items, each at the current epochs."""

    broker: int
    items: tuple[tuple[str, int, tuple[int, ...]], ...]

    def title(self) -> str:
        items = " ".join(f"{t}-{p}:new_isr={_ids(isr)}" for t, p, isr in self.items)
        return f"alter-partition broker={self.broker} {items}"

    def run(self, h: Harness) -> None:
        requests = []
        for topic, p, isr in self.items:
            current = h.image.partition(h.topic_id(topic), p)
            assert current is not None, "scenario bug: no such partition"
            requests.append(
                IsrRequest(h.topic_id(topic), p, current.leader_epoch, isr, current.partition_epoch)
            )
        epoch = h.epoch(self.broker)
        h.generated(generate_alter_partition(h.image, self.broker, epoch, requests))


@dataclass(frozen=True)
class ElectLeaders(Step):
    unclean: bool
    wanted: tuple[tuple[str, int], ...] | None = None

    def title(self) -> str:
        kind = "UNCLEAN" if self.unclean else "PREFERRED"
        wanted = "all" if self.wanted is None else " ".join(f"{t}-{p}" for t, p in self.wanted)
        return f"elect-leaders {kind} {wanted}"

    def run(self, h: Harness) -> None:
        h.generated(generate_elect_leaders(h.image, self.unclean, self.wanted))


@dataclass(frozen=True)
class PreferredRebalance(Step):
    def title(self) -> str:
        return "preferred-rebalance (auto.leader.rebalance.enable)"

    def run(self, h: Harness) -> None:
        records = generate_preferred_rebalance(h.image)
        if not records:
            h.result("nothing to move")
        h.propose(records)


@dataclass(frozen=True)
class AllocateProducerIds(Step):
    broker: int
    broker_epoch: int | None = None
    hold: bool = False

    def title(self) -> str:
        text = f"allocate-producer-ids broker={self.broker}"
        if self.broker_epoch is not None:
            text += f" broker_epoch={self.broker_epoch}"
        return text + (" (held)" if self.hold else "")

    def run(self, h: Harness) -> None:
        epoch = self.broker_epoch if self.broker_epoch is not None else h.epoch(self.broker)
        try:
            record, first, length = generate_allocate_producer_ids(h.image, self.broker, epoch)
        except KafkaError as error:
            h.result(f"{error.error.name} ({error.message})")
            return
        if self.hold:
            h.hold([record])
        else:
            h.propose([record])
        h.result(f"block [{first}, {first + length})")


@dataclass(frozen=True)
class ApplyHeld(Step):
    def title(self) -> str:
        return "apply-held (records generated against an older image)"

    def run(self, h: Harness) -> None:
        held, h.held = h.held, []
        h.propose(held)


def check_partitions(image: MetadataImage) -> None:
    """What every transcript must show, whatever a careless --update-transcripts accepts."""
    for topic in image.topics.values():
        for p, reg in topic.partitions.items():
            where = f"{topic.name}-{p}: {render_partition(reg)}"
            assert len(set(reg.replicas)) == len(reg.replicas) >= 1, where
            assert reg.isr and len(set(reg.isr)) == len(reg.isr), where
            assert set(reg.isr) <= set(reg.replicas), where
            assert reg.leader == NO_LEADER or reg.leader in reg.isr, where


def run_scenario(steps: Sequence[Step]) -> str:
    h = Harness()
    out: list[str] = []
    previous: list[str] = []
    for step in steps:
        h.lines = []
        step.run(h)
        check_partitions(h.image)
        out.append(f"> {step.title()}")
        out.extend(h.lines)
        image = h.image_lines()
        state = [image[0].split(":", 1)[1], *image[1:]]  # everything but the offset
        if state == previous:
            out.append(f"  image @{h.image.offset}: unchanged")
        else:
            out.extend(image)
        previous = state
        out.append("")
    assert not h.held, "scenario bug: records held but never applied"
    return "\n".join(out)
