"""The KAFKA listener's transaction APIs against fake services: every advertised version of each
request is read from Kafka's schema, answered, and the answer encodes in that version and reads
back with what the service said (where each version puts a whole-request error, AddPartitionsToTxn
v4's batch of transactions, DescribeTransactions' start time when none is open)."""

from __future__ import annotations

from typing import Any

import pytest
from kio.serial import entity_reader

from dataplane.kafka import codec as kc
from dataplane.kafka.transactions import KafkaTransactions
from protos import broker_pb2 as pb
from protos import group_pb2 as gpb
from protos import transaction_pb2 as tpb
from raftlog.errors import ErrorCode


class FakeServices:
    """Answers as the coordinators would; remembers the requests."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.add_error = ErrorCode.NONE

    def AddPartitionsToTxn(self, request: tpb.AddPartitionsToTxnRequest, context: Any) -> Any:
        self.requests.append(request)
        if self.add_error is not ErrorCode.NONE:
            return tpb.AddPartitionsToTxnResponse(error_code=self.add_error.code)
        results = [
            tpb.PartitionResult(topic=t.topic, partition=p,
                                error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code
                                if t.topic == "missing" else 0)
            for t in request.topics for p in t.partitions
        ]  # fmt: skip
        return tpb.AddPartitionsToTxnResponse(results=results)

    def AddOffsetsToTxn(self, request: Any, context: Any) -> tpb.AddOffsetsToTxnResponse:
        self.requests.append(request)
        return tpb.AddOffsetsToTxnResponse(error_code=ErrorCode.PRODUCER_FENCED.code)

    def EndTxn(self, request: Any, context: Any) -> tpb.EndTxnResponse:
        self.requests.append(request)
        return tpb.EndTxnResponse(error_code=ErrorCode.CONCURRENT_TRANSACTIONS.code)

    def DescribeTransactions(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        return tpb.DescribeTransactionsResponse(transactions=[
            tpb.TransactionDescription(
                transactional_id="open", state="Ongoing", transaction_timeout_ms=60000,
                transaction_start_ms=1_700_000_000_123, producer_id=7, producer_epoch=2,
                topics=[tpb.TopicPartitions(topic="t", partitions=[0, 2])],
            ),
            tpb.TransactionDescription(
                transactional_id="idle", state="Empty", transaction_timeout_ms=60000,
                transaction_start_ms=-1, producer_id=8, producer_epoch=0,
            ),
            tpb.TransactionDescription(
                transactional_id="nobody", error_code=ErrorCode.TRANSACTIONAL_ID_NOT_FOUND.code,
                transaction_start_ms=-1, producer_id=-1, producer_epoch=-1,
            ),
        ])  # fmt: skip

    def ListTransactions(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        return tpb.ListTransactionsResponse(
            unknown_state_filters=[s for s in request.state_filters if s == "Bogus"],
            transactions=[tpb.ListedTransaction(transactional_id="open", producer_id=7,
                                                state="Ongoing")],
        )  # fmt: skip

    # the group coordinator's and the broker's
    def TxnOffsetCommit(self, request: Any, context: Any) -> gpb.OffsetCommitResponse:
        self.requests.append(request)
        return gpb.OffsetCommitResponse(
            error_code=ErrorCode.ILLEGAL_GENERATION.code,
            topics=[gpb.OffsetCommitTopicResponse(
                name=t.name,
                partitions=[gpb.OffsetCommitPartitionResponse(partition=p.partition)
                            for p in t.partitions],
            ) for t in request.topics],
        )  # fmt: skip

    def DescribeProducers(self, request: Any, context: Any) -> pb.DescribeProducersResponse:
        self.requests.append(request)
        return pb.DescribeProducersResponse(topics=[
            pb.DescribeProducersTopicResponse(name=t.name, partitions=[
                pb.DescribeProducersPartitionResponse(partition=p, active_producers=[
                    pb.ProducerStateEntry(producer_id=7, producer_epoch=2, last_sequence=41,
                                          last_timestamp=1_700_000_000_000, coordinator_epoch=3,
                                          current_txn_start_offset=100),
                ]) for p in t.partitions
            ]) for t in request.topics
        ])  # fmt: skip

    def WriteTxnMarkers(self, request: Any, context: Any) -> pb.WriteTxnMarkersResponse:
        self.requests.append(request)
        return pb.WriteTxnMarkersResponse(markers=[
            pb.TxnMarkerResult(producer_id=m.producer_id, topics=[
                pb.TxnMarkerTopicResult(name=t.name, partitions=[
                    pb.TxnMarkerPartitionResult(partition=p) for p in t.partitions
                ]) for t in m.topics
            ]) for m in request.markers
        ])  # fmt: skip


def serve(api_key: int, version: int, data: dict[str, Any]) -> tuple[FakeServices, Any]:
    """The request ``data`` in ``version``, answered; the fake and the decoded response."""
    fake = FakeServices()
    apis = KafkaTransactions(fake, fake, fake, lambda: None)  # type: ignore[arg-type]
    body = kc.to_entity(kc.request_schema(api_key, version), data)
    request = kc.Request(api_key, version, 1, "test", body)
    frame = kc.encode_response(api_key, version, 1, apis.handlers()[api_key](request))
    schema = kc.response_schema(api_key, version)
    _, header_size = entity_reader(schema.__header_schema__)(frame, kc.SIZE.size)
    response, _ = entity_reader(schema)(frame, kc.SIZE.size + header_size)
    return fake, response


def versions(api_key: int) -> list[int]:
    low, high = kc.SUPPORTED[api_key]
    return list(range(low, high + 1))


@pytest.mark.parametrize("version", versions(kc.API_ADD_PARTITIONS_TO_TXN))
def test_add_partitions_in_every_version(version: int) -> None:
    topics = [{"name": "t", "partitions": [0, 1]}, {"name": "missing", "partitions": [0]}]
    data: dict[str, Any]
    if version >= 4:
        data = {"transactions": [{"transactional_id": "a", "producer_id": 7, "producer_epoch": 2,
                                  "verify_only": True, "topics": topics}]}  # fmt: skip
    else:
        data = {"v3_and_below_transactional_id": "a", "v3_and_below_producer_id": 7,
                "v3_and_below_producer_epoch": 2, "v3_and_below_topics": topics}  # fmt: skip
    fake, response = serve(kc.API_ADD_PARTITIONS_TO_TXN, version, data)
    (sent,) = fake.requests
    assert (sent.transactional_id, sent.producer_id, sent.producer_epoch) == ("a", 7, 2)
    assert sent.verify_only == (version >= 4)
    if version >= 4:
        assert response.error_code == 0
        (result,) = response.results_by_transaction
        assert result.transactional_id == "a"
        by_topic = result.topic_results
    else:
        by_topic = response.results_by_topic_v3_and_below
    codes = {(t.name, p.partition_index): p.partition_error_code
             for t in by_topic for p in t.results_by_partition}  # fmt: skip
    assert codes == {("t", 0): 0, ("t", 1): 0, ("missing", 0): 3}


def test_a_whole_request_error_lands_in_every_partition_before_v4() -> None:
    fake = FakeServices()
    fake.add_error = ErrorCode.NOT_COORDINATOR
    apis = KafkaTransactions(fake, fake, fake, lambda: None)  # type: ignore[arg-type]
    body = kc.to_entity(kc.request_schema(kc.API_ADD_PARTITIONS_TO_TXN, 3), {
        "v3_and_below_transactional_id": "a", "v3_and_below_producer_id": 7,
        "v3_and_below_producer_epoch": 2,
        "v3_and_below_topics": [{"name": "t", "partitions": [0, 1]}],
    })  # fmt: skip
    data = apis.add_partitions_to_txn(kc.Request(kc.API_ADD_PARTITIONS_TO_TXN, 3, 1, "x", body))
    (topic,) = data["results_by_topic_v3_and_below"]
    assert [p["partition_error_code"] for p in topic["results_by_partition"]] == [16, 16]


@pytest.mark.parametrize("version", versions(kc.API_END_TXN))
def test_end_txn_and_add_offsets_carry_the_coordinator_error(version: int) -> None:
    data = {"transactional_id": "a", "producer_id": 7, "producer_epoch": 2, "committed": True}
    fake, response = serve(kc.API_END_TXN, version, data)
    assert fake.requests[0].committed is True
    assert response.error_code == ErrorCode.CONCURRENT_TRANSACTIONS.code
    data = {"transactional_id": "a", "producer_id": 7, "producer_epoch": 2, "group_id": "g"}
    fake, response = serve(kc.API_ADD_OFFSETS_TO_TXN, min(version, 3), data)
    assert fake.requests[0].group_id == "g"
    assert response.error_code == ErrorCode.PRODUCER_FENCED.code


@pytest.mark.parametrize("version", versions(kc.API_TXN_OFFSET_COMMIT))
def test_txn_offset_commit_in_every_version(version: int) -> None:
    data = {
        "transactional_id": "a", "group_id": "g", "producer_id": 7, "producer_epoch": 2,
        "generation_id": 5, "member_id": "m", "group_instance_id": None,
        "topics": [{"name": "t", "partitions": [
            {"partition_index": 0, "committed_offset": 42, "committed_leader_epoch": 1,
             "committed_metadata": "meta"},
        ]}],
    }  # fmt: skip
    fake, response = serve(kc.API_TXN_OFFSET_COMMIT, version, data)
    (sent,) = fake.requests
    assert sent.topics[0].partitions[0].committed_offset == 42
    assert sent.generation_id == (5 if version >= 3 else -1)
    (topic,) = response.topics
    assert [p.error_code for p in topic.partitions] == [ErrorCode.ILLEGAL_GENERATION.code]


def test_describe_transactions_answers_minus_one_when_none_is_open() -> None:
    """Kafka sends -1 as the start time of no transaction (its Admin reads it as empty); kio's
    reader refuses a negative timestamp, so the answer is checked as the entity it encodes."""
    fake = FakeServices()
    apis = KafkaTransactions(fake, fake, fake, lambda: None)  # type: ignore[arg-type]
    schema = kc.request_schema(kc.API_DESCRIBE_TRANSACTIONS, 0)
    body = kc.to_entity(schema, {"transactional_ids": ["open", "idle", "nobody"]})
    request = kc.Request(kc.API_DESCRIBE_TRANSACTIONS, 0, 1, "test", body)
    data = apis.describe_transactions(request)
    kc.encode_response(kc.API_DESCRIBE_TRANSACTIONS, 0, 1, data)  # it encodes
    response = kc.to_entity(kc.response_schema(kc.API_DESCRIBE_TRANSACTIONS, 0), data)
    by_id = {t.transactional_id: t for t in response.transaction_states}
    assert by_id["open"].transaction_state == "Ongoing"
    assert round(by_id["open"].transaction_start_time.timestamp() * 1000) == 1_700_000_000_123
    assert [(t.topic, list(t.partitions)) for t in by_id["open"].topics] == [("t", [0, 2])]
    assert round(by_id["idle"].transaction_start_time.timestamp() * 1000) == -1
    assert by_id["nobody"].error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND.code


@pytest.mark.parametrize("version", versions(kc.API_LIST_TRANSACTIONS))
def test_list_transactions_names_unknown_state_filters(version: int) -> None:
    data = {"state_filters": ["Ongoing", "Bogus"], "producer_id_filters": [7],
            "duration_filter": 5000}  # fmt: skip
    fake, response = serve(kc.API_LIST_TRANSACTIONS, version, data)
    (sent,) = fake.requests
    assert list(sent.producer_id_filters) == [7]
    assert sent.duration_filter_ms == (5000 if version >= 1 else 0)
    assert list(response.unknown_state_filters) == ["Bogus"]
    assert [(t.transactional_id, t.transaction_state) for t in response.transaction_states] == [
        ("open", "Ongoing")
    ]


def test_describe_producers_and_write_txn_markers_reach_the_broker() -> None:
    _, response = serve(kc.API_DESCRIBE_PRODUCERS, 0,
                        {"topics": [{"name": "t", "partition_indexes": [0, 1]}]})  # fmt: skip
    (topic,) = response.topics
    states = [(p.partition_index, s.producer_id, s.current_txn_start_offset)
              for p in topic.partitions for s in p.active_producers]  # fmt: skip
    assert states == [(0, 7, 100), (1, 7, 100)]
    for version in versions(kc.API_WRITE_TXN_MARKERS):
        marker = {
            "producer_id": 7,
            "producer_epoch": 2,
            "transaction_result": True,
            "coordinator_epoch": 3,
            "topics": [{"name": "t", "partition_indexes": [1]}],
        }
        fake, response = serve(kc.API_WRITE_TXN_MARKERS, version, {"markers": [marker]})
        assert fake.requests[0].markers[0].committed is True
        (result,) = response.markers
        assert [(t.name, [p.partition_index for p in t.partitions]) for t in result.topics] == [
            ("t", [1])
        ]
