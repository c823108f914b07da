"""The admin client's transaction calls (Kafka's ``Admin.describeTransactions``,
``listTransactions``, ``describeProducers``), over the brokers.

DescribeTransactions goes to each transactional id's coordinator (FindCoordinator key_type
1), ListTransactions to every broker (each lists the ids it coordinates), DescribeProducers to
each partition's leader (following a moved leader within the deadline).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import grpc

from dataplane.client._cluster import Cluster, rpc_error
from dataplane.client._group import TRANSACTION_KEY, GroupClient
from dataplane.client._types import TopicPartition
from protos import broker_pb2 as pb
from protos import transaction_pb2 as tpb
from raftlog.errors import ErrorCode, KafkaError

__all__ = [
    "ProducerState",
    "TransactionDescription",
    "TransactionListing",
    "describe_producers",
    "describe_transactions",
    "list_transactions",
]

LEADER_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.REQUEST_TIMED_OUT,
    }
)


@dataclass(frozen=True)
class TransactionDescription:
    """Kafka's ``TransactionDescription``: the coordinator's view of a transactional id."""

    transactional_id: str
    coordinator_id: int
    state: str  # Kafka's names: Empty, Ongoing, PrepareCommit, CompleteCommit, ...
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_ms: int  # -1 while no transaction is open
    topic_partitions: frozenset[TopicPartition]


class TransactionListing(NamedTuple):
    transactional_id: str
    producer_id: int
    state: str
    coordinator_id: int  # the broker that listed it


@dataclass(frozen=True)
class ProducerState:
    """Kafka's ``ProducerState``: a producer a partition leader remembers."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int  # -1: unknown
    current_transaction_start_offset: int  # -1: no open transaction


def _node_id(cluster: Cluster, address: str) -> int:
    for broker in cluster.snapshot().brokers.values():
        if broker.address == address:
            return broker.node_id
    return -1


def describe_transactions(
    cluster: Cluster, ids: Iterable[str], closed: threading.Event, timeout_s: float
) -> dict[str, TransactionDescription]:
    """Each id's state at its coordinator; raises the first item's error
    (TRANSACTIONAL_ID_NOT_FOUND for an unknown id)."""
    cluster.refresh()
    result: dict[str, TransactionDescription] = {}
    for transactional_id in ids:
        client = GroupClient(
            cluster, transactional_id, closed, time.monotonic, key_type=TRANSACTION_KEY
        )
        request = tpb.DescribeTransactionsRequest(transactional_ids=[transactional_id])
        response = client.call(
            "DescribeTransactions",
            request,
            timeout_s,
            lambda r: r.transactions[0],
            stub_of=cluster.transaction_stub,
        )
        found = response.transactions[0]
        if found.error_code:
            raise KafkaError(
                ErrorCode.from_code(found.error_code),
                found.error_message or f"transactional id {transactional_id!r}",
            )
        result[transactional_id] = TransactionDescription(
            transactional_id=transactional_id,
            coordinator_id=_node_id(cluster, client.coordinator(timeout_s)),
            state=found.state,
            producer_id=found.producer_id,
            producer_epoch=found.producer_epoch,
            transaction_timeout_ms=found.transaction_timeout_ms,
            transaction_start_ms=found.transaction_start_ms,
            topic_partitions=frozenset(
                TopicPartition(t.topic, p) for t in found.topics for p in t.partitions
            ),
        )
    return result


def list_transactions(
    cluster: Cluster,
    states: Iterable[str],
    producer_ids: Iterable[int],
    duration_ms: int,
    timeout_s: float,
) -> list[TransactionListing]:
    """Every transactional id the brokers coordinate (each asked in turn), filtered by state
    names, producer ids and (``duration_ms`` > 0) how long the transaction has been open."""
    snapshot = cluster.refresh()
    request = tpb.ListTransactionsRequest(
        state_filters=list(states),
        producer_id_filters=list(producer_ids),
        duration_filter_ms=duration_ms,
    )
    found: dict[str, TransactionListing] = {}
    for broker in snapshot.brokers.values():
        try:
            response = cluster.transaction_stub(broker).ListTransactions(request, timeout=timeout_s)
        except grpc.RpcError as error:
            raise rpc_error(error, f"ListTransactions to broker {broker.node_id}") from error
        if response.error_code:
            code = ErrorCode.from_code(response.error_code)
            raise KafkaError(code, f"ListTransactions to broker {broker.node_id}")
        for listed in response.transactions:
            found[listed.transactional_id] = TransactionListing(
                listed.transactional_id, listed.producer_id, listed.state, broker.node_id
            )
    return [found[t] for t in sorted(found)]


def describe_producers(
    cluster: Cluster,
    partitions: Iterable[TopicPartition],
    closed: threading.Event,
    timeout_s: float,
) -> dict[TopicPartition, tuple[ProducerState, ...]]:
    """The active producers of each partition, from its leader; raises the first
    non-retriable partition error (UNKNOWN_TOPIC_OR_PARTITION once the deadline passed)."""
    pending = sorted(set(partitions))
    deadline = time.monotonic() + timeout_s
    cluster.refresh({tp.topic for tp in pending})
    result: dict[TopicPartition, tuple[ProducerState, ...]] = {}
    last = KafkaError(ErrorCode.REQUEST_TIMED_OUT, "DescribeProducers did not complete")
    while pending:
        snapshot = cluster.snapshot()
        by_leader: dict[str, list[TopicPartition]] = {}
        for tp in pending:
            leader = snapshot.leader(tp.topic, tp.partition)
            if leader is None:
                last = KafkaError(ErrorCode.LEADER_NOT_AVAILABLE, f"{tp}: no leader known")
                continue
            by_leader.setdefault(leader.address, []).append(tp)
        for address, tps in by_leader.items():
            for tp, outcome in _describe_at(cluster, address, tps, timeout_s).items():
                if isinstance(outcome, KafkaError):
                    if outcome.error not in LEADER_ERRORS:
                        raise outcome
                    last = outcome
                else:
                    result[tp] = outcome
        pending = [tp for tp in pending if tp not in result]
        if not pending:
            break
        if time.monotonic() >= deadline or closed.is_set():
            raise last
        closed.wait(min(cluster.backoff_s(), max(0.0, deadline - time.monotonic())))
        cluster.refresh()
    return result


def _describe_at(
    cluster: Cluster, address: str, partitions: list[TopicPartition], timeout_s: float
) -> dict[TopicPartition, tuple[ProducerState, ...] | KafkaError]:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    request = pb.DescribeProducersRequest(
        topics=[pb.DescribeProducersTopic(name=t, partitions=ps) for t, ps in by_topic.items()]
    )
    try:
        response = cluster.stub(address).DescribeProducers(request, timeout=timeout_s)
    except grpc.RpcError as error:
        failure = rpc_error(error, f"DescribeProducers to {address}")
        return dict.fromkeys(partitions, failure)
    outcomes: dict[TopicPartition, tuple[ProducerState, ...] | KafkaError] = {}
    for topic in response.topics:
        for answer in topic.partitions:
            tp = TopicPartition(topic.name, answer.partition)
            if answer.error_code:
                code = ErrorCode.from_code(answer.error_code)
                outcomes[tp] = KafkaError(code, answer.error_message or str(tp))
                continue
            outcomes[tp] = tuple(
                ProducerState(
                    p.producer_id, p.producer_epoch, p.last_sequence, p.last_timestamp,
                    p.coordinator_epoch, p.current_txn_start_offset,
                )
                for p in answer.active_producers
            )  # fmt: skip
    return outcomes
