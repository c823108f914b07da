"""The KAFKA listener's log directory and feature answers as pure functions of their inputs
(dataplane/kafka/log_dirs.py, dataplane/kafka/features.py), and their authorization."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dataplane.broker.log_dirs import ReplicaLog
from dataplane.kafka import codec as kc
from dataplane.kafka.features import api_versions_features
from dataplane.kafka.log_dirs import KafkaLogDirs, alter_replica_log_dir, describe_log_dir
from metadata_quorum.image import MetadataImage
from metadata_quorum.security.authorization import ALLOW_ALL, AccessControl, AuthorizerSettings
from metadata_quorum.security.principal import KafkaPrincipal, Session, acting_as
from raftlog.errors import ErrorCode

LOG_DIR = "/var/lib/raftlog/data"
ALICE = Session(KafkaPrincipal.user("alice"), "127.0.0.1", "KAFKA")


def test_describe_log_dir_lists_the_wanted_replicas_by_topic() -> None:
    replicas = [ReplicaLog("b", 0, 10, 0), ReplicaLog("a", 1, 30, 0), ReplicaLog("a", 0, 20, 0)]
    every = describe_log_dir(LOG_DIR, replicas, None, (100, 40))
    assert every["error_code"] == 0 and every["log_dir"] == LOG_DIR
    assert (every["total_bytes"], every["usable_bytes"]) == (100, 40)
    assert [(t["name"], [p["partition_index"] for p in t["partitions"]])
            for t in every["topics"]] == [("a", [0, 1]), ("b", [0])]  # fmt: skip
    assert every["topics"][0]["partitions"][1] == {
        "partition_index": 1, "partition_size": 30, "offset_lag": 0, "is_future_key": False,
    }  # fmt: skip
    some = describe_log_dir(LOG_DIR, replicas, {("a", 1), ("c", 0)}, (100, 40))
    assert [(t["name"], len(t["partitions"])) for t in some["topics"]] == [("a", 1)]


@pytest.mark.parametrize(
    ("path", "hosted", "outcome"),
    [
        (LOG_DIR, True, ErrorCode.NONE),  # already there: nothing to move
        (LOG_DIR + "/", True, ErrorCode.NONE),
        (LOG_DIR, False, ErrorCode.REPLICA_NOT_AVAILABLE),
        ("/elsewhere", True, ErrorCode.LOG_DIR_NOT_FOUND),  # the directory is checked first
        ("/elsewhere", False, ErrorCode.LOG_DIR_NOT_FOUND),
    ],
)
def test_alter_replica_log_dir_with_one_directory(
    path: str, hosted: bool, outcome: ErrorCode
) -> None:
    assert alter_replica_log_dir(LOG_DIR, path, hosted) is outcome


def request(api_key: int, version: int, body: dict[str, Any]) -> kc.Request:
    return kc.Request(
        api_key, version, 1, "test", kc.to_entity(kc.request_schema(api_key, version), body)
    )


def test_log_dir_apis_need_describe_and_alter_on_the_cluster(tmp_path: Path) -> None:
    denying = AccessControl(MetadataImage, AuthorizerSettings())  # no ACLs: nobody but nodes
    apis = KafkaLogDirs(tmp_path, list, denying)
    with acting_as(ALICE):
        described = apis.describe_log_dirs(request(kc.API_DESCRIBE_LOG_DIRS, 4, {"topics": None}))
        altered = apis.alter_replica_log_dirs(request(kc.API_ALTER_REPLICA_LOG_DIRS, 2, {
            "dirs": [{"path": str(tmp_path), "topics": [{"name": "t", "partitions": [0, 1]}]}],
        }))  # fmt: skip
    assert described["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code
    assert described["results"] == []
    assert altered["results"] == [{"topic_name": "t", "partitions": [
        {"partition_index": p, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code}
        for p in (0, 1)
    ]}]  # fmt: skip
    allowed = KafkaLogDirs(tmp_path, list, ALLOW_ALL)
    (result,) = allowed.describe_log_dirs(request(kc.API_DESCRIBE_LOG_DIRS, 4, {"topics": None}))[
        "results"
    ]
    assert result["log_dir"] == str(tmp_path) and result["total_bytes"] > 0


def test_api_versions_features_by_version() -> None:
    image = MetadataImage(offset=41, features={
        "metadata.version": 22, "kraft.version": 1, "group.version": 1, "transaction.version": 0,
    })  # fmt: skip
    v3 = api_versions_features(image, 3)
    assert v3["supported_features"] == [  # KAFKA-17492: below v4, no feature whose minimum is 0
        {"name": "metadata.version", "min_version": 7, "max_version": 23}
    ]
    assert v3["finalized_features_epoch"] == 41
    assert v3["finalized_features"] == [
        {"name": n, "min_version_level": v, "max_version_level": v}
        for n, v in (("group.version", 1), ("kraft.version", 1), ("metadata.version", 22))
    ]  # transaction.version 0 is not listed
    v4 = api_versions_features(image, 4)
    assert [f["name"] for f in v4["supported_features"]] == [
        "eligible.leader.replicas.version", "group.version", "kraft.version", "metadata.version",
        "share.version", "transaction.version",
    ]  # fmt: skip
    assert api_versions_features(MetadataImage(offset=3), 3)["finalized_features_epoch"] == -1
    # the whole answer encodes in every served version
    for version in range(kc.SUPPORTED[kc.API_VERSIONS][1] + 1):
        kc.encode_response(kc.API_VERSIONS, version, 7, {
            "error_code": 0, "api_keys": [], "throttle_time": 0, **v4,
        })  # fmt: skip
