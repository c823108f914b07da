"""The Raft metadata log: the one module that imports pysyncobj (0.3.x), with raft_tls.py.

`MetadataLog` replicates opaque ``bytes`` entries through a pysyncobj quorum and hands each
committed entry, in log order, to a `StateMachine` on every voter. Nothing pysyncobj-specific
leaves this module: callers see futures, `NotLeaderError`, `CommitTimeoutError` and
`QuorumStatus`.

Threads. pysyncobj runs one tick thread per node. `StateMachine.apply`, `snapshot` and
`restore` run on it, and so do the done-callbacks of the futures that `append` returns: keep
them short and never block there on the log. `StateMachine.on_leader_change` runs on a separate
notifier thread, so it may take locks that `apply` also takes and may call `append`.

Entries and leadership. One replicated method takes ``term (8 bytes) + payload``. When it is
applied, an entry whose log term differs from the term it was proposed in is skipped on every
node (the proposer gets `NotLeaderError`): pysyncobj forwards a command proposed on a node that
has just lost leadership to the new leader, and that must not commit records computed by a
deposed controller. `is_leader()` turns true only once this node leads *and* has applied the
no-op entry of its term, i.e. its state machine holds every previously committed entry.
`index` passed to `apply` is the Raft log index: increasing, with gaps (no-ops).

Files under ``data_dir``: ``raft.journal`` (pysyncobj's log format, written by raft_journal.py
with ``pwrite`` into space reserved first: pysyncobj's own journal is mmap'ed and dies of
SIGBUS on a full disk; `_create_journal` installs ours), ``raft.journal.meta``
(term, vote, commit index), ``raft.snapshot`` (our format: both Raft entries pysyncobj
needs, the voter set as of the snapshot, the state machine's bytes, CRC-32),
``raft.bootstrap`` (the voter set the log started from), ``raft.lock`` (flock: one process
per directory).

Membership (KIP-853's AddRaftVoter / RemoveRaftVoter), through pysyncobj's dynamic membership:
`add_voter` / `remove_voter` on the leader, one change at a time. pysyncobj logs a change as a
membership entry and switches its configuration when the entry is *appended* (Raft's
single-server change: the configuration in use is the latest in the log, committed or not),
rolls it back if the entry is truncated, and refuses connections from addresses outside it, so
a removed node is sent nothing, counts toward no commit and can win no election (its own
configuration, which it never sees change, does not matter). What pysyncobj 0.3.17 does not
get right, and this module does: (1) a snapshot made by our serializer carried no voter set
(pysyncobj asks the deserializer for it and *replaces* its partners with the answer), so the
snapshot now stores the configuration as of its last entry (`_RaftNode.voters_at`); (2) at
start pysyncobj takes the partners it is given, loads the snapshot's set, then re-applies only
the *committed* membership entries, and only as they are applied: here the partners passed at
start are already the latest configuration of the snapshot + journal (`_persisted_voters`),
so the ``voters`` a caller passes (a configuration file) matter only for an empty directory;
(3) it applied every membership entry a second time when committed (re-adding a node that a
later, uncommitted entry removed): skipped; (4) a membership change proposed on a node that
has just lost leadership was forwarded to the new leader: refused; (5) anyone could add or
remove nodes with pysyncobj's admin messages on the Raft port: refused.
A compaction runs ``snapshot()`` on the tick thread, so the snapshot and the journal tail
agree: a restart is ``restore(snapshot)`` then the journal entries after it, each once.

Durability, found by reading pysyncobj 0.3.17 (it has no ``flushJournal`` option): pysyncobj
never fsyncs. The journal's writes reach the page cache at once and survive SIGKILL of the
process; the meta file is written + renamed, and so are full dumps,
without fsync. Power loss can therefore lose acknowledged entries and votes. With
``RaftOptions.fsync`` (the default) this module adds, on pysyncobj's thread: fdatasync of the
journal before any ``append_entries`` or acknowledgement leaves the node (a leader counts only
durable entries, a follower acknowledges only durable ones); fsync of the meta file and its
directory before a vote is requested, granted or acknowledged in a new term; fsync of a
snapshot before its rename and of the directory before the journal is cut; fsync of an
installed snapshot before it is applied. An fsync error stops the node. At start it repairs
what a crash can leave: a torn or stale journal tail is cut at the first bad record (never
acknowledged), and a compaction interrupted between the snapshot rename and the journal
rewrite is finished (pysyncobj would drop the journal entries after the snapshot). Left open:
pysyncobj rewrites the journal in place when it compacts; a crash in those microseconds can
lose that node's tail (the leader sends it again).

A full disk (ENOSPC / EDQUOT from the journal, its meta file or an installed snapshot; the first
to fail is usually the meta file, whose temporary needs a new block while the journal still has
a reserved chunk): the write fails before it changes anything, and the voter stops serving
(`_RaftNode._stop_serving`): it steps down if it leads, reads and sends nothing, starts no
election, logs one line; the others elect a leader and commit without it; appends to it fail
with NotLeaderError. Every second its tick tries to reserve a journal chunk and write the meta
file; when both succeed it logs a second line, serves again and catches up from the leader. A
snapshot that does not fit is not a reason to stop: its temporary is removed, the old snapshot
and the uncut journal stay, a later compaction tries again. Kafka's controller treats an IO
error of its metadata log as fatal and the process exits; waiting for space keeps the process
(and a combined node's broker) up with the same safety: nothing unwritten is acknowledged.

Encryption (``RaftOptions.secret``, controller.quorum.raft.secret.file): pysyncobj's own
(``SyncObjConf.password``, read in its encryptor.py, tcp_connection.py and transport.py): a
Fernet key (AES-128-CBC + HMAC-SHA256) derived from the secret by PBKDF2-SHA256 (100,000
iterations, a fixed salt), each connection opened by an exchange of random 32-byte keys that
every later message carries back, a per-connection timestamp that must not go backwards. A
message that fails its HMAC is never unpickled; the connection is dropped before the peer has
named itself, so a node with another secret or none cannot vote, be counted, or move a term.
pysyncobj drops it silently; `_PeerEncryptor` logs it (rate-limited per source host).
The other option, ``RaftOptions.tls``: TLS 1.3 with mutual certificates around pysyncobj's
connections (raft_tls.py), a peer admitted only with a node's principal
(``RaftOptions.tls_peers``); its refusals are logged the same way. The two are exclusive. A
product node runs TLS when its CONTROLLER listener is SSL or SASL_SSL (as Kafka secures the
quorum with that listener's protocol), the secret on a plaintext one; why, measured:
docs/security.md#raft-transport.

Elections (`_PreVote`, KIP-996 in Kafka): pysyncobj 0.3.17 raises its term as soon as a
follower's election timer runs out, and its leader steps down on any vote request of a later
term, so a voter that alone cannot hear the leader (cut off from it, or its tick thread starved)
unseated a healthy leader every election timeout. Here a voter whose timer runs out first asks
the others in a pre-vote round (``pre_vote``: the term it would stand in, its last log term and
index); each grants it, changing nothing, when it would vote for it and has not heard a leader
within the shortest election timeout (or leads). Only with a majority of grants does
pysyncobj's election run. And a voter that hears its leader ignores vote requests of a later
term (Raft §4.2.3), unless they say the leader handed its leadership over (``transfer``, set on
the vote requests of an election that pysyncobj's ``timeout_now`` started). Voters of an older
raftlog do not answer pre-votes: upgrade a quorum whole, not one voter at a time.

pysyncobj behaviours worked around here: a failed snapshot load is logged and ignored (we stop
the node); a leader resends entries already in flight and a follower then truncates entries
it had applied (``_RaftNode.before_receive``); an entry larger than an append message is sent
in pieces, and the leader marks the last one by the command's length, not the pickled entry's,
so pieces before the last are marked last too (``_RaftNode._reassemble``); its tick thread
stops when the thread that built it exits. Not worked around: commands are pickled with
protocol 2, which stores bytes as latin-1 text, so binary payloads take ~1.5x their size in the
journal and on the wire.

Cost, ``python -m tests.metadata_quorum.raft_node bench --count 20000`` (3 processes on
127.0.0.141-143, 2 cores, ext4 on a virtio disk, 1 KiB payloads, 500 appends in flight,
default timing; one journal sync ~4 ms here, paid once per batch): fsync on 6,600-7,700 commits/s,
fsync off 8,100-9,900 commits/s, one append at a time p50 10.5 ms either way. With the two
cores busy elsewhere both fall to ~3,500-5,500/s. Failover after SIGKILL of the leader:
0.3-0.9 s to the next commit. Idle: ~7-9 % of a core per voter (1 ms tick).
"""

from __future__ import annotations

import collections
import fcntl
import functools
import itertools
import logging
import os
import pickle
import re
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from cryptography.fernet import InvalidToken
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj import pickle as syncobj_pickle
from pysyncobj import syncobj as syncobj_module
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.journal import MemoryJournal
from pysyncobj.syncobj import _RAFT_STATE
from pysyncobj.transport import TCPTransport
from pysyncobj.version import VERSION as SYNCOBJ_VERSION

from metadata_quorum.raft_journal import JournalWriteError, RaftJournal, is_disk_full
from metadata_quorum.raft_tls import RaftPeers, RaftTls, RaftTlsFiles, TlsConnection, load_contexts
from raftlog.checkpoint import fsync_path, write_atomically

logger = logging.getLogger(__name__)

JOURNAL_FILE = "raft.journal"
SNAPSHOT_FILE = "raft.snapshot"
LOCK_FILE = "raft.lock"

_ADDRESS = re.compile(r"^[A-Za-z0-9.\-]+:\d{1,5}$")
_TERM_BYTES = 8
_APPEND_BATCH_BYTES = 64 * 1024  # per append_entries message (larger: slower, measured)
_SOCKET_BUFFER_BYTES = 1024 * 1024
_BIND_RETRY_S = 0.1
_BIND_ATTEMPTS = 20
_NOTIFIER_POLL_S = 0.05
_JOIN_TIMEOUT_S = 5.0
_CLOSE_TIMEOUT_S = 30.0  # for the tick thread's last tick (an fsync on a slow disk) and close
_TICK_TASKS_MAX = 16
_LOG_MESSAGES = frozenset({"append_entries", "next_node_idx"})
_META_MESSAGES = _LOG_MESSAGES | {"request_vote", "response_vote"}

# pysyncobj's journal layout (journal.py): name 24 bytes, version 8, format u32, end offset u32,
# then records [u32 size][u64 index][u64 term][command][u32 size].
_JOURNAL_MAGIC = b"PYSYNCOBJ"
_JOURNAL_END_POS = 36
_JOURNAL_HEADER_BYTES = 40

_SNAPSHOT_MAGIC_V1 = b"RLMQSNP1"  # read only: written before the voter set was kept
_SNAPSHOT_HEAD_V1 = struct.Struct(">8sQQQQIIQ")  # magic, last idx/term, prev idx/term, 3 lengths
_SNAPSHOT_MAGIC = b"RLMQSNP2"
_SNAPSHOT_HEAD = struct.Struct(">8sQQQQIIQI")  # v1's fields, then the voters' length
BOOTSTRAP_FILE = "raft.bootstrap"  # the voter set this node's log started from (one per line)
_MEMBERSHIP_COMMAND = 2  # pysyncobj's _COMMAND_TYPE.MEMBERSHIP: b"\x02" + pickle([op, id, node])
_MEMBERSHIP_BYTE = bytes([_MEMBERSHIP_COMMAND])
_CRC = struct.Struct(">I")
SECRET_BYTES_MIN = 16
_REFUSAL_LOG_INTERVAL_S = 10.0  # a refused peer is logged once per interval, with a count
_REFUSED_PEERS_MAX = 1024


# -- configuration -------------------------------------------------------------------------


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise ValueError(f"invalid Raft configuration: {what}")


@dataclass(frozen=True)
class RaftTiming:
    """Time knobs, in seconds. Defaults suit a loopback cluster and fail over in about 1 s.

    Appends do not wait for a period: each one wakes the tick thread and goes out at once
    (pysyncobj's ``appendEntriesUseBatch=False``). The periods only pace the leader's heartbeats
    and the timers, so they can be long: at 1 ms ticks and 10 ms heartbeats an idle node spent
    8% of a core in the tick thread, at 50 ms 3%."""

    election_min_s: float = 0.3
    election_max_s: float = 0.6
    append_period_s: float = 0.05  # heartbeat period of the leader
    tick_period_s: float = 0.05  # longest poll of pysyncobj's tick thread: timers' resolution
    connection_timeout_s: float = 2.0  # silence after which a peer connection is dropped
    connection_retry_s: float = 0.2
    leader_fallback_s: float = 1.5  # a leader without a majority's answers steps down
    commit_timeout_s: float = 5.0  # an append not applied by then fails with CommitTimeoutError
    compaction_interval_s: float = 300.0  # compact at least this often when entries were added

    def __post_init__(self) -> None:
        _check(0 < self.tick_period_s <= self.append_period_s <= 1.0, "tick <= append period")
        _check(self.election_min_s > 3 * self.append_period_s, "election_min > 3 append periods")
        _check(self.election_min_s < self.election_max_s <= 10.0, "election_min < max <= 10 s")
        _check(self.election_max_s <= self.connection_timeout_s <= 60.0, "connection timeout")
        _check(0 < self.connection_retry_s <= 10.0, "connection_retry_s in (0, 10]")
        _check(self.election_max_s <= self.leader_fallback_s <= 60.0, "leader_fallback_s")
        _check(0 < self.commit_timeout_s <= 300.0, "commit_timeout_s in (0, 300]")
        _check(0 < self.compaction_interval_s <= 86_400.0, "compaction_interval_s")

    @classmethod
    def for_election_timeout(cls, election_max_s: float) -> RaftTiming:
        """controller.quorum.election.timeout.ms as the longest election timeout, the shortest
        half of it; heartbeats at most every 50 ms and at least four per shortest timeout; the
        connection timeout and the leader's fallback no shorter than an election timeout."""
        election_min_s = election_max_s / 2
        period_s = min(cls.append_period_s, election_min_s / 4)
        return cls(
            election_min_s=election_min_s,
            election_max_s=election_max_s,
            append_period_s=period_s,
            tick_period_s=period_s,
            connection_timeout_s=max(cls.connection_timeout_s, election_max_s),
            leader_fallback_s=max(cls.leader_fallback_s, election_max_s),
        )


@dataclass(frozen=True)
class RaftOptions:
    """Durability, size limits and the transport's security: a shared secret or TLS (see
    Encryption above), or neither (plaintext)."""

    fsync: bool = True  # make entries and votes durable before they are acknowledged
    max_journal_entries: int = 5_000  # compact (snapshot + cut the journal) beyond this
    max_in_flight_appends: int = 512  # deeper pipelines stall the tick thread (measured)
    max_payload_bytes: int = 1024 * 1024
    secret: bytes | None = field(default=None, repr=False)  # None: the transport is plaintext
    tls: RaftTlsFiles | None = None  # TLS 1.3, mutual certificates (raft_tls.py)
    tls_peers: RaftPeers = field(default_factory=RaftPeers)  # under TLS: who may be a peer

    def __post_init__(self) -> None:
        _check(2 <= self.max_journal_entries <= 10_000_000, "max_journal_entries")
        _check(1 <= self.max_in_flight_appends <= 1_000_000, "max_in_flight_appends")
        _check(1 <= self.max_payload_bytes <= 64 * 1024 * 1024, "max_payload_bytes")
        _check(
            self.secret is None or len(self.secret) >= SECRET_BYTES_MIN,
            f"the Raft secret is at least {SECRET_BYTES_MIN} bytes",
        )
        _check(self.secret is None or self.tls is None, "a Raft secret or TLS, not both")
        if self.tls is not None:
            load_contexts(self.tls, self.tls_peers)  # a bad keystore fails here, named


def read_raft_secret(path: Path) -> bytes:
    """The secret in ``path`` (controller.quorum.raft.secret.file), surrounding whitespace
    stripped. Every controller of a quorum must hold the same bytes."""
    try:
        secret = path.read_bytes().strip()
    except OSError as error:
        raise ValueError(f"controller.quorum.raft.secret.file {path}: {error}") from error
    if len(secret) < SECRET_BYTES_MIN:
        raise ValueError(
            f"controller.quorum.raft.secret.file {path}: the secret is {len(secret)} bytes, "
            f"fewer than {SECRET_BYTES_MIN}"
        )
    return secret


DEFAULT_TIMING = RaftTiming()
DEFAULT_OPTIONS = RaftOptions()


# -- public values and errors ----------------------------------------------------------------


@dataclass(frozen=True)
class VoterStatus:
    address: str
    match_index: int | None  # known on the leader only (its own: its last log index),
    # for a voter that confirmed an entry since the leader's election
    connected: bool  # this node has a live connection to it (itself: True)


@dataclass(frozen=True)
class QuorumStatus:
    self_address: str
    leader: str | None
    term: int
    commit_index: int
    last_applied: int
    has_quorum: bool  # this node is connected to a majority, itself included
    voters: tuple[VoterStatus, ...]
    storage_full: str | None = None  # the write error while this voter waits for disk space
    # this node has applied the commit index a leader told it (or is the leader): until then
    # its image is a replay under way, older than what was committed (Kafka's initial catch-up)
    caught_up: bool = True
    tick_gap_max_s: float = 0.0  # the longest time between two Raft ticks, last 10 s window


class MetadataLogError(Exception):
    """Base of the errors a MetadataLog reports."""


class NotLeaderError(MetadataLogError):
    """This node is not the (caught-up) leader, or the entry was dropped by a leader change;
    the entry is not and will not be committed. ``leader`` is the leader's address if known."""

    def __init__(self, leader: str | None) -> None:
        super().__init__(f"not the leader; leader is {leader or 'unknown'}")
        self.leader = leader


class CommitTimeoutError(MetadataLogError):
    """Not applied within ``commit_timeout_s``. The outcome is unknown: it may still commit."""


class TooManyInFlightError(MetadataLogError):
    """``max_in_flight_appends`` appends are already waiting for their commit."""


class LogClosedError(MetadataLogError):
    """The log was closed or stopped on a fatal error; pending appends have unknown outcome."""


class RaftStorageError(MetadataLogError):
    """The data directory is corrupt or in use by another process."""


class MembershipChangeError(MetadataLogError):
    """pysyncobj refused a membership change: another one is not yet committed, this leader
    has not committed an entry of its term yet, the address is already a voter (add) or is
    not one (remove), or it is this node (a leader does not remove itself)."""


class StateMachine(Protocol):
    def apply(self, payload: bytes, index: int) -> object:
        """Apply one committed entry; deterministic. The result goes to the appender's future.
        Raising hands the exception to that future; apply must then have changed nothing."""
        ...

    def snapshot(self) -> bytes:
        """The whole state, consistent with the last applied entry."""
        ...

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot."""
        ...

    def on_leader_change(self, leader: str | None, is_self: bool) -> None:
        """This node's view of the leader changed (may be a no-op)."""
        ...


# -- files ---------------------------------------------------------------------------------

_Entry = tuple[bytes, int, int]  # pysyncobj's log entry: (command, index, term)
_DISK_PROBE_INTERVAL_S = 1.0  # a voter whose disk is full tries to reserve space this often


def _open_journal(path: Path) -> RaftJournal:
    return RaftJournal(path, SYNCOBJ_VERSION.encode())


def _create_journal(journal_file: str | None) -> Any:
    """pysyncobj's journal factory, replaced: its mmap'ed ``FileJournal`` dies of SIGBUS on a
    full disk (raft_journal.py). pysyncobj takes no journal class in its configuration; it calls
    the ``createJournal`` its syncobj module imported, so that name is rebound, once, here (the
    only module that runs pysyncobj nodes)."""
    return MemoryJournal() if journal_file is None else _open_journal(Path(journal_file))


syncobj_module.createJournal = _create_journal


@dataclass(frozen=True)
class _Snapshot:
    last: _Entry  # the last applied entry
    prev: _Entry  # the one before it (pysyncobj keeps both)
    state: bytes
    voters: frozenset[str] | None  # the configuration as of ``last``; None in a v1 snapshot


def _encode_snapshot(snapshot: _Snapshot) -> bytes:
    last, prev = snapshot.last, snapshot.prev
    voters = "\n".join(sorted(snapshot.voters or ())).encode()
    lengths = (len(last[0]), len(prev[0]), len(snapshot.state), len(voters))
    head = _SNAPSHOT_HEAD.pack(_SNAPSHOT_MAGIC, *last[1:], *prev[1:], *lengths)
    body = b"".join((head, last[0], prev[0], voters, snapshot.state))
    return body + _CRC.pack(zlib.crc32(body))


def _decode_snapshot(blob: bytes, origin: str) -> _Snapshot:
    if len(blob) < _SNAPSHOT_HEAD_V1.size + _CRC.size:
        raise RaftStorageError(f"snapshot {origin} is truncated ({len(blob)} bytes)")
    body, (crc,) = blob[: -_CRC.size], _CRC.unpack(blob[-_CRC.size :])
    if zlib.crc32(body) != crc:
        raise RaftStorageError(f"snapshot {origin} fails its CRC")
    if body.startswith(_SNAPSHOT_MAGIC) and len(body) >= _SNAPSHOT_HEAD.size:
        *fields, voters_n = _SNAPSHOT_HEAD.unpack_from(body)
        start = _SNAPSHOT_HEAD.size
    else:
        fields, voters_n, start = (
            list(_SNAPSHOT_HEAD_V1.unpack_from(body)),
            0,
            _SNAPSHOT_HEAD_V1.size,
        )
    magic, last_i, last_t, prev_i, prev_t, last_n, prev_n, state_n = fields
    if magic not in (_SNAPSHOT_MAGIC, _SNAPSHOT_MAGIC_V1) or (
        start + last_n + prev_n + voters_n + state_n != len(body)
    ):
        raise RaftStorageError(f"snapshot {origin} has a bad header")
    last_cmd = body[start : start + last_n]
    prev_cmd = body[start + last_n : start + last_n + prev_n]
    voters_at = start + last_n + prev_n
    names = body[voters_at : voters_at + voters_n].decode()
    voters = frozenset(filter(None, names.split("\n"))) if magic == _SNAPSHOT_MAGIC else None
    state = body[voters_at + voters_n :]
    return _Snapshot((last_cmd, last_i, last_t), (prev_cmd, prev_i, prev_t), state, voters)


def _entry(raw: Any) -> _Entry:
    return bytes(raw[0]), int(raw[1]), int(raw[2])


def _journal_record(data: bytes, offset: int, end: int, prev: tuple[int, int] | None) -> int:
    """End offset of a valid record at ``offset``, or -1 if it is torn or out of sequence."""
    if offset + 4 > end:
        return -1
    size: int = struct.unpack_from("<I", data, offset)[0]
    stop = offset + 8 + size
    if size < 16 or stop > end or struct.unpack_from("<I", data, stop - 4)[0] != size:
        return -1
    index, term = struct.unpack_from("<QQ", data, offset + 4)
    if prev is not None and (index != prev[0] + 1 or term < prev[1]):
        return -1
    return stop


def scan_journal(data: bytes, origin: str) -> tuple[int, int, int]:
    """(whole records, the end of the last one, the header's declared end) of a journal's
    bytes: the records are read up to the first torn or out-of-sequence one. RaftStorageError
    if it is not a pysyncobj journal. Also the crash-consistency checker's view of the file
    (dataplane/tools/check_data.py)."""
    if len(data) < _JOURNAL_HEADER_BYTES or not data.startswith(_JOURNAL_MAGIC):
        raise RaftStorageError(f"{origin} is not a pysyncobj journal")
    (declared_end,) = struct.unpack_from("<I", data, _JOURNAL_END_POS)
    end = min(declared_end, len(data))
    offset, prev, records = _JOURNAL_HEADER_BYTES, None, 0
    while offset < end:
        stop = _journal_record(data, offset, end, prev)
        if stop < 0:
            break
        prev = cast(tuple[int, int], struct.unpack_from("<QQ", data, offset + 4))
        offset, records = stop, records + 1
    return records, offset, declared_end


def snapshot_last_index(blob: bytes, origin: str) -> int:
    """The last Raft index a snapshot file covers; RaftStorageError unless it decodes (CRC,
    header, lengths). For the crash-consistency checker (dataplane/tools/check_data.py)."""
    return _decode_snapshot(blob, origin).last[1]


def _repair_journal(path: Path, fsync: bool) -> None:
    """Cut the journal at its first torn or out-of-sequence record. Only a record written after
    the last journal sync can be damaged, and such a record was never acknowledged."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    records, offset, declared_end = scan_journal(data, str(path))
    if offset == declared_end:
        return
    logger.warning(
        "%s: cutting the journal after %d records at byte %d (declared end %d)",
        path,
        records,
        offset,
        declared_end,
    )
    with path.open("r+b") as file:
        file.seek(_JOURNAL_END_POS)
        file.write(struct.pack("<I", offset))
        file.flush()
        if fsync:
            os.fsync(file.fileno())


def _finish_compaction(path: Path, snapshot: _Snapshot) -> None:
    """If a crash hit between the snapshot's rename and the journal rewrite, drop the journal
    entries the snapshot covers, as pysyncobj would have; it would otherwise see a mismatch,
    clear the journal and lose the entries after the snapshot."""
    if not path.exists():
        return
    journal = _open_journal(path)
    try:
        if len(journal) < 2:
            return
        skip = snapshot.prev[1] - journal[0][1]
        if skip <= 0 or skip + 1 >= len(journal):
            return
        if journal[skip] != snapshot.prev or journal[skip + 1] != snapshot.last:
            return
        logger.warning("%s: finishing an interrupted compaction (%d entries)", path, skip)
        journal.deleteEntriesTo(skip)
    finally:
        journal._destroy()  # fdatasyncs and closes


# -- membership (pysyncobj's dynamic membership change) ---------------------------------------


def _membership_change(command: bytes) -> tuple[str, str] | None:
    """("add" | "rem", address) of a pysyncobj membership entry, None for any other entry."""
    if not command or command[0] != _MEMBERSHIP_COMMAND:
        return None
    operation, address = syncobj_pickle.loads(command[1:])[:2]
    return str(operation), str(address)


def _replay_membership(
    voters: frozenset[str], commands: Sequence[bytes], self_address: str, reverse: bool = False
) -> frozenset[str]:
    """The configuration after (or, ``reverse``, before) the membership entries among
    ``commands``, as pysyncobj applies them: this node never adds or removes itself."""
    out = set(voters)
    for command in reversed(commands) if reverse else commands:
        change = _membership_change(command)
        if change is None or change[1] == self_address:
            continue
        if (change[0] == "add") != reverse:
            out.add(change[1])
        else:
            out.discard(change[1])
    return frozenset(out)


def _bootstrap_voters(data_dir: Path, configured: Sequence[str], fsync: bool) -> frozenset[str]:
    """The voter set this node's log started from: written once, when the directory holds no
    log yet, and read back on every later start, so a restarted node rebuilds its configuration
    from its own files (snapshot, journal), never from a configuration file edited since."""
    path = data_dir / BOOTSTRAP_FILE
    if path.exists():
        return frozenset(filter(None, path.read_text().split("\n")))
    if (data_dir / JOURNAL_FILE).exists() or (data_dir / SNAPSHOT_FILE).exists():
        return frozenset(configured)  # a directory written before the bootstrap file existed
    write_atomically(path, ("\n".join(sorted(configured)) + "\n").encode(), durable=fsync)
    return frozenset(configured)


def _latest_voters(
    path: Path, base: frozenset[str], after_index: int, self_address: str
) -> frozenset[str]:
    """``base`` (the configuration at ``after_index``) changed by every membership entry of the
    journal after that index, committed or not: Raft's rule, a node uses the latest
    configuration in its log."""
    if not path.exists():
        return base
    journal = _open_journal(path)
    try:
        commands = [bytes(entry[0]) for entry in journal[:] if entry[1] > after_index]
    finally:
        journal._destroy()
    return _replay_membership(base, commands, self_address)


def log_exists(data_dir: Path) -> bool:
    """Whether ``data_dir`` already holds a log, whose voter set then outranks any given."""
    return any((data_dir / name).exists() for name in (BOOTSTRAP_FILE, JOURNAL_FILE, SNAPSHOT_FILE))


def _lock_directory(data_dir: Path) -> int:
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as error:
        os.close(fd)
        raise RaftStorageError(f"{data_dir} is in use by another MetadataLog") from error
    return fd


class _SnapshotStore:
    """pysyncobj's serializer / serializeChecker / deserializer hooks, run on its tick thread.

    pysyncobj calls ``serialize(tmp, (last, prev, cluster))`` then renames tmp over the snapshot
    file itself; ``check`` reports the outcome on the next tick, before the journal is cut.

    The voter set is part of the snapshot. pysyncobj's ``cluster`` is not stored: it is the
    configuration of the whole log (membership entries count from the moment they are
    appended), not of the snapshot's last entry; ``node.voters_at(last index)`` is. Loading
    returns ``node.voters_loaded(snapshot)`` as the cluster (pysyncobj replaces its partners
    with it; an empty set, as before, would drop every partner)."""

    def __init__(
        self, path: Path, node: _RaftNode, fsync: bool, on_fatal: Callable[[str], None]
    ) -> None:
        self._path = path
        self._node = node
        self._state_machine = node._state_machine
        self._fsync = fsync
        self._on_fatal = on_fatal
        self._written_inode: int | None = None  # set by serialize, consumed by check
        self._failed = False

    def serialize(self, tmp_name: str, data: tuple[Any, ...]) -> None:
        last, prev = _entry(data[0]), _entry(data[1])
        try:
            voters = self._node.voters_at(last[1])
            state = self._state_machine.snapshot()
            blob = _encode_snapshot(_Snapshot(last, prev, state, voters))
            with open(tmp_name, "wb") as file:
                file.write(blob)
                file.flush()
                if self._fsync:
                    os.fsync(file.fileno())
                self._written_inode = os.fstat(file.fileno()).st_ino
        except Exception as error:
            self._failed = True
            Path(tmp_name).unlink(missing_ok=True)  # the old snapshot and the journal stay
            if is_disk_full(error):
                logger.warning("snapshot at index %d not written: %s; the journal stays uncut "
                               "until a later compaction succeeds", last[1], error)  # fmt: skip
            else:
                logger.exception("writing the snapshot at index %d failed", last[1])
            raise

    def check(self) -> int:
        if self._failed:
            self._failed = False
            return cast(int, SERIALIZER_STATE.FAILED)
        if self._written_inode is None:
            return cast(int, SERIALIZER_STATE.NOT_SERIALIZING)
        inode, self._written_inode = self._written_inode, None
        try:
            if os.stat(self._path).st_ino != inode:  # pysyncobj's rename did not happen
                raise OSError(f"the snapshot file {self._path} was not replaced")
            if self._fsync:
                fsync_path(self._path.parent)  # the rename is durable before the journal is cut
        except OSError:
            logger.exception("the snapshot is not in place; the journal stays uncut")
            return cast(int, SERIALIZER_STATE.FAILED)
        return cast(int, SERIALIZER_STATE.SUCCESS)

    def deserialize(self, name: str) -> tuple[_Entry, _Entry, list[str]]:
        """pysyncobj swallows any exception raised here and carries on (acknowledging an
        installed snapshot it did not load): a failure stops the node instead."""
        try:
            path = Path(name)
            snapshot = _decode_snapshot(path.read_bytes(), name)
            if self._fsync:  # an installed snapshot is durable before the journal is cleared
                fsync_path(path)
                fsync_path(path.parent)
            self._state_machine.restore(snapshot.state)
            partners = self._node.voters_loaded(snapshot)
        except Exception as error:
            self._on_fatal(f"cannot load the snapshot {name}: {error!r}")
            raise
        return snapshot.last, snapshot.prev, partners


# -- the pysyncobj node ----------------------------------------------------------------------


class _FencedEntry:
    """Result of an entry proposed in another term than it was logged in: skipped."""


_FENCED = _FencedEntry()


@dataclass(frozen=True)
class _ApplyFailure:
    error: Exception


class _NodeStopped(Exception):
    pass


class _PeerEncryptor:
    """pysyncobj's Fernet encryptor for one connection. pysyncobj drops a connection whose
    message does not decrypt without a word; this says who was refused (rate-limited)."""

    def __init__(self, fernet: Any, peer: str, on_refused: Callable[[str], None]) -> None:
        self._fernet = fernet
        self._peer = peer
        self._on_refused = on_refused

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        return cast(bytes, self._fernet.encrypt_at_time(data, current_time))

    def extract_timestamp(self, token: bytes) -> int:  # verifies the HMAC first
        try:
            return cast(int, self._fernet.extract_timestamp(token))
        except InvalidToken:
            self._on_refused(self._peer)
            raise

    def decrypt(self, token: bytes) -> bytes:
        try:
            return cast(bytes, self._fernet.decrypt(token))
        except InvalidToken:
            self._on_refused(self._peer)
            raise


class _RaftTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCP transport with the node's hooks around every message sent or received,
    and, when the quorum has a secret, a `_PeerEncryptor` on every connection; with TLS, every
    connection is a `TlsConnection` and an incoming one must name a voter its certificate
    names."""

    def __init__(self, syncobj: Any, *args: Any, **kwargs: Any) -> None:
        # peer host -> (when last logged, refusals since), at most _REFUSED_PEERS_MAX hosts
        self._refusals: dict[str, tuple[float, int]] = {}
        files, peers = syncobj.tls_files, syncobj.tls_peers
        self._tls = RaftTls(files, self._refused, peers) if files is not None else None
        super().__init__(syncobj, *args, **kwargs)

    def _tls_connection(self, peer: str, sock: socket.socket | None) -> TlsConnection:
        assert self._tls is not None
        conf = self._syncObj.conf
        return TlsConnection(
            self._tls, peer, poller=self._syncObj._poller, socket=sock,
            timeout=conf.connectionTimeout, sendBufferSize=conf.sendBufferSize,
            recvBufferSize=conf.recvBufferSize,
            keepalive=None if sock is not None else conf.tcp_keepalive,  # as pysyncobj's
        )  # fmt: skip

    def _onNewIncomingConnection(self, conn: Any) -> None:
        if self._tls is not None:  # the accepted socket, under TLS from its first byte
            sock = conn._TcpConnection__socket
            conn = self._tls_connection(_peer_name(sock), sock)
        super()._onNewIncomingConnection(conn)
        if conn.encryptor is not None:
            peer = _peer_name(conn._TcpConnection__socket)
            conn.encryptor = _PeerEncryptor(conn.encryptor, peer, self._refused)

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        """Under TLS the first message must name a voter, and the peer's certificate must name
        that voter's host: pysyncobj's utility messages and read-only nodes are refused."""
        if isinstance(conn, TlsConnection):
            named = isinstance(message, str) and message in self._nodeAddrToNode
            if not named or not conn.certifies(message):
                claim = repr(str(message)[:64])
                why = "its certificate does not name " if named else "it names no voter: "
                self._refused(conn.peer, why + claim)
                conn.disconnect()
                self._unknownConnections.discard(conn)
                return
        super()._onIncomingMessageReceived(conn, message)

    def addNode(self, node: Any) -> None:
        super().addNode(node)
        conn = self._connections.get(node)
        if conn is not None and self._tls is not None:  # replace pysyncobj's, never connected
            conn = self._tls_connection(str(node.address), None)
            conn.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, conn))
            conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
            self._connections[node] = conn
        if conn is not None and conn.encryptor is not None:
            conn.encryptor = _PeerEncryptor(conn.encryptor, str(node.address), self._refused)

    def _refused(self, peer: str, reason: str = "not encrypted with this quorum's secret") -> None:
        """A message that does not decrypt with this quorum's secret (a controller with
        another secret or none, or not a controller at all), or a TLS handshake or identity
        that fails. pysyncobj, or `TlsConnection`, drops the connection."""
        host = peer.rsplit(":", 1)[0]
        now = time.monotonic()
        logged_at, count = self._refusals.get(host, (float("-inf"), 0))
        count += 1
        if now - logged_at >= _REFUSAL_LOG_INTERVAL_S:
            logger.warning(
                "raft %s refused a connection from %s: %s (%d refused from %s since the "
                "last report)", self._selfNode, peer, reason, count, host,
            )  # fmt: skip
            logged_at, count = now, 0
        if len(self._refusals) >= _REFUSED_PEERS_MAX and host not in self._refusals:
            self._refusals.clear()  # bounded: forget old peers rather than grow
        self._refusals[host] = (logged_at, count)

    def send(self, node: Any, message: Any) -> bool:
        if not self._syncObj.before_send(message):
            return False
        return bool(super().send(node, message))

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        """A voter whose disk is full reads nothing (it is as if cut off: no term moves, no
        entry is taken); a write failing while a message is handled stops it serving here,
        so the connection's later messages are still read."""
        if self._syncObj.storage_full is not None:
            return
        if self._syncObj.election_message(node, message):
            return  # a pre-vote, or a vote request a voter that hears its leader ignores
        next_index = self._syncObj.before_receive(node, message)
        try:
            super()._onMessageReceived(node, message)
        except OSError as error:
            if not self._syncObj.on_storage_error(error):
                raise
            return
        self._syncObj.after_receive(node, next_index)


_PRE_VOTE = "pre_vote"
_PRE_VOTE_RESPONSE = "pre_vote_response"
_LATER_TERM = "later_term"  # to a leader whose append came from an older term than ours


class _PreVote:
    """A voter's pre-vote bookkeeping (Raft thesis §9.6; Kafka's KIP-996), tick thread only.

    pysyncobj 0.3.17 has no pre-vote: a voter whose election timer runs out raises its term
    and asks for votes at once, and a leader that sees a later term steps down. A voter that
    cannot hear the leader while the others can (cut off from it alone, or its tick starved
    of CPU by a broker opening thousands of partitions) so unseated a healthy leader every
    election timeout (docs/performance.md#metadata-scale-history). Here it first asks
    whether a majority would vote for it, which they refuse while they hear the leader; its
    term moves only once they would."""

    def __init__(self, election_min_s: float) -> None:
        self._min_s = election_min_s
        self._heard_at = float("-inf")  # when an append_entries of the current term came
        self._term = -1  # the term the round asks about
        self._granted: set[str] = set()
        self._won_at: float | None = None
        self.rounds = 0  # rounds started since the leader was last heard
        self.transfer = False  # this tick's election was asked for by the leader

    def heard_leader(self, now: float) -> None:
        self._heard_at = now
        self.rounds = 0

    def heard_within(self, now: float) -> bool:
        return now - self._heard_at < self._min_s

    def start(self, term: int) -> int:
        self._term, self._granted, self._won_at = term, set(), None
        self.rounds += 1
        return self.rounds

    def granted(self, term: Any, voter: str, next_term: int, majority: int, now: float) -> bool:
        """Count a grant; True when it completes a majority (this voter's own vote included)
        of the round that asks about ``next_term`` (a round overtaken by a term change is
        void)."""
        if term != self._term or term != next_term or self._won_at is not None:
            return False
        self._granted.add(voter)
        if len(self._granted) + 1 < majority:
            return False
        self._won_at = now
        return True

    def won(self, term: int, now: float) -> bool:
        """The round about ``term`` reached a majority moments ago (its election runs now);
        used once."""
        won_at, self._won_at = self._won_at, None
        return won_at is not None and term == self._term and now - won_at < self._min_s

    def worth_logging(self) -> bool:
        """Rounds 1, 2, 4, 8, ... since the leader was last heard: a voter cut off for long
        says so without a line per election timeout."""
        return self.rounds & (self.rounds - 1) == 0


class _TickWatch:
    """How far apart this node's Raft ticks run (tick thread only; ``longest_s`` is read by
    any thread). A leader sends its heartbeats from the tick, every append period, and a
    follower that hears none for the shortest election timeout asks to stand (`_PreVote`): a
    tick that comes that late, on the leader, lets both followers ask at once, and they elect
    one of them. What delays a tick is rarely its own work: the thread waits for the CPU and,
    after each of its system calls, for the GIL behind the process's busy threads
    (docs/operations.md#many-partitions). Gaps longer than the shortest election timeout are
    logged, once per window, with how much of the longest the tick before it spent applying
    entries; the longest gap of the last window is a gauge."""

    WINDOW_S = 10.0

    def __init__(self, election_min_s: float, self_address: str) -> None:
        self._limit_s = election_min_s
        self._address = self_address
        self._started: float | None = None
        self._window_start = float("-inf")
        self._window_longest = (0.0, 0.0)  # (gap, applying in the tick before it)
        self._late = 0  # gaps over the limit in the window
        self.applying_s = 0.0  # of the tick under way (`_RaftNode._apply_entry` adds)
        self.longest_s = 0.0  # the longest gap of the last whole window

    def tick(self, now: float) -> None:
        """A tick starts."""
        if self._started is not None:
            gap = now - self._started
            if gap > self._window_longest[0]:
                self._window_longest = (gap, self.applying_s)
            if gap > self._limit_s:
                self._late += 1
        self._started, self.applying_s = now, 0.0
        if now - self._window_start < self.WINDOW_S:
            return
        gap, applying = self._window_longest
        self.longest_s = gap
        if self._late:
            logger.warning(
                "raft %s: %d ticks came more than %.0f ms after the one before in the last "
                "%.0f s, the longest %.0f ms after (%.0f ms of it applying entries); a follower "
                "that hears no heartbeat for %.0f ms asks to stand for election: this process "
                "is short of CPU or of the GIL", self._address, self._late, self._limit_s * 1000,
                self.WINDOW_S, gap * 1000, applying * 1000, self._limit_s * 1000,
            )  # fmt: skip
        self._window_start, self._window_longest, self._late = now, (0.0, 0.0), 0


class _RaftNode(SyncObj):  # type: ignore[misc]
    """The SyncObj. Its attributes are pysyncobj's state only; the application state lives in
    the state machine, reached through ``_state_machine`` and never pickled (the custom
    serializer replaces pysyncobj's pickling of ``__dict__``).

    Reads of pysyncobj internals (name-mangled ``_SyncObj__*``) happen on the tick thread only,
    except ``_SyncObj__raftMatchIndex.get`` (one atomic dict read) in ``match_index``."""

    _SyncObj__raftElectionDeadline: float  # pysyncobj's, monotonic: a follower's next election

    def __init__(
        self,
        self_address: str,
        partners: list[str],
        data_dir: Path,
        state_machine: StateMachine,
        settings: tuple[RaftTiming, RaftOptions],
        on_view_change: Callable[[], None],
    ) -> None:
        # Set before SyncObj.__init__, whose tick thread may already apply entries.
        timing, options = settings
        self._state_machine = state_machine
        self._fsync = options.fsync
        self._meta_path = data_dir / (JOURNAL_FILE + ".meta")
        self._journal_mark: tuple[int, ...] | None = None
        self._meta_mark: tuple[object, ...] | None = None
        self._on_view_change = on_view_change
        self.tls_files = options.tls  # read by _RaftTransport, which SyncObj.__init__ builds
        self.tls_peers = options.tls_peers
        self.view: tuple[str | None, bool] = (None, False)  # (leader, self is ready leader)
        self.log_end = 0
        self.fatal: str | None = None
        self.storage_full: str | None = None  # the error, while this voter waits for space
        self._full_since = 0.0
        self._probe_at = 0.0
        self._snapshot_path = data_dir / SNAPSHOT_FILE
        self._election = _PreVote(timing.election_min_s)
        self.ticks = _TickWatch(timing.election_min_s, self_address)
        self.voters: frozenset[str] = frozenset((self_address, *partners))  # latest config
        self._tick_tasks: collections.deque[Callable[[], None]] = collections.deque(
            maxlen=_TICK_TASKS_MAX
        )
        store = _SnapshotStore(data_dir / SNAPSHOT_FILE, self, options.fsync, self.stop)
        conf = _syncobj_conf(self_address, timing, options, data_dir, store)
        super().__init__(self_address, partners, conf, transportClass=_RaftTransport)
        # pysyncobj stops ticking once the thread that built it ends; tie it to the interpreter.
        self._SyncObj__mainThread = threading.main_thread()
        self.tick_thread = cast(threading.Thread, self._SyncObj__thread)
        journal = self._SyncObj__raftLog
        if isinstance(journal, RaftJournal):  # it syncs meta rewrites until told otherwise
            journal.sync_meta = options.fsync
        # Membership changes only through MetadataLog (the controller mirrors them in its
        # metadata), never through pysyncobj's unauthenticated admin messages on the Raft port.
        transport = self._SyncObj__transport
        for command in ("add", "remove"):
            transport.setOnUtilityMessageCallback(command, _deny_utility_command)
        self.addOnTickCallback(self._publish_view)

    def _SyncObj__doApplyCommand(self, command: bytes) -> object:  # overrides a private method
        """pysyncobj applies a membership entry twice: when it is appended (Raft's rule) and
        again when it is applied, "for a restart". The second time re-adds a node that a later
        entry already removed, until that entry is applied too. Here a configuration is rebuilt
        at start from the snapshot and the journal (`_latest_voters`), so the apply-time change
        is skipped; the entry still resolves the proposer's callback.

        A voter alone sends nothing, so ``before_send`` never makes its journal durable, and
        it commits an entry as soon as it appends it: before it applies one (and so resolves
        its proposer's future) the journal is synced here, or an acknowledged entry of a
        one-voter quorum would not survive a power cut (tests/metadata_quorum/
        test_raft_power_loss.py found it). With partners the sync before sending did it."""
        if self._fsync and not self.otherNodes:
            try:
                self._sync_journal()
            except OSError as error:
                self.stop(f"fsync failed: {error}")
                raise
        if _membership_change(command) is not None:
            return None
        return SyncObj._SyncObj__doApplyCommand(self, command)

    def membership_pending(self) -> bool:
        """A membership entry in the log is not applied yet (tick thread)."""
        journal = self._SyncObj__raftLog
        unapplied = journal[max(0, self.raftLastApplied - journal[0][1] + 1) :]
        return any(bytes(entry[0][:1]) == _MEMBERSHIP_BYTE for entry in unapplied)

    def voters_at(self, index: int) -> frozenset[str]:
        """The configuration as of log ``index`` (tick thread): the latest one with the
        membership entries after ``index`` undone."""
        current = frozenset(str(node.id) for node in self.otherNodes) | {self.selfNode.id}
        journal = self._SyncObj__raftLog
        later = [bytes(e[0]) for e in journal[max(0, index - journal[0][1] + 1) :]]
        return _replay_membership(current, later, self.selfNode.id, reverse=True)

    def voters_loaded(self, snapshot: _Snapshot) -> list[str]:
        """The partners pysyncobj takes on loading ``snapshot`` (tick thread). At start with
        the journal kept, the latest configuration, computed before pysyncobj started; an
        installed snapshot (or a journal pysyncobj clears) leaves the snapshot's own."""
        journal = self._SyncObj__raftLog
        restart = bool(self._SyncObj__needLoadDumpFile)
        kept = len(journal) >= 2 and journal[0] == snapshot.prev and journal[1] == snapshot.last
        if snapshot.voters is None or (restart and kept):
            voters = frozenset(str(node.id) for node in self.otherNodes)
        else:
            voters = snapshot.voters
        return sorted(v for v in voters if v != self.selfNode.id)

    @replicated  # type: ignore[misc, untyped-decorator, unused-ignore]
    def _replicate(self, command: bytes) -> object:
        return self._apply_entry(command)

    def _apply_entry(self, command: bytes) -> object:
        if self.fatal is not None:
            raise _NodeStopped(self.fatal)
        index = self.raftLastApplied + 1
        journal = self._SyncObj__raftLog
        entry = journal[index - journal[0][1]]
        if entry[1] != index:
            self.stop(f"invariant broken: applying index {index} found entry {entry[1]}")
            raise _NodeStopped(self.fatal)
        if entry[2] != int.from_bytes(command[:_TERM_BYTES], "big"):
            return _FENCED
        started = time.monotonic()
        try:
            return self._state_machine.apply(command[_TERM_BYTES:], index)
        except Exception as error:
            logger.exception("the state machine failed to apply entry %d", index)
            return _ApplyFailure(error)
        finally:
            self.ticks.applying_s += time.monotonic() - started

    def _publish_view(self) -> None:
        while self._tick_tasks:
            self._tick_tasks.popleft()()
        voters = frozenset(str(node.id) for node in self.otherNodes) | {self.selfNode.id}
        if voters != self.voters:
            self.voters = voters
        self.log_end = self._SyncObj__raftLog[-1][1]
        noop = self._SyncObj__noopIDx
        ready = bool(self._isLeader() and noop is not None and self.raftLastApplied >= noop)
        node = self._getLeader()
        leader = None if node is None or (node == self.selfNode and not ready) else str(node.id)
        if (leader, ready) != self.view:
            self.view = (leader, ready)
            self._on_view_change()

    def before_receive(self, node: Any, message: Any) -> int | None:
        """Work around pysyncobj's pipelining (tick thread). On every successful ack its leader
        sets ``nextIndex = ack + 1`` although later batches are already on the wire, so it sends
        entries again; its follower then truncates everything after ``prevLogIdx`` and re-adds
        the resent batch, which can retract entries it had acknowledged and applied. Returns the
        leader's ``nextIndex`` to restore after an ack; trims duplicates off an append."""
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "append_entries":
            self._reassemble(message)
            self._trim_duplicates(message)
        elif kind == "next_node_idx" and message["success"] and not message["reset"]:
            return cast(int | None, self._SyncObj__raftNextIndex.get(node))
        return None

    def after_receive(self, node: Any, next_index: int | None) -> None:
        indexes = self._SyncObj__raftNextIndex
        if (
            next_index is not None
            and self._isLeader()
            and indexes.get(node, next_index) < next_index
        ):
            indexes[node] = next_index  # an ack never moves nextIndex back; a reset still does

    def _reassemble(self, message: dict[str, Any]) -> None:
        """The pieces of an entry larger than an append message: pysyncobj's leader marks a
        piece ``finish`` once it reaches the command's length, but it sends the pickled entry,
        which is longer (protocol 2 stores bytes as latin-1 text: ~1.5x), so the pieces past
        the command's length are all marked ``finish``. Its follower unpickled each: the
        truncated ones raised out of the tick (``failed _onTick``, the rest of the tick's
        messages left for the next), after a second, pure-Python try over the whole buffer.
        Here a ``finish`` whose pieces do not yet make an entry is an ordinary piece, and the
        whole one becomes a plain append of that entry (what pysyncobj makes of it)."""
        if message.get("transmission") != "finish":
            return
        if message["term"] < self._SyncObj__raftCurrentTerm:
            return  # a deposed leader's: pysyncobj ignores it, and the buffer is the new one's
        data = (vars(self).get("_SyncObj__recvTransmission") or b"") + message["data"]
        try:
            entry = pickle.loads(data)  # C only: the entry was pickled by this Python's pickle
        except (pickle.UnpicklingError, EOFError):
            message["transmission"] = "process"  # more pieces follow
            return
        self._SyncObj__recvTransmission = ""
        del message["transmission"], message["data"]
        message["entries"] = [entry]

    def _trim_duplicates(self, message: dict[str, Any]) -> None:
        """If this log ends with an entry of the sender's term, the whole log is a prefix of the
        sender's (Log Matching): entries it already holds are dropped and the message is made
        to continue from its end, so pysyncobj appends without truncating anything."""
        prev_index = message.get("prevLogIdx")
        if prev_index is None or "transmission" in message:
            return
        _, last_index, last_term = self._SyncObj__raftLog[-1]
        if last_term != message["term"] or prev_index >= last_index:
            return
        message["entries"] = [e for e in message.get("entries", ()) if e[1] > last_index]
        message["prevLogIdx"], message["prevLogTerm"] = last_index, last_term

    def before_send(self, message: Any) -> bool:
        """Runs on the tick thread before any message leaves: makes what it vouches for durable.
        False: the message must not leave (a membership change is never forwarded)."""
        if self.fatal is not None:
            raise _NodeStopped(self.fatal)
        if self.storage_full is not None:
            return False  # a voter waiting for space says nothing (see _stop_serving)
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "request_vote" and self._election.transfer:
            message["transfer"] = True  # the leader asked for this election (timeout_now)
        if kind == "apply_command" and _membership_change(message["command"]) is not None:
            self._refuse_forwarded(message)
            return False
        if not self._fsync or kind not in _META_MESSAGES:
            return True
        try:
            if kind in _LOG_MESSAGES:
                self._sync_journal()
            self._sync_meta()
        except OSError as error:
            self.stop(f"fsync failed: {error}")
            raise
        return True

    def _refuse_forwarded(self, message: dict[str, Any]) -> None:
        """pysyncobj forwards a command proposed on a node that is no longer the leader to
        the leader; a membership change was validated by this node as the leader, so it is
        dropped here and its proposer told NOT_LEADER."""
        waiting = self._SyncObj__commandsWaitingReply
        callback = waiting.pop(message.get("request_id"), None)
        if callback is not None:
            callback(None, FAIL_REASON.NOT_LEADER)

    def _sync_journal(self) -> None:
        journal = self._SyncObj__raftLog
        last = journal[-1]
        mark = (len(journal), journal[0][1], last[1], last[2])
        if mark != self._journal_mark:
            # fdatasync of the journal's file, not mmap.flush(): on Linux both write back the
            # pages dirtied through the shared mapping, but mmap.flush() holds the GIL for the
            # whole msync (3-6 ms here, freezing every other thread of the controller) while
            # os.fdatasync releases it.
            os.fdatasync(cast(RaftJournal, journal).fileno())
            self._journal_mark = mark

    def _sync_meta(self) -> None:
        journal = self._SyncObj__raftLog
        mark = (journal.getCurrentTerm(), journal.getVotedForNodeId())
        if mark != self._meta_mark and self._meta_path.exists():
            fsync_path(self._meta_path)
            fsync_path(self._meta_path.parent)
            self._meta_mark = mark

    # -- a full disk ---------------------------------------------------------------------------
    def _onTick(self, timeToWait: float = 0.0) -> None:
        """pysyncobj's tick, or, while the disk is full, `_tick_while_full`. A journal or meta
        write that fails in the tick (an append on the leader, a vote, the meta timer) leaves
        the journal as it was (raft_journal.py) and lands here."""
        self.ticks.tick(time.monotonic())
        if self.storage_full is not None:
            self._tick_while_full(timeToWait)
            return
        try:
            self._before_election()
            SyncObj._onTick(self, timeToWait)
        except OSError as error:
            if not self.on_storage_error(error):
                raise
        finally:
            self._election.transfer = False

    # -- pre-vote and leader stickiness --------------------------------------------------------
    def _before_election(self) -> None:
        """Runs before pysyncobj's tick, which starts an election (term + 1) as soon as this
        voter's election deadline passes. Unless a pre-vote round has just been won, or the
        leader handed its leadership over (``timeout_now``), the deadline is moved on and a
        pre-vote round asks the other voters instead: the election runs once a majority
        would vote for this voter (`election_message`)."""
        state = self._SyncObj__raftState
        if state == _RAFT_STATE.LEADER or self._SyncObj__selfNode is None or not self.otherNodes:
            return
        now = time.monotonic()
        if self._SyncObj__raftElectionDeadline >= now or not self._SyncObj__connectedToAnyone():
            return
        term = cast(int, self._SyncObj__raftCurrentTerm) + 1
        if self._SyncObj__transferInProgress:
            self._election.transfer = True  # its vote requests say so (stickiness yields)
            return
        if self._election.won(term, now):
            return  # pysyncobj's election, in this tick
        self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
        rounds = self._election.start(term)
        if self._election.worth_logging():
            logger.info(
                "raft %s: no leader heard; asking the voters whether they would elect it in "
                "term %d (pre-vote round %d)", self.selfNode, term, rounds,
            )  # fmt: skip
        request = {
            "type": _PRE_VOTE,
            "term": term,
            "last_log_index": self._SyncObj__getCurrentLogIndex(),
            "last_log_term": self._SyncObj__getCurrentLogTerm(),
        }
        for node in self.otherNodes:
            self._SyncObj__transport.send(node, dict(request))

    def election_message(self, node: Any, message: Any) -> bool:
        """A message about elections, on the tick thread before pysyncobj sees it. True: it is
        handled here (pysyncobj must not see it).

        - ``append_entries`` of the current term or a later one: the leader was heard.
        - A pre-vote request: answered, granted when this voter would vote for the sender in
          the term it names (a later term than this voter's, a log at least as up to date)
          and hears no leader (`_hears_leader`). Nothing changes here: no term, no vote.
        - A pre-vote answer of this voter's round: counted; with a majority the election
          deadline is set to now, so the next tick runs pysyncobj's election.
        - A vote request of a later term while this voter hears its leader: ignored (Raft
          §4.2.3), unless the leader handed its leadership to the sender (``transfer``). So
          a voter that lost touch with the leader alone cannot unseat it by its term.

        Terms still only move up, and a voter at a later term than the others is brought
        back, as etcd's raft and Kafka's KIP-996 do. A voter can get there: it wins a
        pre-vote round while the others briefly miss the leader, raises its term, and by the
        time its vote requests arrive they hear the leader again and ignore them. pysyncobj's
        follower then ignores the leader's appends (an older term) and its leader learns of
        later terms only from vote requests, so the voter stayed out of the quorum while that
        leader lived, and when it died, the voter with the later term and the older log and
        the one with the newer log and the older term refused each other's pre-votes for good
        (the 10,000-partition run of 2026-11-28 03:22: no controller for 80 s). Now:

        - an append of an older term is answered ``later_term`` with this voter's term, and a
          leader told of a later term steps down to it (a follower in that term), so the next
          election, among voters that hear no leader, runs in a term every voter can vote in;
        - a pre-vote answer carries the voter's term, and a refused candidate whose term is
          older takes it (a follower in it) before its next round."""
        kind = message.get("type") if isinstance(message, dict) else None
        current = cast(int, self._SyncObj__raftCurrentTerm)
        if kind == "append_entries":
            if message.get("term", -1) >= current:
                self._election.heard_leader(time.monotonic())
            elif self._SyncObj__selfNode is not None:
                self._SyncObj__transport.send(node, {"type": _LATER_TERM, "term": current})
            return False
        if kind == _LATER_TERM:
            self._take_later_term(message.get("term", -1), current, "a voter answered an append")
            return True
        if kind == "request_vote":
            stale = message.get("term", -1) > current and not message.get("transfer")
            return bool(stale and self._hears_leader())
        if kind == _PRE_VOTE:
            if self._SyncObj__selfNode is not None:
                self._SyncObj__transport.send(node, {
                    "type": _PRE_VOTE_RESPONSE,
                    "term": message["term"],
                    "granted": self._would_vote(message, current),
                    "voter_term": current,
                })  # fmt: skip
            return True
        if kind == _PRE_VOTE_RESPONSE:
            majority = (len(self.otherNodes) + 1) // 2 + 1
            if message.get("granted") and self._election.granted(
                message.get("term"), str(node.id), current + 1, majority, time.monotonic()
            ):
                self._SyncObj__raftElectionDeadline = 0.0
            elif not message.get("granted"):
                voter_term = message.get("voter_term", -1)
                self._take_later_term(voter_term, current, "a voter refused a pre-vote")
            return True
        return False

    def _take_later_term(self, term: Any, current: int, why: str) -> None:
        """Become a follower, without a leader or a vote, in ``term`` if it is later than
        ``current`` (pysyncobj's own step-down on a vote request of a later term)."""
        if not isinstance(term, int) or term <= current:
            return
        logger.info(
            "raft %s: %s in term %d; this voter was in %d", self.selfNode, why, term, current
        )
        self._SyncObj__setCurrentTerm(term, None)
        self._SyncObj__setState(_RAFT_STATE.FOLLOWER)
        self._SyncObj__raftLeader = None

    def _would_vote(self, message: dict[str, Any], current: int) -> bool:
        if message["term"] <= current or self._hears_leader():
            return False
        mine = (self._SyncObj__getCurrentLogTerm(), self._SyncObj__getCurrentLogIndex())
        return bool((message["last_log_term"], message["last_log_index"]) >= mine)

    def _hears_leader(self) -> bool:
        """This voter leads (pysyncobj steps a leader down once a majority is silent for the
        leader fallback time), or heard its leader within the shortest election timeout."""
        if self._isLeader():
            return True
        leader = self._SyncObj__raftLeader
        return leader is not None and self._election.heard_within(time.monotonic())

    def on_storage_error(self, error: OSError) -> bool:
        """A write failed on the tick thread: ENOSPC / EDQUOT stop this voter serving until
        space returns; any other journal error stops the node (as an fsync error does). False:
        not a storage error, the caller re-raises."""
        if is_disk_full(error):
            self._stop_serving(error)
            return True
        if isinstance(error, JournalWriteError):
            self.stop(f"the journal failed: {error}")
            return True
        return False

    def _stop_serving(self, error: OSError) -> None:
        """What a voter does when its metadata directory is full. It steps down if it leads,
        sends nothing, reads nothing and starts no election, so the others elect a leader and
        commit without it, and nothing it could not write is ever acknowledged; appends to it
        fail with NotLeaderError (retriable: NOT_CONTROLLER). Its log is as it was before the
        failed write. Every `_DISK_PROBE_INTERVAL_S` the tick tries to reserve space again."""
        now = time.monotonic()
        if self.storage_full is None:
            logger.error(
                "raft %s: the metadata log directory %s is full (%s): this voter stops voting, "
                "leading and acknowledging until space returns (tried every %.0f s)",
                self.selfNode, self._snapshot_path.parent, error, _DISK_PROBE_INTERVAL_S,
            )  # fmt: skip
            self._full_since = now
        self.storage_full = str(error)
        self._probe_at = now + _DISK_PROBE_INTERVAL_S
        self._SyncObj__setState(_RAFT_STATE.FOLLOWER)
        self._SyncObj__raftLeader = None
        self._SyncObj__onLeaderChanged()  # commands forwarded to a leader fail: LEADER_CHANGED
        # pysyncobj's half-received snapshot (it writes one beside ours) holds space; the
        # leader sends it again from its start once this voter answers again
        Path(f"{self._snapshot_path}.1.tmp").unlink(missing_ok=True)

    def _tick_while_full(self, wait_s: float) -> None:
        """No Raft work: the probe when due, then the tick callbacks (the transport keeps its
        connections, `_publish_view` runs) and the poll that waits for sockets."""
        if time.monotonic() >= self._probe_at and self._probe():
            return
        with self._SyncObj__onTickCallbacksLock:
            callbacks = list(self._SyncObj__onTickCallbacks)
        for callback in callbacks:
            callback()
        self._poller.poll(wait_s)

    def _probe(self) -> bool:
        """Serve again if a chunk of journal can be reserved and the meta file written (the
        term and vote of this node are then on disk again: a failed vote may have left them
        unsaved). The election timer restarts, so the leader is heard before any election."""
        self._probe_at = time.monotonic() + _DISK_PROBE_INTERVAL_S
        journal = cast(RaftJournal, self._SyncObj__raftLog)
        try:
            journal.reserve_headroom()
            journal.store_meta()
        except OSError as error:
            if not is_disk_full(error):
                self.stop(f"the journal failed: {error}")
            return False
        self._meta_mark = None  # a new meta file: fsynced again before the next vote leaves
        timeout_s = self._SyncObj__generateRaftTimeout()
        self._SyncObj__raftElectionDeadline = time.monotonic() + timeout_s
        self.storage_full = None
        logger.warning("raft %s: space returned after %.1f s: this voter serves again",
                       self.selfNode, time.monotonic() - self._full_since)  # fmt: skip
        return True

    def match_index(self, address: str) -> int | None:
        """The partner's match index as this leader knows it; None if it has confirmed nothing
        since this node became leader (pysyncobj then holds 0, and every log starts at 1)."""
        for node in self.otherNodes:
            if node.id == address:
                match = cast(int | None, self._SyncObj__raftMatchIndex.get(node))
                return match or None
        return None

    def is_connected(self, address: str) -> bool:
        return any(node.id == address and self.isNodeConnected(node) for node in self.otherNodes)

    def stop(self, reason: str) -> None:
        logger.critical("raft node %s stops: %s", self.selfNode, reason)
        self.fatal = reason
        self.destroy()


# -- the public log ----------------------------------------------------------------------------


class MetadataLog:
    """A voter of the metadata quorum, backed by pysyncobj. See the module docstring.

    ``voters`` lists the voters' "host:port" Raft addresses, with or without ``self_address``:
    the configuration a new log starts from; a ``data_dir`` that holds a log uses the latest
    one in it instead (see Membership above). ``data_dir`` holds this voter's files (created if
    missing, locked while open)."""

    def __init__(
        self,
        self_address: str,
        voters: Sequence[str],
        data_dir: Path,
        state_machine: StateMachine,
        timing: RaftTiming = DEFAULT_TIMING,
        options: RaftOptions = DEFAULT_OPTIONS,
    ) -> None:
        self._voters = _check_addresses(self_address, voters)
        self.self_address = self_address
        self._timing = timing
        self._options = options
        self._state_machine = state_machine
        self._lock = threading.Lock()
        self._pending: collections.OrderedDict[int, tuple[float, Future[object]]] = (
            collections.OrderedDict()
        )
        self._tokens = itertools.count()
        self._membership_token: int | None = None  # a membership change proposed, unresolved
        self._closed = False
        self._close_done = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()
        if not data_dir.exists():
            data_dir.mkdir(parents=True)
            if options.fsync:  # its name is durable before anything in it is acknowledged
                fsync_path(data_dir.parent)
        self._lock_fd = _lock_directory(data_dir)
        try:
            self._node = self._start_node(data_dir)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._notifier = threading.Thread(
            target=self._notifier_loop, name=f"raft-notifier-{self_address}", daemon=True
        )
        self._notifier.start()

    def _start_node(self, data_dir: Path) -> _RaftNode:
        journal_path, snapshot_path = data_dir / JOURNAL_FILE, data_dir / SNAPSHOT_FILE
        fsync = self._options.fsync
        _repair_journal(journal_path, fsync)
        if snapshot_path.exists():
            _finish_compaction(journal_path, _decode_snapshot(snapshot_path.read_bytes(), "file"))
        voters = self._persisted_voters(data_dir)
        partners = sorted(voter for voter in voters if voter != self.self_address)
        settings = (self._timing, self._options)
        node = _RaftNode(
            self.self_address, partners, data_dir, self._state_machine, settings, self._wake.set
        )
        try:
            node.waitBinded()  # bounded: _BIND_ATTEMPTS x _BIND_RETRY_S
        except Exception as error:
            node.destroy()
            raise OSError(f"cannot bind the Raft port {self.self_address}") from error
        if fsync:
            # the journal's header before its name: a power cut here must not leave a journal
            # that is there but empty, which no start accepts (test_raft_power_loss.py)
            os.fdatasync(cast(RaftJournal, node._SyncObj__raftLog).fileno())
            fsync_path(data_dir)  # the journal and lock files exist durably
        return node

    def _persisted_voters(self, data_dir: Path) -> frozenset[str]:
        """The latest configuration in this node's files: the snapshot's voter set (or the
        bootstrap set) changed by the journal's membership entries after it. The ``voters``
        given to the constructor count only for a directory that holds no log yet."""
        base = _bootstrap_voters(data_dir, self._voters, self._options.fsync)
        after_index = 0
        snapshot_path = data_dir / SNAPSHOT_FILE
        if snapshot_path.exists():
            snapshot = _decode_snapshot(snapshot_path.read_bytes(), "file")
            after_index = snapshot.last[1]
            base = snapshot.voters if snapshot.voters is not None else base
        voters = _latest_voters(data_dir / JOURNAL_FILE, base, after_index, self.self_address)
        if voters != frozenset(self._voters):
            logger.info("%s: voters from the log %s (configured: %s)", self.self_address,
                        sorted(voters), sorted(self._voters))  # fmt: skip
        return voters | {self.self_address}

    # -- writes ------------------------------------------------------------------------------
    def append(self, payload: bytes) -> Future[object]:
        """Propose one entry (leader only, pipelined). The future resolves on this node's apply
        of it: the state machine's result, or NotLeaderError / CommitTimeoutError /
        TooManyInFlightError / LogClosedError (or the exception ``apply`` raised)."""
        if len(payload) > self._options.max_payload_bytes:
            raise ValueError(f"payload of {len(payload)} bytes > {self._options.max_payload_bytes}")
        future: Future[object] = Future()
        future.set_running_or_notify_cancel()
        term = cast(int, self._node.raftCurrentTerm)
        leader, ready = self._node.view
        deadline = time.monotonic() + self._timing.commit_timeout_s
        error: MetadataLogError | None = None
        with self._lock:  # close() sets _closed under it, then fails what is pending
            if self._closed or self._node.fatal is not None:
                error = LogClosedError(self._node.fatal or "the log is closed")
            elif not ready:
                error = NotLeaderError(leader)
            elif len(self._pending) >= self._options.max_in_flight_appends:
                error = TooManyInFlightError(f"{len(self._pending)} appends in flight")
            else:
                token = next(self._tokens)
                self._pending[token] = (deadline, future)
        if error is not None:
            future.set_exception(error)
            return future
        command = term.to_bytes(_TERM_BYTES, "big") + payload
        self._node._replicate(command, callback=functools.partial(self._on_result, token))
        return future

    # -- membership --------------------------------------------------------------------------
    def add_voter(self, address: str) -> Future[object]:
        """Add a voter (leader only; one change at a time: refused while an earlier membership
        entry is not applied, a check pysyncobj 0.3.17 means to make but never does, its
        ``__changeClusterIDx`` being never set). The configuration changes on each
        node when the entry reaches its log; the future resolves (None) when it is applied
        here, or fails with MembershipChangeError / NotLeaderError / CommitTimeoutError."""
        return self._change_membership(address, self._node.addNodeToCluster)

    def remove_voter(self, address: str) -> Future[object]:
        """Remove a voter other than this node (leader only); see `add_voter`. The removed
        node is no longer sent entries and its connections are refused."""
        return self._change_membership(address, self._node.removeNodeFromCluster)

    def _change_membership(self, address: str, change: Callable[..., None]) -> Future[object]:
        _check_addresses(address, [address])
        future: Future[object] = Future()
        future.set_running_or_notify_cancel()
        leader, ready = self._node.view
        deadline = time.monotonic() + self._timing.commit_timeout_s
        with self._lock:
            if self._closed or self._node.fatal is not None:
                error: MetadataLogError | None = LogClosedError(self._node.fatal or "closed")
            elif not ready:
                error = NotLeaderError(leader)
            else:
                error, token = None, next(self._tokens)
                self._pending[token] = (deadline, future)
        if error is not None:
            future.set_exception(error)
            return future
        callback = functools.partial(self._on_result, token)

        def propose() -> None:  # on the tick thread, which reads the journal
            with self._lock:  # pysyncobj 0.3.17 never checks it itself (see add_voter)
                busy = self._membership_token is not None or self._node.membership_pending()
                if busy:
                    self._pending.pop(token, None)
                else:
                    self._membership_token = token
            if busy:
                message = "the previous membership change is not committed yet"
                future.set_exception(MembershipChangeError(message))
            else:
                change(address, callback=callback)

        self._node._tick_tasks.append(propose)
        return future

    def transfer_leadership(self, address: str | None = None) -> None:
        """Ask the leader to hand leadership to ``address`` (None: the most caught-up voter),
        best effort, on the tick thread: poll `leader()` for the outcome."""

        def transfer() -> None:
            if self._node.view[1]:
                self._node.transferLeadership(address)

        self._node._tick_tasks.append(transfer)
        self._wake.set()

    def voters(self) -> frozenset[str]:
        """This node's latest configuration (its own address included)."""
        return self._node.voters

    def _on_result(self, token: int, result: object, error: int) -> None:
        """pysyncobj's callback, on its tick thread."""
        with self._lock:
            entry = self._pending.pop(token, None)
            if token == self._membership_token:
                self._membership_token = None
        if entry is None:
            return  # already timed out or closed
        future = entry[1]
        if error == FAIL_REASON.SUCCESS and isinstance(result, _ApplyFailure):
            future.set_exception(result.error)
        elif error == FAIL_REASON.SUCCESS and result is not _FENCED:
            future.set_result(result)
        elif error == FAIL_REASON.QUEUE_FULL:
            future.set_exception(TooManyInFlightError("pysyncobj's command queue is full"))
        elif error == FAIL_REASON.REQUEST_DENIED:  # only membership changes are ever denied
            future.set_exception(MembershipChangeError("pysyncobj refused the change"))
        else:  # fenced, NOT_LEADER, LEADER_CHANGED, MISSING_LEADER, DISCARDED, ...
            future.set_exception(NotLeaderError(self._node.view[0]))

    def compact(self) -> None:
        """Ask for a compaction (snapshot + journal cut) on the next tick."""
        self._node.forceLogCompaction()

    # -- reads -------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        """Leader, with every entry committed before its term applied."""
        return self._node.view[1]

    def leader(self) -> str | None:
        return self._node.view[0]

    def wait_for_leader(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while (leader := self.leader()) is None:
            if time.monotonic() >= deadline or self._closed:
                raise TimeoutError(f"{self.self_address}: no leader within {timeout_s} s")
            self._stop.wait(0.01)
        return leader

    def term(self) -> int:
        """The current Raft term: what ``status().term`` says, without the voters' states
        (the active controller reads it on every metadata write)."""
        return cast(int, self._node.raftCurrentTerm)

    def status(self) -> QuorumStatus:
        node = self._node
        leader, ready = node.view
        voters = []
        for address in sorted(node.voters):
            if address == self.self_address:
                voters.append(VoterStatus(address, node.log_end if ready else None, True))
            else:
                match = node.match_index(address) if ready else None
                voters.append(VoterStatus(address, match, node.is_connected(address)))
        connected = sum(voter.connected for voter in voters)
        return QuorumStatus(
            self_address=self.self_address,
            leader=leader,
            term=cast(int, node.raftCurrentTerm),
            commit_index=cast(int, node.raftCommitIndex),
            last_applied=cast(int, node.raftLastApplied),
            has_quorum=connected * 2 > len(voters),
            voters=tuple(voters),
            storage_full=node.storage_full,
            caught_up=bool(node.isReady()),
            tick_gap_max_s=node.ticks.longest_s,
        )

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop pysyncobj's threads and close the journal; pending appends fail. Returns once
        the journal is closed (fdatasynced) and the directory unlocked, so another log may open
        it at once. pysyncobj closes the journal on its tick thread after the tick under way,
        and not at all if that thread ended first (its transport never came up, the main
        thread ended): then it is closed here. A tick thread still running after
        ``_CLOSE_TIMEOUT_S`` is logged and the directory stays locked (the journal may still be
        written). Called on the tick thread (a future's callback), it cannot wait for itself:
        pysyncobj closes the journal when that tick returns. Idempotent: a second caller waits
        for the first one's close, with the same deadline."""
        with self._lock:
            closing = not self._closed
            self._closed = True
        if not closing:
            if not self._close_done.wait(timeout=_CLOSE_TIMEOUT_S):
                logger.error("%s: the first close did not finish", self.self_address)
            return
        try:
            self._close()
        finally:
            self._close_done.set()

    def _close(self) -> None:
        self._stop.set()
        self._wake.set()
        current = threading.current_thread()
        if current is not self._notifier:
            self._notifier.join(timeout=_JOIN_TIMEOUT_S)
        node = self._node
        node.destroy()
        self._fail_pending(LogClosedError("the log was closed"))
        if current is not node.tick_thread:
            node.tick_thread.join(timeout=_CLOSE_TIMEOUT_S)
            if node.tick_thread.is_alive():
                logger.error(
                    "%s: the Raft tick thread did not stop within %.0f s; the directory stays "
                    "locked", self.self_address, _CLOSE_TIMEOUT_S,
                )  # fmt: skip
                return
            if not getattr(node._SyncObj__raftLog, "closed", True):
                node._doDestroy()  # the thread ended without pysyncobj's destroy
        os.close(self._lock_fd)

    def _fail_pending(self, error: MetadataLogError) -> None:
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for _, future in pending:
            future.set_exception(error)

    def _notifier_loop(self) -> None:
        delivered: tuple[str | None, bool] = (None, False)
        while not self._stop.is_set():
            self._wake.wait(timeout=_NOTIFIER_POLL_S)
            self._wake.clear()
            view = self._node.view
            if view != delivered:
                delivered = view
                try:
                    self._state_machine.on_leader_change(*view)
                except Exception:
                    logger.exception("on_leader_change(%s, %s) failed", *view)
            self._expire_pending(time.monotonic())
            if self._node.fatal is not None:
                self._fail_pending(LogClosedError(self._node.fatal))

    def _expire_pending(self, now: float) -> None:
        expired = []
        with self._lock:
            while self._pending:
                token, (deadline, future) = next(iter(self._pending.items()))
                if deadline > now:
                    break
                del self._pending[token]
                expired.append(future)
                if token == self._membership_token:  # its entry, if any, is in the journal now
                    self._membership_token = None
        for future in expired:
            future.set_exception(
                CommitTimeoutError(f"not committed in {self._timing.commit_timeout_s} s")
            )


def _check_addresses(self_address: str, voters: Sequence[str]) -> tuple[str, ...]:
    """Every voter, this one included (added if the caller listed only its partners)."""
    everyone = tuple(voters) if self_address in voters else (*voters, self_address)
    for address in everyone:
        if not _ADDRESS.match(address) or not 0 < int(address.rsplit(":", 1)[1]) < 65536:
            raise ValueError(f"voter address {address!r} is not host:port")
    if len(set(everyone)) != len(everyone):
        raise ValueError(f"voter addresses {list(voters)} are not distinct")
    return everyone


def _syncobj_conf(
    self_address: str,
    timing: RaftTiming,
    options: RaftOptions,
    data_dir: Path,
    store: _SnapshotStore,
) -> Any:
    return SyncObjConf(
        bindAddress=self_address,  # else it binds 0.0.0.0:port and loopback voters collide
        autoTick=True,
        autoTickPeriod=timing.tick_period_s,
        appendEntriesUseBatch=False,  # an append wakes the tick thread and goes out at once
        raftMinTimeout=timing.election_min_s,
        raftMaxTimeout=timing.election_max_s,
        appendEntriesPeriod=timing.append_period_s,
        connectionTimeout=timing.connection_timeout_s,
        connectionRetryTime=timing.connection_retry_s,
        leaderFallbackTimeout=timing.leader_fallback_s,
        logCompactionMinTime=timing.compaction_interval_s,
        logCompactionMinEntries=options.max_journal_entries,
        commandsQueueSize=options.max_in_flight_appends,
        commandsWaitLeader=False,
        appendEntriesBatchSizeBytes=_APPEND_BATCH_BYTES,
        sendBufferSize=_SOCKET_BUFFER_BYTES,
        recvBufferSize=_SOCKET_BUFFER_BYTES,
        journalFile=str(data_dir / JOURNAL_FILE),
        fullDumpFile=str(data_dir / SNAPSHOT_FILE),
        serializer=store.serialize,
        serializeChecker=store.check,
        deserializer=store.deserialize,
        bindRetryTime=_BIND_RETRY_S,
        maxBindRetries=_BIND_ATTEMPTS,
        dynamicMembershipChange=True,
        password=options.secret,  # None: plaintext; else Fernet (see Encryption above)
    )


def _peer_name(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "a peer that already left"
    return f"{host}:{port}"


def _deny_utility_command(args: Any, callback: Callable[[object, int], None]) -> None:
    callback(None, FAIL_REASON.REQUEST_DENIED)
