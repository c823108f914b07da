"""Two-phase commit across processes (KIP-939's shape): a transaction prepared by one producer
and completed by whoever holds its :class:`PreparedTransaction`.

``Producer.prepare_transaction()`` sends and acknowledges every record (and offsets) of the open
transaction and leaves it open on the coordinator, Ongoing, with the producer's id and epoch.
That (transactional id, producer id, epoch) is all the coordinator asks of an EndTxn, so any
process may end the transaction: :func:`complete_prepared_transaction` finds the transactional
id's coordinator (FindCoordinator, key type 1) and sends EndTxn with commit or abort. This is
how a stream processor's tasks write and its driver decides: the tasks prepare, the driver
commits every task's transaction once all of them prepared (see ``spark/_writer.py``).

The answers, as Kafka's coordinator gives them:

* success: the transaction commits (or aborts); also when an earlier EndTxn of the same outcome
  already completed it, so a completion may be repeated after a crash or a timeout;
* CONCURRENT_TRANSACTIONS (the markers of this very end are still being written),
  NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, network errors: retried until ``timeout_s``,
  then :class:`ProducerTimeoutError` (the outcome is then unknown: complete again);
* PRODUCER_FENCED / INVALID_PRODUCER_EPOCH: a newer producer of the transactional id
  initialised (which aborted this transaction) or the coordinator aborted it after
  ``transaction.timeout.ms`` (which also bumps the epoch): :class:`PreparedTransactionFencedError`;
  its records are aborted and never visible to read_committed readers;
* anything else (INVALID_TXN_STATE: committing what an abort ended, or the reverse;
  INVALID_PRODUCER_ID_MAPPING: the transactional id expired) raises as a ``KafkaError``.

A prepared transaction blocks read_committed readers of its partitions (the last stable offset
stays at its first record) until it is completed or times out: complete it promptly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from dataplane.client._accumulator import ProducerTimeoutError
from dataplane.client._cluster import Cluster, SecuritySetting
from dataplane.client._group import TRANSACTION_KEY, GroupClient
from dataplane.client._transactions import FENCED_CODES, ProducerFencedError
from protos import transaction_pb2 as tpb
from raftlog.errors import ErrorCode, KafkaError

__all__ = ["PreparedTransaction", "PreparedTransactionFencedError", "complete_prepared_transaction"]

CONCURRENT_RETRY_S = 0.02  # the markers of the same end are being written: ask again soon
DEFAULT_COMPLETE_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class PreparedTransaction:
    """What a coordinator needs to end a prepared transaction: small and picklable, so it can
    travel from the process that wrote the records to the one that decides."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


class PreparedTransactionFencedError(ProducerFencedError):
    """The prepared transaction was taken over: a newer producer of its transactional id
    initialised, or the coordinator aborted it after ``transaction.timeout.ms``. Its records
    were aborted."""


def complete_prepared_transaction(
    bootstrap_servers: str | Sequence[str],
    prepared: PreparedTransaction,
    *,
    commit: bool,
    timeout_s: float = DEFAULT_COMPLETE_TIMEOUT_S,
    security: SecuritySetting = None,
) -> None:
    """Commit (``commit=True``) or abort the transaction ``prepared`` names, from any process.
    Returns once the coordinator accepted the end (its markers then reach every partition, as
    after ``commit_transaction``). Raises as the module docstring says."""
    cluster = Cluster(bootstrap_servers, security=security)
    try:
        _end(cluster, prepared, commit, time.monotonic() + max(0.0, timeout_s))
    finally:
        cluster.close()


def _end(cluster: Cluster, prepared: PreparedTransaction, commit: bool, deadline: float) -> None:
    never_closed = threading.Event()  # bounds nothing: the deadline does
    coordinator = GroupClient(
        cluster, prepared.transactional_id, never_closed, time.monotonic, key_type=TRANSACTION_KEY
    )
    request = tpb.EndTxnRequest(
        transactional_id=prepared.transactional_id,
        producer_id=prepared.producer_id,
        producer_epoch=prepared.producer_epoch,
        committed=commit,
    )
    verb = "commit" if commit else "abort"
    while True:
        remaining = max(0.001, deadline - time.monotonic())
        try:
            response = coordinator.call(
                "EndTxn", request, remaining, stub_of=cluster.transaction_stub
            )
            code = ErrorCode.from_code(response.error_code)
            error = KafkaError(code, f"EndTxn ({verb}) of {prepared}: {response.error_message}")
        except KafkaError as raised:  # the coordinator could not be reached in time
            code, error = raised.error, raised
        if code is ErrorCode.NONE:
            return
        if code in FENCED_CODES:
            fenced = PreparedTransactionFencedError(
                code,
                f"{prepared.transactional_id}: the prepared transaction (producer "
                f"{prepared.producer_id}, epoch {prepared.producer_epoch}) was taken over by a "
                f"newer producer or aborted by its timeout: {error.message}",
            )
            raise fenced from error
        if not code.retriable:
            raise error
        left = deadline - time.monotonic()
        if left <= 0:
            raise ProducerTimeoutError(
                f"EndTxn ({verb}) of {prepared.transactional_id} did not succeed in time; last "
                f"error {error}"
            ) from error
        pause = (
            CONCURRENT_RETRY_S if code is ErrorCode.CONCURRENT_TRANSACTIONS else cluster.backoff_s()
        )
        time.sleep(min(pause, left))  # a backoff between attempts, not a synchronisation
