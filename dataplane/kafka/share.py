"""ShareFetch (API 78) and ShareAcknowledge (API 79) on the KAFKA listener: a share group's
data path (KIP-932). The rules (share sessions, acknowledgements, fetching, authorization) are
:mod:`dataplane.coordinator.share_requests`', shared with BrokerService's gRPC door; this module
reads Kafka's request bodies (topics by id; a topic may come more than once: librdkafka repeats
it) and writes the answers: the partitions with records, an error or an acknowledgement, and
``node_endpoints`` the current leaders of those answered NOT_LEADER_OR_FOLLOWER.

Versions 1 (Kafka 4.1) and 2 (Kafka 4.2). v2 adds KIP-1222's acknowledge type RENEW (4),
``IsRenewAck`` (a ShareFetch that only acknowledges, see :mod:`share_requests`) and
ShareAcknowledge's ``AcquisitionLockTimeoutMs`` (the group's lock duration, what a renewal
restarts); a RENEW in a v1 request is an unknown type there (the partition's acknowledgement
error INVALID_REQUEST, nothing of it applied), as Kafka's client never sends one below v2.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from dataplane.coordinator.share_manager import Fetched, SharePartitionManager
from dataplane.coordinator.share_partition import AckBatch, AckType
from dataplane.coordinator.share_requests import FetchLimits, Named, ShareItem, ShareRequests
from dataplane.kafka import codec as kc
from metadata_quorum.image import MetadataImage
from metadata_quorum.security.authorization import AccessControl
from raftlog.errors import ErrorCode, KafkaError


class KafkaShare:
    """The share-group data path of one listener."""

    def __init__(
        self,
        manager: SharePartitionManager,
        image: Callable[[], MetadataImage],
        access: AccessControl,
        listener: str,
        clock_ms: Callable[[], int],
    ) -> None:
        self.requests = ShareRequests(manager, image, access, clock_ms)
        self.image = image
        self.listener = listener

    def handlers(self) -> dict[int, Callable[[kc.Request], kc.Data]]:
        return {
            kc.API_SHARE_FETCH: self.share_fetch,
            kc.API_SHARE_ACKNOWLEDGE: self.share_acknowledge,
        }

    def share_fetch(self, request: kc.Request) -> kc.Data:
        body = request.body
        named = _named(body.topics, "partitions", request.api_version)
        forgotten = [
            (t.topic_id.bytes, index)
            for t in kc.field(body, "forgotten_topics_data", ()) or ()
            for index in t.partitions
        ]
        limits = FetchLimits(
            int(kc.field(body, "max_records", 500)),
            int(kc.field(body, "max_bytes", kc.MAX_FRAME_BYTES)),
            kc.millis(body.max_wait),
            int(body.min_bytes),
        )
        error = self.requests.fetch(
            body.group_id or "", body.member_id or "", body.share_session_epoch, named,
            forgotten, limits, request.connection_id,
            renew_ack=bool(kc.field(body, "is_renew_ack", False)),
        )  # fmt: skip
        if error is not None:
            return _fetch_answer(error, 0, [], [])
        lock_ms = self.requests.lock_duration_ms(body.group_id or "")
        return _fetch_answer(None, lock_ms, *self._topics(named, fetch=True))

    def connection_closed(self, connection_id: str) -> None:
        """The listener's connection closed: the share sessions it opened end, their records
        go to the other members at once."""
        self.requests.connection_closed(connection_id)

    def share_acknowledge(self, request: kc.Request) -> kc.Data:
        body = request.body
        named = _named(body.topics, "partitions", request.api_version)
        error = self.requests.acknowledge(
            body.group_id or "", body.member_id or "", body.share_session_epoch, named
        )
        if error is not None:
            return _ack_answer(error, 0, [], [])
        lock_ms = self.requests.lock_duration_ms(body.group_id or "")
        return _ack_answer(None, lock_ms, *self._topics(named, fetch=False))

    def _topics(self, named: Named, fetch: bool) -> tuple[list[kc.Data], list[kc.Data]]:
        """The answer's topics (partitions with something to say) and node endpoints."""
        topics: dict[bytes, list[kc.Data]] = {}
        leaders: set[int] = set()
        for item in named.values():
            if not item.says_something():
                continue
            data = _partition_data(item, fetch)
            error = item.fetched.error if item.fetched is not None else None
            if error is not None and error.error is ErrorCode.NOT_LEADER_OR_FOLLOWER:
                leader = self.requests.leader(item.topic_id, item.index)
                if leader is not None:
                    data["current_leader"] = {"leader_id": leader[0], "leader_epoch": leader[1]}
                    leaders.add(leader[0])
            topics.setdefault(item.topic_id, []).append(data)
        return (
            [{"topic_id": uuid.UUID(bytes=t), "partitions": ps} for t, ps in topics.items()],
            self._endpoints(leaders),
        )

    def _endpoints(self, leaders: set[int]) -> list[kc.Data]:
        image = self.image()
        out: list[kc.Data] = []
        for node in sorted(leaders):
            broker = image.brokers.get(node)
            endpoint = None if broker is None else broker.endpoint(self.listener)
            if broker is not None and endpoint is not None:
                out.append({
                    "node_id": node, "host": endpoint.host, "port": endpoint.port,
                    "rack": broker.rack,
                })  # fmt: skip
        return out


RENEW_FROM_VERSION = 2  # KIP-1222


def _named(topics: Any, partitions_field: str, api_version: int) -> Named:
    """The request's partitions (a topic may come more than once: librdkafka repeats it), each
    with its acknowledgement batches; bad ones get INVALID_REQUEST as their ack error (RENEW
    is a type from v2 on)."""
    top = AckType.RENEW if api_version >= RENEW_FROM_VERSION else AckType.REJECT
    named: Named = {}
    for topic in topics:
        topic_id = topic.topic_id.bytes if topic.topic_id is not None else bytes(16)
        for p in getattr(topic, partitions_field):
            item = named.setdefault(
                (topic_id, p.partition_index), ShareItem(topic_id, p.partition_index)
            )
            for batch in kc.field(p, "acknowledgement_batches", ()) or ():
                try:
                    types = tuple(AckType(t) for t in batch.acknowledge_types)
                    if any(t > top for t in types):
                        raise ValueError
                except ValueError:
                    item.ack_error = KafkaError(
                        ErrorCode.INVALID_REQUEST,
                        f"acknowledge types {list(batch.acknowledge_types)} (0-{int(top)} are "
                        f"served at v{api_version})",
                    )
                    continue
                item.acks.append(AckBatch(batch.first_offset, batch.last_offset, types))
    return named


def _partition_data(item: ShareItem, fetch: bool) -> dict[str, Any]:
    fetched = item.fetched or Fetched()
    error = fetched.error
    data: dict[str, Any] = {
        "partition_index": item.index,
        "error_code": (error.error if error is not None else ErrorCode.NONE).code,
        "error_message": error.message if error is not None else None,
        "current_leader": {"leader_id": fetched.leader_id, "leader_epoch": fetched.leader_epoch},
    }
    if not fetch:  # ShareAcknowledge: its error is the acknowledgement's
        ack = item.ack_error
        data["error_code"] = (ack.error if ack is not None else ErrorCode.NONE).code
        data["error_message"] = ack.message if ack is not None else None
        return data
    ack = item.ack_error
    data["acknowledge_error_code"] = (ack.error if ack is not None else ErrorCode.NONE).code
    data["acknowledge_error_message"] = ack.message if ack is not None else None
    data["records"] = fetched.records
    data["acquired_records"] = [
        {
            "first_offset": r.first_offset,
            "last_offset": r.last_offset,
            "delivery_count": r.delivery_count,
        }
        for r in fetched.acquired
    ]
    return data


def _fetch_answer(
    error: KafkaError | None, lock_ms: int, topics: list[kc.Data], endpoints: list[kc.Data]
) -> kc.Data:
    return {
        "throttle_time": 0,
        "error_code": (error.error if error is not None else ErrorCode.NONE).code,
        "error_message": error.message if error is not None else None,
        "acquisition_lock_timeout": lock_ms,
        "responses": topics,
        "node_endpoints": endpoints,
    }


def _ack_answer(
    error: KafkaError | None, lock_ms: int, topics: list[kc.Data], endpoints: list[kc.Data]
) -> kc.Data:
    return {
        "throttle_time": 0,
        "error_code": (error.error if error is not None else ErrorCode.NONE).code,
        "error_message": error.message if error is not None else None,
        "acquisition_lock_timeout": lock_ms,  # v2+ (KIP-1222)
        "responses": topics,
        "node_endpoints": endpoints,
    }
