"""What the transactions workload recorded: each transaction as its transformer saw it, and the
output topic after the run, read both ways and from the disk.

The transactions workload (``raftlog chaos run --workload transactions``, chaos/transactions.py)
is a consume-transform-produce loop: transformer processes read the input topic (the one the
acks=all producers write) in a consumer group with read_committed, and write each input record,
transformed, to the output topic inside a transaction that also commits the group's offsets
(``send_offsets_to_transaction``). An output value is ``<input value>|<transaction>``, where
``<transaction>`` (`Transaction.name`) names the transformer's transactional id, its process
incarnation and the transaction's serial, so the checker can tell which transaction wrote a
record and which input it came from. Plain data, frozen, JSON round-trips unchanged, like
chaos/history.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TxnOutcome = Literal["committed", "aborted", "unknown"]
TxnClient = Literal["ours", "confluent"]  # raftlog's client, or librdkafka (confluent-kafka)
TXN_CLIENTS: tuple[TxnClient, ...] = ("ours", "confluent")
ControlType = Literal["commit", "abort"]
OUTPUT_SEPARATOR = "|"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TxnInput(_Model):
    """The input records of one partition a transaction consumed: offsets first..last."""

    partition: int
    first_offset: int
    last_offset: int


class TxnOutput(_Model):
    """One record a transaction sent to the output topic; `offset` once acknowledged."""

    partition: int
    value: str
    offset: int | None = None


class Transaction(_Model):
    """One transaction as its transformer saw it.

    `intent` is what the transformer meant to do (a deterministic fraction of transactions is
    aborted on purpose, drawn from the run's seed); `outcome` what it knows happened:
    ``committed`` (commit_transaction returned), ``aborted`` (abort_transaction returned, meant
    or after an abortable error), or ``unknown``: the process died (SIGKILL) or the commit or
    abort ended in an error that leaves the outcome open. An unknown transaction must end up
    entirely visible or entirely invisible (the coordinator, its restart or its timeout
    decide)."""

    transformer: str  # the transactional id
    incarnation: int  # which start of the transformer's process (0, 1, ...)
    serial: int  # the transaction's number within the incarnation
    inputs: list[TxnInput]
    outputs: list[TxnOutput]
    intent: Literal["commit", "abort"]
    outcome: TxnOutcome
    start_s: float
    end_s: float | None = None  # None: no outcome (the process died)
    error: str = ""
    client: TxnClient = "ours"  # the transformer's Kafka client

    @property
    def name(self) -> str:
        return transaction_name(self.transformer, self.incarnation, self.serial)


def transaction_name(transformer: str, incarnation: int, serial: int) -> str:
    return f"{transformer}.{incarnation}.{serial}"


def output_value(input_value: str, transaction: str) -> str:
    """What a transformer writes for `input_value` inside `transaction`."""
    return f"{input_value}{OUTPUT_SEPARATOR}{transaction}"


def split_output(value: str) -> tuple[str, str] | None:
    """(input value, transaction name) of an output value; None for a value of another shape."""
    input_value, separator, transaction = value.rpartition(OUTPUT_SEPARATOR)
    return (input_value, transaction) if separator and input_value and transaction else None


class TxnBatch(_Model):
    """One batch of an output partition as stored on disk (the final leader's replica):
    its offsets, its producer and whether it is transactional or a marker (`control`)."""

    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    transactional: bool
    control: ControlType | None = None  # a commit or abort marker


class OutputPartition(_Model):
    """One output partition after the run: its records read read_committed (up to the last
    stable offset) and read_uncommitted (up to the high watermark), and its batches on disk
    (None: the replica could not be read)."""

    partition: int
    log_start_offset: int
    last_stable_offset: int
    high_watermark: int
    committed: list[tuple[int, str]]  # (offset, value), read_committed
    uncommitted: list[tuple[int, str]]  # (offset, value), read_uncommitted
    batches: list[TxnBatch] | None = None
    batches_node: int | None = None  # whose replica `batches` come from


class TxnFinal(_Model):
    """The transactions workload's final state: the output topic and the transformers' group
    offsets (None: they could not be read) after the final drain."""

    input_topic: str
    output_topic: str
    group: str
    outputs: list[OutputPartition] = Field(default_factory=list)
    group_offsets: dict[int, int] | None = None  # input partition -> committed offset
    drained: bool = False  # the group's offsets reached the input's end before the read
    incarnations: dict[str, int] = Field(default_factory=dict)  # transformer -> process starts


class TxnSummary(_Model):
    """The transactions workload's figures."""

    committed: int
    aborted: int
    aborted_on_purpose: int
    unknown: int
    output_records: int  # visible to read_committed
    transformer_restarts: int
    committed_by_client: dict[str, int] = Field(default_factory=dict)  # client -> committed
