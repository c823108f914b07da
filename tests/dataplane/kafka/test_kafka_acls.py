"""Authorization end to end with authenticated principals (issue 28), judged by Kafka's own
clients: a secure 3-node cluster (127.0.0.138-140, ``running_cluster(..., secure=True)``: TLS,
SCRAM, the StandardAuthorizer, ``admin`` a super user) and a one-node cluster whose KAFKA
listener is SSL with client certificates required (127.0.0.168), since a SASL_SSL listener
takes its principal from SASL, as Kafka's does.

Users are made as a user would make them: alice with ``raftlog user set-password`` (and the
cluster's ``client.properties`` as ``--command-config``), bob and carol with confluent-kafka's
``alter_user_scram_credentials``; dave is a certificate (CN=dave) from the cluster's CA. ACLs are
made with ``raftlog acl add`` and with confluent-kafka's ``create_acls``:

- alice: READ on ``orders`` and on the group ``alice-group``;
- bob: WRITE on the PREFIXED ``orders-`` and on the transactional id ``bob-tx-ok``;
- carol: DENY WRITE on ``payroll``, DENY DESCRIBE on ``hidden``, ALLOW everything on ``*``;
- dave (mTLS): WRITE on ``dave-orders``.

confluent-kafka (librdkafka), kafka-python, kcat and our own client (over the BROKER listener)
then get Kafka's errors for what is not allowed, store nothing for it, and every refusal is a
``raftlog.audit`` DENIED line naming the principal and the resource.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import KafkaException
from confluent_kafka import Producer as RdProducer
from confluent_kafka.admin import AdminClient as RdAdminClient
from confluent_kafka.admin._acl import AclBinding as RdAclBinding
from confluent_kafka.admin._acl import AclOperation as RdOperation
from confluent_kafka.admin._acl import AclPermissionType as RdPermission
from confluent_kafka.admin._resource import ResourcePatternType as RdPattern
from confluent_kafka.admin._resource import ResourceType as RdResourceType
from confluent_kafka.admin._scram import ScramCredentialInfo as RdScramInfo
from confluent_kafka.admin._scram import ScramMechanism as RdScramMechanism
from confluent_kafka.admin._scram import UserScramCredentialAlteration as RdAlteration
from confluent_kafka.admin._scram import UserScramCredentialUpsertion as RdUpsertion
from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

from dataplane.client import AdminClient, Consumer, NewTopic, Producer
from dataplane.client.admin import AclBinding
from dataplane.tools.certificates import make_cert
from dataplane.tools.entry import COMMAND as RAFTLOG
from dataplane.tools.local_cluster import LocalCluster, wait_for
from metadata_quorum.security.acl import AclOperation, PatternType, PermissionType, ResourceType
from metadata_quorum.security.channels import ClientSecurity, open_channel
from protos import broker_pb2 as pb
from protos import broker_pb2_grpc as pb_grpc
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.cluster_support import RANGES, running_cluster

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("kafka-acls")]
KCAT = shutil.which("kcat")
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret"}
MECHANISMS = {"alice": "SCRAM-SHA-512", "bob": "SCRAM-SHA-256", "carol": "SCRAM-SHA-512"}
TOPICS = ("orders", "orders-eu", "ordersx", "payroll", "hidden", "shared")
SEEDED = 3  # records the admin writes to `orders` before the tests
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@dataclass(frozen=True)
class Secured:
    cluster: LocalCluster

    @property
    def kafka_servers(self) -> str:
        return ",".join(self.cluster.kafka_bootstrap_servers)

    def rd(self, user: str | None = None) -> dict[str, Any]:
        """librdkafka's settings as `user` (None: the admin) on the KAFKA listener."""
        settings = {"bootstrap.servers": self.kafka_servers, **self.cluster.client_settings}
        if user is not None:
            settings |= {"sasl.mechanism": MECHANISMS[user], "sasl.username": user,
                         "sasl.password": PASSWORDS[user]}  # fmt: skip
        return settings

    def ours(self, user: str) -> dict[str, str]:
        """Our client's settings (the BROKER listener) as `user`."""
        return {**self.cluster.client_settings, "sasl.mechanism": MECHANISMS[user],
                "sasl.username": user, "sasl.password": PASSWORDS[user]}  # fmt: skip

    def kafka_python(self, user: str) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.cluster.kafka_bootstrap_servers,
            "security_protocol": "SASL_SSL",
            "ssl_cafile": str(self.cluster.secrets.truststore),
            "sasl_mechanism": MECHANISMS[user], "sasl_plain_username": user,
            "sasl_plain_password": PASSWORDS[user],
        }  # fmt: skip

    def end_offset(self, topic: str) -> int:
        """The partition's end offset, as the admin reads it (ListOffsets)."""
        with Consumer(self.cluster.bootstrap_servers, security=self.cluster.client_settings) as c:
            return sum(c.end_offsets([(topic, 0)]).values())

    def audit(self) -> list[str]:
        return [
            line
            for spec in self.cluster.specs
            for line in spec.log_path.read_text().splitlines()
            if "raftlog.audit" in line
        ]


def cli(cluster: LocalCluster, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``raftlog --command-config client.properties ARGS``, as an operator runs it."""
    properties = str(cluster.secrets.client_properties)
    return subprocess.run(
        [*RAFTLOG, "--command-config", properties, *args,
         "--bootstrap-server", ",".join(cluster.bootstrap_servers)],
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}, input=stdin,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def visible_topics(
    cluster: LocalCluster, node_id: int, settings: dict[str, str]
) -> set[str] | None:
    """The topics node `node_id` lists to the principal of `settings` (gRPC Metadata, all
    topics), None while it cannot log in yet."""
    channel = open_channel(
        cluster.broker_address(node_id), ClientSecurity.from_properties(settings)
    )
    try:
        response = pb_grpc.BrokerServiceStub(channel).Metadata(
            pb.MetadataRequest(all_topics=True), timeout=10
        )
    except KafkaError:
        return None
    finally:
        channel.close()
    return {t.name for t in response.topics}


def rd_acl(
    principal: str, rtype: RdResourceType, name: str, op: RdOperation,
    pattern: RdPattern = RdPattern.LITERAL, permission: RdPermission = RdPermission.ALLOW,
) -> RdAclBinding:  # fmt: skip
    return RdAclBinding(rtype, name, pattern, principal, "*", op, permission)


def _results(futures: dict[Any, Any]) -> dict[Any, Any]:
    return {key: future.result(timeout=60) for key, future in futures.items()}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("kafka-acls") / "cluster"
    with running_cluster(root, "kafka_acls", secure=True) as cluster:
        setup_topics(cluster)
        setup_users(cluster)
        setup_acls(cluster)
        yield Secured(cluster)


def setup_topics(cluster: LocalCluster) -> None:
    """The topics (one partition each), and SEEDED records in `orders`, by the admin."""
    with AdminClient(cluster.bootstrap_servers, security=cluster.client_settings) as admin:
        created = admin.create_topics([NewTopic(t, 1, 3) for t in TOPICS])
        assert all(error is None for error in created.values()), created
    with Producer(cluster.bootstrap_servers, security=cluster.client_settings) as producer:
        for n in range(SEEDED):
            producer.send("orders", f"order-{n}".encode(), partition=0).result(timeout=60)
        for topic in TOPICS[1:]:
            producer.send(topic, b"seed", partition=0).result(timeout=60)


def setup_users(cluster: LocalCluster) -> None:
    """alice with our CLI (the password on standard input), bob and carol with confluent-kafka."""
    made = cli(cluster, "user", "set-password", "alice", "--password-file", "-",
               stdin=PASSWORDS["alice"] + "\n")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "set the SCRAM-SHA-512 credential of user alice" in made.stdout
    rd = RdAdminClient(Secured(cluster).rd())
    upsertions: list[RdAlteration] = [
        RdUpsertion(
            user,
            RdScramInfo(RdScramMechanism[MECHANISMS[user].replace("-", "_")], 4096),
            PASSWORDS[user].encode(),
        )
        for user in ("bob", "carol")
    ]
    assert _results(rd.alter_user_scram_credentials(upsertions)) == {"bob": None, "carol": None}


def setup_acls(cluster: LocalCluster) -> None:
    """alice's and bob's transactional id with the CLI, the rest with confluent-kafka; carol's
    ALLOW on ``*`` last, after her DENYs, so a broker that has it has them all (the metadata
    log's order): every broker lists `orders` to carol once every ACL reached it."""
    alice = cli(cluster, "acl", "add", "--allow-principal", "User:alice", "--operation", "Read",
                "--topic", "orders", "--group", "alice-group", "--json")  # fmt: skip
    assert alice.returncode == 0, alice.stderr
    bob_tx = cli(cluster, "acl", "add", "--allow-principal", "User:bob", "--operation", "Write",
                 "--transactional-id", "bob-tx-ok")  # fmt: skip
    assert bob_tx.returncode == 0, bob_tx.stderr
    rd = RdAdminClient(Secured(cluster).rd())
    first = [
        rd_acl("User:bob", RdResourceType.TOPIC, "orders-", RdOperation.WRITE, RdPattern.PREFIXED),
        rd_acl(
            "User:carol",
            RdResourceType.TOPIC,
            "payroll",
            RdOperation.WRITE,
            permission=RdPermission.DENY,
        ),
        rd_acl(
            "User:carol",
            RdResourceType.TOPIC,
            "hidden",
            RdOperation.DESCRIBE,
            permission=RdPermission.DENY,
        ),
    ]
    assert set(_results(rd.create_acls(first)).values()) == {None}
    everything = rd_acl("User:carol", RdResourceType.TOPIC, "*", RdOperation.ALL)
    assert _results(rd.create_acls([everything])) == {everything: None}
    carol = Secured(cluster).ours("carol")
    for spec in cluster.specs:
        wait_for(
            f"carol's ACLs on node {spec.node_id}",
            functools.partial(lists_orders, cluster, spec.node_id, carol),
            timeout_s=60,
        )


def lists_orders(cluster: LocalCluster, node_id: int, settings: dict[str, str]) -> bool:
    return "orders" in (visible_topics(cluster, node_id, settings) or ())


def denied(lines: list[str], principal: str, operation: str, resource: str) -> bool:
    pattern = re.compile(
        rf"DENIED principal={re.escape(principal)} host=\S+ listener=\S+ "
        rf"operation={operation} resource={re.escape(resource)}$"
    )
    return any(pattern.search(line) for line in lines)


def wait_denied(secured: Secured, principal: str, operation: str, resource: str) -> None:
    wait_for(
        f"the audit line of {principal} {operation} {resource}",
        lambda: denied(secured.audit(), principal, operation, resource),
        timeout_s=30,
    )


def rd_produce(settings: dict[str, Any], topic: str, value: bytes, **extra: Any) -> Any:
    """One record through librdkafka: its delivery error, or None when stored."""
    producer = RdProducer({**settings, "acks": "all", "message.timeout.ms": 30_000, **extra})
    reports: list[Any] = []
    producer.produce(topic, value, on_delivery=lambda error, _m: reports.append(error))
    assert producer.flush(60) == 0, "no delivery report"
    return reports[0]


# -- alice: READ, not WRITE ------------------------------------------------------------------------
def test_alice_may_read_orders_but_not_write_it(secured: Secured) -> None:
    before = secured.end_offset("orders")
    error = rd_produce(secured.rd("alice"), "orders", b"forged")
    assert error is not None and error.code() == RdKafkaError.TOPIC_AUTHORIZATION_FAILED, error
    producer = KafkaProducer(acks="all", retries=0, **secured.kafka_python("alice"))
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send("orders", b"forged too").get(timeout=30)
    finally:
        producer.close()
    assert secured.end_offset("orders") == before == SEEDED  # nothing stored
    wait_denied(secured, "User:alice", "WRITE", "TOPIC:orders")

    reader = {"group.id": "alice-group", "auto.offset.reset": "earliest"}
    consumer = RdConsumer({**secured.rd("alice"), **reader, "enable.auto.commit": False})
    try:
        consumer.subscribe(["orders"])
        values: list[bytes] = []

        def all_read() -> bool:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                values.append(message.value() or b"")
            return len(values) >= SEEDED

        wait_for("alice's records", all_read, timeout_s=60)
        consumer.commit(asynchronous=False)  # OffsetCommit: READ on the group and the topic
    finally:
        consumer.close()
    assert values == [f"order-{n}".encode() for n in range(SEEDED)]


def test_alice_may_not_use_another_group(secured: Secured) -> None:
    consumer = RdConsumer({**secured.rd("alice"), "group.id": "bobs-group",
                           "auto.offset.reset": "earliest"})  # fmt: skip
    try:
        consumer.subscribe(["orders"])

        def group_refused() -> bool:
            message = consumer.poll(0.5)
            if message is None:
                return False
            error = message.error()
            assert error is not None, "alice read through a group she may not use"
            return bool(error.code() == RdKafkaError.GROUP_AUTHORIZATION_FAILED)

        wait_for("GROUP_AUTHORIZATION_FAILED", group_refused, timeout_s=60)
    finally:
        consumer.close()
    kp = KafkaConsumer("orders", group_id="bobs-group", auto_offset_reset="earliest",
                       consumer_timeout_ms=20_000, **secured.kafka_python("alice"))  # fmt: skip
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            kp.poll(timeout_ms=20_000)
    finally:
        kp.close()
    wait_denied(secured, "User:alice", "DESCRIBE", "GROUP:bobs-group")


def test_kcat_as_alice_lists_only_what_she_may_describe_and_cannot_produce(
    secured: Secured,
) -> None:
    assert KCAT is not None, "kcat is missing: make test installs it (apt-get install kcat)"

    def kcat(settings: dict[str, Any], *args: str, stdin: str = "") -> Any:
        options = [f"{k}={v}" for k, v in settings.items() if k != "bootstrap.servers"]
        return subprocess.run(
            [KCAT, "-b", settings["bootstrap.servers"], *[a for o in options for a in ("-X", o)],
             *args],
            input=stdin, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    def listed(settings: dict[str, Any]) -> set[str]:
        out = kcat(settings, "-L").stdout
        return set(re.findall(r'^\s*topic "([^"]+)" with', out, re.MULTILINE))

    assert listed(secured.rd("alice")) == {"orders"}
    assert set(TOPICS) <= listed(secured.rd())
    before = secured.end_offset("orders")
    produced = kcat(secured.rd("alice"), "-P", "-t", "orders", stdin="forged\n")
    assert produced.returncode != 0
    assert "Delivery failed for message: Broker: Topic authorization failed" in produced.stderr
    assert secured.end_offset("orders") == before


# -- bob: a PREFIXED ACL, and a transactional id ---------------------------------------------------
def test_a_prefixed_acl_matches_orders_eu_and_not_ordersx(secured: Secured) -> None:
    before = secured.end_offset("ordersx")
    assert rd_produce(secured.rd("bob"), "orders-eu", b"from bob") is None
    error = rd_produce(secured.rd("bob"), "ordersx", b"from bob")
    assert error is not None and error.code() == RdKafkaError.TOPIC_AUTHORIZATION_FAILED, error
    producer = KafkaProducer(acks="all", retries=0, **secured.kafka_python("bob"))
    try:
        producer.send("orders-eu", b"kafka-python").get(timeout=30)
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send("ordersx", b"kafka-python").get(timeout=30)
    finally:
        producer.close()
    assert secured.end_offset("ordersx") == before == 1
    wait_denied(secured, "User:bob", "DESCRIBE", "TOPIC:ordersx")


def test_a_transactional_id_without_write_is_refused(secured: Secured) -> None:
    refused = RdProducer({**secured.rd("bob"), "transactional.id": "bob-tx"})
    with pytest.raises(KafkaException) as raised:
        refused.init_transactions(60)
    code = raised.value.args[0].code()
    assert code == RdKafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, raised.value
    wait_denied(secured, "User:bob", "DESCRIBE", "TRANSACTIONAL_ID:bob-tx")

    allowed = RdProducer({**secured.rd("bob"), "transactional.id": "bob-tx-ok"})
    allowed.init_transactions(60)  # WRITE on bob-tx-ok (the CLI's ACL)
    allowed.begin_transaction()
    allowed.produce("orders-eu", b"in a transaction")
    allowed.commit_transaction(60)


# -- carol: DENY beats ALLOW, and what she may not describe she does not see -----------------------
def test_deny_overrides_allow_on_one_topic(secured: Secured) -> None:
    before = secured.end_offset("payroll")
    assert rd_produce(secured.rd("carol"), "shared", b"allowed by *") is None
    error = rd_produce(secured.rd("carol"), "payroll", b"denied")
    assert error is not None and error.code() == RdKafkaError.TOPIC_AUTHORIZATION_FAILED, error
    assert secured.end_offset("payroll") == before
    wait_denied(secured, "User:carol", "WRITE", "TOPIC:payroll")


def test_a_topic_carol_may_not_describe_is_not_listed(secured: Secured) -> None:
    carol = RdAdminClient(secured.rd("carol")).list_topics(timeout=30).topics
    admin = RdAdminClient(secured.rd()).list_topics(timeout=30).topics
    assert "hidden" in admin and "hidden" not in carol
    assert {"orders", "payroll", "shared"} <= set(carol)
    consumer = KafkaConsumer(**secured.kafka_python("carol"))
    try:
        assert "hidden" not in consumer.topics() and "payroll" in consumer.topics()
    finally:
        consumer.close()
    for spec in secured.cluster.specs:  # Metadata over gRPC, from every broker
        seen = visible_topics(secured.cluster, spec.node_id, secured.ours("carol"))
        assert seen is not None and "hidden" not in seen and "payroll" in seen


# -- our own client over gRPC (the BROKER listener) ------------------------------------------------
def test_our_client_as_alice_is_refused_writes_and_reads(secured: Secured) -> None:
    cluster = secured.cluster
    before = secured.end_offset("orders")
    # idempotent (the default): InitProducerId needs IDEMPOTENT_WRITE or WRITE on some topic
    for idempotent, error in ((False, ErrorCode.TOPIC_AUTHORIZATION_FAILED),
                              (None, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)):  # fmt: skip
        with Producer(cluster.bootstrap_servers, security=secured.ours("alice"),
                      enable_idempotence=idempotent) as producer:  # fmt: skip
            started = time.monotonic()
            with pytest.raises(KafkaError) as raised:
                producer.send("orders", b"ours", partition=0).result(timeout=60)
            assert raised.value.error is error, raised.value
            assert time.monotonic() - started < 30, "refused at once, not after a timeout"
    assert secured.end_offset("orders") == before
    with Consumer(cluster.bootstrap_servers, security=secured.ours("alice"),
                  group_id="alice-group", auto_offset_reset="earliest") as consumer:  # fmt: skip
        consumer.assign([("orders", 0)])
        consumer.commit({("orders", 0): SEEDED})  # OffsetCommit: READ on group and topic
        # a seek wins over the committed offset (as Kafka's seekToBeginning)
        consumer.seek_to_beginning(("orders", 0))
        values: list[bytes] = []

        def read() -> bool:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(r.value or b"" for r in records)
            return len(values) >= SEEDED

        wait_for("alice's records through our client", read, timeout_s=60)
    assert values[:SEEDED] == [f"order-{n}".encode() for n in range(SEEDED)]


# -- dave: a certificate's principal (mTLS) --------------------------------------------------------
@pytest.fixture(scope="module")
def mtls(secured: Secured, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One node whose KAFKA listener is SSL with client certificates required, signed by the
    secure cluster's CA; ``CN=dave`` maps to ``User:dave``. Its gRPC listeners stay PLAINTEXT,
    where ``User:ANONYMOUS`` (the node itself, the test's admin) is a super user."""
    directory = tmp_path_factory.mktemp("mtls-pki")
    ca = secured.cluster.secrets.ca
    host = f"127.0.0.{RANGES['kafka_acls_mtls']}"
    node = make_cert(ca, directory, "mtls-node", ips=(host,))
    overrides: dict[str, str | int] = {
        "listener.security.protocol.map": "KAFKA:SSL",
        "ssl.keystore.location": str(node),
        "ssl.truststore.location": str(ca.cert),
        "ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/L,DEFAULT",
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "super.users": "User:ANONYMOUS",
    }
    root = tmp_path_factory.mktemp("kafka-acls-mtls")
    with running_cluster(root, "kafka_acls_mtls", overrides, nodes=1) as cluster:
        with AdminClient(cluster.bootstrap_servers) as admin:
            created = admin.create_topics([NewTopic(t, 1, 1) for t in ("dave-orders", "orders")])
            assert all(error is None for error in created.values()), created
            write = AclBinding(
                ResourceType.TOPIC, "dave-orders", PatternType.LITERAL, "User:dave", "*",
                AclOperation.WRITE, PermissionType.ALLOW,
            )  # fmt: skip
            assert admin.create_acls([write]) == {write: None}
        yield cluster


def test_a_certificate_principal_gets_its_mapped_names_acls(
    secured: Secured, mtls: LocalCluster, tmp_path: Path
) -> None:
    dave = make_cert(secured.cluster.secrets.ca, tmp_path, "dave", server=False)
    settings = {
        "bootstrap.servers": ",".join(mtls.kafka_bootstrap_servers), "security.protocol": "SSL",
        "ssl.ca.location": str(secured.cluster.secrets.truststore),
        "ssl.certificate.location": str(dave), "ssl.key.location": str(dave),
    }  # fmt: skip
    wait_for("dave's write", lambda: rd_produce(settings, "dave-orders", b"by dave") is None,
             timeout_s=60)  # fmt: skip
    error = rd_produce(settings, "orders", b"by dave")
    assert error is not None and error.code() == RdKafkaError.TOPIC_AUTHORIZATION_FAILED, error
    producer = KafkaProducer(
        bootstrap_servers=mtls.kafka_bootstrap_servers, security_protocol="SSL", retries=0,
        ssl_cafile=str(secured.cluster.secrets.truststore), ssl_certfile=str(dave),
        ssl_keyfile=str(dave),
    )  # fmt: skip
    try:
        producer.send("dave-orders", b"kafka-python").get(timeout=30)
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send("orders", b"kafka-python").get(timeout=30)
    finally:
        producer.close()
    with Consumer(mtls.bootstrap_servers) as consumer:  # the admin: ANONYMOUS, a super user
        assert consumer.end_offsets([("orders", 0)]) == {("orders", 0): 0}
    audit = mtls.specs[0].log_path.read_text().splitlines()
    assert denied(audit, "User:dave", "DESCRIBE", "TOPIC:orders"), "no audit line for dave"
