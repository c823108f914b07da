"""Mirroring, MirrorMaker 2 style: :class:`MirrorSourceConnector` copies the selected topics of a
source cluster to the target cluster (the one the worker produces to) as
``<source-alias>.<topic>``, partition for partition, with keys, values, headers and timestamps.

The **connector** (on one worker) selects the source topics (``topics``: names or regexes,
``topics.exclude``), creates each target topic with the source's partition count and its
non-default configs, grows it when the source grows, keeps its configs in step
(``sync.topic.configs.interval.ms``), and re-evaluates the selection every
``refresh.topics.interval.ms``: when the set of partitions changes it asks the runtime for new
task configs. The partitions are dealt round-robin over ``tasks.max`` tasks.

Each **task** reads its source partitions with a consumer (no group) from the committed source
offsets (``{"cluster", "topic", "partition"}`` -> ``{"offset": last mirrored}``; the runtime
commits an offset only once the target acknowledged it and every record before it, acks=all
with an idempotent producer: at-least-once). When the target acknowledges a record the task
decides (``connect.mirror_core.sync_needed``) whether to write an offset sync (upstream offset
-> downstream offset) to ``mm2-offset-syncs.<target-alias>.internal`` on the target, which the
checkpoint connector (``connect.mirror_checkpoint``) uses to translate consumer-group offsets.
Its status carries the replication lag per partition (source end offset minus mirrored
position), refreshed every ``status.metrics.interval.ms``.

**Exactly-once** (a worker with ``exactly.once.source.support=enabled``, KIP-618): the runtime
commits the task's records and their source offsets in one transaction on the target
(``connect.exactly_once``), and the task hands its offset syncs to that same transaction
(``transaction_records``) instead of writing them with its own producer, so a sync never names
a target offset whose record did not become visible. The source is then read with
``consumer.isolation.level=read_committed`` (the default under exactly-once; MM2's
``exactlyOnceSupport`` says so only with it): aborted source records are not mirrored, and no
control batch is ever copied (the consumer never returns one as a record).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from connect.api import (
    ConnectorConfig,
    JsonDict,
    OffsetReader,
    SourceConnector,
    SourceConnectorConfig,
    SourceRecord,
    SourceTask,
    TransactionRecord,
)
from connect.client_security import (
    MIRROR_PREFIXES,
    collect_security,
    flatten,
    securities,
    split_security,
)
from connect.mirror_core import (
    OffsetSync,
    PartitionLag,
    PartitionSyncState,
    compile_patterns,
    configs_to_copy,
    lag_report,
    offset_syncs_topic,
    plan_topics,
    remote_topic,
    split_partitions,
    sync_needed,
    topic_selected,
)
from connect.storage import REPLICATION_FACTOR_MAX, ensure_topic
from dataplane.client import (
    AdminClient,
    Consumer,
    NewTopic,
    Producer,
    RecordFuture,
    RecordMetadata,
    TopicPartition,
)
from dataplane.client.admin import ConfigResource, ResourceType
from metadata_quorum.security.channels import ClientSecurity
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
ALIAS_PATTERN = r"^[A-Za-z0-9_-]+$"
POLL_MS = 100
TOPICS_MAX = 10_000
CLOSE_TIMEOUT_S = 5.0
SYNCS_PENDING_MAX = 10_000  # offset syncs decided, not yet handed to the producer


class MirrorConfig(SourceConnectorConfig):
    """The settings both mirror connectors share (MM2's names)."""

    source_cluster_alias: str = Field(
        alias="source.cluster.alias", min_length=1, max_length=100, pattern=ALIAS_PATTERN
    )
    target_cluster_alias: str = Field(
        "target", alias="target.cluster.alias", min_length=1, max_length=100, pattern=ALIAS_PATTERN
    )
    source_bootstrap_servers: str = Field(
        alias="source.cluster.bootstrap.servers", min_length=1, max_length=10_000
    )
    target_bootstrap_servers: str = Field(
        alias="target.cluster.bootstrap.servers", min_length=1, max_length=10_000
    )
    topics: str = Field(".*", min_length=1, max_length=10_000)
    topics_exclude: str = Field("", alias="topics.exclude", max_length=10_000)
    request_timeout_ms: int = Field(30_000, alias="request.timeout.ms", ge=100, le=600_000)
    # source.cluster.security.protocol, target.cluster.sasl.jaas.config, ... by prefix
    security_properties: dict[str, dict[str, str]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _collect_security(cls, values: Any) -> Any:
        return collect_security(values, MIRROR_PREFIXES)

    def source_security(self) -> ClientSecurity | None:
        return self._security("source.cluster.")

    def target_security(self) -> ClientSecurity | None:
        return self._security("target.cluster.")

    def _security(self, prefix: str) -> ClientSecurity | None:
        properties = self.security_properties.get(prefix)
        return None if properties is None else securities({prefix: properties})[prefix]

    def source_servers(self) -> list[str]:
        return [s.strip() for s in self.source_bootstrap_servers.split(",") if s.strip()]

    def target_servers(self) -> list[str]:
        return [s.strip() for s in self.target_bootstrap_servers.split(",") if s.strip()]

    def shared(self) -> JsonDict:
        """The settings every task gets."""
        return {
            "source.cluster.alias": self.source_cluster_alias,
            "target.cluster.alias": self.target_cluster_alias,
            "source.cluster.bootstrap.servers": self.source_bootstrap_servers,
            "target.cluster.bootstrap.servers": self.target_bootstrap_servers,
            "topics": self.topics,
            "topics.exclude": self.topics_exclude,
            "request.timeout.ms": self.request_timeout_ms,
            **flatten(self.security_properties),
        }


class MirrorSourceConfig(MirrorConfig):
    refresh_topics_interval_ms: int = Field(
        10_000, alias="refresh.topics.interval.ms", ge=100, le=86_400_000
    )
    sync_topic_configs_enabled: bool = Field(True, alias="sync.topic.configs.enabled")
    sync_topic_configs_interval_ms: int = Field(
        60_000, alias="sync.topic.configs.interval.ms", ge=100, le=86_400_000
    )
    replication_factor: int | None = Field(None, alias="replication.factor", ge=1, le=100)
    offset_lag_max: int = Field(100, alias="offset.lag.max", ge=1, le=10_000_000)
    max_poll_records: int = Field(2000, alias="consumer.max.poll.records", ge=1, le=100_000)
    # None: read_committed when the task runs exactly-once, else Kafka's read_uncommitted
    isolation_level: Literal["read_uncommitted", "read_committed"] | None = Field(
        None, alias="consumer.isolation.level"
    )


def _topic_resource(name: str) -> ConfigResource:
    return ConfigResource(ResourceType.TOPIC, name)


class MirrorSourceConnector(SourceConnector):
    config_model: ClassVar[type[ConnectorConfig]] = MirrorSourceConfig

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partitions: list[tuple[str, int]] = []
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._configs_synced_at = 0.0

    def start(self, config: ConnectorConfig) -> None:
        assert isinstance(config, MirrorSourceConfig)
        self.config = config
        self.include = compile_patterns(config.topics)
        self.exclude = compile_patterns(config.topics_exclude)
        timeout_ms = config.request_timeout_ms
        self.source = AdminClient(
            config.source_servers(), request_timeout_ms=timeout_ms,
            security=config.source_security(),
        )  # fmt: skip
        try:
            self.target = AdminClient(
                config.target_servers(), request_timeout_ms=timeout_ms,
                security=config.target_security(),
            )  # fmt: skip
        except BaseException:
            self.source.close()
            raise
        try:
            ensure_topic(
                config.target_servers(), offset_syncs_topic(config.target_cluster_alias), 1,
                timeout_ms / 1000, config.target_security(),
            )  # fmt: skip
            self._partitions = self._refresh()
        except BaseException:
            self._close_admins()
            raise
        self._thread = threading.Thread(target=self._monitor, name="mirror-topics", daemon=True)
        self._thread.start()

    @classmethod
    def exactly_once_support(cls, config: ConnectorConfig) -> bool | None:
        """Supported unless the source is read read_uncommitted (aborted records would be
        mirrored as committed ones), as MM2 answers."""
        assert isinstance(config, MirrorSourceConfig)
        return config.isolation_level != "read_uncommitted"

    def task_configs(self, max_tasks: int) -> list[JsonDict]:
        with self._lock:
            partitions = list(self._partitions)
        base = {
            **self.config.shared(),
            "offset.lag.max": self.config.offset_lag_max,
            "consumer.max.poll.records": self.config.max_poll_records,
            "consumer.isolation.level": self.config.isolation_level,
        }
        return [
            {**base, "task.assigned.partitions": [[t, p] for t, p in group]}
            for group in split_partitions(partitions, max_tasks)
        ]

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(self.config.request_timeout_ms / 1000 * 2)
        self._close_admins()

    @staticmethod
    def task_class() -> type[SourceTask]:
        return MirrorSourceTask

    def _close_admins(self) -> None:
        try:
            self.source.close()
        finally:
            self.target.close()

    # -- the topics ------------------------------------------------------------------------------
    def _monitor(self) -> None:
        interval_s = self.config.refresh_topics_interval_ms / 1000
        while not self._stopping.wait(interval_s):
            try:
                partitions = self._refresh()
            except KafkaError as error:
                log.warning("mirror %s: topics not refreshed: %s", self.config.name, error)
                continue
            with self._lock:
                changed = partitions != self._partitions
                self._partitions = partitions
            if changed and self.context is not None:
                log.info("mirror %s: %d source partitions now", self.config.name, len(partitions))
                self.context.request_task_reconfiguration()

    def _refresh(self) -> list[tuple[str, int]]:
        """Select the source topics, make their target topics match; the partitions to mirror."""
        alias = self.config.target_cluster_alias
        described = self.source.describe_topics()
        selected = {
            name: len(topic.partitions)
            for name, topic in sorted(described.items())
            if topic_selected(name, self.include, self.exclude, alias)
        }
        if len(selected) > TOPICS_MAX:
            raise ValueError(f"{len(selected)} topics selected; at most {TOPICS_MAX} are mirrored")
        target = {n: len(t.partitions) for n, t in self.target.describe_topics().items()}
        plan = plan_topics(selected, target, self.config.source_cluster_alias)
        source_of = {remote_topic(self.config.source_cluster_alias, t): t for t in selected}
        self._create(plan.create, source_of)
        if plan.grow:
            for error in self.target.create_partitions(plan.grow).values():
                if error is not None and error.error is not ErrorCode.INVALID_PARTITIONS:
                    raise error
            log.info("mirror %s: grew %s", self.config.name, plan.grow)
        self._sync_configs(source_of, skip=set(plan.create))
        return [(t, p) for t, count in selected.items() for p in range(count)]

    def _create(self, create: Mapping[str, int], source_of: Mapping[str, str]) -> None:
        if not create:
            return
        rf = self.config.replication_factor or max(1, min(REPLICATION_FACTOR_MAX, len(
            [b for b in self.target.describe_cluster().brokers if not b.fenced])))  # fmt: skip
        new = [
            NewTopic(name, partitions, rf, self._source_configs(source_of[name]))
            for name, partitions in create.items()
        ]
        for error in self.target.create_topics(new).values():
            if error is not None and error.error is not ErrorCode.TOPIC_ALREADY_EXISTS:
                raise error
        log.info("mirror %s: created %s", self.config.name, dict(create))

    def _source_configs(self, topic: str) -> dict[str, str]:
        resource = _topic_resource(topic)
        entries = self.source.describe_configs([resource])[resource]
        return configs_to_copy({e.name: (e.value, e.is_default) for e in entries.values()})

    def _sync_configs(self, source_of: Mapping[str, str], skip: set[str]) -> None:
        """Set the target topics' configs that differ from the source's (every
        ``sync.topic.configs.interval.ms``)."""
        if not self.config.sync_topic_configs_enabled:
            return
        now = time.monotonic()
        if now - self._configs_synced_at < self.config.sync_topic_configs_interval_ms / 1000:
            return
        self._configs_synced_at = now
        for name, topic in sorted(source_of.items()):
            if name in skip:
                continue
            wanted = self._source_configs(topic)
            resource = _topic_resource(name)
            have = {e.name: e.value for e in self.target.describe_configs([resource])[resource]
                    .values()}  # fmt: skip
            changed = {k: v for k, v in wanted.items() if have.get(k) != v}
            if changed:
                self.target.alter_configs(resource, dict(changed))
                log.info("mirror %s: %s configs set to %s", self.config.name, name, changed)


def source_partition(alias: str, topic: str, partition: int) -> JsonDict:
    """MM2's ``wrapPartition``: the key of a mirrored partition's committed offset."""
    return {"cluster": alias, "partition": partition, "topic": topic}


class MirrorSourceTask(SourceTask):
    def __init__(self) -> None:
        self._lock = threading.Lock()  # the consumer and the producer; closed by stop
        self._acks = threading.Lock()  # what commit_record updates (the producer's thread)
        self._stopping = threading.Event()
        self._sync_states: dict[tuple[str, int], PartitionSyncState] = {}
        self._pending_syncs: list[OffsetSync] = []
        self._mirrored: dict[tuple[str, int], int] = {}  # next upstream offset to mirror
        self._latency_ms: int | None = None
        self._syncs_dropped = 0
        self._consumer: Consumer | None = None
        self._syncs: Producer | None = None

    def start(self, config: JsonDict, offsets: OffsetReader) -> None:
        self.alias = str(config["source.cluster.alias"])
        self.syncs_topic = offset_syncs_topic(str(config["target.cluster.alias"]))
        self.offset_lag_max = int(config["offset.lag.max"])
        timeout_ms = int(config["request.timeout.ms"])
        assigned = [(str(t), int(p)) for t, p in config["task.assigned.partitions"]]
        self._partitions = [TopicPartition(t, p) for t, p in assigned]
        source = str(config["source.cluster.bootstrap.servers"]).split(",")
        target = str(config["target.cluster.bootstrap.servers"]).split(",")
        _, found = split_security(config, MIRROR_PREFIXES)
        clusters = securities(found)  # checked by the connector's config already
        isolation = config.get("consumer.isolation.level") or (
            "read_committed" if self.exactly_once else "read_uncommitted"
        )
        self._consumer = Consumer(
            source, enable_auto_commit=False, auto_offset_reset="earliest",
            fetch_max_wait_ms=POLL_MS, request_timeout_ms=timeout_ms,
            max_poll_records=int(config["consumer.max.poll.records"]),
            isolation_level="read_committed" if isolation == "read_committed"
            else "read_uncommitted", security=clusters.get("source.cluster."),
        )  # fmt: skip
        if not self.exactly_once:  # else the syncs go in the runtime's transactions
            self._syncs = Producer(target, acks="all", linger_ms=0,
                                   request_timeout_ms=timeout_ms,
                                   security=clusters.get("target.cluster."))  # fmt: skip
        self._consumer.assign(self._partitions)
        for tp in self._partitions:
            committed = offsets.offset(source_partition(self.alias, tp.topic, tp.partition))
            if committed is None:
                self._consumer.seek_to_beginning(tp)
            else:
                self._consumer.seek(tp, int(committed["offset"]) + 1)
            self._mirrored[(tp.topic, tp.partition)] = self._consumer.position(tp)
        log.info("mirror task: %s from %s (%s, %s)", assigned, dict(self._mirrored), isolation,
                 "exactly-once" if self.exactly_once else "at-least-once")  # fmt: skip

    def poll(self) -> list[SourceRecord]:
        with self._lock:
            if self._consumer is None or self._stopping.is_set():
                return []
            self._send_syncs()
            batch = self._consumer.poll(POLL_MS)
        polled: list[SourceRecord] = []
        for tp, records in batch.items():
            # one source partition and remote topic for the partition's records, not per record
            partition = source_partition(self.alias, tp.topic, tp.partition)
            topic = remote_topic(self.alias, tp.topic)
            polled += [
                SourceRecord(
                    partition,
                    {"offset": r.offset},
                    topic,
                    r.value,
                    r.key,
                    tp.partition,
                    tuple(r.headers),
                    r.timestamp,
                )
                for r in records
            ]
        return polled

    def commit_record(self, record: SourceRecord, metadata: RecordMetadata) -> None:
        self._acknowledged(record, [(int(record.source_offset["offset"]), metadata.offset)])

    def commit_records(
        self, records: Sequence[SourceRecord], futures: Sequence[RecordFuture]
    ) -> None:
        """A run of one partition's records, acknowledged: the offset syncs are decided per
        record as in ``commit_record``, the rest once for the run."""
        self._acknowledged(
            records[-1],
            [
                (int(r.source_offset["offset"]), f.offset(0))
                for r, f in zip(records, futures, strict=True)
            ],
        )

    def _acknowledged(self, last: SourceRecord, offsets: list[tuple[int, int]]) -> None:
        """Records of one partition were written downstream, ``offsets`` their (upstream,
        downstream) offsets in order, ``last`` the last of them."""
        tp = (str(last.source_partition["topic"]), int(last.source_partition["partition"]))
        with self._acks:
            self._mirrored[tp] = offsets[-1][0] + 1
            if last.timestamp_ms is not None:
                self._latency_ms = int(time.time() * 1000) - last.timestamp_ms
            state = self._sync_states.setdefault(tp, PartitionSyncState())
            for upstream, downstream in offsets:
                if not sync_needed(state, upstream, downstream, self.offset_lag_max):
                    continue
                if len(self._pending_syncs) < SYNCS_PENDING_MAX:
                    self._pending_syncs.append(OffsetSync(*tp, upstream, downstream))
                else:  # dropping a sync is safe: translation gets coarser, never wrong
                    self._syncs_dropped += 1

    def _send_syncs(self) -> None:
        """Write the offset syncs decided since the last poll (at-least-once)."""
        if self._syncs is None:
            return
        for record in self.transaction_records():
            self._syncs.send(record.topic, record.value, record.key, partition=record.partition)

    def transaction_records(self) -> list[TransactionRecord]:
        """The offset syncs decided since the last call: under exactly-once, for every record
        of the transaction about to commit."""
        with self._acks:
            pending, self._pending_syncs = self._pending_syncs, []
        return [
            TransactionRecord(self.syncs_topic, encode_sync(sync),
                              sync_key(sync.topic, sync.partition), partition=0)
            for sync in pending
        ]  # fmt: skip

    def metrics(self) -> JsonDict:
        with self._lock:
            if self._consumer is None or self._stopping.is_set():
                return {}
            ends = self._consumer.end_offsets(self._partitions)
        with self._acks:
            lags = [
                PartitionLag(tp.topic, tp.partition, end, self._mirrored[(tp.topic, tp.partition)])
                for tp, end in ends.items()
            ]
            latency_ms = self._latency_ms
            dropped = self._syncs_dropped
        report = lag_report(lags, self.alias)
        report["replication_latency_ms"] = latency_ms
        report["offset_syncs_dropped"] = dropped
        return report

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            consumer, self._consumer = self._consumer, None
            syncs, self._syncs = self._syncs, None
        try:
            if consumer is not None:
                consumer.close()
        finally:
            if syncs is not None:
                syncs.close(CLOSE_TIMEOUT_S)


def sync_key(topic: str, partition: int) -> bytes:
    return json.dumps([topic, partition], separators=(",", ":")).encode()


def encode_sync(sync: OffsetSync) -> bytes:
    return json.dumps(
        {"topic": sync.topic, "partition": sync.partition,
         "upstream_offset": sync.upstream_offset, "downstream_offset": sync.downstream_offset},
        sort_keys=True, separators=(",", ":"),
    ).encode()  # fmt: skip


def decode_sync(value: bytes) -> OffsetSync:
    parsed: Any = json.loads(value)
    return OffsetSync(
        str(parsed["topic"]), int(parsed["partition"]), int(parsed["upstream_offset"]),
        int(parsed["downstream_offset"]),
    )  # fmt: skip
