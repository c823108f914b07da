"""The partitions a broker hosts: opened, given roles and removed as the metadata image changes.

``apply_image`` is called by the metadata thread with each new image: every partition that lists
this broker as a replica is opened (its directory created or recovered) and made leader or
follower at the image's leader epoch; a partition that is gone (topic deleted, replica moved) is
stopped and its directory deleted. Directories that the first complete image does not know are
strays of topics deleted while the broker was away and are deleted too, as Kafka does in KRaft.

Each image also sets the replication throttles: this broker's leader and follower quotas get
their rates from its dynamic broker configs, over the values of its config file (those apply
from start, before the first image), and each hosted partition learns from its topic's
``*.replication.throttled.replicas`` whether it is throttled on this broker's side (see
:mod:`dataplane.broker.replication_quota`).

The maintenance thread runs the periodic work: ISR shrink checks, high watermark checkpoints,
time-based flushes, retention and compaction. Its 100 ms tick, and the page-cache thread's,
visit only the partitions whose logs told of work (``Log.work_listener``: an append, a roll, a
truncation, a deletion set aside) until they are idle again; the periodic scans of every
partition (ISR, retention) run every few seconds or minutes. Visiting every partition each tick
cost a broker 7% of a core with 1,000 idle partitions, growing with the count.

The high watermarks of every hosted partition go to one file in the log directory every 5 s,
``replication-offset-checkpoint`` (Kafka's, with its
``replica.high.watermark.checkpoint.interval.ms``), one fsync for all of them. Versions before
it wrote a file per partition, two fsyncs each: with 1,000 partitions taking writes that was
~70% of a leader's busy time (py-spy). The file of a partition opened here is still read when
the log directory's holds no entry for it, and removed once it does.

An OSError writing the log directory (a full disk, EIO) goes to ``on_log_dir_failure`` — from
every log's ``io_failure_listener`` and from the manager's own writes — before the write fails
with LogDirIOError: Kafka's LogDirFailureChannel. The broker halts there (its only log directory
is offline). One error is not the disk's: a missing file or directory (ENOENT) of a partition
no longer hosted, from a thread that picked the partition before its topic was deleted and wrote
into the directory removed meanwhile (that write fails, the broker goes on).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dataplane.broker.partition import IsrChange, Partition, Role
from dataplane.broker.replication_quota import ReplicationQuota
from metadata_quorum import configs
from metadata_quorum.configs import ThrottledReplicas
from metadata_quorum.image import MetadataImage, PartitionRegistration
from raftlog.checkpoint import read_offset_checkpoint, write_offset_checkpoint
from raftlog.config import LogConfig
from raftlog.errors import ErrorCode, KafkaError, LogDirIOError, StorageError
from raftlog.log import (
    PARTITION_METADATA,
    Log,
    parse_partition_dir_name,
    read_partition_metadata,
)

log = logging.getLogger(__name__)
HW_CHECKPOINT_INTERVAL_MS = 5000
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"  # in the log directory
MAINTENANCE_TICK_MS = 100


class _Due:
    """The partitions a timer visits at its next tick: added by their logs' work listeners
    (any thread), taken whole by the timer, which adds back those still not idle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partitions: set[Partition] = set()

    def add(self, partition: Partition) -> None:
        """Called on every append: a partition already due is left without the lock. Sound
        unlocked: ``take`` swaps the set before the timer visits any of it, so a partition
        seen in a set the timer has taken is visited after this caller's change."""
        if partition in self._partitions:
            return
        with self._lock:
            self._partitions.add(partition)

    def take(self) -> set[Partition]:
        with self._lock:
            taken, self._partitions = self._partitions, set()
        return taken


@dataclass(frozen=True)
class TopicSettings:
    log_config: LogConfig
    min_insync_replicas: int
    leader_throttled: ThrottledReplicas
    follower_throttled: ThrottledReplicas


@dataclass(frozen=True)
class ReplicaManagerConfig:
    replica_lag_time_max_ms: int = 30_000
    log_retention_check_interval_ms: int = 300_000
    log_cache_tail_bytes: int = 64 * 1024 * 1024  # Log.release_page_cache; 0: the kernel's way
    # the dynamic broker configs the node config file sets (the throttle rates), sorted pairs:
    # they apply from start, until a dynamic value set through the controller overrides them
    static_broker_configs: tuple[tuple[str, str], ...] = ()


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        log_dir: Path,
        config: ReplicaManagerConfig,
        clock_ms: Callable[[], int],
        alter_partition: Callable[[IsrChange], None],
        on_log_dir_failure: Callable[[Path, OSError], None],
        *,
        on_cache_released: Callable[[int], None] | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.on_log_dir_failure = on_log_dir_failure
        self.on_cache_released = on_cache_released  # bytes released from the page cache
        self.log_dir = log_dir
        self.config = config
        self.clock_ms = clock_ms
        self.alter_partition = alter_partition
        self.image = MetadataImage()
        self._lock = threading.Lock()
        self._image_changed = threading.Condition()  # notified by each apply_image
        self._partitions: dict[tuple[str, int], Partition] = {}
        # replication-offset-checkpoint: as read at the first open (None: not yet), as written
        self._stored_hws: dict[tuple[str, int], int] | None = None
        self._written_hws: dict[tuple[str, int], int] = {}
        # the partitions each timer visits at its next tick (see the module's docstring)
        self._maintenance_due = _Due()
        self._release_due = _Due()
        self._settings: dict[str, TopicSettings] = {}
        # the followed partitions' leaders, and may_lead, as the last apply_image left them
        self._followed: dict[tuple[str, int], int] = {}
        self._applied_may_lead: bool | None = None
        self._strays_removed = False
        self._removed = False  # a partition was removed since topics_after_removals last looked
        self.leader_quota = ReplicationQuota("leader", clock_ms)
        self.follower_quota = ReplicationQuota("follower", clock_ms)
        self._set_quotas(self.image)  # the config file's rates, before any image arrives
        self._stop = threading.Event()
        self._maintenance = threading.Thread(
            target=self._maintain, name=f"replica-maintenance-{broker_id}", daemon=True
        )
        self._cache_release = threading.Thread(
            target=self._release_page_cache, name=f"page-cache-release-{broker_id}", daemon=True
        )

    def start(self) -> None:
        self._maintenance.start()
        if self.config.log_cache_tail_bytes > 0:
            self._cache_release.start()

    # -- lookups -------------------------------------------------------------------------------
    def partitions(self) -> list[Partition]:
        with self._lock:
            return list(self._partitions.values())

    def partitions_of(self, topic: str) -> list[Partition]:
        """The hosted partitions of ``topic``: a look-up per partition the image gives it, not a
        pass over every hosted one (a coordinator asks after each metadata update)."""
        with self._lock:
            found = self.image.topic(topic)
            if found is None:
                return []
            hosted = (self._partitions.get((topic, pid)) for pid in found.partitions)
            return [p for p in hosted if p is not None]

    def topics_after_removals(self) -> set[str] | None:
        """The topics hosted, if a partition was removed since the last call (a topic may no
        longer be hosted: the broker forgets its metrics), else None: no pass over every hosted
        partition for each metadata update."""
        with self._lock:
            if not self._removed:
                return None
            self._removed = False
            return {topic for topic, _ in self._partitions}

    def settings(self, topic: str) -> TopicSettings:
        with self._lock:
            found = self._settings.get(topic)
        if found is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {topic!r}")
        return found

    def get(self, topic: str, partition: int) -> Partition:
        """The hosted replica; UNKNOWN_TOPIC_OR_PARTITION if the cluster has no such partition,
        NOT_LEADER_OR_FOLLOWER if it exists but this broker holds no replica of it."""
        with self._lock:
            found = self._partitions.get((topic, partition))
            image = self.image
        if found is not None:
            return found
        topic_image = image.topic(topic)
        if topic_image is None or partition not in topic_image.partitions:
            raise KafkaError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {topic}-{partition}"
            )
        raise KafkaError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"broker {self.broker_id} holds no replica of {topic}-{partition}",
        )

    # -- applying metadata -----------------------------------------------------------------------
    def wait_for_image(
        self, done: Callable[[MetadataImage], bool], timeout_s: float
    ) -> MetadataImage:
        """The image once ``done(image)`` holds, or the newest one when ``timeout_s`` passes
        first. An admin answer waits here until this broker's own metadata shows its change,
        so that the client's next Metadata request to this broker sees it."""
        deadline = time.monotonic() + timeout_s
        with self._image_changed:
            while not done(self.image):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._image_changed.wait(remaining)
            return self.image

    def apply_image(
        self, image: MetadataImage, caught_up: bool, may_lead: bool = True
    ) -> dict[int, list[Partition]]:
        """Give every hosted partition its role under ``image``; return the partitions to fetch,
        by leader broker id. Without ``may_lead`` (this incarnation is not registered and
        unfenced yet) a partition the image says this broker leads is left as it is: that
        leadership belongs to a previous incarnation the controller has not fenced yet.

        Only the topics the image changed are looked at (Kafka's ``applyDelta`` of the topics
        delta): a metadata update touches a few topics, and a pass over every hosted partition
        for each one made the work of N partitions' updates grow as N squared (a CreateTopics,
        an ISR change, each paid for all the partitions hosted). Every partition is looked at
        again when the configs changed (they set each topic's log config and throttles) or
        ``may_lead`` did."""
        changed = self._changed_topics(image, may_lead)
        wanted = dict(self._assigned(image, changed))
        self._set_quotas(image)
        with self._lock:
            if changed is None:
                stale = [p for key, p in self._partitions.items() if key not in wanted]
            else:
                stale = self._stale_of(image, changed, wanted)
        for partition in stale:
            self._remove(partition)
        settings = self._settings_after(image, changed)
        followed = {} if changed is None else dict(self._followed)
        for key in [k for k in followed if k not in self._partitions or k in wanted]:
            del followed[key]
        for (topic, partition_id), (topic_id, reg) in wanted.items():
            if topic not in settings:
                settings[topic] = self._topic_settings(image, topic)
            partition = self._opened(topic, partition_id, topic_id, settings[topic])
            leader = self._set_role(partition, reg, may_lead)
            if leader is not None:
                followed[(topic, partition_id)] = leader
            with self._lock:
                self._partitions[(topic, partition_id)] = partition
        with self._lock:
            self.image = image
            self._settings = settings
            self._followed = followed
            self._applied_may_lead = may_lead
            by_leader: dict[int, list[Partition]] = {}
            for key, leader in followed.items():
                by_leader.setdefault(leader, []).append(self._partitions[key])
        with self._image_changed:
            self._image_changed.notify_all()
        if caught_up and not self._strays_removed:
            self._remove_strays()
            self._strays_removed = True
        return by_leader

    def _settings_after(
        self, image: MetadataImage, changed: set[uuid.UUID] | None
    ) -> dict[str, TopicSettings]:
        """The topics' settings under ``image``: those of the changed topics computed again,
        the removed ones' dropped (all of them left to compute when ``changed`` is None)."""
        if changed is None:
            return {}
        settings = dict(self._settings)
        before = {t.name for tid in changed if (t := self.image.topics.get(tid)) is not None}
        after = {t.name for tid in changed if (t := image.topics.get(tid)) is not None}
        for name in before - after:
            settings.pop(name, None)
        for name in after:
            settings[name] = self._topic_settings(image, name)
        return settings

    def _changed_topics(self, image: MetadataImage, may_lead: bool) -> set[uuid.UUID] | None:
        """The ids of the topics added, changed or removed since the image applied last (a
        MetadataDelta keeps the TopicImage of every topic it did not touch: identity says
        which changed); None when every hosted partition must be looked at."""
        before = self.image
        if self._applied_may_lead is not may_lead or image.configs != before.configs:
            return None
        changed = {
            tid for tid, topic in image.topics.items() if before.topics.get(tid) is not topic
        }
        return changed | (before.topics.keys() - image.topics.keys())

    def _stale_of(
        self,
        image: MetadataImage,
        changed: set[uuid.UUID],
        wanted: dict[tuple[str, int], tuple[uuid.UUID, PartitionRegistration]],
    ) -> list[Partition]:
        """Hosted partitions of the changed topics that ``image`` no longer gives this broker
        (under ``_lock``): those of the previous image's version of each changed topic."""
        stale = []
        for tid in changed:
            for topic in (self.image.topics.get(tid), image.topics.get(tid)):
                if topic is None:
                    continue
                for partition_id in topic.partitions:
                    key = (topic.name, partition_id)
                    hosted = self._partitions.get(key)
                    if hosted is not None and key not in wanted and hosted not in stale:
                        stale.append(hosted)
        return stale

    def _opened(
        self, topic: str, partition_id: int, topic_id: uuid.UUID, settings: TopicSettings
    ) -> Partition:
        """The hosted partition, opened (or re-opened for a new topic id), with the topic's
        settings applied."""
        with self._lock:
            partition = self._partitions.get((topic, partition_id))
        if partition is None or partition.topic_id != topic_id:
            if partition is not None:
                self._remove(partition)
            partition = self._open(topic, partition_id, topic_id, settings.log_config)
        elif partition.log.config != settings.log_config:
            partition.log.config = settings.log_config
        partition.min_insync_replicas = settings.min_insync_replicas
        partition.leader_throttled = settings.leader_throttled.covers(partition_id, self.broker_id)
        partition.follower_throttled = settings.follower_throttled.covers(
            partition_id, self.broker_id
        )
        return partition

    def _isr_eligible(self, broker_id: int) -> bool:
        """Kafka's ``isReplicaIsrEligible``: registered, unfenced, not shutting down."""
        broker = self.image.brokers.get(broker_id)
        return broker is not None and not broker.fenced and not broker.in_controlled_shutdown

    def _assigned(
        self, image: MetadataImage, only: set[uuid.UUID] | None = None
    ) -> Iterator[tuple[tuple[str, int], tuple[uuid.UUID, PartitionRegistration]]]:
        """This broker's partitions in ``image`` (of the topics ``only`` names, if given)."""
        topics = image.topics.values() if only is None else (
            topic for tid in only if (topic := image.topics.get(tid)) is not None
        )  # fmt: skip
        for topic in topics:
            for partition_id, reg in topic.partitions.items():
                if self.broker_id in reg.replicas:
                    yield (topic.name, partition_id), (topic.topic_id, reg)

    def _topic_settings(self, image: MetadataImage, topic: str) -> TopicSettings:
        """As this broker applies them: with its own ``log.*`` defaults (dynamic and static)."""
        static = dict(self.config.static_broker_configs)
        replication = configs.replication_config(image, topic, self.broker_id, static)
        return TopicSettings(
            configs.log_config(image, topic, self.broker_id, static),
            replication.min_insync_replicas,
            *configs.throttled_replicas(replication),
        )

    def _set_quotas(self, image: MetadataImage) -> None:
        static = dict(self.config.static_broker_configs)
        config = configs.broker_config(image, self.broker_id, static)
        for quota, rate in (
            (self.leader_quota, config.leader_replication_throttled_rate),
            (self.follower_quota, config.follower_replication_throttled_rate),
        ):
            if quota.set_rate(rate):
                log.info("broker %d: %s.replication.throttled.rate %d bytes/s",
                         self.broker_id, quota.side, rate)  # fmt: skip

    def _set_role(
        self, partition: Partition, reg: PartitionRegistration, may_lead: bool
    ) -> int | None:
        """Make the partition leader or follower under ``reg``; the leader to fetch from."""
        partition.isr_eligible = self._isr_eligible
        if reg.leader == self.broker_id:
            if may_lead and partition.make_leader(reg):
                log.info("%s: leader at epoch %d", partition.name, reg.leader_epoch)
            return None
        if reg.leader >= 0:
            if partition.make_follower(reg):
                log.info(
                    "%s: follower of %d at epoch %d", partition.name, reg.leader, reg.leader_epoch
                )
            return reg.leader
        partition.make_follower(reg)  # offline: no leader to fetch from
        return None

    def _open(
        self, topic: str, partition_id: int, topic_id: uuid.UUID, config: LogConfig
    ) -> Partition:
        directory = self.log_dir / f"{topic}-{partition_id}"
        try:
            stored = read_partition_metadata(directory / PARTITION_METADATA)
        except StorageError:
            stored = None  # torn by a power cut before its first flush: Log writes it again
        if stored is not None and stored != topic_id:
            log.warning(
                "%s held topic id %s, now %s: deleting the old data", directory, stored, topic_id
            )
            shutil.rmtree(directory)
        try:
            opened = Log(directory, config, topic_id=topic_id)
        except OSError as error:
            raise self._failed(directory, error) from error
        opened.io_failure_listener = self._log_dir_failed
        if opened.recovery.recovered or opened.recovery.notes:
            log.info("%s: recovered %s", directory.name, opened.recovery)
        key = (topic, partition_id)  # what this process last wrote, else what it found
        stored_hw = self._written_hws.get(key, self._stored_high_watermarks().get(key))
        partition = Partition(
            topic, partition_id, topic_id, opened, self.broker_id, self.clock_ms, stored_hw
        )
        opened.work_listener = lambda: self._work_arrived(partition)
        self._work_arrived(partition)  # recovery may have left work (deletions, the cache)
        return partition

    def _work_arrived(self, partition: Partition) -> None:
        self._maintenance_due.add(partition)
        if self.config.log_cache_tail_bytes > 0:  # else nothing visits (no release thread)
            self._release_due.add(partition)

    def _stored_high_watermarks(self) -> dict[tuple[str, int], int]:
        """The log directory's replication-offset-checkpoint, read once; a malformed one is
        ignored (the high watermarks start at 0 and the leaders' fetches raise them)."""
        if self._stored_hws is None:
            path = self.log_dir / REPLICATION_OFFSET_CHECKPOINT
            try:
                self._stored_hws = read_offset_checkpoint(path) or {}
            except StorageError as error:
                log.warning("%s: ignored", error.message)
                self._stored_hws = {}
        return self._stored_hws

    def _remove(self, partition: Partition) -> None:
        with self._lock:
            if self._partitions.get((partition.topic, partition.partition)) is partition:
                del self._partitions[(partition.topic, partition.partition)]
            self._removed = True
        partition.stop()
        partition.log.close()
        log.info("%s: removed (topic id %s)", partition.name, partition.topic_id)
        shutil.rmtree(partition.log.directory, ignore_errors=True)

    def _remove_strays(self) -> None:
        hosted = {p.log.directory.name for p in self.partitions()}
        for directory in sorted(self.log_dir.iterdir()):
            if not directory.is_dir() or directory.name.startswith("__cluster_metadata"):
                continue
            try:
                parse_partition_dir_name(directory.name)
            except StorageError:
                continue  # not a partition directory
            if directory.name not in hosted:
                log.warning(
                    "%s: stray log of a topic this broker no longer hosts; deleted", directory
                )
                shutil.rmtree(directory, ignore_errors=True)

    # -- periodic work ---------------------------------------------------------------------------
    def _maintain(self) -> None:
        lag_check_ms = max(MAINTENANCE_TICK_MS, self.config.replica_lag_time_max_ms // 2)
        due = {"isr": 0, "hw": 0, "retention": 0}
        while not self._stop.wait(MAINTENANCE_TICK_MS / 1000):
            now_ms = self.clock_ms()
            partitions = self.partitions()
            if now_ms >= due["isr"]:
                due["isr"] = now_ms + lag_check_ms
                self._shrink_isrs(partitions, now_ms)
            for partition in self._maintenance_due.take():
                if partition.role is Role.STOPPED:
                    continue
                partition.log.maybe_flush()
                partition.sync_snapshots()
                partition.log.delete_due_segment_files()  # file.delete.delay.ms passed
                if partition.has_timed_work():
                    self._maintenance_due.add(partition)
            if now_ms >= due["hw"]:
                due["hw"] = now_ms + HW_CHECKPOINT_INTERVAL_MS
                self.checkpoint(partitions)
            if now_ms >= due["retention"]:
                due["retention"] = now_ms + self.config.log_retention_check_interval_ms
                self._retain(partitions)

    def _release_page_cache(self) -> None:
        """Its own thread: the advice submits writeback and may wait on a busy disk (up to ~8
        ms a call at 100,000 records/s here), which must not hold up the ISR checks."""
        keep_bytes = self.config.log_cache_tail_bytes
        while not self._stop.wait(MAINTENANCE_TICK_MS / 1000):
            for partition in self._release_due.take():
                if partition.role is Role.STOPPED:
                    continue
                released = partition.log.release_page_cache(keep_bytes)
                if released and self.on_cache_released is not None:
                    self.on_cache_released(released)
                if partition.log.cache_release_pending(keep_bytes):
                    self._release_due.add(partition)

    def _shrink_isrs(self, partitions: list[Partition], now_ms: int) -> None:
        for partition in partitions:
            change = partition.isr_shrink(now_ms, self.config.replica_lag_time_max_ms)
            if change is not None:
                log.info(
                    "%s: shrinking ISR %s -> %s", partition.name, partition.isr, change.new_isr
                )
                self.alter_partition(change)

    def checkpoint(self, partitions: list[Partition]) -> None:
        """Write the high watermarks of ``partitions`` (those not stopped) to the log
        directory's replication-offset-checkpoint, if any changed since the last write."""
        hosted = [p for p in partitions if p.role is not Role.STOPPED]
        offsets = {(p.topic, p.partition): p.high_watermark for p in hosted}
        if offsets == self._written_hws:
            return
        try:
            write_offset_checkpoint(self.log_dir / REPLICATION_OFFSET_CHECKPOINT, offsets)
        except OSError as error:
            raise self._failed(self.log_dir, error) from error
        self._written_hws = offsets
        for partition in hosted:
            partition.drop_legacy_hw_checkpoint()

    def _failed(self, directory: Path, error: OSError) -> LogDirIOError:
        self.on_log_dir_failure(directory, error)
        return LogDirIOError(f"{directory}: {error}")

    def _log_dir_failed(self, directory: Path, error: OSError) -> None:
        """An IO error on a partition's log: the log directory failed, unless the partition's
        directory was removed under the writer (ENOENT on a partition no longer hosted)."""
        if isinstance(error, FileNotFoundError):
            with self._lock:
                hosted = any(p.log.directory == directory for p in self._partitions.values())
            if not hosted:
                log.info("%s: %s after the partition was removed; not a disk failure",
                         directory.name, error)  # fmt: skip
                return
        self.on_log_dir_failure(directory, error)

    def _retain(self, partitions: list[Partition]) -> None:
        for partition in partitions:
            if partition.role is Role.STOPPED:
                continue
            deleted = partition.log.delete_old_segments(partition.high_watermark)
            if deleted:
                log.info("%s: retention deleted %d segments", partition.name, deleted)
            if partition.log.config.compact:
                # Not past the last stable offset (Kafka's cleanableOffsets): an undecided
                # transaction, or records above the high watermark, are not cleaned.
                partition.log.compact(max_offset=partition.last_stable_offset)

    def close(self) -> None:
        self._stop.set()
        for thread in (self._maintenance, self._cache_release):
            if thread.is_alive():
                thread.join(timeout=5)
        partitions = self.partitions()
        self.checkpoint(partitions)
        for partition in partitions:
            partition.stop()
            partition.log.close()
