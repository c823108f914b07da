"""The gRPC listeners secured, on a real 3-node cluster (127.0.0.6-8): CONTROLLER:SSL and
BROKER:SASL_SSL with ``ssl.client.auth=requested`` (the secure local cluster's settings, without
its authorizer: authorization is tested elsewhere). grpcio asks for no certificate in TLS then,
so the nodes prove theirs with RAFTLOG-NODE-CERT: brokers register with the controllers,
replicate from each other and write to the internal topics only if that works. The admin
creates a SCRAM user by certificate; our clients then produce and consume with SCRAM-SHA-512."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from dataplane.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from dataplane.client._admin_security import UserScramCredentialUpsertion
from dataplane.tools.local_cluster import LocalCluster, wait_for
from metadata_quorum.security.channels import ClientSecurity
from metadata_quorum.security.scram import ScramMechanism
from protos import broker_pb2 as pb
from protos import broker_pb2_grpc as pb_grpc
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.cluster_support import running_cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("secure-grpc")]

TOPIC = "secured"
FAIL_FAST_S = 20.0  # a refused password is not retried until a timeout (30 s requests)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides: dict[str, str | int] = {"authorizer.class.name": "", "super.users": ""}
    root = tmp_path_factory.mktemp("secure-grpc")
    with running_cluster(root, "secure_grpc", overrides, secure=True) as running:
        yield running


def _alice(cluster: LocalCluster, password: str = "alice-secret") -> ClientSecurity:
    return ClientSecurity(
        security_protocol="SASL_SSL",
        ssl_ca_location=cluster.secrets.truststore,
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="alice",
        sasl_password=password,
    )


def _admin(cluster: LocalCluster) -> AdminClient:
    return AdminClient(cluster.bootstrap_servers, security=cluster.admin_security)


def test_the_cluster_forms_and_replicates_over_tls(cluster: LocalCluster) -> None:
    """up() returned: every broker registered and was unfenced over CONTROLLER:SSL, and the
    admin's SCRAM user was written by certificate. A topic of RF 3 keeps all three in its ISR
    while acks=all writes go through: the followers fetch over BROKER:SASL_SSL."""
    with _admin(cluster) as admin:
        assert admin.create_topics([NewTopic(TOPIC, 3, 3)])[TOPIC] is None
        admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion("alice", ScramMechanism.SCRAM_SHA_512, "alice-secret")]
        )
    with Producer(cluster.bootstrap_servers, acks="all", security=cluster.client_settings) as p:
        futures = [p.send(TOPIC, f"v{i}".encode(), partition=i % 3) for i in range(30)]
        p.flush(60)
        assert all(f.result(60).offset >= 0 for f in futures)

    def full_isr() -> bool | None:
        with _admin(cluster) as admin:
            partitions = admin.describe_topics([TOPIC])[TOPIC].partitions
        return all(len(p.isr) == 3 for p in partitions) or None

    wait_for("ISR of 3 on every partition", full_isr, timeout_s=60)


def test_scram_clients_produce_and_consume(cluster: LocalCluster) -> None:
    with _admin(cluster) as admin:
        admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion("alice", ScramMechanism.SCRAM_SHA_512, "alice-secret")]
        )
        if TOPIC not in admin.list_topics():
            admin.create_topics([NewTopic(TOPIC, 3, 3)])
    with Producer(cluster.bootstrap_servers, acks="all", security=_alice(cluster)) as producer:
        sent = producer.send(TOPIC, b"from-alice", partition=0).result(60)
    with Consumer(
        cluster.bootstrap_servers, auto_offset_reset="earliest", security=_alice(cluster)
    ) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        seen: list[bytes | None] = []

        def consumed() -> bool | None:
            for records in consumer.poll(timeout_ms=500).values():
                seen.extend(r.value for r in records)
            return (b"from-alice" in seen) or None

        wait_for("alice's record", consumed, timeout_s=60)
    assert sent.offset >= 0


def test_a_wrong_password_fails_fast(cluster: LocalCluster) -> None:
    started = time.monotonic()
    with pytest.raises(KafkaError) as caught:
        AdminClient(cluster.bootstrap_servers, security=_alice(cluster, "wrong")).close()
    assert caught.value.error is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert not caught.value.error.retriable
    producer = Producer(cluster.bootstrap_servers, security=_alice(cluster, "wrong"))
    with producer, pytest.raises(KafkaError) as sending:
        producer.send(TOPIC, b"x", partition=0).result(60)
    assert sending.value.error is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert time.monotonic() - started < FAIL_FAST_S


def test_no_credentials_on_sasl_ssl_is_refused(cluster: LocalCluster) -> None:
    anonymous = ClientSecurity(security_protocol="SSL", ssl_ca_location=cluster.secrets.truststore)
    with pytest.raises(KafkaError) as caught:
        AdminClient(cluster.bootstrap_servers, security=anonymous).close()
    assert caught.value.error is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert "authenticate first" in caught.value.message


def test_a_plaintext_client_cannot_talk_to_the_tls_port(cluster: LocalCluster) -> None:
    address = cluster.broker_address(1)
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.BrokerServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Metadata(pb.MetadataRequest(), timeout=5)
    assert caught.value.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )
    with pytest.raises(KafkaError) as refused:
        AdminClient(cluster.bootstrap_servers, request_timeout_ms=5_000).close()
    assert refused.value.error is ErrorCode.NETWORK_EXCEPTION
