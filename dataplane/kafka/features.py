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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataplane.kafka import codec as kc
from metadata_quorum.features import SUPPORTED_FEATURES, UpgradeType, finalized_features
from metadata_quorum.image import MetadataImage
from protos import controller_pb2 as cpb
from raftlog.errors import ErrorCode, KafkaError

ALL_LEVELS_LISTED_FROM_VERSION = 4  # ApiVersions v4 lists features whose minimum is 0


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
