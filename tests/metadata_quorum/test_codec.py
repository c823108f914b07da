"""The metadata codec: a sample batch round trips, the wire form is pinned, bad bytes refused."""

from __future__ import annotations

import uuid

import pytest

from metadata_quorum.codec import (
    CodecError,
    decode_batch,
    decode_snapshot,
    encode_batch,
    encode_snapshot,
    snapshot_to_proto,
)
from metadata_quorum.image import MetadataImage, apply
from metadata_quorum.records import (
    AccessControlEntryRecord,
    BrokerRegistrationChange,
    ConfigRecord,
    ConfigResourceType,
    ControllerVoter,
    CordonBroker,
    Endpoint,
    FenceBroker,
    LeaderChange,
    MetadataRecord,
    PartitionChange,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBroker,
    RemoveAccessControlEntryRecord,
    RemoveTopic,
    RemoveUserScramCredentialRecord,
    TopicRecord,
    UnfenceBroker,
    UnregisterBroker,
    UserScramCredentialRecord,
    VotersRecord,
)
from metadata_quorum.security.acl import (
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from metadata_quorum.security.scram import ScramMechanism, make_credential
from protos import metadata_pb2 as pb

TOPIC_ID = uuid.UUID("3f2a0c1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b")
STATIC_CONFIGS = (("follower.replication.throttled.rate", "1000"),)  # its node config file's
SAMPLE: list[MetadataRecord] = [
    LeaderChange(leader_id=1, term=3),
    RegisterBroker(1, "inc-1", (Endpoint("BROKER", "127.0.0.11", 9092),), "rack-a"),
    RegisterBroker(2, "inc-2", (Endpoint("BROKER", "127.0.0.12", 9092),), None, STATIC_CONFIGS),
    UnfenceBroker(1, 1),
    UnfenceBroker(2, 2),
    TopicRecord("orders", TOPIC_ID),
    ConfigRecord(ConfigResourceType.TOPIC, "orders", "retention.ms", "60000"),
    ConfigRecord(ConfigResourceType.TOPIC, "orders", "cleanup.policy", ""),
    ConfigRecord(ConfigResourceType.TOPIC, "orders", "cleanup.policy", None),
    PartitionRecord(TOPIC_ID, 0, (1, 2), (1, 2), 1),
    PartitionChange(TOPIC_ID, 0, 0, isr=(1,)),
    PartitionChange(TOPIC_ID, 0, 1, leader=-1),
    PartitionChange(TOPIC_ID, 0, 2, leader=1, isr=(), replicas=(1, 2)),
    PartitionRecord(TOPIC_ID, 1, (3, 1, 2), (1, 2), 1, 4, 7, (3,), (2,)),
    PartitionChange(TOPIC_ID, 1, 7, replicas=(3, 1), adding_replicas=(), removing_replicas=()),
    PartitionRecord(TOPIC_ID, 2, (1, 2, 3), (), -1, 3, 9, elr=(1, 3), last_known_elr=(2,)),
    PartitionChange(TOPIC_ID, 2, 9, leader=1, isr=(1,), elr=(3,)),
    PartitionChange(TOPIC_ID, 2, 10, elr=(), last_known_elr=()),
    ProducerIdsRecord(1, 1, 1000),
    BrokerRegistrationChange(2, 2, in_controlled_shutdown=True),
    CordonBroker(2, cordoned=True),
    CordonBroker(1, cordoned=False),
    FenceBroker(2, 2),
    UnregisterBroker(2, 2),
    RemoveTopic(TOPIC_ID),
    VotersRecord((ControllerVoter(1, "127.0.0.11", 9093, 9094), ControllerVoter(4, "h4", 1, 2))),
]


def test_sample_batch_round_trips() -> None:
    assert decode_batch(encode_batch(SAMPLE)) == SAMPLE
    assert {type(r) for r in SAMPLE} >= {
        LeaderChange,
        RegisterBroker,
        UnfenceBroker,
        TopicRecord,
        ConfigRecord,
        PartitionRecord,
        PartitionChange,
        ProducerIdsRecord,
        BrokerRegistrationChange,
        CordonBroker,
        FenceBroker,
        UnregisterBroker,
        RemoveTopic,
    }


def test_unset_and_empty_optional_fields_stay_apart() -> None:
    """``None`` (unchanged / delete) and an empty value are different records."""
    unchanged, emptied = decode_batch(
        encode_batch([PartitionChange(TOPIC_ID, 0, 0), PartitionChange(TOPIC_ID, 0, 0, isr=())])
    )
    assert isinstance(unchanged, PartitionChange) and isinstance(emptied, PartitionChange)
    assert (unchanged.isr, unchanged.leader, unchanged.replicas) == (None, None, None)
    assert emptied.isr == ()


def test_wire_form_is_pinned() -> None:
    """Field numbers are a compatibility promise: this exact encoding must never change."""
    assert encode_batch([FenceBroker(1, 7)]).hex() == "0a081a06080110011807"


def test_snapshot_round_trips_at_its_offset() -> None:
    image, rejected = apply(MetadataImage(), SAMPLE[:10])
    assert rejected == []
    restored = decode_snapshot(encode_snapshot(image))
    assert restored == image
    assert restored.offset == 9


def test_a_cordon_survives_a_snapshot_and_a_re_registration_not_an_unregistration() -> None:
    endpoints = (Endpoint("BROKER", "127.0.0.12", 9092),)
    image, rejected = apply(MetadataImage(), [
        RegisterBroker(2, "inc-2", endpoints, None),
        CordonBroker(2, cordoned=True),
        CordonBroker(5, cordoned=True),  # not registered: rejected, nothing changes
    ])  # fmt: skip
    assert [r.offset for r in rejected] == [2]
    assert image.brokers[2].cordoned and image.cordoned_broker_ids() == {2}
    restored = decode_snapshot(encode_snapshot(image))
    assert restored == image and restored.brokers[2].cordoned
    restarted, _ = apply(restored, [RegisterBroker(2, "inc-3", endpoints, None)])
    assert restarted.brokers[2].incarnation_id == "inc-3" and restarted.brokers[2].cordoned
    epoch = restarted.brokers[2].broker_epoch
    lifted, _ = apply(restarted, [CordonBroker(2, cordoned=False)])
    assert not lifted.brokers[2].cordoned
    gone, _ = apply(
        restarted, [UnregisterBroker(2, epoch), RegisterBroker(2, "inc-4", endpoints, None)]
    )
    assert not gone.brokers[2].cordoned  # unregistered: the broker starts afresh


READ_ORDERS = AclBinding(
    ResourceType.TOPIC, "orders", PatternType.LITERAL, "User:alice", "*",
    AclOperation.READ, PermissionType.ALLOW,
)  # fmt: skip
DENY_PREFIX = AclBinding(
    ResourceType.GROUP, "app-", PatternType.PREFIXED, "User:*", "10.0.0.1",
    AclOperation.ALL, PermissionType.DENY,
)  # fmt: skip
SHA256 = ScramMechanism.SCRAM_SHA_256
SHA512 = ScramMechanism.SCRAM_SHA_512


def test_acls_and_scram_credentials_round_trip_and_survive_a_snapshot() -> None:
    alice_256 = make_credential(SHA256, "secret", b"salt-1", 4096)
    alice_512 = make_credential(SHA512, "secret", b"salt-2", 8192)
    records: list[MetadataRecord] = [
        AccessControlEntryRecord(READ_ORDERS),
        AccessControlEntryRecord(DENY_PREFIX),
        UserScramCredentialRecord("alice", alice_256),
        UserScramCredentialRecord("alice", alice_512),
        UserScramCredentialRecord("bob", make_credential(SHA512, "pw", b"s", 4096)),
        RemoveAccessControlEntryRecord(DENY_PREFIX),
        RemoveUserScramCredentialRecord("bob", SHA512),
    ]
    assert decode_batch(encode_batch(records)) == records
    image, rejected = apply(MetadataImage(), records)
    assert rejected == []
    assert image.acls == {READ_ORDERS}
    assert image.scram_credentials == {"alice": {SHA256: alice_256, SHA512: alice_512}}
    restored = decode_snapshot(encode_snapshot(image))
    assert restored == image
    assert restored.acls == image.acls and restored.scram_credentials == image.scram_credentials


def test_acl_and_credential_wire_forms_are_pinned() -> None:
    assert encode_batch([RemoveUserScramCredentialRecord("u", SHA512)]).hex() == (
        "0a0a92010708011201751802"
    )


@pytest.mark.parametrize(
    "message",
    [
        pb.MetadataRecord(
            user_scram_credential=pb.UserScramCredentialRecord(version=1, name="u", mechanism=7)
        ),
        pb.MetadataRecord(
            access_control_entry=pb.AccessControlEntryRecord(
                version=1, binding=pb.AclBindingEntry(resource_type=99)
            )
        ),
    ],
    ids=["unknown-mechanism", "unknown-resource-type"],
)
def test_unknown_security_codes_are_refused(message: pb.MetadataRecord) -> None:
    raw = pb.MetadataRecordBatch(records=[message]).SerializeToString()
    with pytest.raises(CodecError, match="unknown"):
        decode_batch(raw)


def test_newer_record_version_is_refused() -> None:
    message = pb.MetadataRecordBatch(
        records=[pb.MetadataRecord(fence_broker=pb.FenceBrokerRecord(version=99, broker_id=1))]
    )
    with pytest.raises(CodecError, match="version 99"):
        decode_batch(message.SerializeToString())


def test_newer_snapshot_version_is_refused() -> None:
    message = snapshot_to_proto(MetadataImage())
    message.version = 99
    with pytest.raises(CodecError, match="version 99"):
        decode_snapshot(message.SerializeToString())


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"\xff\xff\xff\xff", id="bad-varint"),
        pytest.param(b"not a metadata batch", id="text"),
        pytest.param(b"\x0a\x05abc", id="truncated"),
        pytest.param(b"\x0a\x00", id="record-without-type"),
        pytest.param(b"\x0a\x02\x32\x00", id="topic-id-not-16-bytes"),
        pytest.param(b"\x0a\x02\x1a\x00", id="record-without-version"),
    ],
)
def test_garbage_batch_is_refused(garbage: bytes) -> None:
    with pytest.raises(CodecError):
        decode_batch(garbage)


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"\xff\xff\xff\xff", id="bad-varint"),
        pytest.param(b"not a metadata snapshot", id="text"),
        pytest.param(b"\x0a\x00", id="no-version"),
        pytest.param(b"", id="empty"),
    ],
)
def test_garbage_snapshot_is_refused(garbage: bytes) -> None:
    with pytest.raises(CodecError):
        decode_snapshot(garbage)


def test_unknown_config_resource_type_is_refused() -> None:
    config = pb.ConfigRecord(version=1, name="x")
    config.resource_type = 3  # type: ignore[assignment]  # not a ConfigResourceType we know
    message = pb.MetadataRecordBatch(records=[pb.MetadataRecord(config=config)])
    with pytest.raises(CodecError, match="resource type 3"):
        decode_batch(message.SerializeToString())
