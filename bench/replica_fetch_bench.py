"""What an acks=all replication round costs when one partition of many changed, with the
followers' fetch sessions (KIP-227, dataplane/broker/follower_sessions.py) and without.

``python -m bench.replica_fetch_bench [--partitions 1000 3333] [--rounds 200]``

A leader (broker 1) and a follower (broker 2) share N partitions, each broker's replica
manager in this process with its logs on tmpfs (``/dev/shm``: the figure is the CPU of the fetch
path, not the disk's). Each round appends one record to one partition (the next one, in turn)
on the leader, then runs the follower's fetcher twice as its thread would (its own request
building and answer handling, the leader's BrokerService.fetch in between, in process instead
of over gRPC): the fetch that brings the record and the one that reports the follower's new
log end, which moves the leader's high watermark and so completes an acks=all produce. The
figure is that pair's CPU time (the thread's: it holds on a machine other processes share),
best and median over ``--rounds``, for ``max.incremental.fetch.session.cache.slots`` 1000
(sessions) and 0 (every fetch full, as before sessions). 1000 is the shape of a produce to
1,000 partitions of a 3-broker cluster, 3333 of one broker's share of 10,000 partitions at RF 3.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dataplane.broker.fetcher import FetcherConfig, FetcherThread
from dataplane.broker.metrics import NodeMetrics
from dataplane.broker.partition import IsrChange, Partition
from dataplane.broker.replica_manager import ReplicaManager, ReplicaManagerConfig
from dataplane.broker.service import BrokerServicer
from metadata_quorum.image import MetadataImage, PartitionRegistration, TopicImage
from protos import broker_pb2 as pb
from raftlog.records import encode_batch

TOPIC = "replicated"
TOPIC_ID = uuid.UUID(int=227)
SHM = Path("/dev/shm")


def _clock_ms() -> int:
    return int(time.monotonic() * 1000)


def _manager(root: Path, broker_id: int) -> ReplicaManager:
    def alter(change: IsrChange) -> None:
        pass

    def failed(directory: Path, error: OSError) -> None:
        raise SystemExit(f"log dir failure: {directory}: {error}")

    return ReplicaManager(
        broker_id, root / f"b{broker_id}", ReplicaManagerConfig(), _clock_ms, alter, failed
    )


def measure(partitions: int, rounds: int) -> list[dict[str, Any]]:
    """The figures with sessions and without, on the same two brokers' replicas."""
    image = MetadataImage(
        offset=10,
        topics={TOPIC_ID: TopicImage(TOPIC, TOPIC_ID, {
            p: PartitionRegistration((1, 2), (1, 2), 1, 0, 0) for p in range(partitions)
        })},
        topic_ids={TOPIC: TOPIC_ID},
    )  # fmt: skip
    root = Path(tempfile.mkdtemp(dir=SHM if SHM.is_dir() else None, prefix="replica-fetch-"))
    leader, follower = _manager(root, 1), _manager(root, 2)
    try:
        leader.apply_image(image, caught_up=True)
        followed = follower.apply_image(image, caught_up=True)[1]
        return [
            _rounds(leader, followed, rounds, slots, n * rounds)
            for n, slots in enumerate((1000, 0))
        ]
    finally:
        leader.close()
        follower.close()
        shutil.rmtree(root)


def _rounds(
    leader: ReplicaManager, followed: list[Partition], rounds: int, slots: int, first: int
) -> dict[str, Any]:
    partitions = len(followed)
    service = BrokerServicer(
        1, leader, NodeMetrics(), "bench", [], lambda c: None, lambda: 0,
        fetch_session_cache_slots=slots,
    )  # fmt: skip
    fetcher = FetcherThread(
        2, 1, lambda b: None, lambda: 10, FetcherConfig(replica_fetch_wait_max_ms=0), _clock_ms
    )
    fetcher.set_partitions(followed)

    def fetch_round() -> None:
        ready, _, _ = fetcher._ready_partitions()
        request, sent = fetcher._request(ready)
        answer = service.fetch(request)
        if fetcher.session.answered(request, answer.response):
            fetcher._handle(answer, sent)

    value = b"v" * 1000
    for _ in range(3):
        fetch_round()
    cpu_ms = []
    for n in range(first, first + rounds):
        records = encode_batch([(None, value, 1_700_000_000_000, ())], partition_leader_epoch=0)
        produce = pb.ProduceRequest(acks=1, timeout_ms=5_000, topics=[pb.ProduceTopic(
            name=TOPIC, partitions=[pb.ProducePartition(partition=n % partitions, records=records)],
        )])  # fmt: skip
        service.Produce(produce, None)
        started = time.thread_time()
        fetch_round()
        fetch_round()
        cpu_ms.append((time.thread_time() - started) * 1000)
    moved = leader.get(TOPIC, (first + rounds - 1) % partitions)
    assert moved.high_watermark == moved.log.log_end_offset, "the last round did not commit"
    return {
        "partitions": partitions,
        "sessions": slots > 0,
        "rounds": rounds,
        "cpu_ms_best": round(min(cpu_ms), 3),
        "cpu_ms_median": round(statistics.median(cpu_ms), 3),
        "full_fetches": fetcher.session.full_fetches,
        "incremental_fetches": fetcher.session.incremental_fetches,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[1000, 3333])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args(argv)
    results = []
    for partitions in args.partitions:
        for result in measure(partitions, args.rounds):
            results.append(result)
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
