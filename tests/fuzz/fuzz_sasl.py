"""Fuzz target: the SASL exchanges of a SASL_PLAINTEXT KAFKA listener (PLAIN, SCRAM-SHA-256/512).

The input is a connection's frames, each a 2-byte length and that many bytes (a request frame
without its size, or a bare token after SaslHandshake v0), fed in order to
``KafkaListener.handle`` with one ``ConnectionAuthenticator`` (dataplane/kafka/sasl.py) whose
nonce is fixed, so a seed can carry a whole SCRAM exchange. The user ``alice`` exists. A frame
that must close the connection raises ``FrameError`` (``ClosingAnswer`` after its answer); the
connection then ends, as the listener's thread does. Anything else is a crash.
"""

from __future__ import annotations

from dataplane.kafka import codec as kc
from dataplane.kafka.sasl import ConnectionAuthenticator
from tests.fuzz.inprocess import SASL_SECURITY, BrokerPool, scram_credential

NONCE = "fuzznonce"
FRAMES_MAX = 8
ALLOWED = (kc.FrameError,)
POOL = BrokerPool()


def frames_of(data: bytes) -> list[bytes]:
    frames: list[bytes] = []
    position = 0
    while position + 2 <= len(data) and len(frames) < FRAMES_MAX:
        size = int.from_bytes(data[position : position + 2], "big")
        frames.append(data[position + 2 : position + 2 + size])
        position += 2 + size
    return frames


def fuzz_one(data: bytes) -> None:
    listener = POOL.get().sasl_listener
    auth = ConnectionAuthenticator(
        SASL_SECURITY, scram_credential, "127.0.0.212", nonce=lambda: NONCE
    )
    for frame in frames_of(data):
        if not auth.expects_raw_token and len(frame) >= 2:
            api_key = int.from_bytes(frame[:2], "big", signed=True)
            if api_key == kc.API_FETCH or (
                auth.authenticated and api_key not in listener._handlers
            ):
                return  # served as tests/fuzz/fuzz_kafka_request.py serves it
        try:
            listener.handle(frame, "/127.0.0.212", auth)
        except ALLOWED:
            return


if __name__ == "__main__":
    from tests.fuzz.runner import main

    main(fuzz_one)
