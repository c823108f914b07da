"""Fuzz target: a Kafka request frame, per API key and version, through the KAFKA listener.

The first two bytes pick one of the (api key, version) pairs `SUPPORTED` serves; the rest is
the frame after them (correlation id, client id, tagged fields, body). The frame goes to
``KafkaListener.handle`` of an in-process broker (tests/fuzz/inprocess.py): decoded
(dataplane/kafka/codec.py ``parse_request``), served by the API's handler, the answer encoded.
The listener's connection thread (``_serve``) closes the connection on ``FrameError``; any other
exception is a crash. APIs whose handler needs the controller or the transaction coordinator (not
built in process) are decoded only. Fetch's and the classic group protocol's waits are clamped to
0 (a client may ask to wait; the fuzzer may not).
"""

from __future__ import annotations

import dataclasses
import datetime

from dataplane.kafka import codec as kc
from dataplane.kafka.listener import Replicating
from tests.fuzz.inprocess import BrokerPool
from tests.fuzz.runner import main

PAIRS = tuple(
    (key, version)
    for key, (low, high) in sorted(kc.SUPPORTED.items())
    for version in range(low, high + 1)
)
# The fields that make a handler wait (Kafka's purgatories), clamped to no wait.
WAITS = {
    kc.API_FETCH: {"max_wait": datetime.timedelta(0)},
    kc.API_JOIN_GROUP: {"rebalance_timeout": datetime.timedelta(0)},
}
ALLOWED = (kc.FrameError,)
POOL = BrokerPool()


def frame_of(data: bytes) -> bytes:
    """The request frame (without its size) that ``data`` stands for."""
    key, version = PAIRS[int.from_bytes(data[:2], "big") % len(PAIRS)]
    return kc.API_KEY_VERSION.pack(key, version) + data[2:]


def fuzz_one(data: bytes) -> None:
    if len(data) < 2:
        return
    frame = frame_of(data)
    listener = POOL.get().listener
    try:
        request = kc.parse_request(frame, "/127.0.0.212")
        waits = WAITS.get(request.api_key)
        if waits is not None:
            fields = {f.name for f in dataclasses.fields(request.body)}
            clamped = {name: v for name, v in waits.items() if name in fields}
            request = dataclasses.replace(
                request, body=dataclasses.replace(request.body, **clamped)
            )
            data_out = listener._handlers[request.api_key](request)
            if isinstance(data_out, Replicating):  # an acks=all Produce: its answer once replicated
                data_out = data_out.finish()
            if data_out is not None:
                kc.encode_response(
                    request.api_key, request.api_version, request.correlation_id, data_out
                )
            return
        if request.api_key not in listener._handlers and request.api_key != kc.API_SASL_HANDSHAKE:
            return  # decoded; served by the controller or a coordinator not built here
        listener.handle(frame, "/127.0.0.212")
    except ALLOWED:
        return


if __name__ == "__main__":
    main(fuzz_one)
