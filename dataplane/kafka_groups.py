"""The KAFKA listener's group APIs: FindCoordinator, ConsumerGroupHeartbeat (KIP-848),
OffsetCommit and OffsetFetch, served by the same GroupServicer as gRPC.

The coordinator is KIP-848's (server-side assignment; members heartbeat with their epoch), so
Kafka clients that speak the consumer protocol (librdkafka with ``group.protocol=consumer``) join
groups unchanged. Kafka names topics by id in ConsumerGroupHeartbeat and by name elsewhere; the
broker's metadata image translates. Coordinators are answered with their KAFKA endpoints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataplane import kafka_codec as kc
from dataplane.group_coordinator import GroupServicer
from metadata_quorum.image import MetadataImage
from protos import group_pb2 as gpb
from raftlog.errors import ErrorCode

GROUP_KEY_TYPE = 0  # FindCoordinator key_type: 0 group, 1 transaction


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
        if key_type != GROUP_KEY_TYPE:
            return {**out, "error_code": ErrorCode.INVALID_REQUEST.code,
                    "error_message": "transactions are not supported"}  # fmt: skip
        answer = self.groups.FindCoordinator(
            gpb.FindCoordinatorRequest(group_ids=[key]), self.call()
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
        return {
            "throttle_time": 0,
            "topics": [
                {
                    "name": topic.name,
                    "partitions": [
                        {
                            "partition_index": p.partition,
                            "error_code": p.error_code or answer.error_code,
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
            groups = [self._fetch_group(g.group_id, g.topics) for g in body.groups]
            return {"throttle_time": 0, "groups": groups}
        group = self._fetch_group(body.group_id, body.topics)
        return {"throttle_time": 0, "topics": group["topics"], "error_code": group["error_code"]}

    def _fetch_group(self, group_id: str, topics: Any) -> dict[str, Any]:
        fetch = gpb.OffsetFetchRequest(
            group_id=group_id,
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
