"""Per-message CPU of the Raft transport's two protections, in one process: pysyncobj's secret
(zlib + Fernet, as tcp_connection.py does it) against TLS 1.3 records through ``ssl.SSLObject``
over ``MemoryBIO`` (as metadata_quorum/raft_tls.py does it), on the messages
``tests.metadata_quorum.raft_node bench`` sends.

No sockets and no other process, so it is far less sensitive to a busy machine than the
3-process benchmark: what it gives is the cost each protection adds to one message, sender and
receiver together, beside pysyncobj's own framing (pickle + zlib and back), which every
transport pays. Each figure is the median of ``REPEATS`` timings of a loop.

    .venv/bin/python -m bench.raft_transport          # a table
    .venv/bin/python -m bench.raft_transport --json   # what bench/security_bench.py records
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import statistics
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pysyncobj import pickle as syncobj_pickle
from pysyncobj.encryptor import getEncryptor

from dataplane.tools.certificates import make_ca, make_cert
from metadata_quorum.raft_tls import RaftTls, RaftTlsFiles

# raft_node bench's payload size, random; here each entry its own (the bench repeats one
# payload, which zlib folds: its batches shrink to about one entry's size on the wire).
PAYLOAD_BYTES = 1024
REPEATS = 5
LOOP_S = 0.2  # each timing runs the message this long, at least

# (name, entries in one append_entries): an acknowledgement, one append at a time (the latency
# run), and the pipelined run's batches (up to _APPEND_BATCH_BYTES = 64 KiB of entries).
MESSAGES = (("ack (next_node_idx)", 0), ("append_entries, 1 entry", 1),
            ("append_entries, 8 entries", 8), ("append_entries, 40 entries", 40))  # fmt: skip


def raft_message(entries: int) -> Any:
    """A message of the shape pysyncobj 0.3.17 sends (syncobj.py), entries as raft.py makes
    them: a type byte, then the pickled call of the one replicated method on term + payload."""
    if entries == 0:
        return {"type": "next_node_idx", "next_node_idx": 123_457, "reset": False, "success": True}
    term = struct.pack(">Q", 7)
    commands = [
        b"\x00" + syncobj_pickle.dumps((0, (term + os.urandom(PAYLOAD_BYTES),)))
        for _ in range(entries)
    ]
    return {
        "type": "append_entries", "term": 7, "commit_index": 123_400,
        "entries": [(command, 123_456 + i, 7) for i, command in enumerate(commands)],
        "prevLogIdx": 123_455, "prevLogTerm": 7,
    }  # fmt: skip


def _frame(message: Any) -> bytes:
    return zlib.compress(syncobj_pickle.dumps(message), 3)


def _unframe(data: bytes) -> Any:
    return syncobj_pickle.loads(zlib.decompress(data))


def _timed(step: Callable[[], object], loop_s: float) -> float:
    """Microseconds per call: the median of REPEATS loops of at least ``loop_s`` each."""
    calls = 1
    while True:
        started = time.perf_counter()
        for _ in range(calls):
            step()
        if time.perf_counter() - started >= loop_s:
            break
        calls *= 2
    timings = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        for _ in range(calls):
            step()
        timings.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(timings)


class _TlsPair:
    """A client and a server ``SSLObject`` over memory BIOs, handshaken, with raft_tls's
    contexts (TLS 1.3, mutual certificates)."""

    def __init__(self, directory: Path) -> None:
        ca = make_ca(directory)
        keystore = make_cert(ca, directory, "raft-127.0.0.1", ips=("127.0.0.1",))
        tls = RaftTls(RaftTlsFiles(keystore, ca.truststore), lambda peer, reason: None)
        self.client_in, self.client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.server_in, self.server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.client = tls.client.wrap_bio(self.client_in, self.client_out, False, "127.0.0.1")
        self.server = tls.server.wrap_bio(self.server_in, self.server_out, True)
        for _ in range(10):
            done = [self._step(self.client), self._step(self.server)]
            self.server_in.write(self.client_out.read())
            self.client_in.write(self.server_out.read())
            if all(done):
                break
        assert self.client.version() == "TLSv1.3" and self.server.getpeercert()

    @staticmethod
    def _step(side: ssl.SSLObject) -> bool:
        try:
            side.do_handshake()
        except ssl.SSLWantReadError:
            return False
        return True

    def send(self, frame: bytes) -> bytes:
        self.client.write(frame)
        return self.client_out.read()

    def receive(self, records: bytes, size: int) -> bytes:
        self.server_in.write(records)
        plain = bytearray()
        while len(plain) < size:
            plain += self.server.read(size - len(plain))
        return bytes(plain)


def _drain_tickets(pair: _TlsPair) -> None:
    """The client takes the server's session tickets (TLS 1.3 sends them after the handshake)."""
    try:
        pair.client.read(1)
    except ssl.SSLWantReadError:
        return


def measure(directory: Path, loop_s: float = LOOP_S) -> dict[str, Any]:
    """Per message: bytes on the wire and microseconds (sender + receiver) of each path.
    ``loop_s`` below LOOP_S gives rougher figures sooner (a test's tiny run)."""
    fernet = getEncryptor(os.urandom(32).hex())
    rand_key = os.urandom(32)
    pair = _TlsPair(directory)
    _drain_tickets(pair)
    figures: dict[str, Any] = {}
    for name, entries in MESSAGES:
        message = raft_message(entries)
        frame = _frame(message)
        plain_frame = struct.pack("i", len(frame)) + frame
        keyed = _frame((rand_key, message))  # pysyncobj's secret adds the connection's key
        token = fernet.encrypt_at_time(keyed, 1)
        records = pair.send(plain_frame)
        assert pair.receive(records, len(plain_frame)) == plain_frame

        def fernet_round(keyed: bytes = keyed) -> object:
            sent = fernet.encrypt_at_time(keyed, 1)
            fernet.extract_timestamp(sent)  # pysyncobj checks the HMAC here, and again:
            return fernet.decrypt(sent)

        def tls_round(plain_frame: bytes = plain_frame) -> object:
            return pair.receive(pair.send(plain_frame), len(plain_frame))

        def framing_round(message: Any = message) -> object:
            return _unframe(_frame(message))

        figures[name] = {
            "frame_bytes": len(plain_frame),
            "secret_wire_bytes": 4 + len(token),
            "tls_wire_bytes": len(records),
            "framing_us": round(_timed(framing_round, loop_s), 2),
            "secret_us": round(_timed(fernet_round, loop_s), 2),
            "tls_us": round(_timed(tls_round, loop_s), 2),
        }
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench.raft_transport")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raft-transport-") as directory:
        figures = measure(Path(directory))
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"{'message':28} {'frame B':>8} {'wire B secret':>14} {'wire B TLS':>11} "
          f"{'framing µs':>11} {'+secret µs':>11} {'+TLS µs':>8}")  # fmt: skip
    for name, row in figures.items():
        print(f"{name:28} {row['frame_bytes']:>8} {row['secret_wire_bytes']:>14} "
              f"{row['tls_wire_bytes']:>11} {row['framing_us']:>11} {row['secret_us']:>11} "
              f"{row['tls_us']:>8}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
