"""An acks=all Produce on the KAFKA listener is appended in order and waits for its ISR beside
the connection's next requests, which are read and served meanwhile; the answers still leave in
request order (dataplane/kafka/listener.py, `_InOrder`). Kafka keeps the connection muted through
the wait, so one connection carried one produce per replication round: librdkafka, sending a
request per linger.ms, fell behind at 300 records/s (end-to-end p50 833 ms, 16 ms since: the
e2e benchmark's note in bench/performance_notes.md).

In process (tests/fuzz/inprocess.py): one broker, the partition's replication held by a gate
on the first request's wait, so the test sees what was appended while it waited.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from dataplane.broker import service
from dataplane.kafka import codec as kc
from dataplane.tools.local_cluster import wait_for
from raftlog.records import encode_batch
from tests.dataplane.kafka.test_listener_failures import (
    DEADLINE_S,
    METADATA,
    answer,
    request,
    served,
)
from tests.fuzz.inprocess import TOPIC, InProcessBroker


@pytest.fixture
def broker() -> Iterator[InProcessBroker]:
    broker = InProcessBroker()
    yield broker
    broker.close()


def produce(records: int, correlation_id: int) -> bytes:
    batch = encode_batch([(None, os.urandom(64), 1_700_000_000_000, ()) for _ in range(records)])
    body = {"transactional_id": None, "acks": -1, "timeout": 30_000, "topic_data": [
        {"name": TOPIC, "partition_data": [{"index": 0, "records": batch}]},
    ]}  # fmt: skip
    return request(kc.API_PRODUCE, 9, body, correlation_id=correlation_id)


def hold_replication(
    monkeypatch: pytest.MonkeyPatch, first_only: bool = False
) -> tuple[threading.Event, list[service.PendingProduce]]:
    """Produces' waits for their ISR (`PendingProduce.finish`) held until the gate returned
    opens: every one, or only the first; and the waits, as they come."""
    gate = threading.Event()
    finish = service.PendingProduce.finish
    waits: list[service.PendingProduce] = []

    def held(pending: service.PendingProduce) -> object:
        waits.append(pending)
        if not first_only or len(waits) == 1:
            assert gate.wait(DEADLINE_S), "the test never opened the gate"
        return finish(pending)

    monkeypatch.setattr(service.PendingProduce, "finish", held)
    return gate, waits


def test_requests_behind_a_replicating_produce_are_served_and_answered_in_order(
    broker: InProcessBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, waits = hold_replication(monkeypatch, first_only=True)
    partition = broker.servicer.replicas.get(TOPIC, 0)
    start = partition.log.log_end_offset
    client, thread = served(broker.listener)
    try:
        client.sendall(produce(3, 1) + produce(4, 2))
        client.sendall(request(kc.API_METADATA, 9, METADATA, correlation_id=3))
        # the second produce is appended while the first waits for its ISR
        wait_for("the second produce's append", lambda: partition.log.log_end_offset == start + 7,
                 DEADLINE_S)  # fmt: skip
        assert len(waits) >= 1 and broker.listener.requests.in_flight >= 2
        opened = time.monotonic()
        gate.set()
        first, second = answer(client, kc.API_PRODUCE, 9), answer(client, kc.API_PRODUCE, 9)
        metadata = answer(client, kc.API_METADATA, 9)
    finally:
        gate.set()
        client.close()
        thread.join(DEADLINE_S)
    offsets = [r.responses[0].partition_responses[0] for r in (first, second)]
    assert [(p.error_code.value, p.base_offset) for p in offsets] == [(0, start), (0, start + 3)]
    assert TOPIC in [t.name for t in metadata.topics]
    # the second request's 30 s timeout runs from its append, not from the end of the first wait
    assert len(waits) == 2 and waits[1].deadline < opened + 30.0
    wait_for("the permits back", lambda: broker.listener.requests.in_flight == 0, DEADLINE_S)


def test_a_closed_connection_gives_back_the_permits_of_answers_it_never_got(
    broker: InProcessBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, _ = hold_replication(monkeypatch)
    client, thread = served(broker.listener)
    client.sendall(produce(1, 1) + produce(1, 2))
    wait_for("both produces read", lambda: broker.listener.requests.in_flight == 2, DEADLINE_S)
    client.close()
    thread.join(DEADLINE_S)
    assert not thread.is_alive()
    gate.set()
    wait_for("the permits back", lambda: broker.listener.requests.in_flight == 0, DEADLINE_S)


def test_a_connection_closed_for_its_next_request_still_answers_the_produce_before_it(
    broker: InProcessBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that closes the connection (here an API the listener lacks; also a SASL
    session past connections.max.reauth.ms, from a client that does not re-authenticate, such
    as kcat's librdkafka 2.0.2) read while a Produce replicates: the Produce's answer still goes
    out first. Lost, a producer without idempotence (kcat's default) would send the appended
    batch again, and it would be written twice."""
    gate, _ = hold_replication(monkeypatch)
    partition = broker.servicer.replicas.get(TOPIC, 0)
    start = partition.log.log_end_offset
    client, thread = served(broker.listener)
    try:
        client.sendall(produce(2, 1))
        client.sendall(request(kc.API_CREATE_TOPICS, 7, {"topics": [], "timeout": 1000}))
        wait_for("the produce appended", lambda: partition.log.log_end_offset == start + 2,
                 DEADLINE_S)  # fmt: skip
        wait_for("the closing request read", lambda: broker.listener.requests.in_flight == 1,
                 DEADLINE_S)  # fmt: skip
        gate.set()
        produced = answer(client, kc.API_PRODUCE, 9).responses[0].partition_responses[0]
        assert (produced.error_code.value, produced.base_offset) == (0, start)
        assert client.recv(1) == b""  # then the connection closes, CreateTopics unanswered
        thread.join(DEADLINE_S)
        assert not thread.is_alive()
    finally:
        gate.set()
        client.close()
    wait_for("the permits back", lambda: broker.listener.requests.in_flight == 0, DEADLINE_S)
