"""A chaos run against a secure cluster (``raftlog chaos run --secure``).

The run's cluster is ``LocalCluster(secure=True)`` (dataplane/tools/secure_cluster.py): every
listener but METRICS SASL_SSL, the StandardAuthorizer, the Raft transport under TLS between the
nodes' certificates. Who connects as whom:

- The workloads (producers, group members, the committed-offsets watcher, the admin workload,
  the metadata sampler) and the transformers connect as the SCRAM user ``chaos``
  (`WORKLOAD_USER`, SCRAM-SHA-512 over TLS) that holds only the ACLs a least-privileged client of
  the run needs (`workload_acls`), so the run exercises authentication and authorization under
  faults as well: a refusal shows as a failed operation (and a ``DENIED`` line on the
  ``raftlog.audit`` logger of the node's log), a lost credential as a workload that stops.
- The harness's own reads and checks (recovery, the final state, the controllers' images) and
  the faults that act on the cluster (reassign, membership) use the admin's certificate
  (``LocalCluster.admin_security``), a super user, as Kafka's operators would.

The transformer processes read the workload user's settings from ``secrets/chaos.properties``
(0600, librdkafka's property names: ``--command-config``); the run makes a new password every
time it starts.

Node processes run as their own system users (chaos/network.py), and the secrets are root's,
0600 in a 0700 directory. `share_secrets` lets each node read what it needs and nothing more:
its own keystore (handed to its user; the Raft transport's TLS uses it too), the CA's certificate
(readable by the node group), passage through the directory (search, no listing). The CA's key,
the admin's keystore and password and the workload user's settings stay root's alone.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from chaos.network import NodeIdentity, node_group_gid
from dataplane.client import AdminClient
from dataplane.client.admin import UserScramCredentialUpsertion
from dataplane.tools.local_cluster import LocalCluster, wait_until_brokers_know
from dataplane.tools.secure_cluster import ClusterSecrets, write_properties
from metadata_quorum.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from metadata_quorum.security.channels import ClientSecurity
from metadata_quorum.security.scram import ScramMechanism
from raftlog.errors import KafkaError

WORKLOAD_USER = "chaos"
WORKLOAD_MECHANISM = ScramMechanism.SCRAM_SHA_512
PASSWORD_BYTES = 24
PROPERTIES_NAME = "chaos.properties"
PROPAGATION_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class WorkloadResources:
    """What the run's workloads touch: the ACLs of `workload_acls` name exactly these."""

    topics: tuple[str, ...]  # produced to and consumed from
    groups: tuple[str, ...]  # consumer groups (the workload's, the transformers')
    admin_topic_prefix: str  # the topics the admin workload creates and deletes
    transactional_id_prefix: str | None = None  # the transformers' ids (transactions workload)


def workload_acls(principal: str, resources: WorkloadResources) -> list[AclBinding]:
    """The least a client of the run needs (Kafka's per-request ACLs; DESCRIBE is implied by
    READ, WRITE, CREATE and DELETE):

    - TOPIC each workload topic: READ, WRITE;
    - TOPIC prefixed with the admin workload's prefix: CREATE, DELETE;
    - GROUP each group: READ (join, commit, fetch offsets);
    - TRANSACTIONAL_ID prefixed with the transformers' prefix: WRITE;
    - CLUSTER: IDEMPOTENT_WRITE (InitProducerId of an idempotent producer; KIP-679 would let
      WRITE on a topic do, granted anyway as Kafka's docs advise for older brokers)."""

    def allow(
        resource: ResourceType, name: str, operation: AclOperation, prefixed: bool = False
    ) -> AclBinding:
        pattern = PatternType.PREFIXED if prefixed else PatternType.LITERAL
        return AclBinding(resource, name, pattern, principal, "*", operation, PermissionType.ALLOW)

    out = [allow(ResourceType.CLUSTER, CLUSTER_NAME, AclOperation.IDEMPOTENT_WRITE)]
    out += [allow(ResourceType.GROUP, group, AclOperation.READ) for group in resources.groups]
    if resources.transactional_id_prefix is not None:
        out.append(
            allow(
                ResourceType.TRANSACTIONAL_ID, resources.transactional_id_prefix,
                AclOperation.WRITE, prefixed=True,
            )
        )  # fmt: skip
    out += [
        allow(ResourceType.TOPIC, resources.admin_topic_prefix, operation, prefixed=True)
        for operation in (AclOperation.CREATE, AclOperation.DELETE)
    ]
    out += [
        allow(ResourceType.TOPIC, topic, operation)
        for topic in resources.topics
        for operation in (AclOperation.READ, AclOperation.WRITE)
    ]
    return out


@dataclass(frozen=True)
class RunSecurity:
    """How the parts of a secure run connect (see the module's docstring)."""

    harness: ClientSecurity  # the admin's certificate: a super user
    workload: ClientSecurity  # the SCRAM user `WORKLOAD_USER` over TLS
    workload_properties: Path  # the same for the transformer processes (--command-config)


def workload_settings(secrets_of: ClusterSecrets, password: str) -> dict[str, str]:
    """The workload user's client settings, librdkafka's names (ClientSecurity takes them)."""
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": WORKLOAD_MECHANISM.mechanism_name,
        "sasl.username": WORKLOAD_USER,
        "sasl.password": password,
        "ssl.ca.location": str(secrets_of.truststore),
    }


def set_up(local: LocalCluster, resources: WorkloadResources) -> RunSecurity:
    """Create the workload user's ACLs, then the user (a new password), over the admin's
    certificate; write its properties file, and wait until every broker knows the user
    (`wait_until_brokers_know`). The ACLs go first: a broker that authenticates the user has applied
    them too (the metadata log is applied in order), so no client of the run meets a broker
    that knows the user but not yet what it may do. Raises KafkaError when the cluster refuses
    either."""
    harness = local.admin_security
    if harness is None:
        raise ValueError("the run's cluster is not secure")
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    acls = workload_acls(f"User:{WORKLOAD_USER}", resources)
    with AdminClient(
        local.bootstrap_servers, security=harness, request_timeout_ms=REQUEST_TIMEOUT_MS
    ) as admin:
        refused = [(b, e) for b, e in admin.create_acls(acls).items() if e is not None]
        if refused:
            binding, first = refused[0]
            raise KafkaError(first.error, f"the ACL {binding} was refused: {first}")
        upsertion = UserScramCredentialUpsertion(WORKLOAD_USER, WORKLOAD_MECHANISM, password)
        error = admin.alter_user_scram_credentials([upsertion])[WORKLOAD_USER]
        if error is not None:
            raise error
    settings = workload_settings(local.secrets, password)
    path = write_properties(
        local.secrets.directory / PROPERTIES_NAME, settings,
        "raftlog chaos run --secure: the workload user over TLS",
    )  # fmt: skip
    workload = ClientSecurity.from_properties(settings)
    wait_until_brokers_know(
        local.bootstrap_servers, workload, resources.topics, PROPAGATION_TIMEOUT_S
    )
    return RunSecurity(harness=harness, workload=workload, workload_properties=path)


def share_secrets(secrets_of: ClusterSecrets, node_id: int, identity: NodeIdentity) -> None:
    """Let node ``node_id``'s processes (running as `identity`, with the node group as a
    supplementary group: chaos/network.py `spawn`) read what a secure node reads: its keystore
    becomes its user's (still 0600), the CA's certificate the node group's (0640), the
    directory searchable by the node group (0710: no listing). Run after
    ``ClusterSecrets.ensure`` made the files and before the node starts."""
    group = node_group_gid()
    directory = secrets_of.directory
    os.chown(directory, 0, group)
    directory.chmod(0o710)
    os.chown(secrets_of.truststore, 0, group)
    secrets_of.truststore.chmod(0o640)
    keystore = secrets_of.node_keystore(node_id)
    os.chown(keystore, identity.uid, identity.gid)
    keystore.chmod(0o600)
