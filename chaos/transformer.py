"""A transformer of the transactions workload: one OS process the harness starts, SIGKILLs and
starts again (chaos/transactions.py), running Kafka's consume-transform-produce loop (KIP-98,
KIP-447) with raftlog's client, or with librdkafka (``--client confluent``: chaos/rd_transformer.py,
the same loop and history through the KAFKA listener)::

    python -m chaos.transformer --bootstrap H:P,... --input T --output O --group G \\
        --transactional-id ID --incarnation N --seed S --history FILE --t0 MONOTONIC

It reads the input topic in group G with read_committed, and for each batch of input records
(up to ``--commit-records`` or ``--commit-ms`` after the first) writes, in one transaction,
``<input value>|<ID>.<N>.<serial>`` to the output partition of the same number and the
group's offsets after those records (``send_offsets_to_transaction``). A fraction of the
transactions (``--abort-fraction``, drawn from the seed, the id and the incarnation) is aborted
on purpose, once its records are in the log (read_uncommitted readers see them); after any
abort the consumer seeks back to the transaction's first input offsets, so the records are
transformed again in a later transaction.

Each transaction leaves two JSON lines in ``--history``: ``prepared`` (what it read and sent,
and whether it means to commit) just before ``commit_transaction``/``abort_transaction``, and
``ended`` with the outcome once that returned. A transaction with no ``ended`` line died with
the process: its outcome is unknown (chaos/transactions.py `read_transactions`). Times are
seconds since ``--t0`` on the machine's monotonic clock (the harness's clock too).

A commit or abort that keeps failing (the coordinator unreachable past ``--give-up-s``) or a
fatal error (this producer fenced) ends the process with status 3 after recording the
transaction's outcome as unknown; the harness starts it again, and the new incarnation's
``init_transactions`` fences this one and completes its transaction, as a restarted Kafka
application does. SIGTERM ends the loop after the current transaction (committed as meant).

``--command-config FILE`` (a secure cluster, ``raftlog chaos run --secure``): the client
properties to connect with (``security.protocol``, ``sasl.*``, ``ssl.*``; chaos/secure.py writes
the workload user's), for either client.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

import grpc

from chaos.txn_history import TXN_CLIENTS, output_value, transaction_name
from dataplane.client import (
    AbortableTransactionError,
    Consumer,
    ConsumerRebalanceListener,
    FatalTransactionError,
    Producer,
    TopicPartition,
)
from dataplane.client.producer import RecordFuture
from dataplane.tools.command_config import read_command_config
from raftlog.errors import KafkaError

if TYPE_CHECKING:
    from chaos.rd_transformer import RdTransformer

log = logging.getLogger("chaos.transformer")
# What a client call raises when the cluster misbehaves (retried, or the transaction aborted).
CLIENT_ERRORS = (KafkaError, grpc.RpcError, TimeoutError, OSError)
UNKNOWN_EXIT_STATUS = 3  # a transaction's outcome is unknown: start again to resolve it
CALL_TIMEOUT_S = 10.0  # each transactional call; repeated until `give_up_s`
RETRY_WAIT_S = 0.5  # between repeated calls


@dataclass
class _Open:
    """The transaction being built: input offsets per partition, output records sent."""

    serial: int
    start_s: float
    started: float  # monotonic, for --commit-ms
    inputs: dict[int, list[int]] = field(default_factory=dict)  # partition -> [first, last]
    outputs: list[tuple[int, str, RecordFuture]] = field(default_factory=list)

    @property
    def records(self) -> int:
        return len(self.outputs)


class OutcomeUnknown(Exception):
    """A commit or abort whose outcome this process cannot learn: it must exit."""


class Transformer(ConsumerRebalanceListener):
    def __init__(self, args: argparse.Namespace, history: IO[str]) -> None:
        self.args = args
        self.history = history
        self.stop = threading.Event()
        self.rng = random.Random(f"{args.seed}:{args.transactional_id}:{args.incarnation}")
        bootstrap = args.bootstrap.split(",")
        security = None if args.command_config is None else read_command_config(args.command_config)
        self.consumer = Consumer(
            bootstrap, group_id=args.group, enable_auto_commit=False,
            auto_offset_reset="earliest", isolation_level="read_committed",
            max_poll_records=args.commit_records, request_timeout_ms=5_000,
            fetch_max_wait_ms=200, metadata_max_age_ms=5_000, security=security,
        )  # fmt: skip
        self.producer = Producer(
            bootstrap, transactional_id=args.transactional_id,
            transaction_timeout_ms=args.transaction_timeout_ms, linger_ms=5,
            request_timeout_ms=5_000, delivery_timeout_ms=30_000, max_block_ms=10_000,
            metadata_max_age_ms=5_000, security=security,
        )  # fmt: skip
        self.open: _Open | None = None
        self.serial = 0

    def now(self) -> float:
        t0: float = self.args.t0
        return round(time.monotonic() - t0, 4)

    def _line(self, **fields: Any) -> None:
        self.history.write(json.dumps(fields) + "\n")
        self.history.flush()

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> int:
        self._repeat("init_transactions", lambda: self.producer.init_transactions(CALL_TIMEOUT_S))
        self.consumer.subscribe([self.args.input], listener=self)
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
        try:
            polled = self.consumer.poll(200)
        except KafkaError as error:
            log.info("poll: %s", error)
            self.stop.wait(0.2)  # back off after a failed poll
            return
        for tp, records in polled.items():
            for record in records:
                self._transform(tp.partition, record.offset, (record.value or b"").decode())

    def _transform(self, partition: int, offset: int, value: str) -> None:
        if self.open is None:
            self.producer.begin_transaction()
            self.open = _Open(self.serial, self.now(), time.monotonic())
            self.serial += 1
        txn = self.open
        span = txn.inputs.setdefault(partition, [offset, offset])
        span[1] = offset
        name = transaction_name(self.args.transactional_id, self.args.incarnation, txn.serial)
        out = output_value(value, name)
        target = partition % self.args.output_partitions
        try:
            future = self.producer.send(self.args.output, out.encode(), partition=target)
        except (KafkaError, TimeoutError) as error:  # the transaction failed: abort it below
            log.info("send: %s", error)
            future = RecordFuture.failed(TopicPartition(self.args.output, target), error)
        txn.outputs.append((target, out, future))

    # -- ending a transaction ------------------------------------------------------------------
    def _finish(self) -> None:
        """Commit (or abort, as drawn) the open transaction with its input offsets; record it."""
        txn = self.open
        if txn is None:
            return
        self.open = None
        commit = self.rng.random() >= self.args.abort_fraction
        offsets = {
            TopicPartition(self.args.input, p): last + 1 for p, (_, last) in txn.inputs.items()
        }
        self._line(
            event="prepared", transformer=self.args.transactional_id,
            incarnation=self.args.incarnation, serial=txn.serial, start_s=txn.start_s,
            inputs=[
                {"partition": p, "first_offset": first, "last_offset": last}
                for p, (first, last) in sorted(txn.inputs.items())
            ],
            outputs=[{"partition": p, "value": v} for p, v, _ in txn.outputs],
            intent="commit" if commit else "abort", client="ours",
        )  # fmt: skip
        try:
            outcome, error = self._end(commit, offsets)
        except (OutcomeUnknown, FatalTransactionError) as failure:
            self._ended(txn, "unknown", _describe(failure))
            raise OutcomeUnknown(_describe(failure)) from failure
        self._ended(txn, outcome, error)
        if outcome == "aborted":
            self._rewind(txn)

    def _end(self, commit: bool, offsets: dict[TopicPartition, int]) -> tuple[str, str]:
        """Commit with the offsets, or abort; (outcome, error). An offsets call or a commit
        that fails abortably, or an offsets call that times out (the coordinator moving), ends
        in an abort; a fatal error or a commit or abort that never succeeds propagates."""
        if not commit:
            self._flush()  # in the log before the abort: read_uncommitted readers see them
            self._repeat("abort", lambda: self.producer.abort_transaction(CALL_TIMEOUT_S))
            return "aborted", ""
        try:
            group = self.consumer.group_metadata()
            self.producer.send_offsets_to_transaction(offsets, group, CALL_TIMEOUT_S)
            self._repeat("commit", lambda: self.producer.commit_transaction(CALL_TIMEOUT_S))
            return "committed", ""
        except FatalTransactionError:
            raise
        except (AbortableTransactionError, *CLIENT_ERRORS) as failure:
            self._repeat("abort", lambda: self.producer.abort_transaction(CALL_TIMEOUT_S))
            return "aborted", _describe(failure)

    def _flush(self) -> None:
        """Send the transaction's records (a failure shows on their futures; the abort that
        follows clears it)."""
        try:
            self.producer.flush(CALL_TIMEOUT_S)
        except CLIENT_ERRORS as error:
            log.info("flush before an abort: %s", error)

    def _ended(self, txn: _Open, outcome: str, error: str) -> None:
        offsets = [_offset(future) for _, _, future in txn.outputs]
        self._line(
            event="ended", transformer=self.args.transactional_id,
            incarnation=self.args.incarnation, serial=txn.serial, outcome=outcome,
            end_s=self.now(), offsets=offsets, error=error,
        )  # fmt: skip

    def _rewind(self, txn: _Open) -> None:
        """After an abort, read the transaction's input again (the partitions still owned)."""
        owned = self.consumer.assignment()
        for partition, (first, _) in txn.inputs.items():
            tp = TopicPartition(self.args.input, partition)
            if tp in owned:
                self.consumer.seek(tp, first)

    def _repeat(self, what: str, call: Any) -> None:
        """`call` until it returns, repeated after retriable failures (Kafka allows repeating
        init_transactions, commit_transaction and abort_transaction after a timeout) until
        `give_up_s`; abortable and fatal errors propagate."""
        deadline = time.monotonic() + self.args.give_up_s
        while True:
            try:
                call()
                return
            except (AbortableTransactionError, FatalTransactionError):
                raise
            except CLIENT_ERRORS as error:
                if time.monotonic() >= deadline:
                    raise OutcomeUnknown(f"{what}: {_describe(error)}") from error
                log.info("%s: %s; again", what, error)
                time.sleep(RETRY_WAIT_S)  # a backoff between attempts, not a synchronisation

    # ConsumerRebalanceListener: end the transaction before its partitions go elsewhere.
    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        txn = self.open
        if txn is not None and any(tp.partition in txn.inputs for tp in revoked):
            self._finish()

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        return None

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        return None

    def close(self) -> None:
        self.consumer.close()
        self.producer.close(5.0)


def _offset(future: RecordFuture) -> int | None:
    if not future.done() or future.exception() is not None:
        return None
    return future.result().offset


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="chaos.transformer", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--client", choices=TXN_CLIENTS, default="ours",
        help="raftlog's client (gRPC) or confluent-kafka (librdkafka, the KAFKA listener)",
    )  # fmt: skip
    parser.add_argument(
        "--bootstrap", required=True,
        help="host:port,... of the brokers (their KAFKA listeners with --client confluent)",
    )  # fmt: skip
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--output-partitions", type=int, required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--incarnation", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--history", type=Path, required=True, help="JSON lines, appended")
    parser.add_argument("--t0", type=float, required=True, help="time zero, time.monotonic()")
    parser.add_argument("--commit-records", type=int, default=50)
    parser.add_argument("--commit-ms", type=int, default=500)
    parser.add_argument("--abort-fraction", type=float, default=0.1)
    parser.add_argument("--transaction-timeout-ms", type=int, default=10_000)
    parser.add_argument("--give-up-s", type=float, default=30.0)
    parser.add_argument(
        "--command-config", type=Path, default=None,
        help="client properties (security.protocol, sasl.*, ssl.*) for a secure cluster",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not 0 <= args.abort_fraction <= 1 or args.commit_records < 1 or args.commit_ms < 1:
        parser.error("--abort-fraction in 0..1, --commit-records and --commit-ms >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    with args.history.open("a", encoding="utf-8") as history:
        transformer: Transformer | RdTransformer
        unknown: tuple[type[Exception], ...] = (OutcomeUnknown,)
        if args.client == "confluent":
            # Loaded only here: the gRPC transformer does not need librdkafka.
            from chaos import rd_transformer  # noqa: PLC0415

            transformer = rd_transformer.RdTransformer(args, history)
            unknown = (rd_transformer.OutcomeUnknown,)
        else:
            transformer = Transformer(args, history)

        def stop(signum: int, frame: FrameType | None) -> None:
            transformer.stop.set()

        signal.signal(signal.SIGTERM, stop)
        try:
            return transformer.run()
        except unknown as error:
            log.error("exiting, a transaction's outcome is unknown: %s", error)
            return UNKNOWN_EXIT_STATUS
        finally:
            transformer.close()


if __name__ == "__main__":
    sys.exit(main())
