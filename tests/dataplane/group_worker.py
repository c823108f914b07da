"""A consumer-group member as its own process, for tests that SIGKILL members.

``python -m tests.dataplane.group_worker BOOTSTRAP GROUP TOPIC LOG`` subscribes to TOPIC in
GROUP and appends one line per event to LOG (line-buffered, so a SIGKILL loses nothing already
written): ``ASSIGNED|REVOKED|LOST <ns> p,p,..``, ``REC <ns> partition offset value`` for every
record processed, ``COMMIT <ns> partition offset`` after each synchronous commit (offsets are
committed after processing, and for revoked partitions in the listener). SIGTERM closes the
consumer cleanly (leaving the group) and writes ``CLOSED``.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import TextIO

from dataplane.client import Consumer, ConsumerRebalanceListener, TopicPartition


def line(out: TextIO, *fields: object) -> None:
    out.write(" ".join(str(f) for f in fields) + "\n")


def partitions(tps: set[TopicPartition]) -> str:
    return ",".join(str(tp.partition) for tp in sorted(tps)) or "-"


class Listener(ConsumerRebalanceListener):
    def __init__(self, consumer: Consumer, out: TextIO) -> None:
        self.consumer = consumer
        self.out = out

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        positions = {tp: self.consumer.position(tp) for tp in revoked}
        self.consumer.commit(positions)
        for tp, offset in sorted(positions.items()):
            line(self.out, "COMMIT", time.time_ns(), tp.partition, offset)
        line(self.out, "REVOKED", time.time_ns(), partitions(revoked))

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        line(self.out, "ASSIGNED", time.time_ns(), partitions(assigned))

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        line(self.out, "LOST", time.time_ns(), partitions(lost))


def main(bootstrap: str, group: str, topic: str, path: str) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with open(path, "a", buffering=1) as out:
        consumer = Consumer(
            bootstrap, group_id=group, client_id=path.rsplit("/", 1)[-1],
            auto_offset_reset="earliest", enable_auto_commit=False,
        )  # fmt: skip
        consumer.subscribe([topic], listener=Listener(consumer, out))
        while not stop.is_set():
            batches = consumer.poll(timeout_ms=200)
            for tp, records in batches.items():
                for record in records:
                    value = (record.value or b"").decode()
                    line(out, "REC", time.time_ns(), tp.partition, record.offset, value)
            if batches:
                positions = {tp: consumer.position(tp) for tp in batches}
                consumer.commit(positions)
                for tp, offset in sorted(positions.items()):
                    line(out, "COMMIT", time.time_ns(), tp.partition, offset)
        consumer.close()
        line(out, "CLOSED", time.time_ns())


if __name__ == "__main__":
    main(*sys.argv[1:5])
