"""A rogue node against a secure 3-node cluster (127.0.0.146-148; the rogue controller on .149,
.150 is tests/dataplane/broker/test_metrics_server.py's): it tries to register as a broker,
follow the metadata, fetch as a replica and join the Raft quorum, and is refused by each layer.

- **Certificates from another CA**, even one naming a node (CN=node-4, a super user's name): the
  CONTROLLER and BROKER listeners are SASL_SSL with ``ssl.client.auth=requested``, so TLS asks
  for no certificate (grpcio cannot ask for an optional one) and the rogue proves it with
  RAFTLOG-NODE-CERT, which checks the chain against the truststore: SASL_AUTHENTICATION_FAILED
  before any RPC runs. Where TLS does ask (METRICS requires a certificate in the secure cluster)
  the handshake fails.
- **A certificate from the cluster's CA** whose principal (User:mallory) is neither a super user
  nor granted CLUSTER_ACTION: authenticated, then refused by the authorizer: RegisterBroker
  CLUSTER_AUTHORIZATION_FAILED, FetchMetadata PERMISSION_DENIED, a replica's Fetch
  TOPIC_AUTHORIZATION_FAILED on every partition, nothing read.
- **The Raft transport** (TLS in a secure cluster: its CONTROLLER listener is SASL_SSL): a
  controller process that lists itself among the cluster's voters and dials them over TLS with
  mallory's certificate (the cluster's CA, its own IP as SAN: only the principal gives it away),
  with a certificate of another CA (CN=node-4), and speaking the secret's encryption instead.
  Each voter refuses the connection before it is heard, saying why (not a node principal, an
  untrusted certificate, not TLS): no vote of it is counted, no term moves, it never learns a
  leader (tests/metadata_quorum/test_raft_tls.py shows the quorum side in detail).

Every refusal is a line in the refusing node's log (``raftlog.audit``, or the Raft refusal), and
the cluster is unaffected: the same leader and term, produce and consume keep working, and the
metadata names no broker 4.
"""

from __future__ import annotations

import re
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from dataplane.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from dataplane.server.config import NodeConfig
from dataplane.tools.certificates import make_ca, make_cert
from dataplane.tools.entry import COMMAND
from dataplane.tools.local_cluster import (
    LOCAL_DEFAULTS,
    LocalCluster,
    owned_launcher,
    pick_cluster_port,
    wait_for,
)
from metadata_quorum.security.channels import ClientSecurity, open_channel
from metadata_quorum.security.node_cert import NODE_CERT_MECHANISM
from protos import broker_pb2 as pb
from protos import broker_pb2_grpc as pb_grpc
from protos import controller_pb2 as cpb
from protos import controller_pb2_grpc as cpb_grpc
from protos import metadata_pb2 as mpb
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.cluster_support import RANGES, running_cluster

pytestmark = [pytest.mark.timeout(400), pytest.mark.xdist_group("rogue_node")]

ROGUE_HOST = f"127.0.0.{RANGES['rogue_node'] + 3}"
ROGUE_ID = 4
TOPIC = "guarded"
WAIT_S = 60.0
RPC_TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("rogue") / "cluster"
    with running_cluster(root, "rogue_node", secure=True) as running:
        with AdminClient(running.bootstrap_servers, security=running.admin_security) as admin:
            assert admin.create_topics([NewTopic(TOPIC, 3, 3)])[TOPIC] is None
        _produce(running, [b"before-the-rogue"])
        yield running


@pytest.fixture(scope="module")
def rogue_keys(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """mallory: the cluster's CA, not a super user; stranger: CN=node-4 from another CA."""
    directory = tmp_path_factory.mktemp("rogue-keys")
    other = make_ca(directory / "other", name="other-ca")
    return {
        "mallory": make_cert(cluster.secrets.ca, directory, "mallory", ips=(ROGUE_HOST,)),
        "stranger": make_cert(other, directory / "other", f"node-{ROGUE_ID}", ips=(ROGUE_HOST,)),
    }


def _by_certificate(cluster: LocalCluster, keystore: Path) -> ClientSecurity:
    """What a node uses on SASL_SSL gRPC listeners: TLS, then RAFTLOG-NODE-CERT."""
    return ClientSecurity(
        security_protocol="SASL_SSL",
        ssl_ca_location=cluster.secrets.truststore,
        ssl_certificate_location=keystore,
        ssl_key_location=keystore,
        sasl_mechanism=NODE_CERT_MECHANISM,
    )


def _produce(cluster: LocalCluster, values: list[bytes]) -> None:
    with Producer(cluster.bootstrap_servers, acks="all", security=cluster.client_settings) as p:
        futures = [p.send(TOPIC, value, partition=0) for value in values]
        p.flush(60)
        assert all(f.result(60).offset >= 0 for f in futures)


def _consume(cluster: LocalCluster, wanted: bytes) -> None:
    with Consumer(
        cluster.bootstrap_servers, auto_offset_reset="earliest", security=cluster.client_settings
    ) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        seen: list[bytes | None] = []

        def consumed() -> bool | None:
            for records in consumer.poll(timeout_ms=500).values():
                seen.extend(r.value for r in records)
            return (wanted in seen) or None

        wait_for(f"{wanted!r} consumed", consumed, timeout_s=WAIT_S)


def _log(cluster: LocalCluster, node_id: int) -> str:
    return cluster.spec(node_id).log_path.read_text(errors="replace")


def _quorum(cluster: LocalCluster) -> cpb.DescribeQuorumResponse:
    client = cluster.client()
    try:
        return client.describe_quorum()
    finally:
        client.close()


def _register(channel: grpc.Channel, cluster: LocalCluster) -> cpb.RegisterBrokerResponse:
    """RegisterBroker as broker 4, with endpoints on the rogue's address."""
    request = cpb.RegisterBrokerRequest(
        broker_id=ROGUE_ID,
        incarnation_id=uuid.uuid4().hex,
        endpoints=[mpb.Endpoint(name="BROKER", host=ROGUE_HOST, port=cluster.port - 1)],
    )
    stub = cpb_grpc.ControllerServiceStub(channel)
    response: cpb.RegisterBrokerResponse = stub.RegisterBroker(request, timeout=RPC_TIMEOUT_S)
    return response


def _replica_fetch(channel: grpc.Channel) -> pb.FetchResponse:
    """A follower's Fetch (replica_id set) of every partition of the topic, as broker 2."""
    partitions = [
        pb.FetchPartition(
            partition=p, fetch_offset=0, last_fetched_epoch=-1, partition_max_bytes=1 << 20
        )
        for p in range(3)
    ]
    request = pb.FetchRequest(
        replica_id=2, broker_epoch=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
        topics=[pb.FetchTopic(name=TOPIC, partitions=partitions)],
    )  # fmt: skip
    response: pb.FetchResponse = pb_grpc.BrokerServiceStub(channel).Fetch(
        request, timeout=RPC_TIMEOUT_S
    )
    return response


def _broker_ids(cluster: LocalCluster) -> set[int]:
    client = cluster.client()
    try:
        described = client.call("DescribeCluster", cpb.DescribeClusterRequest())
    finally:
        client.close()
    return {b.broker_id for b in described.brokers}


def test_another_ca_is_refused_before_any_rpc(
    cluster: LocalCluster, rogue_keys: dict[str, Path]
) -> None:
    """CN=node-4 would be a super user, but its chain does not lead to the truststore: neither
    RegisterBroker on a controller nor a replica's Fetch on a broker gets to run."""
    security = _by_certificate(cluster, rogue_keys["stranger"])
    with open_channel(cluster.controller_addresses[0], security) as channel:
        registering = _refused(lambda: _register(channel, cluster))
    with open_channel(cluster.broker_address(2), security) as channel:
        fetching = _refused(lambda: _replica_fetch(channel))
    for refused in (registering, fetching):
        assert refused.error is ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "not trusted" in refused.message
    wait_for(
        "nodes 1 (CONTROLLER) and 2 (BROKER) audit the untrusted certificate",
        lambda: all(_untrusted_audited(_log(cluster, n)) for n in (1, 2)) or None,
        timeout_s=WAIT_S,
    )
    assert ROGUE_ID not in _broker_ids(cluster)


def _refused(call: Callable[[], object]) -> KafkaError:
    with pytest.raises(KafkaError) as refused:
        call()
    return refused.value


def _untrusted_audited(log: str) -> bool:
    return (
        re.search(
            rf"AUTHENTICATION FAILED user=CN=node-{ROGUE_ID} .* mechanism=RAFTLOG-NODE-CERT "
            rf"reason=certificate CN=node-{ROGUE_ID} not trusted",
            log,
        )
        is not None
    )


def test_the_right_ca_without_cluster_action_is_refused(
    cluster: LocalCluster, rogue_keys: dict[str, Path]
) -> None:
    """mallory authenticates (the cluster's CA signed her certificate) but holds no
    CLUSTER_ACTION: she can neither register, nor follow the metadata, nor fetch as a
    replica; each refusal is audited with her principal."""
    security = _by_certificate(cluster, rogue_keys["mallory"])
    controller = cluster.controller_addresses[0]
    with open_channel(controller, security) as channel:
        registered = _register(channel, cluster)
        assert registered.status.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code
        assert "CLUSTER_ACTION" in registered.status.error_message
        updates = cpb_grpc.ControllerServiceStub(channel).FetchMetadata(
            cpb.FetchMetadataRequest(from_offset=0, max_wait_ms=100), timeout=RPC_TIMEOUT_S
        )
        with pytest.raises(grpc.RpcError) as following:
            list(updates)
        assert following.value.code() is grpc.StatusCode.PERMISSION_DENIED
    isr_before = _isr(cluster)
    with open_channel(cluster.broker_address(1), security) as channel:
        fetched = _replica_fetch(channel)
    partitions = [p for t in fetched.topics for p in t.partitions]
    assert len(partitions) == 3
    for partition in partitions:
        assert partition.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
        assert not partition.records
    assert _isr(cluster) == isr_before  # the fake follower moved no replica state

    # node 1 is controller and broker: RegisterBroker, FetchMetadata and the Fetch, one line each
    def denials(listener: str) -> int:
        pattern = (
            rf"DENIED principal=User:mallory host=\S+ listener={listener} operation=CLUSTER_ACTION"
        )
        return len(re.findall(pattern, _log(cluster, 1)))

    wait_for(
        "node 1 audits the three refusals",
        lambda: (denials("CONTROLLER") >= 2 and denials("BROKER") >= 1) or None,
        timeout_s=WAIT_S,
    )
    assert ROGUE_ID not in _broker_ids(cluster)


def _isr(cluster: LocalCluster) -> list[tuple[int, ...]]:
    with AdminClient(cluster.bootstrap_servers, security=cluster.admin_security) as admin:
        described = admin.describe_topics([TOPIC])[TOPIC]
    return [tuple(sorted(p.isr)) for p in sorted(described.partitions, key=lambda p: p.partition)]


def test_metrics_refuse_a_certificate_from_another_ca(
    cluster: LocalCluster, rogue_keys: dict[str, Path]
) -> None:
    """METRICS:SSL with client certificates required: here TLS asks for the certificate, so a
    stranger's fails the handshake; the cluster's admin certificate scrapes."""
    url = f"https://{cluster.metrics_address(1)}/metrics"
    truststore = cluster.secrets.truststore

    def scrape(keystore: Path) -> str:
        context = ssl.create_default_context(cafile=truststore)
        context.load_cert_chain(keystore)
        with urllib.request.urlopen(url, timeout=RPC_TIMEOUT_S, context=context) as answer:
            return str(answer.read().decode())

    assert "raftlog_partitions" in scrape(cluster.secrets.admin_keystore)
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        scrape(rogue_keys["stranger"])
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError, OSError)):
        urllib.request.urlopen(f"http://{cluster.metrics_address(1)}/metrics", timeout=10)
    wait_for(
        "node 1 audits the refused METRICS handshakes",
        lambda: "listener=METRICS mechanism=SSL" in _log(cluster, 1) or None,
        timeout_s=WAIT_S,
    )


def _rogue_controller_config(
    cluster: LocalCluster, keystore: Path, directory: Path, raft: dict[str, object]
) -> tuple[NodeConfig, int]:
    """Controller 4 on ROGUE_HOST: the cluster's voters plus itself, the cluster's TLS settings
    (so its Raft transport is TLS too) with ``keystore``, and ``raft``'s settings over them."""
    port = pick_cluster_port([ROGUE_HOST])
    values: dict[str, object] = {
        **LOCAL_DEFAULTS,
        **cluster.secrets.node_settings(ROGUE_ID, range(1, 10)),
        "node.id": ROGUE_ID,
        "process.roles": "controller",
        "controller.quorum.voters": f"{cluster.voters},{ROGUE_ID}@{ROGUE_HOST}:{port}",
        "listeners": f"CONTROLLER://{ROGUE_HOST}:{port}",
        "log.dirs": str(directory / "data"),
        "ssl.keystore.location": str(keystore),
        **raft,
    }
    return NodeConfig.parse(values), port


def _raft_refusals(cluster: LocalCluster, node_id: int) -> int:
    return _log(cluster, node_id).count("refused a connection from ")


def _secret_instead(directory: Path) -> dict[str, object]:
    secret = directory / "raft.secret"
    secret.write_text("not-the-quorum-secret-" + uuid.uuid4().hex + "\n")
    return {
        "controller.quorum.raft.transport.security": "encryption",
        "controller.quorum.raft.secret.file": str(secret),
    }


# the rogue's keystore (rogue_keys), its Raft settings, and the reason each voter logs
ROGUE_CONTROLLERS = {
    "mallory": ("mallory", None, r"User:mallory \(certificate CN=mallory\) is not a node"),
    "another-ca": ("stranger", None, "CERTIFICATE_VERIFY_FAILED"),
    "secret-not-tls": ("mallory", _secret_instead, "WRONG_VERSION_NUMBER"),
}


@pytest.mark.parametrize("rogue_kind", list(ROGUE_CONTROLLERS))
def test_a_rogue_controller_gets_no_vote(
    cluster: LocalCluster, rogue_keys: dict[str, Path], tmp_path: Path, rogue_kind: str
) -> None:
    """mallory's certificate is the cluster CA's and names the rogue's IP, so the handshake
    and the host check pass; its principal, User:mallory, is not a super user, which a Raft
    peer must be. Another CA's certificate fails the handshake; the secret's encryption is not
    TLS. Every voter logs the refusal with its reason; the quorum is as it was."""
    key, raft_settings, reason = ROGUE_CONTROLLERS[rogue_kind]
    before = _quorum(cluster)
    assert before.leader_id in (1, 2, 3) and before.has_quorum
    logged = {n: len(_log(cluster, n)) for n in (1, 2, 3)}
    raft = raft_settings(tmp_path) if raft_settings is not None else {}
    config, port = _rogue_controller_config(cluster, rogue_keys[key], tmp_path, raft)
    config_path = tmp_path / "node.toml"
    config_path.write_text(config.to_toml())
    argv = [*COMMAND, "node", "--config", str(config_path)]
    rogue = owned_launcher(ROGUE_ID, argv, tmp_path / "node.log")

    def refused_by(node_id: int) -> bool:
        lines = _log(cluster, node_id)[logged[node_id] :].splitlines()
        return any(
            "refused a connection from" in line and re.search(reason, line) for line in lines
        )

    try:
        wait_for(
            f"every voter logs the rogue's refused Raft connections ({reason})",
            lambda: all(refused_by(n) for n in (1, 2, 3)) or None,
            timeout_s=WAIT_S,
        )
        # it campaigns meanwhile (a voter of its own configuration); no one hears it
        _produce(cluster, [f"with-the-rogue-{n}".encode() for n in range(20)])
        assert rogue.poll() is None, (tmp_path / "node.log").read_text()[-3000:]
        after = _quorum(cluster)
        assert (after.leader_id, after.term) == (before.leader_id, before.term)
        assert sorted(v.node_id for v in after.voters) == [1, 2, 3]
        if key == "mallory":  # the admin trusts its CONTROLLER listener: the rogue's own view
            client = cluster.client()
            try:
                seen = client.describe_quorum(f"{ROGUE_HOST}:{port}")
            finally:
                client.close()
            assert seen.leader_id == -1 and not seen.has_quorum, seen
    finally:
        rogue.kill()
        rogue.wait(timeout=30)


def test_the_cluster_is_unaffected(cluster: LocalCluster) -> None:
    """After all of it: produce and consume work, the leader is one of the three, the quorum
    has its three voters, and the metadata names no broker 4."""
    _produce(cluster, [b"after-the-rogue"])
    _consume(cluster, b"after-the-rogue")
    quorum = _quorum(cluster)
    assert quorum.leader_id in (1, 2, 3) and quorum.has_quorum
    assert sorted(v.node_id for v in quorum.voters) == [1, 2, 3]
    assert _broker_ids(cluster) == {1, 2, 3}
