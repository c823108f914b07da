"""gRPC's own cost per megabyte and per call: unary calls against a bidirectional stream, on
three servers (127.0.0.61, reserved).

``python -m bench.grpc_bench --out bench/results/latest.json [--quick]``

The brokers' CPU per record is mostly gRPC and the kernel moving the records (see the peer
benchmark in the README), so this measures the transport alone, with nothing of raftlog's in
it: a server process whose handler answers ``b"ok"`` to 1 MB messages of random bytes (no
(de)serialisation: bytes in, bytes out), and a client sending them

- **unary**: five threads each calling a unary method in turn (five in flight, as the producer
  keeps five batches in flight);
- **stream**: one bidirectional stream, the server answering each message, at most five
  messages unanswered.

Each mode reports MB/s and the CPU seconds per MB of the client and of the server process
(``getrusage`` / ``/proc/<pid>/stat``), both with the node's malloc settings; then the same
with 100-byte messages, calls per second and CPU µs per call: the fixed cost of a request,
which a broker pays per produce request and per follower fetch however few records they
carry. All of it against three servers, each its own process: the thread-pool server the brokers
run (``sync``, the top-level figures), ``grpc.aio`` (``aio``) and ``grpc.aio`` on uvloop's event
loop (``aio_uvloop``): the alternatives to the brokers' server, picked between by these
numbers. Options the gRPC channel takes (``grpc.http2.max_frame_size``,
``grpc.http2.lookahead_bytes``, TCP read chunk sizes) changed nothing measurable here and are
not in it.
"""

from __future__ import annotations

import asyncio
import os
import queue
import resource
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from bench import bench_main
from bench.dataplane_bench import cpu_seconds
from dataplane.broker.malloc_tuning import tune_malloc
from dataplane.tools.owned_process import popen_owned

HOST = "127.0.0.61"
MESSAGE_BYTES = 1_000_000
IN_FLIGHT = 5
MESSAGES = {"full": 1000, "quick": 20}
SMALL_MESSAGE_BYTES = 100  # per-call costs: what a request costs besides its bytes
SMALL_MESSAGES = {"full": 4000, "quick": 200}
SERVER_KINDS = ("sync", "aio", "aio_uvloop")  # the brokers' server first
WARMUP_MESSAGES = 20
SERVICE = "bench.Transport"
OPTIONS = [
    ("grpc.max_receive_message_length", 64 * MESSAGE_BYTES),
    ("grpc.max_send_message_length", 64 * MESSAGE_BYTES),
]
SERVER_START_S = 30.0


# -- the server process ----------------------------------------------------------------------
def serve(kind: str = "sync") -> None:
    """Serve the two methods on an ephemeral port of HOST, print the port, stop at stdin EOF.
    ``kind``: "sync" (the brokers' thread-pool server), "aio" (``grpc.aio`` on asyncio) or
    "aio_uvloop" (the same on uvloop's event loop)."""
    tune_malloc()
    if kind == "sync":
        _serve_sync()
    else:
        if kind == "aio_uvloop":
            import uvloop  # noqa: PLC0415 - only this server kind needs it

            uvloop.install()
        asyncio.run(_serve_aio())


def _serve_sync() -> None:
    def put(request: bytes, context: Any) -> bytes:
        return b"ok"

    def stream(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        for _ in requests:
            yield b"ok"

    server = grpc.server(futures.ThreadPoolExecutor(IN_FLIGHT + 2), options=OPTIONS)
    server.add_generic_rpc_handlers((_handler(put, stream),))
    port = server.add_insecure_port(f"{HOST}:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()  # until the benchmark closes the pipe
    server.stop(grace=None)


async def _serve_aio() -> None:
    async def put(request: bytes, context: Any) -> bytes:
        return b"ok"

    async def stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for _ in requests:
            yield b"ok"

    server = grpc.aio.server(options=OPTIONS)
    server.add_generic_rpc_handlers((_handler(put, stream),))
    port = server.add_insecure_port(f"{HOST}:0")
    await server.start()
    print(port, flush=True)
    # until the benchmark closes the pipe
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)


def _handler(put: Any, stream: Any) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Put": grpc.unary_unary_rpc_method_handler(put),
            "Stream": grpc.stream_stream_rpc_method_handler(stream),
        },
    )


# -- the client ------------------------------------------------------------------------------
def _unary(channel: grpc.Channel, payload: bytes, messages: int) -> None:
    put = channel.unary_unary(f"/{SERVICE}/Put")
    share = messages // IN_FLIGHT

    def caller() -> None:
        for _ in range(share):
            put(payload, timeout=SERVER_START_S)

    threads = [threading.Thread(target=caller) for _ in range(IN_FLIGHT)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _stream(channel: grpc.Channel, payload: bytes, messages: int) -> None:
    outgoing: queue.Queue[bytes | None] = queue.Queue()

    def requests() -> Iterator[bytes]:
        while (item := outgoing.get()) is not None:
            yield item

    answers = channel.stream_stream(f"/{SERVICE}/Stream")(requests(), timeout=SERVER_START_S)
    window = threading.Semaphore(IN_FLIGHT)

    def reader() -> None:
        for _ in range(messages):
            next(answers)
            window.release()

    reading = threading.Thread(target=reader)
    reading.start()
    for _ in range(messages):
        window.acquire()
        outgoing.put(payload)
    reading.join()
    outgoing.put(None)


MODES = {"unary": _unary, "stream": _stream}


def _process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(
    server_kind: str, mode: str, payload: bytes, messages: int
) -> tuple[float, float, float]:
    """(seconds, client CPU s, server CPU s) of ``messages`` calls of ``mode`` against a fresh
    server process of ``server_kind``, after a warm-up."""
    server = popen_owned(  # dies with the benchmark, also when it is killed
        [sys.executable, "-c", f"from bench.grpc_bench import serve; serve({server_kind!r})"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None and server.stdin is not None
        port = int(server.stdout.readline())  # printed once it listens
        channel = grpc.insecure_channel(f"{HOST}:{port}", options=OPTIONS)
        try:
            MODES[mode](channel, payload, WARMUP_MESSAGES)
            client_before, server_before = _process_cpu_s(), cpu_seconds(server.pid)
            started = time.perf_counter()
            MODES[mode](channel, payload, messages)
            seconds = time.perf_counter() - started
            return (
                seconds,
                _process_cpu_s() - client_before,
                cpu_seconds(server.pid) - server_before,
            )
        finally:
            channel.close()
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(timeout=SERVER_START_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def measure(messages: int, small_messages: int = 0) -> dict[str, Any]:
    """Per MB with ``messages`` 1 MB messages and per call with ``small_messages`` of
    ``SMALL_MESSAGE_BYTES`` (0: not measured), against each server kind: the thread-pool
    server's figures at the top level (the brokers' server), the others under their names."""
    tune_malloc()
    figures: dict[str, Any] = {"message_bytes": MESSAGE_BYTES, "in_flight": IN_FLIGHT}
    for kind in SERVER_KINDS:
        measured = _server_figures(kind, messages, small_messages)
        if kind == "sync":
            figures.update(measured)
        else:
            figures[kind] = measured
    return figures


def _server_figures(kind: str, messages: int, small_messages: int) -> dict[str, Any]:
    payload = os.urandom(MESSAGE_BYTES)
    figures: dict[str, Any] = {}
    for mode in MODES:
        seconds, client_cpu, server_cpu = _timed(kind, mode, payload, messages)
        megabytes = messages * MESSAGE_BYTES / 1e6
        figures[mode] = {
            "messages": messages,
            "mb_per_s": round(megabytes / seconds, 1),
            "client_cpu_ms_per_mb": round(client_cpu / megabytes * 1000, 3),
            "server_cpu_ms_per_mb": round(server_cpu / megabytes * 1000, 3),
        }
    if small_messages:
        small: dict[str, Any] = {"message_bytes": SMALL_MESSAGE_BYTES}
        for mode in MODES:
            seconds, client_cpu, server_cpu = _timed(
                kind, mode, os.urandom(SMALL_MESSAGE_BYTES), small_messages
            )
            small[mode] = {
                "messages": small_messages,
                "calls_per_s": round(small_messages / seconds),
                "client_cpu_us_per_call": round(client_cpu / small_messages * 1e6, 1),
                "server_cpu_us_per_call": round(server_cpu / small_messages * 1e6, 1),
            }
        figures["small"] = small
    return figures


def print_report(console: Console, figures: dict[str, Any]) -> None:
    table = Table(
        title=f"gRPC alone: {MESSAGE_BYTES:,} B and {SMALL_MESSAGE_BYTES} B messages, "
        f"{IN_FLIGHT} in flight"
    )
    for column in (
        "server", "mode", "MB/s", "client CPU ms/MB", "server CPU ms/MB", "calls/s",
        "client CPU µs/call", "server CPU µs/call",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for kind in SERVER_KINDS:
        measured = figures if kind == "sync" else figures[kind]
        for mode in MODES:
            row, small = measured[mode], measured.get("small", {}).get(mode)
            per_call = (
                [f"{small['calls_per_s']:,}", f"{small['client_cpu_us_per_call']:.1f}",
                 f"{small['server_cpu_us_per_call']:.1f}"]
                if small is not None else ["", "", ""]
            )  # fmt: skip
            table.add_row(
                kind, mode, f"{row['mb_per_s']:,.1f}", f"{row['client_cpu_ms_per_mb']:.3f}",
                f"{row['server_cpu_ms_per_mb']:.3f}", *per_call,
            )  # fmt: skip
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    def figures(workdir: Path, quick: bool, progress: Console) -> dict[str, Any]:
        progress.log(
            f"gRPC transport on {HOST}: unary calls and a bidirectional stream, against the "
            "thread-pool server, grpc.aio, and grpc.aio on uvloop"
        )
        size = "quick" if quick else "full"
        return measure(MESSAGES[size], SMALL_MESSAGES[size])

    return bench_main(argv, __doc__.splitlines()[0], "grpc_transport", figures, print_report)


if __name__ == "__main__":
    sys.exit(main())
