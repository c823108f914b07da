"""The KAFKA listener's view of config resources: ListConfigResources (key 74, Kafka 4.1) and
DescribeConfigs of GROUP resources (Kafka 4's group configs).

ListConfigResources lists, from this broker's metadata image, the config resources of the
asked types as Kafka 4.1's broker does: every topic (TOPIC, 2), every broker (BROKER, 4), every
group with a dynamic config (GROUP, 32); raftlog has neither client metrics resources
(CLIENT_METRICS, 16: KIP-714) nor dynamic logger levels (BROKER_LOGGER, 8), so those list
nothing. v0 (Kafka 3.7's ListClientMetricsResources) lists client metrics only. It needs
DESCRIBE_CONFIGS on the cluster.

A group's DescribeConfigs is answered here, as Kafka's broker answers DescribeConfigs itself:
its overrides from the image (GROUP_CONFIG, source 8), the other keys with this broker's value
of the config they override (STATIC_BROKER_CONFIG when its node config sets it, else
DEFAULT_CONFIG), after DESCRIBE_CONFIGS on the group (GROUP_AUTHORIZATION_FAILED otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataplane.kafka import codec as kc
from metadata_quorum.group_configs import KAFKA_GROUP_RULES, GroupRules
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import ConfigResourceType
from metadata_quorum.security.acl import CLUSTER_NAME, AclOperation, ResourceType
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl
from metadata_quorum.topic_config_defs import config_type
from raftlog.errors import ErrorCode

TOPIC, BROKER_LOGGER, BROKER, CLIENT_METRICS, GROUP = 2, 8, 4, 16, 32
SUPPORTED_TYPES = (TOPIC, BROKER_LOGGER, BROKER, CLIENT_METRICS, GROUP)  # Kafka 4.1's
# DescribeConfigs' config_source of a group row (Kafka's ConfigSource ids)
SOURCES = {"group": 8, "static": 4, "default": 5}


def list_config_resources(image: MetadataImage, resource_types: list[int]) -> list[tuple[str, int]]:
    """(name, type) of each config resource of ``resource_types`` (empty: every supported
    type), in Kafka's order: groups, brokers, topics."""
    wanted = set(resource_types or SUPPORTED_TYPES)
    out: list[tuple[str, int]] = []
    if GROUP in wanted:
        out += sorted(
            (name, GROUP)
            for kind, name in image.configs
            if kind is ConfigResourceType.GROUP
        )  # fmt: skip
    if BROKER in wanted:
        out += [(str(broker_id), BROKER) for broker_id in sorted(image.brokers)]
    if TOPIC in wanted:
        out += [(name, TOPIC) for name in sorted(image.topic_ids)]
    return out


class KafkaConfigResources:
    """ListConfigResources, and DescribeConfigs of groups (for dataplane/kafka/admin.py)."""

    def __init__(
        self,
        image: Callable[[], MetadataImage],
        group_rules: GroupRules = KAFKA_GROUP_RULES,
        access: AccessControl = ALLOW_ALL,
    ) -> None:
        self.image = image
        self.group_rules = group_rules
        self.access = access

    def handlers(self) -> dict[int, Callable[[kc.Request], kc.Data]]:
        return {kc.API_LIST_CONFIG_RESOURCES: self.list_config_resources}

    def list_config_resources(self, request: kc.Request) -> kc.Data:
        answer: dict[str, Any] = {"throttle_time": 0, "error_code": 0, "config_resources": []}
        if not self.access.allowed(
            AclOperation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME
        ):
            return {**answer, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code}
        if request.api_version == 0:
            return answer  # client metrics resources only: raftlog has none
        asked = [int(t) for t in kc.field(request.body, "resource_types", ()) or ()]
        if any(t not in SUPPORTED_TYPES for t in asked):
            return {**answer, "error_code": ErrorCode.UNSUPPORTED_VERSION.code}
        listed = list_config_resources(self.image(), asked)
        return {
            **answer,
            "config_resources": [
                {"resource_name": name, "resource_type": kind} for name, kind in listed
            ],
        }

    def describe_group(self, resource: Any, synonyms: bool) -> dict[str, Any]:
        """One GROUP resource's DescribeConfigs result."""
        name = resource.resource_name
        out: dict[str, Any] = {
            "error_code": 0, "error_message": None, "resource_type": GROUP,
            "resource_name": name, "configs": [],
        }  # fmt: skip
        if not name:
            return {**out, "error_code": ErrorCode.INVALID_REQUEST.code,
                    "error_message": "a group resource needs the group id"}  # fmt: skip
        if not self.access.allowed(AclOperation.DESCRIBE_CONFIGS, ResourceType.GROUP, name):
            refused = f"not authorized to DESCRIBE_CONFIGS group {name}"
            return {**out, "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED.code,
                    "error_message": refused}  # fmt: skip
        overrides = self.image().configs.get((ConfigResourceType.GROUP, name), {})
        keys = resource.configuration_keys
        for row in self.group_rules.describe(overrides):
            if keys is not None and row.name not in keys:
                continue
            source = SOURCES[row.origin]
            shown = row.name if row.origin == "group" else row.synonym
            out["configs"].append({
                "name": row.name, "value": row.value, "read_only": False,
                "is_default": row.origin == "default", "config_source": source,
                "is_sensitive": False,
                "synonyms": [{"name": shown, "value": row.value, "source": source}]
                if synonyms and shown is not None else [],
                "config_type": int(config_type(row.name)), "documentation": None,
            })  # fmt: skip
        return out
