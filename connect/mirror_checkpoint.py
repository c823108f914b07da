"""Consumer-group offset translation, as MirrorMaker 2's MirrorCheckpointConnector.

Each task reads ``mm2-offset-syncs.<target-alias>.internal`` on the target from the beginning
(to its end before it emits anything) into an :class:`~connect.mirror_core.OffsetSyncStore`, and
every ``emit.checkpoints.interval.ms`` translates the committed offsets of its share of the
selected source groups (``groups`` / ``groups.exclude``; a group belongs to task
``crc32(group) % tasks``) for the selected topics: a checkpoint per group and partition whose
translation changed goes to ``<source-alias>.checkpoints.internal`` on the target (key
``{"group","topic","partition"}``, value ``{"upstream_offset","downstream_offset","metadata"}``,
JSON). With ``sync.group.offsets.enabled``, every ``sync.group.offsets.interval.ms`` the
translated offsets are committed to the same group on the target for ``<source-alias>.<topic>``
when that group has no active members there and only where they move the group forward.

The syncs are read with read_committed: under exactly-once mirroring they are written in the
transactions of the records they describe, so a translation never points past committed data.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import ClassVar

from pydantic import Field

from connect.api import (
    ConnectorConfig,
    JsonDict,
    OffsetReader,
    SourceConnector,
    SourceRecord,
    SourceTask,
)
from connect.mirror import MirrorConfig, decode_sync
from connect.mirror_core import (
    DEFAULT_GROUPS_EXCLUDE,
    Checkpoint,
    OffsetSyncStore,
    checkpoints,
    checkpoints_topic,
    compile_patterns,
    group_selected,
    group_task,
    offset_syncs_topic,
    offsets_to_sync,
    topic_selected,
)
from connect.storage import ensure_topic
from dataplane.client import AdminClient, Consumer, TopicPartition
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
POLL_MS = 100
GROUPS_MAX = 10_000
READ_TO_END_S = 60.0


class MirrorCheckpointConfig(MirrorConfig):
    groups: str = Field(".*", min_length=1, max_length=10_000)
    groups_exclude: str = Field(
        ",".join(DEFAULT_GROUPS_EXCLUDE), alias="groups.exclude", max_length=10_000
    )
    emit_checkpoints_interval_ms: int = Field(
        60_000, alias="emit.checkpoints.interval.ms", ge=100, le=86_400_000
    )
    sync_group_offsets_enabled: bool = Field(False, alias="sync.group.offsets.enabled")
    sync_group_offsets_interval_ms: int = Field(
        60_000, alias="sync.group.offsets.interval.ms", ge=100, le=86_400_000
    )


class MirrorCheckpointConnector(SourceConnector):
    config_model: ClassVar[type[ConnectorConfig]] = MirrorCheckpointConfig

    def start(self, config: ConnectorConfig) -> None:
        assert isinstance(config, MirrorCheckpointConfig)
        self.config = config
        timeout_s = config.request_timeout_ms / 1000
        servers = config.target_servers()
        target = config.target_security()
        ensure_topic(servers, offset_syncs_topic(config.target_cluster_alias), 1, timeout_s, target)
        ensure_topic(servers, checkpoints_topic(config.source_cluster_alias), 1, timeout_s, target)

    def task_configs(self, max_tasks: int) -> list[JsonDict]:
        c = self.config
        base = {
            **c.shared(),
            "groups": c.groups,
            "groups.exclude": c.groups_exclude,
            "emit.checkpoints.interval.ms": c.emit_checkpoints_interval_ms,
            "sync.group.offsets.enabled": c.sync_group_offsets_enabled,
            "sync.group.offsets.interval.ms": c.sync_group_offsets_interval_ms,
        }
        return [{**base, "task.index": i, "task.count": max_tasks} for i in range(max_tasks)]

    @staticmethod
    def task_class() -> type[SourceTask]:
        return MirrorCheckpointTask


class MirrorCheckpointTask(SourceTask):
    def __init__(self) -> None:
        self._lock = threading.Lock()  # the clients; closed by stop
        self._stopping = threading.Event()
        self.store = OffsetSyncStore()
        self._emitted: dict[tuple[str, str, int], tuple[int, int]] = {}
        self._latest: dict[str, list[Checkpoint]] = {}
        self._consumer: Consumer | None = None
        self._source: AdminClient | None = None
        self._target: AdminClient | None = None

    def start(self, config: JsonDict, offsets: OffsetReader) -> None:
        parsed = MirrorCheckpointConfig.model_validate(
            {**{k: v for k, v in config.items() if not k.startswith("task.")},
             "name": "task", "connector.class": "MirrorCheckpointConnector"}
        )  # fmt: skip
        self.config = parsed
        self.index, self.count = int(config["task.index"]), int(config["task.count"])
        self.topics = compile_patterns(parsed.topics)
        self.topics_exclude = compile_patterns(parsed.topics_exclude)
        self.groups = compile_patterns(parsed.groups)
        self.groups_exclude = compile_patterns(parsed.groups_exclude)
        timeout_ms = parsed.request_timeout_ms
        self._source = AdminClient(
            parsed.source_servers(), request_timeout_ms=timeout_ms,
            security=parsed.source_security(),
        )  # fmt: skip
        self._target = AdminClient(
            parsed.target_servers(), request_timeout_ms=timeout_ms,
            security=parsed.target_security(),
        )  # fmt: skip
        self._consumer = Consumer(  # read_committed: only syncs of committed mirrored records
            parsed.target_servers(), enable_auto_commit=False, auto_offset_reset="earliest",
            fetch_max_wait_ms=POLL_MS, request_timeout_ms=timeout_ms,
            isolation_level="read_committed", security=parsed.target_security(),
        )  # fmt: skip
        topic = offset_syncs_topic(parsed.target_cluster_alias)
        partitions = [TopicPartition(topic, p) for p in sorted(
            self._consumer.partitions_for_topic(topic))]  # fmt: skip
        self._consumer.assign(partitions)
        self._consumer.seek_to_beginning(*partitions)
        self._read_syncs_to_end(partitions)
        now = time.monotonic()
        self._next_emit = now
        self._next_sync = now

    def _read_syncs_to_end(self, partitions: list[TopicPartition]) -> None:
        assert self._consumer is not None
        ends = self._consumer.end_offsets(partitions)
        deadline = time.monotonic() + READ_TO_END_S
        while any(self._consumer.position(tp) < end for tp, end in ends.items()):
            if time.monotonic() > deadline:
                raise KafkaError(ErrorCode.REQUEST_TIMED_OUT, "offset syncs not read in time")
            self._read_syncs()

    def _read_syncs(self) -> None:
        assert self._consumer is not None
        for records in self._consumer.poll(POLL_MS).values():
            for record in records:
                if record.value is not None:
                    self.store.add(decode_sync(record.value))

    def poll(self) -> list[SourceRecord]:
        with self._lock:
            if self._consumer is None or self._stopping.is_set():
                return []
            self._read_syncs()
            now = time.monotonic()
            records: list[SourceRecord] = []
            if now >= self._next_emit:
                self._next_emit = now + self.config.emit_checkpoints_interval_ms / 1000
                records = self._checkpoint_records()
            if self.config.sync_group_offsets_enabled and now >= self._next_sync:
                self._next_sync = now + self.config.sync_group_offsets_interval_ms / 1000
                self._sync_group_offsets()
            return records

    def _my_groups(self) -> list[str]:
        assert self._source is not None
        found = [
            g.group_id
            for g in self._source.list_groups()
            if group_selected(g.group_id, self.groups, self.groups_exclude)
            and group_task(g.group_id, self.count) == self.index
        ]
        if len(found) > GROUPS_MAX:
            log.warning("%d groups selected; checkpointing the first %d", len(found), GROUPS_MAX)
        return found[:GROUPS_MAX]

    def _checkpoint_records(self) -> list[SourceRecord]:
        assert self._source is not None
        alias = self.config.source_cluster_alias
        target_alias = self.config.target_cluster_alias
        records: list[SourceRecord] = []
        latest: dict[str, list[Checkpoint]] = {}
        for group in self._my_groups():
            committed = {
                (tp.topic, tp.partition): (o.offset, o.metadata)
                for tp, o in self._source.list_group_offsets(group).items()
                if topic_selected(tp.topic, self.topics, self.topics_exclude, target_alias)
            }
            latest[group] = found = checkpoints(group, committed, self.store)
            log.debug("group %s: committed %s, checkpoints %s", group, committed, found)
            for c in found:
                key = (c.group, c.topic, c.partition)
                if self._emitted.get(key) == (c.upstream_offset, c.downstream_offset):
                    continue
                self._emitted[key] = (c.upstream_offset, c.downstream_offset)
                records.append(_checkpoint_record(c, alias))
        self._latest = latest
        return records

    def _sync_group_offsets(self) -> None:
        assert self._target is not None
        for group, found in sorted(self._latest.items()):
            if not found or self._active_on_target(group):
                continue
            have = {
                (tp.topic, tp.partition): o.offset
                for tp, o in self._target.list_group_offsets(group).items()
            }
            wanted = offsets_to_sync(found, have, self.config.source_cluster_alias)
            if not wanted:
                continue
            answers = self._target.alter_group_offsets(
                group, {TopicPartition(t, p): o for (t, p), o in wanted.items()}
            )
            refused = {str(tp): e for tp, e in answers.items() if e is not None}
            if refused:
                log.warning("group %s: offsets not synced on the target: %s", group, refused)
            else:
                log.info("group %s: synced offsets %s on the target", group, wanted)

    def _active_on_target(self, group: str) -> bool:
        assert self._target is not None
        try:
            described = self._target.describe_groups([group])[group]
        except KafkaError as error:
            if error.error is ErrorCode.GROUP_ID_NOT_FOUND:
                return False
            raise
        return bool(described.members)

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            clients = (self._consumer, self._source, self._target)
            self._consumer = self._source = self._target = None
        for client in clients:
            if client is not None:
                client.close()


def _checkpoint_record(c: Checkpoint, source_alias: str) -> SourceRecord:
    key = {"group": c.group, "partition": c.partition, "topic": c.topic}
    value = {"downstream_offset": c.downstream_offset, "metadata": c.metadata,
             "upstream_offset": c.upstream_offset}  # fmt: skip
    return SourceRecord(
        source_partition=key,
        source_offset={"offset": c.upstream_offset},
        topic=checkpoints_topic(source_alias),
        partition=0,
        key=json.dumps(key, sort_keys=True, separators=(",", ":")).encode(),
        value=json.dumps(value, sort_keys=True, separators=(",", ":")).encode(),
    )


def decode_checkpoint(key: bytes, value: bytes) -> Checkpoint:
    k, v = json.loads(key), json.loads(value)
    return Checkpoint(
        str(k["group"]), str(k["topic"]), int(k["partition"]), int(v["upstream_offset"]),
        int(v["downstream_offset"]), str(v.get("metadata", "")),
    )  # fmt: skip
