"""The framing checks of a batch header: one combined test on the hot path, and on failure the
first rule broken, in a fixed order, with Kafka's error code."""

from __future__ import annotations

import pytest

from raftlog.batch import MIN_BATCH_LENGTH, BatchHeader, check_header, read_header
from raftlog.errors import ErrorCode, KafkaError
from tests.raftlog.batches import make_batch

GOOD = read_header(make_batch([b"v"] * 3))
AVAILABLE = GOOD.size_bytes


@pytest.mark.parametrize(
    ("changes", "available", "error", "message"),
    [
        ({"magic": 1}, AVAILABLE, ErrorCode.CORRUPT_MESSAGE, "magic"),
        ({"batch_length": MIN_BATCH_LENGTH - 1}, AVAILABLE, ErrorCode.CORRUPT_MESSAGE, "minimum"),
        ({}, AVAILABLE - 1, ErrorCode.CORRUPT_MESSAGE, "truncated"),
        ({"attributes": 5}, AVAILABLE, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, "codec id 5"),
        ({"last_offset_delta": -1}, AVAILABLE, ErrorCode.INVALID_RECORD, "negative"),
        ({"record_count": -1}, AVAILABLE, ErrorCode.INVALID_RECORD, "negative"),
        # Several rules broken: the first in the order above is reported.
        ({"magic": 0, "record_count": -1}, AVAILABLE - 1, ErrorCode.CORRUPT_MESSAGE, "magic"),
        (
            {"attributes": 7, "last_offset_delta": -2},
            AVAILABLE,
            ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
            "codec",
        ),
    ],
)
def test_check_header_reports_the_first_rule_broken(
    changes: dict[str, int], available: int, error: ErrorCode, message: str
) -> None:
    header = GOOD._replace(**changes)
    with pytest.raises(KafkaError, match=message) as caught:
        check_header(header, available)
    assert caught.value.error is error


@pytest.mark.parametrize(
    "header",
    [
        GOOD,
        GOOD._replace(attributes=4 | 0x08 | 0x10 | 0x20 | 0x40),  # zstd and every flag bit
        GOOD._replace(batch_length=MIN_BATCH_LENGTH, last_offset_delta=0, record_count=0),
    ],
)
def test_check_header_accepts_valid_headers(header: BatchHeader) -> None:
    check_header(header, header.size_bytes)
