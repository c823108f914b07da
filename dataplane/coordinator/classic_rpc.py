"""JoinGroup / SyncGroup / Heartbeat / LeaveGroup over gRPC: the classic group protocol.

The same coordinator calls the Kafka listener makes (``dataplane.kafka.groups``), translated from
and to ``group.proto`` messages. Mixed into
:class:`~dataplane.coordinator.group_coordinator.GroupServicer`, so they are served next to the
other group RPCs and reach a group's coordinator the same way: the client asks FindCoordinator and
sends there; any other broker answers NOT_COORDINATOR.
"""

from __future__ import annotations

from typing import Any

from dataplane.coordinator import classic_group as cg
from protos import group_pb2 as gpb
from raftlog.errors import KafkaError


class ClassicGroupRpcs:
    """The four classic RPCs; ``coordinator`` is the broker's GroupCoordinator."""

    coordinator: Any

    def JoinGroup(self, request: gpb.JoinGroupRequest, context: Any) -> gpb.JoinGroupResponse:
        join = cg.JoinRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            group_instance_id=request.group_instance_id or None,
            client_id=request.client_id,
            client_host=_peer_host(context),
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            protocol_type=request.protocol_type,
            protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
            require_known_member_id=True,
        )
        try:
            answer = self.coordinator.join_group(join)
        except KafkaError as error:
            answer = cg.JoinAnswer(error.error, request.member_id, message=error.message)
        return gpb.JoinGroupResponse(
            error_code=answer.error.code,
            error_message=answer.message,
            generation_id=answer.generation_id,
            protocol_type=answer.protocol_type or "",
            protocol_name=answer.protocol_name or "",
            leader=answer.leader,
            member_id=answer.member_id,
            members=[
                gpb.JoinGroupMember(
                    member_id=member_id, group_instance_id=instance or "", metadata=metadata
                )
                for member_id, instance, metadata in answer.members
            ],
        )

    def SyncGroup(self, request: gpb.SyncGroupRequest, context: Any) -> gpb.SyncGroupResponse:
        sync = cg.SyncRequest(
            request.group_id,
            request.generation_id,
            request.member_id,
            request.group_instance_id or None,
            request.protocol_type or None,
            request.protocol_name or None,
            {a.member_id: bytes(a.assignment) for a in request.assignments},
        )
        try:
            answer = self.coordinator.sync_group(sync)
        except KafkaError as error:
            answer = cg.SyncAnswer(error.error, message=error.message)
        return gpb.SyncGroupResponse(
            error_code=answer.error.code,
            error_message=answer.message,
            protocol_type=answer.protocol_type or "",
            protocol_name=answer.protocol_name or "",
            assignment=answer.assignment,
        )

    def Heartbeat(self, request: gpb.HeartbeatRequest, context: Any) -> gpb.HeartbeatResponse:
        try:
            self.coordinator.classic_heartbeat(
                request.group_id,
                request.generation_id,
                request.member_id,
                request.group_instance_id or None,
            )
        except KafkaError as error:
            return gpb.HeartbeatResponse(error_code=error.error.code, error_message=error.message)
        return gpb.HeartbeatResponse()

    def LeaveGroup(self, request: gpb.LeaveGroupRequest, context: Any) -> gpb.LeaveGroupResponse:
        leaving = [(m.member_id, m.group_instance_id or None) for m in request.members]
        try:
            outcomes = self.coordinator.leave_group(request.group_id, leaving)
        except KafkaError as error:
            return gpb.LeaveGroupResponse(error_code=error.error.code, error_message=error.message)
        response = gpb.LeaveGroupResponse()
        for (member_id, instance), outcome in zip(leaving, outcomes, strict=True):
            response.members.add(
                member_id=member_id,
                group_instance_id=instance or "",
                error_code=0 if outcome is None else outcome.error.code,
                error_message="" if outcome is None else outcome.message,
            )
        return response


def _peer_host(context: Any) -> str:
    """The caller's host from gRPC's peer string (``ipv4:127.0.0.1:5555``); "" if unknown."""
    peer = context.peer() if context is not None else ""
    kind, _, rest = str(peer).partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0]
    return ""
