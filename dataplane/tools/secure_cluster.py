"""The secrets and settings of a local cluster in secure mode (``raftlog cluster up --secure``,
``LocalCluster(secure=True)``; docs/security.md "The local cluster in secure mode").

Under ``root/secrets/`` (every file mode 0600): a private CA (``raftlog-ca.crt`` is the
truststore everyone loads), one PEM keystore per node (``node-<id>.pem``: CN=node-<id>, its
127.0.0.N address as IP SAN), the admin's client keystore (``admin.pem``, CN=admin) and, once the
cluster is up, ``client.properties``: the SCRAM user ``admin`` with its random password, for
librdkafka, Java clients and ``raftlog --command-config``. No Raft secret: the CONTROLLER
listener is SASL_SSL, so the Raft transport between controllers is TLS with the nodes' keystores
(`NodeConfig.raft_transport_security`), and a Raft peer must be a node: its certificate names
its voter address's IP and maps to ``User:node-<id>``, a super user.

Nodes: CONTROLLER, BROKER and KAFKA all SASL_SSL with client certificates requested: nodes and
the admin's keystore authenticate by certificate (principal from the CN,
``ssl.principal.mapping.rules``), SCRAM clients by password and need none. CONTROLLER is SASL_SSL,
not SSL with certificates required, because our AdminClient calls the controllers itself (Kafka's
clients reach them only through the brokers): a SCRAM user must be able to authenticate there
too. The StandardAuthorizer with the nodes and ``admin`` as super users; SCRAM-SHA-256/512.
``ssl.client.auth`` stays ``requested`` on those three (``required`` would shut out the SCRAM
clients, which have no certificate). METRICS serves HTTPS and requires a certificate from the
cluster's CA (``listener.name.metrics.ssl.client.auth=required``): metrics name every topic,
which the authorizer hides from whoever may not DESCRIBE them, and scrapers carry no password.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dataplane.tools.certificates import CertFiles, make_ca, make_cert
from dataplane.tools.command_config import format_properties
from metadata_quorum.security.channels import ClientSecurity
from metadata_quorum.security.node_cert import NODE_CERT_MECHANISM

ADMIN_USER = "admin"
ADMIN_MECHANISM = "SCRAM-SHA-512"
SECURITY_PROTOCOL_MAP = "CONTROLLER:SASL_SSL,BROKER:SASL_SSL,KAFKA:SASL_SSL,METRICS:SSL"
PRINCIPAL_MAPPING_RULES = "RULE:^CN=([^,]+).*$/$1/,DEFAULT"
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
PASSWORD_BYTES = 24


def _private(path: Path, text: str) -> Path:
    """Write ``text`` to a file only its owner can read (created 0600, never wider)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    path.chmod(0o600)
    return path


def write_properties(path: Path, settings: dict[str, str], comment: str = "") -> Path:
    """A client properties file (Java's format, as librdkafka and Kafka's tools read it) that
    only its owner can read: it holds a password."""
    return _private(path, format_properties(settings, comment))


@dataclass(frozen=True)
class ClusterSecrets:
    """The paths under ``root/secrets``; `ensure` makes what is missing."""

    directory: Path

    @property
    def ca(self) -> CertFiles:
        return CertFiles(self.directory / "raftlog-ca.crt", self.directory / "raftlog-ca.key")

    @property
    def truststore(self) -> Path:
        return self.ca.cert

    def node_keystore(self, node_id: int) -> Path:
        return self.directory / f"node-{node_id}.pem"

    @property
    def admin_keystore(self) -> Path:
        return self.directory / f"{ADMIN_USER}.pem"

    @property
    def client_properties(self) -> Path:
        return self.directory / "client.properties"

    @property
    def password_file(self) -> Path:
        return self.directory / "admin.password.json"

    def ensure(self, nodes: Sequence[tuple[int, str]]) -> None:
        """The CA, the admin's keystore, and a keystore for each ``(node id, host)`` (its IP
        the SAN the Raft transport checks): made once, kept across restarts (a node added later
        gets its own)."""
        if not self.directory.is_dir():
            # made 0700; an existing directory keeps its mode (the chaos harness lets its node
            # users search it: chaos/secure.py `share_secrets`)
            self.directory.mkdir(parents=True)
            self.directory.chmod(0o700)
        ca = self.ca
        if not ca.cert.exists() or not ca.key.exists():
            ca = make_ca(self.directory)
        for node_id, host in nodes:
            if not self.node_keystore(node_id).exists():
                make_cert(ca, self.directory, f"node-{node_id}", ips=(host,))
        if not self.admin_keystore.exists():
            make_cert(ca, self.directory, ADMIN_USER, server=False)

    def node_settings(self, node_id: int, all_node_ids: Sequence[int]) -> dict[str, object]:
        """The node.toml settings that secure node ``node_id``."""
        super_users = [f"User:node-{n}" for n in sorted(all_node_ids)] + [f"User:{ADMIN_USER}"]
        return {
            "listener.security.protocol.map": SECURITY_PROTOCOL_MAP,
            "ssl.keystore.location": str(self.node_keystore(node_id)),
            "ssl.truststore.location": str(self.truststore),
            "ssl.client.auth": "requested",
            "listener.name.metrics.ssl.client.auth": "required",
            "ssl.principal.mapping.rules": PRINCIPAL_MAPPING_RULES,
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
            "authorizer.class.name": STANDARD_AUTHORIZER,
            "super.users": ";".join(super_users),
        }

    def admin_certificate_security(self) -> ClientSecurity:
        """The admin by certificate (principal User:admin): what the cluster commands use, and
        what creates the SCRAM user before any exists. gRPC listeners with
        ``ssl.client.auth=requested`` ask for no certificate in TLS (grpcio cannot), so it is
        proven by RAFTLOG-NODE-CERT (`metadata_quorum.security.node_cert`)."""
        return ClientSecurity(
            security_protocol="SSL",
            ssl_ca_location=self.truststore,
            ssl_certificate_location=self.admin_keystore,
            ssl_key_location=self.admin_keystore,
            sasl_mechanism=NODE_CERT_MECHANISM,
        )

    def admin_password(self) -> str:
        """The SCRAM password of ``admin``: made once, kept beside the other secrets."""
        try:
            return str(json.loads(self.password_file.read_text())["password"])
        except FileNotFoundError:
            password = secrets.token_urlsafe(PASSWORD_BYTES)
            _private(self.password_file, json.dumps({"user": ADMIN_USER, "password": password}))
            return password

    def client_settings(self, password: str) -> dict[str, str]:
        """librdkafka's (and confluent-kafka's, and our ClientSecurity's) names."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": ADMIN_MECHANISM,
            "sasl.username": ADMIN_USER,
            "sasl.password": password,
            "ssl.ca.location": str(self.truststore),
        }

    def write_client_properties(self, password: str, bootstrap: Sequence[str]) -> Path:
        """``client.properties`` (0600): librdkafka's names and Java's PEM equivalents."""
        escaped = password.replace("\\", "\\\\").replace('"', '\\"')
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{ADMIN_USER}" password="{escaped}";'
        )
        settings = {
            "bootstrap.servers": ",".join(bootstrap),
            **self.client_settings(password),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.truststore),
            "sasl.jaas.config": jaas,
        }
        return write_properties(
            self.client_properties,
            settings,
            "raftlog cluster up --secure: the SCRAM user admin over TLS",
        )
