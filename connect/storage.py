"""Where Connect keeps its state: a local offsets file (standalone) or compacted topics
(distributed: ``connect-configs``, ``connect-offsets``, ``connect-status``).

:class:`TopicLog` is Kafka Connect's ``KafkaBasedLog``: a producer writing keyed JSON records and a
consumer assigned every partition of the topic from the beginning, with ``read_to_end`` (read up
to the end offsets asked just before) so a reader knows it has seen every write that was
acknowledged before it asked. Compaction keeps the last value per key, which replays to the same
state.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from connect.offsets import JsonDict, offset_key
from dataplane.client import (
    AdminClient,
    Consumer,
    ConsumerRecord,
    NewTopic,
    Producer,
    RecordMetadata,
    TopicPartition,
)
from metadata_quorum.security.channels import ClientSecurity
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
REPLICATION_FACTOR_MAX = 3
READ_POLL_MS = 100


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync of the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class FileOffsetStore:
    """Source offsets in one JSON file (``offset.storage.file.filename``), rewritten atomically
    on every commit. Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._offsets: dict[str, JsonDict] = {}
        if path.exists():
            loaded = json.loads(path.read_bytes() or b"{}")
            if not isinstance(loaded, dict):
                raise ValueError(f"{path}: not an offsets file")
            self._offsets = loaded

    def get(self, connector: str, partition: Mapping[str, Any]) -> JsonDict | None:
        with self._lock:
            return self._offsets.get(offset_key(connector, partition))

    def commit(self, offsets: Mapping[str, JsonDict]) -> None:
        """Store ``offsets`` (offset key -> offset) durably before returning."""
        if not offsets:
            return
        with self._lock:
            self._offsets.update(offsets)
            data = json.dumps(self._offsets, sort_keys=True, indent=1).encode()
            write_atomically(self.path, data)

    def refresh(self, timeout_s: float) -> None:
        """Nothing to read: this process is the file's only writer."""


def ensure_topic(
    bootstrap_servers: Sequence[str],
    name: str,
    partitions: int,
    timeout_s: float,
    security: ClientSecurity | None = None,
) -> None:
    """Create the compacted internal topic ``name`` if it is missing, with replication
    factor min(3, brokers), as Kafka Connect's first worker does."""
    admin = AdminClient(
        list(bootstrap_servers), request_timeout_ms=int(timeout_s * 1000), security=security
    )
    try:
        if name in admin.list_topics():
            return
        brokers = [b for b in admin.describe_cluster().brokers if not b.fenced]
        rf = max(1, min(REPLICATION_FACTOR_MAX, len(brokers)))
        configs = {"cleanup.policy": "compact"}
        errors = admin.create_topics([NewTopic(name, partitions, rf, configs)])
        error = errors.get(name)
        if error is not None and error.error is not ErrorCode.TOPIC_ALREADY_EXISTS:
            raise error
        log.info("created %s (%d partitions, replication factor %d, compact)", name,
                 partitions, rf)  # fmt: skip
    finally:
        admin.close()


class Delivery(Protocol):
    """A produced record's future (``Producer.send``'s answer)."""

    def result(self, timeout: float | None = None) -> RecordMetadata: ...


def encode_value(value: JsonDict | None) -> bytes | None:
    """A :class:`TopicLog` record's value (None: a tombstone)."""
    return None if value is None else json.dumps(value, sort_keys=True).encode()


class TopicLog:
    """A compacted topic read from the beginning into ``on_record`` and written by key."""

    def __init__(
        self,
        bootstrap_servers: Sequence[str],
        topic: str,
        on_record: Callable[[str, bytes | None, ConsumerRecord], None],
        request_timeout_ms: int,
        isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted",
        security: ClientSecurity | None = None,
    ) -> None:
        self.topic = topic
        self._on_record = on_record
        self._lock = threading.RLock()
        self._producer = Producer(
            list(bootstrap_servers), acks="all", linger_ms=0,
            request_timeout_ms=request_timeout_ms,
            delivery_timeout_ms=max(request_timeout_ms * 2, 10_000), security=security,
        )  # fmt: skip
        self._consumer = Consumer(
            list(bootstrap_servers),
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=READ_POLL_MS,
            request_timeout_ms=request_timeout_ms,
            isolation_level=isolation_level,
            security=security,
        )
        partitions = self._consumer.partitions_for_topic(topic)
        self._partitions = [TopicPartition(topic, p) for p in sorted(partitions)]
        self._consumer.assign(self._partitions)
        self._consumer.seek_to_beginning(*self._partitions)

    def send(self, key: str, value: JsonDict | None) -> Delivery:
        return self._producer.send(self.topic, encode_value(value), key.encode())

    def write(self, items: Mapping[str, JsonDict | None], timeout_s: float) -> None:
        """Write every item and wait until all are acknowledged (acks=all)."""
        futures = [self.send(key, value) for key, value in items.items()]
        self._producer.flush(timeout_s)
        for future in futures:
            future.result(timeout=timeout_s)

    def poll(self, timeout_ms: int = 0) -> int:
        """Apply what arrived; the number of records applied."""
        with self._lock:
            applied = 0
            for records in self._consumer.poll(timeout_ms).values():
                for record in records:
                    if record.key is None:
                        continue
                    self._on_record(record.key.decode(), record.value, record)
                    applied += 1
            return applied

    def read_to_end(self, timeout_s: float) -> None:
        """Apply every record written before this call (as far as the end offsets show)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            ends = self._consumer.end_offsets(self._partitions)
            while any(self._consumer.position(tp) < end for tp, end in ends.items()):
                if time.monotonic() > deadline:
                    raise KafkaError(
                        ErrorCode.REQUEST_TIMED_OUT, f"{self.topic} not read to its end in time"
                    )
                self.poll(READ_POLL_MS)

    def close(self) -> None:
        self._producer.close(5.0)
        self._consumer.close()


class TopicOffsetStore:
    """Source offsets in ``connect-offsets`` (distributed mode).

    Read with read_committed: an exactly-once task writes its offsets inside the transaction
    of its records (``connect.exactly_once``), so the offsets a task resumes from are those of
    records that became visible, never of an aborted or still open transaction. Offsets that
    at-least-once tasks write are not transactional and read the same either way."""

    def __init__(
        self,
        bootstrap_servers: Sequence[str],
        topic: str,
        request_timeout_ms: int,
        security: ClientSecurity | None = None,
    ) -> None:
        self.topic = topic
        self._lock = threading.Lock()
        self._offsets: dict[str, JsonDict] = {}
        self.request_timeout_s = request_timeout_ms / 1000
        self._log = TopicLog(bootstrap_servers, topic, self._apply, request_timeout_ms,
                             isolation_level="read_committed", security=security)  # fmt: skip

    def _apply(self, key: str, value: bytes | None, record: ConsumerRecord) -> None:
        with self._lock:
            if value is None:
                self._offsets.pop(key, None)
            else:
                self._offsets[key] = json.loads(value)

    def get(self, connector: str, partition: Mapping[str, Any]) -> JsonDict | None:
        with self._lock:
            return self._offsets.get(offset_key(connector, partition))

    def commit(self, offsets: Mapping[str, JsonDict]) -> None:
        if offsets:
            self._log.write(dict(offsets), self.request_timeout_s)
            with self._lock:
                self._offsets.update(offsets)

    def committed_in_transaction(self, offsets: Mapping[str, JsonDict]) -> None:
        """``offsets`` were written to the topic in a transaction that committed (by an
        exactly-once task's producer): this worker's view takes them without waiting to read
        them back."""
        with self._lock:
            self._offsets.update(offsets)

    def refresh(self, timeout_s: float) -> None:
        """Read what other workers committed (before a task starts)."""
        self._log.read_to_end(timeout_s)

    def close(self) -> None:
        self._log.close()
