"""Replica fetchers: one thread per source broker, fetching all its partitions in one request.

A follower sends, per partition, its log end offset as the fetch offset, the epoch of its last
batch and the leader epoch it believes in. The leader answers with batches (appended unchanged),
its high watermark, or a diverging epoch: the follower then truncates to the leader's end offset
for that epoch (or its own, if smaller) and fetches again. A partition whose leader refuses it
(not leader, fenced epoch) is backed off until the metadata moves it.

Replication throttles, the follower's side: while the broker's follower quota is exceeded, the
partitions it throttles (named in the topic's ``follower.replication.throttled.replicas`` and out
of the ISR) are left out of the fetch request, and the bytes fetched for them are recorded against
the quota (see :mod:`dataplane.broker.replication_quota`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from dataplane.broker.partition import Partition
from dataplane.broker.replication_quota import ReplicationQuota
from metadata_quorum.security.channels import ClientSecurity, open_channel
from protos import RECONNECT_OPTIONS
from protos import broker_pb2 as pb
from protos.wire import FetchAnswer, Records, each_partition, fetch_method
from raftlog.batch import OFFSET_LENGTH_EPOCH, OFFSET_LENGTH_EPOCH_SIZE
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
BACKOFF_MS = 100
BACKOFF_MAX_MS = 1000
RPC_MARGIN_S = 5.0


@dataclass(frozen=True)
class FetcherConfig:
    replica_fetch_max_bytes: int = 1024 * 1024
    replica_fetch_response_max_bytes: int = 10 * 1024 * 1024
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_min_bytes: int = 1


class FetcherThread(threading.Thread):
    def __init__(
        self,
        broker_id: int,
        source_id: int,
        address_of: Callable[[int], str | None],
        broker_epoch: Callable[[], int],
        config: FetcherConfig,
        clock_ms: Callable[[], int],
        quota: ReplicationQuota | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        super().__init__(name=f"replica-fetcher-{broker_id}-from-{source_id}", daemon=True)
        self.broker_id = broker_id
        self.source_id = source_id
        self.address_of = address_of
        self.broker_epoch = broker_epoch
        self.config = config
        self.clock_ms = clock_ms
        self.quota = quota  # the broker's follower quota, shared by its fetchers
        self.security = security  # how to reach a BROKER listener that uses TLS
        self._lock = threading.Lock()
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._delayed_until_ms: dict[tuple[str, int], int] = {}
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._channel: grpc.Channel | None = None
        self._fetch: grpc.UnaryUnaryMultiCallable | None = None
        self._address: str | None = None

    # -- membership (metadata thread) --------------------------------------------------------------
    def set_partitions(self, partitions: list[Partition]) -> None:
        with self._lock:
            self._partitions = {(p.topic, p.partition): p for p in partitions}
            self._delayed_until_ms = {
                k: v for k, v in self._delayed_until_ms.items() if k in self._partitions
            }
        self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> None:
        backoff_ms = BACKOFF_MS
        while not self._stopped.is_set():
            ready, wait_ms, quota_wait_ms = self._ready_partitions()
            if not ready:
                self._wake.wait(wait_ms / 1000)
                self._wake.clear()
                continue
            fetch = self._fetch_method()
            if fetch is None:
                self._stopped.wait(backoff_ms / 1000)
                continue
            request, sent = self._request(ready)
            if quota_wait_ms is not None:  # back for the partitions held back once it allows
                request.max_wait_ms = min(request.max_wait_ms, quota_wait_ms)
            if not sent:
                self._wake.wait(BACKOFF_MS / 1000)
                self._wake.clear()
                continue
            try:
                answer = fetch(
                    request, timeout=self.config.replica_fetch_wait_max_ms / 1000 + RPC_MARGIN_S
                )
            except grpc.RpcError as error:
                log.debug("fetch from %d failed: %s", self.source_id, error)
                self._stopped.wait(backoff_ms / 1000)
                backoff_ms = min(backoff_ms * 2, BACKOFF_MAX_MS)
                self._drop_channel()
                continue
            backoff_ms = BACKOFF_MS
            if self._stopped.is_set():
                break  # stopped while fetching: the broker may have closed the logs already
            self._handle(answer, sent)
        self._drop_channel()

    def _ready_partitions(self) -> tuple[list[Partition], int, int | None]:
        """The partitions to fetch now; how long to wait when there are none; and, when the
        follower quota holds throttled partitions back, how long until it lets them go."""
        now_ms = self.clock_ms()
        with self._lock:
            ready = [
                p
                for key, p in self._partitions.items()
                if self._delayed_until_ms.get(key, 0) <= now_ms
            ]
            pending = [t - now_ms for t in self._delayed_until_ms.values() if t > now_ms]
        wait_ms = min(pending, default=BACKOFF_MAX_MS)
        throttled = {id(p) for p in ready if p.follower_throttles()}
        if not throttled or self.quota is None or not self.quota.exceeded():
            return ready, wait_ms, None
        quota_wait_ms = self.quota.delay_ms()
        ready = [p for p in ready if id(p) not in throttled]
        return ready, min(wait_ms, quota_wait_ms), quota_wait_ms

    def _fetch_method(self) -> grpc.UnaryUnaryMultiCallable | None:
        """Fetch on the source's channel, answering a ``protos.wire.FetchAnswer``: the records
        are views of the answer's bytes, appended to the log without a copy."""
        address = self.address_of(self.source_id)
        if address is None:
            return None
        if address != self._address:
            self._drop_channel()
            self._channel = open_channel(address, self.security, RECONNECT_OPTIONS)
            self._fetch = fetch_method(self._channel)
            self._address = address
        return self._fetch

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel, self._fetch, self._address = None, None, None

    def _request(
        self, partitions: list[Partition]
    ) -> tuple[pb.FetchRequest, dict[tuple[str, int], tuple[Partition, int, int]]]:
        topics: dict[str, list[pb.FetchPartition]] = {}
        sent: dict[tuple[str, int], tuple[Partition, int, int]] = {}
        for partition in partitions:
            state = partition.fetch_state()
            if state is None:
                continue  # stopped or now leading: the next reconcile drops it
            fetch_offset, last_epoch, leader_epoch, log_start = state
            topics.setdefault(partition.topic, []).append(
                pb.FetchPartition(
                    partition=partition.partition,
                    fetch_offset=fetch_offset,
                    current_leader_epoch=leader_epoch,
                    last_fetched_epoch=last_epoch,
                    partition_max_bytes=self.config.replica_fetch_max_bytes,
                    log_start_offset=log_start,
                )
            )
            sent[(partition.topic, partition.partition)] = (partition, fetch_offset, leader_epoch)
        request = pb.FetchRequest(
            replica_id=self.broker_id,
            broker_epoch=self.broker_epoch(),
            max_wait_ms=self.config.replica_fetch_wait_max_ms,
            min_bytes=self.config.replica_fetch_min_bytes,
            max_bytes=self.config.replica_fetch_response_max_bytes,
            topics=[pb.FetchTopic(name=t, partitions=ps) for t, ps in topics.items()],
        )
        return request, sent

    def _handle(
        self, answer: FetchAnswer, sent: dict[tuple[str, int], tuple[Partition, int, int]]
    ) -> None:
        for topic, item, records in each_partition(answer.response, answer.records):
            entry = sent.get((topic.name, item.partition))
            if entry is None:
                continue
            partition, fetch_offset, leader_epoch = entry
            if records and self.quota is not None and partition.follower_throttles():
                self.quota.record(len(records))
            try:
                error = apply_fetched(partition, fetch_offset, leader_epoch, item, records)
            except KafkaError as failure:
                log.warning("%s: follower append failed: %s", partition.name, failure)
                error = failure.error
            if error is not ErrorCode.NONE:
                log.debug("%s: leader %d answered %s", partition.name, self.source_id, error.name)
                self._delay(partition)

    def _delay(self, partition: Partition) -> None:
        with self._lock:
            self._delayed_until_ms[(partition.topic, partition.partition)] = (
                self.clock_ms() + BACKOFF_MS
            )


def apply_fetched(
    partition: Partition,
    fetch_offset: int,
    leader_epoch: int,
    item: pb.FetchPartitionResponse,
    records: Records,
) -> ErrorCode:
    """Apply one partition of a leader's fetch response to the follower replica; the error to
    back off on (NONE when the answer was used, including a truncation)."""
    error = ErrorCode.from_code(item.error_code)
    if error is ErrorCode.NONE:
        if item.HasField("diverging_epoch"):
            truncate_diverged(partition, leader_epoch, item.diverging_epoch)
        elif not truncate_overlapped(partition, leader_epoch, records):
            partition.append_as_follower(
                records, item.high_watermark, leader_epoch, item.log_start_offset
            )
        return ErrorCode.NONE
    if error is ErrorCode.OFFSET_OUT_OF_RANGE:
        if fetch_offset < item.log_start_offset:
            log.info("%s: the leader starts at %d: restarting there", partition.name,
                     item.log_start_offset)  # fmt: skip
            partition.restart_at(item.log_start_offset, leader_epoch)
            return ErrorCode.NONE
        if fetch_offset > item.log_end_offset >= 0:
            log.warning("%s: ahead of the leader's end %d: truncating", partition.name,
                        item.log_end_offset)  # fmt: skip
            partition.truncate_to(item.log_end_offset, leader_epoch)
            return ErrorCode.NONE
    return error


def truncate_diverged(
    partition: Partition, leader_epoch: int, diverging: pb.EpochEndOffset
) -> None:
    """Truncate to the leader's end offset for the diverging epoch, or to our own end of that
    epoch if it is smaller (Kafka's ``getOffsetTruncationState``)."""
    epoch, own_end = partition.log.end_offset_for_epoch(diverging.epoch)
    if epoch < 0:
        own_end = partition.log.log_start_offset  # nothing in common with the leader
    end = partition.truncate_to(min(diverging.end_offset, own_end), leader_epoch)
    log.info("%s: diverged from the leader at epoch %d: truncated to %d", partition.name,
             diverging.epoch, end)  # fmt: skip


def truncate_overlapped(partition: Partition, leader_epoch: int, records: Records) -> bool:
    """A leader batch that starts below our log end is a divergence the epoch check missed
    (our last epoch names batches the leader never had: issue 30 §1): the leader is right, so
    truncate to that batch's base offset. Whether the records must wait for the next fetch: the
    truncation took whole batches down below that base (ours were laid out differently), and
    appending there would leave a gap; the next fetch, from the new log end, fills it."""
    if len(records) < OFFSET_LENGTH_EPOCH_SIZE:
        return False
    base_offset = int(OFFSET_LENGTH_EPOCH.unpack_from(records, 0)[0])
    log_end = partition.log.log_end_offset
    if base_offset >= log_end:
        return False
    end = partition.truncate_to(base_offset, leader_epoch)
    log.warning("%s: the leader's batch at %d starts below our log end %d: diverged, "
                "truncated to %d", partition.name, base_offset, log_end, end)  # fmt: skip
    return end != base_offset


class FetcherManager:
    """Fetcher threads by source broker, reconciled with each metadata image."""

    def __init__(
        self,
        broker_id: int,
        address_of: Callable[[int], str | None],
        broker_epoch: Callable[[], int],
        config: FetcherConfig,
        clock_ms: Callable[[], int],
        quota: ReplicationQuota | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.address_of = address_of
        self.broker_epoch = broker_epoch
        self.config = config
        self.clock_ms = clock_ms
        self.quota = quota
        self.security = security
        self._threads: dict[int, FetcherThread] = {}

    def reconcile(self, followed: dict[int, list[Partition]]) -> None:
        for source_id in list(self._threads):
            if source_id not in followed:
                self._threads.pop(source_id).stop()
        for source_id, partitions in followed.items():
            thread = self._threads.get(source_id)
            if thread is None:
                thread = FetcherThread(
                    self.broker_id, source_id, self.address_of, self.broker_epoch,
                    self.config, self.clock_ms, self.quota, self.security,
                )  # fmt: skip
                self._threads[source_id] = thread
                thread.set_partitions(partitions)
                thread.start()
            else:
                thread.set_partitions(partitions)

    def close(self) -> None:
        threads = list(self._threads.values())
        self._threads.clear()
        for thread in threads:
            thread.stop()
        for thread in threads:
            thread.join(timeout=RPC_MARGIN_S + 2)
