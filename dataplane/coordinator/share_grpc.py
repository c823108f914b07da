"""ShareFetch and ShareAcknowledge on BrokerService (gRPC): the door our own
:class:`~dataplane.client.share_consumer.ShareConsumer` uses. Topics come by name (as every
BrokerService RPC names them) and are turned into the topic ids the share sessions are kept
under; the rules are :mod:`dataplane.coordinator.share_requests`', shared with the Kafka
listener's ShareFetch / ShareAcknowledge, so a member sees the same sessions, errors and records
whichever door it uses. A topic name the broker does not know gets UNKNOWN_TOPIC_OR_PARTITION
for its partitions (they join no session). A partition answered NOT_LEADER_OR_FOLLOWER carries
the current leader as the metadata image knows it. RENEW (4, KIP-1222) is served as on the
Kafka listener's v2; an RPC has no version to withhold it from, and its ShareFetch has no
``IsRenewAck`` (a renewal rides on a fetch like any acknowledgement, or goes alone in a
ShareAcknowledge, which answers the group's lock duration as Kafka's v2 does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dataplane.coordinator.share_manager import Fetched, SharePartitionManager
from dataplane.coordinator.share_partition import AckBatch, AckType
from dataplane.coordinator.share_requests import FetchLimits, Named, ShareItem, ShareRequests
from metadata_quorum.image import MetadataImage
from metadata_quorum.security.authorization import AccessControl
from protos import broker_pb2 as pb
from raftlog.errors import ErrorCode, KafkaError

_Answered = pb.ShareFetchPartitionResponse | pb.ShareAcknowledgePartitionResponse
MAX_BYTES_DEFAULT = 64 * 1024 * 1024  # a request's max_bytes left at 0


class GrpcShare:
    """BrokerService's ShareFetch / ShareAcknowledge (set on the servicer by the broker)."""

    def __init__(
        self,
        manager: SharePartitionManager,
        image: Callable[[], MetadataImage],
        access: AccessControl,
        clock_ms: Callable[[], int],
    ) -> None:
        self.requests = ShareRequests(manager, image, access, clock_ms)
        self.image = image

    def share_fetch(self, request: pb.ShareFetchRequest) -> pb.ShareFetchResponse:
        ids = self._ids()
        named, unknown = _named(request.topics, ids)
        forgotten = [
            (ids[t.name], index)
            for t in request.forgotten_topics
            if t.name in ids
            for index in t.partitions
        ]
        limits = FetchLimits(
            request.max_records or 500, request.max_bytes or MAX_BYTES_DEFAULT,
            request.max_wait_ms,
        )  # fmt: skip
        error = self.requests.fetch(
            request.group_id, request.member_id, request.share_session_epoch, named, forgotten,
            limits,
        )  # fmt: skip
        if error is not None:
            return pb.ShareFetchResponse(error_code=error.error.code, error_message=error.message)
        response = pb.ShareFetchResponse(
            acquisition_lock_timeout_ms=self.requests.lock_duration_ms(request.group_id)
        )
        topics: dict[str, pb.ShareFetchTopicResponse] = {}
        names = self.requests.names()
        for item in named.values():
            if not item.says_something():
                continue
            name = names.get(item.topic_id, "")
            topic = topics.get(name)
            if topic is None:
                topic = topics[name] = response.topics.add(name=name)
            self._fetch_partition(item, topic.partitions.add())
        for name, index in unknown:
            topic = topics.get(name)
            if topic is None:
                topic = topics[name] = response.topics.add(name=name)
            error = _unknown_topic(name)
            topic.partitions.add(
                partition=index, error_code=error.error.code, error_message=error.message,
                acknowledge_error_code=error.error.code, leader_id=-1, leader_epoch=-1,
            )  # fmt: skip
        return response

    def share_acknowledge(self, request: pb.ShareAcknowledgeRequest) -> pb.ShareAcknowledgeResponse:
        named, unknown = _named(request.topics, self._ids())
        error = self.requests.acknowledge(
            request.group_id, request.member_id, request.share_session_epoch, named
        )
        if error is not None:
            return pb.ShareAcknowledgeResponse(
                error_code=error.error.code, error_message=error.message
            )
        response = pb.ShareAcknowledgeResponse(
            acquisition_lock_timeout_ms=self.requests.lock_duration_ms(request.group_id)
        )
        topics: dict[str, pb.ShareAcknowledgeTopicResponse] = {}
        names = self.requests.names()
        answers: list[tuple[str, int, KafkaError | None, ShareItem | None]] = [
            (names.get(i.topic_id, ""), i.index, i.ack_error, i) for i in named.values()
        ]
        answers += [(name, index, _unknown_topic(name), None) for name, index in unknown]
        for name, index, ack_error, item in answers:
            if item is not None and not item.says_something():
                continue
            topic = topics.get(name)
            if topic is None:
                topic = topics[name] = response.topics.add(name=name)
            out = topic.partitions.add(partition=index, leader_id=-1, leader_epoch=-1)
            if ack_error is not None:
                out.error_code, out.error_message = ack_error.error.code, ack_error.message
                if item is not None and ack_error.error is ErrorCode.NOT_LEADER_OR_FOLLOWER:
                    self._fill_leader(item, out)
        return response

    def _ids(self) -> dict[str, bytes]:
        return {name: topic_id.bytes for name, topic_id in self.image().topic_ids.items()}

    def _fetch_partition(self, item: ShareItem, out: pb.ShareFetchPartitionResponse) -> None:
        fetched = item.fetched or Fetched()
        out.partition = item.index
        out.leader_id, out.leader_epoch = fetched.leader_id, fetched.leader_epoch
        if fetched.error is not None:
            out.error_code, out.error_message = fetched.error.error.code, fetched.error.message
            if fetched.error.error is ErrorCode.NOT_LEADER_OR_FOLLOWER:
                self._fill_leader(item, out)
        if item.ack_error is not None:
            out.acknowledge_error_code = item.ack_error.error.code
            out.acknowledge_error_message = item.ack_error.message
        out.records = fetched.records
        for r in fetched.acquired:
            out.acquired_records.add(
                first_offset=r.first_offset, last_offset=r.last_offset,
                delivery_count=r.delivery_count,
            )  # fmt: skip

    def _fill_leader(self, item: ShareItem, out: _Answered) -> None:
        leader = self.requests.leader(item.topic_id, item.index)
        if leader is not None:
            out.leader_id, out.leader_epoch = leader


def _named(
    topics: Iterable[pb.ShareRequestTopic], ids: dict[str, bytes]
) -> tuple[Named, list[tuple[str, int]]]:
    """The request's partitions by (topic id, partition), with their acknowledgements (a bad
    acknowledge type: INVALID_REQUEST as the partition's acknowledgement error); and the
    (name, partition) of the topics the broker does not know."""
    named: Named = {}
    unknown: list[tuple[str, int]] = []
    for topic in topics:
        topic_id = ids.get(topic.name)
        for p in topic.partitions:
            if topic_id is None:
                unknown.append((topic.name, p.partition))
                continue
            item = named.setdefault((topic_id, p.partition), ShareItem(topic_id, p.partition))
            for batch in p.acknowledgement_batches:
                try:
                    types = tuple(AckType(t) for t in batch.acknowledge_types)
                    if not types or batch.last_offset < batch.first_offset:
                        raise ValueError
                except ValueError:
                    item.ack_error = KafkaError(
                        ErrorCode.INVALID_REQUEST,
                        f"acknowledgement batch {batch.first_offset}-{batch.last_offset} with "
                        f"types {list(batch.acknowledge_types)} (one or one per offset, 0-4)",
                    )
                    continue
                item.acks.append(AckBatch(batch.first_offset, batch.last_offset, types))
    return named, unknown


def _unknown_topic(name: str) -> KafkaError:
    return KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
