"""ControllerService over gRPC: protobuf requests in, the pure core's calls, protobuf answers out.

Every controller serves it. Writes on a node that is not the active controller are answered with
NOT_CONTROLLER and the active controller's address; errors of a request as a whole go in
``status``, errors of one topic / partition / resource go in that item. The mapping between Kafka
error values and the wire lives here and nowhere else.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from metadata_quorum import configs
from metadata_quorum.cluster import (
    generate_allocate_producer_ids,
    generate_cordon_broker,
    generate_heartbeat,
    generate_register_broker,
    generate_unregister_broker,
)
from metadata_quorum.codec import (
    endpoint_from_proto,
    endpoint_to_proto,
    record_to_proto,
    snapshot_to_proto,
    voter_from_proto,
    voter_to_proto,
)
from metadata_quorum.controller import NotControllerError, QuorumController
from metadata_quorum.features import (
    FeatureUpdate,
    UpgradeType,
    elr_enabled,
    generate_clear_elrs,
    generate_update_features,
)
from metadata_quorum.group_configs import KAFKA_GROUP_RULES, GroupConfigRow, GroupRules
from metadata_quorum.grpc_errors import abort
from metadata_quorum.grpc_standard import (
    DEFAULT_KEEPALIVE,
    Keepalive,
    NodeHealth,
    RichErrors,
    add_standard_services,
)
from metadata_quorum.image import MetadataImage, PartitionRegistration
from metadata_quorum.raft import QuorumStatus
from metadata_quorum.reassignment import (
    ReassignRequest,
    generate_alter_reassignments,
    list_reassignments,
)
from metadata_quorum.records import (
    NO_LEADER,
    ConfigRecord,
    ConfigResourceType,
    ControllerVoter,
    MetadataRecord,
)
from metadata_quorum.replication import (
    IsrRequest,
    ItemResult,
    NewTopic,
    generate_alter_partition,
    generate_create_partitions,
    generate_create_topics,
    generate_delete_topics,
    generate_elect_leaders,
)
from metadata_quorum.request_authorization import authorize_rpc, check_cluster
from metadata_quorum.request_handler_pool import KEEP_ALIVE_S, RequestHandlerPool
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl
from metadata_quorum.security.channels import ClientSecurity, open_channel
from metadata_quorum.security.grpc_auth import AUTHENTICATION_SERVICE, ServerSecurity
from metadata_quorum.security_service import SecurityRpcs
from protos import MAX_MESSAGE_BYTES
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pb_grpc
from raftlog.errors import ErrorCode, KafkaError

R = TypeVar("R")
log = logging.getLogger(__name__)
FETCH_METADATA_MAX_RECORDS = 5000
# a change of it clears the affected partitions' ELR (KIP-966, metadata_quorum.features)
MIN_INSYNC_REPLICAS = "min.insync.replicas"
# DescribeQuorum on a standby controller is forwarded to the active one, once: a request
# carrying this gRPC metadata key (value: the forwarding node's id) is answered where it lands.
FORWARDED_METADATA_KEY = "raftlog-forwarded-by"
FORWARD_TIMEOUT_S = 2.0
FORWARD_TIMEOUT_MIN_S = 0.05


Voter = ControllerVoter  # a controller: its id, the gRPC address clients use, its Raft address
PROBE_TIMEOUT_S = 2.0  # AddRaftVoter asks the new controller who it is, within this


class ControllerServicer(SecurityRpcs, pb_grpc.ControllerServiceServicer):
    """The ACL and SCRAM credential RPCs are in metadata_quorum/security_service.py.
    ``access_control``: the controller's authorizer over its own image (ALLOW_ALL: none)."""

    def __init__(
        self,
        controller: QuorumController,
        cluster_id: str,
        access_control: AccessControl = ALLOW_ALL,
        node_security: ClientSecurity | None = None,
        group_rules: GroupRules = KAFKA_GROUP_RULES,
    ) -> None:
        self.controller = controller
        # group configs are validated with this node's group coordinator defaults and bounds
        self.group_rules = group_rules
        self.cluster_id = cluster_id
        self.access_control = access_control
        # how this controller reaches another's CONTROLLER listener (TLS, its certificate)
        self.node_security = node_security
        self.stop_streams = False

    @property
    def voters(self) -> dict[int, Voter]:
        """The quorum's voters: the image's (KIP-853), or the static ones until recorded."""
        return {v.node_id: v for v in self.controller.voters()}

    # -- plumbing ----------------------------------------------------------------------------
    def _status(self, error: ErrorCode = ErrorCode.NONE, message: str = "") -> pb.Status:
        leader = self.controller.active_controller_id()
        voter = self.voters.get(leader)
        return pb.Status(
            error_code=error.code,
            error_message=message,
            controller_address=voter.address if voter else "",
        )

    def _guard(self, response_type: type[R], body: Callable[[], R]) -> R:
        try:
            return body()
        except NotControllerError as error:
            return response_type(status=self._status(ErrorCode.NOT_CONTROLLER, error.message))  # type: ignore[call-arg]
        except KafkaError as error:
            return response_type(status=self._status(error.error, error.message))  # type: ignore[call-arg]

    def _image(self) -> MetadataImage:
        return self.controller.state.image

    def _replaying(self, response_type: type[R]) -> R | None:
        """For the reads a standby answers from its own image: while this controller is still
        replaying (started again, not caught up with the commit index a leader told it), the
        answer is NOT_CONTROLLER with the active controller's address, which clients follow,
        not an image that lacks what was committed since its last persisted commit index."""
        if self.controller.caught_up():
            return None
        message = "this controller is still replaying the metadata log; ask the active one"
        return response_type(status=self._status(ErrorCode.NOT_CONTROLLER, message))  # type: ignore[call-arg]

    # -- brokers -----------------------------------------------------------------------------
    @authorize_rpc("RegisterBroker")
    def RegisterBroker(self, request: pb.RegisterBrokerRequest, context: Any) -> Any:
        def body() -> pb.RegisterBrokerResponse:
            endpoints = tuple(endpoint_from_proto(e) for e in request.endpoints)
            now = self.controller.now_ms()

            def generate(image: MetadataImage) -> tuple[list[MetadataRecord], int]:
                records = generate_register_broker(
                    image,
                    self.controller.sessions,
                    now,
                    request.broker_id,
                    request.incarnation_id,
                    endpoints,
                    request.rack or None,
                    request.static_configs,
                    previous_broker_epoch=(
                        request.previous_broker_epoch
                        if request.HasField("previous_broker_epoch")
                        else -1
                    ),
                )
                current = image.brokers.get(request.broker_id)
                return records, current.broker_epoch if current and not records else -1

            existing, first_offset = self.controller.write(generate)
            epoch = existing if existing >= 0 else first_offset
            return pb.RegisterBrokerResponse(status=self._status(), broker_epoch=epoch)

        return self._guard(pb.RegisterBrokerResponse, body)

    @authorize_rpc("BrokerHeartbeat")
    def BrokerHeartbeat(self, request: pb.BrokerHeartbeatRequest, context: Any) -> Any:
        def body() -> pb.BrokerHeartbeatResponse:
            now = self.controller.now_ms()

            def generate(image: MetadataImage) -> tuple[list[MetadataRecord], Any]:
                result = generate_heartbeat(
                    image,
                    self.controller.sessions,
                    now,
                    request.broker_id,
                    request.broker_epoch,
                    request.current_metadata_offset,
                    request.want_fence,
                    request.want_shutdown,
                )
                return result.records, result

            try:
                result, _ = self.controller.write(generate)
            except NotControllerError:
                self.controller.note_standby_heartbeat(request.broker_id, request.broker_epoch, now)
                raise
            return pb.BrokerHeartbeatResponse(
                status=self._status(),
                is_caught_up=result.is_caught_up,
                is_fenced=result.is_fenced,
                should_shut_down=result.should_shut_down,
            )

        return self._guard(pb.BrokerHeartbeatResponse, body)

    @authorize_rpc("UnregisterBroker")
    def UnregisterBroker(self, request: pb.UnregisterBrokerRequest, context: Any) -> Any:
        def body() -> pb.UnregisterBrokerResponse:
            self.controller.write(
                lambda image: (
                    generate_unregister_broker(image, request.broker_id, request.force),
                    None,
                )
            )
            return pb.UnregisterBrokerResponse(status=self._status())

        return self._guard(pb.UnregisterBrokerResponse, body)

    @authorize_rpc("CordonBroker")
    def CordonBroker(self, request: pb.CordonBrokerRequest, context: Any) -> Any:
        def body() -> pb.CordonBrokerResponse:
            self.controller.write(
                lambda image: (
                    generate_cordon_broker(image, request.broker_id, request.cordoned),
                    None,
                )
            )
            return pb.CordonBrokerResponse(status=self._status())

        return self._guard(pb.CordonBrokerResponse, body)

    @authorize_rpc("AllocateProducerIds")
    def AllocateProducerIds(self, request: pb.AllocateProducerIdsRequest, context: Any) -> Any:
        def body() -> pb.AllocateProducerIdsResponse:
            def generate(image: MetadataImage) -> tuple[list[MetadataRecord], tuple[int, int]]:
                record, start, length = generate_allocate_producer_ids(
                    image, request.broker_id, request.broker_epoch
                )
                return [record], (start, length)

            (start, length), _ = self.controller.write(generate)
            return pb.AllocateProducerIdsResponse(
                status=self._status(), producer_id_start=start, producer_id_len=length
            )

        return self._guard(pb.AllocateProducerIdsResponse, body)

    # -- topics and partitions -----------------------------------------------------------------
    @authorize_rpc("CreateTopics")
    def CreateTopics(self, request: pb.CreateTopicsRequest, context: Any) -> Any:
        topics = [
            NewTopic(
                t.name,
                t.num_partitions,
                t.replication_factor,
                {a.partition: tuple(a.broker_ids) for a in t.assignments} or None,
                dict(t.configs),
            )
            for t in request.topics
        ]

        def body() -> pb.CreateTopicsResponse:
            rng = self.controller.rng
            out, _ = self.controller.write(
                lambda image: _split(
                    generate_create_topics(image, topics, request.validate_only, rng)
                )
            )
            return pb.CreateTopicsResponse(
                status=self._status(),
                topics=[
                    pb.CreatableTopicResult(
                        name=r.name,
                        topic_id=r.topic_id.bytes if r.topic_id else b"",
                        error_code=r.error.code,
                        error_message=r.message,
                        num_partitions=r.num_partitions,
                        replication_factor=r.replication_factor,
                    )
                    for r in out
                ],
            )

        return self._guard(pb.CreateTopicsResponse, body)

    @authorize_rpc("DeleteTopics")
    def DeleteTopics(self, request: pb.DeleteTopicsRequest, context: Any) -> Any:
        def body() -> pb.DeleteTopicsResponse:
            out, _ = self.controller.write(
                lambda image: _split(generate_delete_topics(image, list(request.names)))
            )
            return pb.DeleteTopicsResponse(
                status=self._status(),
                topics=[
                    pb.DeletableTopicResult(
                        name=r.name,
                        topic_id=r.topic_id.bytes if r.topic_id else b"",
                        error_code=r.error.code,
                        error_message=r.message,
                    )
                    for r in out
                ],
            )

        return self._guard(pb.DeleteTopicsResponse, body)

    @authorize_rpc("CreatePartitions")
    def CreatePartitions(self, request: pb.CreatePartitionsRequest, context: Any) -> Any:
        wanted = [
            (t.name, t.count, {a.partition: tuple(a.broker_ids) for a in t.assignments} or None)
            for t in request.topics
        ]

        def body() -> pb.CreatePartitionsResponse:
            out, _ = self.controller.write(
                lambda image: _split(
                    generate_create_partitions(
                        image, wanted, request.validate_only, self.controller.rng
                    )
                )
            )
            return pb.CreatePartitionsResponse(
                status=self._status(),
                topics=[
                    pb.TopicResult(name=r.name, error_code=r.error.code, error_message=r.message)
                    for r in out
                ],
            )

        return self._guard(pb.CreatePartitionsResponse, body)

    @authorize_rpc("AlterPartition")
    def AlterPartition(self, request: pb.AlterPartitionRequest, context: Any) -> Any:
        def body() -> pb.AlterPartitionResponse:
            items = [  # a malformed topic id is the answer's error (UNKNOWN_TOPIC_ID)
                IsrRequest(
                    _topic_id(i.topic_id), i.partition, i.leader_epoch, tuple(i.new_isr),
                    i.partition_epoch,
                )
                for i in request.partitions
            ]  # fmt: skip
            out, _ = self.controller.write(
                lambda image: _split(
                    generate_alter_partition(image, request.broker_id, request.broker_epoch, items)
                )
            )
            return pb.AlterPartitionResponse(
                status=self._status(), partitions=[_partition_result(r) for r in out]
            )

        return self._guard(pb.AlterPartitionResponse, body)

    @authorize_rpc("ElectLeaders")
    def ElectLeaders(self, request: pb.ElectLeadersRequest, context: Any) -> Any:
        wanted = [(tp.topic, tp.partition) for tp in request.partitions] or None
        unclean = request.election_type == pb.UNCLEAN

        def body() -> pb.ElectLeadersResponse:
            out, _ = self.controller.write(
                lambda image: _split(generate_elect_leaders(image, unclean, wanted))
            )
            return pb.ElectLeadersResponse(
                status=self._status(), partitions=[_partition_result(r) for r in out]
            )

        return self._guard(pb.ElectLeadersResponse, body)

    # -- finalized features (KIP-584/778; the rules are in metadata_quorum.features) ----------
    @authorize_rpc("UpdateFeatures")
    def UpdateFeatures(self, request: pb.UpdateFeaturesRequest, context: Any) -> Any:
        updates = [
            FeatureUpdate(u.feature, u.max_version_level, _upgrade_type(u.upgrade_type))
            for u in request.updates
        ]

        def body() -> pb.UpdateFeaturesResponse:
            results, _ = self.controller.write(
                lambda image: generate_update_features(image, updates, request.validate_only)
            )
            return pb.UpdateFeaturesResponse(
                status=self._status(),
                results=[
                    pb.FeatureUpdateResult(
                        feature=r.feature, error_code=r.error.code, error_message=r.message
                    )
                    for r in results
                ],
            )

        return self._guard(pb.UpdateFeaturesResponse, body)

    # -- reassignment (KIP-455) ------------------------------------------------------------------
    @authorize_rpc("AlterPartitionReassignments")
    def AlterPartitionReassignments(
        self, request: pb.AlterPartitionReassignmentsRequest, context: Any
    ) -> Any:
        allow = request.allow_replication_factor_change

        def body() -> pb.AlterPartitionReassignmentsResponse:
            items = [_reassign_request(p) for p in request.partitions]
            out, _ = self.controller.write(
                lambda image: _split(generate_alter_reassignments(image, items, allow))
            )
            return pb.AlterPartitionReassignmentsResponse(
                status=self._status(), partitions=[_partition_result(r) for r in out]
            )

        return self._guard(pb.AlterPartitionReassignmentsResponse, body)

    @authorize_rpc("ListPartitionReassignments")
    def ListPartitionReassignments(
        self, request: pb.ListPartitionReassignmentsRequest, context: Any
    ) -> Any:
        """From this controller's image, like DescribeTopics: a standby answers too."""
        if (replaying := self._replaying(pb.ListPartitionReassignmentsResponse)) is not None:
            return replaying
        wanted = [(tp.topic, tp.partition) for tp in request.partitions] or None
        image = self._image()
        return pb.ListPartitionReassignmentsResponse(
            status=self._status(),
            partitions=[
                pb.PartitionState(
                    topic=r.topic,
                    partition=r.partition,
                    replicas=list(r.replicas),
                    adding_replicas=list(r.adding_replicas),
                    removing_replicas=list(r.removing_replicas),
                )
                for r in list_reassignments(image, wanted)
            ],
        )

    # -- configs -------------------------------------------------------------------------------
    @authorize_rpc("AlterConfigs")
    def AlterConfigs(self, request: pb.AlterConfigsRequest, context: Any) -> Any:
        def generate(image: MetadataImage) -> tuple[list[MetadataRecord], list[pb.ResourceResult]]:
            records: list[MetadataRecord] = []
            results = []
            for resource in request.resources:
                error, message, changes = _config_changes(
                    image, resource, request.replace, self.group_rules
                )
                results.append(
                    pb.ResourceResult(
                        resource=resource.resource, error_code=error.code, error_message=message
                    )
                )
                if not request.validate_only:
                    records.extend(changes)
            return records, results

        def body() -> pb.AlterConfigsResponse:
            results, _ = self.controller.write(generate)
            return pb.AlterConfigsResponse(status=self._status(), resources=results)

        return self._guard(pb.AlterConfigsResponse, body)

    @authorize_rpc("DescribeConfigs")
    def DescribeConfigs(self, request: pb.DescribeConfigsRequest, context: Any) -> Any:
        if (replaying := self._replaying(pb.DescribeConfigsResponse)) is not None:
            return replaying
        image = self._image()
        out = []
        for resource in request.resources:
            try:
                broker_id = request.broker_id if request.HasField("broker_id") else None
                entries = _describe_configs(image, resource, broker_id, self.group_rules)
            except KafkaError as error:
                out.append(
                    pb.DescribedConfigs(
                        resource=resource, error_code=error.error.code, error_message=error.message
                    )
                )
                continue
            out.append(pb.DescribedConfigs(resource=resource, entries=entries))
        return pb.DescribeConfigsResponse(status=self._status(), resources=out)

    # -- reads -------------------------------------------------------------------------------
    @authorize_rpc("DescribeCluster")
    def DescribeCluster(self, request: pb.DescribeClusterRequest, context: Any) -> Any:
        if (replaying := self._replaying(pb.DescribeClusterResponse)) is not None:
            # the voters it follows meanwhile: how a joining controller (an observer until
            # added) shows what it learned from the quorum
            replaying.voters.extend(voter_to_proto(v) for v in self.controller.voters())
            replaying.controller_id = self.controller.active_controller_id()
            replaying.controller_address = replaying.status.controller_address
            replaying.cluster_id = self.cluster_id
            return replaying
        image = self._image()
        leader = self.controller.active_controller_id()
        voter = self.voters.get(leader)
        return pb.DescribeClusterResponse(
            status=self._status(),
            cluster_id=self.cluster_id,
            controller_id=leader,
            controller_address=voter.address if voter else "",
            brokers=[
                pb.BrokerDescription(
                    broker_id=b.broker_id,
                    endpoints=[endpoint_to_proto(e) for e in b.endpoints],
                    rack=b.rack or "",
                    fenced=b.fenced,
                    broker_epoch=b.broker_epoch,
                    in_controlled_shutdown=b.in_controlled_shutdown,
                    cordoned=b.cordoned,
                )
                for _, b in sorted(image.brokers.items())
            ],
            metadata_offset=image.offset,
            voters=[voter_to_proto(v) for v in self.controller.voters()],
        )

    @authorize_rpc("DescribeTopics")
    def DescribeTopics(self, request: pb.DescribeTopicsRequest, context: Any) -> Any:
        if (replaying := self._replaying(pb.DescribeTopicsResponse)) is not None:
            return replaying
        image = self._image()
        names = list(request.names) or sorted(image.topic_ids)
        out = []
        for name in names:
            topic = image.topic(name)
            if topic is None:
                out.append(
                    pb.TopicDescription(
                        name=name,
                        error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code,
                        error_message=f"no topic {name}",
                    )
                )
                continue
            partitions = [
                _partition_state(name, topic.topic_id, p, reg)
                for p, reg in sorted(topic.partitions.items())
            ]
            out.append(
                pb.TopicDescription(
                    name=name,
                    topic_id=topic.topic_id.bytes,
                    partitions=partitions,
                    configs=dict(image.topic_configs(name)),
                )
            )
        return pb.DescribeTopicsResponse(
            status=self._status(), topics=out, metadata_offset=image.offset
        )

    @authorize_rpc("DescribeQuorum")
    def DescribeQuorum(self, request: pb.DescribeQuorumRequest, context: Any) -> Any:
        """The quorum as the active controller sees it. Only the Raft leader knows how far each
        voter's log matches its own, so another controller forwards the request there (Kafka's
        brokers forward DescribeQuorum to the active controller too) and answers from its own
        view, match indexes unknown (-1), only if the active controller does not answer."""
        leader_id = self.controller.active_controller_id()
        leader = self.voters.get(leader_id)
        if leader is not None and leader_id != self.controller.node_id and not _forwarded(context):
            by = str(self.controller.node_id)
            answer = _ask_active_controller(
                leader.address, request, context, by, self.node_security
            )
            if answer is not None:
                return answer
        return self._local_quorum()

    def _local_quorum(self) -> pb.DescribeQuorumResponse:
        status = self.controller.quorum_status()
        by_raft = {v.raft_address: v for v in self.voters.values()}
        image = self._image()
        leader = by_raft.get(status.leader or "")
        voters = []
        for vs, lag in zip(status.voters, voter_lags(status), strict=True):
            voter = by_raft.get(vs.address)
            voters.append(
                pb.VoterState(
                    node_id=voter.node_id if voter else -1,
                    address=voter.address if voter else vs.address,
                    match_index=-1 if vs.match_index is None else vs.match_index,
                    lag=-1 if lag is None else lag,
                    connected=vs.connected,
                    raft_address=vs.address,
                )
            )
        offsets = self.controller.sessions.metadata_offset if self.controller.is_active else {}
        observers = [
            pb.ObserverState(
                node_id=broker_id,
                metadata_offset=offsets.get(broker_id, -1),
                lag=max(0, image.offset - offsets[broker_id]) if broker_id in offsets else -1,
            )
            for broker_id in sorted(image.brokers)
        ]
        return pb.DescribeQuorumResponse(
            status=self._status(),
            leader_id=leader.node_id if leader else NO_LEADER,
            term=status.term,
            commit_index=status.commit_index,
            metadata_offset=image.offset,
            voters=voters,
            has_quorum=status.has_quorum,
            observers=observers,
        )

    # -- controller membership (KIP-853) -------------------------------------------------------
    @authorize_rpc("AddRaftVoter")
    def AddRaftVoter(self, request: pb.AddRaftVoterRequest, context: Any) -> Any:
        def body() -> pb.RaftVoterResponse:
            self._check_cluster_id(request.cluster_id)
            voter = voter_from_proto(request.voter)
            probed = _probe_cluster_id(voter, self.node_security)  # running, and one of ours
            self._check_cluster_id(probed)
            voters = self.controller.add_voter(voter)
            return pb.RaftVoterResponse(
                status=self._status(), voters=[voter_to_proto(v) for v in voters]
            )

        return self._guard(pb.RaftVoterResponse, body)

    @authorize_rpc("RemoveRaftVoter")
    def RemoveRaftVoter(self, request: pb.RemoveRaftVoterRequest, context: Any) -> Any:
        def body() -> pb.RaftVoterResponse:
            self._check_cluster_id(request.cluster_id)
            voters = self.controller.remove_voter(request.voter_id)
            return pb.RaftVoterResponse(
                status=self._status(), voters=[voter_to_proto(v) for v in voters]
            )

        return self._guard(pb.RaftVoterResponse, body)

    def _check_cluster_id(self, cluster_id: str) -> None:
        if cluster_id and cluster_id != self.cluster_id:
            raise KafkaError(
                ErrorCode.INCONSISTENT_CLUSTER_ID,
                f"cluster id {cluster_id!r} is not this cluster's ({self.cluster_id!r})",
            )

    def FetchMetadata(self, request: pb.FetchMetadataRequest, context: Any) -> Iterator[Any]:
        """Stream updates from ``from_offset``: the image first if the caller is too far behind,
        then record deltas as they commit, until ``max_wait_ms`` passes with nothing new."""
        try:  # CLUSTER_ACTION: only the nodes follow the metadata
            check_cluster(self.access_control, "FetchMetadata")
        except KafkaError as error:
            if context is None:
                raise
            abort(context, error)
        next_offset = max(0, request.from_offset)
        wait_s = (request.max_wait_ms or 30_000) / 1000
        while not self.stop_streams and (context is None or context.is_active()):
            image, records, high = self.controller.state.updates_since(next_offset, wait_s)
            if image is not None:
                yield pb.MetadataUpdate(snapshot=snapshot_to_proto(image), high_offset=high)
                next_offset = image.offset + 1
                continue
            if not records:
                if request.max_wait_ms:
                    return
                continue
            for start in range(0, len(records), FETCH_METADATA_MAX_RECORDS):
                chunk = records[start : start + FETCH_METADATA_MAX_RECORDS]
                yield pb.MetadataUpdate(
                    records=[
                        pb.OffsetRecord(offset=o, record=record_to_proto(r)) for o, r in chunk
                    ],
                    high_offset=high,
                )
            next_offset = records[-1][0] + 1


def voter_lags(status: QuorumStatus) -> list[int | None]:
    """Each voter's lag behind the leader: the leader's last log index minus the voter's match
    index (Kafka's DescribeQuorum lag: leader log end offset minus the voter's). None where
    unknown: on a node that is not the ready leader, which knows no match index."""
    own = next((v for v in status.voters if v.address == status.self_address), None)
    if own is None or own.match_index is None:
        return [None for _ in status.voters]
    last_index = own.match_index
    return [
        None if v.match_index is None else max(0, last_index - v.match_index) for v in status.voters
    ]


def _probe_cluster_id(voter: ControllerVoter, security: ClientSecurity | None = None) -> str:
    """The cluster id the controller to add serves (DescribeCluster on its CONTROLLER
    listener); REQUEST_TIMED_OUT if it does not answer: it must run before it is added."""
    try:
        with open_channel(voter.address, security) as channel:
            stub = pb_grpc.ControllerServiceStub(channel)
            answer = stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=PROBE_TIMEOUT_S)
    except grpc.RpcError as error:
        raise KafkaError(
            ErrorCode.REQUEST_TIMED_OUT,
            f"controller {voter.node_id} does not answer at {voter.address} ({error.code()}): "
            "start it (with the current voters in controller.quorum.voters) first",
        ) from error
    return str(answer.cluster_id)


def _forwarded(context: Any) -> bool:
    """The request came from another controller: answer it here, never forward it again."""
    if context is None:
        return False
    return any(key == FORWARDED_METADATA_KEY for key, _ in context.invocation_metadata() or ())


def _ask_active_controller(
    address: str,
    request: pb.DescribeQuorumRequest,
    context: Any,
    forwarded_by: str,
    security: ClientSecurity | None = None,
) -> pb.DescribeQuorumResponse | None:
    """The active controller's DescribeQuorum answer, or None if it does not answer within
    half the caller's remaining deadline (at most FORWARD_TIMEOUT_S), so that the caller still
    gets this node's own answer in time (a dead, paused or partitioned active controller).
    ``wait_for_ready``: a connection refused a moment ago (a node still starting) is retried
    within the timeout instead of failing at once."""
    remaining_s = context.time_remaining() if context is not None else None
    timeout_s = FORWARD_TIMEOUT_S if remaining_s is None else remaining_s / 2
    timeout_s = min(FORWARD_TIMEOUT_S, timeout_s)
    if timeout_s < FORWARD_TIMEOUT_MIN_S:
        return None
    forwarded = ((FORWARDED_METADATA_KEY, forwarded_by),)
    try:
        with open_channel(address, security) as channel:
            stub = pb_grpc.ControllerServiceStub(channel)
            answer: pb.DescribeQuorumResponse = stub.DescribeQuorum(
                request, timeout=timeout_s, metadata=forwarded, wait_for_ready=True
            )
    except (grpc.RpcError, KafkaError) as error:  # KafkaError: its authentication failed
        log.info("DescribeQuorum forwarded to %s failed (%s); answering locally", address, error)
        return None
    return answer


def _split(generated: Any) -> tuple[list[MetadataRecord], list[ItemResult]]:
    return generated.records, generated.results


def _topic_id(raw: bytes) -> uuid.UUID:
    if len(raw) != 16:
        raise KafkaError(ErrorCode.UNKNOWN_TOPIC_ID, f"a topic id has 16 bytes, not {len(raw)}")
    return uuid.UUID(bytes=raw)


def _partition_state(
    name: str, topic_id: uuid.UUID, partition: int, reg: PartitionRegistration
) -> pb.PartitionState:
    return pb.PartitionState(
        topic=name,
        topic_id=topic_id.bytes,
        partition=partition,
        leader=reg.leader,
        leader_epoch=reg.leader_epoch,
        isr=list(reg.isr),
        partition_epoch=reg.partition_epoch,
        replicas=list(reg.replicas),
        adding_replicas=list(reg.adding_replicas),
        removing_replicas=list(reg.removing_replicas),
        eligible_leader_replicas=list(reg.elr),
        last_known_elr=list(reg.last_known_elr),
    )


def _reassign_request(item: pb.ReassignableTopicPartition) -> ReassignRequest:
    if item.cancel and item.replicas:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST, "a cancel names no replicas; a target names no cancel"
        )
    target = None if item.cancel else tuple(item.replicas)
    return ReassignRequest(item.topic, item.partition, target)


def _partition_result(result: ItemResult) -> pb.PartitionState:
    if result.state is not None and result.topic_id is not None:
        message = _partition_state(result.name, result.topic_id, result.partition, result.state)
    else:
        message = pb.PartitionState(topic=result.name, partition=result.partition)
        if result.topic_id is not None:  # a broker matches a refusal to its change by id
            message.topic_id = result.topic_id.bytes
    message.error_code = result.error.code
    message.error_message = result.message
    return message


def _resource(resource: pb.ConfigResource) -> tuple[ConfigResourceType, str]:
    try:
        kind = ConfigResourceType(resource.resource_type)
    except ValueError as error:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST, f"unknown resource type {resource.resource_type}"
        ) from error
    name = resource.resource_name
    if kind is ConfigResourceType.BROKER and name:
        if not (name.isascii() and name.isdigit() and int(name) < 2**31):
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"a broker resource is named by a broker id, or '' for the cluster-wide "
                f"default: {name!r}",
            )
        name = str(int(name))  # "007" is broker 7's
    if kind is ConfigResourceType.GROUP and not name:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "a group resource needs the group id")
    if kind is ConfigResourceType.CLIENT_METRICS and not name:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Subscription name can't be empty")
    return kind, name


def _alter_op(value: int) -> configs.AlterOp:
    try:
        return configs.AlterOp(value)
    except ValueError as error:
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"unknown config operation {value}") from error


def _config_changes(
    image: MetadataImage,
    request: pb.AlterConfigsResource,
    replace: bool = False,
    group_rules: GroupRules = KAFKA_GROUP_RULES,
) -> tuple[ErrorCode, str, list[MetadataRecord]]:
    """One ConfigRecord per key whose override changes (None: deleted), from the pure
    ``configs.alter_dynamic_configs``; or the resource's error and no records."""
    try:
        kind, name = _resource(request.resource)
        current = dict(image.configs.get((kind, name), {}))
        if kind is ConfigResourceType.TOPIC and image.topic(name) is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
        ops = [(_alter_op(c.op), c.name, c.value) for c in request.configs]
        new = configs.alter_dynamic_configs(
            kind, name, current, ops, replace=replace, group_rules=group_rules
        )
        _check_min_isr_under_elr(image, kind, name, current, new)
    except KafkaError as error:
        return error.error, error.message, []
    records: list[MetadataRecord] = [
        ConfigRecord(kind, name, key, new.get(key))
        for key in sorted(current.keys() | new.keys())
        if current.get(key) != new.get(key)
    ]
    if current.get(MIN_INSYNC_REPLICAS) != new.get(MIN_INSYNC_REPLICAS):
        if kind is ConfigResourceType.TOPIC:
            records += generate_clear_elrs(image, {name})
        elif kind is ConfigResourceType.BROKER:
            records += generate_clear_elrs(image)
    return ErrorCode.NONE, "", records


def _check_min_isr_under_elr(
    image: MetadataImage,
    kind: ConfigResourceType,
    name: str,
    current: dict[str, str],
    new: dict[str, str],
) -> None:
    """With eligible leader replicas on, min.insync.replicas is a topic's or the cluster's,
    never one broker's, and the cluster's may be changed but not removed (Kafka 4.1's
    ``ConfigurationControlManager``): an ELR is chosen against one minimum per topic."""
    if kind is not ConfigResourceType.BROKER or not elr_enabled(image):
        return
    if current.get(MIN_INSYNC_REPLICAS) == new.get(MIN_INSYNC_REPLICAS):
        return
    if name:
        raise KafkaError(
            ErrorCode.INVALID_CONFIG,
            "Broker-level min.insync.replicas cannot be altered while ELR is enabled.",
        )
    if MIN_INSYNC_REPLICAS not in new:
        raise KafkaError(
            ErrorCode.INVALID_CONFIG,
            "Cluster-level min.insync.replicas cannot be removed while ELR is enabled.",
        )


def _describe_configs(
    image: MetadataImage,
    resource: pb.ConfigResource,
    broker_id: int | None,
    group_rules: GroupRules = KAFKA_GROUP_RULES,
) -> list[pb.ConfigEntry]:
    """``broker_id``: the broker that asks; a topic is described as that broker applies it
    (a group with this controller's defaults: the KAFKA listener describes groups itself)."""
    kind, name = _resource(resource)
    if kind is ConfigResourceType.GROUP:
        return group_config_entries(group_rules.describe(image.configs.get((kind, name), {})))
    if kind is ConfigResourceType.CLIENT_METRICS:  # Kafka's: only what the subscription sets
        return [
            pb.ConfigEntry(name=key, value=value, source=pb.CLIENT_METRICS_CONFIG)
            for key, value in sorted(image.configs.get((kind, name), {}).items())
        ]
    if kind is ConfigResourceType.TOPIC:
        if image.topic(name) is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
        rows = configs.describe_topic(image, name, broker_id)
    elif name:
        rows = configs.describe_broker(image, int(name))
    else:
        rows = configs.describe_cluster(image)
    return [
        pb.ConfigEntry(
            name=row.name,
            value=row.value,
            is_default=row.is_default,
            source=pb.ConfigSource.ValueType(row.source),
            synonyms=[
                pb.ConfigSynonym(
                    name=s.name, value=s.value, source=pb.ConfigSource.ValueType(s.source)
                )
                for s in row.synonyms
            ],
        )
        for row in rows
    ]


GROUP_ORIGINS = {
    "group": pb.GROUP_CONFIG,
    "static": pb.STATIC_BROKER_CONFIG,
    "default": pb.DEFAULT_CONFIG,
}


def group_config_entries(rows: list[GroupConfigRow]) -> list[pb.ConfigEntry]:
    """A group's DescribeConfigs rows: its override (GROUP_CONFIG) or the broker's value of
    the config it overrides (STATIC_BROKER_CONFIG, DEFAULT_CONFIG), that synonym listed."""
    out = []
    for row in rows:
        source = GROUP_ORIGINS[row.origin]
        entry = pb.ConfigEntry(
            name=row.name, value=row.value, is_default=row.origin == "default", source=source
        )
        if row.origin == "group":
            entry.synonyms.add(name=row.name, value=row.value, source=source)
        elif row.synonym is not None:
            entry.synonyms.add(name=row.synonym, value=row.value, source=source)
        out.append(entry)
    return out


def serve(
    servicer: ControllerServicer,
    address: str,
    max_workers: int = 32,
    security: ServerSecurity | None = None,
    health: NodeHealth | None = None,
    keepalive: Keepalive = DEFAULT_KEEPALIVE,
    keep_alive_s: float = KEEP_ALIVE_S,
) -> grpc.Server:
    """Start a gRPC server for ControllerService on ``address`` (host:port); with `security`,
    the CONTROLLER listener's TLS and authentication (None: plaintext, every call as the node).
    It serves reflection and ``health`` (the controller's: None, one that says SERVING from the
    start) over ControllerService (and Authentication, with `security`). Calls run on a
    RequestHandlerPool: a thread idle for ``keep_alive_s`` ends (a burst's threads do not stay)."""

    interceptors: list[grpc.ServerInterceptor] = [RichErrors()]
    if security is not None:
        interceptors += security.interceptors()
    server = grpc.server(
        RequestHandlerPool(max_workers, keep_alive_s=keep_alive_s, thread_name_prefix="ctl"),
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),  # a CreateTopics of many
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            *keepalive.options(),
        ],
    )
    pb_grpc.add_ControllerServiceServicer_to_server(servicer, server)
    services = [pb.DESCRIPTOR.services_by_name["ControllerService"].full_name]
    if health is None:
        health = NodeHealth()
        health.set_serving(True)
    if security is None:
        port = server.add_insecure_port(address)
    else:
        port = security.add_port(server, address)
        services.append(AUTHENTICATION_SERVICE)
    add_standard_services(server, services, health)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    return server


def _upgrade_type(value: int) -> UpgradeType:
    """An upgrade type Kafka does not define is UNKNOWN, which the rules refuse."""
    try:
        return UpgradeType(value)
    except ValueError:
        return UpgradeType.UNKNOWN
