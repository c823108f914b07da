"""The transactions workload's transformer on librdkafka (confluent-kafka), beside raftlog's own
(chaos/transformer.py): the same consume-transform-produce loop, the same history lines, the
same deliberate aborts drawn from the seed, through the cluster's KAFKA listener::

    python -m chaos.transformer --client confluent --bootstrap H:P,... (KAFKA listeners) ...

What differs is the client's error model. librdkafka reports a failed transactional call as a
`KafkaException` whose `KafkaError` says what to do (its transactions guide, and the EOS
example's ``process_input``):

- ``txn_requires_abort()``: the transaction cannot commit: `abort_transaction`, then rewind;
- ``retriable()``: the same call may be made again (commit, abort, send_offsets, init);
- ``fatal()``: this producer is done (fenced by a newer epoch): the transaction's outcome is
  unknown and the process exits with status 3, like ours, to be started again; the next
  incarnation's ``init_transactions`` fences this one and completes its transaction.

After an abort the consumer is rewound as the EOS example does: each assigned partition the
transaction read is sought to the group's committed offset (`Consumer.committed`), or, when
that cannot be read, to the transaction's first input offset (the same offset: every earlier
transaction of this incarnation committed past it or was rewound). Delivery reports (each
output record's offset) come through `Producer.flush` before the commit or abort; the
rebalance callback ``on_revoke`` ends the open transaction before its partitions go elsewhere,
as ``on_partitions_revoked`` does in ours.

librdkafka's `send_offsets_to_transaction` can block past its timeout, for good, while the group
coordinator is down (librdkafka issues 5456 and 5511, open): a watchdog thread records the
transaction `unknown` and exits with status 3 once a transactional call has blocked
HUNG_AFTER_S, since the blocked main thread never returns to Python.

The consumer speaks KIP-848's group protocol (``group.protocol=consumer``), as raftlog's client
does: both kinds of transformer share one group, and raftlog does not convert a classic group
that has members into a consumer group (Kafka's ``group.consumer.migration.policy``), so with
librdkafka's default (classic) protocol whichever client joined second would be refused.

With ``--command-config`` (a secure cluster) both clients take the file's security properties
(`security_config`: librdkafka's own names, so SASL_SSL with SCRAM and the CA's certificate).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka import TopicPartition as RdTopicPartition

from chaos.txn_history import output_value, transaction_name
from dataplane.tools.command_config import parse_properties

log = logging.getLogger("chaos.rd_transformer")
CALL_TIMEOUT_S = 10.0  # each transactional call; repeated until `give_up_s`
RETRY_WAIT_S = 0.5  # between repeated calls
# A transactional call still blocked this long past its timeout is hung (librdkafka issues 5456
# and 5511: send_offsets_to_transaction waits forever for a group coordinator that is down).
HUNG_AFTER_S = CALL_TIMEOUT_S + 10.0
UNKNOWN_EXIT_STATUS = 3  # chaos/transformer.py: a transaction's outcome is unknown
# the properties of --command-config librdkafka takes (Java's PEM store names it does not)
SECURITY_PROPERTIES = frozenset({
    "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
    "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
})  # fmt: skip


def security_config(path: Path | None) -> dict[str, str]:
    """The security properties of a client properties file (none without one)."""
    if path is None:
        return {}
    properties = parse_properties(path.read_text(encoding="utf-8"))
    return {k: v for k, v in properties.items() if k in SECURITY_PROPERTIES}


class OutcomeUnknown(Exception):
    """A commit or abort whose outcome this process cannot learn (or a fenced producer): exit."""


@dataclass
class _Delivery:
    """One output record's delivery report: its offset once acknowledged."""

    offset: int | None = None
    error: str = ""

    def report(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            self.offset = message.offset()
        else:
            self.error = str(error)


@dataclass
class _Open:
    serial: int
    start_s: float
    started: float  # monotonic, for --commit-ms
    inputs: dict[int, list[int]] = field(default_factory=dict)  # partition -> [first, last]
    outputs: list[tuple[int, str, _Delivery]] = field(default_factory=list)

    @property
    def records(self) -> int:
        return len(self.outputs)


class RdTransformer:
    """chaos/transformer.py's `Transformer` on confluent-kafka: `run`, `stop`, `close`."""

    def __init__(self, args: argparse.Namespace, history: IO[str]) -> None:
        self.args = args
        self.history = history
        self.stop = threading.Event()
        self.rng = random.Random(f"{args.seed}:{args.transactional_id}:{args.incarnation}")
        security = security_config(args.command_config)
        self.consumer = Consumer({
            "bootstrap.servers": args.bootstrap, "group.id": args.group,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "isolation.level": "read_committed", "group.protocol": "consumer",
            "socket.timeout.ms": 5_000,
            "topic.metadata.refresh.interval.ms": 5_000, "fetch.wait.max.ms": 200,
            "logger": log, **security,
        })  # fmt: skip
        # message.timeout.ms is left to librdkafka: it caps it at transaction.timeout.ms.
        self.producer = Producer({
            "bootstrap.servers": args.bootstrap, "transactional.id": args.transactional_id,
            "transaction.timeout.ms": args.transaction_timeout_ms, "linger.ms": 5,
            "socket.timeout.ms": 5_000, "request.timeout.ms": 5_000,
            "topic.metadata.refresh.interval.ms": 5_000, "logger": log, **security,
        })  # fmt: skip
        self.open: _Open | None = None
        self.serial = 0
        self._writing = threading.Lock()  # history lines: the loop's, or the watchdog's last
        self._call: tuple[str, float, _Open | None] | None = None  # (what, since, transaction)
        self._ending: _Open | None = None  # the transaction `_end` is ending
        threading.Thread(target=self._watch, name="hung-call-watchdog", daemon=True).start()

    def now(self) -> float:
        t0: float = self.args.t0
        return round(time.monotonic() - t0, 4)

    def _line(self, **fields: Any) -> None:
        with self._writing:
            self.history.write(json.dumps(fields) + "\n")
            self.history.flush()

    def _watch(self) -> None:
        """A librdkafka call that blocks past HUNG_AFTER_S does not return to Python (not even
        for SIGTERM): record the transaction it was ending as unknown and exit with status 3,
        as a commit that keeps failing does; the next incarnation's init_transactions
        resolves it."""
        while True:
            time.sleep(1.0)  # a watchdog's period, not a synchronisation
            with self._writing:
                call = self._call
                if call is None or time.monotonic() - call[1] < HUNG_AFTER_S:
                    continue
                what, _, txn = call
                reason = f"{what}: blocked past its timeout in librdkafka"
                if txn is not None:
                    self.history.write(
                        json.dumps(self._ended_fields(txn, "unknown", reason)) + "\n"
                    )
                    self.history.flush()
                log.error("exiting, a transaction's outcome is unknown: %s", reason)
                logging.shutdown()
                os._exit(UNKNOWN_EXIT_STATUS)  # the main thread is stuck inside librdkafka

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> int:
        self._repeat("init_transactions", lambda: self.producer.init_transactions(CALL_TIMEOUT_S))
        self.consumer.subscribe([self.args.input], on_revoke=self._on_revoke)
        while not self.stop.is_set():
            self._poll_once()
            txn = self.open
            if txn is not None and (
                txn.records >= self.args.commit_records
                or time.monotonic() - txn.started >= self.args.commit_ms / 1000
            ):
                self._finish()
        if self.open is not None:
            self._finish()
        return 0

    def _poll_once(self) -> None:
        # Not more than the transaction still takes: the rest would be consumed past its end.
        room = self.args.commit_records - (0 if self.open is None else self.open.records)
        for message in self.consumer.consume(num_messages=max(1, room), timeout=0.2):
            error = message.error()
            if error is not None:
                log.info("consume: %s", error)
                continue
            partition, offset = message.partition(), message.offset()
            if partition is None or offset is None:
                continue
            self._transform(partition, offset, (message.value() or b"").decode())
        self._poll_producer()

    def _poll_producer(self) -> None:
        """Serve delivery reports; librdkafka raises a fatal error here too (fenced): exit."""
        try:
            self.producer.poll(0)
        except KafkaException as error:
            raise OutcomeUnknown(f"producer poll: {_describe(error)}") from error

    def _transform(self, partition: int, offset: int, value: str) -> None:
        if self.open is None:
            try:
                self.producer.begin_transaction()
            except KafkaException as error:  # fatal: this producer is done
                raise OutcomeUnknown(f"begin_transaction: {_describe(error)}") from error
            self.open = _Open(self.serial, self.now(), time.monotonic())
            self.serial += 1
        txn = self.open
        span = txn.inputs.setdefault(partition, [offset, offset])
        span[1] = offset
        name = transaction_name(self.args.transactional_id, self.args.incarnation, txn.serial)
        out = output_value(value, name)
        target = partition % self.args.output_partitions
        delivery = _Delivery()
        try:
            self._produce(target, out, delivery)
        except KafkaException as error:  # the transaction failed: the commit aborts it
            log.info("produce: %s", error)
            delivery.error = _describe(error)
        txn.outputs.append((target, out, delivery))

    def _produce(self, partition: int, value: str, delivery: _Delivery) -> None:
        """Produce, waiting for room in librdkafka's queue (BufferError) until `give_up_s`."""
        deadline = time.monotonic() + self.args.give_up_s
        while True:
            try:
                self.producer.produce(
                    self.args.output, value=value.encode(), partition=partition,
                    on_delivery=delivery.report,
                )  # fmt: skip
                return
            except BufferError:
                if time.monotonic() >= deadline:
                    raise KafkaException(KafkaError(KafkaError._QUEUE_FULL)) from None
                self._poll_producer()  # serves delivery reports, which frees the queue
                time.sleep(0.05)  # a backoff while librdkafka sends, not a synchronisation

    # -- ending a transaction ------------------------------------------------------------------
    def _finish(self, rewind: bool = True) -> None:
        txn = self.open
        if txn is None:
            return
        self.open = None
        commit = self.rng.random() >= self.args.abort_fraction
        self._line(
            event="prepared", transformer=self.args.transactional_id,
            incarnation=self.args.incarnation, serial=txn.serial, start_s=txn.start_s,
            inputs=[
                {"partition": p, "first_offset": first, "last_offset": last}
                for p, (first, last) in sorted(txn.inputs.items())
            ],
            outputs=[{"partition": p, "value": v} for p, v, _ in txn.outputs],
            intent="commit" if commit else "abort", client="confluent",
        )  # fmt: skip
        self._ending = txn
        try:
            outcome, error = self._end(commit, txn)
        except OutcomeUnknown as failure:
            self._ended(txn, "unknown", str(failure))
            raise
        self._ended(txn, outcome, error)
        if outcome == "aborted" and rewind:
            self._rewind(txn)

    def _end(self, commit: bool, txn: _Open) -> tuple[str, str]:
        """Commit with the offsets, or abort; (outcome, error). A call that requires an abort
        ends in one; a fatal error or a commit or abort that never succeeds raises
        OutcomeUnknown."""
        self._flush()  # delivery reports; meant aborts: the records are in the log first
        if not commit:
            self._abort()
            return "aborted", ""
        offsets = [
            RdTopicPartition(self.args.input, p, last + 1) for p, (_, last) in txn.inputs.items()
        ]
        try:
            group = self.consumer.consumer_group_metadata()
            self._repeat(
                "send_offsets_to_transaction",
                lambda: self.producer.send_offsets_to_transaction(offsets, group, CALL_TIMEOUT_S),
            )
            self._repeat("commit", lambda: self.producer.commit_transaction(CALL_TIMEOUT_S))
            return "committed", ""
        except _Abortable as failure:
            self._abort()
            return "aborted", str(failure)

    def _abort(self) -> None:
        try:
            self._repeat("abort", lambda: self.producer.abort_transaction(CALL_TIMEOUT_S))
        except _Abortable as failure:  # an abort cannot require an abort: no outcome known
            raise OutcomeUnknown(str(failure)) from failure

    def _flush(self) -> None:
        try:
            remaining = self.producer.flush(CALL_TIMEOUT_S)
        except KafkaException as error:  # fatal (fenced): the outcome is the coordinator's
            raise OutcomeUnknown(f"flush: {_describe(error)}") from error
        if remaining:  # they fail with the abort, or the commit waits for them
            log.info("flush: %d records still in flight", remaining)

    def _ended(self, txn: _Open, outcome: str, error: str) -> None:
        try:
            self.producer.poll(0)  # the last delivery reports
        except KafkaException as failure:  # fatal: poll raises it again; the offsets known stay
            log.info("delivery reports: %s", failure)
        self._line(**self._ended_fields(txn, outcome, error))
        self._ending = None

    def _ended_fields(self, txn: _Open, outcome: str, error: str) -> dict[str, Any]:
        return {
            "event": "ended", "transformer": self.args.transactional_id,
            "incarnation": self.args.incarnation, "serial": txn.serial, "outcome": outcome,
            "end_s": self.now(), "offsets": [d.offset for _, _, d in txn.outputs], "error": error,
        }  # fmt: skip

    def _rewind(self, txn: _Open) -> None:
        """Seek each partition the aborted transaction read (still assigned) back to the group's
        committed offset, else to the transaction's first input offset. A seek that fails
        would skip input: the process exits and its next incarnation starts at the group's
        offsets."""
        owned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
        mine = [p for p in txn.inputs if (self.args.input, p) in owned]
        if not mine:
            return
        targets = {p: txn.inputs[p][0] for p in mine}
        try:
            asked = [RdTopicPartition(self.args.input, p) for p in mine]
            for tp in self.consumer.committed(asked, timeout=CALL_TIMEOUT_S):
                if tp.error is None and tp.offset != OFFSET_INVALID and tp.offset >= 0:
                    targets[tp.partition] = tp.offset
        except KafkaException as error:
            log.info("committed offsets for the rewind: %s; the transaction's first offsets", error)
        for partition, offset in sorted(targets.items()):
            try:
                self.consumer.seek(RdTopicPartition(self.args.input, partition, offset))
            except KafkaException as error:
                raise OutcomeUnknown(
                    f"rewind {partition} to {offset}: {_describe(error)}"
                ) from error

    def _repeat(self, what: str, call: Callable[[], object]) -> None:
        """`call` until it returns, again after a retriable error until `give_up_s`; an error
        that requires an abort raises `_Abortable`, a fatal one or the last retriable one
        OutcomeUnknown."""
        deadline = time.monotonic() + self.args.give_up_s
        while True:
            try:
                with self._writing:
                    self._call = (what, time.monotonic(), self._ending)
                try:
                    call()
                finally:
                    with self._writing:
                        self._call = None
                return
            except KafkaException as exception:
                error = exception.args[0]
                if not isinstance(error, KafkaError) or error.fatal():
                    raise OutcomeUnknown(f"{what}: {_describe(exception)}") from exception
                if error.txn_requires_abort():
                    raise _Abortable(f"{what}: {_describe(exception)}") from exception
                if not error.retriable() or time.monotonic() >= deadline:
                    raise OutcomeUnknown(f"{what}: {_describe(exception)}") from exception
                log.info("%s: %s; again", what, error)
                time.sleep(RETRY_WAIT_S)  # a backoff between attempts, not a synchronisation

    def _on_revoke(self, consumer: Consumer, revoked: list[RdTopicPartition]) -> None:
        """End the transaction before its partitions go elsewhere (called inside `consume`;
        an OutcomeUnknown raised here comes out of `consume`). No rewind: a partition revoked
        is read again from the group's offsets by its next owner."""
        txn = self.open
        if txn is not None and any(tp.partition in txn.inputs for tp in revoked):
            self._finish(rewind=False)

    def close(self) -> None:
        try:
            self.consumer.close()
            self.producer.flush(5.0)
        except KafkaException as error:  # a fenced producer's flush raises its fatal error
            log.info("close: %s", error)


class _Abortable(Exception):
    """A transactional call failed with ``txn_requires_abort()``."""


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]
