"""The KAFKA listener's AlterConfigs (key 33) and IncrementalAlterConfigs (key 44).

As a KRaft broker does (KIP-590), both are forwarded to the active controller, which applies
them to the metadata in one write: IncrementalAlterConfigs' operations (SET, DELETE, APPEND,
SUBTRACT) as they are, AlterConfigs as a replacement of each resource's whole dynamic config
set (``replace``). The arithmetic and validation are the controller's
(``metadata_quorum.configs.alter_dynamic_configs``); here only what Kafka's broker checks before
it forwards (Kafka's ConfigAdminManager.preprocess): the resource type (TOPIC, BROKER,
CLIENT_METRICS or GROUP; broker "" is the cluster-wide default), a resource named twice in one
request, a null value to set. BROKER_LOGGER (type 8) is this broker's own and never forwarded:
IncrementalAlterConfigs sets its log levels here (``local``: dataplane/kafka/broker_loggers.py,
not persisted, as Kafka's), and legacy AlterConfigs refuses it as Kafka's broker does
("Unknown resource type 8").
Each resource gets its own result, with Kafka's error code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataplane.kafka import codec as kc
from protos import controller_pb2 as cpb
from protos import metadata_pb2 as mpb
from raftlog.errors import ErrorCode, KafkaError

Forward = Callable[[str, Any, int], Any]  # (method, request, timeout_ms) -> the answer
# a resource this broker alters itself: (the Kafka resource, validate_only) -> its error or None
Local = Callable[[Any, bool], KafkaError | None]
RESOURCE_TYPES = {
    2: mpb.CONFIG_RESOURCE_TOPIC,
    4: mpb.CONFIG_RESOURCE_BROKER,
    16: mpb.CONFIG_RESOURCE_CLIENT_METRICS,
    32: mpb.CONFIG_RESOURCE_GROUP,
}
BROKER_LOGGER = 8
OP_DELETE = 1  # Kafka's AlterConfigOp.OpType.DELETE
ALTER_DEADLINE_MS = 30_000  # neither request carries a timeout


def _result(resource: Any, code: int, message: str | None) -> dict[str, Any]:
    return {
        "error_code": code,
        "error_message": message or None,
        "resource_type": resource.resource_type,
        "resource_name": resource.resource_name,
    }


def _refusal(
    resource: Any, seen: set[tuple[int, str]], incremental: bool, loggers: bool
) -> KafkaError | None:
    """Why the broker answers ``resource`` itself instead of forwarding it, if it does
    (``loggers``: it alters its BROKER_LOGGER resource itself)."""
    key = (resource.resource_type, resource.resource_name)
    if key in seen:
        return KafkaError(ErrorCode.INVALID_REQUEST, "Each resource must appear at most once.")
    seen.add(key)
    if resource.resource_type == BROKER_LOGGER and incremental and loggers:
        return None
    if resource.resource_type not in RESOURCE_TYPES:
        return KafkaError(
            ErrorCode.INVALID_REQUEST, f"Unknown resource type {resource.resource_type}"
        )
    for config in resource.configs:
        operation = config.config_operation if incremental else 0
        if config.value is None and operation != OP_DELETE:
            return KafkaError(
                ErrorCode.INVALID_CONFIG, f"{config.name}: a null value cannot be set"
            )
    return None


def _forwarded(resource: Any, incremental: bool) -> cpb.AlterConfigsResource:
    return cpb.AlterConfigsResource(
        resource=cpb.ConfigResource(
            resource_type=RESOURCE_TYPES[resource.resource_type],
            resource_name=resource.resource_name,
        ),
        configs=[
            cpb.AlterableConfig(
                name=c.name,
                value=c.value or "",
                op=cpb.AlterConfigOp.ValueType(c.config_operation if incremental else 0),
            )
            for c in resource.configs
        ],
    )


def _alter(
    forward: Forward, request: kc.Request, incremental: bool, local: Local | None = None
) -> kc.Data:
    body = request.body
    results: list[dict[str, Any] | None] = []
    asked: list[tuple[int, Any]] = []  # (index in results, the Kafka resource)
    seen: set[tuple[int, str]] = set()
    for resource in body.resources:
        refused = _refusal(resource, seen, incremental, local is not None)
        if refused is None and resource.resource_type == BROKER_LOGGER and local is not None:
            failed = local(resource, bool(body.validate_only))
            code, message = (failed.error.code, failed.message) if failed else (0, None)
            results.append(_result(resource, code, message))
        elif refused is not None:
            results.append(_result(resource, refused.error.code, refused.message))
        else:
            asked.append((len(results), resource))
            results.append(None)
    if asked:
        forwarded = cpb.AlterConfigsRequest(
            resources=[_forwarded(r, incremental) for _, r in asked],
            validate_only=bool(body.validate_only),
            replace=not incremental,
        )
        try:
            answers = list(forward("AlterConfigs", forwarded, ALTER_DEADLINE_MS).resources)
        except KafkaError as error:
            answers = []
            for index, resource in asked:
                results[index] = _result(resource, error.error.code, error.message)
        for (index, resource), answer in zip(asked, answers, strict=False):
            results[index] = _result(resource, answer.error_code, answer.error_message)
    unanswered = ErrorCode.UNKNOWN_SERVER_ERROR.code, "the controller gave no answer"
    return {
        "throttle_time": 0,
        "responses": [
            found if found is not None else _result(resource, *unanswered)
            for found, resource in zip(results, body.resources, strict=True)
        ],
    }


def alter_configs(forward: Forward, request: kc.Request) -> kc.Data:
    """AlterConfigs: each resource's configs become its whole dynamic set."""
    return _alter(forward, request, incremental=False)


def incremental_alter_configs(
    forward: Forward, request: kc.Request, local: Local | None = None
) -> kc.Data:
    """IncrementalAlterConfigs: SET, DELETE, APPEND, SUBTRACT per key; BROKER_LOGGER resources
    by ``local`` (refused without it)."""
    return _alter(forward, request, incremental=True, local=local)
