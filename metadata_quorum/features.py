"""Finalized feature levels (KIP-584, KIP-778): what the cluster has switched on, as pure functions.

Kafka's controller keeps each feature's finalized level in the metadata log (FeatureLevelRecord);
brokers answer ApiVersions (v3+) from their image with the levels each node supports and the
finalized ones, and UpdateFeatures changes them. raftlog does the same with these features, at
the levels whose semantics it implements, and enforces each as Kafka does (docs/operations.md,
"Feature levels"):

- ``metadata.version`` 7 (3.3-IV3, the lowest Kafka 4 accepts) to 23 (4.0-IV1, whose partition
  records carry KIP-966's eligible leader replicas). raftlog's own metadata records do not
  change with it below 23; it is finalized so that clients and tools see a Kafka 4 cluster.
- ``kraft.version`` 0 to 1: 1 is KIP-853's controller membership (AddRaftVoter and
  RemoveRaftVoter are refused at 0, as Kafka's AddVoterHandler refuses them); it needs
  metadata.version 21 (3.9-IV0). A downgrade is refused, as Kafka refuses it.
- ``group.version`` 0 to 1: 1 is KIP-848's consumer group protocol; at 0 the brokers neither
  advertise nor serve ConsumerGroupHeartbeat and ConsumerGroupDescribe (Kafka's
  ``isConsumerGroupProtocolEnabled``).
- ``transaction.version`` 0 to 1: transactions as KIP-890 part 1. Level 1 is Kafka's flexible
  transaction log records, which gates no API; part 2 (level 2: an epoch bump per transaction,
  Produce v12, AddPartitionsToTxn v5, EndTxn v5) is not served, so 2 is not supported.
- ``share.version`` 0 to 1: 1 is KIP-932's share groups; at 0 their APIs are neither advertised
  nor served (Kafka's ``isShareGroupProtocolEnabled``). Kafka ties level 1 to a 4.1
  metadata.version raftlog does not claim (its share-partition state is a topic, not metadata
  records), so here it depends on no metadata.version beyond every feature's minimum.

- ``eligible.leader.replicas.version`` 0 to 1: 1 is KIP-966's eligible leader replicas
  (metadata_quorum/placement.py ``elect``): an ISR may become empty, the replicas that left it
  under min.insync.replicas stay eligible to lead, a broker that restarts without a clean
  shutdown leaves every ISR and ELR, and leaders hold the high watermark under min ISR. It needs
  metadata.version 23 (Kafka's ELRV_1 needs 4.0-IV1) and is on in new clusters, as in Kafka 4.1.
  A downgrade to 0 clears every partition's ELR (``generate_update_features``' records), where
  Kafka 4.1 lets them go lazily, at a partition's next change or snapshot: the same state.

Kafka 4's ``streams.version`` is not claimed: raftlog does not implement KIP-1071's streams
groups.

Every node of a raftlog cluster runs the same code, so the supported ranges are this module's,
checked by the controller for the whole cluster (Kafka checks each registered broker's ranges).
The first active controller writes the bootstrap levels (Kafka writes them when the metadata log
is formatted); ``generate_bootstrap_features`` also finalizes a feature an older image lacks.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from metadata_quorum.image import MetadataImage
from metadata_quorum.records import FeatureLevelRecord, MetadataRecord, PartitionChange
from raftlog.errors import ErrorCode, KafkaError

METADATA_VERSION = "metadata.version"
KRAFT_VERSION = "kraft.version"
GROUP_VERSION = "group.version"
TRANSACTION_VERSION = "transaction.version"
SHARE_VERSION = "share.version"
ELIGIBLE_LEADER_REPLICAS_VERSION = "eligible.leader.replicas.version"

# feature -> (min, max) level this code implements
SUPPORTED_FEATURES: Mapping[str, tuple[int, int]] = {
    METADATA_VERSION: (7, 23),
    KRAFT_VERSION: (0, 1),
    GROUP_VERSION: (0, 1),
    TRANSACTION_VERSION: (0, 1),
    SHARE_VERSION: (0, 1),
    ELIGIBLE_LEADER_REPLICAS_VERSION: (0, 1),
}
# the levels a new cluster starts at: the highest supported, so a new cluster serves everything
# raftlog implements (Kafka 4's defaults for its latest production metadata.version, and share
# groups on: Kafka 4.1 formats share.version 0 only because its share groups are a preview there)
BOOTSTRAP_FEATURES: Mapping[str, int] = {
    name: high for name, (_, high) in SUPPORTED_FEATURES.items()
}
# (feature, level) -> the levels of other features it needs (Kafka's FeatureVersion dependencies:
# KRaftVersion 1 needs 3.9-IV0; GroupVersion and TransactionVersion need none) plus
# Feature.validateVersion's rule: any level >= 1 needs metadata.version >= MINIMUM_VERSION
DEPENDENCIES: Mapping[tuple[str, int], Mapping[str, int]] = {
    (KRAFT_VERSION, 1): {METADATA_VERSION: 21},
    (ELIGIBLE_LEADER_REPLICAS_VERSION, 1): {METADATA_VERSION: 23},
}
# what a feature level switches on, as (feature, level, what): Kafka's
# GroupVersion.isConsumerRebalanceProtocolSupported and ShareVersion.supportsShareGroups
CONSUMER_GROUP_PROTOCOL = (GROUP_VERSION, 1, "the consumer group protocol (KIP-848)")
SHARE_GROUPS = (SHARE_VERSION, 1, "share groups (KIP-932)")
MINIMUM_METADATA_VERSION_FOR_FEATURES = 7  # Kafka 4's MetadataVersion.MINIMUM_VERSION, 3.3-IV3
# metadata.version levels whose metadata records differ from the level below (Kafka's
# MetadataVersion.didMetadataChange): a downgrade across one of them might lose metadata
METADATA_CHANGED_AT = frozenset({7, 8, 11, 13, 14, 15, 17, 23})


class UpgradeType(enum.IntEnum):
    """UpdateFeatures v1's upgrade_type (v0: allow_downgrade false/true = UPGRADE/SAFE)."""

    UNKNOWN = 0
    UPGRADE = 1
    SAFE_DOWNGRADE = 2
    UNSAFE_DOWNGRADE = 3


@dataclass(frozen=True)
class FeatureUpdate:
    feature: str
    max_version_level: int
    upgrade_type: UpgradeType = UpgradeType.UPGRADE


@dataclass(frozen=True)
class FeatureResult:
    feature: str
    error: ErrorCode = ErrorCode.NONE
    message: str = ""


def finalized_features(image: MetadataImage) -> dict[str, int]:
    """The finalized levels, without the features at level 0 (Kafka lists only those above)."""
    return {name: level for name, level in sorted(image.features.items()) if level > 0}


def feature_level(image: MetadataImage, name: str) -> int:
    """A feature's finalized level; one not finalized (yet) is at 0, as Kafka's brokers read
    ``finalizedFeatures.getOrDefault(name, 0)``."""
    return image.features.get(name, 0)


def disabled_reason(image: MetadataImage, name: str, level: int, what: str) -> str | None:
    """Why ``what``, which ``name`` at ``level`` switches on, is off, or None if it is on."""
    current = feature_level(image, name)
    if current >= level:
        return None
    return f"{what} is not enabled: {name} is {current} (it needs {level})"


def check_enabled(image: MetadataImage, name: str, level: int, what: str) -> None:
    """UNSUPPORTED_VERSION, Kafka's answer to an API whose feature is off, unless it is on."""
    reason = disabled_reason(image, name, level, what)
    if reason is not None:
        raise KafkaError(ErrorCode.UNSUPPORTED_VERSION, reason)


def elr_enabled(image: MetadataImage) -> bool:
    """KIP-966's rules apply (Kafka's ``FeatureControlManager.isElrFeatureEnabled``)."""
    return feature_level(image, ELIGIBLE_LEADER_REPLICAS_VERSION) >= 1


def check_voter_change_supported(image: MetadataImage, change: str) -> None:
    """AddRaftVoter / RemoveRaftVoter need kraft.version 1 (KIP-853); below it they are
    refused with Kafka's error and message. ``change`` is "adding" or "removing"."""
    level = feature_level(image, KRAFT_VERSION)
    if level < 1:
        raise KafkaError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"Cluster doesn't support {change} voter because the {KRAFT_VERSION} feature is "
            f"{level}",
        )


def generate_bootstrap_features(image: MetadataImage) -> list[FeatureLevelRecord]:
    """The bootstrap level of every supported feature the image has no level for yet."""
    return [
        FeatureLevelRecord(name, level)
        for name, level in sorted(BOOTSTRAP_FEATURES.items())
        if name not in image.features
    ]


def generate_update_features(
    image: MetadataImage, updates: Sequence[FeatureUpdate], validate_only: bool
) -> tuple[list[MetadataRecord], list[FeatureResult]]:
    """UpdateFeatures: every update is checked against the others; one refused update refuses
    the whole request (Kafka's controller applies them atomically), and the others answer
    with the same error. Nothing is written if ``validate_only``. Turning
    eligible.leader.replicas.version off also clears every partition's ELR and last known
    ELR, so no replica stays eligible under rules that no longer maintain it."""
    names = [u.feature for u in updates]
    proposed = dict(image.features)
    proposed.update({u.feature: u.max_version_level for u in updates})
    records: list[MetadataRecord] = []
    try:
        for update in updates:
            if names.count(update.feature) > 1:
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST, f"feature {update.feature} is listed twice"
                )
            _check_update(image, update, proposed)
            if image.features.get(update.feature, 0) != update.max_version_level:
                records.append(FeatureLevelRecord(update.feature, update.max_version_level))
    except KafkaError as error:
        return [], [FeatureResult(u.feature, error.error, error.message) for u in updates]
    if (
        proposed.get(ELIGIBLE_LEADER_REPLICAS_VERSION, 0)
        < 1
        <= feature_level(image, ELIGIBLE_LEADER_REPLICAS_VERSION)
    ):
        records.extend(generate_clear_elrs(image))
    return ([] if validate_only else records), [FeatureResult(u.feature) for u in updates]


def generate_clear_elrs(
    image: MetadataImage, topics: Collection[str] | None = None
) -> list[MetadataRecord]:
    """Changes that empty the ELR and last known ELR of every partition of ``topics`` (None:
    all) that has one: when eligible.leader.replicas.version goes to 0, and when a topic's
    min.insync.replicas (or the cluster default) changes, since its ELR was chosen against the
    old minimum (Kafka 4.0, KAFKA-16540)."""
    return [
        PartitionChange(topic.topic_id, p, current.partition_epoch, elr=(), last_known_elr=())
        for topic in sorted(image.topics.values(), key=lambda t: t.name)
        if topics is None or topic.name in topics
        for p, current in sorted(topic.partitions.items())
        if current.elr or current.last_known_elr
    ]


def _check_update(image: MetadataImage, update: FeatureUpdate, proposed: dict[str, int]) -> None:
    name, level, kind = update.feature, update.max_version_level, update.upgrade_type
    current = image.features.get(name, 0)
    if kind not in (UpgradeType.UPGRADE, UpgradeType.SAFE_DOWNGRADE, UpgradeType.UNSAFE_DOWNGRADE):
        raise _invalid(name, level, "The controller does not support the given upgrade type.")
    if level < 0:
        raise _invalid(name, level, "A feature version cannot be less than 0.")
    low, high = SUPPORTED_FEATURES.get(name, (0, 0))
    if not low <= level <= high:
        reason = (
            "does not support this feature."
            if high == 0
            else f"only supports versions {low}-{high}"
        )
        raise _invalid(name, level, f"The controller {reason}")
    if level < current and kind is UpgradeType.UPGRADE:
        raise _invalid(
            name, level,
            "Can't downgrade the version of this feature without setting the upgrade type to "
            "either safe or unsafe downgrade.",
        )  # fmt: skip
    if level > current and kind is not UpgradeType.UPGRADE:
        raise _invalid(name, level, "Can't downgrade to a newer version.")
    if level < current:
        _check_downgrade(name, level, current, kind)
    problem = _dependency_problem(proposed)
    if problem is not None:
        raise _invalid(name, level, problem)


def _check_downgrade(name: str, level: int, current: int, kind: UpgradeType) -> None:
    if name == KRAFT_VERSION:
        raise _invalid(name, level, "Downgrading kraft.version is not supported.")
    if name != METADATA_VERSION:
        return
    if not any(level < changed <= current for changed in METADATA_CHANGED_AT):
        return
    if kind is UpgradeType.UNSAFE_DOWNGRADE:
        raise _invalid(name, level, "Unsafe metadata downgrade is not supported in this version.")
    raise _invalid(
        name, level,
        "Refusing to perform the requested downgrade because it might delete metadata "
        "information.",
    )  # fmt: skip


def _dependency_problem(proposed: Mapping[str, int]) -> str | None:
    """Why the proposed levels break a finalized level's dependencies, or None. The whole
    proposed set is checked, so a metadata.version downgrade under what kraft.version 1 needs is
    refused too (Kafka checks only the features being updated; raftlog never finalizes a set
    whose dependencies do not hold)."""
    metadata_version = proposed.get(METADATA_VERSION, 0)
    for name, level in sorted(proposed.items()):
        below_minimum = metadata_version < MINIMUM_METADATA_VERSION_FOR_FEATURES
        if name != METADATA_VERSION and level >= 1 and below_minimum:
            return (
                f"{name} could not be set to {level} because it depends on "
                f"metadata.version={MINIMUM_METADATA_VERSION_FOR_FEATURES} (3.3-IV3)"
            )
        for needed, needed_level in DEPENDENCIES.get((name, level), {}).items():
            if proposed.get(needed, 0) < needed_level:
                return (
                    f"{name} could not be set to {level} because it depends on {needed} "
                    f"level {needed_level}"
                )
    return None


def _invalid(name: str, level: int, message: str) -> KafkaError:
    return KafkaError(
        ErrorCode.INVALID_UPDATE_VERSION,
        f"Invalid update version {level} for feature {name}. {message}",
    )
