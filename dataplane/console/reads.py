"""What each console page shows, read through the client library only: the admin client
(cluster, quorum, topics, configs, groups) and a consumer (log start and end offsets, records),
as ``raftlog`` commands read them; the console has no other path into a broker. Each function
returns plain frozen data for :mod:`dataplane.console.pages` to render.

Numbers the admin API does not give are not shown: a partition's size in bytes and the disk a
broker uses (raftlog's admin client has no DescribeLogDirs yet); the record count shown is the
log end offset minus the log start offset.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from dataplane.client import AdminClient, Consumer, ConsumerRecord, TopicPartition
from dataplane.client.admin import (
    BrokerDescription,
    ConfigEntry,
    ConfigResource,
    GroupListing,
    LogDirDescription,
    PartitionDescription,
    QuorumDescription,
    ResourceType,
    TopicDescription,
)
from dataplane.client.group_lag import GroupLag, describe_group_lag
from dataplane.console.history import Sample
from metadata_quorum.security.channels import ClientSecurity
from raftlog.errors import KafkaError

log = logging.getLogger(__name__)

RECORDS_PER_PAGE_MAX = 100
RECORDS_READ_TIMEOUT_S = 5.0  # a page of records is given up to this long to arrive
POLL_MS = 200


@dataclass(frozen=True)
class BrokerRow:
    broker: BrokerDescription
    state: Literal["unfenced", "fenced", "shutting down"]
    leaders: int  # partitions it leads
    replicas: int  # replicas it hosts
    disk_used: int | None = None  # bytes its replicas take (DescribeLogDirs); None: unknown
    disk_free: int | None = None  # usable bytes left on its log directory's filesystem


@dataclass(frozen=True)
class ClusterView:
    cluster_id: str
    controller_id: int
    metadata_offset: int
    brokers: tuple[BrokerRow, ...]
    quorum: QuorumDescription


@dataclass(frozen=True)
class PartitionRow:
    description: PartitionDescription
    log_start_offset: int | None
    log_end_offset: int | None  # the high watermark
    size_bytes: int | None = None  # the leader's replica on disk; None: unknown

    @property
    def under_replicated(self) -> bool:
        return len(self.description.isr) < len(self.description.replicas)

    @property
    def records(self) -> int | None:
        if self.log_start_offset is None or self.log_end_offset is None:
            return None
        return self.log_end_offset - self.log_start_offset


@dataclass(frozen=True)
class TopicView:
    name: str
    topic_id: bytes
    partitions: tuple[PartitionRow, ...]
    configs: tuple[ConfigEntry, ...]  # every config the controller describes, sorted

    @property
    def under_replicated(self) -> int:
        return sum(p.under_replicated for p in self.partitions)

    @property
    def records(self) -> int:
        return sum(p.records or 0 for p in self.partitions)

    @property
    def size_bytes(self) -> int | None:
        """The leaders' replicas on disk, None when unknown (no DESCRIBE on the cluster)."""
        sizes = [p.size_bytes for p in self.partitions]
        return None if not sizes or None in sizes else sum(s or 0 for s in sizes)


@dataclass(frozen=True)
class RecordsView:
    topic: str
    partitions: tuple[int, ...]
    partition: int
    log_start_offset: int
    log_end_offset: int
    from_offset: int
    records: tuple[ConsumerRecord, ...]


def _state(broker: BrokerDescription) -> Literal["unfenced", "fenced", "shutting down"]:
    if broker.in_controlled_shutdown:
        return "shutting down"
    return "fenced" if broker.fenced else "unfenced"


def read_cluster(admin: AdminClient) -> ClusterView:
    cluster = admin.describe_cluster()
    topics = admin.describe_topics()
    leaders: Counter[int] = Counter()
    replicas: Counter[int] = Counter()
    for topic in topics.values():
        for p in topic.partitions:
            leaders[p.leader] += 1
            replicas.update(p.replicas)
    dirs = _log_dirs(admin)
    rows = tuple(
        BrokerRow(
            b,
            _state(b),
            leaders[b.broker_id],
            replicas[b.broker_id],
            dirs[b.broker_id].used_bytes if b.broker_id in dirs else None,
            dirs[b.broker_id].usable_bytes if b.broker_id in dirs else None,
        )
        for b in sorted(cluster.brokers, key=lambda b: b.broker_id)
    )
    return ClusterView(
        cluster.cluster_id, cluster.controller_id, cluster.metadata_offset, rows,
        admin.describe_quorum(),
    )  # fmt: skip


def read_topics(
    admin: AdminClient, bootstrap: list[str], security: ClientSecurity | None
) -> tuple[TopicView, ...]:
    """Every topic with its partitions and their offsets (no configs: the topic page has them)."""
    described = admin.describe_topics()
    tps = [TopicPartition(t, p.partition) for t, d in described.items() for p in d.partitions]
    starts, ends = _offsets(bootstrap, security, tps)
    sizes = _leader_sizes(admin, described)
    return tuple(
        TopicView(
            name,
            d.topic_id,
            tuple(_partition_row(name, p, starts, ends, sizes) for p in d.partitions),
            (),
        )
        for name, d in sorted(described.items())
    )


def read_topic(
    admin: AdminClient, bootstrap: list[str], security: ClientSecurity | None, name: str
) -> TopicView:
    """One topic; raises UNKNOWN_TOPIC_OR_PARTITION for a topic that does not exist."""
    d = admin.describe_topics([name])[name]
    tps = [TopicPartition(name, p.partition) for p in d.partitions]
    starts, ends = _offsets(bootstrap, security, tps)
    configs = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)])
    entries = next(iter(configs.values()), {})
    sizes = _leader_sizes(admin, {name: d})
    return TopicView(
        name, d.topic_id,
        tuple(_partition_row(name, p, starts, ends, sizes) for p in d.partitions),
        tuple(entries[k] for k in sorted(entries)),
    )  # fmt: skip


def _partition_row(
    topic: str,
    p: PartitionDescription,
    starts: dict[TopicPartition, int],
    ends: dict[TopicPartition, int],
    sizes: dict[TopicPartition, int],
) -> PartitionRow:
    tp = TopicPartition(topic, p.partition)
    return PartitionRow(p, starts.get(tp), ends.get(tp), sizes.get(tp))


def _log_dirs(admin: AdminClient, topics: Iterable[str] = ()) -> dict[int, LogDirDescription]:
    """Every live broker's log directory; none when the user may not DESCRIBE the cluster
    (Kafka's rule for DescribeLogDirs) or a broker does not answer: the sizes show as -."""
    try:
        return admin.describe_log_dirs(topics=topics)
    except KafkaError:
        return {}


def _leader_sizes(
    admin: AdminClient, described: Mapping[str, TopicDescription]
) -> dict[TopicPartition, int]:
    """Each partition's size on disk at its leader."""
    if not described:
        return {}
    dirs = _log_dirs(admin, described)
    sizes = {}
    for name, d in described.items():
        for p in d.partitions:
            tp = TopicPartition(name, p.partition)
            found = dirs.get(p.leader)
            if found is not None and tp in found.replica_bytes:
                sizes[tp] = found.replica_bytes[tp]
    return sizes


def _offsets(
    bootstrap: list[str], security: ClientSecurity | None, tps: list[TopicPartition]
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    if not tps:
        return {}, {}
    with Consumer(bootstrap, security=security, client_id="raftlog-console") as consumer:
        return consumer.beginning_offsets(tps), consumer.end_offsets(tps)


def read_records(
    admin: AdminClient,
    bootstrap: list[str],
    security: ClientSecurity | None,
    topic: str,
    partition: int,
    from_offset: int | None,
    timestamp_ms: int | None,
    limit: int,
) -> RecordsView:
    """Up to ``limit`` records of one partition from ``from_offset`` (clamped into the log),
    or from the first record at or after ``timestamp_ms``, or else the last ``limit``."""
    limit = max(1, min(limit, RECORDS_PER_PAGE_MAX))
    partitions = tuple(p.partition for p in admin.describe_topics([topic])[topic].partitions)
    tp = TopicPartition(topic, partition)
    with Consumer(
        bootstrap, security=security, client_id="raftlog-console", enable_auto_commit=False,
        max_poll_records=limit,
    ) as consumer:  # fmt: skip
        start, end = consumer.beginning_offsets([tp])[tp], consumer.end_offsets([tp])[tp]
        if timestamp_ms is not None:
            found = consumer.offsets_for_times({tp: timestamp_ms})[tp]
            from_offset = end if found is None else found[0]
        elif from_offset is None:
            from_offset = max(start, end - limit)
        from_offset = min(max(from_offset, start), end)
        records = _read(consumer, tp, from_offset, min(end, from_offset + limit))
    return RecordsView(topic, partitions, partition, start, end, from_offset, tuple(records))


def _read(consumer: Consumer, tp: TopicPartition, first: int, stop: int) -> list[ConsumerRecord]:
    """The records of [first, stop) (fewer if some were compacted away or do not arrive within
    RECORDS_READ_TIMEOUT_S)."""
    records: list[ConsumerRecord] = []
    if first >= stop:
        return records
    consumer.assign([tp])
    consumer.seek(tp, first)
    deadline = time.monotonic() + RECORDS_READ_TIMEOUT_S
    while consumer.position(tp) < stop and time.monotonic() < deadline:
        for record in consumer.poll(POLL_MS).get(tp, []):
            if record.offset < stop:
                records.append(record)
    return records


def read_groups(admin: AdminClient) -> list[GroupListing]:
    return sorted(admin.list_groups(), key=lambda g: g.group_id)


def read_group(
    admin: AdminClient, bootstrap: list[str], security: ClientSecurity | None, group: str
) -> GroupLag:
    """What ``raftlog group describe`` prints, from the same code."""
    return describe_group_lag(admin, bootstrap, group, security=security)


class SampleReader:
    """Reads one `Sample` for the charts: ``describe_topics`` (ISR sizes), one consumer's
    ``end_offsets`` for every partition, and ``list_group_offsets`` of every group that commits
    offsets (a share group commits none). The consumer is made at the first read and kept for
    the next ones (one connection per broker for the console's life, not one per sample);
    `close` closes it. Used from the sampler's thread only."""

    def __init__(
        self,
        admin: Callable[[], AdminClient],
        bootstrap: list[str],
        security: ClientSecurity | None,
    ) -> None:
        self._admin = admin
        self._bootstrap = bootstrap
        self._security = security
        self._consumer: Consumer | None = None

    def read(self) -> Sample:
        at = time.time()
        admin = self._admin()
        described = admin.describe_topics()
        tps = [TopicPartition(t, p.partition) for t, d in described.items() for p in d.partitions]
        isr = {
            TopicPartition(t, p.partition): len(p.isr)
            for t, d in described.items()
            for p in d.partitions
        }
        if self._consumer is None:
            self._consumer = Consumer(
                self._bootstrap, security=self._security, client_id="raftlog-console-sampler"
            )
        ends = self._consumer.end_offsets(tps) if tps else {}
        committed: dict[str, dict[TopicPartition, int]] = {}
        for g in admin.list_groups():
            if g.group_type == "share":
                continue
            try:
                offsets = admin.list_group_offsets(g.group_id)
            except KafkaError as error:  # deleted since listed, its coordinator moving ...
                log.debug("console sample: group %s: %s", g.group_id, error)
                continue
            committed[g.group_id] = {tp: o.offset for tp, o in offsets.items()}
        return Sample(at, ends, isr, committed)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
