"""The KAFKA listener's TLS and SASL against Kafka's own clients on real clusters: a 3-node
SASL_SSL cluster (127.0.0.27-29, connections.max.reauth.ms 4 s) and a 1-node SSL cluster that
requires client certificates (127.0.0.41). confluent-kafka, kafka-python and kcat produce and
consume with SCRAM-SHA-256/512 and with a client certificate; wrong passwords, unknown users,
PLAIN with a wrong password, a session that expires without re-authentication, a plaintext
client on the TLS port, a certificate from another CA and garbage (hypothesis) each cost only
their own connection: the broker keeps serving a good client, and failures are audited."""

from __future__ import annotations

import contextlib
import io
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaException
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, KafkaProducer
from kafka import errors as kafka_errors
from kio.serial import entity_reader, entity_writer

from dataplane.client import AdminClient
from dataplane.client.admin import UserScramCredentialUpsertion
from dataplane.kafka import codec as kc
from dataplane.tools.certificates import CertFiles, make_ca, make_cert
from dataplane.tools.local_cluster import LocalCluster, wait_for
from metadata_quorum.security.scram import ScramClient, ScramMechanism, plain_message
from tests.dataplane.cluster_support import RANGES, create_topic, running_cluster

pytestmark = [pytest.mark.timeout(400), pytest.mark.xdist_group("kafka-security")]
KCAT = shutil.which("kcat")
REAUTH_MS = 4000
USERS = {"alice": "alice-secret", "bob": "bob-secret"}
SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512


@dataclass(frozen=True)
class Pki:
    ca: CertFiles
    broker: Path  # every test broker's keystore (its IP SANs cover both clusters)
    client: Path  # CN=client-1, signed by the CA
    stranger: Path  # CN=stranger, signed by another CA


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory)
    hosts = [RANGES["kafka_security"] + n for n in range(3)] + [RANGES["kafka_security_mtls"]]
    broker = make_cert(ca, directory, "broker", ips=[f"127.0.0.{h}" for h in hosts])
    client = make_cert(ca, directory, "client-1", server=False)
    other = make_ca(directory / "other", "other-ca")
    stranger = make_cert(other, directory / "other", "stranger", server=False)
    return Pki(ca, broker, client, stranger)


def create_users(cluster: LocalCluster) -> None:
    """SCRAM credentials for USERS (both mechanisms) through the AdminClient's
    AlterUserScramCredentials, as `raftlog user set-password` makes them (KIP-554: the salted
    password travels, never the password; one change per user per request, as Kafka requires);
    then wait until every broker's image holds them."""
    with AdminClient(cluster.bootstrap_servers) as admin:
        for mechanism in (SHA256, SHA512):
            results = admin.alter_user_scram_credentials(
                [
                    UserScramCredentialUpsertion(user, mechanism, password)
                    for user, password in USERS.items()
                ]
            )
            assert results == dict.fromkeys(USERS), results
    wait_for(
        "the credentials on every broker",
        lambda: all(_scram_works(cluster, spec.node_id, "bob") for spec in cluster.specs),
        timeout_s=30,
    )


@pytest.fixture(scope="module")
def sasl_cluster(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[LocalCluster]:
    overrides: dict[str, str | int] = {
        "listener.security.protocol.map": "KAFKA:SASL_SSL",
        "ssl.keystore.location": str(pki.broker),
        "ssl.truststore.location": str(pki.ca.cert),
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "connections.max.reauth.ms": REAUTH_MS,
    }
    root = tmp_path_factory.mktemp("kafka-sasl")
    with running_cluster(root, "kafka_security", overrides) as running:
        create_users(running)
        yield running


@pytest.fixture(scope="module")
def mtls_cluster(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[LocalCluster]:
    overrides: dict[str, str | int] = {
        "listener.security.protocol.map": "KAFKA:SSL",
        "ssl.keystore.location": str(pki.broker),
        "ssl.truststore.location": str(pki.ca.cert),
        "ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/L,DEFAULT",
    }
    root = tmp_path_factory.mktemp("kafka-mtls")
    with running_cluster(root, "kafka_security_mtls", overrides, nodes=1) as running:
        yield running


def servers(cluster: LocalCluster) -> str:
    return ",".join(cluster.kafka_bootstrap_servers)


def rd_sasl(cluster: LocalCluster, pki: Pki, mechanism: str, user: str = "alice",
            password: str | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "bootstrap.servers": servers(cluster), "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(pki.ca.cert), "sasl.mechanism": mechanism,
        "sasl.username": user, "sasl.password": USERS.get(user, "") if password is None
        else password,
    }  # fmt: skip


def rd_round_trip(config: dict[str, Any], topic: str, count: int) -> list[bytes]:
    """Produce `count` values with librdkafka, consume them back from the beginning."""
    producer = RdProducer({**config, "acks": "all", "enable.idempotence": True})
    errors: list[object] = []
    for n in range(count):
        producer.produce(topic, value=f"{topic}-{n}".encode(),
                         on_delivery=lambda e, _m: errors.extend([e] if e else []))  # fmt: skip
    assert producer.flush(60) == 0 and errors == []
    consumer = RdConsumer({**config, "group.id": f"{topic}-reader", "enable.auto.commit": False})
    try:
        consumer.assign([RdTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)])
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value() or b"")
        return sorted(values)
    finally:
        consumer.close()


def expected(topic: str, count: int) -> list[bytes]:
    return sorted(f"{topic}-{n}".encode() for n in range(count))


# -- SASL_SSL with Kafka's clients ----------------------------------------------------------------
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_librdkafka_produces_and_consumes_over_sasl_ssl(
    sasl_cluster: LocalCluster, pki: Pki, mechanism: str
) -> None:
    topic = f"rd-{mechanism.lower()}"
    create_topic(sasl_cluster, topic, 3)
    config = rd_sasl(sasl_cluster, pki, mechanism)
    assert rd_round_trip(config, topic, 300) == expected(topic, 300)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_produces_and_consumes_over_sasl_ssl(
    sasl_cluster: LocalCluster, pki: Pki, mechanism: str
) -> None:
    topic = f"kp-{mechanism.lower()}"
    create_topic(sasl_cluster, topic, 3)
    common: dict[str, Any] = {
        "bootstrap_servers": sasl_cluster.kafka_bootstrap_servers,
        "security_protocol": "SASL_SSL", "ssl_cafile": str(pki.ca.cert),
        "sasl_mechanism": mechanism, "sasl_plain_username": "bob",
        "sasl_plain_password": USERS["bob"],
    }  # fmt: skip
    producer = KafkaProducer(acks="all", **common)
    try:
        for n in range(200):
            producer.send(topic, f"{topic}-{n}".encode())
        producer.flush(60)
    finally:
        producer.close()
    consumer = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=20_000,
                             **common)  # fmt: skip
    try:
        values = []
        for message in consumer:
            values.append(message.value)
            if len(values) == 200:
                break
    finally:
        consumer.close()
    assert sorted(values) == expected(topic, 200)


def test_kcat_produces_and_consumes_over_sasl_ssl(sasl_cluster: LocalCluster, pki: Pki) -> None:
    assert KCAT is not None, "kcat is missing: make test installs it (apt-get install kcat)"
    create_topic(sasl_cluster, "kcat-sasl", 3)
    options = [
        "-b", servers(sasl_cluster), "-X", "security.protocol=SASL_SSL",
        "-X", f"ssl.ca.location={pki.ca.cert}", "-X", "sasl.mechanism=SCRAM-SHA-512",
        "-X", "sasl.username=alice", "-X", f"sasl.password={USERS['alice']}",
    ]  # fmt: skip
    lines = "".join(f"kcat-sasl-{n}\n" for n in range(100))
    subprocess.run([KCAT, *options, "-P", "-t", "kcat-sasl"], input=lines, text=True,
                   timeout=60, check=True)  # fmt: skip
    # each record with its partition and offset, and librdkafka's fetch log: a record given
    # twice (once in a CI run: 99 of 100, while the log held each once) says at which offsets
    consume = subprocess.run([KCAT, *options, "-d", "fetch,topic", "-C", "-t", "kcat-sasl", "-o",
                              "beginning", "-e", "-q", "-f", "%p %o %s\\n"], capture_output=True,
                             text=True, timeout=60, check=True)  # fmt: skip
    delivered = [line.split() for line in consume.stdout.splitlines()]
    assert sorted(value for _, _, value in delivered) == sorted(
        f"kcat-sasl-{n}" for n in range(100)
    ), f"delivered (partition, offset): {[(p, o) for p, o, _ in delivered]}\n{consume.stderr}"


def test_librdkafka_reauthenticates_across_several_session_lifetimes(
    sasl_cluster: LocalCluster, pki: Pki
) -> None:
    create_topic(sasl_cluster, "reauth", 3)
    producer = RdProducer({**rd_sasl(sasl_cluster, pki, "SCRAM-SHA-256"), "acks": "all"})
    errors: list[object] = []
    delivered = 0
    start = time.monotonic()
    while time.monotonic() - start < 3.5 * REAUTH_MS / 1000:  # more than three lifetimes
        producer.produce("reauth", value=b"x",
                         on_delivery=lambda e, _m: errors.extend([e] if e else []))  # fmt: skip
        assert producer.flush(30) == 0
        delivered += 1
        time.sleep(0.2)  # pacing the load, not synchronisation
    assert errors == [] and delivered > 10
    logs = "".join(spec.log_path.read_text() for spec in sasl_cluster.specs)
    assert "expired" not in logs, "librdkafka re-authenticated before its sessions ended"


# -- denials --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "mechanism, user, password",
    [
        ("SCRAM-SHA-256", "alice", "wrong"),
        ("SCRAM-SHA-512", "mallory", "whatever"),  # an unknown user
        ("PLAIN", "alice", "wrong"),
    ],
)
def test_bad_credentials_are_refused_and_audited(
    sasl_cluster: LocalCluster, pki: Pki, mechanism: str, user: str, password: str
) -> None:
    config = rd_sasl(sasl_cluster, pki, mechanism, user, password)
    # librdkafka retries a refused authentication until the message times out (1 s here):
    # the record is never delivered, and the consumer's metadata request never answered
    producer = RdProducer({**config, "message.timeout.ms": 1000})
    failures: list[Any] = []
    producer.produce("refused", value=b"x",
                     on_delivery=lambda e, _m: failures.append(e))  # fmt: skip
    producer.flush(20)
    assert failures and failures[0] is not None  # never delivered
    with pytest.raises(KafkaException):  # librdkafka reports a transport failure
        RdConsumer({**config, "group.id": "g"}).list_topics(timeout=3)
    audit = "".join(spec.log_path.read_text() for spec in sasl_cluster.specs)
    assert "AUTHENTICATION_FAILED address=127.0.0." in audit
    assert f"mechanism={mechanism} user={user!r}" in audit
    assert_serves_a_good_client(sasl_cluster)


def test_plain_with_the_right_password_is_accepted(sasl_cluster: LocalCluster, pki: Pki) -> None:
    create_topic(sasl_cluster, "plain", 3)
    assert rd_round_trip(rd_sasl(sasl_cluster, pki, "PLAIN", "bob"), "plain", 20) == expected(
        "plain", 20
    )


def test_kafka_python_with_a_wrong_password_gets_an_authentication_error(
    sasl_cluster: LocalCluster, pki: Pki
) -> None:
    # kafka-python 3 retries a failed authentication until bootstrap_timeout_ms (30 s by
    # default, 3 s here), then raises KafkaTimeoutError; the audit line shows the broker
    # refused it
    with pytest.raises(kafka_errors.KafkaError):  # an authentication failure or no brokers
        producer = KafkaProducer(
            bootstrap_servers=sasl_cluster.kafka_bootstrap_servers[:1],
            security_protocol="SASL_SSL", ssl_cafile=str(pki.ca.cert),
            sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice",
            sasl_plain_password="wrong", max_block_ms=3_000, bootstrap_timeout_ms=3_000,
        )  # fmt: skip
        try:
            producer.send("refused", b"x").get(timeout=20)
        finally:
            producer.close()
    audited, log_path = "mechanism=SCRAM-SHA-512 user='alice'", sasl_cluster.specs[0].log_path
    wait_for(f"the audit line {audited}", lambda: audited in log_path.read_text())
    assert_serves_a_good_client(sasl_cluster)


def test_a_session_not_reauthenticated_is_closed_at_its_next_request(
    sasl_cluster: LocalCluster, pki: Pki
) -> None:
    with raw_sasl_connection(sasl_cluster, pki, "bob") as (connection, lifetime_ms):
        assert lifetime_ms == REAUTH_MS
        assert metadata_answered(connection)
        time.sleep(REAUTH_MS / 1000 + 0.5)  # let the session lifetime pass: the point of the test
        send(connection, kc.API_METADATA, 1, 9, {"topics": None})
        assert read_frame(connection) is None, "the expired session was served"
    assert_serves_a_good_client(sasl_cluster)


def test_a_plaintext_client_on_the_tls_port_is_closed(sasl_cluster: LocalCluster) -> None:
    host, port = sasl_cluster.kafka_address(1).split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        send(raw, kc.API_VERSIONS, 0, 1, {})
        assert read_frame(raw) is None  # the TLS handshake fails: closed without an answer
    assert_serves_a_good_client(sasl_cluster)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(garbage=st.binary(min_size=1, max_size=2000))
def test_tls_garbage_closes_only_its_connection(sasl_cluster: LocalCluster, garbage: bytes) -> None:
    host, port = sasl_cluster.kafka_address(2).split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        # the broker may close (a TLS alert) before all of it is sent or before our shutdown
        with contextlib.suppress(ConnectionError, OSError):
            raw.sendall(garbage)
            raw.shutdown(socket.SHUT_WR)  # no more: the broker must close within its deadline
        while _recv(raw):  # a TLS alert perhaps, then the close
            pass
    assert_serves_a_good_client(sasl_cluster, node_id=2)


SASL_INPUTS = st.lists(
    st.one_of(
        st.tuples(st.just(kc.API_SASL_HANDSHAKE), st.text(max_size=40)),
        st.tuples(st.just(kc.API_SASL_AUTHENTICATE), st.binary(max_size=3000)),
        st.tuples(st.just(kc.API_METADATA), st.none()),
        st.tuples(st.just(-1), st.binary(max_size=200)),  # a raw frame, perhaps truncated
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(inputs=SASL_INPUTS)
def test_sasl_garbage_on_a_live_listener_closes_only_its_connection(
    sasl_cluster: LocalCluster, pki: Pki, inputs: list[tuple[int, Any]]
) -> None:
    with tls_connection(sasl_cluster, pki, node_id=3) as connection:
        for n, (api_key, value) in enumerate(inputs):
            try:
                if api_key == -1:
                    connection.sendall(kc.SIZE.pack(len(value) + 4) + value)  # short by 4 bytes
                elif api_key == kc.API_SASL_HANDSHAKE:
                    send(connection, api_key, 1, n, {"mechanism": value})
                elif api_key == kc.API_SASL_AUTHENTICATE:
                    send(connection, api_key, 2, n, {"auth_bytes": value})
                else:
                    send(connection, api_key, 1, n, {"topics": None})
            except OSError:
                break  # closed already
        with contextlib.suppress(OSError):  # the broker may have closed it already
            connection.shutdown(socket.SHUT_WR)
        while _recv(connection):  # answers, then the close: never an authenticated session
            pass
    assert_serves_a_good_client(sasl_cluster, node_id=3)


# -- SSL with client certificates (mTLS) ----------------------------------------------------------
def test_librdkafka_and_kafka_python_with_a_client_certificate(
    mtls_cluster: LocalCluster, pki: Pki
) -> None:
    create_topic(mtls_cluster, "mtls", 3, rf=1)
    config = {
        "bootstrap.servers": servers(mtls_cluster), "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca.cert), "ssl.certificate.location": str(pki.client),
        "ssl.key.location": str(pki.client),
    }  # fmt: skip
    assert rd_round_trip(config, "mtls", 100) == expected("mtls", 100)
    producer = KafkaProducer(
        bootstrap_servers=mtls_cluster.kafka_bootstrap_servers, security_protocol="SSL",
        ssl_cafile=str(pki.ca.cert), ssl_certfile=str(pki.client), ssl_keyfile=str(pki.client),
    )  # fmt: skip
    try:
        producer.send("mtls", b"from-kafka-python").get(timeout=30)
    finally:
        producer.close()


def test_a_certificate_from_another_ca_is_refused(mtls_cluster: LocalCluster, pki: Pki) -> None:
    for certificate in (pki.stranger, None):  # another CA's, and none at all (auth required)
        context = ssl.create_default_context(cafile=str(pki.ca.cert))
        if certificate is not None:
            context.load_cert_chain(certificate)
        host, port = mtls_cluster.kafka_address(1).split(":")
        with socket.create_connection((host, int(port)), timeout=30) as raw:
            try:
                with context.wrap_socket(raw, server_hostname=host) as secured:
                    send(secured, kc.API_VERSIONS, 0, 1, {})
                    assert read_frame(secured) is None
            except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
                pass  # TLS 1.3 reports the refusal at the first read or write
    audit = mtls_cluster.specs[0].log_path.read_text()
    assert "AUTHENTICATION_FAILED" in audit and "mechanism=SSL" in audit
    config = {
        "bootstrap.servers": servers(mtls_cluster), "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca.cert), "ssl.certificate.location": str(pki.client),
        "ssl.key.location": str(pki.client),
    }  # fmt: skip
    consumer = RdConsumer({**config, "group.id": "after"})
    try:
        assert consumer.list_topics(timeout=20).brokers  # a good client is still served
    finally:
        consumer.close()


# -- raw Kafka protocol helpers ------------------------------------------------------------------
def _recv(connection: socket.socket) -> bytes:
    try:
        return connection.recv(65536)
    except OSError:
        return b""


def send(connection: socket.socket, api_key: int, version: int, correlation_id: int,
         data: dict[str, Any]) -> None:  # fmt: skip
    schema = kc.request_schema(api_key, version)
    header_schema = schema.__header_schema__
    buffer = io.BytesIO()
    header = kc.to_entity(header_schema, {
        "request_api_key": api_key, "request_api_version": version,
        "correlation_id": correlation_id, "client_id": "raw-test",
    })  # fmt: skip
    entity_writer(header_schema)(buffer, header)
    entity_writer(schema)(buffer, kc.to_entity(schema, _defaults(api_key, data)))
    body = buffer.getvalue()
    connection.sendall(kc.SIZE.pack(len(body)) + body)


def _defaults(api_key: int, data: dict[str, Any]) -> dict[str, Any]:
    if api_key == kc.API_METADATA:
        return {"allow_auto_topic_creation": False, "include_topic_authorized_operations": False,
                "include_cluster_authorized_operations": False, **data}  # fmt: skip
    return data


def read_frame(connection: socket.socket) -> bytes | None:
    """The next response frame, None when the broker closed the connection."""
    head = b""
    while len(head) < 4:
        chunk = _recv(connection)
        if not chunk:
            return None
        head += chunk
    (size,) = kc.SIZE.unpack(head[:4])
    frame = head[4:]
    while len(frame) < size:
        chunk = _recv(connection)
        if not chunk:
            return None
        frame += chunk
    return frame


def answer(connection: socket.socket, api_key: int, version: int) -> Any:
    frame = read_frame(connection)
    assert frame is not None, f"closed instead of answering api key {api_key}"
    schema = kc.response_schema(api_key, version)
    _, offset = entity_reader(schema.__header_schema__)(frame, 0)
    body, _ = entity_reader(schema)(frame, offset)
    return body


class tls_connection:
    """A TLS connection to a broker's KAFKA listener (closed on exit)."""

    def __init__(self, cluster: LocalCluster, pki: Pki, node_id: int = 1) -> None:
        host, port = cluster.kafka_address(node_id).split(":")
        context = ssl.create_default_context(cafile=str(pki.ca.cert))
        self.connection = context.wrap_socket(
            socket.create_connection((host, int(port)), timeout=30), server_hostname=host
        )

    def __enter__(self) -> ssl.SSLSocket:
        return self.connection

    def __exit__(self, *exc: object) -> None:
        self.connection.close()


class raw_sasl_connection:
    """A SASL_SSL connection authenticated with SCRAM-SHA-512 by hand, which never
    re-authenticates: (the socket, the session lifetime the broker announced)."""

    def __init__(self, cluster: LocalCluster, pki: Pki, user: str, node_id: int = 1) -> None:
        self._tls = tls_connection(cluster, pki, node_id)
        connection = self._tls.connection
        send(connection, kc.API_SASL_HANDSHAKE, 1, 1, {"mechanism": "SCRAM-SHA-512"})
        assert answer(connection, kc.API_SASL_HANDSHAKE, 1).error_code == 0
        client = ScramClient(SHA512, user, USERS[user], "rawclientnonce")
        send(connection, kc.API_SASL_AUTHENTICATE, 2, 2, {"auth_bytes": client.first()})
        first = answer(connection, kc.API_SASL_AUTHENTICATE, 2)
        send(connection, kc.API_SASL_AUTHENTICATE, 2, 3,
             {"auth_bytes": client.final(first.auth_bytes)})  # fmt: skip
        final = answer(connection, kc.API_SASL_AUTHENTICATE, 2)
        assert final.error_code == 0, final.error_message
        client.verify(final.auth_bytes)
        self.lifetime_ms = int(final.session_lifetime.total_seconds() * 1000)

    def __enter__(self) -> tuple[ssl.SSLSocket, int]:
        return self._tls.connection, self.lifetime_ms

    def __exit__(self, *exc: object) -> None:
        self._tls.connection.close()


def metadata_answered(connection: socket.socket) -> bool:
    send(connection, kc.API_METADATA, 1, 8, {"topics": None})
    return bool(answer(connection, kc.API_METADATA, 1).brokers)


def _scram_works(cluster: LocalCluster, node_id: int, user: str) -> bool:
    pki_ca = cluster.overrides["ssl.truststore.location"]
    host, port = cluster.kafka_address(node_id).split(":")
    context = ssl.create_default_context(cafile=str(pki_ca))
    with context.wrap_socket(
        socket.create_connection((host, int(port)), timeout=30), server_hostname=host
    ) as connection:
        send(connection, kc.API_SASL_HANDSHAKE, 1, 1, {"mechanism": "PLAIN"})
        if answer(connection, kc.API_SASL_HANDSHAKE, 1).error_code != 0:
            return False
        send(connection, kc.API_SASL_AUTHENTICATE, 0, 2,
             {"auth_bytes": plain_message(user, USERS[user])})  # fmt: skip
        frame = read_frame(connection)
        if frame is None:
            return False
        schema = kc.response_schema(kc.API_SASL_AUTHENTICATE, 0)
        _, offset = entity_reader(schema.__header_schema__)(frame, 0)
        return int(entity_reader(schema)(frame, offset)[0].error_code) == 0


def assert_serves_a_good_client(cluster: LocalCluster, node_id: int = 1) -> None:
    """The listener still authenticates and serves a well-behaved client."""
    assert _scram_works(cluster, node_id, "alice")
