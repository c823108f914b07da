"""How a Kafka error that fails a whole gRPC call travels, so that any language can read it.

Errors of one partition, topic or member stay values inside the response (``error_code`` and
``error_message`` per item: Kafka's error model, docs/api.md "Errors"). An error of the call as a
whole ends the call with a non-OK status that carries, beside the message:

- the trailer ``grpc-status-details-bin``: a ``google.rpc.Status`` (code and message equal to the
  call's) whose one detail is a ``google.rpc.ErrorInfo`` with ``reason`` = Kafka's error name
  (``NOT_LEADER_OR_FOLLOWER``), ``domain`` = ``raftlog`` and ``metadata`` = {"kafka_error_code":
  "6", "retriable": "true"}: what gRPC's richer error model gives every language
  (``grpcio-status``, ``status.FromError`` in Go, ``StatusProto.fromThrowable`` in Java);
- the plain trailer ``raftlog-kafka-error-code`` (the decimal code), for clients without it.

The gRPC status code follows `grpc_status_code`: one table, the manual's. This is the one place
where Kafka errors meet gRPC status codes, on both sides of a call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from raftlog.errors import ErrorCode, KafkaError

ERROR_DOMAIN = "raftlog"
KAFKA_ERROR_CODE_KEY = "raftlog-kafka-error-code"
STATUS_DETAILS_KEY = "grpc-status-details-bin"  # gRPC's own key for a google.rpc.Status
_S = grpc.StatusCode

# Errors whose gRPC code is not the rule's (retriable: UNAVAILABLE; else FAILED_PRECONDITION).
GRPC_STATUS_CODES: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.UNKNOWN_SERVER_ERROR: _S.INTERNAL,
    ErrorCode.REQUEST_TIMED_OUT: _S.DEADLINE_EXCEEDED,
    ErrorCode.OFFSET_OUT_OF_RANGE: _S.OUT_OF_RANGE,
    # the request itself is wrong: sending it again cannot help
    ErrorCode.INVALID_REQUEST: _S.INVALID_ARGUMENT,
    ErrorCode.CORRUPT_MESSAGE: _S.INVALID_ARGUMENT,
    ErrorCode.INVALID_RECORD: _S.INVALID_ARGUMENT,
    ErrorCode.INVALID_TOPIC_EXCEPTION: _S.INVALID_ARGUMENT,
    ErrorCode.INVALID_REQUIRED_ACKS: _S.INVALID_ARGUMENT,
    ErrorCode.INVALID_FETCH_SIZE: _S.INVALID_ARGUMENT,
    ErrorCode.INVALID_TIMESTAMP: _S.INVALID_ARGUMENT,
    ErrorCode.INVALID_PARTITIONS: _S.INVALID_ARGUMENT,
    ErrorCode.INVALID_REPLICATION_FACTOR: _S.INVALID_ARGUMENT,
    ErrorCode.INVALID_REPLICA_ASSIGNMENT: _S.INVALID_ARGUMENT,
    ErrorCode.INVALID_CONFIG: _S.INVALID_ARGUMENT,
    ErrorCode.INVALID_GROUP_ID: _S.INVALID_ARGUMENT,
    ErrorCode.INVALID_SESSION_TIMEOUT: _S.INVALID_ARGUMENT,
    ErrorCode.INVALID_TRANSACTION_TIMEOUT: _S.INVALID_ARGUMENT,
    ErrorCode.INVALID_REGULAR_EXPRESSION: _S.INVALID_ARGUMENT,
    ErrorCode.POLICY_VIOLATION: _S.INVALID_ARGUMENT,
    # what the request names does not exist
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: _S.NOT_FOUND,
    ErrorCode.UNKNOWN_TOPIC_ID: _S.NOT_FOUND,
    ErrorCode.GROUP_ID_NOT_FOUND: _S.NOT_FOUND,
    ErrorCode.RESOURCE_NOT_FOUND: _S.NOT_FOUND,
    ErrorCode.TRANSACTIONAL_ID_NOT_FOUND: _S.NOT_FOUND,
    ErrorCode.BROKER_ID_NOT_REGISTERED: _S.NOT_FOUND,
    ErrorCode.VOTER_NOT_FOUND: _S.NOT_FOUND,
    ErrorCode.LOG_DIR_NOT_FOUND: _S.NOT_FOUND,
    # it does exist already
    ErrorCode.TOPIC_ALREADY_EXISTS: _S.ALREADY_EXISTS,
    ErrorCode.DUPLICATE_RESOURCE: _S.ALREADY_EXISTS,
    ErrorCode.DUPLICATE_BROKER_REGISTRATION: _S.ALREADY_EXISTS,
    ErrorCode.DUPLICATE_VOTER: _S.ALREADY_EXISTS,
    # who asks may not
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: _S.PERMISSION_DENIED,
    ErrorCode.GROUP_AUTHORIZATION_FAILED: _S.PERMISSION_DENIED,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: _S.PERMISSION_DENIED,
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: _S.PERMISSION_DENIED,
    # who asks is not known
    ErrorCode.SASL_AUTHENTICATION_FAILED: _S.UNAUTHENTICATED,
    ErrorCode.UNSUPPORTED_SASL_MECHANISM: _S.UNAUTHENTICATED,
    ErrorCode.ILLEGAL_SASL_STATE: _S.UNAUTHENTICATED,
    # sizes and quotas
    ErrorCode.MESSAGE_TOO_LARGE: _S.RESOURCE_EXHAUSTED,
    ErrorCode.RECORD_LIST_TOO_LARGE: _S.RESOURCE_EXHAUSTED,
    ErrorCode.OFFSET_METADATA_TOO_LARGE: _S.RESOURCE_EXHAUSTED,
    ErrorCode.GROUP_MAX_SIZE_REACHED: _S.RESOURCE_EXHAUSTED,
    ErrorCode.SHARE_SESSION_LIMIT_REACHED: _S.RESOURCE_EXHAUSTED,
    # this server does not do it
    ErrorCode.UNSUPPORTED_VERSION: _S.UNIMPLEMENTED,
    ErrorCode.UNSUPPORTED_COMPRESSION_TYPE: _S.UNIMPLEMENTED,
    ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT: _S.UNIMPLEMENTED,
    ErrorCode.UNSUPPORTED_ASSIGNOR: _S.UNIMPLEMENTED,
    ErrorCode.UNSUPPORTED_ENDPOINT_TYPE: _S.UNIMPLEMENTED,
    ErrorCode.SECURITY_DISABLED: _S.UNIMPLEMENTED,
}


def grpc_status_code(error: ErrorCode) -> grpc.StatusCode:
    """The gRPC status code of a call that fails with ``error``: the table, else UNAVAILABLE for
    a retriable error (the caller should try again, maybe elsewhere: a leadership that moved, a
    coordinator loading) and FAILED_PRECONDITION for the rest (the state forbids it: a fenced
    epoch, a rebalance, a transaction in the wrong state)."""
    if error is ErrorCode.NONE:
        raise AssertionError("a call fails with an error, never with NONE")
    code = GRPC_STATUS_CODES.get(error)
    if code is not None:
        return code
    return _S.UNAVAILABLE if error.retriable else _S.FAILED_PRECONDITION


def error_info(error: ErrorCode) -> error_details_pb2.ErrorInfo:
    return error_details_pb2.ErrorInfo(
        reason=error.name,
        domain=ERROR_DOMAIN,
        metadata={
            "kafka_error_code": str(error.code),
            "retriable": "true" if error.retriable else "false",
        },
    )


def rich_status(error: KafkaError, code: grpc.StatusCode | None = None) -> grpc.Status:
    """The status a call failing with ``error`` ends with (``code``: instead of the table's,
    where gRPC's own meaning decides, e.g. a passed deadline)."""
    code = grpc_status_code(error.error) if code is None else code
    detail = any_pb2.Any()
    detail.Pack(error_info(error.error))
    status = status_pb2.Status(
        code=code.value[0], message=f"{error.error.name}: {error.message}", details=[detail]
    )
    converted = rpc_status.to_status(status)
    return _Status(
        converted.code,
        converted.details,
        (*converted.trailing_metadata, (KAFKA_ERROR_CODE_KEY, str(error.error.code))),
    )


class _Status(grpc.Status):  # type: ignore[misc]
    def __init__(
        self, code: grpc.StatusCode, details: str, trailing_metadata: tuple[Any, ...]
    ) -> None:
        self.code = code
        self.details = details
        self.trailing_metadata = trailing_metadata


def abort(
    context: grpc.ServicerContext, error: KafkaError, code: grpc.StatusCode | None = None
) -> NoReturn:
    """End the call with ``error``'s rich status (grpc raises out of here)."""
    context.abort_with_status(rich_status(error, code))
    raise AssertionError("grpc's abort_with_status returned")


def kafka_error_of(error: grpc.RpcError) -> ErrorCode | None:
    """The Kafka error a failed call's trailers carry (the ErrorInfo, else the plain key), or
    None when it carries none (the call failed in gRPC itself: no connection, a deadline, a
    message over the size limit)."""
    if not isinstance(error, grpc.Call):
        return None
    trailers: Iterable[tuple[str, Any]] = error.trailing_metadata() or ()
    plain = None
    for key, value in trailers:
        if key == STATUS_DETAILS_KEY:
            found = _from_status_details(bytes(value))
            if found is not None:
                return found
        elif key == KAFKA_ERROR_CODE_KEY:
            text = value if isinstance(value, str) else bytes(value).decode()
            plain = ErrorCode.from_code(int(text)) if text.lstrip("-").isdigit() else None
    return plain


def _from_status_details(data: bytes) -> ErrorCode | None:
    status = status_pb2.Status.FromString(data)
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == ERROR_DOMAIN and info.reason in ErrorCode.__members__:
                return ErrorCode[info.reason]
    return None
