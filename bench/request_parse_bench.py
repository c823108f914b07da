"""What checking a request's lengths before kio reads it costs (dataplane/kafka/length_walker.py).

``python -m bench.request_parse_bench [--rounds N]``

Every request the KAFKA listener reads is walked once before kio's native reader sees it (issue
30: kio reserves whatever an array claims). This times, per request, the walk alone, kio's
readers alone, and ``codec.parse_request`` (header, walk, kio's read, null checks) before the
walker existed (``before``: the walk replaced by nothing) and with it (``after``), on the
requests of the hot path, encoded by kio's writer as a client sends them: Produce v9 and v11
with one partition of 1 KiB and of 1 MiB of records, Fetch v11 (legacy arrays) and v12
(compact) for 1 and 50 partitions. The best of ``--rounds`` timings, in µs of the thread's CPU
time (the figures hold on a machine other processes share).
"""

from __future__ import annotations

import argparse
import io
import time
import timeit
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

from kio.serial import entity_reader, entity_writer

from dataplane.kafka import codec as kc
from dataplane.kafka.length_walker import request_walker
from raftlog.records import encode_batch


def request_frame(api_key: int, version: int, body: kc.Data) -> bytes:
    """A request frame (without its size) as a client encodes it."""
    schema = kc.request_schema(api_key, version)
    header_schema = schema.__header_schema__
    header = kc.to_entity(header_schema, {
        "request_api_key": api_key, "request_api_version": version, "correlation_id": 7,
        "client_id": "bench",
    })  # fmt: skip
    buffer = io.BytesIO()
    entity_writer(header_schema)(buffer, header)
    entity_writer(schema)(buffer, kc.to_entity(schema, body))
    return buffer.getvalue()


def produce(version: int, record_bytes: int) -> bytes:
    value = b"v" * 1000
    batch = encode_batch([(None, value, 1_700_000_000_000, ())] * max(record_bytes // 1000, 1))
    return request_frame(kc.API_PRODUCE, version, {
        "transactional_id": None, "acks": -1, "timeout": 30_000,
        "topic_data": [{"name": "bench", "partition_data": [{"index": 0, "records": batch}]}],
    })  # fmt: skip


def fetch(version: int, partitions: int) -> bytes:
    return request_frame(kc.API_FETCH, version, {
        "replica_id": -1, "max_wait": 500, "min_bytes": 1, "max_bytes": 52_428_800,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
        "topics": [{"topic": "bench", "partitions": [
            {"partition": p, "current_leader_epoch": 0, "fetch_offset": 1000 * p,
             "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1_048_576}
            for p in range(partitions)
        ]}],
        "forgotten_topics_data": [],
    })  # fmt: skip


REQUESTS: dict[str, Callable[[], bytes]] = {
    "Produce v9, 1 KiB": lambda: produce(9, 1024),
    "Produce v11, 1 KiB": lambda: produce(11, 1024),
    "Produce v9, 1 MiB": lambda: produce(9, 1 << 20),
    "Produce v11, 1 MiB": lambda: produce(11, 1 << 20),
    "Fetch v11, 1 partition": lambda: fetch(11, 1),
    "Fetch v12, 1 partition": lambda: fetch(12, 1),
    "Fetch v11, 50 partitions": lambda: fetch(11, 50),
    "Fetch v12, 50 partitions": lambda: fetch(12, 50),
}


def _best_us(call: Callable[[], Any], rounds: int) -> float:
    # CPU time, not wall time: the figures hold on a machine other processes share
    number = 2000
    times = timeit.repeat(call, number=number, repeat=rounds, timer=time.thread_time)
    return min(times) / number * 1e6


def _unchecked(schema: Any) -> Callable[[bytes], int]:
    return len


def measure(frame: bytes, rounds: int) -> dict[str, float]:
    """The walk alone, kio's readers alone, and ``parse_request`` without the walk (before it
    existed) and with it."""
    api_key, version = kc.API_KEY_VERSION.unpack_from(frame)
    schema = kc.request_schema(api_key, version)
    walk = request_walker(schema)
    read_header, read_body = entity_reader(schema.__header_schema__), entity_reader(schema)

    def kio_only() -> None:
        _, offset = read_header(frame, 0)
        read_body(frame, offset)

    figures = {
        "walk_us": _best_us(lambda: walk(frame), rounds),
        "kio_us": _best_us(kio_only, rounds),
        "parse_after_us": _best_us(lambda: kc.parse_request(frame), rounds),
    }
    with mock.patch.object(kc, "request_walker", _unchecked):
        figures["parse_before_us"] = _best_us(lambda: kc.parse_request(frame), rounds)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    print(f"{'request':26} {'bytes':>9} {'walk':>6} {'kio':>7} {'before':>7} {'after':>7}  (µs)")
    for name, build in REQUESTS.items():
        frame = build()
        f = measure(frame, args.rounds)
        print(
            f"{name:26} {len(frame):>9} {f['walk_us']:>6.2f} {f['kio_us']:>7.2f} "
            f"{f['parse_before_us']:>7.2f} {f['parse_after_us']:>7.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
