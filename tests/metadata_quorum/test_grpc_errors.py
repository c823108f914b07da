"""The rich error model of the gRPC API (metadata_quorum.grpc_errors, docs/api.md "Errors"): the
status code table, and the trailers a failed call carries as another language's client reads
them (``grpc_status.rpc_status.from_call``, which also checks that the google.rpc.Status agrees
with the call's own code and message), through a real in-process server with `RichErrors`."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from dataplane.client._cluster import rpc_error_code
from metadata_quorum.grpc_errors import (
    ERROR_DOMAIN,
    KAFKA_ERROR_CODE_KEY,
    grpc_status_code,
    kafka_error_of,
)
from metadata_quorum.grpc_standard import RichErrors
from raftlog.errors import ErrorCode, KafkaError

HOST = "127.0.0.173"  # this module's in-process server (RANGES: "grpc_product")
S = grpc.StatusCode


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ErrorCode.NOT_LEADER_OR_FOLLOWER, S.UNAVAILABLE),
        (ErrorCode.NOT_CONTROLLER, S.UNAVAILABLE),
        (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, S.UNAVAILABLE),
        (ErrorCode.INVALID_REQUEST, S.INVALID_ARGUMENT),
        (ErrorCode.CORRUPT_MESSAGE, S.INVALID_ARGUMENT),  # retriable in Kafka, still the input's
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, S.NOT_FOUND),
        (ErrorCode.TOPIC_ALREADY_EXISTS, S.ALREADY_EXISTS),
        (ErrorCode.TOPIC_AUTHORIZATION_FAILED, S.PERMISSION_DENIED),
        (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, S.PERMISSION_DENIED),
        (ErrorCode.SASL_AUTHENTICATION_FAILED, S.UNAUTHENTICATED),
        (ErrorCode.REQUEST_TIMED_OUT, S.DEADLINE_EXCEEDED),
        (ErrorCode.RECORD_LIST_TOO_LARGE, S.RESOURCE_EXHAUSTED),
        (ErrorCode.OFFSET_OUT_OF_RANGE, S.OUT_OF_RANGE),
        (ErrorCode.UNSUPPORTED_VERSION, S.UNIMPLEMENTED),
        (ErrorCode.UNKNOWN_SERVER_ERROR, S.INTERNAL),
        (ErrorCode.PRODUCER_FENCED, S.FAILED_PRECONDITION),  # the rule: not retriable
        (ErrorCode.FENCED_LEADER_EPOCH, S.UNAVAILABLE),  # the rule: retriable
    ],
)
def test_status_code_table(error: ErrorCode, status: grpc.StatusCode) -> None:
    assert grpc_status_code(error) is status


def test_no_call_fails_with_none() -> None:
    with pytest.raises(AssertionError):
        grpc_status_code(ErrorCode.NONE)


def _raise(error: ErrorCode) -> Any:
    def behaviour(request: bytes, context: grpc.ServicerContext) -> bytes:
        raise KafkaError(error, "as the test asked")

    return grpc.unary_unary_rpc_method_handler(behaviour)


@pytest.fixture(scope="module")
def channel() -> Iterator[grpc.Channel]:
    handlers = {
        "NotLeader": _raise(ErrorCode.NOT_LEADER_OR_FOLLOWER),
        "Denied": _raise(ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[RichErrors()])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Errors", handlers),))
    port = server.add_insecure_port(f"{HOST}:0")
    server.start()
    try:
        with grpc.insecure_channel(f"{HOST}:{port}") as opened:
            yield opened
    finally:
        server.stop(grace=None)


def _fail(channel: grpc.Channel, method: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as failed:
        channel.unary_unary(f"/t.Errors/{method}")(b"", timeout=10)
    return failed.value


@pytest.mark.parametrize(
    ("method", "error", "status", "retriable"),
    [
        ("NotLeader", ErrorCode.NOT_LEADER_OR_FOLLOWER, S.UNAVAILABLE, "true"),
        ("Denied", ErrorCode.TOPIC_AUTHORIZATION_FAILED, S.PERMISSION_DENIED, "false"),
    ],
)
def test_a_kafka_error_out_of_a_handler_reaches_the_caller_as_a_rich_status(
    channel: grpc.Channel, method: str, error: ErrorCode, status: grpc.StatusCode, retriable: str
) -> None:
    failed = _fail(channel, method)
    assert isinstance(failed, grpc.Call)
    assert failed.code() is status
    assert failed.details() == f"{error.name}: as the test asked"
    rich = rpc_status.from_call(failed)  # raises if code or message disagree with the call's
    assert rich is not None and len(rich.details) == 1
    info = error_details_pb2.ErrorInfo()
    assert rich.details[0].Unpack(info)
    assert (info.reason, info.domain) == (error.name, ERROR_DOMAIN)
    assert dict(info.metadata) == {"kafka_error_code": str(error.code), "retriable": retriable}
    plain = dict(failed.trailing_metadata() or ())
    assert plain[KAFKA_ERROR_CODE_KEY] == str(error.code)
    assert kafka_error_of(failed) is error
    assert rpc_error_code(failed) is error, "our client reads the Kafka error, not the status"


def test_a_request_that_does_not_parse_is_invalid_argument() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[RichErrors()])

    def echo(request: Any, context: grpc.ServicerContext) -> bytes:
        return b"ok"

    handler = grpc.unary_unary_rpc_method_handler(
        echo, request_deserializer=error_details_pb2.ErrorInfo.FromString
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.P", {"E": handler}),))
    port = server.add_insecure_port(f"{HOST}:0")
    server.start()
    try:
        with grpc.insecure_channel(f"{HOST}:{port}") as opened:
            call = opened.unary_unary("/t.P/E")
            assert call(error_details_pb2.ErrorInfo(reason="x").SerializeToString(), timeout=10)
            with pytest.raises(grpc.RpcError) as failed:
                call(b"\x0a\xff\xff", timeout=10)  # field 1, a length past the end
    finally:
        server.stop(grace=None)
    assert isinstance(failed.value, grpc.Call)
    assert failed.value.code() is S.INVALID_ARGUMENT
    assert kafka_error_of(failed.value) is ErrorCode.INVALID_REQUEST
