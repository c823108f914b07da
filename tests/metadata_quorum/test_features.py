"""Finalized feature levels (metadata_quorum/features.py): the bootstrap, Kafka's UpdateFeatures
rules (FeatureControlManager), replay and snapshots; and the refusal to delete or grow the
internal topics (metadata_quorum/replication.py)."""

from __future__ import annotations

import random
import uuid

import pytest

from metadata_quorum.features import (
    BOOTSTRAP_FEATURES,
    CONSUMER_GROUP_PROTOCOL,
    FeatureUpdate,
    UpgradeType,
    check_enabled,
    check_voter_change_supported,
    disabled_reason,
    feature_level,
    finalized_features,
    generate_bootstrap_features,
    generate_update_features,
)
from metadata_quorum.image import MetadataImage, apply, from_records, to_records
from metadata_quorum.records import (
    FeatureLevelRecord,
    MetadataRecord,
    PartitionRecord,
    TopicRecord,
)
from metadata_quorum.replication import generate_create_partitions, generate_delete_topics
from raftlog.errors import ErrorCode, KafkaError

UPGRADE, SAFE, UNSAFE = (
    UpgradeType.UPGRADE,
    UpgradeType.SAFE_DOWNGRADE,
    UpgradeType.UNSAFE_DOWNGRADE,
)


def bootstrapped() -> MetadataImage:
    image, rejected = apply(MetadataImage(), generate_bootstrap_features(MetadataImage()))
    assert rejected == []
    return image


def before_elr() -> MetadataImage:
    """A cluster at metadata.version 22 (4.0-IV0) without eligible leader replicas."""
    image, rejected = apply(bootstrapped(), [
        FeatureLevelRecord("eligible.leader.replicas.version", 0),
        FeatureLevelRecord("metadata.version", 22),
    ])  # fmt: skip
    assert rejected == []
    return image


def test_bootstrap_writes_every_supported_feature_once() -> None:
    image = bootstrapped()
    assert image.features == {
        "eligible.leader.replicas.version": 1, "group.version": 1, "kraft.version": 1,
        "metadata.version": 23, "share.version": 1, "transaction.version": 1,
    }  # fmt: skip
    assert image.features == dict(BOOTSTRAP_FEATURES)
    assert generate_bootstrap_features(image) == []  # written once
    # a feature an older image lacks is finalized; the others keep their (changed) levels
    lowered, _ = apply(image, [FeatureLevelRecord("transaction.version", 0)])
    older = MetadataImage(features={"metadata.version": 22})
    assert generate_bootstrap_features(older) == [
        FeatureLevelRecord(name, BOOTSTRAP_FEATURES[name])
        for name in sorted(BOOTSTRAP_FEATURES)
        if name != "metadata.version"
    ]
    assert generate_bootstrap_features(lowered) == []


def test_level_zero_is_not_listed_and_snapshots_keep_the_levels() -> None:
    image, _ = apply(bootstrapped(), [FeatureLevelRecord("transaction.version", 0)])
    assert "transaction.version" not in finalized_features(image)
    brokers, records = to_records(image)
    restored = from_records(image.offset, brokers, records, image.next_producer_id)
    assert restored.features == image.features
    _, rejected = apply(image, [FeatureLevelRecord("group.version", -1)])
    assert [r.reason for r in rejected] == ["feature group.version level -1 < 0"]


def update(
    image: MetadataImage, *updates: tuple[str, int, UpgradeType], validate_only: bool = False
) -> tuple[list[MetadataRecord], list[tuple[str, ErrorCode, str]]]:
    records, results = generate_update_features(
        image, [FeatureUpdate(*u) for u in updates], validate_only
    )
    return records, [(r.feature, r.error, r.message) for r in results]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (("transaction.version", 0, UPGRADE), "without setting the upgrade type"),
        (("transaction.version", 2, UPGRADE), "only supports versions 0-1"),
        (("group.version", 1, UpgradeType.UNKNOWN), "does not support the given upgrade type"),
        (("metadata.version", 24, UPGRADE), "only supports versions 7-23"),
        (("metadata.version", 6, SAFE), "only supports versions 7-23"),
        (("share.version", 2, UPGRADE), "only supports versions 0-1"),
        (("eligible.leader.replicas.version", 2, UPGRADE), "only supports versions 0-1"),
        (("metadata.version", 22, SAFE), "might delete metadata information"),
        (("streams.version", 1, UPGRADE), "does not support this feature"),
        (("group.version", -1, SAFE), "cannot be less than 0"),
        (("kraft.version", 0, SAFE), "Downgrading kraft.version is not supported"),
        (("metadata.version", 16, SAFE), "might delete metadata information"),
        (("metadata.version", 16, UNSAFE), "Unsafe metadata downgrade is not supported"),
        (("metadata.version", 20, SAFE), "kraft.version could not be set to 1 because it "
                                         "depends on metadata.version level 21"),
        (("eligible.leader.replicas.version", 1, UPGRADE), "could not be set to 1 because it "
                                         "depends on metadata.version level 23"),
    ],
)  # fmt: skip
def test_refused_updates_are_invalid_update_version(
    change: tuple[str, int, UpgradeType], reason: str
) -> None:
    # from a cluster at 22 without ELR, but the downgrade from 23 (its partition records carry
    # the ELR, so Kafka's didMetadataChange refuses it)
    base = bootstrapped() if change == ("metadata.version", 22, SAFE) else before_elr()
    records, results = update(base, change)
    assert records == []
    ((feature, error, message),) = results
    assert feature == change[0] and error is ErrorCode.INVALID_UPDATE_VERSION
    assert message.startswith(f"Invalid update version {change[1]} for feature {change[0]}.")
    assert reason in message


def test_an_upgrade_to_a_lower_level_with_a_downgrade_type_is_refused() -> None:
    low, _ = apply(bootstrapped(), [FeatureLevelRecord("transaction.version", 0)])
    _, results = update(low, ("transaction.version", 1, SAFE))
    assert "Can't downgrade to a newer version" in results[0][2]


def test_updates_are_all_or_nothing_and_validate_only_writes_nothing() -> None:
    image = bootstrapped()
    records, results = update(
        image, ("transaction.version", 0, SAFE), ("transaction.version", 1, UPGRADE)
    )
    assert records == [] and {e for _, e, _ in results} == {ErrorCode.INVALID_REQUEST}
    records, results = update(
        image, ("transaction.version", 0, SAFE), ("group.version", 2, UPGRADE)
    )
    assert records == [] and {e for _, e, _ in results} == {ErrorCode.INVALID_UPDATE_VERSION}
    records, results = update(image, ("transaction.version", 0, SAFE), validate_only=True)
    assert records == [] and results == [("transaction.version", ErrorCode.NONE, "")]
    records, _ = update(image, ("transaction.version", 0, SAFE), ("group.version", 1, UPGRADE))
    assert records == [FeatureLevelRecord("transaction.version", 0)]  # group.version unchanged


def test_metadata_version_downgrades_across_no_metadata_change() -> None:
    image = before_elr()
    # 22 -> 21 crosses no level whose records changed (Kafka's didMetadataChange); group.version
    # 1 depends on no metadata.version (Kafka's GroupVersion), kraft.version 1 on 21
    records, results = update(image, ("metadata.version", 21, SAFE))
    assert {e for _, e, _ in results} == {ErrorCode.NONE}
    assert records == [FeatureLevelRecord("metadata.version", 21)]


def test_a_feature_is_checked_against_the_levels_proposed_with_it() -> None:
    """Kafka's Feature.validateVersion: the dependencies hold in the proposed levels, so an
    upgrade of kraft.version needs metadata.version 21 already or in the same request."""
    low, _ = apply(before_elr(), [
        FeatureLevelRecord("metadata.version", 20), FeatureLevelRecord("kraft.version", 0),
    ])  # fmt: skip
    _, results = update(low, ("kraft.version", 1, UPGRADE))
    assert (
        "kraft.version could not be set to 1 because it depends on metadata.version level 21"
        in (results[0][2])
    )
    records, results = update(low, ("kraft.version", 1, UPGRADE), ("metadata.version", 21, UPGRADE))
    assert {e for _, e, _ in results} == {ErrorCode.NONE}
    assert records == [
        FeatureLevelRecord("kraft.version", 1), FeatureLevelRecord("metadata.version", 21),
    ]  # fmt: skip


def test_group_and_share_versions_go_down_and_up_again() -> None:
    image = bootstrapped()
    records, results = update(image, ("group.version", 0, SAFE), ("share.version", 0, SAFE))
    assert {e for _, e, _ in results} == {ErrorCode.NONE}
    low, _ = apply(image, records)
    assert feature_level(low, "group.version") == feature_level(low, "share.version") == 0
    assert "share.version" not in finalized_features(low)
    records, _ = update(low, ("group.version", 1, UPGRADE), ("share.version", 1, UPGRADE))
    assert records == [
        FeatureLevelRecord("group.version", 1),
        FeatureLevelRecord("share.version", 1),
    ]


@pytest.mark.parametrize(
    ("features", "enabled"),
    [({}, False), ({"group.version": 0}, False), ({"group.version": 1}, True)],
)
def test_check_enabled_is_unsupported_version_below_the_level(
    features: dict[str, int], enabled: bool
) -> None:
    image = MetadataImage(features=features)
    reason = disabled_reason(image, *CONSUMER_GROUP_PROTOCOL)
    if enabled:
        assert reason is None
        check_enabled(image, *CONSUMER_GROUP_PROTOCOL)
        return
    assert reason == (
        "the consumer group protocol (KIP-848) is not enabled: group.version is 0 (it needs 1)"
    )
    with pytest.raises(KafkaError) as refused:
        check_enabled(image, *CONSUMER_GROUP_PROTOCOL)
    assert refused.value.error is ErrorCode.UNSUPPORTED_VERSION


def test_voter_changes_need_kraft_version_1() -> None:
    check_voter_change_supported(bootstrapped(), "adding")
    for features in ({}, {"kraft.version": 0}):
        with pytest.raises(KafkaError) as refused:
            check_voter_change_supported(MetadataImage(features=features), "removing")
        assert refused.value.error is ErrorCode.UNSUPPORTED_VERSION
        assert refused.value.message == (
            "Cluster doesn't support removing voter because the kraft.version feature is 0"
        )


# -- internal topics -----------------------------------------------------------------------
def with_internal_topic() -> MetadataImage:
    topic_id = uuid.UUID(int=7)
    image, rejected = apply(MetadataImage(), [
        TopicRecord("__consumer_offsets", topic_id),
        PartitionRecord(topic_id, 0, (1,), (1,), 1),
    ])  # fmt: skip
    assert rejected == []
    return image


def test_internal_topics_are_not_deleted() -> None:
    out = generate_delete_topics(with_internal_topic(), ["__consumer_offsets"])
    assert out.records == []
    (result,) = out.results
    assert result.error is ErrorCode.INVALID_TOPIC_EXCEPTION
    assert "__consumer_offsets is an internal topic" in result.message


def test_internal_topics_are_not_grown() -> None:
    out = generate_create_partitions(
        with_internal_topic(), [("__consumer_offsets", 2, None)], False, random.Random(1)
    )
    assert out.records == []
    assert [r.error for r in out.results] == [ErrorCode.INVALID_TOPIC_EXCEPTION]
