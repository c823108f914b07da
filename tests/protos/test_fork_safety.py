"""Forking while gRPC threads run must not kill the child (PySpark's JVM launch does this).

The probe runs in a fresh interpreter, because gRPC reads GRPC_ENABLE_FORK_SUPPORT once, when it is
first imported: it imports raftlog's `protos` package first (as every raftlog package does), then
keeps a loopback gRPC server busy with four client threads while it starts `/bin/true` with a
`preexec_fn` (fork + exec, as PySpark's ``launch_gateway``) a few hundred times. With gRPC's fork
handlers on, about one child in ten dies before its exec (measured: 113 of 1,174), and a run
may hang outright.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FORKS = 300
PROBE = f"""
import os, signal, subprocess, threading
from concurrent import futures

import protos  # what every raftlog package imports before grpc
import grpc

server = grpc.server(futures.ThreadPoolExecutor(8))
echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Echo", {{"Call": echo}}),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
stop = threading.Event()

def client():
    call = grpc.insecure_channel(f"127.0.0.1:{{port}}").unary_unary("/t.Echo/Call")
    while not stop.is_set():
        try:
            call(b"x" * 100, timeout=10)
        except grpc.RpcError:  # the server stopping at the end
            return

threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
for thread in threads:
    thread.start()
ignore_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)
failed = sum(
    subprocess.Popen(["/bin/true"], preexec_fn=ignore_sigint).wait() != 0 for _ in range({FORKS})
)
stop.set()
server.stop(0).wait(15)  # a server left running can hold the interpreter's exit
for thread in threads:
    thread.join(timeout=15)
print("failed children:", failed, flush=True)
# Not the interpreter's own exit: under load gRPC's serving thread was seen scheduling work
# after the shutdown had begun and the exit hung past the test's timeout (the count printed).
os._exit(0)
"""


@pytest.mark.timeout(120)
def test_children_forked_beside_busy_grpc_threads_all_start() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=100, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "failed children: 0" in result.stdout, result.stderr[-3000:]
