"""A local cluster in secure mode (``LocalCluster(secure=True)``, ``raftlog cluster up --secure``)
on 127.0.0.189-190: its secrets, the SCRAM user admin, client.properties, our client and
confluent-kafka through it, the CLI with ``--command-config``, and what a plaintext client gets."""

from __future__ import annotations

import http.client
import ipaddress
import json
import re
import ssl
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import confluent_kafka
import pytest
from cryptography import x509
from typer.testing import CliRunner

from dataplane.client import AdminClient, Consumer, NewTopic, Producer
from dataplane.client._admin_security import UserScramCredentialUpsertion
from dataplane.server.node import raft_options
from dataplane.tools.cli import _print_client_settings, app
from dataplane.tools.cluster_status import cluster_status_rows
from dataplane.tools.command_config import read_command_config
from dataplane.tools.entry import COMMAND
from dataplane.tools.local_cluster import LocalCluster, wait_for
from dataplane.tools.owned_process import popen_owned
from metadata_quorum.security.acl import (
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from metadata_quorum.security.channels import ClientSecurity
from metadata_quorum.security.principal import KafkaPrincipal
from metadata_quorum.security.scram import ScramMechanism
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.cluster_support import running_cluster

TWO_NODES: dict[str, str | int] = {
    "offsets.topic.replication.factor": 2,
    "transaction.state.log.replication.factor": 2,
}
pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("secure_cluster"),
    pytest.mark.timeout(400),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("secure") / "cluster"
    with running_cluster(root, "secure_cluster", TWO_NODES, nodes=2, secure=True) as running:
        yield running


def test_the_secrets_are_private_and_the_nodes_configured(cluster: LocalCluster) -> None:
    secrets = cluster.secrets
    for path in (
        secrets.ca.key, secrets.node_keystore(1), secrets.node_keystore(2),
        secrets.admin_keystore, secrets.client_properties,
    ):  # fmt: skip
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(secrets.directory.stat().st_mode) == 0o700
    config = cluster.config(cluster.spec(1))
    assert config.security_protocols == {
        "BROKER": "SASL_SSL", "CONTROLLER": "SASL_SSL", "KAFKA": "SASL_SSL", "METRICS": "SSL",
    }  # fmt: skip
    assert [config.client_auth(n) for n in ("BROKER", "CONTROLLER", "KAFKA", "METRICS")] == [
        "requested", "requested", "requested", "required",
    ]  # fmt: skip
    assert config.authorizer_settings is not None
    assert "User:node-2" in config.super_users and "User:admin" in config.super_users
    assert json.loads(cluster.state_path.read_text())["secure"] is True


def test_the_raft_transport_is_tls_between_node_certificates(cluster: LocalCluster) -> None:
    """No Raft secret: the CONTROLLER listener is SASL_SSL, so the quorum (both nodes vote:
    it formed) runs over TLS with the nodes' keystores, each naming its node's IP (what the
    Raft transport checks a voter against), and admits only super users as peers."""
    secrets = cluster.secrets
    assert not (secrets.directory / "raft.secret").exists()
    for node_id in (1, 2):
        config = cluster.config(cluster.spec(node_id))
        assert config.controller_quorum_raft_secret_file is None
        assert config.raft_transport_security == "tls"
        options = raft_options(config)
        assert options.tls is not None and options.tls.keystore == secrets.node_keystore(node_id)
        assert options.tls_peers.principals is not None
        assert KafkaPrincipal.user(f"node-{node_id}") in options.tls_peers.principals
        assert options.tls_peers.refusal(f"CN=node-{node_id}") is None
        assert options.tls_peers.refusal("CN=mallory") is not None
        leaf = x509.load_pem_x509_certificates(secrets.node_keystore(node_id).read_bytes())[0]
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        host = ipaddress.ip_address(cluster.spec(node_id).host)
        assert host in names.get_values_for_type(x509.IPAddress)
    client = cluster.client()
    try:
        quorum = client.describe_quorum()
    finally:
        client.close()
    assert quorum.has_quorum and sorted(v.node_id for v in quorum.voters) == [1, 2]


def test_client_properties_log_our_client_in_as_admin(cluster: LocalCluster) -> None:
    text = cluster.secrets.client_properties.read_text()
    wanted = (
        "security.protocol=SASL_SSL", "sasl.mechanism=SCRAM-SHA-512", "sasl.username=admin",
        "ssl.truststore.type=PEM", "ssl.ca.location=", "ssl.truststore.location=",
        'ScramLoginModule required username="admin"',
    )  # fmt: skip
    for key in wanted:
        assert key in text, key
    security = read_command_config(cluster.secrets.client_properties)
    topic = f"secure-{uuid.uuid4().hex[:8]}"
    with AdminClient(cluster.bootstrap_servers, security=security) as admin:
        assert admin.create_topics([NewTopic(topic, 2, 2)])[topic] is None
    with Producer(cluster.bootstrap_servers, security=security) as producer:
        for n in range(10):
            producer.send(topic, f"v{n}".encode()).result(timeout=60)
    with Consumer(
        cluster.bootstrap_servers,
        security=security,
        auto_offset_reset="earliest",
        group_id=f"group-{topic}",
    ) as consumer:
        consumer.subscribe([topic])
        seen: list[bytes] = []

        def ten_records() -> bool:
            polled = consumer.poll(timeout_ms=500)
            seen.extend(r.value for records in polled.values() for r in records if r.value)
            return len(seen) >= 10

        wait_for("the records", ten_records, timeout_s=60)
    assert sorted(seen) == sorted(f"v{n}".encode() for n in range(10))


def test_a_plaintext_client_gets_nothing(cluster: LocalCluster) -> None:
    with (
        pytest.raises((KafkaError, OSError, TimeoutError)),
        AdminClient(cluster.bootstrap_servers, request_timeout_ms=3_000) as admin,
    ):
        admin.list_topics()


def test_the_cli_takes_command_config_and_the_cluster_commands_keep_working(
    cluster: LocalCluster,
) -> None:
    runner = CliRunner()
    bootstrap = ",".join(cluster.bootstrap_servers)
    properties = str(cluster.secrets.client_properties)
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    created = runner.invoke(
        app, ["--command-config", properties, "topic", "create", topic, "--partitions", "1",
              "--bootstrap-server", bootstrap],
    )  # fmt: skip
    assert created.exit_code == 0, created.output
    listed = runner.invoke(
        app, ["topic", "list", "--json", "--bootstrap-server", bootstrap],
        env={"RAFTLOG_COMMAND_CONFIG": properties},
    )  # fmt: skip
    assert listed.exit_code == 0, listed.output
    assert topic in json.loads(listed.output)
    status = runner.invoke(app, ["cluster", "status", "--json", "--root", str(cluster.root)])
    assert status.exit_code == 0, status.output  # the recorded cluster, over the admin's cert
    assert {row["node"] for row in json.loads(status.output)} == {1, 2}
    rows = cluster_status_rows(cluster)
    assert {row["node"] for row in rows} == {1, 2}
    assert any(row["role"] == "active controller" for row in rows), rows


def test_confluent_kafka_through_the_kafka_listener(cluster: LocalCluster) -> None:
    settings = {
        "bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers),
        **cluster.client_settings,
    }
    topic = f"kafka-{uuid.uuid4().hex[:8]}"
    with AdminClient(cluster.bootstrap_servers, security=cluster.client_settings) as admin:
        assert admin.create_topics([NewTopic(topic, 1, 2)])[topic] is None
    producer = confluent_kafka.Producer(settings)
    producer.produce(topic, b"through SASL_SSL")
    assert producer.flush(60) == 0
    consumer = confluent_kafka.Consumer(
        {**settings, "group.id": "secure-test", "auto.offset.reset": "earliest"}
    )
    try:
        consumer.subscribe([topic])
        message = wait_for("the record", lambda: consumer.poll(1.0), timeout_s=60)
        assert message.error() is None and message.value() == b"through SASL_SSL"
    finally:
        consumer.close()


def test_cluster_up_refuses_to_change_a_clusters_mode(cluster: LocalCluster) -> None:
    result = CliRunner().invoke(
        app, ["cluster", "up", "--plaintext", "--root", str(cluster.root)], env={"COLUMNS": "400"}
    )
    assert result.exit_code == 2, result.output
    assert "holds a secure cluster (cluster.json): a cluster keeps its mode" in result.output


def test_secrets_made_once_are_kept(tmp_path: Path) -> None:
    """Pure: no nodes. A second ensure keeps the CA and the keystores; a new node gets its own."""
    local = LocalCluster(tmp_path / "c", nodes=2, first_host=189, secure=True)
    local.secrets.ensure([(1, "127.0.0.189")])
    ca, node_1 = local.secrets.ca.cert.read_bytes(), local.secrets.node_keystore(1).read_bytes()
    local.secrets.ensure([(1, "127.0.0.189"), (2, "127.0.0.190")])
    assert local.secrets.ca.cert.read_bytes() == ca
    assert local.secrets.node_keystore(1).read_bytes() == node_1
    assert local.secrets.node_keystore(2).exists()
    assert local.secrets.admin_password() == local.secrets.admin_password()


def test_cluster_up_prints_the_client_settings(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    _print_client_settings(cluster)
    out = capsys.readouterr().out
    assert str(cluster.secrets.client_properties) in out
    assert f"RAFTLOG_COMMAND_CONFIG={cluster.secrets.client_properties}" in out
    password = cluster.secrets.admin_password()
    assert f"'sasl.password': '{password}'" in out
    assert cluster.kafka_bootstrap_servers[0] in out


# -- the web console with a login (dataplane/console/sessions.py) -------------------------------
class ConsoleHttp:
    """An HTTPS client of one node's console that follows no redirect and keeps one cookie."""

    def __init__(self, cluster: LocalCluster, url: str | None = None) -> None:
        url = url or cluster.console_url(1)
        assert url is not None and url.startswith("https://")
        self.host = urlsplit(url).netloc
        self.context = ssl.create_default_context(cafile=str(cluster.secrets.truststore))
        self.cookie: str | None = None

    def request(
        self, method: str, path: str, form: dict[str, str] | None = None, origin: str | None = None
    ) -> tuple[int, dict[str, str], str]:
        host, port = self.host.rsplit(":", 1)
        connection = http.client.HTTPSConnection(host, int(port), context=self.context, timeout=30)
        headers = {"Host": self.host, "Origin": origin or f"https://{self.host}"}
        if self.cookie:
            headers["Cookie"] = self.cookie
        body = None
        if form is not None:
            body = urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            connection.request(method, path, body, headers)
            answer = connection.getresponse()
            text = answer.read().decode()
            got = {k.lower(): v for k, v in answer.getheaders()}
        finally:
            connection.close()
        if "set-cookie" in got:
            self.cookie = got["set-cookie"].split(";")[0]
        return answer.status, got, text

    def csrf(self, path: str) -> str:
        _, _, html = self.request("GET", path)
        found = re.search(r'name="csrf" value="([^"]+)"', html)
        assert found, f"no CSRF token on {path}"
        return found.group(1)


def test_the_console_asks_for_a_login_and_shows_each_user_what_their_acls_allow(
    cluster: LocalCluster,
) -> None:
    """On a secure cluster every broker node serves the console over HTTPS (its keystore, the
    cluster's CA) with a login: a user is a SCRAM user of the cluster and sees what their ACLs
    let them describe. Every form needs its CSRF token and this console's Origin."""
    with AdminClient(cluster.bootstrap_servers, security=cluster.admin_security) as admin:
        for name in ("console-visible", "console-hidden"):
            if name not in admin.list_topics():
                admin.create_topics([NewTopic(name, 1, 2)])
        admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion("carol", ScramMechanism.SCRAM_SHA_512, "carol-secret")]
        )
        allow = AclBinding(
            ResourceType.TOPIC, "console-visible", PatternType.LITERAL, "User:carol", "*",
            AclOperation.DESCRIBE, PermissionType.ALLOW,
        )  # fmt: skip
        assert admin.create_acls([allow]) == {allow: None}
        disks = admin.describe_log_dirs()
        assert sorted(disks) == [1, 2] and all(d.usable_bytes > 0 for d in disks.values())
    carol = ClientSecurity(
        security_protocol="SASL_SSL", ssl_ca_location=cluster.secrets.truststore,
        sasl_mechanism="SCRAM-SHA-512", sasl_username="carol", sasl_password="carol-secret",
    )  # fmt: skip
    with AdminClient(cluster.bootstrap_servers, security=carol) as as_carol:
        with pytest.raises(KafkaError) as refused:  # Kafka's rule: DESCRIBE on the cluster
            as_carol.describe_log_dirs()
        assert refused.value.error is ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    check_console_login(cluster, ConsoleHttp(cluster))


def check_console_login(cluster: LocalCluster, carol: ConsoleHttp) -> None:
    status, headers, _ = carol.request("GET", "/topics")
    assert (status, headers.get("location")) == (303, "/login?next=%2Ftopics")
    status, _, html = carol.request(
        "POST", "/login", {"user": "carol", "password": "wrong", "next": "/topics"}
    )
    assert status == 401 and 'id="error"' in html and carol.cookie is None
    status, _, _ = carol.request(
        "POST", "/login", {"user": "carol", "password": "carol-secret"}, "https://evil.example"
    )
    assert status == 403, "a login posted from another site"
    status, headers, _ = carol.request(
        "POST", "/login", {"user": "carol", "password": "carol-secret", "next": "/topics"}
    )
    assert (status, headers.get("location")) == (303, "/topics")
    assert carol.cookie is not None
    assert all(flag in headers["set-cookie"] for flag in ("HttpOnly", "SameSite=Strict", "Secure"))

    def listed() -> str | None:  # the ACL reaches the brokers' images
        _, _, html = carol.request("GET", "/topics")
        return html if "console-visible" in html else None

    html = wait_for("carol's topics page", listed, 30)
    assert "console-hidden" not in html and "carol" in html  # the nav names who is logged in
    assert carol.request("GET", "/topics/console-hidden")[0] == 403
    # carol may describe but not write: the form is hers, the cluster refuses the record
    token = carol.csrf("/topics/console-visible/records")
    form = {"value": "from carol", "key": "", "partition": "", "headers": ""}
    assert carol.request("POST", "/topics/console-visible/produce", form)[0] == 403  # no token
    assert carol.request("POST", "/topics/console-visible/produce", {**form, "csrf": token},
                         "https://evil.example")[0] == 403  # fmt: skip
    status, _, html = carol.request(
        "POST", "/topics/console-visible/produce", {**form, "csrf": token}
    )
    assert status == 403 and "AUTHORIZATION_FAILED" in html  # Kafka's: IDEMPOTENT_WRITE first
    # admin may write: the record lands and the redirect shows it
    admin_http = ConsoleHttp(cluster, f"https://{carol.host}/")
    password = cluster.secrets.admin_password()
    assert admin_http.request("POST", "/login", {"user": "admin", "password": password})[0] == 303
    token = admin_http.csrf("/topics/console-visible/records")
    status, headers, _ = admin_http.request(
        "POST", "/topics/console-visible/produce", {**form, "csrf": token, "value": "from admin"}
    )
    assert status == 303 and "produced=" in headers["location"]
    assert "from admin" in admin_http.request("GET", headers["location"])[2]
    # logging out ends the session: the old cookie leads to the login again
    old = carol.cookie
    assert carol.request("POST", "/logout", {"csrf": carol.csrf("/")})[0] == 303
    carol.cookie = old
    assert carol.request("GET", "/")[0] == 303


def test_raftlog_console_on_its_own_with_a_login_over_https(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """``raftlog console --login --tls-keystore``: the command config's admin samples the
    charts, each user logs in as themselves; the process is stopped by its pid."""
    argv = [
        *COMMAND,
        "--command-config", str(cluster.secrets.client_properties), "console",
        "--bootstrap-server", ",".join(cluster.bootstrap_servers),
        "--login", "--tls-keystore", str(cluster.secrets.node_keystore(1)),
        "--listen", f"{cluster.spec(1).host}:0",
    ]  # fmt: skip
    out = tmp_path / "console.out"
    with out.open("wb") as sink:
        process = popen_owned(argv, stdout=sink, stderr=subprocess.STDOUT)
    try:

        def serving() -> str | None:
            found = re.search(r"console: (https://\S+)/ ", out.read_text())
            return found.group(1) if found else None

        url = wait_for("raftlog console serving", serving, 60)
        check_console_login(cluster, ConsoleHttp(cluster, url))
    finally:
        process.terminate()
        process.wait(30)
