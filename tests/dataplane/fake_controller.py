"""An in-process fake of ControllerService's admin RPCs over a FakeCluster, for client tests.

Topics it creates appear in the fake brokers' metadata at once (one shared FakeCluster)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc

from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pb_grpc
from protos import metadata_pb2
from raftlog.errors import ErrorCode
from tests.dataplane.fake_broker import FakeCluster, FakePartition

DEFAULT_PARTITIONS = 3


class FakeController(pb_grpc.ControllerServiceServicer):
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.configs: dict[tuple[int, str], dict[str, str]] = {}

    def CreateTopics(
        self, request: pb.CreateTopicsRequest, context: grpc.ServicerContext
    ) -> pb.CreateTopicsResponse:
        results = []
        with self.cluster.lock:
            for topic in request.topics:
                count = DEFAULT_PARTITIONS if topic.num_partitions == -1 else topic.num_partitions
                if topic.name in self.cluster.topics:
                    code = ErrorCode.TOPIC_ALREADY_EXISTS
                elif count <= 0:
                    code = ErrorCode.INVALID_PARTITIONS
                else:
                    code = ErrorCode.NONE
                    if not request.validate_only:
                        self.cluster.create_topic(topic.name, count)
                        self.configs[(metadata_pb2.CONFIG_RESOURCE_TOPIC, topic.name)] = dict(
                            topic.configs
                        )
                results.append(
                    pb.CreatableTopicResult(
                        name=topic.name, error_code=code.code, num_partitions=count
                    )
                )
        return pb.CreateTopicsResponse(status=pb.Status(), topics=results)

    def DeleteTopics(
        self, request: pb.DeleteTopicsRequest, context: grpc.ServicerContext
    ) -> pb.DeleteTopicsResponse:
        results = []
        with self.cluster.lock:
            for name in request.names:
                found = self.cluster.topics.pop(name, None) is not None
                code = ErrorCode.NONE if found else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                results.append(pb.DeletableTopicResult(name=name, error_code=code.code))
        return pb.DeleteTopicsResponse(status=pb.Status(), topics=results)

    def CreatePartitions(
        self, request: pb.CreatePartitionsRequest, context: grpc.ServicerContext
    ) -> pb.CreatePartitionsResponse:
        results = []
        with self.cluster.lock:
            for topic in request.topics:
                partitions = self.cluster.topics.get(topic.name)
                if partitions is None:
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif topic.count <= len(partitions):
                    code = ErrorCode.INVALID_PARTITIONS
                else:
                    code = ErrorCode.NONE
                    leader = min(self.cluster.brokers)
                    partitions.extend(
                        FakePartition(leader=leader) for _ in range(topic.count - len(partitions))
                    )
                results.append(pb.TopicResult(name=topic.name, error_code=code.code))
        return pb.CreatePartitionsResponse(status=pb.Status(), topics=results)

    def DescribeTopics(
        self, request: pb.DescribeTopicsRequest, context: grpc.ServicerContext
    ) -> pb.DescribeTopicsResponse:
        with self.cluster.lock:
            names = list(request.names) or sorted(self.cluster.topics)
            topics = []
            for name in names:
                partitions = self.cluster.topics.get(name)
                if partitions is None:
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code
                    topics.append(pb.TopicDescription(name=name, error_code=code))
                    continue
                states = [
                    pb.PartitionState(
                        topic=name,
                        partition=i,
                        leader=p.leader,
                        leader_epoch=p.leader_epoch,
                        isr=[p.leader],
                        replicas=[p.leader],
                    )
                    for i, p in enumerate(partitions)
                ]
                configs = self.configs.get((metadata_pb2.CONFIG_RESOURCE_TOPIC, name), {})
                topics.append(
                    pb.TopicDescription(
                        name=name,
                        topic_id=b"id-" + name.encode(),
                        partitions=states,
                        configs=configs,
                    )
                )
        return pb.DescribeTopicsResponse(status=pb.Status(), topics=topics)

    def DescribeCluster(
        self, request: pb.DescribeClusterRequest, context: grpc.ServicerContext
    ) -> pb.DescribeClusterResponse:
        brokers = [
            pb.BrokerDescription(
                broker_id=n,
                endpoints=[
                    metadata_pb2.Endpoint(
                        name="BROKER", host=a.rsplit(":", 1)[0], port=int(a.rsplit(":", 1)[1])
                    )
                ],
                fenced=n == 2,
                broker_epoch=10 + n,
            )
            for n, a in sorted(self.cluster.brokers.items())
        ]
        return pb.DescribeClusterResponse(
            status=pb.Status(), cluster_id="fake-cluster", controller_id=100, brokers=brokers
        )

    def DescribeQuorum(
        self, request: pb.DescribeQuorumRequest, context: grpc.ServicerContext
    ) -> pb.DescribeQuorumResponse:
        voters = [pb.VoterState(node_id=100, address="x:1", match_index=5, lag=0, connected=True)]
        return pb.DescribeQuorumResponse(
            status=pb.Status(),
            leader_id=100,
            term=3,
            commit_index=5,
            has_quorum=True,
            voters=voters,
        )

    def AlterConfigs(
        self, request: pb.AlterConfigsRequest, context: grpc.ServicerContext
    ) -> pb.AlterConfigsResponse:
        results = []
        for item in request.resources:
            key = (item.resource.resource_type, item.resource.resource_name)
            configs = self.configs.setdefault(key, {})
            for entry in item.configs:
                if entry.name == "bogus":
                    results.append(
                        pb.ResourceResult(
                            resource=item.resource,
                            error_code=ErrorCode.INVALID_CONFIG.code,
                            error_message="bogus",
                        )
                    )
                    break
                if entry.op == pb.DELETE:
                    configs.pop(entry.name, None)
                else:
                    configs[entry.name] = entry.value
            else:
                results.append(pb.ResourceResult(resource=item.resource))
        return pb.AlterConfigsResponse(status=pb.Status(), resources=results)

    def DescribeConfigs(
        self, request: pb.DescribeConfigsRequest, context: grpc.ServicerContext
    ) -> pb.DescribeConfigsResponse:
        described = []
        for resource in request.resources:
            configs = self.configs.get((resource.resource_type, resource.resource_name), {})
            entries = [pb.ConfigEntry(name=k, value=v) for k, v in sorted(configs.items())]
            entries.append(pb.ConfigEntry(name="retention.ms", value="604800000", is_default=True))
            described.append(pb.DescribedConfigs(resource=resource, entries=entries))
        return pb.DescribeConfigsResponse(status=pb.Status(), resources=described)

    def ElectLeaders(
        self, request: pb.ElectLeadersRequest, context: grpc.ServicerContext
    ) -> pb.ElectLeadersResponse:
        states = [
            pb.PartitionState(
                topic=tp.topic,
                partition=tp.partition,
                error_code=ErrorCode.ELECTION_NOT_NEEDED.code,
            )
            for tp in request.partitions
        ]
        return pb.ElectLeadersResponse(status=pb.Status(), partitions=states)

    # broker-side RPCs are not what these client tests exercise
    def RegisterBroker(
        self, request: pb.RegisterBrokerRequest, context: grpc.ServicerContext
    ) -> pb.RegisterBrokerResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def BrokerHeartbeat(
        self, request: pb.BrokerHeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.BrokerHeartbeatResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def AlterPartition(
        self, request: pb.AlterPartitionRequest, context: grpc.ServicerContext
    ) -> pb.AlterPartitionResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def AllocateProducerIds(
        self, request: pb.AllocateProducerIdsRequest, context: grpc.ServicerContext
    ) -> pb.AllocateProducerIdsResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def AlterPartitionReassignments(
        self, request: pb.AlterPartitionReassignmentsRequest, context: grpc.ServicerContext
    ) -> pb.AlterPartitionReassignmentsResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def ListPartitionReassignments(
        self, request: pb.ListPartitionReassignmentsRequest, context: grpc.ServicerContext
    ) -> pb.ListPartitionReassignmentsResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def AddRaftVoter(
        self, request: pb.AddRaftVoterRequest, context: grpc.ServicerContext
    ) -> pb.RaftVoterResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def RemoveRaftVoter(
        self, request: pb.RemoveRaftVoterRequest, context: grpc.ServicerContext
    ) -> pb.RaftVoterResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def UnregisterBroker(
        self, request: pb.UnregisterBrokerRequest, context: grpc.ServicerContext
    ) -> pb.UnregisterBrokerResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def CordonBroker(
        self, request: pb.CordonBrokerRequest, context: grpc.ServicerContext
    ) -> pb.CordonBrokerResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def FetchMetadata(
        self, request: pb.FetchMetadataRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.MetadataUpdate]:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    # ACLs and SCRAM credentials: tests/dataplane/test_security_admin_cluster.py uses real nodes
    def CreateAcls(self, request: pb.CreateAclsRequest, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def DeleteAcls(self, request: pb.DeleteAclsRequest, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def DescribeAcls(self, request: pb.DescribeAclsRequest, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def AlterUserScramCredentials(
        self, request: pb.AlterUserScramCredentialsRequest, context: grpc.ServicerContext
    ) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def DescribeUserScramCredentials(
        self, request: pb.DescribeUserScramCredentialsRequest, context: grpc.ServicerContext
    ) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")

    def UpdateFeatures(
        self, request: pb.UpdateFeaturesRequest, context: grpc.ServicerContext
    ) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not faked")
        raise AssertionError("context.abort raises")


@contextmanager
def fake_controller(cluster: FakeCluster) -> Iterator[str]:
    """Serve a FakeController over ``cluster``; yields its address and tells the brokers."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_ControllerServiceServicer_to_server(FakeController(cluster), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    address = f"127.0.0.1:{port}"
    cluster.controller_addresses = (address,)
    try:
        yield address
    finally:
        server.stop(grace=None)
