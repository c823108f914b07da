"""The KAFKA listener's view of config resources: ListConfigResources (key 74, Kafka 4.1) and
the DescribeConfigs this broker answers itself, as Kafka's broker does (its ConfigHelper):
GROUP, BROKER, BROKER_LOGGER and CLIENT_METRICS resources (topics' go to the controller).

ListConfigResources lists, from this broker's metadata image, the config resources of the
asked types as Kafka 4.1's broker does: every topic (TOPIC, 2), every broker (BROKER, 4), every
group with a dynamic config (GROUP, 32), every client metrics subscription (CLIENT_METRICS, 16:
KIP-714, metadata_quorum/client_metrics_configs.py); BROKER_LOGGER (8) lists nothing, as in
Kafka. v0 (Kafka 3.7's ListClientMetricsResources) lists the subscriptions only. It needs
DESCRIBE_CONFIGS on the cluster.

A BROKER resource is this broker's every config (metadata_quorum/broker_describe.py; another
broker id is INVALID_REQUEST, as clients send it to the broker it names) or, named "", the
cluster-wide dynamic values; BROKER_LOGGER its log levels (dataplane/kafka/broker_loggers.py);
CLIENT_METRICS a subscription's stored keys (source CLIENT_METRICS_CONFIG, 7; none for a name
without any). All three need DESCRIBE_CONFIGS on the cluster (CLUSTER_AUTHORIZATION_FAILED).

A group's DescribeConfigs is answered here, as Kafka's broker answers DescribeConfigs itself:
its overrides from the image (GROUP_CONFIG, source 8), the other keys with this broker's value
of the config they override (STATIC_BROKER_CONFIG when its node config sets it, else
DEFAULT_CONFIG), after DESCRIBE_CONFIGS on the group (GROUP_AUTHORIZATION_FAILED otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataplane.kafka import codec as kc
from dataplane.kafka.broker_loggers import BrokerLoggers, check_own_logger_resource
from metadata_quorum.broker_describe import (
    BrokerConfigRow,
    NodeConfigView,
    check_own_broker,
    describe_cluster_default,
    describe_own_broker,
)
from metadata_quorum.group_configs import KAFKA_GROUP_RULES, GroupRules
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import ConfigResourceType
from metadata_quorum.security.acl import CLUSTER_NAME, AclOperation, ResourceType
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl
from metadata_quorum.topic_config_defs import config_type
from raftlog.errors import ErrorCode, KafkaError

TOPIC, BROKER_LOGGER, BROKER, CLIENT_METRICS, GROUP = 2, 8, 4, 16, 32
SUPPORTED_TYPES = (TOPIC, BROKER_LOGGER, BROKER, CLIENT_METRICS, GROUP)  # Kafka 4.1's
# DescribeConfigs' config_source of a group row (Kafka's ConfigSource ids)
SOURCES = {"group": 8, "static": 4, "default": 5}
DYNAMIC_BROKER_LOGGER_CONFIG, CLIENT_METRICS_CONFIG = 6, 7  # Kafka's ConfigSource ids


def list_config_resources(image: MetadataImage, resource_types: list[int]) -> list[tuple[str, int]]:
    """(name, type) of each config resource of ``resource_types`` (empty: every supported
    type), in Kafka's order: client metrics, groups, brokers, topics."""
    wanted = set(resource_types or SUPPORTED_TYPES)
    out: list[tuple[str, int]] = []
    if CLIENT_METRICS in wanted:
        out += sorted(
            (name, CLIENT_METRICS)
            for kind, name in image.configs
            if kind is ConfigResourceType.CLIENT_METRICS
        )  # fmt: skip
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
    """ListConfigResources, and the DescribeConfigs this broker answers itself (for
    dataplane/kafka/admin.py)."""

    def __init__(
        self,
        image: Callable[[], MetadataImage],
        group_rules: GroupRules = KAFKA_GROUP_RULES,
        access: AccessControl = ALLOW_ALL,
        broker_id: int = -1,
        node_configs: NodeConfigView | None = None,
        loggers: BrokerLoggers | None = None,
    ) -> None:
        self.image = image
        self.group_rules = group_rules
        self.access = access
        self.broker_id = broker_id
        self.node_configs = node_configs or NodeConfigView()
        self.loggers = loggers or BrokerLoggers()

    def handlers(self) -> dict[int, Callable[[kc.Request], kc.Data]]:
        return {kc.API_LIST_CONFIG_RESOURCES: self.list_config_resources}

    def list_config_resources(self, request: kc.Request) -> kc.Data:
        answer: dict[str, Any] = {"throttle_time": 0, "error_code": 0, "config_resources": []}
        if not self.access.allowed(
            AclOperation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME
        ):
            return {**answer, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code}
        asked = [int(t) for t in kc.field(request.body, "resource_types", ()) or ()]
        if request.api_version == 0:  # ListClientMetricsResources: the subscriptions only
            asked = [CLIENT_METRICS]
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

    # -- BROKER, BROKER_LOGGER and CLIENT_METRICS ------------------------------------------------
    def _cluster_refusal(self) -> KafkaError | None:
        if self.access.allowed(AclOperation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME):
            return None
        return KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")

    def describe_local(self, resource: Any, synonyms: bool, documented: bool) -> dict[str, Any]:
        """A BROKER, BROKER_LOGGER or CLIENT_METRICS resource's DescribeConfigs result."""
        out: dict[str, Any] = {
            "error_code": 0, "error_message": None, "resource_type": resource.resource_type,
            "resource_name": resource.resource_name, "configs": [],
        }  # fmt: skip
        try:
            refused = self._cluster_refusal()
            if refused is not None:
                raise refused
            configs = self._described(resource, synonyms, documented)
        except KafkaError as error:
            return {**out, "error_code": error.error.code, "error_message": error.message}
        keys = resource.configuration_keys
        return {**out, "configs": [c for c in configs if not keys or c["name"] in keys]}

    def _described(self, resource: Any, synonyms: bool, documented: bool) -> list[dict[str, Any]]:
        name, kind = resource.resource_name, resource.resource_type
        if kind == BROKER:
            check_own_broker(name, self.broker_id)
            rows = (
                describe_own_broker(self.image(), self.broker_id, self.node_configs)
                if name
                else describe_cluster_default(self.image(), self.node_configs)
            )
            return [_broker_entry(row, synonyms, documented) for row in rows]
        if kind == BROKER_LOGGER:
            check_own_logger_resource(name, self.broker_id)
            levels = self.loggers.levels().items()
            return [_plain_entry(n, v, DYNAMIC_BROKER_LOGGER_CONFIG, 2) for n, v in levels]
        if not name:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST, "Client metrics subscription name must not be empty"
            )
        stored = self.image().configs.get((ConfigResourceType.CLIENT_METRICS, name), {})
        return [
            _plain_entry(k, v, CLIENT_METRICS_CONFIG, int(config_type(k)))
            for k, v in sorted(stored.items())
        ]

    def alter_loggers(self, resource: Any, validate_only: bool) -> KafkaError | None:
        """IncrementalAlterConfigs of this broker's BROKER_LOGGER resource (ALTER_CONFIGS on
        the cluster, as Kafka's RuntimeLoggerManager)."""
        if not self.access.allowed(AclOperation.ALTER_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME):
            return KafkaError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed."
            )
        try:
            check_own_logger_resource(resource.resource_name, self.broker_id)
            self.loggers.alter(resource, validate_only)
        except KafkaError as error:
            return error
        return None


def _plain_entry(name: str, value: str, source: int, kind: int) -> dict[str, Any]:
    return {
        "name": name, "value": value, "read_only": False, "is_default": False,
        "config_source": source, "is_sensitive": False, "synonyms": [], "config_type": kind,
        "documentation": None,
    }  # fmt: skip


def _broker_entry(row: BrokerConfigRow, synonyms: bool, documented: bool) -> dict[str, Any]:
    return {
        "name": row.name, "value": row.value, "read_only": row.read_only,
        "is_default": row.source == 5,  # DescribeConfigs v0's flag: DEFAULT_CONFIG
        "config_source": int(row.source), "is_sensitive": row.sensitive,
        "synonyms": [{"name": s.name, "value": s.value, "source": int(s.source)}
                     for s in row.synonyms] if synonyms else [],
        "config_type": int(row.type), "documentation": row.documentation if documented else None,
    }  # fmt: skip
