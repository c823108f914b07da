"""A node's access control: the authorizer over the node's own metadata image, and the audit log.

Every handler that serves a client asks `AccessControl` before it touches state; the answer
comes from the ACLs in the image the node already holds (no round trip). The `Authorizer` is
rebuilt only when the image's ACLs change. With no authorizer configured
(``authorizer.class.name`` empty) everything is allowed, as in Kafka.

Every denial, and every ACL or credential change, is written to the ``raftlog.audit`` logger:
one line with the principal, its address, the listener, the operation and the resource.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from metadata_quorum.image import MetadataImage
from metadata_quorum.security.acl import AclOperation, Authorizer, ResourceType
from metadata_quorum.security.principal import KafkaPrincipal, Session, current_session
from raftlog.errors import ErrorCode, KafkaError

audit = logging.getLogger("raftlog.audit")

# Kafka's class names for its KRaft authorizer; either turns ours on
STANDARD_AUTHORIZERS = frozenset(
    {"org.apache.kafka.metadata.authorizer.StandardAuthorizer", "StandardAuthorizer"}
)
DENIED_ERROR = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


@dataclass(frozen=True)
class AuthorizerSettings:
    """``super.users`` (``User:a;User:b``) and ``allow.everyone.if.no.acl.found``."""

    super_users: frozenset[KafkaPrincipal] = frozenset()
    allow_everyone_if_no_acl_found: bool = False

    @classmethod
    def parse(cls, super_users: str, allow_everyone_if_no_acl_found: bool) -> AuthorizerSettings:
        users = frozenset(
            KafkaPrincipal.parse(p.strip()) for p in super_users.split(";") if p.strip()
        )
        return cls(users, allow_everyone_if_no_acl_found)


def describe(session: Session | None) -> str:
    if session is None:
        return "principal=(node) host=- listener=-"
    return f"principal={session.principal} host={session.client_host} listener={session.listener}"


class AccessControl:
    """`settings` None: no authorizer, everything allowed. `image_of` gives the node's current
    metadata image (the broker's or the controller's)."""

    def __init__(
        self, image_of: Callable[[], MetadataImage], settings: AuthorizerSettings | None
    ) -> None:
        self._image_of = image_of
        self.settings = settings
        # (the ACL set it was built from, the authorizer): replaced whole, read without a lock
        self._built: tuple[frozenset[object], Authorizer] | None = None

    @property
    def enabled(self) -> bool:
        return self.settings is not None

    def authorizer(self) -> Authorizer | None:
        """The authorizer of the image's ACLs, rebuilt only when they change (two requests
        racing over a change may both build it: the same result)."""
        if self.settings is None:
            return None
        acls = self._image_of().acls
        built = self._built
        if built is None or built[0] is not acls:
            settings = self.settings
            authorizer = Authorizer(
                acls, settings.super_users, settings.allow_everyone_if_no_acl_found
            )
            built = self._built = (acls, authorizer)
        return built[1]

    def allowed(
        self,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
        *,
        log_denial: bool = True,
    ) -> bool:
        """May the current session do this? A denial is audited unless `log_denial` is False
        (filters such as Metadata's list of topics drop what is not described, silently as
        Kafka does)."""
        authorizer = self.authorizer()
        if authorizer is None:
            return True
        session = current_session()
        if authorizer.authorize(session, operation, resource_type, name):
            return True
        if log_denial:
            audit.warning(
                "DENIED %s operation=%s resource=%s:%s",
                describe(session), operation.name, resource_type.name, name,
            )  # fmt: skip
        return False

    def allowed_any(self, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Allowed on at least one resource of the type (Kafka's authorizeByResourceType)."""
        authorizer = self.authorizer()
        return authorizer is None or authorizer.authorize_any(
            current_session(), operation, resource_type
        )

    def check(self, operation: AclOperation, resource_type: ResourceType, name: str) -> None:
        """Raise KafkaError with the resource type's *_AUTHORIZATION_FAILED when denied."""
        if not self.allowed(operation, resource_type, name):
            raise KafkaError(
                DENIED_ERROR.get(resource_type, ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
                f"{_principal()} may not {operation.name} {resource_type.name} {name!r}",
            )

    def filter(
        self, operation: AclOperation, resource_type: ResourceType, names: Iterable[str]
    ) -> list[str]:
        """The names the current session may `operation` (denials not audited: a listing)."""
        return [n for n in names if self.allowed(operation, resource_type, n, log_denial=False)]


def _principal() -> str:
    session = current_session()
    return "the node" if session is None else str(session.principal)


def audit_change(what: str) -> None:
    """An ACL or credential change, with who made it."""
    audit.info("CHANGE %s %s", describe(current_session()), what)


ALLOW_ALL = AccessControl(MetadataImage, None)
