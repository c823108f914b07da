"""What a soak run samples of each node every 10 s: the IO shell around bench/soak_rules.py.

- The process (by the pid the cluster recorded): resident memory (``VmRSS`` of
  ``/proc/PID/status``), open file descriptors (the entries of ``/proc/PID/fd``), threads
  (``Threads``).
- Its data directory (``log.dirs``): allocated bytes in all (what ``du`` counts), and split by
  partition directory into those of delete-policy topics (retention's; with the bound their
  configs give, `bench.soak_rules.partition_bound_bytes`) and those of compacted topics.
- The metadata log (``__cluster_metadata``): the journal's and the snapshot's file sizes and the
  snapshot's last Raft index (`metadata_quorum.raft.snapshot_last_index`).

Topic configs come from DescribeConfigs once per topic (`TopicConfigs`, cached: the configs the
soak sets do not change). A config the topic does not set is the broker default the run
configured (the node file's ``log.*``, which every broker applies, `RETENTION_OVERRIDES` in
bench/soak.py); a topic that cannot be described (deleted meanwhile, no controller) is bounded
by those defaults too; Kafka's internal topics are compacted.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import IO

from bench.soak_rules import NodeSample, TopicRetention, partition_bound_bytes
from chaos.workloads import CLIENT_ERRORS
from dataplane.client import AdminClient
from dataplane.client.admin import ConfigResource, ResourceType
from metadata_quorum.raft import (
    JOURNAL_FILE,
    SNAPSHOT_FILE,
    RaftStorageError,
    scan_journal,
    snapshot_last_index,
)
from raftlog.errors import StorageError
from raftlog.log import parse_partition_dir_name

log = logging.getLogger(__name__)
METADATA_DIR = "__cluster_metadata"
# Kafka creates its internal topics compacted; the controller does not describe them.
INTERNAL_COMPACTED = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})
# The source of a config no one set: the broker's own default applies (the node file's, which
# the controller's DescribeConfigs does not show).
DEFAULT_SOURCE = "DEFAULT_CONFIG"
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def process_figures(pid: int) -> tuple[int, int, int] | None:
    """(RSS bytes, open fds, threads) of ``pid``, or None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kib = int(fields.get("VmRSS", "0 kB").split()[0])
    return rss_kib * 1024, fds, int(fields.get("Threads", "0").strip())


def allocated_bytes(path: Path) -> int:
    """Allocated bytes of every file under ``path`` (``du``'s count); files that vanish
    while it walks (a segment deleted, a topic removed) count as nothing."""
    total = 0
    try:
        entries = list(os.scandir(path))
    except (FileNotFoundError, NotADirectoryError):
        return 0
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                total += allocated_bytes(Path(entry.path))
            else:
                total += entry.stat(follow_symlinks=False).st_blocks * 512
        except FileNotFoundError:
            continue
    return total


def _file_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _journal(path: Path) -> tuple[int, int]:
    """(bytes, records) the journal holds: up to the end of its last whole record. Not the
    file's size: the journal reserves space in chunks (metadata_quorum/raft_journal.py), and a
    compaction cuts what it holds, not always the file."""
    try:
        records, end, _ = scan_journal(path.read_bytes(), str(path))
    except FileNotFoundError:
        return 0, 0
    except RaftStorageError as error:  # a finding of the data check, not of the sampler
        log.warning("%s", error)
        return 0, 0
    return end, records


def _snapshot_index(path: Path) -> int:
    """The snapshot's last Raft index; -1 when there is none yet. The node writes a snapshot
    aside and renames it into place, so the file read is always a whole one."""
    try:
        return snapshot_last_index(path.read_bytes(), str(path))
    except FileNotFoundError:
        return -1
    except RaftStorageError as error:  # a finding of the data check, not of the sampler
        log.warning("%s", error)
        return -1


class TopicConfigs:
    """Each topic's `TopicRetention`, described once (DescribeConfigs), else ``default``."""

    def __init__(self, admin: AdminClient, default: TopicRetention) -> None:
        self._admin = admin
        self._default = default
        self._known: dict[str, TopicRetention] = {}

    def of(self, topic: str) -> TopicRetention:
        found = self._known.get(topic)
        if found is not None:
            return found
        if topic in INTERNAL_COMPACTED:
            return replace(self._default, delete=False)
        resource = ConfigResource(ResourceType.TOPIC, topic)
        try:
            entries = self._admin.describe_configs([resource])[resource]
        except CLIENT_ERRORS as error:  # deleted meanwhile, no controller: the broker default
            log.info("DescribeConfigs %s: %s", topic, error)
            return self._default
        d = self._default

        def value(name: str, fallback: str) -> str:
            """The topic's own value; else the broker's default, as the broker applies it."""
            entry = entries.get(name)
            return fallback if entry is None or entry.source == DEFAULT_SOURCE else entry.value

        retention = TopicRetention(
            delete="delete" in value("cleanup.policy", "delete" if d.delete else "compact"),
            retention_bytes=int(value("retention.bytes", str(d.retention_bytes))),
            segment_bytes=int(value("segment.bytes", str(d.segment_bytes))),
            segment_index_bytes=int(value("segment.index.bytes", str(d.segment_index_bytes))),
        )
        self._known[topic] = retention
        return retention


def sample_node(
    time_s: float, node_id: int, pid: int | None, data_dir: Path, configs: TopicConfigs
) -> NodeSample:
    """One `NodeSample` of the node (module doc)."""
    figures = process_figures(pid) if pid is not None else None
    retained = bound = compacted = partitions = 0
    try:
        children = list(os.scandir(data_dir))
    except FileNotFoundError:
        children = []
    for child in children:
        try:
            topic, _ = parse_partition_dir_name(child.name)
        except StorageError:
            continue  # the metadata log, checkpoints, a partition being deleted
        if not child.is_dir():
            continue
        partitions += 1
        size = allocated_bytes(Path(child.path))
        partition_bound = partition_bound_bytes(configs.of(topic))
        if partition_bound is None:
            compacted += size
        else:
            retained += size
            bound += partition_bound
    metadata = data_dir / METADATA_DIR
    snapshot_index = _snapshot_index(metadata / SNAPSHOT_FILE)
    rss, fds, threads = figures or (0, 0, 0)
    journal_bytes, journal_records = _journal(metadata / JOURNAL_FILE)
    return NodeSample(
        time_s=round(time_s, 1),
        node_id=node_id,
        up=figures is not None,
        pid=pid if figures is not None and pid is not None else 0,
        rss_bytes=rss,
        fds=fds,
        threads=threads,
        disk_bytes=allocated_bytes(data_dir),
        retained_bytes=retained,
        retained_bound_bytes=bound,
        compacted_bytes=compacted,
        partitions=partitions,
        journal_bytes=journal_bytes,
        journal_records=journal_records,
        snapshot_bytes=_file_bytes(metadata / SNAPSHOT_FILE),
        snapshot_index=snapshot_index,
    )


class Sampler(threading.Thread):
    """Every ``every_s``, one `NodeSample` per node, appended to ``out`` as a JSON line (and
    kept in ``samples``). ``nodes()`` lists (node id, pid or None, data directory); ``now()``
    is the run's clock."""

    def __init__(
        self,
        nodes: Callable[[], Iterable[tuple[int, int | None, Path]]],
        configs: TopicConfigs,
        now: Callable[[], float],
        out: IO[str],
        every_s: float,
    ) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self._nodes, self._configs, self._now, self._out = nodes, configs, now, out
        self.every_s = every_s
        self.stop = threading.Event()
        self.samples: list[NodeSample] = []

    def run(self) -> None:
        while True:
            self.sample_once()
            if self.stop.wait(self.every_s):
                return

    def sample_once(self) -> None:
        time_s = self._now()
        for node_id, pid, data_dir in self._nodes():
            sample = sample_node(time_s, node_id, pid, data_dir, self._configs)
            self.samples.append(sample)
            self._out.write(json.dumps(sample.to_json()) + "\n")
        self._out.flush()
