"""ACLs and the authorizer, as Kafka's StandardAuthorizer decides (pure).

An ACL binds a resource pattern (type, name, LITERAL or PREFIXED; the LITERAL name ``*`` is the
wildcard) to an entry (principal or ``User:*``, host or ``*``, operation, ALLOW or DENY). ACLs are
metadata records (``AccessControlEntryRecord``), so every node decides from its own image.

The rules, Kafka's:
- a super user (``super.users``) may do anything;
- a DENY that matches wins over every ALLOW;
- ALLOW of READ, WRITE, DELETE or ALTER implies DESCRIBE; ALLOW of ALTER_CONFIGS implies
  DESCRIBE_CONFIGS; ALL (ALLOW or DENY) matches every operation. A DENY implies nothing else:
  DENY READ leaves DESCRIBE alone;
- when no ACL at all names the resource (whatever its principal), the answer is
  ``allow.everyone.if.no.acl.found`` (default false).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from metadata_quorum.security.principal import KafkaPrincipal, Session

WILDCARD = "*"  # the LITERAL resource name, principal name and host that match any
WILDCARD_PRINCIPAL = f"User:{WILDCARD}"


class ResourceType(enum.IntEnum):
    """Kafka's codes (AclResourceType); UNKNOWN and ANY only in filters."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters: any pattern type
    MATCH = 2  # filters: the patterns that would apply to the name
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class PermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"  # the one CLUSTER resource's name, as Kafka names it
# Which operations an ALLOW of the key implies besides itself
_IMPLIED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    AclOperation.DESCRIBE: frozenset(
        {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}
    ),
    AclOperation.DESCRIBE_CONFIGS: frozenset({AclOperation.ALTER_CONFIGS}),
}
# The operations a binding of each resource type may name (Kafka's AclEntry.supportedOperations)
_O = AclOperation
SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset(
        {_O.READ, _O.WRITE, _O.CREATE, _O.DESCRIBE, _O.DELETE, _O.ALTER}
        | {_O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS}
    ),
    # Kafka 4 adds DESCRIBE_CONFIGS and ALTER_CONFIGS (group configs)
    ResourceType.GROUP: frozenset(
        {_O.READ, _O.DESCRIBE, _O.DELETE, _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS}
    ),
    ResourceType.CLUSTER: frozenset(
        {_O.CREATE, _O.CLUSTER_ACTION, _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS}
        | {_O.IDEMPOTENT_WRITE, _O.ALTER, _O.DESCRIBE}
    ),
    ResourceType.TRANSACTIONAL_ID: frozenset({_O.DESCRIBE, _O.WRITE}),
}


@dataclass(frozen=True, order=True)
class AclBinding:
    """One ACL: a resource pattern and an access control entry. ``principal`` is Kafka's string
    form (``User:alice``, ``User:*``), ``host`` an address or ``*``."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: PermissionType

    def validate(self) -> None:
        """Kafka's checks on a new ACL (AclControlManager.validateNewAcl); ValueError says which
        (the caller answers INVALID_REQUEST)."""
        if self.resource_type not in SUPPORTED_OPERATIONS:
            raise ValueError(f"resource type {self.resource_type.name} cannot carry an ACL")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise ValueError(f"pattern type {self.pattern_type.name}: use LITERAL or PREFIXED")
        if self.operation in (AclOperation.ANY, AclOperation.UNKNOWN):
            raise ValueError(f"operation {self.operation.name} is only for filters")
        if self.permission not in (PermissionType.ALLOW, PermissionType.DENY):
            raise ValueError(f"permission {self.permission.name}: use ALLOW or DENY")
        allowed = SUPPORTED_OPERATIONS[self.resource_type] | {AclOperation.ALL}
        if self.operation not in allowed:
            raise ValueError(
                f"operation {self.operation.name} does not apply to a "
                f"{self.resource_type.name} resource"
            )
        if not self.resource_name:
            raise ValueError("the resource name is empty")
        if self.resource_type == ResourceType.CLUSTER and self.resource_name != CLUSTER_NAME:
            raise ValueError(f"the CLUSTER resource is named {CLUSTER_NAME!r}")
        KafkaPrincipal.parse(self.principal)
        if not self.host:
            raise ValueError("the host is empty (use * for any)")

    def __str__(self) -> str:
        return (
            f"{self.permission.name} {self.principal} {self.operation.name} from {self.host} on "
            f"{self.resource_type.name}:{self.pattern_type.name}:{self.resource_name}"
        )


@dataclass(frozen=True)
class AclFilter:
    """Kafka's AclBindingFilter (DescribeAcls, DeleteAcls): None or ANY matches anything;
    pattern type MATCH selects the bindings that would apply to ``resource_name``."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: PermissionType = PermissionType.ANY

    def matches(self, binding: AclBinding) -> bool:
        if self.resource_type not in (ResourceType.ANY, binding.resource_type):
            return False
        if not self._matches_pattern(binding):
            return False
        if self.principal is not None and self.principal != binding.principal:
            return False
        if self.host is not None and self.host != binding.host:
            return False
        if self.operation not in (AclOperation.ANY, binding.operation):
            return False
        return self.permission in (PermissionType.ANY, binding.permission)

    def _matches_pattern(self, binding: AclBinding) -> bool:
        if self.pattern_type == PatternType.MATCH:
            if self.resource_name is None:
                return True
            return _pattern_applies(binding, self.resource_name)
        if self.pattern_type not in (PatternType.ANY, binding.pattern_type):
            return False
        return self.resource_name is None or self.resource_name == binding.resource_name


def _pattern_applies(binding: AclBinding, name: str) -> bool:
    if binding.pattern_type == PatternType.PREFIXED:
        return name.startswith(binding.resource_name)
    return binding.resource_name in (name, WILDCARD)


def _operation_matches(binding: AclBinding, operation: AclOperation) -> bool:
    if binding.operation in (operation, AclOperation.ALL):
        return True
    return binding.permission == PermissionType.ALLOW and binding.operation in _IMPLIED_BY.get(
        operation, frozenset()
    )


class Authorizer:
    """Decides from a set of ACLs, indexed by resource type and name so that a request costs a
    few dict lookups however many ACLs there are (one per distinct prefix length)."""

    def __init__(
        self,
        bindings: Iterable[AclBinding],
        super_users: frozenset[KafkaPrincipal] = frozenset(),
        allow_everyone_if_no_acl_found: bool = False,
    ) -> None:
        self.super_users = super_users
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        self._prefixed: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        self._prefix_lengths: dict[ResourceType, set[int]] = {}
        self._by_type: dict[ResourceType, list[AclBinding]] = {}
        for binding in bindings:
            key = (binding.resource_type, binding.resource_name)
            if binding.pattern_type == PatternType.PREFIXED:
                self._prefixed.setdefault(key, []).append(binding)
                lengths = self._prefix_lengths.setdefault(binding.resource_type, set())
                lengths.add(len(binding.resource_name))
            else:
                self._literal.setdefault(key, []).append(binding)
            self._by_type.setdefault(binding.resource_type, []).append(binding)

    def _applicable(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        found = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            found.extend(self._literal.get((resource_type, WILDCARD), ()))
        for length in self._prefix_lengths.get(resource_type, ()):
            if length <= len(name):
                found.extend(self._prefixed.get((resource_type, name[:length]), ()))
        return found

    def authorize(
        self,
        session: Session | None,
        operation: AclOperation,
        resource_type: ResourceType,
        resource_name: str,
    ) -> bool:
        """May `session` do `operation` on the resource? None (the node itself) may."""
        if session is None or session.principal in self.super_users:
            return True
        applicable = self._applicable(resource_type, resource_name)
        if not applicable:
            return self.allow_everyone_if_no_acl_found
        allowed = False
        for binding in applicable:
            if not _entry_matches(binding, session) or not _operation_matches(binding, operation):
                continue
            if binding.permission == PermissionType.DENY:
                return False
            allowed = True
        return allowed

    def authorize_any(
        self, session: Session | None, operation: AclOperation, resource_type: ResourceType
    ) -> bool:
        """Kafka's authorizeByResourceType (KIP-679): is `operation` allowed on at least one
        resource of the type, by an ALLOW no DENY of the same principal cancels? An idempotent
        producer needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic."""
        if session is None or session.principal in self.super_users:
            return True
        bindings = [
            b
            for b in self._by_type.get(resource_type, ())
            if _entry_matches(b, session) and _operation_matches(b, operation)
        ]
        denied_all = any(
            b.permission == PermissionType.DENY
            and b.pattern_type == PatternType.LITERAL
            and b.resource_name == WILDCARD
            for b in bindings
        )
        if denied_all:
            return False
        denied = {
            (b.pattern_type, b.resource_name)
            for b in bindings
            if b.permission == PermissionType.DENY
        }
        return any(
            b.permission == PermissionType.ALLOW
            and not any(
                (pattern, name) in denied
                for pattern, name in _covering(b.pattern_type, b.resource_name)
            )
            for b in bindings
        )


def _covering(pattern: PatternType, name: str) -> list[tuple[PatternType, str]]:
    """The patterns whose DENY covers everything `pattern`/`name` allows."""
    covering = [(PatternType.LITERAL, WILDCARD)]
    covering.extend((PatternType.PREFIXED, name[:i]) for i in range(len(name) + 1))
    if pattern == PatternType.LITERAL:
        covering.append((PatternType.LITERAL, name))
    return covering


def _entry_matches(binding: AclBinding, session: Session) -> bool:
    if binding.principal != WILDCARD_PRINCIPAL and binding.principal != str(session.principal):
        return False
    return binding.host in (WILDCARD, session.client_host)
