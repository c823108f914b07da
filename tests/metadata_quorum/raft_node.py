"""One MetadataLog voter in a child process, driven over stdin/stdout; and a 3-process benchmark.

Child (started by `NodeProcess`)::

    python -m tests.metadata_quorum.raft_node serve --self A --voters A,B,C --data-dir D

reads one command per line on stdin and answers one JSON object per line on stdout:
``append <text>``, ``append_many <count> <prefix>`` (pipelined),
``bench <count> <bytes> [<latency samples>]``,
``state``, ``status``, ``compact``, ``add_voter <address>``, ``remove_voter <address>``,
``quit``. Its logs go to stderr (a file, never a pipe).

Benchmark (pipelined 1 KiB commits/s on a 3-process cluster, fsync on and off; or, with
``--encryption``, fsync on with the Raft transport plaintext, encrypted with a secret
(``--secret-file``) and under TLS (``--tls-keystore``/``--tls-truststore``, certificates of a
fresh CA made in the run's temporary directory), the three interleaved ``--rounds`` times, each
figure the median of its rounds with the spread beside it; ``--json`` prints the figures as one
JSON object, which bench/security_bench.py reads)::

    .venv/bin/python -m tests.metadata_quorum.raft_node bench --count 20000
    .venv/bin/python -m tests.metadata_quorum.raft_node bench --encryption --rounds 3 --count 5000
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any

from dataplane.tools.certificates import CertFiles, make_ca, make_cert
from dataplane.tools.owned_process import popen_owned
from metadata_quorum import raft
from metadata_quorum.raft import (
    MetadataLog,
    MetadataLogError,
    NotLeaderError,
    RaftOptions,
    read_raft_secret,
)
from metadata_quorum.raft_tls import RaftTlsFiles

REPO = Path(__file__).resolve().parents[2]
HOSTS = ("127.0.0.141", "127.0.0.142", "127.0.0.143")  # reserved for the raft tests
REPLY_TIMEOUT_S = 30.0
PIPELINE_WINDOW = 500  # <= RaftOptions.max_in_flight_appends
FUTURE_TIMEOUT_S = 10.0
LATENCY_SAMPLES = 200
COMPACT_WAIT_S = 1.0


class ListMachine:
    """A list of payloads. Snapshot: last applied index (u64) then length-prefixed payloads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: list[bytes] = []
        self.last_index = 0
        self.order_violations = 0
        self.restores = 0
        self.restored_entries = 0
        self.applied_since_restore = 0
        self.snapshots = 0
        self.keep_payloads = True  # the benchmark counts only, so snapshots stay small

    def apply(self, payload: bytes, index: int) -> object:
        with self._lock:
            if index <= self.last_index:
                self.order_violations += 1
            self.last_index = index
            if self.keep_payloads:
                self.entries.append(payload)
            self.applied_since_restore += 1
            return len(self.entries)

    def snapshot(self) -> bytes:
        with self._lock:
            self.snapshots += 1
            parts = [struct.pack(">Q", self.last_index)]
            parts += [struct.pack(">I", len(p)) + p for p in self.entries]
            return b"".join(parts)

    def restore(self, data: bytes) -> None:
        (last_index,), offset, entries = struct.unpack_from(">Q", data), 8, []
        while offset < len(data):
            (size,) = struct.unpack_from(">I", data, offset)
            entries.append(data[offset + 4 : offset + 4 + size])
            offset += 4 + size
        with self._lock:
            self.entries, self.last_index = entries, last_index
            self.restores += 1
            self.restored_entries, self.applied_since_restore = len(entries), 0

    def on_leader_change(self, leader: str | None, is_self: bool) -> None:
        logging.getLogger("raft_node").info("leader is now %s (self: %s)", leader, is_self)

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {
                "ok": True,
                "entries": [p.decode() for p in self.entries],
                "order_violations": self.order_violations,
                "restores": self.restores,
                "restored_entries": self.restored_entries,
                "applied_since_restore": self.applied_since_restore,
            }


def _error_reply(error: BaseException) -> dict[str, Any]:
    leader = error.leader if isinstance(error, NotLeaderError) else None
    return {"ok": False, "error": type(error).__name__, "message": str(error), "leader": leader}


def _pipelined(log: MetadataLog, payloads: Any) -> tuple[int, float]:
    """Append every payload with at most PIPELINE_WINDOW in flight; (count, seconds)."""
    window: collections.deque[Future[object]] = collections.deque()
    count, started = 0, time.perf_counter()
    for payload in payloads:
        if len(window) >= PIPELINE_WINDOW:
            window.popleft().result(timeout=FUTURE_TIMEOUT_S)
        window.append(log.append(payload))
        count += 1
    for future in window:
        future.result(timeout=FUTURE_TIMEOUT_S)
    return count, time.perf_counter() - started


def _handle(log: MetadataLog, machine: ListMachine, words: list[str]) -> dict[str, Any]:
    command, args = words[0], words[1:]
    try:
        if command == "append":
            return {"ok": True, "result": log.append(args[0].encode()).result(FUTURE_TIMEOUT_S)}
        if command == "append_many":
            payloads = (f"{args[1]}-{i}".encode() for i in range(int(args[0])))
            count, seconds = _pipelined(log, payloads)
            return {"ok": True, "count": count, "seconds": seconds}
        if command == "bench":
            machine.keep_payloads = False
            payload = os.urandom(int(args[1]))
            samples = int(args[2]) if len(args) > 2 else LATENCY_SAMPLES
            count, seconds = _pipelined(log, (payload for _ in range(int(args[0]))))
            latencies = sorted(_pipelined(log, [payload])[1] for _ in range(samples))
            return {
                "ok": True, "count": count, "seconds": seconds, "ops_per_s": count / seconds,
                "latency_p50_ms": latencies[len(latencies) // 2] * 1e3,
                "latency_p99_ms": latencies[len(latencies) * 99 // 100] * 1e3,
            }  # fmt: skip
        if command == "state":
            return machine.report()
        if command == "status":
            status = dataclasses.asdict(log.status())
            voters = sorted(log.voters())
            return {"ok": True, "is_leader": log.is_leader(), "voter_set": voters, **status}
        if command in ("add_voter", "remove_voter"):
            change = log.add_voter if command == "add_voter" else log.remove_voter
            change(args[0]).result(FUTURE_TIMEOUT_S)
            return {"ok": True, "voters": sorted(log.voters())}
        if command == "compact":  # waits for the snapshot unless there is nothing new to take
            before = machine.snapshots
            log.compact()
            deadline = time.monotonic() + COMPACT_WAIT_S
            while machine.snapshots == before and time.monotonic() < deadline:
                time.sleep(0.005)  # poll interval, bounded by the deadline
            return {"ok": True, "compacted": machine.snapshots > before}
    except MetadataLogError as error:
        return _error_reply(error)
    return {"ok": False, "error": "UnknownCommand", "message": command, "leader": None}


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    if args.refusal_log_interval_s is not None:  # tests of refusals: a new line per phase sooner
        raft._REFUSAL_LOG_INTERVAL_S = args.refusal_log_interval_s
    machine = ListMachine()
    secret = read_raft_secret(Path(args.secret_file)) if args.secret_file else None
    tls = None
    if args.tls_keystore or args.tls_truststore:
        tls = RaftTlsFiles(Path(args.tls_keystore), Path(args.tls_truststore))
    options = RaftOptions(
        fsync=args.fsync, max_journal_entries=args.max_journal_entries, secret=secret, tls=tls
    )
    log = MetadataLog(
        args.self, args.voters.split(","), Path(args.data_dir), machine, options=options
    )
    print(json.dumps({"ok": True, "ready": args.self}), flush=True)
    try:
        for line in sys.stdin:
            words = line.split()
            if not words or words[0] == "quit":
                break
            print(json.dumps(_handle(log, machine, words)), flush=True)
    finally:
        log.close()
    return 0


# -- the parent side -----------------------------------------------------------------------


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class NodeProcess:
    """A `serve` child: started, asked, SIGKILLed by pid."""

    def __init__(self, address: str, voters: list[str], data_dir: Path, extra: list[str]) -> None:
        self.address = address
        self.data_dir = data_dir
        self.log_path = data_dir.with_name(data_dir.name + ".log")
        self._argv = [
            sys.executable, "-m", "tests.metadata_quorum.raft_node", "serve", "--self", address,
            "--voters", ",".join(voters), "--data-dir", str(data_dir), *extra,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._stderr: IO[bytes] | None = None

    def add_arguments(self, extra: list[str]) -> None:
        """More ``serve`` arguments (this node's own, e.g. its certificate), before start."""
        self._argv += extra

    def start(self) -> None:
        self._stderr = self.log_path.open("ab")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = popen_owned(  # dies with this process if the test run is killed
            self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            cwd=REPO, env=env,
        )  # fmt: skip
        self._buffer = b""
        reply = self._read_reply(REPLY_TIMEOUT_S)
        assert reply.get("ready") == self.address, reply

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def request(self, line: str, timeout_s: float = REPLY_TIMEOUT_S) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        return self._read_reply(timeout_s)

    def _read_reply(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise TimeoutError(f"{self.address}: no reply in {timeout_s} s\n{self.tail()}")
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise EOFError(f"{self.address} exited\n{self.tail()}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return dict(json.loads(line))

    def kill(self) -> None:
        """SIGKILL by pid and reap; a no-op when not running."""
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    pipe.close()
            self.proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Cluster:
    """Three `serve` children on ``hosts`` (127.0.0.141-143) with free ports, data under
    ``root``; ``others`` are more voters' addresses, started separately (`add_process`)."""

    def __init__(
        self,
        root: Path,
        extra: list[str],
        hosts: tuple[str, ...] = HOSTS,
        others: tuple[str, ...] = (),
    ) -> None:
        self.addresses = [f"{host}:{free_port(host)}" for host in hosts] + list(others)
        self.nodes = {
            address: NodeProcess(address, self.addresses, root / f"node{i}", extra)
            for i, address in enumerate(self.addresses)
            if address not in others
        }

    def start(self, *addresses: str) -> None:
        for address in addresses or list(self.nodes):
            self.nodes[address].start()

    def add_process(self, host: str, root: Path, extra: list[str]) -> NodeProcess:
        """A new voter-to-be on ``host``, told of the initial voters; not started."""
        address = f"{host}:{free_port(host)}"
        node = NodeProcess(address, self.addresses, root / f"node-{host}", extra)
        self.nodes[address] = node
        return node

    def live(self) -> list[NodeProcess]:
        return [node for node in self.nodes.values() if node.alive]

    def leader(self, timeout_s: float = 10.0) -> NodeProcess:
        """The live node that reports itself the (caught-up) leader, polled until the deadline."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in self.live():
                if node.request("status").get("is_leader"):
                    return node
            time.sleep(0.02)  # poll interval; the loop is bounded by the deadline
        raise TimeoutError(f"no leader within {timeout_s} s")

    def kill_all(self) -> None:
        for node in self.nodes.values():
            node.kill()


def tls_arguments(ca_dir: Path, host: str, ca_name: str = "raftlog-ca") -> list[str]:
    """``serve`` arguments for TLS with a certificate for ``host`` signed by the CA in
    ``ca_dir`` (made there on first use)."""
    ca_cert = ca_dir / f"{ca_name}.crt"
    if ca_cert.exists():
        ca = CertFiles(ca_cert, ca_dir / f"{ca_name}.key")
    else:
        ca = make_ca(ca_dir, ca_name)
    keystore = make_cert(ca, ca_dir, f"raft-{host}", ips=(host,))
    return ["--tls-keystore", str(keystore), "--tls-truststore", str(ca.truststore)]


def _bench_one(args: argparse.Namespace, fsync: bool, transport: str) -> dict[str, Any]:
    """One 3-process run; ``transport`` is plaintext, encrypted (a secret) or tls."""
    with tempfile.TemporaryDirectory(prefix="raft-bench-") as root:
        extra = [] if fsync else ["--no-fsync"]
        if transport == "encrypted":
            secret_file = Path(root) / "raft.secret"
            secret_file.write_text(os.urandom(32).hex())
            extra += ["--secret-file", str(secret_file)]
        cluster = Cluster(Path(root), extra, hosts=tuple(args.hosts.split(",")))
        if transport == "tls":  # each node its own certificate, for its own address
            for node in cluster.nodes.values():
                host = node.address.rsplit(":", 1)[0]
                node.add_arguments(tls_arguments(Path(root) / "tls", host))
        try:
            cluster.start()
            command = f"bench {args.count} {args.size} {args.latency_samples}"
            reply = cluster.leader().request(command, 600.0)
        finally:
            cluster.kill_all()
    assert reply["ok"], reply
    return reply


_FIGURES = ("commits_per_s", "commit_latency_p50_ms", "commit_latency_p99_ms")


def _median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds, and its spread (min, max) when there are several."""
    figures: dict[str, Any] = {}
    for name, reply_key in zip(
        _FIGURES, ("ops_per_s", "latency_p50_ms", "latency_p99_ms"), strict=True
    ):
        values = sorted(run[reply_key] for run in runs)
        figures[name] = round(values[len(values) // 2], 3 if "ms" in name else 1)
        if len(values) > 1:
            figures[f"{name}_range"] = [round(values[0], 3), round(values[-1], 3)]
    figures["rounds"] = len(runs)
    return figures


def bench(args: argparse.Namespace) -> int:
    if args.encryption:  # interleaved, so that a busy spell hits every transport alike
        modes = [("fsync", True, "plaintext"), ("encrypted", True, "encrypted"),
                 ("tls", True, "tls")]  # fmt: skip
    else:
        modes = [("fsync", True, "plaintext"), ("no_fsync", False, "plaintext")]
    runs: dict[str, list[dict[str, Any]]] = {key: [] for key, _, _ in modes}
    for round_number in range(args.rounds):
        for key, fsync, transport in modes:
            reply = _bench_one(args, fsync, transport)
            runs[key].append(reply)
            if not args.json:
                print(
                    f"round {round_number + 1} fsync={'on' if fsync else 'off'} {transport}: "
                    f"{args.count} x {args.size} B pipelined in {reply['seconds']:.2f} s "
                    f"= {reply['ops_per_s']:,.0f} commits/s; one append at a time: "
                    f"p50 {reply['latency_p50_ms']:.2f} ms, p99 {reply['latency_p99_ms']:.2f} ms",
                    flush=True,
                )
    figures = {key: _median_of(replies) for key, replies in runs.items()}
    if args.json:
        print(json.dumps(figures))
    else:
        for key, values in figures.items():
            print(f"{key}: {json.dumps(values)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="raft_node")
    commands = parser.add_subparsers(dest="command", required=True)
    node = commands.add_parser("serve")
    node.add_argument("--self", required=True)
    node.add_argument("--voters", required=True)
    node.add_argument("--data-dir", required=True)
    node.add_argument("--max-journal-entries", type=int, default=5_000)
    node.add_argument("--no-fsync", dest="fsync", action="store_false")
    node.add_argument("--secret-file", default=None)
    node.add_argument("--tls-keystore", default=None)  # with --tls-truststore: TLS 1.3, mTLS
    node.add_argument("--tls-truststore", default=None)
    node.add_argument("--refusal-log-interval-s", type=float, default=None)  # default: 10 s
    measure = commands.add_parser("bench")
    measure.add_argument("--count", type=int, default=20_000)
    measure.add_argument("--size", type=int, default=1024)
    measure.add_argument("--latency-samples", type=int, default=LATENCY_SAMPLES)  # one at a time
    measure.add_argument("--hosts", default=",".join(HOSTS))
    measure.add_argument("--encryption", action="store_true")
    measure.add_argument("--rounds", type=int, default=1)
    measure.add_argument("--json", action="store_true")
    args = parser.parse_args()
    return serve(args) if args.command == "serve" else bench(args)


if __name__ == "__main__":
    sys.exit(main())
