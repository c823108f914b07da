"""Follower fetching (KIP-392): the replica selector's rules (dataplane/broker/replica_selector.py)
and BrokerService's fetch on a real replica manager, without processes. A consumer that sends
its rack is answered a preferred read replica by a leader under ``replica.selector.class``
(an ISR follower of its rack holding the offset, no records, no long poll), and a follower
serves such a consumer up to its own high watermark; a consumer that sends no rack is served
by the leader only, as before."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataplane.broker.metrics import NodeMetrics
from dataplane.broker.partition import IsrChange
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from dataplane.broker.replica_selector import (
    RACK_AWARE_REPLICA_SELECTOR,
    ReplicaView,
    preferred_read_replica,
    rack_aware_select,
)
from dataplane.broker.service import BrokerServicer
from dataplane.server.config import NodeConfig
from metadata_quorum.image import (
    BrokerRegistration,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
)
from metadata_quorum.records import Endpoint
from protos import broker_pb2 as pb
from raftlog.config import ConfigError
from raftlog.errors import ErrorCode
from raftlog.records import encode_batch
from tests.dataplane.broker.test_replication_core import Clock

TOPIC = "events"
TOPIC_ID = uuid.UUID(int=392)
RACKS = {1: "rack-a", 2: "rack-b", 3: "rack-c"}
LEADER = ReplicaView(1, "rack-a", 100, 0)


# -- the selector ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("client_rack", "candidates", "chosen"),
    [
        ("", [ReplicaView(2, "rack-b", 100, 0)], 1),  # no client rack: the leader
        ("rack-a", [ReplicaView(2, "rack-a", 100, 0)], 1),  # the leader is in the rack
        ("rack-z", [ReplicaView(2, "rack-b", 100, 0)], 1),  # nobody in the rack
        ("rack-b", [ReplicaView(2, "rack-b", 100, 0)], 2),
        # the most caught up: log end offset, then the shortest time since caught up, then id
        ("rack-b", [ReplicaView(2, "rack-b", 90, 0), ReplicaView(3, "rack-b", 95, 500)], 3),
        ("rack-b", [ReplicaView(2, "rack-b", 95, 10), ReplicaView(3, "rack-b", 95, 500)], 2),
        ("rack-b", [ReplicaView(2, "rack-b", 95, 10), ReplicaView(3, "rack-b", 95, 10)], 3),
        ("rack-b", [ReplicaView(2, None, 100, 0)], 1),  # a broker without a rack
    ],
)
def test_rack_aware_selection_follows_kafka(
    client_rack: str, candidates: list[ReplicaView], chosen: int
) -> None:
    assert rack_aware_select(client_rack, LEADER, candidates).broker_id == chosen


def test_no_selector_means_the_leader_serves() -> None:
    follower = [ReplicaView(2, "rack-b", 100, 0)]
    assert preferred_read_replica(None, "rack-b", LEADER, follower) is None
    assert preferred_read_replica(RACK_AWARE_REPLICA_SELECTOR, "rack-b", LEADER, follower) == 2
    assert preferred_read_replica(RACK_AWARE_REPLICA_SELECTOR, "rack-a", LEADER, follower) is None


# -- the broker ----------------------------------------------------------------------------------
def image(isr: tuple[int, ...] = (1, 2, 3), fenced: frozenset[int] = frozenset()) -> MetadataImage:
    """Broker 1 leads partition 0 (replicas 1, 2, 3) and follows broker 2 on partition 1."""
    partitions = {
        0: PartitionRegistration((1, 2, 3), isr, 1, 0, 3 - len(isr)),
        1: PartitionRegistration((2, 1), (2, 1), 2, 0, 0),
    }
    brokers = {
        b: BrokerRegistration(
            b,
            f"inc-{b}",
            10,
            (Endpoint("KAFKA", f"127.0.0.{b}", 9092),),
            rack,
            fenced=b in fenced,
        )
        for b, rack in RACKS.items()
    }
    return MetadataImage(
        offset=10, brokers=brokers,
        topics={TOPIC_ID: TopicImage(TOPIC, TOPIC_ID, partitions)}, topic_ids={TOPIC: TOPIC_ID},
    )  # fmt: skip


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[ReplicaManager]:
    def alter(change: IsrChange) -> None:
        pass

    def failed(directory: Path, error: OSError) -> None:
        raise AssertionError(f"no log dir failure expected: {directory}: {error}")

    manager = ReplicaManager(1, tmp_path, ReplicaManagerConfig(), Clock(), alter, failed)
    manager.apply_image(image(), caught_up=True)
    yield manager
    manager.close()


def servicer(replicas: ReplicaManager, selector: str | None) -> BrokerServicer:
    return BrokerServicer(
        1, replicas, NodeMetrics(), "test", [], lambda c: None, lambda: 0,
        replica_selector=selector,
    )  # fmt: skip


def batch(*values: bytes, base_offset: int = 0) -> bytes:
    return encode_batch(
        [(None, v, 1_000_000, ()) for v in values], base_offset=base_offset,
        partition_leader_epoch=0,
    )  # fmt: skip


def fill_leader(service: BrokerServicer, follower_offsets: dict[int, int]) -> None:
    """Three records on partition 0; each follower then fetches from its offset (which tells
    the leader its log end offset)."""
    request = pb.ProduceRequest(acks=1, timeout_ms=5_000, topics=[pb.ProduceTopic(
        name=TOPIC, partitions=[pb.ProducePartition(partition=0, records=batch(b"x", b"y", b"z"))],
    )])  # fmt: skip
    assert service.Produce(request, None).topics[0].partitions[0].error_code == 0
    for broker_id, offset in follower_offsets.items():
        answer = service.Fetch(fetch_request(0, offset, replica_id=broker_id), None)
        assert answer.topics[0].partitions[0].error_code == 0


def fetch_request(
    partition: int, offset: int, *, rack: str | None = None, replica_id: int = -1,
    max_wait_ms: int = 0,
) -> pb.FetchRequest:  # fmt: skip
    request = pb.FetchRequest(
        replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
        topics=[pb.FetchTopic(name=TOPIC, partitions=[pb.FetchPartition(
            partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20,
            current_leader_epoch=-1, last_fetched_epoch=-1)])],
    )  # fmt: skip
    if rack is not None:
        request.rack_id = rack
    return request


def consume(
    service: BrokerServicer, partition: int, offset: int, rack: str | None, max_wait_ms: int = 0
) -> pb.FetchPartitionResponse:
    request = fetch_request(partition, offset, rack=rack, max_wait_ms=max_wait_ms)
    return service.fetch(request, "KAFKA").message().topics[0].partitions[0]


def test_a_leader_sends_a_consumer_of_another_rack_to_its_follower(
    replicas: ReplicaManager,
) -> None:
    service = servicer(replicas, RACK_AWARE_REPLICA_SELECTOR)
    fill_leader(service, {2: 3, 3: 3})
    started = time.monotonic()
    answer = consume(service, 0, 0, "rack-b", max_wait_ms=5_000)
    assert time.monotonic() - started < 2.5  # answered at once, no long poll
    assert answer.HasField("preferred_read_replica") and answer.preferred_read_replica == 2
    assert answer.records == b"" and answer.error_code == 0
    assert answer.high_watermark == 3 and answer.log_start_offset == 0


@pytest.mark.parametrize("rack", [None, "", "rack-a", "rack-z"])
def test_the_leader_serves_when_no_follower_is_preferred(
    replicas: ReplicaManager, rack: str | None
) -> None:
    service = servicer(replicas, RACK_AWARE_REPLICA_SELECTOR)
    fill_leader(service, {2: 3, 3: 3})
    answer = consume(service, 0, 0, rack)
    assert not answer.HasField("preferred_read_replica")
    assert answer.records and answer.high_watermark == 3


def test_without_a_selector_the_leader_always_serves(replicas: ReplicaManager) -> None:
    service = servicer(replicas, None)
    fill_leader(service, {2: 3, 3: 3})
    answer = consume(service, 0, 0, "rack-b")
    assert not answer.HasField("preferred_read_replica") and answer.records


def test_a_follower_behind_the_offset_or_out_of_the_isr_or_fenced_is_not_preferred(
    replicas: ReplicaManager,
) -> None:
    service = servicer(replicas, RACK_AWARE_REPLICA_SELECTOR)
    fill_leader(service, {2: 1, 3: 3})
    assert consume(service, 0, 1, "rack-b").preferred_read_replica == 2  # it holds offset 1
    assert not consume(service, 0, 2, "rack-b").HasField("preferred_read_replica")
    assert consume(service, 0, 2, "rack-c").preferred_read_replica == 3
    replicas.apply_image(image(fenced=frozenset({3})), caught_up=True)
    assert not consume(service, 0, 2, "rack-c").HasField("preferred_read_replica")
    replicas.apply_image(image(isr=(1, 2)), caught_up=True)
    assert not consume(service, 0, 2, "rack-c").HasField("preferred_read_replica")


def test_a_follower_serves_a_consumer_that_sent_its_rack_up_to_its_high_watermark(
    replicas: ReplicaManager,
) -> None:
    service = servicer(replicas, RACK_AWARE_REPLICA_SELECTOR)
    follower = replicas.get(TOPIC, 1)
    follower.append_as_follower(batch(b"a", b"b"), 0, 0)
    follower.append_as_follower(batch(b"c", base_offset=2), 2, 0)  # the leader's HW: 2
    answer = consume(service, 1, 0, "")
    assert answer.error_code == 0 and answer.high_watermark == 2
    assert answer.records == batch(b"a", b"b")  # the batch below the high watermark only
    assert consume(service, 1, 2, "").records == b""  # at its high watermark: nothing yet
    # a consumer without client metadata (Fetch before v11, the gRPC client) is refused
    assert consume(service, 1, 0, None).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code


def test_a_follower_checks_the_consumers_leader_epoch(replicas: ReplicaManager) -> None:
    service = servicer(replicas, RACK_AWARE_REPLICA_SELECTOR)
    request = fetch_request(1, 0, rack="")
    request.topics[0].partitions[0].current_leader_epoch = 5
    answer = service.fetch(request, "KAFKA").message().topics[0].partitions[0]
    assert answer.error_code == ErrorCode.UNKNOWN_LEADER_EPOCH.code


# -- the configuration -----------------------------------------------------------------------------
def test_replica_selector_and_session_slots_are_node_configs() -> None:
    base = {
        "node.id": 1, "process.roles": "broker", "controller.quorum.voters": "1@127.0.0.11:9093",
        "listeners": "BROKER://127.0.0.11:9092", "log.dirs": "/tmp/node-1",
    }  # fmt: skip
    default = NodeConfig.parse(base)
    assert default.replica_selector_class is None
    assert default.max_incremental_fetch_session_cache_slots == 1000
    chosen = NodeConfig.parse({**base, "replica.selector.class": RACK_AWARE_REPLICA_SELECTOR})
    assert chosen.replica_selector_class == RACK_AWARE_REPLICA_SELECTOR
    with pytest.raises(ConfigError, match=re.escape("replica.selector.class")):
        NodeConfig.parse({**base, "replica.selector.class": "com.example.NearestSelector"})
    with pytest.raises(ConfigError, match=re.escape("max.incremental.fetch.session.cache.slots")):
        NodeConfig.parse({**base, "max.incremental.fetch.session.cache.slots": -1})
