"""The broker's clean-shutdown marker (KIP-966): proof, at the next start, that this log
directory was flushed and closed by the incarnation registered at a given broker epoch.

Kafka's ``CleanShutdownFileHandler``: ``<log dir>/.kafka_cleanshutdown`` holds
``{"version":0,"brokerEpoch":N}``. The broker writes it durably once every log is closed cleanly
on a controlled stop, reads it at start (sending N as ``PreviousBrokerEpoch`` when it registers)
and removes it durably before any log is written, so a later crash or power cut leaves no
marker. The controller takes N equal to the registered epoch as a clean shutdown; anything
else (no file, a torn or foreign one: -1) is unclean, and with eligible leader replicas the
broker then leaves every ISR and ELR, since its unflushed tail may be gone.

raftlog adds a second proof Kafka does not have: **the same boot**. A process that dies without
a clean shutdown (a crash, an OOM kill, SIGKILL) loses nothing it wrote: every ``write()`` that
returned is in the kernel's page cache, which outlives the process; only a power cut or a
kernel crash drops unflushed pages, and both start a new boot. So after each registration the
broker notes the epoch and the kernel's boot id (``/proc/sys/kernel/random/boot_id``) in
``<log dir>/.raftlog-same-boot``, never fsynced, and a start that finds no clean-shutdown marker
but that note, with the boot id it runs under, sends its epoch all the same: a broker restarted
after a crash keeps its place in the ELR, where Kafka's would leave it and could leave a
partition offline. A broker whose log directory failed removes the note (an I/O error may have
cost it pages). The chaos harness, which cuts power without a reboot, removes it at each cut.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from raftlog.checkpoint import fsync_path, write_atomically

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
CLEAN_SHUTDOWN_VERSION = 0
SAME_BOOT_FILE = ".raftlog-same-boot"
SAME_BOOT_VERSION = 0
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
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
    body = _read_json(log_dir / CLEAN_SHUTDOWN_FILE, CLEAN_SHUTDOWN_VERSION)
    return NO_BROKER_EPOCH if body is None else _epoch(body)


def _read_json(path: Path, version: int) -> dict[str, object] | None:
    try:
        body = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("version") != version:
        return None
    return body


def _epoch(body: dict[str, object]) -> int:
    epoch = body.get("brokerEpoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        return NO_BROKER_EPOCH
    return epoch


def boot_id(path: Path = BOOT_ID_PATH) -> str | None:
    """The kernel's id of this boot (a new one at every boot), None where there is none."""
    try:
        found = path.read_text().strip()
    except OSError:
        return None
    return found or None


def note_same_boot(log_dir: Path, broker_epoch: int, current_boot: str | None) -> None:
    """Note that the incarnation registered at ``broker_epoch`` runs under ``current_boot``
    (:func:`boot_id`): written and renamed into place, never fsynced, since it only has to
    outlive this process, not the machine. Nothing without a boot id; a note that cannot be
    written is removed (no proof is always safe)."""
    if current_boot is None or broker_epoch < 0:
        return
    body = {"version": SAME_BOOT_VERSION, "bootId": current_boot, "brokerEpoch": broker_epoch}
    temporary = log_dir / f"{SAME_BOOT_FILE}.tmp"
    try:
        temporary.write_text(json.dumps(body))
        os.replace(temporary, log_dir / SAME_BOOT_FILE)
    except OSError as error:  # a full disk: no note, and a stale one must not stay
        log.warning("%s: could not note the boot: %s", log_dir, error)
        forget_same_boot(log_dir)


def forget_same_boot(log_dir: Path) -> None:
    """Remove the note (a failed log directory: its pages may be gone), as far as the directory
    still allows."""
    try:
        (log_dir / SAME_BOOT_FILE).unlink(missing_ok=True)
    except OSError as error:
        log.warning("%s: could not remove %s: %s", log_dir, SAME_BOOT_FILE, error)


def read_same_boot_epoch(log_dir: Path, current_boot: str | None) -> int:
    """The epoch the note names if it was written under ``current_boot``, else -1 (another
    boot, no boot id, a missing, torn or foreign note)."""
    body = _read_json(log_dir / SAME_BOOT_FILE, SAME_BOOT_VERSION)
    if body is None or current_boot is None or body.get("bootId") != current_boot:
        return NO_BROKER_EPOCH
    return _epoch(body)


@dataclass(frozen=True)
class PreviousIncarnation:
    """What a start proves about the last incarnation: its broker epoch (-1: nothing) and how
    (``clean shutdown``, ``same boot`` or ``none``)."""

    broker_epoch: int
    proof: str


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


def take_previous_incarnation(log_dir: Path, current_boot: str | None) -> PreviousIncarnation:
    """The proof to send at registration: the clean-shutdown marker (taken, so used once), else
    a same-boot note of this boot. The note stays until the next registration replaces it."""
    clean = take_clean_shutdown_epoch(log_dir)
    if clean != NO_BROKER_EPOCH:
        return PreviousIncarnation(clean, "clean shutdown")
    same_boot = read_same_boot_epoch(log_dir, current_boot)
    if same_boot != NO_BROKER_EPOCH:
        return PreviousIncarnation(same_boot, "same boot")
    return PreviousIncarnation(NO_BROKER_EPOCH, "none")
