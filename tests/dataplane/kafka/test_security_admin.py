"""ACLs and SCRAM credentials as metadata on a real 3-node cluster (127.0.0.107-109), with the
StandardAuthorizer on and, since PLAINTEXT principals are ANONYMOUS, ``User:ANONYMOUS`` a super
user. They are created through our AdminClient (the controllers' gRPC API), through Kafka's own
clients on the KAFKA listener (kafka-python's KafkaAdminClient; confluent-kafka's AdminClient,
SCRAM credentials included) and through the CLI (``raftlog acl``, ``raftlog user``); every
client sees what the others wrote; bad input gets Kafka's error codes. Last, everything survives
a restart of every node and the loss of the active controller: the new one answers the same."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient as RdAdminClient
from confluent_kafka.admin._acl import AclBinding as RdAclBinding
from confluent_kafka.admin._acl import AclBindingFilter as RdAclFilter
from confluent_kafka.admin._acl import AclOperation as RdOperation
from confluent_kafka.admin._acl import AclPermissionType as RdPermission
from confluent_kafka.admin._resource import ResourcePatternType as RdPattern
from confluent_kafka.admin._resource import ResourceType as RdResourceType
from confluent_kafka.admin._scram import ScramCredentialInfo as RdScramInfo
from confluent_kafka.admin._scram import ScramMechanism as RdScramMechanism
from confluent_kafka.admin._scram import UserScramCredentialDeletion as RdDeletion
from confluent_kafka.admin._scram import UserScramCredentialUpsertion as RdUpsertion
from kafka import KafkaAdminClient
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ResourcePattern,
    ResourcePatternFilter,
)
from kafka.admin import ACLResourcePatternType as KpPattern
from kafka.admin import ResourceType as KpResourceType

from dataplane.client import AdminClient
from dataplane.client.admin import (
    AclBinding,
    AclFilter,
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from dataplane.tools.entry import COMMAND as RAFTLOG
from dataplane.tools.local_cluster import LocalCluster, wait_for
from metadata_quorum.security.acl import (
    CLUSTER_NAME,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from metadata_quorum.security.scram import ScramMechanism
from raftlog.errors import ErrorCode, KafkaError
from tests.dataplane.cluster_support import running_cluster

pytestmark = [pytest.mark.timeout(420), pytest.mark.xdist_group("security-admin")]
SECURED: dict[str, str | int] = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",
}
SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
K = TypeVar("K")


def acl(
    rtype: ResourceType, name: str, principal: str, op: AclOperation,
    pattern: PatternType = PatternType.LITERAL, permission: PermissionType = PermissionType.ALLOW,
) -> AclBinding:  # fmt: skip
    return AclBinding(rtype, name, pattern, principal, "*", op, permission)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("security-admin")
    with running_cluster(root, "security_admin", overrides=SECURED) as running:
        yield running


@pytest.fixture
def admin(cluster: LocalCluster) -> Iterator[AdminClient]:
    with AdminClient(cluster.bootstrap_servers) as client:
        yield client


def test_acls_and_credentials_through_our_admin_client(admin: AdminClient) -> None:
    read = acl(ResourceType.TOPIC, "ours-orders", "User:alice", AclOperation.READ)
    prefixed = acl(
        ResourceType.GROUP, "ours-", "User:alice", AclOperation.READ, PatternType.PREFIXED
    )
    invalid = acl(ResourceType.GROUP, "ours-g", "User:alice", AclOperation.WRITE)
    results = admin.create_acls([read, prefixed, invalid])
    assert results[read] is None and results[prefixed] is None
    error = results[invalid]
    assert error is not None and error.error is ErrorCode.INVALID_REQUEST
    assert "WRITE does not apply to a GROUP" in error.message
    assert admin.create_acls([read]) == {read: None}  # exists: a success, nothing changes
    mine = AclFilter(principal="User:alice")
    assert admin.describe_acls(mine) == sorted([read, prefixed])
    applies = AclFilter(ResourceType.GROUP, "ours-app", PatternType.MATCH)
    assert admin.describe_acls(applies) == [prefixed]
    deleted = admin.delete_acls([AclFilter(ResourceType.TOPIC, principal="User:alice")])
    assert [r.deleted for r in deleted.values()] == [(read,)]
    assert admin.describe_acls(mine) == [prefixed]
    admin.delete_acls([mine])
    assert admin.describe_acls(mine) == []

    upsert = UserScramCredentialUpsertion("ours-alice", SHA512, "alice-secret", iterations=8192)
    too_few = UserScramCredentialUpsertion("ours-bob", SHA256, "bob-secret", iterations=100)
    results_by_user = admin.alter_user_scram_credentials([upsert, too_few])
    assert results_by_user["ours-alice"] is None
    bob = results_by_user["ours-bob"]
    assert bob is not None and bob.error is ErrorCode.UNACCEPTABLE_CREDENTIAL
    assert admin.describe_user_scram_credentials(["ours-alice"]) == {
        "ours-alice": (ScramCredentialInfo(SHA512, 8192),)
    }
    with pytest.raises(KafkaError) as missing:
        admin.describe_user_scram_credentials(["ours-bob"])
    assert missing.value.error is ErrorCode.RESOURCE_NOT_FOUND
    gone = admin.alter_user_scram_credentials(
        deletions=[UserScramCredentialDeletion("ours-alice", SHA512)]
    )
    assert gone == {"ours-alice": None}
    again = admin.alter_user_scram_credentials(
        deletions=[UserScramCredentialDeletion("ours-alice", SHA512)]
    )["ours-alice"]
    assert again is not None and again.error is ErrorCode.RESOURCE_NOT_FOUND


def test_kafka_python_creates_describes_and_deletes_acls(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    client = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers)
    try:
        write = ACL(
            "User:kp", "*", ACLOperation.WRITE, ACLPermissionType.ALLOW,
            ResourcePattern(KpResourceType.TOPIC, "kp-", KpPattern.PREFIXED),
        )  # fmt: skip
        deny = ACL(
            "User:kp", "10.0.0.1", ACLOperation.READ, ACLPermissionType.DENY,
            ResourcePattern(KpResourceType.TOPIC, "kp-orders", KpPattern.LITERAL),
        )  # fmt: skip
        created = client.create_acls([write, deny])
        assert created["failed"] == [] and len(created["succeeded"]) == 2
        any_kp = ACLFilter(
            "User:kp", None, ACLOperation.ANY, ACLPermissionType.ANY,
            ResourcePatternFilter(KpResourceType.ANY, None, KpPattern.ANY),
        )  # fmt: skip
        found, error = client.describe_acls(any_kp)
        assert error.errno == 0
        assert {(a.operation, a.resource_pattern.resource_name) for a in found} == {
            (ACLOperation.WRITE, "kp-"), (ACLOperation.READ, "kp-orders"),
        }  # fmt: skip
        # what Kafka's client wrote, ours reads the same
        kp_write = acl(
            ResourceType.TOPIC, "kp-", "User:kp", AclOperation.WRITE, PatternType.PREFIXED
        )
        assert kp_write in admin.describe_acls(AclFilter(principal="User:kp"))
        ((_, matched, filter_error),) = client.delete_acls([any_kp])
        assert filter_error.errno == 0 and len(matched) == 2
        assert admin.describe_acls(AclFilter(principal="User:kp")) == []
    finally:
        client.close()


def _wait(future_map: Mapping[K, Future[Any]]) -> dict[K, Any]:
    return {key: future.result(timeout=60) for key, future in future_map.items()}


def _rd_filter(principal: str) -> RdAclFilter:
    """Any ACL of `principal` (librdkafka takes None for "any"; the stubs say str)."""
    return RdAclFilter(
        RdResourceType.ANY, None, RdPattern.ANY, principal, None,  # type: ignore[arg-type]
        RdOperation.ANY, RdPermission.ANY,
    )  # fmt: skip


def test_confluent_kafka_acls_and_scram_credentials(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    rd = RdAdminClient({"bootstrap.servers": ",".join(cluster.kafka_bootstrap_servers)})
    binding = RdAclBinding(
        RdResourceType.TOPIC, "rd-orders", RdPattern.LITERAL, "User:rd", "*",
        RdOperation.DESCRIBE, RdPermission.ALLOW,
    )  # fmt: skip
    cluster_alter = RdAclBinding(
        RdResourceType.BROKER, CLUSTER_NAME, RdPattern.LITERAL, "User:rd", "*",
        RdOperation.ALTER, RdPermission.ALLOW,
    )  # fmt: skip
    assert _wait(rd.create_acls([binding, cluster_alter])) == {binding: None, cluster_alter: None}
    rd_filter = _rd_filter("User:rd")
    described = rd.describe_acls(rd_filter).result(timeout=60)
    assert {(b.restype, b.name, b.operation) for b in described} == {
        (RdResourceType.TOPIC, "rd-orders", RdOperation.DESCRIBE),
        (RdResourceType.BROKER, CLUSTER_NAME, RdOperation.ALTER),
    }
    assert acl(ResourceType.CLUSTER, CLUSTER_NAME, "User:rd", AclOperation.ALTER) in (
        admin.describe_acls(AclFilter(ResourceType.CLUSTER))
    )
    bad = RdAclBinding(
        RdResourceType.TOPIC, "rd-orders", RdPattern.LITERAL, "User:rd", "*",
        RdOperation.CLUSTER_ACTION, RdPermission.ALLOW,
    )  # fmt: skip
    with pytest.raises(KafkaException) as refused:
        rd.create_acls([bad])[bad].result(timeout=60)
    assert refused.value.args[0].code() == ErrorCode.INVALID_REQUEST.code
    (deleted,) = _wait(rd.delete_acls([rd_filter])).values()
    assert len(deleted) == 2
    assert rd.describe_acls(rd_filter).result(timeout=60) == []

    upsert = RdUpsertion("rd-alice", RdScramInfo(RdScramMechanism.SCRAM_SHA_256, 4096), b"pw-a")
    assert _wait(rd.alter_user_scram_credentials([upsert])) == {"rd-alice": None}
    users = rd.describe_user_scram_credentials(["rd-alice"])
    assert isinstance(users, dict)  # one future per user named
    (description,) = _wait(users).values()
    infos = description.scram_credential_infos
    assert [(i.mechanism, i.iterations) for i in infos] == [(RdScramMechanism.SCRAM_SHA_256, 4096)]
    assert admin.describe_user_scram_credentials(["rd-alice"]) == {
        "rd-alice": (ScramCredentialInfo(SHA256, 4096),)
    }
    nobody = rd.describe_user_scram_credentials(["rd-nobody"])
    assert isinstance(nobody, dict)
    with pytest.raises(KafkaException) as unknown:
        nobody["rd-nobody"].result(timeout=60)
    assert unknown.value.args[0].code() == ErrorCode.RESOURCE_NOT_FOUND.code
    deletion = RdDeletion("rd-alice", RdScramMechanism.SCRAM_SHA_256)
    assert _wait(rd.alter_user_scram_credentials([deletion])) == {"rd-alice": None}
    with pytest.raises(KafkaError):
        admin.describe_user_scram_credentials(["rd-alice"])


def cli(cluster: LocalCluster, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    bootstrap = ",".join(cluster.bootstrap_servers)
    return subprocess.run(
        [*RAFTLOG, *args, "--bootstrap-server", bootstrap], env=env, input=stdin,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_cli_acl_and_user_commands(cluster: LocalCluster, tmp_path: Path) -> None:
    added = cli(
        cluster, "acl", "add", "--allow-principal", "User:cli", "--producer",
        "--topic", "cli-orders", "--transactional-id", "cli-tx", "--json",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert {(r["resource_name"], r["operation"]) for r in json.loads(added.stdout)} == {
        ("cli-orders", "WRITE"), ("cli-orders", "DESCRIBE"), ("cli-orders", "CREATE"),
        ("cli-tx", "WRITE"), ("cli-tx", "DESCRIBE"),
    }  # fmt: skip
    consumer = cli(
        cluster, "acl", "add", "--allow-principal", "User:cli", "--consumer", "--topic",
        "cli-", "--group", "cli-", "--resource-pattern-type", "prefixed",
    )  # fmt: skip
    assert consumer.returncode == 0, consumer.stderr
    assert "PREFIXED" in consumer.stdout and "READ" in consumer.stdout
    listed = cli(cluster, "acl", "list", "--principal", "User:cli", "--json")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 8  # 5 producer + topic READ, DESCRIBE + group READ
    matching = cli(
        cluster, "acl", "list", "--topic", "cli-orders", "--resource-pattern-type", "match",
        "--json",
    )  # fmt: skip
    assert {r["pattern_type"] for r in json.loads(matching.stdout)} == {"LITERAL", "PREFIXED"}
    bad = cli(cluster, "acl", "add", "--allow-principal", "User:cli", "--operation", "Read",
              "--cluster")  # fmt: skip
    assert bad.returncode == 1 and "INVALID_REQUEST" in bad.stderr
    removed = cli(cluster, "acl", "remove", "--topic", "cli-orders", "--force", "--json")
    assert removed.returncode == 0, removed.stderr
    assert len(json.loads(removed.stdout)) == 3
    rest = cli(
        cluster, "acl", "remove", "--allow-principal", "User:cli", "--topic", "cli-", "--group",
        "cli-", "--transactional-id", "cli-tx", "--resource-pattern-type", "any", "--force",
    )  # fmt: skip
    assert rest.returncode == 0, rest.stderr
    assert json.loads(cli(cluster, "acl", "list", "--principal", "User:cli", "--json").stdout) == []

    password_file = tmp_path / "password"
    password_file.write_text("cli-secret\n")
    set_file = cli(cluster, "user", "set-password", "cli-alice", "--password-file",
                   str(password_file), "--iterations", "8192")  # fmt: skip
    assert set_file.returncode == 0, set_file.stderr
    assert "cli-secret" not in set_file.stdout + set_file.stderr
    set_stdin = cli(cluster, "user", "set-password", "cli-alice", "--mechanism", "SCRAM-SHA-256",
                    stdin="other-secret\n")  # fmt: skip
    assert set_stdin.returncode == 0, set_stdin.stderr
    users = json.loads(cli(cluster, "user", "list", "cli-alice", "--json").stdout)
    assert users == [
        {"user": "cli-alice", "mechanism": "SCRAM-SHA-256", "iterations": 4096},
        {"user": "cli-alice", "mechanism": "SCRAM-SHA-512", "iterations": 8192},
    ]
    table = cli(cluster, "user", "list")
    assert "cli-alice" in table.stdout and "SCRAM-SHA-512" in table.stdout
    deleted = cli(cluster, "user", "delete", "cli-alice", "--mechanism", "SCRAM-SHA-256",
                  "--mechanism", "SCRAM-SHA-512")  # fmt: skip
    assert deleted.returncode == 0, deleted.stderr
    missing = cli(cluster, "user", "list", "cli-alice")
    assert missing.returncode == 1 and "RESOURCE_NOT_FOUND" in missing.stderr
    again = cli(cluster, "user", "delete", "cli-alice", "--mechanism", "SCRAM-SHA-512")
    assert again.returncode == 1 and "RESOURCE_NOT_FOUND" in again.stderr


def _state(
    admin: AdminClient,
) -> tuple[list[AclBinding], dict[str, tuple[ScramCredentialInfo, ...]]]:
    return admin.describe_acls(), admin.describe_user_scram_credentials()


def _new_leader(admin: AdminClient, old: int) -> int | None:
    try:
        leader = admin.describe_quorum().leader_id
    except KafkaError:
        return None
    return leader if leader not in (old, -1) else None


def test_acls_and_credentials_survive_a_full_restart_and_a_controller_failover(
    cluster: LocalCluster,
) -> None:
    """Runs last: it restarts every node and kills the active controller."""
    bindings = [
        acl(ResourceType.TOPIC, "kept-", "User:kept", AclOperation.ALL, PatternType.PREFIXED),
        acl(
            ResourceType.GROUP,
            "kept-g",
            "User:kept",
            AclOperation.READ,
            permission=PermissionType.DENY,
        ),
    ]
    with AdminClient(cluster.bootstrap_servers) as admin:
        assert set(admin.create_acls(bindings).values()) == {None}
        upsert = UserScramCredentialUpsertion("kept-user", SHA512, "kept-pw", iterations=4096)
        assert admin.alter_user_scram_credentials([upsert]) == {"kept-user": None}
        before = _state(admin)
    assert set(bindings) <= set(before[0]) and "kept-user" in before[1]

    cluster.down()
    cluster.up(timeout_s=90)
    with AdminClient(cluster.bootstrap_servers) as admin:
        assert _state(admin) == before
        active = admin.describe_quorum().leader_id
    cluster.stop_node(active, kill=True)
    survivors = [s.node_id for s in cluster.specs if s.node_id != active]
    try:
        bootstrap = [cluster.broker_address(n) for n in survivors]
        with AdminClient(bootstrap) as admin:
            wait_for("a new active controller", lambda: _new_leader(admin, active), 60)
            after = wait_for("the new active controller's ACLs", lambda: _state(admin) or None, 60)
            assert after == before
        rd = RdAdminClient({"bootstrap.servers": cluster.kafka_address(survivors[0])})
        described = rd.describe_acls(_rd_filter("User:kept")).result(timeout=60)
        assert {b.name for b in described} == {"kept-", "kept-g"}
    finally:
        cluster.start_node(active)
