"""Security benchmark: what TLS + SCRAM, the authorizer with 10,000 ACLs and the Raft transport's
encryption cost.

``python -m bench.security_bench --out bench/results/latest.json [--quick]``

Clusters of 2 combined nodes on 127.0.0.189-190, one after another, and a 3-voter Raft quorum on
127.0.0.251-253 (both reserved for this benchmark and some tests; benchmarks run alone), data in
temporary directories removed afterwards:

1. Throughput, our client over the BROKER listener: produce (acks=all, 1 KiB records, the
   producer's defaults) then three reads of the whole topic by an assigned consumer, each timed
   from its first records (the median counts), records/s, on a plaintext cluster and
   on a secure one (``LocalCluster(secure=True)``: TLS, SCRAM-SHA-512 as ``admin``, the
   StandardAuthorizer; admin is a super user). Target: TLS costs at most 25% of produce.
2. Handshakes on the secure cluster, each new connection measured alone (p50 / p99 ms): gRPC
   (a channel made ready: TCP + TLS + HTTP/2; then the SCRAM exchange that yields the session
   token) and the KAFKA listener (TCP + TLS; then SaslHandshake + SaslAuthenticate SCRAM-SHA-512,
   two rounds), against the plaintext gRPC channel's setup.
3. The authorizer's cost per request: produce latency (one record at a time, acks=all, linger 0)
   on a plaintext cluster without an authorizer, then on one with the StandardAuthorizer and
   10,000 ACLs of which ``MATCHING_ACLS`` name the producing principal (User:ANONYMOUS: the
   listener is plaintext). Target: p99 at most 5% above.
4. The Raft transport: pipelined commits/s and one-at-a-time commit latency of a 3-process
   quorum (``tests.metadata_quorum.raft_node bench --encryption``), plaintext, encrypted with
   the secret and under TLS; and each one's CPU per message (``bench.raft_transport``).

Every wait polls a condition with a deadline; the nodes are stopped by their pids at the end,
also on failure or SIGTERM.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from bench import RECORD_BYTES, REPO_ROOT, bench_main, raft_transport
from dataplane.client import AdminClient, Consumer, NewTopic, Producer
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port, wait_for
from metadata_quorum.security.acl import (
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from metadata_quorum.security.channels import ClientSecurity, SaslSession
from metadata_quorum.security.scram import ScramClient, ScramMechanism

FIRST_HOST = 189  # 127.0.0.189-190 are this benchmark's
NODES = 2
RAFT_HOSTS = "127.0.0.251,127.0.0.252,127.0.0.253"
PARTITIONS = 4
ACLS = 10_000
MATCHING_ACLS = 10  # of the ACLS, those that name the producing principal
ACL_BATCH = 1_000  # ACLs per CreateAcls request
CONSUME_PASSES = 3  # reads of the whole topic; the median is the figure (one read is ~2 s)
WAIT_S = 300.0
TWO_NODES = {"offsets.topic.replication.factor": 2, "transaction.state.log.replication.factor": 2}
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
TLS_PRODUCE_COST_TARGET_PCT = 25.0
AUTHORIZER_P99_TARGET_PCT = 5.0
KAFKA_HEADER = struct.Struct(">hhih")  # api key, version, correlation id, client id length
CLIENT_ID = b"security-bench"


@dataclass(frozen=True)
class Sizes:
    records: int  # produced, then consumed, per throughput run
    handshakes: int  # connections measured per kind
    latency_records: int  # one-at-a-time produces per authorizer run
    raft_commits: int  # pipelined, per Raft run
    raft_latency_samples: int | None = None  # one-at-a-time commits per Raft run; None: 200
    transport_loop_s: float = raft_transport.LOOP_S  # each per-message timing's loop, at least


FULL = Sizes(records=200_000, handshakes=200, latency_records=3_000, raft_commits=20_000)
QUICK = Sizes(records=2_000, handshakes=5, latency_records=50, raft_commits=500)


# -- clusters ----------------------------------------------------------------------------------
@contextmanager
def cluster_in(
    workdir: Path,
    console: Console,
    *,
    secure: bool = False,
    overrides: dict[str, Any] | None = None,
) -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix="security-", dir=workdir))
    hosts = [f"127.0.0.{FIRST_HOST + n}" for n in range(NODES)]
    cluster = LocalCluster(
        root, nodes=NODES, first_host=FIRST_HOST, port=pick_cluster_port(hosts),
        overrides={**TWO_NODES, **(overrides or {})}, secure=secure,
    )  # fmt: skip
    try:
        console.log(f"starting {NODES} nodes ({'secure' if secure else 'plaintext'}) on {hosts}")
        cluster.up(timeout_s=WAIT_S)
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)


def client_security(cluster: LocalCluster) -> ClientSecurity | None:
    """The SCRAM user admin over TLS on a secure cluster; None (plaintext) otherwise."""
    settings = cluster.client_settings
    return ClientSecurity.from_properties(settings) if settings else None


def create_topic(cluster: LocalCluster, security: ClientSecurity | None, name: str) -> None:
    with AdminClient(cluster.bootstrap_servers, security=security) as admin:
        errors = admin.create_topics([NewTopic(name, PARTITIONS, NODES)])
        if errors[name] is not None:
            raise errors[name]  # type: ignore[misc]
        wait_for(f"leaders of {name}", lambda: all(
            p.leader >= 0 for p in admin.describe_topics([name])[name].partitions),
            timeout_s=WAIT_S)  # fmt: skip


# -- 1. throughput -----------------------------------------------------------------------------
def throughput(cluster: LocalCluster, sizes: Sizes) -> dict[str, Any]:
    security = client_security(cluster)
    topic = "throughput"
    create_topic(cluster, security, topic)
    payload = os.urandom(RECORD_BYTES)
    with Producer(cluster.bootstrap_servers, acks="all", security=security) as producer:
        start = time.perf_counter()
        futures = [producer.send(topic, payload) for _ in range(sizes.records)]
        producer.flush(timeout=WAIT_S)
        produce_s = time.perf_counter() - start
    failed = sum(future.exception() is not None for future in futures)
    if failed:
        raise RuntimeError(f"{failed} of {sizes.records} records were not acknowledged")
    passes = [consume_pass(cluster, security, topic, sizes.records) for _ in range(CONSUME_PASSES)]
    return {
        "produce_records_per_s": round(sizes.records / produce_s, 1),
        "consume_records_per_s": round(statistics.median(passes), 1),
        "consume_passes_records_per_s": [round(p, 1) for p in passes],
    }


def consume_pass(
    cluster: LocalCluster, security: ClientSecurity | None, topic: str, records: int
) -> float:
    """Records/s of one read of the whole topic by an assigned consumer (no group: no join),
    timed from the first records' arrival, so the connection's setup is left out."""
    received = timed = 0  # timed: the records after the first poll that returned any
    with Consumer(cluster.bootstrap_servers, security=security) as consumer:
        consumer.assign([(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        started_at = time.perf_counter()
        deadline = time.monotonic() + WAIT_S
        first_at: float | None = None
        while received < records and time.monotonic() < deadline:
            polled = sum(len(batch) for batch in consumer.poll(timeout_ms=500).values())
            if polled and first_at is None:
                first_at = time.perf_counter()
            elif polled:
                timed += polled
            received += polled
        ended_at = time.perf_counter()
    if received < records:
        raise RuntimeError(f"consumed {received} of {records} records in {WAIT_S} s")
    if not timed:  # everything came in the first poll (tiny runs): the setup is timed too
        timed, first_at = received, started_at
    return timed / (ended_at - (first_at or started_at))


# -- 2. handshakes -----------------------------------------------------------------------------
def _ms_summary(samples_s: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    return {
        "p50": round(statistics.median(ordered) * 1e3, 3),
        "p99": round(ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)] * 1e3, 3),
    }


def _timed(count: int, one: Callable[[], float]) -> dict[str, float]:
    one()  # warm-up: imports, the server's first-connection paths
    return _ms_summary([one() for _ in range(count)])


def grpc_channel_ready_s(address: str, security: ClientSecurity | None) -> float:
    start = time.perf_counter()
    if security is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, security.grpc_credentials())
    try:
        grpc.channel_ready_future(channel).result(timeout=WAIT_S)
        return time.perf_counter() - start
    finally:
        channel.close()


def grpc_scram_s(address: str, security: ClientSecurity) -> float:
    """The SCRAM exchange that yields a session token, on a TLS channel already ready."""
    channel = grpc.secure_channel(address, security.grpc_credentials())
    try:
        grpc.channel_ready_future(channel).result(timeout=WAIT_S)
        session = SaslSession(channel, security)
        start = time.perf_counter()
        session.token(WAIT_S)
        return time.perf_counter() - start
    finally:
        channel.close()


def _kafka_request(sock: ssl.SSLSocket, key: int, version: int, body: bytes) -> bytes:
    header = KAFKA_HEADER.pack(key, version, 1, len(CLIENT_ID)) + CLIENT_ID
    sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
    size = struct.unpack(">i", _read_exactly(sock, 4))[0]
    return _read_exactly(sock, size)[4:]  # without the correlation id


def _read_exactly(sock: ssl.SSLSocket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the KAFKA listener closed the connection")
        data += chunk
    return data


def _sasl_authenticate(sock: ssl.SSLSocket, message: bytes) -> bytes:
    """SaslAuthenticate v1: the server's bytes; raises on an error code."""
    body = _kafka_request(sock, 36, 1, struct.pack(">i", len(message)) + message)
    error, message_length = struct.unpack_from(">hh", body)
    offset = 4 + max(message_length, 0)
    if error:
        raise ConnectionError(f"SaslAuthenticate failed with error {error}")
    (length,) = struct.unpack_from(">i", body, offset)
    return body[offset + 4 : offset + 4 + length]


def kafka_handshakes_s(address: str, security: ClientSecurity) -> tuple[float, float]:
    """(TCP + TLS, SaslHandshake + SCRAM-SHA-512's two SaslAuthenticate rounds) seconds."""
    host, port = address.rsplit(":", 1)
    context = security.tls_settings().client_context(check_hostname=True)
    start = time.perf_counter()
    raw = socket.create_connection((host, int(port)), timeout=WAIT_S)
    with context.wrap_socket(raw, server_hostname=host) as sock:
        tls_s = time.perf_counter() - start
        start = time.perf_counter()
        mechanism = security.sasl_mechanism.encode()
        _kafka_request(sock, 17, 1, struct.pack(">h", len(mechanism)) + mechanism)
        assert security.sasl_username is not None and security.sasl_password is not None
        client = ScramClient(
            ScramMechanism.from_name(security.sasl_mechanism),
            security.sasl_username, security.sasl_password, os.urandom(18).hex(),
        )  # fmt: skip
        server_first = _sasl_authenticate(sock, client.first())
        client.verify(_sasl_authenticate(sock, client.final(server_first)))
        return tls_s, time.perf_counter() - start


def handshakes(secure: LocalCluster, plaintext_address: str | None, sizes: Sizes) -> dict[str, Any]:
    security = client_security(secure)
    assert security is not None
    broker, kafka = secure.broker_address(1), secure.kafka_address(1)
    kafka_runs = [kafka_handshakes_s(kafka, security) for _ in range(sizes.handshakes + 1)][1:]
    figures = {
        "grpc_tls_channel_ms": _timed(
            sizes.handshakes, lambda: grpc_channel_ready_s(broker, security)
        ),
        "grpc_scram_exchange_ms": _timed(sizes.handshakes, lambda: grpc_scram_s(broker, security)),
        "kafka_tls_ms": _ms_summary([tls for tls, _ in kafka_runs]),
        "kafka_scram_ms": _ms_summary([sasl for _, sasl in kafka_runs]),
    }
    if plaintext_address is not None:
        figures["grpc_plaintext_channel_ms"] = _timed(
            sizes.handshakes, lambda: grpc_channel_ready_s(plaintext_address, None)
        )
    return figures


# -- 3. the authorizer -------------------------------------------------------------------------
def bench_acls(topic: str) -> list[AclBinding]:
    """ACLS ACLs: MATCHING_ACLS for User:ANONYMOUS (what the benchmark's produce needs, and more
    on the same topic and its prefix), the rest for 9,990 other principals and resources."""

    def acl(
        rtype: ResourceType, name: str, pattern: PatternType, who: str, op: AclOperation
    ) -> AclBinding:
        return AclBinding(rtype, name, pattern, who, "*", op, PermissionType.ALLOW)

    me, op, rt = "User:ANONYMOUS", AclOperation, ResourceType
    literal, prefixed, cluster = PatternType.LITERAL, PatternType.PREFIXED, "kafka-cluster"
    matching = [
        acl(rt.CLUSTER, cluster, literal, me, op.ALTER),
        acl(rt.CLUSTER, cluster, literal, me, op.CREATE),
        acl(rt.CLUSTER, cluster, literal, me, op.IDEMPOTENT_WRITE),
        acl(rt.TOPIC, topic, literal, me, op.WRITE),
        acl(rt.TOPIC, topic, literal, me, op.DESCRIBE),
        acl(rt.TOPIC, topic[:4], prefixed, me, op.READ),
        acl(rt.TOPIC, topic[:3], prefixed, me, op.DESCRIBE_CONFIGS),
        acl(rt.TOPIC, "*", literal, me, op.DESCRIBE),
        acl(rt.GROUP, "bench-", prefixed, me, op.READ),
        acl(rt.TRANSACTIONAL_ID, "bench-", prefixed, me, op.WRITE),
    ]
    assert len(matching) == MATCHING_ACLS
    others = []
    for n in range(ACLS - MATCHING_ACLS):
        kind = n % 3
        who = f"User:user-{n}"
        if kind == 0:  # other principals on the same topic
            others.append(
                acl(ResourceType.TOPIC, topic, PatternType.LITERAL, who, AclOperation.WRITE)
            )
        elif kind == 1:  # other topics, prefixed
            others.append(
                acl(ResourceType.TOPIC, f"app-{n}-", PatternType.PREFIXED, who, AclOperation.READ)
            )
        else:
            others.append(
                acl(ResourceType.GROUP, f"group-{n}", PatternType.LITERAL, who, AclOperation.READ)
            )
    return matching + others


def produce_latency_ms(cluster: LocalCluster, topic: str, sizes: Sizes) -> dict[str, float]:
    """One record at a time (acks=all, linger 0): each send's latency until acknowledged."""
    samples = []
    with Producer(cluster.bootstrap_servers, acks="all", linger_ms=0) as producer:
        producer.send(topic, b"warm-up").result(timeout=WAIT_S)
        for _ in range(sizes.latency_records):
            start = time.perf_counter()
            producer.send(topic, b"x" * 100).result(timeout=WAIT_S)
            samples.append(time.perf_counter() - start)
    return _ms_summary(samples)


def authorizer_cost(workdir: Path, sizes: Sizes, console: Console) -> dict[str, Any]:
    topic = "bench-latency"
    with cluster_in(workdir, console) as cluster:
        create_topic(cluster, None, topic)
        without = produce_latency_ms(cluster, topic, sizes)
    # allow.everyone.if.no.acl.found: the first CreateAcls (which grants ANONYMOUS ALTER on
    # the cluster) is allowed; from then on ANONYMOUS is authorized by its ACLs only
    overrides = {
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "allow.everyone.if.no.acl.found": "true",
    }
    with cluster_in(workdir, console, overrides=overrides) as cluster:
        acls = bench_acls(topic)
        with AdminClient(cluster.bootstrap_servers) as admin:
            for start in range(0, len(acls), ACL_BATCH):
                for binding, error in admin.create_acls(acls[start : start + ACL_BATCH]).items():
                    if error is not None:
                        raise RuntimeError(f"CreateAcls {binding}: {error}")
            wait_for(
                "every node's image holds the ACLs",
                lambda: len(admin.describe_acls()) >= ACLS,
                WAIT_S,
            )
        create_topic(cluster, None, topic)
        with_acls = produce_latency_ms(cluster, topic, sizes)
    return {
        "acls": ACLS, "matching_acls": MATCHING_ACLS,
        "no_authorizer_ms": without, "authorizer_ms": with_acls,
        "p99_cost_pct": round((with_acls["p99"] / without["p99"] - 1) * 100, 1),
        "p50_cost_pct": round((with_acls["p50"] / without["p50"] - 1) * 100, 1),
    }  # fmt: skip


# -- 4. the Raft transport ---------------------------------------------------------------------
def raft_encryption(sizes: Sizes) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "tests.metadata_quorum.raft_node", "bench", "--encryption",
        "--json", "--count", str(sizes.raft_commits), "--hosts", RAFT_HOSTS,
    ]  # fmt: skip
    if sizes.raft_latency_samples is not None:
        argv += ["--latency-samples", str(sizes.raft_latency_samples)]
    done = subprocess.run(
        argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=WAIT_S * 4, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    plain, encrypted, tls = figures["fsync"], figures["encrypted"], figures["tls"]
    with tempfile.TemporaryDirectory(prefix="raft-transport-") as directory:
        per_message = raft_transport.measure(Path(directory), sizes.transport_loop_s)
    return {
        "plaintext": plain,
        "encrypted": encrypted,
        "tls": tls,
        "commits_cost_pct": round(
            (1 - encrypted["commits_per_s"] / plain["commits_per_s"]) * 100, 1
        ),
        "tls_commits_cost_pct": round((1 - tls["commits_per_s"] / plain["commits_per_s"]) * 100, 1),
        "per_message_us": per_message,
    }


# -- the run -----------------------------------------------------------------------------------
def run_benchmark(workdir: Path, sizes: Sizes, console: Console) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "record_bytes": RECORD_BYTES,
        "nodes": NODES,
        "partitions": PARTITIONS,
    }
    with cluster_in(workdir, console) as plaintext:
        figures["plaintext"] = throughput(plaintext, sizes)
        plaintext_address = plaintext.broker_address(1)
        with cluster_in(workdir, console, secure=True) as secure:
            figures["tls_scram"] = throughput(secure, sizes)
            console.log("handshakes")
            figures["handshakes"] = handshakes(secure, plaintext_address, sizes)
    plain, tls = figures["plaintext"], figures["tls_scram"]
    for kind in ("produce", "consume"):
        key = f"{kind}_records_per_s"
        figures[f"tls_{kind}_cost_pct"] = round((1 - tls[key] / plain[key]) * 100, 1)
    console.log(f"the authorizer with {ACLS:,} ACLs")
    figures["authorizer"] = authorizer_cost(workdir, sizes, console)
    console.log("the Raft transport")
    figures["raft"] = raft_encryption(sizes)
    return figures


def print_report(console: Console, figures: dict[str, Any]) -> None:
    table = Table("figure", "plaintext", "secure", "cost", title="security")
    plain, tls = figures["plaintext"], figures["tls_scram"]
    for kind in ("produce", "consume"):
        key = f"{kind}_records_per_s"
        table.add_row(
            f"{kind} records/s (TLS + SCRAM)", f"{plain[key]:,.0f}", f"{tls[key]:,.0f}",
            f"{figures[f'tls_{kind}_cost_pct']}% (target <= {TLS_PRODUCE_COST_TARGET_PCT}%)"
            if kind == "produce" else f"{figures[f'tls_{kind}_cost_pct']}%",
        )  # fmt: skip
    auth = figures["authorizer"]
    table.add_row(
        f"produce p50 / p99 ms ({auth['acls']:,} ACLs)",
        f"{auth['no_authorizer_ms']['p50']} / {auth['no_authorizer_ms']['p99']}",
        f"{auth['authorizer_ms']['p50']} / {auth['authorizer_ms']['p99']}",
        f"p99 {auth['p99_cost_pct']}% (target <= {AUTHORIZER_P99_TARGET_PCT}%)",
    )
    raft = figures["raft"]
    table.add_row(
        "Raft commits/s (encrypted)", f"{raft['plaintext']['commits_per_s']:,.0f}",
        f"{raft['encrypted']['commits_per_s']:,.0f}", f"{raft['commits_cost_pct']}%",
    )  # fmt: skip
    table.add_row(
        "Raft commit p50 ms", f"{raft['plaintext']['commit_latency_p50_ms']}",
        f"{raft['encrypted']['commit_latency_p50_ms']}", "",
    )  # fmt: skip
    table.add_row(
        "Raft commits/s (TLS)", f"{raft['plaintext']['commits_per_s']:,.0f}",
        f"{raft['tls']['commits_per_s']:,.0f}", f"{raft['tls_commits_cost_pct']}%",
    )  # fmt: skip
    table.add_row(
        "Raft commit p50 ms (TLS)", f"{raft['plaintext']['commit_latency_p50_ms']}",
        f"{raft['tls']['commit_latency_p50_ms']}", "",
    )  # fmt: skip
    console.print(table)
    shakes = Table("handshake", "p50 ms", "p99 ms", title="new connections")
    for name, summary in figures["handshakes"].items():
        shakes.add_row(name.removesuffix("_ms"), f"{summary['p50']}", f"{summary['p99']}")
    console.print(shakes)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through the clusters' finally: nodes stopped by pid


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)

    def figures(workdir: Path, quick: bool, progress: Console) -> dict[str, Any]:
        return run_benchmark(workdir, QUICK if quick else FULL, progress)

    run: Callable[[Path, bool, Console], dict[str, Any]] = figures
    return bench_main(argv, __doc__.splitlines()[0], "security", run, print_report)


if __name__ == "__main__":
    sys.exit(main())
