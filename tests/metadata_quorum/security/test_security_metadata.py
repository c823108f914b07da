"""ACLs and SCRAM credentials as metadata: replay, rejections, snapshots; and a node's
AccessControl over its image (rebuilt only when the ACLs change, denials audited)."""

from __future__ import annotations

import logging

import pytest

from metadata_quorum.image import MetadataImage, apply, from_records, to_records
from metadata_quorum.records import (
    AccessControlEntryRecord,
    RemoveAccessControlEntryRecord,
    RemoveUserScramCredentialRecord,
    UserScramCredentialRecord,
)
from metadata_quorum.security.acl import (
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from metadata_quorum.security.authorization import AccessControl, AuthorizerSettings
from metadata_quorum.security.principal import KafkaPrincipal, Session, acting_as
from metadata_quorum.security.scram import ScramMechanism, make_credential
from raftlog.errors import ErrorCode, KafkaError

READ_ORDERS = AclBinding(
    ResourceType.TOPIC, "orders", PatternType.LITERAL, "User:alice", "*", AclOperation.READ,
    PermissionType.ALLOW,
)  # fmt: skip
SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
ALICE_256 = make_credential(SHA256, "pw", b"0123456789abcdef", 4096)
ALICE_512 = make_credential(SHA512, "pw", b"0123456789abcdef", 4096)
ALICE = Session(KafkaPrincipal.user("alice"), "127.0.0.1", "KAFKA")


def test_acls_replay_and_reject_duplicates_and_strangers() -> None:
    image, rejected = apply(
        MetadataImage(),
        [
            AccessControlEntryRecord(READ_ORDERS),
            AccessControlEntryRecord(READ_ORDERS),  # the same ACL twice: refused
            RemoveAccessControlEntryRecord(READ_ORDERS),
            RemoveAccessControlEntryRecord(READ_ORDERS),  # already gone: refused
            AccessControlEntryRecord(READ_ORDERS),
        ],
    )
    assert image.acls == frozenset({READ_ORDERS})
    assert [r.offset for r in rejected] == [1, 3]
    assert image.offset == 4


def test_credentials_replay_per_mechanism() -> None:
    image, rejected = apply(
        MetadataImage(),
        [
            UserScramCredentialRecord("alice", ALICE_256),
            UserScramCredentialRecord("alice", ALICE_512),
            RemoveUserScramCredentialRecord("alice", SHA256),
            RemoveUserScramCredentialRecord("bob", SHA256),  # none: refused
        ],
    )
    assert image.scram_credential("alice", SHA512) == ALICE_512
    assert image.scram_credential("alice", SHA256) is None
    assert [r.offset for r in rejected] == [3]
    image, _ = apply(image, [RemoveUserScramCredentialRecord("alice", SHA512)])
    assert image.scram_credentials == {}  # the last credential gone: the user is gone


def test_snapshot_carries_acls_and_credentials() -> None:
    image, _ = apply(
        MetadataImage(),
        [AccessControlEntryRecord(READ_ORDERS), UserScramCredentialRecord("alice", ALICE_512)],
    )
    brokers, records = to_records(image)
    rebuilt = from_records(image.offset, brokers, records, image.next_producer_id)
    assert rebuilt.acls == image.acls
    assert rebuilt.scram_credentials == image.scram_credentials


def test_base_image_is_not_changed_by_a_delta() -> None:
    base, _ = apply(MetadataImage(), [AccessControlEntryRecord(READ_ORDERS)])
    after, _ = apply(base, [RemoveAccessControlEntryRecord(READ_ORDERS)])
    assert base.acls == frozenset({READ_ORDERS}) and after.acls == frozenset()
    untouched, _ = apply(base, [UserScramCredentialRecord("alice", ALICE_256)])
    assert untouched.acls is base.acls  # unchanged ACLs keep their identity (no rebuild)


def test_access_control_follows_the_image(caplog: pytest.LogCaptureFixture) -> None:
    images = [MetadataImage()]
    access = AccessControl(lambda: images[-1], AuthorizerSettings())
    with acting_as(ALICE):
        assert not access.allowed(AclOperation.READ, ResourceType.TOPIC, "orders")
        images.append(apply(images[-1], [AccessControlEntryRecord(READ_ORDERS)])[0])
        assert access.allowed(AclOperation.READ, ResourceType.TOPIC, "orders")
        assert access.filter(AclOperation.DESCRIBE, ResourceType.TOPIC, ["a", "orders"]) == [
            "orders"
        ]
        with (
            caplog.at_level(logging.WARNING, logger="raftlog.audit"),
            pytest.raises(KafkaError) as denied,
        ):
            access.check(AclOperation.WRITE, ResourceType.TOPIC, "orders")
        assert denied.value.error == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        assert "principal=User:alice" in caplog.text and "resource=TOPIC:orders" in caplog.text
        with pytest.raises(KafkaError) as denied:
            access.check(AclOperation.READ, ResourceType.GROUP, "g")
        assert denied.value.error == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert access.allowed(AclOperation.WRITE, ResourceType.TOPIC, "orders")  # the node itself


def test_no_authorizer_allows_everything() -> None:
    access = AccessControl(MetadataImage, None)
    with acting_as(ALICE):
        assert access.allowed(AclOperation.ALTER, ResourceType.CLUSTER, "kafka-cluster")
    assert not access.enabled
