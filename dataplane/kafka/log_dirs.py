"""The KAFKA listener's log directory APIs: DescribeLogDirs (35) and AlterReplicaLogDirs (34).

A raftlog broker has one log directory (``log.dirs`` names a single path, and a failed one halts
the broker, dataplane/server/broker_server.py): there is no JBOD, so no replica ever moves between
directories. DescribeLogDirs answers that directory as a Kafka broker does: its absolute path,
the filesystem's total and usable bytes (v4), and each hosted replica's size and offset lag
(Kafka's ``max(high watermark - log end offset, 0)``: 0 for every current replica) with
``is_future_key`` false (a future replica exists only while moving between directories).
AlterReplicaLogDirs answers as Kafka does for one directory: a path that is not the log
directory is LOG_DIR_NOT_FOUND, a replica this broker does not host REPLICA_NOT_AVAILABLE, and
a hosted replica asked to stay where it is NONE, with nothing to move.

Authorization as Kafka's KafkaApis: DESCRIBE on the cluster for DescribeLogDirs (refused: the
top-level CLUSTER_AUTHORIZATION_FAILED and no directories), ALTER on the cluster for
AlterReplicaLogDirs (refused: every partition CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dataplane.broker.log_dirs import (
    Partition,
    ReplicaLog,
    disk_usage,
    log_dir_path,
    replica_logs,
)
from dataplane.kafka import codec as kc
from metadata_quorum.request_authorization import check_cluster
from metadata_quorum.security.authorization import AccessControl
from raftlog.errors import ErrorCode, KafkaError


def describe_log_dir(
    log_dir: str,
    replicas: Iterable[ReplicaLog],
    wanted: set[tuple[str, int]] | None,
    disk: tuple[int, int],
) -> kc.Data:
    """One DescribeLogDirs result: the replicas ``wanted`` (None: all) in ``log_dir``, whose
    filesystem has ``disk`` = (total, usable) bytes."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(replicas, key=lambda r: (r.topic, r.partition)):
        if wanted is None or (r.topic, r.partition) in wanted:
            by_topic.setdefault(r.topic, []).append({
                "partition_index": r.partition, "partition_size": r.size_bytes,
                "offset_lag": r.offset_lag, "is_future_key": False,
            })  # fmt: skip
    return {
        "error_code": ErrorCode.NONE.code,
        "log_dir": log_dir,
        "topics": [{"name": name, "partitions": ps} for name, ps in by_topic.items()],
        "total_bytes": disk[0],
        "usable_bytes": disk[1],
    }


def alter_replica_log_dir(log_dir: str, path: str, hosted: bool) -> ErrorCode:
    """The outcome of asking one replica to live in ``path`` on a broker whose only log
    directory is ``log_dir`` (Kafka checks the directory first, then the replica)."""
    if os.path.normpath(path) != log_dir:
        return ErrorCode.LOG_DIR_NOT_FOUND
    if not hosted:
        return ErrorCode.REPLICA_NOT_AVAILABLE
    return ErrorCode.NONE


class KafkaLogDirs:
    """DescribeLogDirs and AlterReplicaLogDirs over the broker's one log directory."""

    def __init__(
        self,
        log_dir: Path,
        partitions: Callable[[], Iterable[Partition]],
        access: AccessControl,
    ) -> None:
        self.log_dir = log_dir_path(log_dir)
        self.partitions = partitions
        self.access = access

    def handlers(self) -> dict[int, Callable[[kc.Request], kc.Data]]:
        return {
            kc.API_DESCRIBE_LOG_DIRS: self.describe_log_dirs,
            kc.API_ALTER_REPLICA_LOG_DIRS: self.alter_replica_log_dirs,
        }

    def describe_log_dirs(self, request: kc.Request) -> kc.Data:
        answer: dict[str, Any] = {"throttle_time": 0}
        try:
            check_cluster(self.access, "DescribeLogDirs")
        except KafkaError as error:
            return {**answer, "error_code": error.error.code, "results": []}
        topics = request.body.topics
        wanted = None if topics is None else {(t.topic, p) for t in topics for p in t.partitions}
        result = describe_log_dir(
            self.log_dir, replica_logs(self.partitions()), wanted, disk_usage(Path(self.log_dir))
        )
        return {**answer, "error_code": ErrorCode.NONE.code, "results": [result]}

    def alter_replica_log_dirs(self, request: kc.Request) -> kc.Data:
        refused: ErrorCode | None = None
        try:
            check_cluster(self.access, "AlterReplicaLogDirs")
        except KafkaError as denied:
            refused = denied.error
        hosted = {(p.topic, p.partition) for p in self.partitions()}
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for log_dir in request.body.dirs:
            for topic in log_dir.topics:
                for index in topic.partitions:
                    outcome = refused or alter_replica_log_dir(
                        self.log_dir, log_dir.path, (topic.name, index) in hosted
                    )
                    by_topic.setdefault(topic.name, []).append(
                        {"partition_index": index, "error_code": outcome.code}
                    )
        return {
            "throttle_time": 0,
            "results": [{"topic_name": name, "partitions": ps} for name, ps in by_topic.items()],
        }
