"""Kafka's error codes, as values, and the one exception family that carries them.

Expected errors are values with Kafka's numeric code and a ``retriable`` flag (see
``org.apache.kafka.common.protocol.Errors``). Code that hits one raises :class:`KafkaError`
carrying the :class:`ErrorCode`; servers turn it into a per-partition error in a response.
A broken invariant is not a Kafka error: it is an ``AssertionError`` naming the invariant.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """Kafka's error codes: ``(code, retriable)``; the member name is Kafka's name."""

    UNKNOWN_SERVER_ERROR = (-1, False)
    NONE = (0, False)
    OFFSET_OUT_OF_RANGE = (1, False)
    CORRUPT_MESSAGE = (2, True)
    UNKNOWN_TOPIC_OR_PARTITION = (3, True)
    INVALID_FETCH_SIZE = (4, False)
    LEADER_NOT_AVAILABLE = (5, True)
    NOT_LEADER_OR_FOLLOWER = (6, True)
    REQUEST_TIMED_OUT = (7, True)
    BROKER_NOT_AVAILABLE = (8, False)
    REPLICA_NOT_AVAILABLE = (9, True)
    MESSAGE_TOO_LARGE = (10, False)
    OFFSET_METADATA_TOO_LARGE = (12, False)
    NETWORK_EXCEPTION = (13, True)
    COORDINATOR_LOAD_IN_PROGRESS = (14, True)
    COORDINATOR_NOT_AVAILABLE = (15, True)
    NOT_COORDINATOR = (16, True)
    INVALID_TOPIC_EXCEPTION = (17, False)
    RECORD_LIST_TOO_LARGE = (18, False)
    NOT_ENOUGH_REPLICAS = (19, True)
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = (20, True)
    INVALID_REQUIRED_ACKS = (21, False)
    ILLEGAL_GENERATION = (22, False)
    INCONSISTENT_GROUP_PROTOCOL = (23, False)
    INVALID_GROUP_ID = (24, False)
    UNKNOWN_MEMBER_ID = (25, False)
    INVALID_SESSION_TIMEOUT = (26, False)
    REBALANCE_IN_PROGRESS = (27, False)
    TOPIC_AUTHORIZATION_FAILED = (29, False)
    GROUP_AUTHORIZATION_FAILED = (30, False)
    CLUSTER_AUTHORIZATION_FAILED = (31, False)
    INVALID_TIMESTAMP = (32, False)
    UNSUPPORTED_SASL_MECHANISM = (33, False)
    ILLEGAL_SASL_STATE = (34, False)
    UNSUPPORTED_VERSION = (35, False)
    TOPIC_ALREADY_EXISTS = (36, False)
    INVALID_PARTITIONS = (37, False)
    INVALID_REPLICATION_FACTOR = (38, False)
    INVALID_REPLICA_ASSIGNMENT = (39, False)
    INVALID_CONFIG = (40, False)
    NOT_CONTROLLER = (41, True)
    INVALID_REQUEST = (42, False)
    UNSUPPORTED_FOR_MESSAGE_FORMAT = (43, False)
    POLICY_VIOLATION = (44, False)
    OUT_OF_ORDER_SEQUENCE_NUMBER = (45, False)
    DUPLICATE_SEQUENCE_NUMBER = (46, False)
    INVALID_PRODUCER_EPOCH = (47, False)
    INVALID_TXN_STATE = (48, False)
    INVALID_PRODUCER_ID_MAPPING = (49, False)
    INVALID_TRANSACTION_TIMEOUT = (50, False)
    CONCURRENT_TRANSACTIONS = (51, True)
    TRANSACTION_COORDINATOR_FENCED = (52, False)
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = (53, False)
    SECURITY_DISABLED = (54, False)
    OPERATION_NOT_ATTEMPTED = (55, False)
    KAFKA_STORAGE_ERROR = (56, True)
    LOG_DIR_NOT_FOUND = (57, False)
    SASL_AUTHENTICATION_FAILED = (58, False)
    REASSIGNMENT_IN_PROGRESS = (60, False)
    NON_EMPTY_GROUP = (68, False)
    GROUP_ID_NOT_FOUND = (69, False)
    FETCH_SESSION_ID_NOT_FOUND = (70, True)
    INVALID_FETCH_SESSION_EPOCH = (71, True)
    FENCED_LEADER_EPOCH = (74, True)
    UNKNOWN_LEADER_EPOCH = (75, True)
    UNSUPPORTED_COMPRESSION_TYPE = (76, False)
    OFFSET_NOT_AVAILABLE = (78, True)
    MEMBER_ID_REQUIRED = (79, False)
    STALE_BROKER_EPOCH = (77, False)
    PREFERRED_LEADER_NOT_AVAILABLE = (80, True)
    GROUP_MAX_SIZE_REACHED = (81, False)
    FENCED_INSTANCE_ID = (82, False)
    ELIGIBLE_LEADERS_NOT_AVAILABLE = (83, True)
    ELECTION_NOT_NEEDED = (84, True)
    NO_REASSIGNMENT_IN_PROGRESS = (85, False)
    GROUP_SUBSCRIBED_TO_TOPIC = (86, False)
    INVALID_RECORD = (87, False)
    UNSTABLE_OFFSET_COMMIT = (88, True)
    PRODUCER_FENCED = (90, False)
    RESOURCE_NOT_FOUND = (91, False)
    DUPLICATE_RESOURCE = (92, False)
    UNACCEPTABLE_CREDENTIAL = (93, False)
    INVALID_UPDATE_VERSION = (95, False)
    FEATURE_UPDATE_FAILED = (96, False)
    UNKNOWN_TOPIC_ID = (100, True)
    DUPLICATE_BROKER_REGISTRATION = (101, False)
    BROKER_ID_NOT_REGISTERED = (102, False)
    INCONSISTENT_TOPIC_ID = (103, True)
    INCONSISTENT_CLUSTER_ID = (104, False)
    TRANSACTIONAL_ID_NOT_FOUND = (105, False)
    INELIGIBLE_REPLICA = (107, False)
    NEW_LEADER_ELECTED = (108, False)
    FENCED_MEMBER_EPOCH = (110, False)
    UNRELEASED_INSTANCE_ID = (111, False)  # KIP-848: the static member has not left
    UNSUPPORTED_ASSIGNOR = (112, False)
    STALE_MEMBER_EPOCH = (113, False)
    UNSUPPORTED_ENDPOINT_TYPE = (115, False)
    INVALID_RECORD_STATE = (121, False)  # share groups (KIP-932)
    SHARE_SESSION_NOT_FOUND = (122, True)
    INVALID_SHARE_SESSION_EPOCH = (123, True)
    FENCED_STATE_EPOCH = (124, False)
    DUPLICATE_VOTER = (126, False)
    VOTER_NOT_FOUND = (127, False)
    INVALID_REGULAR_EXPRESSION = (128, False)
    SHARE_SESSION_LIMIT_REACHED = (133, True)

    @property
    def code(self) -> int:
        return self.value[0]

    @property
    def retriable(self) -> bool:
        return self.value[1]

    @classmethod
    def from_code(cls, code: int) -> ErrorCode:
        try:
            return _BY_CODE[code]
        except KeyError:
            return cls.UNKNOWN_SERVER_ERROR


_BY_CODE = {member.code: member for member in ErrorCode}


class KafkaError(Exception):
    """An expected error with Kafka's code: bad input, a stale request, an unavailable resource."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(f"{error.name}: {message}")
        self.error = error
        self.message = message

    @property
    def retriable(self) -> bool:
        return self.error.retriable


class CorruptRecordError(KafkaError):
    """CORRUPT_MESSAGE: a batch whose CRC, magic or framing does not check out."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.CORRUPT_MESSAGE, message)


class InvalidRecordError(KafkaError):
    """INVALID_RECORD: framing is intact but the records inside are malformed."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_RECORD, message)


class UnsupportedCompressionError(KafkaError):
    """UNSUPPORTED_COMPRESSION_TYPE: a codec id we do not know or cannot decode."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, message)


class OffsetOutOfRangeError(KafkaError):
    """OFFSET_OUT_OF_RANGE: an offset outside [log start offset, log end offset]."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.OFFSET_OUT_OF_RANGE, message)


class StorageError(KafkaError):
    """KAFKA_STORAGE_ERROR: the log directory is not usable (IO error, bad layout)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.KAFKA_STORAGE_ERROR, message)


class LogDirIOError(StorageError):
    """KAFKA_STORAGE_ERROR from the operating system (ENOSPC, EIO, ...) while writing a log
    directory. Kafka takes such a directory offline (``LogDirFailureChannel``): what the log
    holds on disk may no longer match what it holds in memory, so no further write is trusted.
    The log tells its ``io_failure_listener`` before raising this."""
