"""The transactional producer's state (Kafka's ``TransactionManager``), without IO.

A producer with a ``transactional.id`` moves through Kafka's states, one table of legal
transitions (:data:`TRANSITIONS`) and one :meth:`TransactionManager._transition_to`::

    UNINITIALIZED -> INITIALIZING -> READY -> IN_TRANSACTION -> COMMITTING_TRANSACTION -> READY
                                               IN_TRANSACTION -> ABORTING_TRANSACTION -> READY
    IN_TRANSACTION | COMMITTING_TRANSACTION -> ABORTABLE_ERROR -> ABORTING_TRANSACTION
    IN_TRANSACTION -> PREPARED_TRANSACTION (KIP-939's two-phase commit: the transaction is left
                      open for another process to complete; only close() is left)
    ABORTING_TRANSACTION -> INITIALIZING (an epoch bump after failed batches) -> READY
    any -> FATAL_ERROR (only close() is left)

The application threads (``begin_transaction``, ``send``, ``commit_transaction``, ...) and the
sender thread (which adds partitions to the transaction before their first batch goes, and
reports failed batches) share one manager; every method takes its lock.

Errors are classified as Kafka's Java client does (:func:`classify`):

* **fatal** (:class:`FatalTransactionError`; :class:`ProducerFencedError` when a newer producer
  with the same transactional id took over): PRODUCER_FENCED, INVALID_PRODUCER_EPOCH from the
  coordinator, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, UNSUPPORTED_VERSION, INVALID_TXN_STATE,
  TRANSACTION_COORDINATOR_FENCED, INVALID_TRANSACTION_TIMEOUT. Every later call raises it;
  close the producer.
* **abortable** (:class:`AbortableTransactionError`): any other failure inside a transaction,
  e.g. a record too large, a topic missing, INVALID_PRODUCER_EPOCH answered to a Produce
  (KIP-588), a group refusing the offsets. ``abort_transaction()`` clears it.
* **retriable**: the coordinator moved or is loading, CONCURRENT_TRANSACTIONS, a network error:
  retried within the call's timeout, then :class:`ProducerTimeoutError`; the call may be
  repeated (Kafka's rule for ``init_transactions`` and ``commit_transaction``).

A call the state does not allow (commit without begin, send outside a transaction) raises
:class:`TransactionStateError` at once: a caller's bug, Kafka's ``IllegalStateException``.
"""

from __future__ import annotations

import enum
import threading
from typing import Literal

from dataplane.client._types import TopicPartition
from raftlog.errors import ErrorCode, KafkaError

__all__ = [
    "AbortableTransactionError",
    "FatalTransactionError",
    "ProducerFencedError",
    "TransactionAbortedError",
    "TransactionManager",
    "TransactionState",
    "TransactionStateError",
    "classify",
]


class TransactionStateError(RuntimeError):
    """A transactional call the producer's state does not allow (Kafka's
    ``IllegalStateException``): commit without begin, send outside a transaction, begin
    before ``init_transactions``, any transactional call on a producer without a
    ``transactional_id``."""


class FatalTransactionError(KafkaError):
    """The producer cannot go on: only ``close()`` is left. Carries the broker's code."""


class ProducerFencedError(FatalTransactionError):
    """A newer producer with the same transactional id initialised (a higher epoch): this one
    is a zombie (Kafka's ``ProducerFencedException``)."""


class AbortableTransactionError(KafkaError):
    """The transaction failed: call ``abort_transaction()``, then begin a new one."""


class TransactionAbortedError(KafkaError):
    """What the future of a record holds when its transaction was aborted before it was sent
    (Kafka's ``TransactionAbortedException``)."""

    def __init__(self, message: str = "the transaction was aborted before it was sent") -> None:
        super().__init__(ErrorCode.INVALID_TXN_STATE, message)


class TransactionState(enum.Enum):
    UNINITIALIZED = "Uninitialized"
    INITIALIZING = "Initializing"
    READY = "Ready"
    IN_TRANSACTION = "InTransaction"
    COMMITTING_TRANSACTION = "CommittingTransaction"
    ABORTING_TRANSACTION = "AbortingTransaction"
    ABORTABLE_ERROR = "AbortableError"
    PREPARED_TRANSACTION = "PreparedTransaction"
    FATAL_ERROR = "FatalError"


S = TransactionState
# target -> the states it may be reached from (Kafka's TransactionManager.isTransitionValid)
TRANSITIONS: dict[TransactionState, frozenset[TransactionState]] = {
    S.UNINITIALIZED: frozenset(),
    S.INITIALIZING: frozenset({S.UNINITIALIZED, S.ABORTING_TRANSACTION}),
    S.READY: frozenset({S.INITIALIZING, S.COMMITTING_TRANSACTION, S.ABORTING_TRANSACTION}),
    S.IN_TRANSACTION: frozenset({S.READY}),
    S.COMMITTING_TRANSACTION: frozenset({S.IN_TRANSACTION}),
    S.ABORTING_TRANSACTION: frozenset({S.IN_TRANSACTION, S.ABORTABLE_ERROR}),
    S.ABORTABLE_ERROR: frozenset(
        {S.IN_TRANSACTION, S.COMMITTING_TRANSACTION, S.ABORTABLE_ERROR, S.INITIALIZING}
    ),
    S.PREPARED_TRANSACTION: frozenset({S.IN_TRANSACTION}),
    S.FATAL_ERROR: frozenset(S),
}
# states in which the sender adds partitions and sends the transaction's batches
SENDING = frozenset({S.IN_TRANSACTION, S.COMMITTING_TRANSACTION})

FATAL_CODES = frozenset(
    {
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.INVALID_TXN_STATE,
        ErrorCode.TRANSACTION_COORDINATOR_FENCED,
        ErrorCode.INVALID_TRANSACTION_TIMEOUT,
    }
)
# on the produce path INVALID_PRODUCER_EPOCH is abortable (KIP-588); the others stay fatal
FATAL_PRODUCE_CODES = frozenset(
    {
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ErrorCode.UNSUPPORTED_VERSION,
    }
)
FENCED_CODES = frozenset({ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH})
Severity = Literal["retriable", "abortable", "fatal"]


def classify(code: ErrorCode, *, produce: bool = False) -> Severity:
    """How a transactional producer treats ``code``: answered by a coordinator (the
    default) or by a partition leader to a Produce (``produce=True``)."""
    if code in (FATAL_PRODUCE_CODES if produce else FATAL_CODES):
        return "fatal"
    if code.retriable and not produce:
        return "retriable"
    return "abortable"


def as_transaction_error(error: KafkaError, severity: Severity) -> KafkaError:
    """The error to raise (and keep) for a fatal or abortable failure; its cause is
    ``error``."""
    if isinstance(error, FatalTransactionError | AbortableTransactionError):
        return error
    if severity == "fatal":
        kind = ProducerFencedError if error.error in FENCED_CODES else FatalTransactionError
        made: KafkaError = kind(error.error, error.message)
    else:
        made = AbortableTransactionError(error.error, error.message)
    made.__cause__ = error
    return made


class TransactionManager:
    """The transactional state of one producer. Thread-safe."""

    def __init__(self, transactional_id: str, transaction_timeout_ms: int) -> None:
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self._lock = threading.Lock()
        self._state = S.UNINITIALIZED
        self._last_error: KafkaError | None = None  # set in ABORTABLE_ERROR and FATAL_ERROR
        self._producer_id = -1
        self._producer_epoch = -1
        # partitions of the open transaction: new (to add), being added (the sender's
        # AddPartitionsToTxn is in flight), added (the coordinator has them)
        self._pending: set[TopicPartition] = set()
        self._adding: set[TopicPartition] = set()
        self._added: set[TopicPartition] = set()
        self._offsets_added = False  # AddOffsetsToTxn succeeded in this transaction
        # a batch of this epoch failed after its sequences were assigned: the next epoch must
        # start afresh (KIP-360's bump, done when the transaction is aborted)
        self._epoch_bump_required = False

    # -- reading -----------------------------------------------------------------------------
    @property
    def state(self) -> TransactionState:
        with self._lock:
            return self._state

    def producer_id_and_epoch(self) -> tuple[int, int]:
        with self._lock:
            return self._producer_id, self._producer_epoch

    def last_error(self) -> KafkaError | None:
        with self._lock:
            return self._last_error if self._state in (S.ABORTABLE_ERROR, S.FATAL_ERROR) else None

    def transaction_started(self) -> bool:
        """The coordinator knows of this transaction (a partition or the offsets were added):
        ending it takes an EndTxn."""
        with self._lock:
            return bool(self._added) or self._offsets_added

    @property
    def epoch_bump_required(self) -> bool:
        with self._lock:
            return self._epoch_bump_required

    def is_sendable(self, tp: TopicPartition) -> bool:
        """The sender may send ``tp``'s batches: the transaction is open (or committing) and
        the coordinator has the partition."""
        with self._lock:
            return self._state in SENDING and tp in self._added

    # -- transitions ---------------------------------------------------------------------------
    def _transition_to(self, target: TransactionState, error: KafkaError | None = None) -> None:
        """The only mutator of the state; the caller holds the lock."""
        if self._state not in TRANSITIONS[target]:
            raise TransactionStateError(
                f"transactional id {self.transactional_id!r}: cannot go from "
                f"{self._state.value} to {target.value}"
            )
        self._state = target
        if target in (S.ABORTABLE_ERROR, S.FATAL_ERROR):
            self._last_error = error

    def _fail_if_error_locked(self) -> None:
        if self._state in (S.ABORTABLE_ERROR, S.FATAL_ERROR):
            assert self._last_error is not None, "an error state keeps its error"
            raise self._last_error

    def _require_locked(self, what: str, *states: TransactionState) -> None:
        self._fail_if_error_locked()
        if self._state not in states:
            raise TransactionStateError(
                f"{what} is not allowed in state {self._state.value} "
                f"(transactional id {self.transactional_id!r})"
            )

    def begin_init(self) -> None:
        """``init_transactions``: UNINITIALIZED -> INITIALIZING; a repeated call after a
        timeout carries on where the first stopped."""
        with self._lock:
            if self._state is S.INITIALIZING:
                return
            self._require_locked("init_transactions()", S.UNINITIALIZED)
            self._transition_to(S.INITIALIZING)

    def begin_epoch_bump(self) -> None:
        """After an abort whose batches failed: ABORTING -> INITIALIZING (InitProducerId with
        the current id and epoch follows)."""
        with self._lock:
            self._transition_to(S.INITIALIZING)

    def initialized(self, producer_id: int, producer_epoch: int) -> None:
        with self._lock:
            self._transition_to(S.READY)
            self._producer_id, self._producer_epoch = producer_id, producer_epoch
            self._epoch_bump_required = False
            self._clear_locked()

    def begin_transaction(self) -> None:
        with self._lock:
            self._require_locked("begin_transaction()", S.READY)
            self._transition_to(S.IN_TRANSACTION)

    def check_can_send(self) -> None:
        """``send`` on a transactional producer needs an open transaction."""
        with self._lock:
            self._require_locked("send() outside a transaction", S.IN_TRANSACTION)

    def check_in_transaction(self, what: str) -> None:
        with self._lock:
            self._require_locked(what, S.IN_TRANSACTION)

    def maybe_add_partition(self, tp: TopicPartition) -> None:
        """A record was appended for ``tp``: the sender adds new partitions to the
        transaction before their first batch goes. Raises like :meth:`check_can_send`."""
        with self._lock:
            self._require_locked("send() outside a transaction", S.IN_TRANSACTION)
            if tp not in self._added and tp not in self._adding:
                self._pending.add(tp)

    def offsets_added(self) -> None:
        with self._lock:
            self._offsets_added = True

    def begin_commit(self) -> None:
        """IN_TRANSACTION -> COMMITTING; a repeated call after a timeout carries on."""
        with self._lock:
            if self._state is S.COMMITTING_TRANSACTION:
                return
            self._require_locked("commit_transaction()", S.IN_TRANSACTION)
            self._transition_to(S.COMMITTING_TRANSACTION)

    def begin_abort(self) -> None:
        """IN_TRANSACTION or ABORTABLE_ERROR -> ABORTING; a repeated call carries on. A fatal
        error raises: there is nothing to abort with."""
        with self._lock:
            if self._state is S.ABORTING_TRANSACTION:
                return
            if self._state is S.FATAL_ERROR:
                self._fail_if_error_locked()
            if self._state not in TRANSITIONS[S.ABORTING_TRANSACTION]:
                raise TransactionStateError(
                    f"abort_transaction() is not allowed in state {self._state.value} "
                    f"(transactional id {self.transactional_id!r})"
                )
            self._transition_to(S.ABORTING_TRANSACTION)

    def prepared(self) -> None:
        """``prepare_transaction`` flushed every record without error: IN_TRANSACTION ->
        PREPARED_TRANSACTION. The coordinator keeps the transaction open (whoever holds the
        producer id and epoch ends it with EndTxn); this producer starts no other."""
        with self._lock:
            self._require_locked("prepare_transaction()", S.IN_TRANSACTION)
            if not (self._added or self._offsets_added):
                raise TransactionStateError(
                    f"prepare_transaction(): the transaction of {self.transactional_id!r} is "
                    "empty (no record, no offsets): there is nothing for the coordinator to hold"
                )
            self._transition_to(S.PREPARED_TRANSACTION)

    def completed(self) -> None:
        """EndTxn succeeded (or the transaction was empty): COMMITTING/ABORTING -> READY."""
        with self._lock:
            self._transition_to(S.READY)
            self._clear_locked()

    def _clear_locked(self) -> None:
        self._pending.clear()
        self._adding.clear()
        self._added.clear()
        self._offsets_added = False

    def fail(self, error: KafkaError, severity: Severity) -> KafkaError:
        """Enter FATAL_ERROR or ABORTABLE_ERROR for ``error`` and return what to raise. Any
        failure of InitProducerId is fatal (Kafka's). An abortable error while aborting
        leaves the state as it is: the call that met it raises and may be repeated. The first
        error of a transaction is kept."""
        with self._lock:
            kept = self._last_error
            if self._state is S.FATAL_ERROR or (
                self._state is S.ABORTABLE_ERROR and severity != "fatal"
            ):
                assert kept is not None, "an error state keeps its error"
                return kept
            if severity == "fatal" or self._state is S.INITIALIZING:
                fatal = as_transaction_error(error, "fatal")
                self._transition_to(S.FATAL_ERROR, fatal)
                return fatal
            abortable = as_transaction_error(error, "abortable")
            if self._state in SENDING:
                self._transition_to(S.ABORTABLE_ERROR, abortable)
            return abortable

    def batch_failed(self, error: KafkaError, sequences_spent: bool) -> None:
        """A batch of the transaction failed (its futures hold ``error``): the transaction
        cannot commit. ``sequences_spent``: the batch had sequence numbers, so the epoch is
        bumped when the transaction is aborted."""
        with self._lock:
            if sequences_spent:
                self._epoch_bump_required = True
        if not isinstance(error, TransactionAbortedError):
            severity = classify(error.error, produce=True)
            self.fail(error, "fatal" if severity == "fatal" else "abortable")

    # -- the sender's partitions -----------------------------------------------------------
    def take_pending(self) -> list[TopicPartition]:
        """New partitions to add now (the sender's AddPartitionsToTxn), in one request."""
        with self._lock:
            if self._state not in SENDING or not self._pending:
                return []
            taken = sorted(self._pending)
            self._adding.update(taken)
            self._pending.clear()
            return taken

    def partitions_added(self, partitions: list[TopicPartition]) -> None:
        with self._lock:
            for tp in partitions:
                if tp in self._adding:
                    self._adding.discard(tp)
                    self._added.add(tp)

    def add_partitions_retry(self, partitions: list[TopicPartition]) -> None:
        """The AddPartitionsToTxn met a retriable error: the partitions go again."""
        with self._lock:
            for tp in partitions:
                if tp in self._adding:
                    self._adding.discard(tp)
                    self._pending.add(tp)

    def queued_batch_error(self) -> KafkaError | None:
        """What queued (unsent) batches fail with now: the transaction's error, or
        :class:`TransactionAbortedError` while aborting; None while they may go."""
        with self._lock:
            if self._state is S.ABORTING_TRANSACTION:
                return TransactionAbortedError()
            if self._state in (S.ABORTABLE_ERROR, S.FATAL_ERROR):
                return self._last_error
            return None
