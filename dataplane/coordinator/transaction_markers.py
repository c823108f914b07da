"""The transaction coordinator's conversations with partition leaders: markers and verification.

**Markers** (Kafka's ``TransactionMarkerChannelManager``). A transaction in PrepareCommit /
PrepareAbort ends with a commit / abort marker on every partition it wrote.
:class:`MarkerWriter` writes the markers of one :class:`MarkerJob` in rounds: one
WriteTxnMarkers per partition leader (the leader from the metadata image; this broker's own
``BrokerServicer`` when it leads, gRPC otherwise); the coordinator repeats the round, with a
growing backoff (``MARKER_BACKOFF_MIN_S`` to ``MARKER_BACKOFF_MAX_S``), for the partitions that
answered a retriable error or whose leader is unknown or moved, until every partition answered
NONE. A
partition whose topic was deleted counts as done, as in Kafka (nothing can read it). The
coordinator epoch sent is the leader epoch of the coordinator's ``__transaction_state``
partition, so a leader can refuse a deposed coordinator's markers. Each error is classified as
Kafka's ``TransactionMarkerRequestCompletionHandler`` does (:func:`marker_outcome`): a
producer or coordinator epoch that moved on abandons the job (the transaction is no longer this
coordinator's to finish); the errors Kafka treats as fatal stop it too, loudly.

**Verification** (KIP-890 part 1, Kafka's ``AddPartitionsToTxnManager``). Before a partition
leader takes the first transactional batch of a producer, :class:`TransactionVerifier` asks the
transaction's coordinator (in process when this broker coordinates it, else AddPartitionsToTxn
with ``verify_only``) whether that transaction is ongoing and holds the partition. The answer is
the produce response's error: PRODUCER_FENCED becomes INVALID_PRODUCER_EPOCH (what producers
expect there), and a coordinator that is unknown, moving or busy becomes NOT_ENOUGH_REPLICAS,
retriable, as Kafka's ReplicaManager maps them.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable

import grpc

from dataplane.coordinator.transaction_state import MarkerJob, TopicPartition
from metadata_quorum.image import MetadataImage
from metadata_quorum.security.channels import ClientSecurity, open_channel
from protos import broker_pb2 as pb
from protos import broker_pb2_grpc as pb_grpc
from protos import transaction_pb2 as tpb
from protos import transaction_pb2_grpc as tpb_grpc
from raftlog.coordinator_key import partition_for
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)
TRANSACTION_STATE_TOPIC = "__transaction_state"
MARKER_RPC_TIMEOUT_S = 30.0  # a marker waits for its replication like an acks=all produce
MARKER_BACKOFF_MIN_S = 0.05
MARKER_BACKOFF_MAX_S = 2.0
VERIFY_RPC_TIMEOUT_S = 5.0
E = ErrorCode


class Outcome(enum.Enum):
    DONE = "done"  # the partition has its marker (or can never need one)
    RETRY = "retry"  # again, to the partition's leader as the image names it then
    ABANDON = "abandon"  # the producer or coordinator epoch moved on: not this job's to finish
    FATAL = "fatal"  # Kafka's IllegalStateException: a broken invariant


_OUTCOMES: dict[ErrorCode, Outcome] = {
    E.NONE: Outcome.DONE,
    # the producer could never have written there: nothing waits for a marker
    E.UNSUPPORTED_FOR_MESSAGE_FORMAT: Outcome.DONE,
    E.UNSUPPORTED_VERSION: Outcome.DONE,
    E.UNKNOWN_TOPIC_OR_PARTITION: Outcome.RETRY,
    E.NOT_LEADER_OR_FOLLOWER: Outcome.RETRY,
    E.NOT_ENOUGH_REPLICAS: Outcome.RETRY,
    E.NOT_ENOUGH_REPLICAS_AFTER_APPEND: Outcome.RETRY,
    E.REQUEST_TIMED_OUT: Outcome.RETRY,
    E.KAFKA_STORAGE_ERROR: Outcome.RETRY,
    E.LEADER_NOT_AVAILABLE: Outcome.RETRY,
    E.FENCED_LEADER_EPOCH: Outcome.RETRY,
    E.NETWORK_EXCEPTION: Outcome.RETRY,
    E.COORDINATOR_LOAD_IN_PROGRESS: Outcome.RETRY,  # __consumer_offsets' writer is loading
    E.COORDINATOR_NOT_AVAILABLE: Outcome.RETRY,
    E.NOT_COORDINATOR: Outcome.RETRY,
    E.INVALID_PRODUCER_EPOCH: Outcome.ABANDON,
    E.PRODUCER_FENCED: Outcome.ABANDON,
    E.TRANSACTION_COORDINATOR_FENCED: Outcome.ABANDON,
    E.CORRUPT_MESSAGE: Outcome.FATAL,
    E.MESSAGE_TOO_LARGE: Outcome.FATAL,
    E.RECORD_LIST_TOO_LARGE: Outcome.FATAL,
    E.INVALID_REQUIRED_ACKS: Outcome.FATAL,
}


def marker_outcome(error: ErrorCode) -> Outcome:
    """What a partition's answer to WriteTxnMarkers means for its marker. An error Kafka does
    not expect there is fatal in Kafka; here it is retried if retriable, else fatal."""
    found = _OUTCOMES.get(error)
    if found is not None:
        return found
    return Outcome.RETRY if error.retriable else Outcome.FATAL


class Channels:
    """One gRPC channel per broker address, closed together."""

    def __init__(self, security: ClientSecurity | None = None) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        # how to reach a BROKER listener that uses TLS (may be set before the first channel)
        self.security = security
        self._closed = False

    def get(self, address: str) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise KafkaError(ErrorCode.NETWORK_EXCEPTION, "the broker is stopping")
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = open_channel(address, self.security)
            return channel

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
            self._closed = True
        for channel in channels:
            channel.close()


def broker_address(image: MetadataImage, broker_id: int) -> str | None:
    broker = image.brokers.get(broker_id)
    endpoint = None if broker is None or broker.fenced else broker.endpoint("BROKER")
    return None if endpoint is None else endpoint.address


# This broker's own WriteTxnMarkers (``BrokerServicer``), called in process.
LocalMarkers = Callable[[pb.WriteTxnMarkersRequest], pb.WriteTxnMarkersResponse]
SendMarkers = Callable[[int, pb.WriteTxnMarkersRequest], pb.WriteTxnMarkersResponse]


class MarkerWriter:
    """Writes the markers of prepared transactions (see the module docstring)."""

    def __init__(
        self,
        broker_id: int,
        image: Callable[[], MetadataImage],
        local: LocalMarkers,
        channels: Channels,
        send: SendMarkers | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.image = image
        self.local = local
        self.channels = channels
        self.send = send or self._send

    def write_round(
        self, job: MarkerJob, coordinator_epoch: int, pending: set[TopicPartition]
    ) -> bool:
        """One round: the markers of the ``pending`` partitions of ``job`` to their leaders;
        each partition written (or deleted) leaves ``pending``. False if the job is to be
        abandoned. Raises AssertionError for an answer Kafka treats as fatal. The caller
        repeats, with a backoff, while ``pending`` is not empty."""
        by_leader = self._leaders(job, pending)
        for leader, partitions in sorted(by_leader.items()):
            answers = self._write_to(leader, job, coordinator_epoch, partitions)
            for tp, (error, message) in answers.items():
                outcome = marker_outcome(error)
                if outcome is Outcome.DONE:
                    pending.discard(tp)
                elif outcome is Outcome.ABANDON:
                    log.info("%s: marker on %s-%d refused (%s: %s): not this coordinator's "
                             "to finish", job.transactional_id, *tp, error.name,
                             message)  # fmt: skip
                    return False
                elif outcome is Outcome.FATAL:
                    raise AssertionError(
                        f"{job.transactional_id}: the marker on {tp[0]}-{tp[1]} got "
                        f"{error.name} ({message}): a marker is never refused so"
                    )
        return True

    def _leaders(
        self, job: MarkerJob, pending: set[TopicPartition]
    ) -> dict[int, list[TopicPartition]]:
        """The leader of each pending partition; a deleted one is done (dropped from
        ``pending``), one without a leader waits for the next round."""
        image = self.image()
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in sorted(pending):
            topic = image.topic(tp[0])
            registration = None if topic is None else topic.partitions.get(tp[1])
            if registration is None:
                log.info("%s: %s-%d no longer exists: no marker needed",
                         job.transactional_id, *tp)  # fmt: skip
                pending.discard(tp)
            elif registration.leader >= 0:
                by_leader.setdefault(registration.leader, []).append(tp)
        return by_leader

    def _write_to(
        self, leader: int, job: MarkerJob, coordinator_epoch: int, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, tuple[ErrorCode, str]]:
        """Each partition's answer; a failed call answers NETWORK_EXCEPTION for all."""
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        request = pb.WriteTxnMarkersRequest(
            markers=[
                pb.TxnMarker(
                    producer_id=job.producer_id,
                    producer_epoch=job.producer_epoch,
                    committed=job.commit,
                    coordinator_epoch=coordinator_epoch,
                    topics=[pb.TxnMarkerTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
                )
            ]
        )
        answers = {tp: (ErrorCode.NETWORK_EXCEPTION, f"no answer from broker {leader}")
                   for tp in partitions}  # fmt: skip
        try:
            response = self.send(leader, request)
        except (KafkaError, grpc.RpcError) as error:
            log.info("%s: WriteTxnMarkers to broker %d failed: %s",
                     job.transactional_id, leader, error)  # fmt: skip
            return answers
        for marker in response.markers:
            if marker.producer_id != job.producer_id:
                continue
            for answered in marker.topics:
                for result in answered.partitions:
                    tp = (answered.name, result.partition)
                    if tp in answers:
                        answers[tp] = (ErrorCode.from_code(result.error_code), result.error_message)
        return answers

    def _send(self, leader: int, request: pb.WriteTxnMarkersRequest) -> pb.WriteTxnMarkersResponse:
        if leader == self.broker_id:
            return self.local(request)
        address = broker_address(self.image(), leader)
        if address is None:
            raise KafkaError(ErrorCode.LEADER_NOT_AVAILABLE, f"broker {leader} has no endpoint")
        stub = pb_grpc.BrokerServiceStub(self.channels.get(address))
        response: pb.WriteTxnMarkersResponse = stub.WriteTxnMarkers(
            request, timeout=MARKER_RPC_TIMEOUT_S
        )
        return response


# -- KIP-890 verification -------------------------------------------------------------------------
# What a produce request may answer: coordinator trouble is the producer's to retry.
_PRODUCE_ERRORS = {
    E.PRODUCER_FENCED: E.INVALID_PRODUCER_EPOCH,
    E.CONCURRENT_TRANSACTIONS: E.NOT_ENOUGH_REPLICAS,
    E.COORDINATOR_LOAD_IN_PROGRESS: E.NOT_ENOUGH_REPLICAS,
    E.COORDINATOR_NOT_AVAILABLE: E.NOT_ENOUGH_REPLICAS,
    E.NOT_COORDINATOR: E.NOT_ENOUGH_REPLICAS,
}
# (transactional id, producer id, epoch, [(topic, partition)]) -> each partition's code
VerifyLocally = Callable[[str, int, int, list[TopicPartition]], dict[TopicPartition, ErrorCode]]


class TransactionVerifier:
    """``BrokerServicer.verify_transaction``: (transactional id, producer id, producer epoch,
    topic, partition) -> NONE or the produce error (see the module docstring)."""

    def __init__(
        self,
        broker_id: int,
        image: Callable[[], MetadataImage],
        verify_locally: VerifyLocally,
        channels: Channels,
    ) -> None:
        self.broker_id = broker_id
        self.image = image
        self.verify_locally = verify_locally
        self.channels = channels

    def __call__(
        self, transactional_id: str, producer_id: int, producer_epoch: int, topic: str,
        partition: int,
    ) -> ErrorCode:  # fmt: skip
        error = self._ask(transactional_id, producer_id, producer_epoch, (topic, partition))
        return _PRODUCE_ERRORS.get(error, error)

    def _ask(self, transactional_id: str, producer_id: int, epoch: int, tp: TopicPartition) -> E:
        image = self.image()
        state_topic = image.topic(TRANSACTION_STATE_TOPIC)
        if state_topic is None or not state_topic.partitions:
            return E.COORDINATOR_NOT_AVAILABLE  # no coordinator ever began a transaction
        index = partition_for(transactional_id, len(state_topic.partitions))
        leader = state_topic.partitions[index].leader
        try:
            if leader == self.broker_id:
                return self.verify_locally(transactional_id, producer_id, epoch, [tp])[tp]
        except KafkaError as error:
            return error.error
        address = None if leader < 0 else broker_address(image, leader)
        if address is None:
            return E.COORDINATOR_NOT_AVAILABLE
        request = tpb.AddPartitionsToTxnRequest(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch,
            topics=[tpb.TopicPartitions(topic=tp[0], partitions=[tp[1]])], verify_only=True,
        )  # fmt: skip
        started = time.monotonic()
        try:
            stub = tpb_grpc.TransactionCoordinatorServiceStub(self.channels.get(address))
            response = stub.AddPartitionsToTxn(request, timeout=VERIFY_RPC_TIMEOUT_S)
        except (KafkaError, grpc.RpcError) as error:
            log.info("verifying %s on %s-%d with broker %d failed after %.0f ms: %s",
                     transactional_id, *tp, leader, (time.monotonic() - started) * 1000,
                     error)  # fmt: skip
            return E.NETWORK_EXCEPTION
        if response.error_code:
            return ErrorCode.from_code(response.error_code)
        for result in response.results:
            if (result.topic, result.partition) == tp:
                return ErrorCode.from_code(result.error_code)
        return E.INVALID_TXN_STATE  # the coordinator did not vouch for the partition
