"""Fetch (API 1) on the KAFKA listener: fetch sessions (KIP-227) around the broker's fetch.

Each request gets its fetch session context from the listener's `FetchSessionCache`
(dataplane/broker/fetch_sessions.py, the pure core): the partitions to read are the request's
(a full or sessionless fetch) or the session's (an incremental one). They are read by the same
``BrokerServicer.fetch`` the gRPC door calls (long poll, ``min_bytes``, authorization, isolation
level), and the context decides which partitions the answer names and with which session id.
A session error (unknown session, wrong epoch) is answered alone, nothing read.

Fetch v11+ carries the consumer's rack (``client.rack``, KIP-392): it goes to the broker as
``rack_id``, so a follower may serve this consumer and a leader under ``replica.selector.class``
may answer a ``preferred_read_replica`` instead of records.

Followers replicate over gRPC: a Fetch here with a replica id closes the connection.

The answer carries each partition's records as the log read them (bytes, or views of them):
`kc.encode_response_parts` keeps them by reference and the connection hands them to one
``sendmsg``, so the listener copies no record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataplane.broker.fetch_sessions import (
    NO_PREFERRED_REPLICA,
    FetchContext,
    FetchSessionCache,
    PartitionKey,
    PartitionOutcome,
    PartitionRequest,
    SessionErrorContext,
    SessionlessContext,
)
from dataplane.broker.follower_sessions import CONTEXTS, outcome_of
from dataplane.broker.metrics import FetchSessionGauge
from dataplane.broker.service import BrokerServicer
from dataplane.kafka import codec as kc
from protos import broker_pb2 as pb
from protos.wire import FetchAnswer, each_partition

RACK_ID_VERSION = 11  # Fetch v11 added rack_id and preferred_read_replica (KIP-392)


class KafkaFetch:
    """The Fetch handler of one listener, with its fetch session cache."""

    def __init__(
        self,
        servicer: BrokerServicer,
        listener: str,
        cache_slots: int,
        clock_ms: Callable[[], int],
    ) -> None:
        self.servicer = servicer
        self.listener = listener
        self.sessions = FetchSessionCache(cache_slots)
        self._clock_ms = clock_ms
        counter = servicer.metrics.kafka_fetches
        self._counted = {kind: counter.labels(kind) for kind in CONTEXTS}

    def gauge(self) -> FetchSessionGauge:
        cache = self.sessions
        return FetchSessionGauge(len(cache), cache.total_partitions, cache.evictions)

    def handle(self, request: kc.Request) -> kc.Data:
        body = request.body
        if kc.field(body, "replica_id", -1) >= 0:
            raise kc.FrameError("followers fetch over gRPC, not the KAFKA listener")
        now_ms = self._clock_ms()
        context = self.sessions.new_context(
            kc.field(body, "session_id", 0), kc.field(body, "session_epoch", -1),
            _wanted(body), _forgotten(body), now_ms,
        )  # fmt: skip
        self._counted[context.kind].inc()
        if isinstance(context, SessionErrorContext):
            return _answer(context.error.code, 0, [])
        fetched = self.servicer.fetch(self._broker_request(request, context), self.listener)
        if isinstance(context, SessionlessContext):
            return _answer(0, 0, _topics(fetched, None))
        answer = context.respond(_outcomes(fetched), now_ms)
        return _answer(answer.error.code, answer.session_id, _topics(fetched, answer.included))

    def _broker_request(self, request: kc.Request, context: FetchContext) -> pb.FetchRequest:
        """The BrokerService request of the context's partitions (consecutive partitions of a
        topic are one topic entry, as Kafka groups its response)."""
        body = request.body
        fetch = pb.FetchRequest(
            replica_id=-1,
            max_wait_ms=kc.millis(body.max_wait),
            min_bytes=body.min_bytes,
            max_bytes=kc.field(body, "max_bytes", kc.MAX_FRAME_BYTES),
            isolation_level=int(kc.field(body, "isolation_level", 0)),
        )
        if request.api_version >= RACK_ID_VERSION:
            fetch.rack_id = kc.field(body, "rack_id") or ""
        topic: Any = None
        for (name, index), wanted in context.partitions:
            if topic is None or topic.name != name:
                topic = fetch.topics.add(name=name)
            topic.partitions.add(
                partition=index, fetch_offset=wanted.fetch_offset,
                current_leader_epoch=wanted.current_leader_epoch,
                partition_max_bytes=wanted.max_bytes,
            )  # fmt: skip
        return fetch


def _wanted(body: Any) -> list[tuple[PartitionKey, PartitionRequest]]:
    return [
        (
            (topic.topic, p.partition),
            PartitionRequest(
                p.fetch_offset,
                kc.field(p, "current_leader_epoch", -1),
                kc.field(p, "log_start_offset", -1),
                p.partition_max_bytes,
            ),
        )
        for topic in body.topics
        for p in topic.partitions
    ]


def _forgotten(body: Any) -> list[PartitionKey]:
    return [
        (topic.topic, index)
        for topic in kc.field(body, "forgotten_topics_data", ()) or ()
        for index in topic.partitions
    ]


def _outcomes(fetched: FetchAnswer) -> list[PartitionOutcome]:
    return [outcome_of(p, r) for _, p, r in each_partition(fetched.response, fetched.records)]


def _preferred(p: pb.FetchPartitionResponse) -> int:
    if p.HasField("preferred_read_replica"):
        return p.preferred_read_replica
    return NO_PREFERRED_REPLICA


def _topics(fetched: FetchAnswer, included: list[bool] | None) -> list[kc.Data]:
    """The answer's topics: every partition read, or those ``included`` says (a topic with
    none left is left out)."""
    topics: list[kc.Data] = []
    position = 0
    each = iter(fetched.records)
    for topic in fetched.response.topics:
        partitions = []
        for p in topic.partitions:
            records = next(each)
            if included is None or included[position]:
                partitions.append(_partition(p, records))
            position += 1
        if partitions:
            topics.append({"topic": topic.name, "partitions": partitions})
    return topics


def _partition(p: pb.FetchPartitionResponse, records: bytes | memoryview) -> kc.Data:
    return {
        "partition_index": p.partition, "error_code": p.error_code,
        "high_watermark": p.high_watermark,
        "last_stable_offset": p.last_stable_offset,
        "log_start_offset": p.log_start_offset,
        "aborted_transactions": [
            {"producer_id": a.producer_id, "first_offset": a.first_offset}
            for a in p.aborted_transactions
        ],
        # the stored batches as the log read them, not copied: the frame holds them by
        # reference and the socket takes them from there (kc.encode_response_parts)
        "preferred_read_replica": _preferred(p), "records": records,
    }  # fmt: skip


def _answer(error_code: int, session_id: int, topics: list[kc.Data]) -> kc.Data:
    return {
        "throttle_time": 0, "error_code": error_code, "session_id": session_id,
        "responses": topics,
    }  # fmt: skip
