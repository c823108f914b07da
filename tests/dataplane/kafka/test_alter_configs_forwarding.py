"""AlterConfigs (key 33) and IncrementalAlterConfigs (key 44) at the KAFKA listener, without a
cluster: each advertised version's request is turned into the controller's AlterConfigs RPC
(operations as given, ``replace`` for the legacy request, validate_only passed on), what the
broker refuses itself (a resource named twice, a resource type other than TOPIC or BROKER, a null
value to set) never reaches the controller, each resource gets its own result in the request's
order, and every response encodes in its version."""

from __future__ import annotations

from typing import Any

import pytest

from dataplane.kafka import codec as kc
from dataplane.kafka.alter_configs import alter_configs, incremental_alter_configs
from protos import controller_pb2 as cpb
from protos import metadata_pb2 as mpb
from raftlog.errors import ErrorCode, KafkaError

RATE = "leader.replication.throttled.rate"
REPLICAS = "leader.replication.throttled.replicas"


class FakeController:
    """Answers AlterConfigs with the codes it is given, by resource name; records requests."""

    def __init__(self, codes: dict[str, int] | None = None, down: bool = False) -> None:
        self.codes = codes or {}
        self.down = down
        self.requests: list[cpb.AlterConfigsRequest] = []

    def __call__(self, method: str, request: Any, timeout_ms: int) -> Any:
        assert method == "AlterConfigs" and timeout_ms > 0
        self.requests.append(request)
        if self.down:
            raise KafkaError(ErrorCode.NOT_CONTROLLER, "no active controller")
        return cpb.AlterConfigsResponse(
            resources=[
                cpb.ResourceResult(
                    resource=r.resource,
                    error_code=self.codes.get(r.resource.resource_name, 0),
                    error_message="refused" if r.resource.resource_name in self.codes else "",
                )
                for r in request.resources
            ]
        )


def request(api_key: int, version: int, resources: list[dict[str, Any]], validate: bool) -> Any:
    schema = kc.request_schema(api_key, version)
    body = kc.to_entity(schema, {"resources": resources, "validate_only": validate})
    return kc.Request(api_key, version, 1, "test", body)


def resource(kind: int, name: str, *configs: tuple[str, str | None, int]) -> dict[str, Any]:
    return {
        "resource_type": kind,
        "resource_name": name,
        "configs": [{"name": n, "value": v, "config_operation": op} for n, v, op in configs],
    }


def answered(api_key: int, version: int, data: kc.Data) -> list[tuple[str, int]]:
    kc.encode_response(api_key, version, 1, data)  # fits the version's schema
    return [(r["resource_name"], r["error_code"]) for r in data["responses"]]


@pytest.mark.parametrize("version", range(kc.SUPPORTED[kc.API_INCREMENTAL_ALTER_CONFIGS][1] + 1))
def test_incremental_operations_are_forwarded_as_given(version: int) -> None:
    controller = FakeController({"gone": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code})
    resources = [
        resource(4, "1", (RATE, "1024", 0)),
        resource(2, "t", (REPLICAS, "0:1", 2), (REPLICAS + "x", None, 1)),
        resource(2, "gone", ("retention.ms", "1", 0)),
    ]
    data = incremental_alter_configs(controller, request(44, version, resources, True))
    assert answered(44, version, data) == [
        ("1", 0), ("t", 0), ("gone", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code),
    ]  # fmt: skip
    (forwarded,) = controller.requests
    assert forwarded.validate_only and not forwarded.replace
    assert forwarded.resources[0].resource == cpb.ConfigResource(
        resource_type=mpb.CONFIG_RESOURCE_BROKER, resource_name="1"
    )
    assert [(c.name, c.value, c.op) for c in forwarded.resources[1].configs] == [
        (REPLICAS, "0:1", cpb.APPEND), (REPLICAS + "x", "", cpb.DELETE),
    ]  # fmt: skip


@pytest.mark.parametrize("version", range(kc.SUPPORTED[kc.API_ALTER_CONFIGS][1] + 1))
def test_alter_configs_replaces_the_set(version: int) -> None:
    controller = FakeController()
    data = alter_configs(
        controller, request(33, version, [resource(2, "t", ("retention.ms", "5", 0))], False)
    )
    assert answered(33, version, data) == [("t", 0)]
    (forwarded,) = controller.requests
    assert forwarded.replace and not forwarded.validate_only
    assert [(c.name, c.value, c.op) for c in forwarded.resources[0].configs] == [
        ("retention.ms", "5", cpb.SET)
    ]


def test_what_the_broker_refuses_itself_is_not_forwarded() -> None:
    controller = FakeController()
    resources = [
        resource(2, "t", ("retention.ms", "5", 0)),
        resource(2, "t", ("segment.ms", "5", 0)),  # named twice: both refused
        resource(8, "1", ("kafka.server", "DEBUG", 0)),  # BROKER_LOGGER
        resource(2, "u", ("retention.ms", None, 0)),
        resource(2, "v", ("retention.ms", "5", 0)),
    ]
    data = incremental_alter_configs(controller, request(44, 1, resources, False))
    invalid_request, invalid_config = ErrorCode.INVALID_REQUEST.code, ErrorCode.INVALID_CONFIG.code
    assert answered(44, 1, data) == [
        ("t", 0), ("t", invalid_request), ("1", invalid_request), ("u", invalid_config), ("v", 0),
    ]  # fmt: skip
    assert [r.resource.resource_name for r in controller.requests[0].resources] == ["t", "v"]


def test_no_controller_fails_every_forwarded_resource() -> None:
    controller = FakeController(down=True)
    resources = [
        resource(2, "t", ("retention.ms", "5", 0)),
        resource(16, "m", ("interval.ms", "1000", 0)),  # CLIENT_METRICS: the controller's
        resource(8, "1", ("root", "DEBUG", 0)),  # BROKER_LOGGER: legacy AlterConfigs refuses it
    ]
    data = alter_configs(controller, request(33, 2, resources, False))
    assert answered(33, 2, data) == [
        ("t", ErrorCode.NOT_CONTROLLER.code), ("m", ErrorCode.NOT_CONTROLLER.code),
        ("1", ErrorCode.INVALID_REQUEST.code),
    ]  # fmt: skip
