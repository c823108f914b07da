"""The child pytest session of test_orphans.py (not collected on its own: not ``test_*.py``).

It starts a 3-node cluster with the fixture code every cluster test uses (``running_cluster``),
writes the session's and the nodes' pids to ``$RAFTLOG_ORPHAN_DIR/pids.json`` once the cluster
is up, and holds it until test_orphans.py kills this session.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from dataplane.tools.local_cluster import wait_for
from tests.dataplane.cluster_support import running_cluster

ORPHAN_DIR = "RAFTLOG_ORPHAN_DIR"
HOLD_S = 150.0  # longer than the killing test waits; an unkilled session fails


def test_hold_a_cluster_until_killed() -> None:
    if ORPHAN_DIR not in os.environ:
        pytest.skip(f"run by tests/dataplane/tools/test_orphans.py, which sets {ORPHAN_DIR}")
    # Ctrl-C's KeyboardInterrupt, whatever this process inherited: a shell runs a command it
    # puts in the background without job control with SIGINT ignored (POSIX), and a session
    # started under one (`nohup make test &`) would ignore test_orphans.py's SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out = Path(os.environ[ORPHAN_DIR])
    with running_cluster(out / "cluster", "orphans") as cluster:
        nodes = {spec.node_id: cluster.pid(spec.node_id) for spec in cluster.specs}
        assert None not in nodes.values(), nodes
        ready = out / "pids.json.tmp"
        ready.write_text(json.dumps({"session": os.getpid(), "nodes": nodes}))
        ready.replace(out / "pids.json")
        wait_for("test_orphans.py to kill this session", lambda: False, HOLD_S)
