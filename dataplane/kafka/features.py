"""The KAFKA listener's feature APIs (KIP-584/778): ApiVersions' features and UpdateFeatures.

ApiVersions v3+ carries the features this broker supports and the cluster's finalized levels,
read from the broker's metadata image (the levels the controller wrote as FeatureLevelRecords,
metadata_quorum/features.py); the epoch of the finalized levels is the image's metadata offset,
as a Kafka broker reports its image's. Below v4 (advertised, as Kafka 4 does),
features whose lowest supported level is 0 are left out of ``supported_features`` (KAFKA-17492:
older clients cannot read them), so v3 lists only metadata.version there and v4 every feature;
finalized features at level 0 are never listed. Admin clients' "describe features" is this answer.

UpdateFeatures is forwarded to the controller, which checks and writes the new levels all or
nothing; as Kafka's controller answers, a refused update is the top-level error ("The update
failed for all features since ...") with no per-feature results, an accepted one lists every
feature with NONE. Authorization: ALTER on the cluster (metadata_quorum.request_authorization).

The levels are enforced here as a Kafka 4 broker enforces them (KafkaApis'
``isConsumerGroupProtocolEnabled`` / ``isShareGroupProtocolEnabled``): an API whose feature is
below the level that switches it on (``GATED_APIS``) is left out of ApiVersions and answered
UNSUPPORTED_VERSION in its own response layout. Both read the broker's image of the moment, so
an UpdateFeatures takes effect without a restart, once the broker has the new levels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataplane.broker import authorization as authz
from dataplane.kafka import codec as kc
from metadata_quorum.features import (
    CONSUMER_GROUP_PROTOCOL,
    SHARE_GROUPS,
    SUPPORTED_FEATURES,
    UpgradeType,
    disabled_reason,
    feature_level,
    finalized_features,
)
from metadata_quorum.image import MetadataImage
from protos import controller_pb2 as cpb
from raftlog.errors import ErrorCode, KafkaError

ALL_LEVELS_LISTED_FROM_VERSION = 4  # ApiVersions v4 lists features whose minimum is 0
# API key -> (feature, the level that switches it on, what it is)
GATED_APIS: dict[int, tuple[str, int, str]] = {
    kc.API_CONSUMER_GROUP_HEARTBEAT: CONSUMER_GROUP_PROTOCOL,
    kc.API_CONSUMER_GROUP_DESCRIBE: CONSUMER_GROUP_PROTOCOL,
    kc.API_SHARE_GROUP_HEARTBEAT: SHARE_GROUPS,
    kc.API_SHARE_GROUP_DESCRIBE: SHARE_GROUPS,
    kc.API_SHARE_FETCH: SHARE_GROUPS,
    kc.API_SHARE_ACKNOWLEDGE: SHARE_GROUPS,
}


def disabled_apis(image: MetadataImage) -> frozenset[int]:
    """The API keys the finalized levels switch off: not advertised, and refused."""
    return frozenset(
        key
        for key, (feature, level, _) in GATED_APIS.items()
        if feature_level(image, feature) < level
    )


def feature_refusal(image: MetadataImage, request: kc.Request) -> kc.Data | None:
    """The UNSUPPORTED_VERSION answer to a request whose feature is off (Kafka's
    ``getErrorResponse``), or None to serve it."""
    gate = GATED_APIS.get(request.api_key)
    if gate is None:
        return None
    message = disabled_reason(image, *gate)
    if message is None:
        return None
    error = ErrorCode.UNSUPPORTED_VERSION.code
    if request.api_key in (kc.API_CONSUMER_GROUP_DESCRIBE, kc.API_SHARE_GROUP_DESCRIBE):
        groups = [
            {"error_code": error, "error_message": message, "group_id": group_id,
             "group_state": "", "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "",
             "members": [], "authorized_operations": authz.NOT_REQUESTED}
            for group_id in request.body.group_ids
        ]  # fmt: skip
        return {"throttle_time": 0, "groups": groups}
    answer: dict[str, Any] = {"throttle_time": 0, "error_code": error, "error_message": message}
    if request.api_key in (kc.API_CONSUMER_GROUP_HEARTBEAT, kc.API_SHARE_GROUP_HEARTBEAT):
        return {**answer, "member_id": None, "member_epoch": 0, "heartbeat_interval": 0,
                "assignment": None}  # fmt: skip
    if request.api_key in (kc.API_SHARE_FETCH, kc.API_SHARE_ACKNOWLEDGE):
        answer["acquisition_lock_timeout"] = 0  # ShareAcknowledge: v2+ (dropped below)
    return {**answer, "responses": [], "node_endpoints": []}


def api_versions_features(image: MetadataImage, api_version: int) -> kc.Data:
    """ApiVersions' feature fields (dropped by `to_entity` in versions below 3)."""
    supported = [
        {"name": name, "min_version": low, "max_version": high}
        for name, (low, high) in sorted(SUPPORTED_FEATURES.items())
        if low > 0 or api_version >= ALL_LEVELS_LISTED_FROM_VERSION
    ]
    finalized = [
        {"name": name, "min_version_level": level, "max_version_level": level}
        for name, level in finalized_features(image).items()
    ]
    return {
        "supported_features": supported,
        "finalized_features_epoch": image.offset if image.features else -1,
        "finalized_features": finalized,
        "zk_migration_ready": False,
    }


def update_features(forward: Callable[[str, Any, int], Any], request: kc.Request) -> kc.Data:
    """UpdateFeatures v0 (allow_downgrade: SAFE_DOWNGRADE) and v1 (upgrade_type)."""
    body = request.body
    forwarded = cpb.UpdateFeaturesRequest(
        validate_only=bool(kc.field(body, "validate_only", False))
    )
    for update in body.feature_updates:
        kind = kc.field(update, "upgrade_type")
        if kind is None:  # v0
            allow_downgrade = kc.field(update, "allow_downgrade", False)
            kind = UpgradeType.SAFE_DOWNGRADE if allow_downgrade else UpgradeType.UPGRADE
        forwarded.updates.add(
            feature=update.feature, max_version_level=update.max_version_level,
            upgrade_type=int(kind),
        )  # fmt: skip
    answer: dict[str, Any] = {"throttle_time": 0}
    try:
        reply = forward("UpdateFeatures", forwarded, kc.millis(body.timeout))
    except KafkaError as error:
        return {**answer, "error_code": error.error.code, "error_message": error.message,
                "results": []}  # fmt: skip
    refused = next((r for r in reply.results if r.error_code), None)
    if refused is not None:
        message = (
            "The update failed for all features since the following feature had an error: "
            f"{refused.error_message}"
        )
        return {**answer, "error_code": refused.error_code, "error_message": message,
                "results": []}  # fmt: skip
    return {
        **answer,
        "error_code": ErrorCode.NONE.code,
        "error_message": None,
        "results": [
            {"feature": r.feature, "error_code": 0, "error_message": None} for r in reply.results
        ],
    }
