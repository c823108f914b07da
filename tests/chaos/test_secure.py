"""The pieces of ``raftlog chaos run --secure`` that need no cluster (chaos/secure.py): the
workload user's ACLs, its properties file, and what each transformer client takes from it. The
run itself is tests/chaos/test_chaos_secure.py."""

from __future__ import annotations

import stat
from pathlib import Path

from chaos.rd_transformer import security_config
from chaos.secure import WorkloadResources, workload_acls, workload_settings
from dataplane.tools.command_config import read_command_config
from dataplane.tools.secure_cluster import ClusterSecrets, write_properties
from metadata_quorum.security.acl import AclOperation, PatternType, PermissionType, ResourceType

TRANSACTIONS = WorkloadResources(
    topics=("chaos-events", "chaos-output"),
    groups=("chaos-group", "chaos-transformers"),
    admin_topic_prefix="chaos-admin-",
    transactional_id_prefix="chaos-transformer-",
)


def test_the_workload_user_gets_what_its_clients_need_and_no_more() -> None:
    acls = workload_acls("User:chaos", TRANSACTIONS)
    assert {(a.principal, a.host, a.permission) for a in acls} == {
        ("User:chaos", "*", PermissionType.ALLOW)
    }
    for acl in acls:
        acl.validate()
    granted = {(a.resource_type, a.resource_name, a.pattern_type, a.operation) for a in acls}
    literal, prefixed = PatternType.LITERAL, PatternType.PREFIXED
    assert granted == {
        (ResourceType.CLUSTER, "kafka-cluster", literal, AclOperation.IDEMPOTENT_WRITE),
        (ResourceType.GROUP, "chaos-group", literal, AclOperation.READ),
        (ResourceType.GROUP, "chaos-transformers", literal, AclOperation.READ),
        (ResourceType.TRANSACTIONAL_ID, "chaos-transformer-", prefixed, AclOperation.WRITE),
        (ResourceType.TOPIC, "chaos-admin-", prefixed, AclOperation.CREATE),
        (ResourceType.TOPIC, "chaos-admin-", prefixed, AclOperation.DELETE),
        (ResourceType.TOPIC, "chaos-events", literal, AclOperation.READ),
        (ResourceType.TOPIC, "chaos-events", literal, AclOperation.WRITE),
        (ResourceType.TOPIC, "chaos-output", literal, AclOperation.READ),
        (ResourceType.TOPIC, "chaos-output", literal, AclOperation.WRITE),
    }
    # the plain workload: no transactional ids
    plain = WorkloadResources(("chaos-events",), ("chaos-group",), "chaos-admin-")
    assert ResourceType.TRANSACTIONAL_ID not in {
        a.resource_type for a in workload_acls("User:chaos", plain)
    }


def test_the_properties_file_is_private_and_both_clients_read_it(tmp_path: Path) -> None:
    secrets = ClusterSecrets(tmp_path / "secrets")
    settings = workload_settings(secrets, "p4ss=w0rd")
    path = write_properties(tmp_path / "chaos.properties", settings)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ours = read_command_config(path)  # raftlog's client (chaos/transformer.py)
    assert (ours.security_protocol, ours.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
    assert (ours.sasl_username, ours.sasl_password) == ("chaos", "p4ss=w0rd")
    assert ours.ssl_ca_location == secrets.truststore
    assert security_config(path) == settings  # librdkafka's (chaos/rd_transformer.py)
    assert security_config(None) == {}
