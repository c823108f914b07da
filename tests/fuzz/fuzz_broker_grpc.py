"""Fuzz target: BrokerService's gRPC handlers, as the server registers them.

The first byte picks the method, the rest is its request message: deserialized as the server
does (``_add_broker_service``: Produce's records read around the message), served by the
BrokerServicer of an in-process broker (tests/fuzz/inprocess.py), the answer serialized. A
message that does not parse is gRPC's INTERNAL; ``context.abort`` is a status; every expected
error must come back as a Kafka error code in the response. Anything else is a crash (gRPC would
answer UNKNOWN, the mapping bypassed). Fetch's long poll is clamped to no wait.
"""

from __future__ import annotations

from dataplane.broker.service import _add_broker_service
from tests.fuzz.inprocess import BrokerPool, GrpcDoor

POOL = BrokerPool()
_doors: dict[int, GrpcDoor] = {}


def fuzz_one(data: bytes) -> None:
    broker = POOL.get()
    door = _doors.get(id(broker))
    if door is None:
        _doors.clear()
        door = _doors[id(broker)] = GrpcDoor(lambda s: _add_broker_service(broker.servicer, s))
    door.call(data, clamp={"max_wait_ms": 0})


if __name__ == "__main__":
    from tests.fuzz.runner import main

    main(fuzz_one)
