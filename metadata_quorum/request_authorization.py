"""What each controller RPC needs, as Kafka's ControllerApis (and KafkaApis before it forwards)
asks its authorizer (issue 28).

One table: an RPC acts either on the cluster (every node RPC, CLUSTER_ACTION: a rogue process
without it can neither register as a broker nor follow the metadata; the admin ones ALTER or
DESCRIBE) or on the topics or config resources it names, each refused on its own with
TOPIC_AUTHORIZATION_FAILED (CLUSTER_AUTHORIZATION_FAILED for a broker's configs) while the others
are served. `authorized` serves a request that way around the real handler; the controller's
servicer uses it, and so does the broker's KAFKA listener before it forwards an admin request
with its own identity (dataplane/kafka/admin.py), so both answer alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from metadata_quorum.security.acl import CLUSTER_NAME, AclOperation, ResourceType
from metadata_quorum.security.authorization import AccessControl
from protos import controller_pb2 as pb
from protos import metadata_pb2 as mpb
from raftlog.errors import ErrorCode, KafkaError

ALTER, DESCRIBE = AclOperation.ALTER, AclOperation.DESCRIBE
CLUSTER_ACTION = AclOperation.CLUSTER_ACTION

# RPC -> the operations on the cluster any one of which allows it
CLUSTER_RPCS: dict[str, tuple[AclOperation, ...]] = {
    # the nodes' own (inter-broker) requests
    "RegisterBroker": (CLUSTER_ACTION,),
    "BrokerHeartbeat": (CLUSTER_ACTION,),
    "AlterPartition": (CLUSTER_ACTION,),
    "AllocateProducerIds": (CLUSTER_ACTION,),
    "FetchMetadata": (CLUSTER_ACTION,),
    # Kafka: ALTER; a broker unregistering itself holds CLUSTER_ACTION
    "UnregisterBroker": (ALTER, CLUSTER_ACTION),
    # administration
    "CordonBroker": (ALTER,),
    "ElectLeaders": (ALTER,),
    "UpdateFeatures": (ALTER,),
    "AlterPartitionReassignments": (ALTER,),
    "AddRaftVoter": (ALTER,),
    "RemoveRaftVoter": (ALTER,),
    "ListPartitionReassignments": (DESCRIBE,),
    "DescribeCluster": (DESCRIBE,),
    "DescribeQuorum": (DESCRIBE,),
    # answered by the broker itself (its log directory, dataplane/kafka/log_dirs.py)
    "DescribeLogDirs": (DESCRIBE,),
    "AlterReplicaLogDirs": (ALTER,),
}


@dataclass(frozen=True)
class ItemRpc:
    """An RPC whose items are authorized one by one: where they are in the request and the
    response, and how a refused one is answered."""

    operation: AclOperation
    request_field: str
    response_field: str
    refused: Callable[[Any, KafkaError], Any]  # (request item, error) -> response item
    resource: Callable[[Any], tuple[ResourceType, str]] = lambda name: (ResourceType.TOPIC, name)
    create: bool = False  # CREATE on the cluster allows every item (CreateTopics)


def _config_resource(resource: pb.ConfigResource) -> tuple[ResourceType, str]:
    if resource.resource_type == mpb.CONFIG_RESOURCE_TOPIC:
        return ResourceType.TOPIC, resource.resource_name
    if resource.resource_type == mpb.CONFIG_RESOURCE_GROUP:  # Kafka 4: the group's ACLs
        return ResourceType.GROUP, resource.resource_name
    return ResourceType.CLUSTER, CLUSTER_NAME  # a broker's (or the default broker) configs


def _failed(error: KafkaError) -> dict[str, Any]:
    return {"error_code": error.error.code, "error_message": error.message}


ITEM_RPCS: dict[str, ItemRpc] = {
    "CreateTopics": ItemRpc(
        AclOperation.CREATE, "topics", "topics",
        lambda t, e: pb.CreatableTopicResult(
            name=t.name, num_partitions=-1, replication_factor=-1, **_failed(e)
        ),
        resource=lambda t: (ResourceType.TOPIC, t.name), create=True,
    ),
    "DeleteTopics": ItemRpc(
        AclOperation.DELETE, "names", "topics",
        lambda name, e: pb.DeletableTopicResult(name=name, **_failed(e)),
    ),
    "CreatePartitions": ItemRpc(
        ALTER, "topics", "topics", lambda t, e: pb.TopicResult(name=t.name, **_failed(e)),
        resource=lambda t: (ResourceType.TOPIC, t.name),
    ),
    "DescribeTopics": ItemRpc(
        DESCRIBE, "names", "topics",
        lambda name, e: pb.TopicDescription(name=name, **_failed(e)),
    ),
    "AlterConfigs": ItemRpc(
        AclOperation.ALTER_CONFIGS, "resources", "resources",
        lambda r, e: pb.ResourceResult(resource=r.resource, **_failed(e)),
        resource=lambda r: _config_resource(r.resource),
    ),
    "DescribeConfigs": ItemRpc(
        AclOperation.DESCRIBE_CONFIGS, "resources", "resources",
        lambda r, e: pb.DescribedConfigs(resource=r, **_failed(e)),
        resource=_config_resource,
    ),
}  # fmt: skip


def check_cluster(access: AccessControl, rpc: str) -> None:
    """Raise CLUSTER_AUTHORIZATION_FAILED unless the session may ``rpc`` (a CLUSTER_RPCS one)."""
    operations = CLUSTER_RPCS[rpc]
    if any(access.allowed(op, ResourceType.CLUSTER, CLUSTER_NAME, log_denial=False)
           for op in operations):  # fmt: skip
        return
    access.allowed(operations[0], ResourceType.CLUSTER, CLUSTER_NAME)  # audits the denial
    names = " or ".join(op.name for op in operations)
    raise KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, f"{rpc} needs {names} on the cluster")


def _refusals(access: AccessControl, rpc: ItemRpc, items: list[Any]) -> list[KafkaError | None]:
    if rpc.create and access.allowed(
        AclOperation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME, log_denial=False
    ):
        return [None] * len(items)
    out: list[KafkaError | None] = []
    for item in items:
        resource_type, name = rpc.resource(item)
        if access.allowed(rpc.operation, resource_type, name):
            out.append(None)
            continue
        code = {
            ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
            ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
        }.get(resource_type, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
        what = "the cluster" if resource_type is ResourceType.CLUSTER else name
        out.append(KafkaError(code, f"not authorized to {rpc.operation.name} {what}"))
    return out


def authorized(
    access: AccessControl, method: str, request: Any, serve: Callable[[Any], Any]
) -> Any:
    """``serve(request)`` for what the session may do: a cluster RPC it may not do raises
    KafkaError(CLUSTER_AUTHORIZATION_FAILED); the items of an item RPC it may not touch are
    taken out before ``serve`` and answered TOPIC_/CLUSTER_AUTHORIZATION_FAILED in their place
    in the response. DescribeTopics for every topic lists only those it may DESCRIBE."""
    if not access.enabled:
        return serve(request)
    if method in CLUSTER_RPCS:
        check_cluster(access, method)
        return serve(request)
    rpc = ITEM_RPCS.get(method)
    if rpc is None:
        return serve(request)
    items = list(getattr(request, rpc.request_field))
    if method == "DescribeTopics" and not items:
        response = serve(request)
        names = [t.name for t in response.topics]
        described = set(access.filter(DESCRIBE, ResourceType.TOPIC, names))
        shown = [t for t in response.topics if t.name in described]
        del response.topics[:]
        response.topics.extend(shown)
        return response
    refusals = _refusals(access, rpc, items)
    if not any(refusals):
        return serve(request)
    allowed = type(request)()
    allowed.CopyFrom(request)
    field = getattr(allowed, rpc.request_field)
    del field[:]
    field.extend(item for item, refused in zip(items, refusals, strict=True) if refused is None)
    response = serve(allowed) if len(field) else None
    answered = iter(list(getattr(response, rpc.response_field)) if response is not None else [])
    merged = [
        rpc.refused(item, refused) if refused is not None else next(answered, None)
        for item, refused in zip(items, refusals, strict=True)
    ]
    if response is None:
        response = _empty_response(method)
    out = getattr(response, rpc.response_field)
    del out[:]
    out.extend(entry for entry in merged if entry is not None)
    return response


def _empty_response(method: str) -> Any:
    """The RPC's response with nothing served (every item refused): status OK."""
    response_type = getattr(pb, f"{method}Response")
    response = response_type()
    if "status" in response.DESCRIPTOR.fields_by_name:
        response.status.error_code = 0
    return response


RESPONSE_TYPES = {"AddRaftVoter": pb.RaftVoterResponse, "RemoveRaftVoter": pb.RaftVoterResponse}


def authorize_rpc(method: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates a ControllerServicer RPC: served through `authorized` with the servicer's
    ``access_control``; a refusal of the whole RPC is its response's status."""
    response_type = RESPONSE_TYPES.get(method) or getattr(pb, f"{method}Response")

    def decorate(handler: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(handler)
        def rpc(servicer: Any, request: Any, context: Any) -> Any:
            try:
                return authorized(
                    servicer.access_control, method, request,
                    lambda allowed: handler(servicer, allowed, context),
                )  # fmt: skip
            except KafkaError as error:
                if error.error is not ErrorCode.CLUSTER_AUTHORIZATION_FAILED:
                    raise
                return response_type(status=servicer._status(error.error, error.message))

        return rpc

    return decorate
