"""The broker's clean-shutdown marker (KIP-966): proof, at the next start, that this log
directory was flushed and closed by the incarnation registered at a given broker epoch.

Kafka's ``CleanShutdownFileHandler``: ``<log dir>/.kafka_cleanshutdown`` holds
``{"version":0,"brokerEpoch":N}``. The broker writes it durably once every log is closed cleanly
on a controlled stop, reads it at start (sending N as ``PreviousBrokerEpoch`` when it registers)
and removes it durably before any log is written, so a later crash or power cut leaves no
marker. The controller takes N equal to the registered epoch as a clean shutdown; anything
else (no file, a torn or foreign one: -1) is unclean, and with eligible leader replicas the
broker then leaves every ISR and ELR, since its unflushed tail may be gone.
"""

from __future__ import annotations

import json
from pathlib import Path

from raftlog.checkpoint import fsync_path, write_atomically

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
CLEAN_SHUTDOWN_VERSION = 0
NO_BROKER_EPOCH = -1


def write_clean_shutdown_epoch(log_dir: Path, broker_epoch: int) -> None:
    """Write the marker durably (temporary, fsync, rename, directory fsync)."""
    if broker_epoch < 0:
        raise ValueError(f"broker epoch {broker_epoch} < 0 proves no clean shutdown")
    body = {"version": CLEAN_SHUTDOWN_VERSION, "brokerEpoch": broker_epoch}
    write_atomically(log_dir / CLEAN_SHUTDOWN_FILE, json.dumps(body).encode())


def read_clean_shutdown_epoch(log_dir: Path) -> int:
    """The broker epoch in the marker, or -1 when it is absent, unreadable, of an unknown
    version or malformed (Kafka reads such a file as no clean shutdown, never as an error)."""
    try:
        body = json.loads((log_dir / CLEAN_SHUTDOWN_FILE).read_bytes())
    except (OSError, ValueError):
        return NO_BROKER_EPOCH
    if not isinstance(body, dict) or body.get("version") != CLEAN_SHUTDOWN_VERSION:
        return NO_BROKER_EPOCH
    epoch = body.get("brokerEpoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        return NO_BROKER_EPOCH
    return epoch


def take_clean_shutdown_epoch(log_dir: Path) -> int:
    """Read the marker, then remove it durably (unlink, directory fsync) before the caller
    writes any log: the proof is good for this start only. An OSError removing it propagates:
    a broker that cannot make its log directory durable must not start."""
    epoch = read_clean_shutdown_epoch(log_dir)
    marker = log_dir / CLEAN_SHUTDOWN_FILE
    if marker.exists():
        marker.unlink()
        fsync_path(log_dir)
    return epoch
