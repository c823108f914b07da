"""Node identities and network partitions between real node processes.

Why a user per node
-------------------
Every node of a local cluster listens on its own loopback address, but a process that connects to
127.0.0.12 sends from 127.0.0.1 whatever address it listens on (NOTES.md), so iptables rules by
source address cut nothing. Each node process therefore runs as its own system user
(``raftlog-n<id>``, see `ensure_node_identity` and `spawn`) and the rules match the socket's
owner in the OUTPUT chain, which loopback traffic passes through. Network namespaces were the
alternative; they would move the nodes off the shared loopback DESIGN.md gives them: not used.

What a cut drops
----------------
``cut_one_way(src, dst)``: no packet sent by src's processes reaches dst's processes.
1. Packets to dst's addresses (connections src opened): ``-m owner --uid-owner SRC -d ADDR``.
   The owner match applies per packet, so open connections stop delivering too, not only new ones.
2. Packets src sends on connections *dst* opened. They go to dst's source address, 127.0.0.1, so
   their destination says nothing. Each connection is marked with its initiator's uid (CONNMARK on
   the initiator's packets, ``--ctdir ORIGINAL``; mark ``uid << 16`` under mask 0xffff0000, the
   same in every run) and ``-m owner --uid-owner SRC -m connmark --mark MARK(DST)`` drops them,
   the SYN-ACK included (its owner is src's listening socket): dst cannot even connect to src.
Without (2) a "cut" A<->B still lets B's responses and pushes on A's open connections through.
A connection is attributed at its initiator's first packet after the marking rules exist, and
connections older than the first conntrack rule in the namespace may be attributed to whoever sends
first: enter the `NetworkFaults` context before starting the nodes.

One chain per run
-----------------
A run's rules live in its own chain ``RAFTLOG-<run id>``, jumped to from the top of OUTPUT; every
rule, the jump included, carries ``-m comment --comment raftlog-<run id>``. `heal` is one flush
(then the marking rules go back: they drop nothing), `close` deletes one jump and one chain, and
`sweep` finds a crashed run's leftovers by chain name and comment, never by guessing rule specs.
Runs never touch each other's rules, so pytest-xdist workers can partition clusters concurrently.
``iptables -w`` waits (bounded) for the xtables lock; the nf_tables backend accepts and ignores it.

Permissions on a fresh machine
------------------------------
Node users need search (x) on every directory leading to the interpreter, the venv, the project
and their data. Python lives under /root/.pyenv and /root is 0700, so a node user cannot exec the
venv's python. Worse, when the exec succeeds anyway (a path resolved before root was dropped),
python cannot find its prefix and silently runs with Debian's /usr/lib/python3.11 stdlib (the node
is exec'd by ``/bin/sh`` after ``setpriv`` changed the user: see ``dataplane.tools.owned_process``).
So `prepare_runtime` compares what the node's interpreter loads (prefixes, stdlib, module files,
sys.path) with what root's loads, and fails loudly on any difference.

The fix is the narrowest that works: on exactly the directories node users cannot search (here
only /root), `grant_search` adds one POSIX ACL entry ``group:raftlog-nodes:--x``, and `spawn` gives
node processes that supplementary group. Only node users gain anything, and only passage by name:
no listing, no reading; the owner, owning group and others keep their rights (``ls -l`` shows
``drwx--x---+``: the group bits now show the ACL mask). o+x would open /root to every local account;
a mount namespace per node needs an unshare before the uid change and more moving parts. Where a
filesystem has no ACLs, the grant falls back to o+x. Every grant is logged (WARNING) and returned.
File modes are never changed (a clone made with umask 022 is readable). `prepare_data_dir` creates
and chowns data directories. Users and the group are created when missing, never deleted.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import functools
import grp
import ipaddress
import json
import logging
import os
import pwd
import re
import secrets
import shlex
import stat
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from dataplane.tools.owned_process import OwnedProcessError, popen_owned

log = logging.getLogger(__name__)

NODE_GROUP = "raftlog-nodes"
RULE_COMMENT_PREFIX = "raftlog-"
CHAIN_PREFIX = "RAFTLOG-"
CONNMARK_SHIFT = 16
CONNMARK_MASK = 0xFFFF0000
IPTABLES_LOCK_WAIT_S = 5
COMMAND_TIMEOUT_S = 15.0
PROBE_TIMEOUT_S = 60.0

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,19}")  # the chain name must stay <= 28 chars
_USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_NOLOGIN_SHELL = "/usr/sbin/nologin"
_USERS_LOCK = Path(tempfile.gettempdir()) / "raftlog-node-users.lock"
_INSTALL_HINT = "install it with `apt-get install -y iptables` (`make deps` does)"

Redirect = int | IO[Any] | None


class NetworkFaultError(RuntimeError):
    """An iptables command is missing, failed or timed out; the message names the command."""


class NodeIdentityError(RuntimeError):
    """A node user cannot be created, or cannot run the project's interpreter as root does."""


def _run(
    argv: Sequence[str], *, timeout_s: float, error: type[RuntimeError], hint: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run a command with a deadline; any failure raises `error` naming the command and stderr."""
    command = shlex.join(argv)
    try:
        result = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError as exc:
        raise error(f"`{command}`: {argv[0]} not found. {hint}".rstrip()) from exc
    except subprocess.TimeoutExpired as exc:
        raise error(f"`{command}` did not finish within {timeout_s} s") from exc
    if result.returncode != 0:
        stderr = result.stderr.strip() or "(no stderr)"
        raise error(f"`{command}` exited with {result.returncode}: {stderr}")
    return result


# ----------------------------------------------------------------------------- node identities


@dataclass(frozen=True)
class NodeIdentity:
    """Who a node's processes run as and where they listen: what partitions are cut by."""

    user: str
    uid: int
    gid: int
    addresses: tuple[str, ...]

    def __post_init__(self) -> None:
        if not 0 < self.uid <= 0xFFFF:
            raise ValueError(f"node uid must be in 1..65535 (root cannot be a node): {self.uid}")
        if not self.addresses:
            raise ValueError(f"node {self.user} has no listen address")
        for address in self.addresses:
            ipaddress.IPv4Address(address)  # raises ValueError naming the address

    @property
    def connmark(self) -> int:
        """The conntrack mark of connections this node opens (under `CONNMARK_MASK`)."""
        return self.uid << CONNMARK_SHIFT


def node_user_name(node_id: int) -> str:
    """The system user node `node_id` runs as: ``raftlog-n11`` for node 11."""
    if node_id < 0:
        raise ValueError(f"node id must not be negative: {node_id}")
    return f"raftlog-n{node_id}"


@contextlib.contextmanager
def _users_lock() -> Iterator[None]:
    """Serialise user creation between processes (pytest-xdist workers) on this machine."""
    with _USERS_LOCK.open("a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def ensure_node_identity(
    user: str, addresses: Sequence[str], *, timeout_s: float = COMMAND_TIMEOUT_S
) -> NodeIdentity:
    """The identity of a node: its system user (created when missing) and its listen addresses.

    Creates the group `NODE_GROUP` and a system user without home directory or login shell
    (``useradd --system -M -s /usr/sbin/nologin``) if they do not exist. Never deletes or changes
    an existing user or group.
    """
    if not _USER_NAME.fullmatch(user):
        raise ValueError(f"not a valid system user name: {user!r}")
    with _users_lock():
        _ensure_node_group(timeout_s)
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            argv = ["useradd", "--system", "--no-create-home", "--user-group"]
            argv += ["--home-dir", "/nonexistent", "--shell", _NOLOGIN_SHELL]
            _run([*argv, user], timeout_s=timeout_s, error=NodeIdentityError)
            log.warning("created system user %s for a raftlog node", user)
            entry = pwd.getpwnam(user)
    return NodeIdentity(user=user, uid=entry.pw_uid, gid=entry.pw_gid, addresses=tuple(addresses))


def _ensure_node_group(timeout_s: float) -> None:
    try:
        grp.getgrnam(NODE_GROUP)
    except KeyError:
        _run(["groupadd", "--system", NODE_GROUP], timeout_s=timeout_s, error=NodeIdentityError)
        log.warning("created system group %s for raftlog nodes", NODE_GROUP)


def node_group_gid() -> int:
    """The gid of `NODE_GROUP`, the supplementary group every node process gets."""
    try:
        return grp.getgrnam(NODE_GROUP).gr_gid
    except KeyError as exc:
        missing = f"group {NODE_GROUP} is missing: ensure_node_identity creates it"
        raise NodeIdentityError(missing) from exc


def _default_env(identity: NodeIdentity) -> dict[str, str]:
    home = pwd.getpwuid(identity.uid).pw_dir
    return {**os.environ, "HOME": home, "USER": identity.user, "LOGNAME": identity.user}


def spawn(
    identity: NodeIdentity,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdout: Redirect = None,
    stderr: Redirect = None,
    stdin: Redirect = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """Start `argv` as the node's user, with `NODE_GROUP` as supplementary group.

    With ``env=None`` the child gets this process's environment with HOME, USER and LOGNAME of the
    node's user. The caller owns the process and kills it by pid: the pid is the command's own
    (setpriv execs it). The process dies with this one (``popen_owned``): setpriv arms the
    parent-death signal after it changes the user, so the change does not clear it.

    The user changes in ``setpriv``, not in Popen's ``user=``: with ``user=`` Python forks the
    whole process (vfork is ruled out) and gRPC's fork handlers run in a child of a process full
    of gRPC threads. Chaos runs that restarted nodes this way saw the child die before the node
    logged a line: SIGSEGV in gRPC's event-engine thread, or abseil's "Mutex::Fer with pending
    CondVar" abort, in the node's log. Without ``user=`` Python uses vfork, which runs no fork
    handlers; restarts have not failed since.
    """
    groups = f"{identity.gid},{node_group_gid()}"
    drop = [f"--reuid={identity.uid}", f"--regid={identity.gid}", f"--groups={groups}"]
    try:
        return popen_owned(
            argv,
            setpriv_options=drop,
            env=dict(env) if env is not None else _default_env(identity),
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            close_fds=True,
        )
    except OwnedProcessError as exc:  # setpriv is missing
        raise NodeIdentityError(str(exc)) from exc


# ----------------------------------------------------------------------------- permissions

AclEntry = tuple[int, int, int]  # (tag, permission bits rwx=4|2|1, uid or gid)

_ACL_XATTR = "system.posix_acl_access"
_ACL_VERSION = 2
_ACL_USER_OBJ, _ACL_USER, _ACL_GROUP_OBJ, _ACL_GROUP, _ACL_MASK, _ACL_OTHER = 1, 2, 4, 8, 16, 32
_ACL_UNDEFINED_ID = 0xFFFFFFFF
_ACL_HEADER = struct.Struct("<I")
_ACL_ENTRY = struct.Struct("<HHI")
_SEARCH = 1


def _decode_acl(blob: bytes) -> list[AclEntry]:
    """Parse the kernel's ``system.posix_acl_access`` value."""
    (version,) = _ACL_HEADER.unpack_from(blob)
    body = len(blob) - _ACL_HEADER.size
    if version != _ACL_VERSION or body % _ACL_ENTRY.size:
        raise ValueError(f"not a version {_ACL_VERSION} POSIX ACL: {blob!r}")
    return list(_ACL_ENTRY.iter_unpack(blob[_ACL_HEADER.size :]))


def _encode_acl(entries: Iterable[AclEntry]) -> bytes:
    ordered = sorted(entries, key=lambda entry: (entry[0], entry[2]))  # the kernel's order
    return _ACL_HEADER.pack(_ACL_VERSION) + b"".join(_ACL_ENTRY.pack(*e) for e in ordered)


def _acl_from_mode(mode: int) -> list[AclEntry]:
    """The minimal ACL that a file without one has: its mode bits."""
    return [
        (_ACL_USER_OBJ, (mode >> 6) & 7, _ACL_UNDEFINED_ID),
        (_ACL_GROUP_OBJ, (mode >> 3) & 7, _ACL_UNDEFINED_ID),
        (_ACL_OTHER, mode & 7, _ACL_UNDEFINED_ID),
    ]


def _acl_with_group_search(entries: Sequence[AclEntry], gid: int) -> list[AclEntry]:
    """`entries` plus search for group `gid`; the mask gains search, nothing else changes."""
    group_obj = next(perm for tag, perm, _ in entries if tag == _ACL_GROUP_OBJ)
    old_mask = next((perm for tag, perm, _ in entries if tag == _ACL_MASK), group_obj)
    old_named = next((p for tag, p, i in entries if tag == _ACL_GROUP and i == gid), 0)
    kept = [e for e in entries if e[0] != _ACL_MASK and not (e[0] == _ACL_GROUP and e[2] == gid)]
    kept.append((_ACL_GROUP, old_named | _SEARCH, gid))
    kept.append((_ACL_MASK, old_mask | _SEARCH, _ACL_UNDEFINED_ID))
    return sorted(kept, key=lambda entry: (entry[0], entry[2]))


def _read_acl(path: Path) -> list[AclEntry] | None:
    try:
        return _decode_acl(os.getxattr(path, _ACL_XATTR))
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.EOPNOTSUPP):
            return None
        raise


def _group_can_search(path: Path, gid: int) -> bool:
    """Whether members of `gid` (not owning `path`) may pass through directory `path`."""
    st = path.stat()
    entries = _read_acl(path)
    if entries is not None:
        mask = next((perm for tag, perm, _ in entries if tag == _ACL_MASK), 7)
        named = next((p for tag, p, i in entries if tag == _ACL_GROUP and i == gid), None)
        if named is not None:
            return bool(named & mask & _SEARCH)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _grant_search_on(directory: Path, gid: int) -> None:
    st = directory.stat()
    entries = _read_acl(directory) or _acl_from_mode(st.st_mode)
    try:
        os.setxattr(directory, _ACL_XATTR, _encode_acl(_acl_with_group_search(entries, gid)))
    except OSError as exc:
        if exc.errno != errno.EOPNOTSUPP:
            raise
        directory.chmod(stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
        log.warning("granted o+x on %s (no ACL support there) so node users reach it", directory)
        return
    log.warning("granted search on %s to group %s (POSIX ACL)", directory, NODE_GROUP)


def _directories_leading_to(paths: Iterable[Path]) -> list[Path]:
    """Every existing directory from / down to each path (the path itself if a directory)."""
    found: dict[Path, None] = {}
    for given in paths:
        for path in {Path(os.path.abspath(given)), Path(os.path.realpath(given))}:
            chain = [path, *path.parents] if path.is_dir() else list(path.parents)
            for directory in reversed(chain):
                if directory.is_dir():
                    found[directory] = None
    return list(found)


def grant_search(paths: Iterable[Path]) -> list[Path]:
    """Let node users pass through every directory leading to `paths`; returns those changed."""
    gid = node_group_gid()
    granted: list[Path] = []
    for directory in _directories_leading_to(paths):
        if not _group_can_search(directory, gid):
            _grant_search_on(directory, gid)
            granted.append(directory)
    return granted


_PROBE = """\
import importlib, json, os, sys
modules = {m: getattr(importlib.import_module(m), "__file__", None) for m in sys.argv[1:]}
print(json.dumps({"base_prefix": sys.base_prefix, "prefix": sys.prefix, "stdlib": os.__file__,
                  "modules": modules, "path": sys.path}))
"""


def _probe(
    identity: NodeIdentity,
    *,
    as_node: bool,
    python: Path,
    cwd: Path,
    modules: Sequence[str],
    timeout_s: float,
) -> dict[str, Any]:
    """What `python` loads in `cwd`, run as the node's user or as this process's user."""
    argv = [str(python), "-c", _PROBE, *modules]
    env = _default_env(identity)
    if as_node:
        pipe = subprocess.PIPE
        try:
            child = spawn(identity, argv, env=env, cwd=cwd, stdout=pipe, stderr=pipe)
        except PermissionError as exc:
            raise NodeIdentityError(f"{identity.user} cannot start {python}: {exc}") from exc
        try:
            out, err = child.communicate(timeout=timeout_s)
        finally:
            child.kill()
            child.wait(timeout=timeout_s)
        result = subprocess.CompletedProcess(argv, child.returncode, out.decode(), err.decode())
    else:
        result = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    if result.returncode != 0:
        who = identity.user if as_node else "this process's user"
        raise NodeIdentityError(f"as {who}, `{shlex.join(argv[:2])} ...` failed: {result.stderr}")
    loaded: dict[str, Any] = json.loads(result.stdout)
    return loaded


def prepare_runtime(
    identity: NodeIdentity,
    python: Path,
    cwd: Path,
    modules: Sequence[str] = ("raftlog",),
    extra_paths: Iterable[Path] = (),
    *,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> list[Path]:
    """Make `identity` run `python` in `cwd` exactly as this process does; returns grants made.

    Runs a probe as this process's user, grants node users search on the directories leading to
    everything it loaded (and to `extra_paths`, e.g. a script), runs the probe as the node and
    raises `NodeIdentityError` unless both loaded the same prefixes, stdlib, modules and sys.path.
    """
    probe = functools.partial(_probe, identity, python=python, cwd=cwd, modules=modules)
    expected = probe(as_node=False, timeout_s=timeout_s)
    loaded_paths = [expected["base_prefix"], expected["prefix"], expected["stdlib"]]
    loaded_paths += [f for f in expected["modules"].values() if f] + expected["path"]
    needed = [python, cwd, *extra_paths, *(Path(p) for p in loaded_paths if os.path.isabs(p))]
    granted = grant_search(needed)
    seen = probe(as_node=True, timeout_s=timeout_s)
    if seen != expected:
        raise NodeIdentityError(
            f"{identity.user} runs {python} differently from this process:\n"
            f"  as {identity.user}: {json.dumps(seen)}\n  expected: {json.dumps(expected)}"
        )
    return granted


def prepare_data_dir(identity: NodeIdentity, path: Path) -> Path:
    """Create `path` (if missing), hand it and its contents to the node, let the node reach it."""
    path = Path(os.path.abspath(path))
    path.mkdir(parents=True, exist_ok=True)
    grant_search([path.parent])
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.chown(Path(root) / name, identity.uid, identity.gid, follow_symlinks=False)
    os.chown(path, identity.uid, identity.gid)
    path.chmod(0o750)
    return path


# ----------------------------------------------------------------------------- iptables rules

Rule = list[str]  # iptables match and target arguments, without the chain and the comment


def marking_rule(node: NodeIdentity) -> Rule:
    """Mark the connections `node` opens with its connmark, on every packet it sends in them."""
    mark = f"{node.connmark:#x}/{CONNMARK_MASK:#x}"
    owner = ["-m", "owner", "--uid-owner", str(node.uid)]
    return ["-m", "conntrack", "--ctdir", "ORIGINAL", *owner, "-j", "CONNMARK", "--set-xmark", mark]


def cut_rules(src: NodeIdentity, dst: NodeIdentity) -> list[Rule]:
    """The DROP rules that stop every packet `src` sends from reaching `dst` (see module doc)."""
    owner = ["-m", "owner", "--uid-owner", str(src.uid)]
    rules = [[*owner, "-d", f"{address}/32", "-j", "DROP"] for address in dst.addresses]
    mark = f"{dst.connmark:#x}/{CONNMARK_MASK:#x}"
    rules.append([*owner, "-m", "connmark", "--mark", mark, "-j", "DROP"])
    return rules


def _with_comment(rule: Rule, comment: str) -> Rule:
    target = rule.index("-j")
    return [*rule[:target], "-m", "comment", "--comment", comment, *rule[target:]]


def _iptables(iptables: str, args: Sequence[str], timeout_s: float) -> str:
    argv = [iptables, "-w", str(IPTABLES_LOCK_WAIT_S), *args]
    return _run(argv, timeout_s=timeout_s, error=NetworkFaultError, hint=_INSTALL_HINT).stdout


def new_run_id() -> str:
    """A run id that starts with this process's pid, so `stale_run_ids` can tell crashed runs."""
    return f"{os.getpid()}-{secrets.token_hex(3)}"


class NetworkFaults:
    """Partitions between node processes, cut by owner in the run's own iptables chain.

    Use as a context manager and start the nodes inside it; leaving it (also by an exception), or
    `close`, removes every rule of the run, and an atexit handler does so as a last resort.
    Thread-safe; every iptables call and every wait for the internal lock is bounded.
    """

    def __init__(
        self,
        nodes: Iterable[NodeIdentity] = (),
        *,
        run_id: str | None = None,
        iptables: str = "iptables",
        timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> None:
        self.run_id = new_run_id() if run_id is None else run_id
        if not _RUN_ID.fullmatch(self.run_id):
            raise ValueError(f"run id must match {_RUN_ID.pattern}: {self.run_id!r}")
        self.comment = RULE_COMMENT_PREFIX + self.run_id
        self.chain = CHAIN_PREFIX + self.run_id
        self._iptables_binary = iptables
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._initial_nodes = tuple(nodes)
        self._marked: dict[int, NodeIdentity] = {}  # uid -> node whose connections are marked
        self._cuts: set[tuple[int, int]] = set()  # (src uid, dst uid)
        self._installed = False
        self._chain_created = False
        self._jump_added = False

    def __enter__(self) -> Self:
        self.install()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if not self._lock.acquire(timeout=4 * self._timeout_s):
            raise NetworkFaultError(f"run {self.run_id}: another thread holds the rules' lock")
        try:
            yield
        finally:
            self._lock.release()

    def _ipt(self, *args: str) -> str:
        return _iptables(self._iptables_binary, args, self._timeout_s)

    def _jump(self) -> Rule:
        return _with_comment(["-j", self.chain], self.comment)

    def install(self) -> None:
        """Create the run's chain, jump to it from the top of OUTPUT, mark the known nodes."""
        try:
            with self._locked():
                if self._installed:
                    return
                self._installed = True
                atexit.register(self.close)
                self._ipt("-N", self.chain)
                self._chain_created = True
                self._ipt("-I", "OUTPUT", "1", *self._jump())
                self._jump_added = True
                for node in self._initial_nodes:
                    self._mark(node)
        except BaseException:
            self.close()
            raise

    def _mark(self, node: NodeIdentity) -> None:
        """Add the marking rule of `node` unless it is there. Call with the lock held."""
        known = self._marked.get(node.uid)
        if known is not None:
            if known != node:
                raise ValueError(f"{node} and {known} share uid {node.uid}: cannot tell them apart")
            return
        self._ipt("-A", self.chain, *_with_comment(marking_rule(node), self.comment))
        self._marked[node.uid] = node

    def _require_installed(self) -> None:
        if not self._installed:
            raise NetworkFaultError(f"run {self.run_id} is not installed: use it as a context")

    def cut_one_way(self, src: NodeIdentity, dst: NodeIdentity) -> None:
        """Drop every packet `src` sends to `dst`, on new and on open connections."""
        if src.uid == dst.uid:
            raise ValueError(f"cannot cut {src.user} from itself")
        with self._locked():
            self._require_installed()
            self._mark(src)
            self._mark(dst)
            if (src.uid, dst.uid) in self._cuts:
                return
            for rule in cut_rules(src, dst):
                self._ipt("-A", self.chain, *_with_comment(rule, self.comment))
            self._cuts.add((src.uid, dst.uid))

    def cut(self, a: NodeIdentity, b: NodeIdentity) -> None:
        """Cut `a` and `b` apart in both directions."""
        self.cut_one_way(a, b)
        self.cut_one_way(b, a)

    def isolate(self, node: NodeIdentity, from_nodes: Iterable[NodeIdentity]) -> None:
        """Cut `node` from each of `from_nodes`, both ways; they still reach each other."""
        for other in from_nodes:
            if other.uid != node.uid:
                self.cut(node, other)

    def heal(self) -> None:
        """Remove every cut: flush the run's chain, then put back the marking rules."""
        with self._locked():
            self._require_installed()
            self._ipt("-F", self.chain)
            marked = list(self._marked.values())
            self._marked.clear()
            self._cuts.clear()
            for node in marked:
                self._mark(node)

    def cuts(self) -> set[tuple[str, str]]:
        """The directed cuts in place, as (src user, dst user)."""
        with self._locked():
            users = {uid: node.user for uid, node in self._marked.items()}
            return {(users[src], users[dst]) for src, dst in self._cuts}

    def rules(self) -> list[str]:
        """The run's chain as ``iptables -S`` prints it."""
        return self._ipt("-S", self.chain).splitlines()

    def close(self) -> None:
        """Remove the jump and the chain; idempotent. Tries every step, raises if any failed."""
        with self._locked():
            if not self._installed:
                return
            errors: list[NetworkFaultError] = []
            if self._jump_added:
                self._try(errors, "-D", "OUTPUT", *self._jump())
                self._jump_added = bool(errors)
            if self._chain_created:
                self._try(errors, "-F", self.chain)
                self._try(errors, "-X", self.chain)
                self._chain_created = bool(errors)
            if errors:
                raise NetworkFaultError("; ".join(map(str, errors))) from errors[0]
            self._installed = False
            self._marked.clear()
            self._cuts.clear()
            atexit.unregister(self.close)

    def _try(self, errors: list[NetworkFaultError], *args: str) -> None:
        """Run one cleanup step, recording its failure so the others still run."""
        try:
            self._ipt(*args)
        except NetworkFaultError as exc:
            errors.append(exc)


# ----------------------------------------------------------------------------- leftovers


def _option(args: Sequence[str], *names: str) -> str:
    """The value after the first of `names` in a parsed ``iptables -S`` line, or ""."""
    return next((args[i + 1] for i in range(len(args) - 1) if args[i] in names), "")


def _sweep_plan(listing: Iterable[str], run_id_prefix: str) -> tuple[list[list[str]], list[str]]:
    """From ``iptables -S`` lines: the rules to delete (as -D args) and the run chains to drop."""
    parsed = [shlex.split(line) for line in listing if line.strip()]
    chains = [a[1] for a in parsed if a[:1] == ["-N"] and a[1].startswith(CHAIN_PREFIX)]
    chains = [c for c in chains if c.startswith(CHAIN_PREFIX + run_id_prefix)]
    comment = RULE_COMMENT_PREFIX + run_id_prefix
    deletes = [
        ["-D", *a[1:]]
        for a in parsed
        if a[:1] == ["-A"]
        and a[1] not in chains
        and (_option(a, "--comment").startswith(comment) or _option(a, "-j", "-g") in chains)
    ]
    return deletes, chains


def sweep(
    run_id_prefix: str, *, iptables: str = "iptables", timeout_s: float = COMMAND_TIMEOUT_S
) -> list[str]:
    """Remove the rules and chains of every run whose id starts with `run_id_prefix`.

    For leftovers of crashed runs: a live run swept from under it fails when it closes. Returns
    the run ids removed. ``sweep("")`` removes every raftlog run on this machine.
    """
    listing = _iptables(iptables, ["-S"], timeout_s).splitlines()
    deletes, chains = _sweep_plan(listing, run_id_prefix)
    run_ids = {chain.removeprefix(CHAIN_PREFIX) for chain in chains}
    for args in deletes:
        run_ids.add(_option(args, "--comment").removeprefix(RULE_COMMENT_PREFIX))
        _iptables(iptables, args, timeout_s)
    for chain in chains:
        _iptables(iptables, ["-F", chain], timeout_s)
        _iptables(iptables, ["-X", chain], timeout_s)
    return sorted(run_ids - {""})


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_run_ids(*, iptables: str = "iptables", timeout_s: float = COMMAND_TIMEOUT_S) -> list[str]:
    """Run ids (made by `new_run_id`) with a chain left behind whose process no longer exists."""
    _, chains = _sweep_plan(_iptables(iptables, ["-S"], timeout_s).splitlines(), "")
    stale = []
    for chain in chains:
        run_id = chain.removeprefix(CHAIN_PREFIX)
        pid, dash, _ = run_id.partition("-")
        if dash and pid.isdigit() and not pid_alive(int(pid)):
            stale.append(run_id)
    return sorted(stale)
