"""The registry's IO shell: the ``_schemas`` topic tailed into a :class:`RegistryState`, and the
one writer that adds to it.

Reads are answered from this node's state; a read that finds nothing first reads the topic to
its end once, so a schema registered through another node a moment ago is found (a serializer
on node A, its deserializer on node B).

Ids are unique because there is one writer at a time: every write is a transaction of the
producer whose ``transactional.id`` is ``_schemas-writer`` on every node. Initialising it (once
per node, again after being fenced) makes that node the writer: the transaction coordinator
bumps the producer epoch, aborts an open transaction of the previous holder and fences it, as
Kafka fences a zombie. The writer then reads the topic to its last stable offset, which
includes every transaction that committed before it became the writer, generates the records
from that state, and commits them. A node that was the writer before and is fenced meanwhile
fails the commit (ProducerFencedError), nothing of it is visible (the topic is read
read_committed), and it retries as the new writer. So two writes never allocate from the same
state: an id is allocated once. Killing the writer's node needs no election: the next write on
any node takes over (the transaction coordinator moves with ``__transaction_state``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from dataplane.client import (
    AdminClient,
    Consumer,
    NewTopic,
    Producer,
    ProducerFencedError,
    TopicPartition,
)
from dataplane.schema_registry import errors
from dataplane.schema_registry.errors import RegistryError
from dataplane.schema_registry.state import Record, RegistryState
from metadata_quorum.security.channels import ClientSecurity
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
TOPIC = "_schemas"
WRITER_TRANSACTIONAL_ID = "_schemas-writer"
REPLICATION_FACTOR_MAX = 3
TAIL_POLL_MS = 200
TOPIC_CHECK_INTERVAL_S = 1.0  # while _schemas does not exist, doubling up to the max
TOPIC_CHECK_INTERVAL_MAX_S = 8.0
WRITE_ATTEMPTS = 5
T = TypeVar("T")


class Registry:
    """One node's registry: thread-safe; :meth:`start` tails the topic, :meth:`stop` ends it."""

    def __init__(
        self, bootstrap_servers: list[str], security: ClientSecurity | None, timeout_s: float
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.security = security
        self.timeout_s = timeout_s
        self.state = RegistryState()
        self._lock = threading.RLock()  # the state and the consumer
        self._write_lock = threading.Lock()  # one write of this node at a time
        self._consumer: Consumer | None = None
        self._partitions: list[TopicPartition] = []
        self._producer: Producer | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tail, name="schema-registry", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
            if self._producer is not None:
                self._producer.close(5.0)

    # -- reading ----------------------------------------------------------------------------

    def _tail(self) -> None:
        """Follow the topic until stopped (opening it once it exists). A cluster whose registry
        was never written has no ``_schemas``: the check for it backs off (every node of every
        local cluster serves a registry), and a request reads the topic to its end anyway."""
        interval_s = TOPIC_CHECK_INTERVAL_S
        while not self._stop.is_set():
            try:
                if self._open(create=False):
                    self._poll(TAIL_POLL_MS)
                    continue
            except KafkaError as error:  # the cluster is starting or a leader moves: retry
                log.warning("schema registry: reading %s: %s", TOPIC, error)
            self._stop.wait(interval_s)
            interval_s = min(2 * interval_s, TOPIC_CHECK_INTERVAL_MAX_S)

    def _open(self, create: bool) -> bool:
        """Whether the topic is open for reading; ``create`` makes it first if missing."""
        with self._lock:
            if self._consumer is not None:
                return True
            if not self._topic_exists(create):
                return False
            consumer = Consumer(
                self.bootstrap_servers, auto_offset_reset="earliest", enable_auto_commit=False,
                fetch_max_wait_ms=TAIL_POLL_MS, request_timeout_ms=int(self.timeout_s * 1000),
                isolation_level="read_committed", security=self.security,
            )  # fmt: skip
            partitions = sorted(consumer.partitions_for_topic(TOPIC))
            self._partitions = [TopicPartition(TOPIC, p) for p in partitions]
            consumer.assign(self._partitions)
            consumer.seek_to_beginning(*self._partitions)
            self._consumer = consumer
            return True

    def _topic_exists(self, create: bool) -> bool:
        admin = AdminClient(
            self.bootstrap_servers, request_timeout_ms=int(self.timeout_s * 1000),
            security=self.security,
        )  # fmt: skip
        try:
            if _described(admin):
                return True
            if not create:
                return False
            brokers = [b for b in admin.describe_cluster().brokers if not b.fenced]
            rf = max(1, min(REPLICATION_FACTOR_MAX, len(brokers)))
            topic = NewTopic(TOPIC, 1, rf, {"cleanup.policy": "compact"})
            error = admin.create_topics([topic]).get(TOPIC)
            if error is not None and error.error is not ErrorCode.TOPIC_ALREADY_EXISTS:
                raise error
            log.info("created %s (1 partition, replication factor %d, compact)", TOPIC, rf)
            return True
        finally:
            admin.close()

    def _poll(self, timeout_ms: int) -> None:
        with self._lock:
            assert self._consumer is not None, "polled before the topic was opened"
            for records in self._consumer.poll(timeout_ms).values():
                for record in records:
                    if record.key is None:
                        continue
                    try:
                        self.state.replay(record.key, record.value)
                    except (ValueError, KeyError, TypeError) as error:
                        log.warning("%s offset %d: not a registry record (%s): skipped",
                                    TOPIC, record.offset, error)  # fmt: skip

    def read_to_end(self) -> None:
        """Replay every record committed before this call; 50002 if that takes too long."""
        deadline = time.monotonic() + self.timeout_s
        with self._lock:
            if not self._open(create=False):
                return
            assert self._consumer is not None
            ends = self._consumer.end_offsets(self._partitions)
            while any(self._consumer.position(tp) < end for tp, end in ends.items()):
                if time.monotonic() > deadline:
                    raise errors.operation_timed_out(f"{TOPIC} not read to its end in time")
                self._poll(TAIL_POLL_MS)

    def read(self, query: Callable[[RegistryState], T]) -> T:
        """``query`` on the state; if it finds nothing (40401-40403), again after reading the
        topic to its end."""
        with self._lock:
            try:
                return query(self.state)
            except RegistryError as error:
                if error.error_code not in (40401, 40402, 40403):
                    raise
            self._read_to_end_or_store_error()
            return query(self.state)

    def knows_id(self, schema_id: int) -> bool:
        """Whether ``schema_id`` is registered (a version holds it, soft-deleted or not), after
        reading the topic to its end if this node has not seen it yet; for the broker's
        ``value.schema.validation``. REQUEST_TIMED_OUT (retriable) if the topic cannot be read
        in time: the produce is refused, not the record judged."""
        with self._lock:
            if self.state.has_id(schema_id):
                return True
            try:
                self.read_to_end()
            except RegistryError as error:
                raise KafkaError(ErrorCode.REQUEST_TIMED_OUT, str(error)) from None
            return self.state.has_id(schema_id)

    def _read_to_end_or_store_error(self) -> None:
        try:
            self.read_to_end()
        except KafkaError as error:
            raise errors.store_error(str(error)) from error

    # -- writing ----------------------------------------------------------------------------

    def write(self, generate: Callable[[RegistryState], tuple[list[Record], T]]) -> T:
        """Generate records from the whole topic's state as its one writer, commit them and
        replay them here; the answer ``generate`` gave."""
        with self._write_lock:
            for attempt in range(1, WRITE_ATTEMPTS + 1):
                try:
                    return self._write_once(generate)
                except ProducerFencedError as error:
                    log.info("schema registry writer fenced (%s): attempt %d", error, attempt)
                    self._close_producer()
                except KafkaError as error:
                    self._close_producer()
                    if not error.retriable or attempt == WRITE_ATTEMPTS:
                        raise errors.store_error(str(error)) from error
            raise errors.store_error(f"fenced {WRITE_ATTEMPTS} times by other writers")

    def _write_once(self, generate: Callable[[RegistryState], tuple[list[Record], T]]) -> T:
        self._open(create=True)
        producer = self._writer()  # the writer from here on, until another node fences it
        self.read_to_end()
        with self._lock:
            records, answer = generate(self.state)
        if not records:
            return answer
        producer.begin_transaction()
        futures = [producer.send(TOPIC, value, key) for key, value in records]
        producer.commit_transaction(self.timeout_s)
        last: dict[TopicPartition, int] = {}
        for future in futures:
            written = future.result(timeout=self.timeout_s)
            tp = TopicPartition(written.topic, written.partition)
            last[tp] = max(last.get(tp, -1), written.offset)
        self._read_past(last)
        return answer

    def _read_past(self, offsets: dict[TopicPartition, int]) -> None:
        """Replay until this write's own records (up to ``offsets``) are applied, so the node
        that took a write answers reads with it. Reading to the end is not enough: the
        transaction coordinator writes the commit markers after ``commit_transaction``
        returns (as Kafka's does), so the last stable offset passes the records a moment
        later, and a read_committed consumer's end is the last stable offset."""
        deadline = time.monotonic() + self.timeout_s
        with self._lock:
            if not self._open(create=False):
                return
            assert self._consumer is not None
            while any(self._consumer.position(tp) <= offset for tp, offset in offsets.items()):
                if time.monotonic() > deadline:
                    raise errors.operation_timed_out(f"{TOPIC}: a write not read back in time")
                self._poll(TAIL_POLL_MS)

    def _writer(self) -> Producer:
        if self._producer is None:
            producer = Producer(
                self.bootstrap_servers, transactional_id=WRITER_TRANSACTIONAL_ID, linger_ms=0,
                request_timeout_ms=int(self.timeout_s * 1000),
                delivery_timeout_ms=int(self.timeout_s * 2000), security=self.security,
            )  # fmt: skip
            try:
                producer.init_transactions(self.timeout_s)
            except BaseException:
                producer.close(5.0)
                raise
            self._producer = producer
        return self._producer

    def _close_producer(self) -> None:
        if self._producer is not None:
            self._producer.close(5.0)
            self._producer = None


def _described(admin: AdminClient) -> bool:
    """Whether the registry's topic exists. Only it is described: listing every topic described
    every partition of the cluster (10,000 at the metadata benchmark) on each try while a
    restarted broker caught up, on every node."""
    try:
        admin.describe_topics([TOPIC])
    except KafkaError as error:
        if error.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            return False
        raise
    return True
