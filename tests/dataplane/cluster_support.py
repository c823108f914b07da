"""Real 3-node clusters (combined controller + broker processes) for data-plane tests.

Each test module takes its own loopback range (see ``RANGES``) and ephemeral ports, so modules
run in parallel without colliding. Every process is stopped by its pid in the fixture's
``finally``. The raw-RPC helpers here speak BrokerService directly (what a client library does),
so broker behaviour is tested independently of ``dataplane.client``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from dataplane.client import AdminClient, Consumer, NewTopic, Producer
from dataplane.tools.local_cluster import LocalCluster, pick_cluster_port, wait_for
from protos import CHANNEL_OPTIONS
from protos import broker_pb2 as pb
from protos import broker_pb2_grpc as pb_grpc
from raftlog.records import Record, encode_batch, iter_records

# first host of each module's cluster: 127.0.0.N .. N+2
RANGES = {
    "roundtrip": 81,
    "restart": 84,
    "divergence": 87,
    "isr": 91,
    "bad_input": 94,
    "cli": 97,
    # also test_client_long_tail.py's and test_share_consumer.py's (the same xdist group, in turn)
    "client": 101,
    "page_cache": 104,
    "spark": 111,
    "spark_stream": 114,
    "spark_pipeline": 117,
    "spark_eos": 34,  # tests/spark/test_exactly_once.py: 34-36
    "idempotence": 121,
    "groups": 124,
    "groups_failover": 127,
    # tests/dataplane/broker/test_disk_full.py: 164-166; tests/metadata_quorum/
    # test_quorum_disk_full.py's too (the same xdist group, in turn)
    "disk_full": 164,
    # test_protocol.py, test_kafka_admin_extras.py, test_kafka_quorum_and_group_configs.py,
    # test_feature_levels.py (one node, 171)
    "kafka": 171,  # (one xdist group, one module after the other)
    # also test_static_membership.py's, test_share_groups.py's and test_share_membership.py's
    # (the same xdist group, in turn)
    "kafka_groups": 174,
    "auto_create": 18,  # tests/dataplane/kafka/test_auto_create.py: 18-20
    # tests/dataplane/kafka/test_transactions_kafka.py: 31-33; test_fetch_sessions.py's too (the
    # same xdist group, in turn)
    "kafka_txn": 31,
    "kafka_security": 27,  # tests/dataplane/kafka/test_kafka_security.py: 27-29 (SASL_SSL)
    "kafka_security_mtls": 41,  # the same module's one-node SSL (mTLS) cluster: 41
    "connect": 181,
    "connect_distributed": 184,
    "mirror_source": 191,
    "mirror_target": 194,
    # tests/connect/test_mirror_exactly_once.py: 37-39 and 44-46, its mirror process on .40
    "mirror_eos_source": 37,
    "mirror_eos_target": 44,
    "orphans": 211,  # tests/dataplane/tools/test_orphans.py (its child pytest sessions)
    "reassignment": 231,  # four nodes: 231-234
    "follower_sessions": 235,  # tests/dataplane/broker/test_follower_sessions.py: in process
    "throttle": 224,  # tests/dataplane/broker/test_throttle_cluster.py: four nodes, 224-227
    "elastic_brokers": 246,  # tests/dataplane/broker/test_elastic_brokers.py: up to five, 246-250
    "failover_fencing": 228,  # tests/dataplane/server/test_failover_fencing.py: 228-230
    "transactions": 204,  # tests/dataplane/coordinator/test_transactions_cluster.py: 204-206
    "transactions_failover": 207,  # .../coordinator/test_transactions_failover.py: 207-209
    # tests/dataplane/broker/test_transactions_cluster.py: 201-203; test_delete_records.py, in
    # turn with it (one xdist group): 201-202
    "transactions_broker": 201,
    # tests/dataplane/kafka/test_kafka_configs.py: 221-223; test_newcomer_clients.py's and
    # test_kafkajs.py's too (the same xdist group, in turn)
    "kafka_configs": 221,
    "txn_offsets": 214,  # tests/dataplane/coordinator/test_txn_offsets_cluster.py: 214-216
    "txn_client": 217,  # tests/dataplane/client/test_transactions_cluster.py: 217-219
    # tests/dataplane/server/test_bootstrap_servers.py: three nodes and a fourth, 242-245
    "bootstrap_servers": 242,
    # tests/dataplane/kafka/test_security_admin.py: 107-109 (110 also H3's, unused)
    "security_admin": 107,
    # tests/dataplane/server/test_rogue_node.py: 146-148, its rogue controller on 149; 150 is
    # tests/dataplane/broker/test_metrics_server.py's in-process server
    "rogue_node": 146,
    # tests/dataplane/kafka/test_authorization_kafka.py: one node, 167 (169-170 H4's spare)
    "kafka_authorization": 167,
    # tests/dataplane/kafka/test_kafka_acls.py: the secure cluster 138-140, the mTLS node 168
    "kafka_acls": 138,
    "kafka_acls_mtls": 168,
    # tests/dataplane/server/test_secure_grpc.py: 6-8 (9 and 10 are tests/metadata_quorum/
    # security/test_node_cert.py's and test_grpc_auth.py's in-process servers)
    "secure_grpc": 6,
    # tests/dataplane/kafka/test_connection_limits_cluster.py: one node, 141; its flooding
    # clients bind 142 and 143 as their source addresses. 141-145 are the raft tests' too
    # (tests/metadata_quorum/raft_node.py HOSTS): it joins their xdist group "raft", in turn
    "limits": 141,
    "secure_cluster": 189,  # tests/dataplane/tools/test_secure_cluster.py: two nodes, 189-190
    "spark_secure": 160,  # tests/spark/test_spark_secure.py: two nodes, 160-161
    # tests/bench/test_soak.py: 67-69, the mirror's REST API on 70 (make soak's own addresses:
    # a soak run and the suite do not run at once)
    "soak": 67,
    # tests/dataplane/server/test_grpc_product.py: 171-172 (a controller+broker and a broker),
    # 173 tests/metadata_quorum/test_grpc_errors.py's and that module's in-process servers.
    # The brief of issue 31 gave 171-179, which "kafka" (171-173), "kafka_groups" (174-176)
    # and tests/chaos/test_chaos_transactions.py (177-180) also use: distinct ports keep them
    # apart (pick_cluster_port), but they are not a range of their own
    "grpc_product": 171,
    # tests/dataplane/server/test_node_grpc_client.py: 231-233, the range issue 31's brief gave;
    # "reassignment" (231-234) uses it too: distinct ports (pick_cluster_port) keep the two apart
    "grpc_node": 231,
    # tests/dataplane/server/test_controller_health.py: 171-173 (a controller's health when
    # the other two voters are paused), in test_grpc_product's xdist group, one module after the
    # other (127.0.0.151-159 are the chaos network tests', whose iptables rules name addresses)
    "controller_health": 171,
    # tests/dataplane/console/test_console_browser.py: one node, 163 (the brief named
    # 159, which is tests/chaos/test_network.py's third slot, 157-159)
    "console": 163,
    # tests/dataplane/schema_registry/test_registry_cluster.py: 174-176, "kafka_groups"'s range
    # (no iptables there; distinct ports keep the two apart, pick_cluster_port)
    "schema_registry": 174,
    # tests/bench/test_metadata_scale.py: 14-16 (bench/metadata_scale.py in miniature; the
    # benchmark itself runs on the local cluster's 11-13)
    "metadata_scale": 14,
    # 127.0.0.251-254 are tests/metadata_quorum/test_raft_secret.py's (three voters, an outsider)
    # and bench/security_bench.py's (benchmarks run alone; 189-190 are its too)
    # 127.0.0.236-241 are tests/metadata_quorum/test_controller_membership.py's too: distinct
    # ports keep them apart (pick_cluster_port)
    # tests/dataplane/server/test_fetch_stream_cluster.py: 236-237 (xdist group "grpc-stream",
    # with tests/dataplane/broker/test_fetch_stream.py's in-process server on 238); 239-241 are
    # bench/fetch_stream_bench.py's (benchmarks run alone)
    "grpc_stream": 236,
    # 127.0.0.131-133 and 137 (a membership fault's new controller) are tests/chaos/
    # test_chaos_run.py's, test_voter_changes.py's, test_power_loss_fault.py's and
    # test_elr_power_loss.py's (one xdist group); 134-135 test_faults.py's
    # 127.0.0.47-49 are bench/txn_bench.py's (tests/bench/test_txn_bench.py runs it in miniature)
    # 127.0.0.24 is tests/metadata_quorum/test_raft_power_loss.py's (one in-process voter)
    # 127.0.0.177-179 (and 180 for its port pick) are tests/chaos/test_chaos_transactions.py's
    # 127.0.0.198-200 and 210 (a membership fault's new controller) are tests/chaos/
    # test_chaos_secure.py's
}


@contextmanager
def running_cluster(
    root: Path,
    name: str,
    overrides: dict[str, str | int] | None = None,
    nodes: int = 3,
    controllers: int | None = None,
    secure: bool = False,
    node_overrides: dict[int, dict[str, str | int]] | None = None,
) -> Iterator[LocalCluster]:
    """``nodes`` nodes on the module's range, the first ``controllers`` (default all) voting;
    ``secure``: TLS, SCRAM, ACLs (``cluster.admin_security``, ``cluster.client_settings``);
    ``node_overrides``: one node's settings (by node id), e.g. its ``broker.rack``."""
    first_host = RANGES[name]
    hosts = [f"127.0.0.{first_host + n}" for n in range(nodes)]
    cluster = LocalCluster(
        root, nodes=nodes, first_host=first_host, port=pick_cluster_port(hosts),
        overrides=overrides or {}, controllers=controllers, secure=secure,
        node_overrides=node_overrides,
    )  # fmt: skip
    try:
        cluster.up()
        yield cluster
    except BaseException:
        for spec in cluster.specs:
            log_path = spec.log_path
            if log_path.exists():
                print(f"---- {log_path}\n{log_path.read_text()[-4000:]}")
        raise
    finally:
        for spec in cluster.specs:
            cluster.signal_node(spec.node_id, 18)  # SIGCONT: a paused node must die too
        cluster.down()


def create_topic(
    cluster: LocalCluster,
    name: str,
    partitions: int,
    rf: int = 3,
    configs: dict[str, str] | None = None,
) -> dict[int, pb.PartitionMetadata]:
    """Create a topic with the AdminClient; wait until every live broker serves its leaders
    (so even an acks=0 write, never retried, finds its leader). The leaders, by partition."""
    admin = AdminClient(cluster.bootstrap_servers)
    try:
        errors = admin.create_topics([NewTopic(name, partitions, rf, configs or {})])
        assert errors[name] is None, errors[name]
    finally:
        admin.close()
    return wait_for_leaders(cluster, name, partitions)


def metadata(cluster: LocalCluster, node_id: int, topic: str) -> pb.TopicMetadata | None:
    try:
        response = stub(cluster.broker_address(node_id)).Metadata(
            pb.MetadataRequest(topics=[topic]), timeout=2
        )
    except grpc.RpcError:
        return None
    return response.topics[0] if response.topics else None


def wait_for_leaders(
    cluster: LocalCluster, topic: str, partitions: int, timeout_s: float = 30.0
) -> dict[int, pb.PartitionMetadata]:
    """Wait until every live broker's metadata shows a leader for every partition."""

    def probe() -> dict[int, pb.PartitionMetadata] | None:
        seen: dict[int, pb.PartitionMetadata] | None = None
        for spec in cluster.specs:
            if cluster.pid(spec.node_id) is None:
                continue
            described = metadata(cluster, spec.node_id, topic)
            if described is None or described.error_code or len(described.partitions) != partitions:
                return None
            if any(p.leader_id < 0 for p in described.partitions):
                return None
            seen = {p.partition: p for p in described.partitions}
        return seen

    return wait_for(f"leaders of {topic}", probe, timeout_s)


_CHANNELS: dict[str, grpc.Channel] = {}


def stub(address: str) -> pb_grpc.BrokerServiceStub:
    """A stub on one cached channel per address, with the client's channel options and so its
    reconnect backoff: with gRPC's own (1 s, growing to 120 s) a channel to a broker killed and
    restarted failed every call without trying for seconds, and a test missed the whole window
    in which the restarted broker refused clients while catching up (a CI failure)."""
    channel = _CHANNELS.get(address)
    if channel is None:
        channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        _CHANNELS[address] = channel
    return pb_grpc.BrokerServiceStub(channel)


def produce(
    address: str,
    topic: str,
    partition: int,
    records: bytes,
    acks: int = -1,
    timeout_ms: int = 10_000,
) -> pb.ProducePartitionResponse:
    response = stub(address).Produce(
        pb.ProduceRequest(
            acks=acks,
            timeout_ms=timeout_ms,
            topics=[
                pb.ProduceTopic(
                    name=topic,
                    partitions=[pb.ProducePartition(partition=partition, records=records)],
                )
            ],
        ),
        timeout=timeout_ms / 1000 + 5,
    )
    if acks == 0:
        return pb.ProducePartitionResponse()
    result: pb.ProducePartitionResponse = response.topics[0].partitions[0]
    return result


def fetch(
    address: str, topic: str, partition: int, offset: int, max_wait_ms: int = 0, **kwargs: Any
) -> pb.FetchPartitionResponse:
    response = stub(address).Fetch(
        pb.FetchRequest(
            replica_id=-1,
            max_wait_ms=max_wait_ms,
            min_bytes=kwargs.pop("min_bytes", 1),
            max_bytes=kwargs.pop("max_bytes", 50 * 1024 * 1024),
            topics=[
                pb.FetchTopic(
                    name=topic,
                    partitions=[
                        pb.FetchPartition(
                            partition=partition,
                            fetch_offset=offset,
                            current_leader_epoch=kwargs.pop("leader_epoch", -1),
                            partition_max_bytes=kwargs.pop("partition_max_bytes", 1024 * 1024),
                        )
                    ],
                )
            ],
        ),
        timeout=max_wait_ms / 1000 + 10,
    )
    result: pb.FetchPartitionResponse = response.topics[0].partitions[0]
    return result


def read_all(address: str, topic: str, partition: int, end_offset: int) -> list[Record]:
    """Every record below ``end_offset`` from the leader at ``address``."""
    records: list[Record] = []
    offset = 0
    while offset < end_offset:
        answer = fetch(address, topic, partition, offset, max_wait_ms=200)
        assert answer.error_code == 0, f"fetch {topic}-{partition}@{offset}: {answer.error_message}"
        batch = [r for r in iter_records(answer.records) if r.offset >= offset]
        if batch:
            records += batch
            offset = batch[-1].offset + 1
    return records


def values_batch(values: list[bytes], timestamp_ms: int | None = None, **kwargs: Any) -> bytes:
    now_ms = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
    return encode_batch([(None, v, now_ms, ()) for v in values], **kwargs)


def produce_numbers(cluster: LocalCluster, topic: str, start: int, count: int) -> None:
    """Records ``start .. start+count-1``, each its number as key and value (acks=all)."""
    with Producer(cluster.bootstrap_servers) as producer:
        for n in range(start, start + count):
            producer.send(topic, key=str(n).encode(), value=str(n).encode())
        producer.flush()


def consume_values(consumer: Consumer, count: int, timeout_s: float = 60) -> list[str]:
    """Poll until ``count`` record values arrived (decoded), within ``timeout_s``."""
    values: list[str] = []
    deadline = time.monotonic() + timeout_s
    while len(values) < count:
        assert time.monotonic() < deadline, f"got {len(values)} of {count}"
        for records in consumer.poll(timeout_ms=200).values():
            values += [(r.value or b"").decode() for r in records]
    return values
