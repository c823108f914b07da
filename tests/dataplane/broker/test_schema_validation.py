"""key/value.schema.validation's check (pure): the framing Confluent's serializers write, the
ids a registry knows, the message naming the batch and offset delta, null keys and values."""

from __future__ import annotations

import pytest

from dataplane.broker.schema_validation import check_schema_ids
from metadata_quorum.topic_config_defs import NOT_KAFKA_TOPIC_CONFIGS, TOPIC_CONFIG_DEFS
from raftlog.batch import Compression
from raftlog.config import LogConfig
from raftlog.errors import ErrorCode, KafkaError
from raftlog.records import encode_batch

KNOWN = {1, 7}
NOW_MS = 1_700_000_000_000


def framed(schema_id: int, body: bytes = b"\x02x") -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + body


def batch(*pairs: tuple[bytes | None, bytes | None], compression: int = Compression.NONE) -> bytes:
    return encode_batch([(k, v, NOW_MS, ()) for k, v in pairs], compression=compression)


def refusal(records: bytes, keys: bool = False, values: bool = True) -> str:
    with pytest.raises(KafkaError) as raised:
        check_schema_ids(records, keys, values, KNOWN.__contains__, 3)
    assert raised.value.error is ErrorCode.INVALID_RECORD
    return raised.value.message


def test_framed_values_with_known_ids_pass_and_so_do_nulls() -> None:
    records = batch((None, framed(1)), (b"plain key", framed(7)), (b"k", None))
    check_schema_ids(records, False, True, KNOWN.__contains__, 3)
    check_schema_ids(records + batch((None, framed(7))), False, True, KNOWN.__contains__, 3)
    check_schema_ids(batch((b"plain", b"plain")), False, False, None, 3)  # neither asked


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"hello world", "its value starts with byte 104, not the magic byte 0"),
        (b"\x00\x00\x01", "its value has 3 bytes, fewer than the magic byte and a 4-byte"),
        (framed(99), "its value carries schema id 99, which the schema registry does not know"),
        (b"", "its value has 0 bytes"),
    ],
)
def test_a_bad_value_is_invalid_record_naming_batch_and_offset_delta(
    value: bytes, reason: str
) -> None:
    records = batch((None, framed(1))) + batch((None, framed(7)), (None, value))
    message = refusal(records)
    assert message.startswith("value.schema.validation: batch 1, record at offset delta 1: ")
    assert reason in message


def test_keys_are_checked_only_when_asked_and_compressed_batches_too() -> None:
    records = batch((b"plain key", framed(1)), compression=Compression.GZIP)
    check_schema_ids(records, False, True, KNOWN.__contains__, 3)
    assert "its key starts with byte 112" in refusal(records, keys=True, values=False)
    check_schema_ids(batch((framed(7), b"plain")), True, False, KNOWN.__contains__, 3)


def test_without_a_registry_the_produce_is_refused_with_why() -> None:
    with pytest.raises(KafkaError) as raised:
        check_schema_ids(batch((None, framed(1))), False, True, None, 3)
    assert raised.value.error is ErrorCode.INVALID_RECORD
    assert "schema.registry.listener is unset on node 3" in raised.value.message


def test_the_configs_are_raftlogs_own_booleans_off_by_default() -> None:
    for name in ("key.schema.validation", "value.schema.validation"):
        assert name in TOPIC_CONFIG_DEFS and name in NOT_KAFKA_TOPIC_CONFIGS
    config = LogConfig.model_validate({"value.schema.validation": "true"})
    assert config.value_schema_validation and not config.key_schema_validation
    assert not LogConfig().value_schema_validation
