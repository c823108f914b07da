"""The finalized feature levels switch APIs off (dataplane/kafka/features.py), as a Kafka 4 broker
does: group.version 0 takes ConsumerGroupHeartbeat and ConsumerGroupDescribe out of ApiVersions
and answers them UNSUPPORTED_VERSION, share.version 0 the share group APIs. Pure: the answers
are encoded and read back in every version the listener serves. The cluster test is
test_feature_levels.py."""

from __future__ import annotations

from typing import Any

import pytest
from kio.serial import entity_reader

from dataplane.kafka import codec as kc
from dataplane.kafka.features import GATED_APIS, disabled_apis, feature_refusal
from metadata_quorum.features import BOOTSTRAP_FEATURES
from metadata_quorum.image import MetadataImage
from raftlog.errors import ErrorCode

CONSUMER_GROUP_APIS = {kc.API_CONSUMER_GROUP_HEARTBEAT, kc.API_CONSUMER_GROUP_DESCRIBE}
SHARE_APIS = {
    kc.API_SHARE_GROUP_HEARTBEAT, kc.API_SHARE_GROUP_DESCRIBE, kc.API_SHARE_FETCH,
    kc.API_SHARE_ACKNOWLEDGE,
}  # fmt: skip
MEMBER = {"group_id": "g", "member_id": "m", "member_epoch": 0}
SESSION = {"group_id": "g", "member_id": "m", "share_session_epoch": 0, "topics": []}
BODIES: dict[int, dict[str, Any]] = {
    kc.API_CONSUMER_GROUP_HEARTBEAT: {**MEMBER, "topic_partitions": None},
    kc.API_CONSUMER_GROUP_DESCRIBE: {
        "group_ids": ["g", "h"], "include_authorized_operations": True,
    },
    kc.API_SHARE_GROUP_HEARTBEAT: MEMBER,
    kc.API_SHARE_GROUP_DESCRIBE: {"group_ids": ["g"], "include_authorized_operations": False},
    kc.API_SHARE_FETCH: {
        **SESSION, "max_wait": 500, "min_bytes": 1, "max_records": 10, "batch_size": 10,
        "forgotten_topics_data": [],
    },
    kc.API_SHARE_ACKNOWLEDGE: SESSION,
}  # fmt: skip


def with_levels(**levels: int) -> MetadataImage:
    features = dict(BOOTSTRAP_FEATURES)
    features.update({name.replace("_", "."): level for name, level in levels.items()})
    return MetadataImage(offset=5, features=features)


def request(api_key: int, version: int) -> kc.Request:
    schema = kc.request_schema(api_key, version)
    return kc.Request(api_key, version, 9, "test", kc.to_entity(schema, BODIES[api_key]))


def read_back(api_key: int, version: int, data: kc.Data) -> Any:
    """``data`` encoded as the listener sends it, then read as a client reads it."""
    frame = kc.encode_response(api_key, version, 9, data)[kc.SIZE.size :]
    schema = kc.response_schema(api_key, version)
    _, offset = entity_reader(schema.__header_schema__)(frame, 0)
    body, _ = entity_reader(schema)(frame, offset)
    return body


def test_the_gated_apis_are_kafkas() -> None:
    assert set(GATED_APIS) == CONSUMER_GROUP_APIS | SHARE_APIS
    assert all(key in kc.SUPPORTED for key in GATED_APIS)


@pytest.mark.parametrize(
    ("image", "disabled"),
    [
        (with_levels(), set()),
        (with_levels(group_version=0), CONSUMER_GROUP_APIS),
        (with_levels(share_version=0), SHARE_APIS),
        (with_levels(group_version=0, share_version=0), CONSUMER_GROUP_APIS | SHARE_APIS),
        # before the bootstrap levels are written every feature is at 0 (Kafka's default)
        (MetadataImage(), CONSUMER_GROUP_APIS | SHARE_APIS),
    ],
)
def test_disabled_apis_follow_the_finalized_levels(
    image: MetadataImage, disabled: set[int]
) -> None:
    assert disabled_apis(image) == disabled
    for key in GATED_APIS:
        version = kc.SUPPORTED[key][1]
        assert (feature_refusal(image, request(key, version)) is not None) is (key in disabled)


@pytest.mark.parametrize("api_key", sorted(GATED_APIS))
def test_a_switched_off_api_is_answered_unsupported_version(api_key: int) -> None:
    image = with_levels(group_version=0, share_version=0)
    low, high = kc.SUPPORTED[api_key]
    for version in range(low, high + 1):
        refusal = feature_refusal(image, request(api_key, version))
        assert refusal is not None
        body = read_back(api_key, version, refusal)
        errors = (
            [(g.group_id, g.error_code, g.error_message) for g in body.groups]
            if hasattr(body, "groups")
            else [(None, body.error_code, body.error_message)]
        )
        feature = "group.version" if api_key in CONSUMER_GROUP_APIS else "share.version"
        for _, code, message in errors:
            assert code == ErrorCode.UNSUPPORTED_VERSION.code
            assert f"{feature} is 0 (it needs 1)" in message
        if hasattr(body, "groups"):  # every group asked for is answered
            assert [g for g, _, _ in errors] == BODIES[api_key]["group_ids"]
