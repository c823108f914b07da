"""The KAFKA listener's group APIs: FindCoordinator, ConsumerGroupHeartbeat (KIP-848), the
classic protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup), OffsetCommit, OffsetFetch,
ListGroups and DescribeGroups, served by the same group coordinator as gRPC.

Clients that speak KIP-848's consumer protocol (librdkafka with ``group.protocol=consumer``) get
server-side assignment; clients of the classic protocol (librdkafka's default, kafka-python) get a
classic group (:mod:`dataplane.coordinator.classic_group`) whose leader assigns. Both kinds live in
the same ``__consumer_offsets`` shards, commit offsets the same way, and are listed and described
together; DescribeGroups shows a KIP-848 group in the classic shape (subscriptions and assignments
encoded as
Kafka's consumer protocol), as Kafka does. Kafka names topics by id in ConsumerGroupHeartbeat and by
name elsewhere; the broker's metadata image translates. Coordinators are answered with their KAFKA
endpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dataplane.broker import authorization as authz
from dataplane.coordinator import assignor, share_assignor
from dataplane.coordinator import classic_group as cg
from dataplane.coordinator import consumer_protocol as cp
from dataplane.coordinator import group_state as gs
from dataplane.coordinator import share_group as sg
from dataplane.coordinator.group_coordinator import GroupServicer
from dataplane.coordinator.topic_partitions import TopicPartition
from dataplane.kafka import codec as kc
from metadata_quorum.image import MetadataImage
from metadata_quorum.security.acl import AclOperation
from protos import group_pb2 as gpb
from raftlog.errors import ErrorCode, KafkaError

GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE, SHARE_KEY_TYPE = 0, 1, 2  # FindCoordinator's key_type
OFFSET_COMMIT_KIP_848_VERSION = 9  # from v9 a commit may carry a KIP-848 member epoch
CLASSIC_PROTOCOL_TYPE = "consumer"  # what a KIP-848 group is shown as in DescribeGroups


class KafkaGroups:
    """Group requests of the KAFKA listener."""

    def __init__(
        self,
        groups: GroupServicer,
        image: Callable[[], MetadataImage],
        listener: str,
        call: Callable[[], Any],
    ) -> None:
        self.groups = groups
        self.image = image
        self.listener = listener
        self.call = call

    def handlers(self) -> dict[int, Callable[[kc.Request], kc.Data]]:
        return {
            kc.API_FIND_COORDINATOR: self.find_coordinator,
            kc.API_CONSUMER_GROUP_HEARTBEAT: self.consumer_group_heartbeat,
            kc.API_OFFSET_COMMIT: self.offset_commit,
            kc.API_OFFSET_FETCH: self.offset_fetch,
            kc.API_JOIN_GROUP: self.join_group,
            kc.API_SYNC_GROUP: self.sync_group,
            kc.API_HEARTBEAT: self.heartbeat,
            kc.API_LEAVE_GROUP: self.leave_group,
            kc.API_LIST_GROUPS: self.list_groups,
            kc.API_DESCRIBE_GROUPS: self.describe_groups,
            kc.API_DELETE_GROUPS: self.delete_groups,
            kc.API_OFFSET_DELETE: self.offset_delete,
            kc.API_CONSUMER_GROUP_DESCRIBE: self.consumer_group_describe,
            kc.API_SHARE_GROUP_HEARTBEAT: self.share_group_heartbeat,
            kc.API_SHARE_GROUP_DESCRIBE: self.share_group_describe,
        }

    # -- FindCoordinator --------------------------------------------------------------------------
    def find_coordinator(self, request: kc.Request) -> kc.Data:
        body = request.body
        batched = request.api_version >= 4
        keys = list(body.coordinator_keys) if batched else [body.key]
        found = [self._coordinator(key, kc.field(body, "key_type", GROUP_KEY_TYPE)) for key in keys]
        if batched:
            return {"throttle_time": 0, "coordinators": found}
        (only,) = found
        return {"throttle_time": 0, **{k: v for k, v in only.items() if k != "key"}}

    def _coordinator(self, key: str, key_type: int) -> kc.Data:
        out: dict[str, Any] = {"key": key, "node_id": -1, "host": "", "port": -1}
        if key_type not in (GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE, SHARE_KEY_TYPE):
            return {**out, "error_code": ErrorCode.INVALID_REQUEST.code,
                    "error_message": f"unknown key type {key_type}"}  # fmt: skip
        answer = self.groups.FindCoordinator(
            gpb.FindCoordinatorRequest(group_ids=[key], key_type=key_type), self.call()
        )
        (coordinator,) = answer.coordinators
        if coordinator.error_code:
            return {**out, "error_code": coordinator.error_code,
                    "error_message": coordinator.error_message or None}  # fmt: skip
        broker = self.image().brokers.get(coordinator.node_id)
        endpoint = None if broker is None else broker.endpoint(self.listener)
        if endpoint is None:
            missing = f"broker {coordinator.node_id} has no {self.listener} listener"
            return {**out, "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE.code,
                    "error_message": missing}  # fmt: skip
        return {**out, "node_id": coordinator.node_id, "host": endpoint.host,
                "port": endpoint.port, "error_code": 0, "error_message": None}  # fmt: skip

    # -- ConsumerGroupHeartbeat -------------------------------------------------------------------
    def consumer_group_heartbeat(self, request: kc.Request) -> kc.Data:
        body = request.body
        image = self.image()
        names = {topic_id: name for name, topic_id in image.topic_ids.items()}
        heartbeat = gpb.ConsumerGroupHeartbeatRequest(
            group_id=body.group_id,
            member_id=body.member_id,
            member_epoch=body.member_epoch,
            rebalance_timeout_ms=kc.millis(body.rebalance_timeout),
            client_id=request.client_id or "",
            server_assignor=body.server_assignor or "",
        )
        instance_id = body.instance_id
        if instance_id is not None:
            if not instance_id:  # Kafka: "InstanceId can't be empty."
                return _heartbeat_refused(ErrorCode.INVALID_REQUEST, "InstanceId can't be empty.")
            heartbeat.instance_id = instance_id
        if body.subscribed_topic_names is not None:
            heartbeat.subscribed_topic_names.SetInParent()
            heartbeat.subscribed_topic_names.names.extend(body.subscribed_topic_names)
        regex = kc.field(body, "subscribed_topic_regex")
        if regex is not None:
            heartbeat.subscribed_topic_regex = regex
        if body.topic_partitions is not None:
            heartbeat.owned.SetInParent()
            for owned in body.topic_partitions:
                name = names.get(owned.topic_id)
                if name is not None:  # a topic deleted meanwhile is owned no more
                    heartbeat.owned.topics.add(topic=name, partitions=owned.partitions)
        answer = self.groups.ConsumerGroupHeartbeat(heartbeat, self.call())
        assignment = None
        if not answer.error_code:
            assignment = {"topic_partitions": [
                {"topic_id": image.topic_ids[t.topic], "partitions": list(t.partitions)}
                for t in answer.assignment.topics
                if t.topic in image.topic_ids
            ]}  # fmt: skip
        return {
            "throttle_time": 0,
            "error_code": answer.error_code,
            "error_message": answer.error_message or None,
            "member_id": answer.member_id or None,
            "member_epoch": answer.member_epoch,
            "heartbeat_interval": answer.heartbeat_interval_ms,
            "assignment": assignment,
        }

    # -- OffsetCommit / OffsetFetch ---------------------------------------------------------------
    def offset_commit(self, request: kc.Request) -> kc.Data:
        body = request.body
        commit = gpb.OffsetCommitRequest(
            group_id=body.group_id,
            member_id=body.member_id,
            member_epoch=body.generation_id_or_member_epoch,
            group_instance_id=kc.field(body, "group_instance_id") or "",
            topics=[
                gpb.OffsetCommitTopic(
                    name=topic.name,
                    partitions=[
                        gpb.OffsetCommitPartition(
                            partition=p.partition_index,
                            committed_offset=p.committed_offset,
                            committed_leader_epoch=kc.field(p, "committed_leader_epoch", -1),
                            metadata=p.committed_metadata or "",
                        )
                        for p in topic.partitions
                    ],
                )
                for topic in body.topics
            ],
        )
        answer = self.groups.OffsetCommit(commit, self.call())
        legacy = request.api_version < OFFSET_COMMIT_KIP_848_VERSION

        def code(p: gpb.OffsetCommitPartitionResponse) -> int:
            found = p.error_code or answer.error_code
            if legacy and found == ErrorCode.GROUP_ID_NOT_FOUND.code:
                # A classic member committing to a group the coordinator does not know:
                # Kafka answers older versions ILLEGAL_GENERATION, so the member rejoins.
                return ErrorCode.ILLEGAL_GENERATION.code
            return found

        return {
            "throttle_time": 0,
            "topics": [
                {
                    "name": topic.name,
                    "partitions": [
                        {
                            "partition_index": p.partition,
                            "error_code": code(p),
                        }
                        for p in topic.partitions
                    ],
                }
                for topic in answer.topics
            ],
        }

    def offset_fetch(self, request: kc.Request) -> kc.Data:
        body = request.body
        if request.api_version >= 8:
            stable = kc.field(body, "require_stable", False)
            groups = [self._fetch_group(g.group_id, g.topics, stable) for g in body.groups]
            return {"throttle_time": 0, "groups": groups}
        group = self._fetch_group(
            body.group_id, body.topics, kc.field(body, "require_stable", False)
        )
        return {"throttle_time": 0, "topics": group["topics"], "error_code": group["error_code"]}

    def _fetch_group(self, group_id: str, topics: Any, require_stable: bool) -> dict[str, Any]:
        fetch = gpb.OffsetFetchRequest(
            group_id=group_id,
            require_stable=require_stable,  # KIP-447: UNSTABLE_OFFSET_COMMIT while pending
            topics=[
                gpb.TopicPartitions(topic=t.name, partitions=list(t.partition_indexes))
                for t in topics or ()
            ],
        )
        answer = self.groups.OffsetFetch(fetch, self.call())
        return {
            "group_id": group_id,
            "error_code": answer.error_code,
            "topics": [
                {
                    "name": topic.name,
                    "partitions": [
                        {
                            "partition_index": p.partition,
                            "committed_offset": p.committed_offset,
                            "committed_leader_epoch": p.committed_leader_epoch,
                            "metadata": p.metadata,
                            "error_code": p.error_code,
                        }
                        for p in topic.partitions
                    ],
                }
                for topic in answer.topics
            ],
        }

    # -- the classic protocol ---------------------------------------------------------------------
    @property
    def coordinator(self) -> Any:
        return self.groups.coordinator

    def join_group(self, request: kc.Request) -> kc.Data:
        body = request.body
        session_ms = kc.millis(body.session_timeout)
        # v0 has no rebalance timeout: the session timeout stands for it, as in Kafka.
        rebalance = kc.field(body, "rebalance_timeout")
        join = cg.JoinRequest(
            group_id=body.group_id,
            member_id=body.member_id,
            group_instance_id=kc.field(body, "group_instance_id"),
            client_id=request.client_id or "",
            client_host=request.client_host,
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=session_ms if rebalance is None else kc.millis(rebalance),
            protocol_type=body.protocol_type,
            protocols=tuple((p.name, bytes(p.metadata)) for p in body.protocols),
            require_known_member_id=request.api_version >= JOIN_GROUP_KIP_394_VERSION,
            skip_assignment_allowed=request.api_version >= JOIN_GROUP_SKIP_ASSIGNMENT_VERSION,
        )
        try:
            answer = self.coordinator.join_group(join)
        except KafkaError as error:
            answer = cg.JoinAnswer(error.error, body.member_id, message=error.message)
        nullable = request.api_version >= JOIN_GROUP_NULLABLE_PROTOCOL_VERSION
        return {
            "throttle_time": 0,
            "error_code": answer.error.code,
            "generation_id": answer.generation_id,
            "protocol_type": answer.protocol_type,
            "protocol_name": answer.protocol_name or (None if nullable else ""),
            "leader": answer.leader,
            "skip_assignment": answer.skip_assignment,
            "member_id": answer.member_id,
            "members": [
                {"member_id": m, "group_instance_id": instance, "metadata": metadata}
                for m, instance, metadata in answer.members
            ],
        }

    def sync_group(self, request: kc.Request) -> kc.Data:
        body = request.body
        try:
            answer = self.coordinator.sync_group(
                cg.SyncRequest(
                    body.group_id,
                    body.generation_id,
                    body.member_id,
                    kc.field(body, "group_instance_id"),
                    kc.field(body, "protocol_type"),
                    kc.field(body, "protocol_name"),
                    {a.member_id: bytes(a.assignment) for a in body.assignments},
                )
            )
        except KafkaError as error:
            answer = cg.SyncAnswer(error.error, message=error.message)
        return {
            "throttle_time": 0,
            "error_code": answer.error.code,
            "protocol_type": answer.protocol_type,
            "protocol_name": answer.protocol_name,
            "assignment": answer.assignment,
        }

    def heartbeat(self, request: kc.Request) -> kc.Data:
        body = request.body
        try:
            self.coordinator.classic_heartbeat(
                body.group_id, body.generation_id, body.member_id,
                kc.field(body, "group_instance_id"),
            )  # fmt: skip
        except KafkaError as error:
            return {"throttle_time": 0, "error_code": error.error.code}
        return {"throttle_time": 0, "error_code": 0}

    def leave_group(self, request: kc.Request) -> kc.Data:
        body = request.body
        batched = request.api_version >= 3
        leaving = (
            [(m.member_id, m.group_instance_id) for m in body.members]
            if batched
            else [(body.member_id, None)]
        )
        try:
            outcomes = self.coordinator.leave_group(body.group_id, leaving)
        except KafkaError as error:
            return {"throttle_time": 0, "error_code": error.error.code, "members": []}
        if not batched:
            (only,) = outcomes
            return {"throttle_time": 0, "error_code": 0 if only is None else only.error.code}
        return {
            "throttle_time": 0,
            "error_code": 0,
            "members": [
                {
                    "member_id": member_id,
                    "group_instance_id": instance,
                    "error_code": 0 if outcome is None else outcome.error.code,
                }
                for (member_id, instance), outcome in zip(leaving, outcomes, strict=True)
            ],
        }

    # -- ListGroups / DescribeGroups ---------------------------------------------------------------
    def list_groups(self, request: kc.Request) -> kc.Data:
        body = request.body
        states = {s.lower() for s in kc.field(body, "states_filter", ()) or ()}
        types = {t.lower() for t in kc.field(body, "types_filter", ()) or ()}
        groups = []
        for group_id, state, group_type, protocol_type in self.coordinator.list_groups():
            if (states and state.lower() not in states) or (types and group_type not in types):
                continue
            groups.append(
                {
                    "group_id": group_id,
                    "protocol_type": protocol_type,
                    "group_state": state,
                    "group_type": group_type,
                }
            )
        return {"throttle_time": 0, "error_code": 0, "groups": groups}

    def describe_groups(self, request: kc.Request) -> kc.Data:
        asked = _operations_asked(request)
        described = [
            self._with_operations(self._describe_group(group_id), asked)
            for group_id in request.body.groups
        ]
        return {"throttle_time": 0, "groups": described}

    def _with_operations(self, group: dict[str, Any], asked: bool) -> dict[str, Any]:
        """A described group with what the session may do on it, if the client asked (v3+)."""
        if asked and not group["error_code"]:
            group["authorized_operations"] = authz.authorized_operations(
                self.coordinator.access, authz.GROUP, group["group_id"]
            )
        return group

    def _describe_group(self, group_id: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "error_code": 0, "group_id": group_id, "group_state": "Dead", "protocol_type": "",
            "protocol_data": "", "members": [], "authorized_operations": authz.NOT_REQUESTED,
        }  # fmt: skip
        try:
            group = self.coordinator.describe_group(group_id)
        except KafkaError as error:
            return {**out, "error_code": error.error.code}
        if group is None or isinstance(group, sg.ShareGroup):
            # Kafka describes an unknown group, or one of neither the classic nor the consumer
            # protocol (a share group), as Dead, with no error (v0-v5)
            return out
        if isinstance(group, cg.DescribedClassicGroup):
            members = [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata,
                    "member_assignment": m.assignment,
                }
                for m in group.members
            ]
            return {
                **out, "group_state": group.state, "protocol_type": group.protocol_type or "",
                "protocol_data": group.protocol_name or "", "members": members,
            }  # fmt: skip
        return {**out, **_as_classic(group)}

    def delete_groups(self, request: kc.Request) -> kc.Data:
        """DeleteGroups: each group's offsets and records, if it has no members (Kafka's
        NON_EMPTY_GROUP otherwise; DELETE on the group; GROUP_ID_NOT_FOUND)."""
        results = []
        for group_id in request.body.groups_names:
            try:
                self.coordinator.delete_group(group_id)
                code = 0
            except KafkaError as error:
                code = error.error.code
            results.append({"group_id": group_id, "error_code": code})
        return {"throttle_time": 0, "results": results}

    def offset_delete(self, request: kc.Request) -> kc.Data:
        """OffsetDelete: the group's committed offsets of the named partitions (see
        ``GroupShard.delete_offsets``); a group-level error answers every partition with it."""
        body = request.body
        answer = self.groups.OffsetDelete(
            gpb.OffsetDeleteRequest(
                group_id=body.group_id,
                topics=[
                    gpb.TopicPartitions(
                        topic=t.name, partitions=[p.partition_index for p in t.partitions]
                    )
                    for t in body.topics
                ],
            ),
            self.call(),
        )
        return {
            "error_code": answer.error_code,
            "throttle_time": 0,
            "topics": [
                {
                    "name": t.name,
                    "partitions": [
                        {"partition_index": p.partition, "error_code": p.error_code}
                        for p in t.partitions
                    ],
                }
                for t in answer.topics
            ],
        }

    def consumer_group_describe(self, request: kc.Request) -> kc.Data:
        """ConsumerGroupDescribe (KIP-848): a consumer group's epochs, members, their
        subscriptions, assignments and targets, topics by id and name. A classic group or an
        unknown one is GROUP_ID_NOT_FOUND; DESCRIBE on the group, and (Kafka 4) on every topic
        its members subscribe to or hold, else TOPIC_AUTHORIZATION_FAILED for the group."""
        image = self.image()
        return {
            "throttle_time": 0,
            "groups": [
                self._with_operations(self._consumer_group(g, image), _operations_asked(request))
                for g in request.body.group_ids
            ],
        }

    def _consumer_group(self, group_id: str, image: MetadataImage) -> dict[str, Any]:
        out = _described_group(group_id)
        try:
            group = self.coordinator.describe_group(group_id)
        except KafkaError as error:
            return {**out, **_error(error)}
        if not isinstance(group, gs.Group) or (group.epoch == 0 and not group.members):
            missing = KafkaError(
                ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id!r} is not a consumer group"
            )
            return {**out, **_error(missing)}
        members = sorted(group.members.values(), key=lambda m: m.member_id)
        topics = {t for m in members for t, _ in m.assigned | m.pending_revocation}
        topics |= {t for m in members for t in m.subscribed_topic_names}
        topics |= {t for target in group.target.values() for t, _ in target}
        denied = self._topics_denied(topics)
        if denied is not None:
            return {**out, **denied}
        return {
            **out,
            "group_state": group.state,
            "group_epoch": group.epoch,
            "assignment_epoch": group.assignment_epoch,
            "assignor_name": next(
                (m.server_assignor for m in members if m.server_assignor), DEFAULT_ASSIGNOR
            ),
            "members": [
                {
                    "member_id": m.member_id,
                    "instance_id": m.instance_id or None,
                    "rack_id": None,
                    "member_epoch": m.member_epoch,
                    "client_id": m.client_id,
                    "client_host": "",
                    "subscribed_topic_names": list(m.subscribed_topic_names),
                    "subscribed_topic_regex": m.subscribed_topic_regex or None,
                    "assignment": _by_topic_id(m.assigned, image),
                    "target_assignment": _by_topic_id(group.target.get(m.member_id, ()), image),
                    "member_type": CONSUMER_MEMBER_TYPE,
                }
                for m in members
            ],
        }

    def _topics_denied(self, topics: Iterable[str]) -> dict[str, Any] | None:
        """Kafka 4's rule for describing a group: DESCRIBE on every topic its members subscribe
        to or hold, else TOPIC_AUTHORIZATION_FAILED for the whole group."""
        if not authz.denied_topics(self.coordinator.access, AclOperation.DESCRIBE, topics):
            return None
        return _error(
            KafkaError(
                ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                "not authorized to DESCRIBE every topic of the group",
            )
        )

    # -- share groups (KIP-932) -------------------------------------------------------------------
    def share_group_heartbeat(self, request: kc.Request) -> kc.Data:
        """ShareGroupHeartbeat v1: the member names itself; the assignment (topics by id) is
        sent when joining or when it changed, null otherwise, as Kafka."""
        body = request.body
        heartbeat = gpb.ShareGroupHeartbeatRequest(
            group_id=body.group_id,
            member_id=body.member_id,
            member_epoch=body.member_epoch,
            client_id=request.client_id or "",
            client_host=request.client_host,
        )
        if body.rack_id is not None:
            heartbeat.rack_id = body.rack_id
        if body.subscribed_topic_names is not None:
            heartbeat.subscribed_topic_names.SetInParent()
            heartbeat.subscribed_topic_names.names.extend(body.subscribed_topic_names)
        answer = self.groups.ShareGroupHeartbeat(heartbeat, self.call())
        image = self.image()
        assignment = None
        if not answer.error_code and answer.has_assignment:
            assignment = {"topic_partitions": [
                {"topic_id": image.topic_ids[t.topic], "partitions": list(t.partitions)}
                for t in answer.assignment.topics
                if t.topic in image.topic_ids
            ]}  # fmt: skip
        return {
            "throttle_time": 0,
            "error_code": answer.error_code,
            "error_message": answer.error_message or None,
            "member_id": answer.member_id or None,
            "member_epoch": answer.member_epoch,
            "heartbeat_interval": answer.heartbeat_interval_ms,
            "assignment": assignment,
        }

    def share_group_describe(self, request: kc.Request) -> kc.Data:
        """ShareGroupDescribe: a share group's epochs, members, subscriptions and assignments
        (topics by id and name). DESCRIBE on the group, and (Kafka 4) on every topic its members
        subscribe to or hold, else TOPIC_AUTHORIZATION_FAILED; an unknown group, or one of
        another type, is GROUP_ID_NOT_FOUND."""
        image = self.image()
        return {
            "throttle_time": 0,
            "groups": [
                self._with_operations(self._share_group(g, image), _operations_asked(request))
                for g in request.body.group_ids
            ],
        }

    def _share_group(self, group_id: str, image: MetadataImage) -> dict[str, Any]:
        out = _described_group(group_id)
        try:
            group = self.coordinator.describe_share_group(group_id)
        except KafkaError as error:
            return {**out, **_error(error)}
        members = sorted(group.members.values(), key=lambda m: m.member_id)
        topics = {t for m in members for t, _ in m.assigned}
        topics |= {t for m in members for t in m.subscribed_topic_names}
        denied = self._topics_denied(topics)
        if denied is not None:
            return {**out, **denied}
        return {
            **out,
            "group_state": group.state,
            "group_epoch": group.epoch,
            "assignment_epoch": group.assignment_epoch,
            "assignor_name": share_assignor.NAME,
            "members": [
                {
                    "member_id": m.member_id,
                    "rack_id": m.rack_id or None,
                    "member_epoch": m.member_epoch,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "subscribed_topic_names": list(m.subscribed_topic_names),
                    "assignment": _by_topic_id(m.assigned, image),
                }
                for m in members
            ],
        }


def _described_group(group_id: str) -> dict[str, Any]:
    """ConsumerGroupDescribe's and ShareGroupDescribe's answer for a group not (yet) found."""
    return {
        "error_code": 0, "error_message": None, "group_id": group_id, "group_state": "Dead",
        "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "", "members": [],
        "authorized_operations": authz.NOT_REQUESTED,
    }  # fmt: skip


def _error(error: KafkaError) -> dict[str, Any]:
    return {"error_code": error.error.code, "error_message": error.message}


def _by_topic_id(tps: Iterable[TopicPartition], image: MetadataImage) -> dict[str, Any]:
    """An assignment as Kafka's describe answers carry it: topic id, name, partitions."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in tps:
        by_topic.setdefault(topic, []).append(partition)
    return {"topic_partitions": [
        {"topic_id": image.topic_ids[t], "topic_name": t, "partitions": sorted(p)}
        for t, p in sorted(by_topic.items())
        if t in image.topic_ids
    ]}  # fmt: skip


SHARE_PROTOCOL_TYPE = "share"  # Kafka's ShareGroup.PROTOCOL_TYPE, as ListGroups shows it


def _operations_asked(request: kc.Request) -> bool:
    return bool(kc.field(request.body, "include_authorized_operations", False))


# ConsumerGroupDescribe v1's member_type (KIP-1099): a member speaking KIP-848's protocol
CONSUMER_MEMBER_TYPE = 1
DEFAULT_ASSIGNOR = assignor.UNIFORM

JOIN_GROUP_KIP_394_VERSION = 4  # from v4 a new member first gets its id (MEMBER_ID_REQUIRED)
JOIN_GROUP_NULLABLE_PROTOCOL_VERSION = 7
JOIN_GROUP_SKIP_ASSIGNMENT_VERSION = 9  # KIP-814: a static leader's rejoin skips assigning


def _heartbeat_refused(error: ErrorCode, message: str) -> kc.Data:
    return {
        "throttle_time": 0, "error_code": error.code, "error_message": message,
        "member_id": None, "member_epoch": 0, "heartbeat_interval": 0, "assignment": None,
    }  # fmt: skip


def _as_classic(group: gs.Group) -> dict[str, Any]:
    """A KIP-848 group in DescribeGroups' shape: subscriptions and assignments as the
    consumer protocol's bytes."""
    members = [
        {
            "member_id": m.member_id,
            "group_instance_id": m.instance_id or None,
            "client_id": m.client_id,
            "client_host": "",
            "member_metadata": cp.encode_subscription(m.subscribed_topic_names),
            "member_assignment": cp.encode_assignment(m.assigned),
        }
        for m in sorted(group.members.values(), key=lambda m: m.member_id)
    ]
    return {
        "group_state": group.state,
        "protocol_type": CLASSIC_PROTOCOL_TYPE if group.members else "",
        "protocol_data": "uniform" if group.members else "",
        "members": members,
    }
