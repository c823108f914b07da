"""TLS around pysyncobj's TCP connections: the Raft transport's other option next to the secret.

pysyncobj (0.3.x) runs non-blocking sockets on its own poller (``TcpConnection`` in
tcp_connection.py). `TlsConnection` is a ``TcpConnection`` whose bytes on the wire are TLS
records: an ``ssl.SSLObject`` over two ``MemoryBIO``\\ s sits between pysyncobj's framing
(``zlib(pickle(message))`` behind a 4-byte length) and the socket, and the handshake is driven by
the same poller events that move the data. Only the two private steps that touch the socket are
replaced, ``__processRead`` (ciphertext in: feed the BIO, advance the handshake, read plaintext
into pysyncobj's read buffer) and the hand-over in ``send`` (plaintext frames go through
``SSLObject.write``, the records into pysyncobj's write buffer, sent by its own
``__processSend``); timeouts, framing, parsing and reconnects stay pysyncobj's.

Security: TLS 1.3 only, both sides present a certificate from the truststore's CA (mutual
authentication), the dialler checks the listener's certificate against the address it dialled
(IP or DNS SAN), and the listener checks the dialler's certificate against the voter address it
then names (`TlsConnection.certifies`): a certificate of the cluster's CA issued for another host
(a broker's, a client's) cannot speak for a voter. The same CA also signs clients' certificates
(the admin's, users' for mTLS), so a certificate is not enough: once the handshake is done each
side maps the other's subject to a principal (``ssl.principal.mapping.rules``) and requires a
node's (`RaftPeers`), as Kafka's controllers require CLUSTER_ACTION of whoever sends them a
Vote or a Fetch. No plaintext fallback: a peer that does not speak TLS, presents no certificate,
one of another CA or one of a principal that is not a node is refused and logged by the
transport (``on_refused``), and never names itself, so it cannot vote or be counted.

Cost and the choice between this and the secret: docs/security.md#raft-transport.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import ssl
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pysyncobj import pickle as syncobj_pickle
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection

from metadata_quorum.security.principal import KafkaPrincipal, PrincipalMappingRules
from metadata_quorum.security.tls import socket_peer_subject

_READ_BYTES = 256 * 1024  # plaintext taken from the TLS object per read call
_RETRY_ERRNOS = (errno.EAGAIN, errno.EWOULDBLOCK)


@dataclass(frozen=True)
class RaftTlsFiles:
    """The node's PEM keystore (private key, certificate, chain: ``ssl.keystore.location``) and
    the CA certificates it trusts (``ssl.truststore.location``)."""

    keystore: Path
    truststore: Path
    key_password: str | None = None


@dataclass(frozen=True)
class RaftPeers:
    """Who may be a Raft peer, beyond a certificate of the CA that names its voter's host: the
    principal its certificate's subject maps to by ``mapping_rules`` (the node's
    ``ssl.principal.mapping.rules``) must be one of ``principals``. A node that runs an
    authorizer passes its ``super.users``: the nodes are super users (that is how the cluster
    recognises them on BROKER and CONTROLLER too), a client certificate the same CA signed
    (``User:mallory``) is not. None: any principal, for a node without an authorizer (Kafka then
    lets any authenticated peer act)."""

    mapping_rules: str = "DEFAULT"
    principals: frozenset[KafkaPrincipal] | None = None

    def refusal(self, subject: str | None) -> str | None:
        """Why a peer whose verified certificate has ``subject`` may not be a Raft peer, or
        None when it may."""
        if subject is None:
            return "it presented no certificate"
        try:
            principal = PrincipalMappingRules(self.mapping_rules).principal_of(subject)
        except ValueError as error:
            return str(error)
        if self.principals is not None and principal not in self.principals:
            return f"{principal} (certificate {subject}) is not a node: not in super.users"
        return None


class RaftTls:
    """The client and server contexts of one node, who may be a peer, and who to tell when a
    peer is refused: ``on_refused(peer, reason)``."""

    def __init__(
        self,
        files: RaftTlsFiles,
        on_refused: Callable[[str, str], None],
        peers: RaftPeers | None = None,  # None: any principal of the CA (RaftPeers())
    ) -> None:
        self.server = _context(ssl.PROTOCOL_TLS_SERVER, files)
        self.client = _context(ssl.PROTOCOL_TLS_CLIENT, files)
        self.client.check_hostname = True  # the dialled voter's address is in its certificate
        self.peers = peers or RaftPeers()
        self.on_refused = on_refused


def load_contexts(files: RaftTlsFiles, peers: RaftPeers) -> None:
    """Load both contexts and the mapping rules once, so that a bad keystore, truststore or
    rule fails at start with its name, not on the first connection."""
    RaftTls(files, lambda peer, reason: None, peers)
    PrincipalMappingRules(peers.mapping_rules)


def _context(protocol: ssl._SSLMethod, files: RaftTlsFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(protocol)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.maximum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED  # the listener requires the dialler's certificate
    try:
        context.load_cert_chain(files.keystore, password=files.key_password)
        context.load_verify_locations(cafile=files.truststore)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(
            f"Raft TLS: keystore {files.keystore}, truststore {files.truststore}: {error}"
        ) from error
    return context


class TlsConnection(TcpConnection):  # type: ignore[misc]
    """A pysyncobj connection whose bytes are TLS records (see the module docstring). Outgoing:
    built without a socket, then ``connect``; incoming: built on the accepted socket, server
    side. ``peer`` names the other end in refusal logs."""

    def __init__(self, tls: RaftTls, peer: str, **kwargs: Any) -> None:
        self._tls = tls
        self.peer = peer
        self._ssl: ssl.SSLObject | None = None
        self._wire_in = ssl.MemoryBIO()
        self._wire_out = ssl.MemoryBIO()
        self._pending = bytearray()  # plaintext frames sent before the handshake completed
        self._established = False
        self._on_established: Callable[[], None] | None = None
        super().__init__(**kwargs)
        if kwargs.get("socket") is not None:  # accepted: we are the server side
            self._new_session(server_side=True, hostname=None)

    def _new_session(self, server_side: bool, hostname: str | None) -> None:
        self._wire_in, self._wire_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        context = self._tls.server if server_side else self._tls.client
        self._ssl = context.wrap_bio(self._wire_in, self._wire_out, server_side, hostname)
        self._pending.clear()
        self._established = False

    def setOnConnectedCallback(self, onConnected: Callable[[], None] | None) -> None:
        """pysyncobj calls this back once TCP connects; here that starts the handshake, and
        ``onConnected`` (the transport naming this node, counting the peer connected) waits
        until the handshake has verified the peer's certificate."""
        self._on_established = onConnected
        super().setOnConnectedCallback(self._pump if onConnected is not None else None)

    @property
    def state(self) -> int:
        """CONNECTING until the handshake is done: pysyncobj's transport sends nothing to a
        peer before then, so this node's name is the first message the peer reads."""
        state = int(self._TcpConnection__state)
        if state == CONNECTION_STATE.CONNECTED and not self._established:
            return int(CONNECTION_STATE.CONNECTING)
        return state

    def connect(self, host: str, port: int) -> bool:
        if not super().connect(host, port):
            return False
        self._new_session(server_side=False, hostname=host)
        return True

    def send(self, message: Any) -> None:
        """pysyncobj's framing, then TLS; frames wait for the handshake in ``_pending``."""
        data = zlib.compress(syncobj_pickle.dumps(message), 3)
        self._pending += struct.pack("i", len(data)) + data
        self._pump()

    def certifies(self, address: str) -> bool:
        """The peer's certificate names the host of ``address`` (an IP or a DNS SAN): checked
        when an incoming peer names the voter it is."""
        certificate = self._ssl.getpeercert() if self._ssl and self._established else None
        if not certificate:
            return False
        host = address.rsplit(":", 1)[0]
        alt_names: Any = certificate.get("subjectAltName", ())  # ((kind, value), ...)
        for kind, name in alt_names:
            if kind == "DNS" and name == host:
                return True
            if kind == "IP Address" and _is_ip(host) and _is_ip(name) and _same_ip(name, host):
                return True
        return False

    def _pump(self) -> None:
        """Advance the handshake, encrypt what waits, and hand the records to the socket."""
        if self._ssl is None or self.state == CONNECTION_STATE.DISCONNECTED:
            return
        established_now = False
        try:
            if not self._established:
                self._ssl.do_handshake()
                refusal = self._tls.peers.refusal(socket_peer_subject(self._ssl))
                if refusal is not None:  # a certificate of the CA, but not a node's
                    self._tls.on_refused(self.peer, refusal)
                    self.disconnect()
                    return
                self._established = established_now = True
            if self._pending:
                self._ssl.write(bytes(self._pending))
                self._pending.clear()
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as error:
            self._refuse(error)
            return
        records = self._wire_out.read()
        if records:
            self._TcpConnection__writeBuffer += records
            self._TcpConnection__trySendBuffer()
        if established_now and self._on_established is not None and self._established:
            self._on_established()  # sends this node's name: back into _pump, established

    def _refuse(self, error: ssl.SSLError) -> None:
        self._flush_alert()
        self._tls.on_refused(self.peer, getattr(error, "reason", None) or str(error))
        self.disconnect()

    def _flush_alert(self) -> None:
        """Best effort: the TLS alert that says why goes out before the socket closes."""
        sock = self._TcpConnection__socket
        alert = self._wire_out.read()
        if sock is not None and alert:
            try:
                sock.send(alert)
            except OSError:
                return  # the peer is gone or its buffer full: the close says enough

    def _TcpConnection__processRead(self) -> bool:  # overrides a private method
        sock = self._TcpConnection__socket
        try:
            incoming = sock.recv(self._TcpConnection__recvBufferSize)
        except OSError as error:
            if error.errno not in _RETRY_ERRNOS:
                self.disconnect()
            return False
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) or not incoming:
            self.disconnect()
            return False
        self._wire_in.write(incoming)
        self._pump()
        if self._established:
            self._read_plaintext()
        return bool(self.state != CONNECTION_STATE.DISCONNECTED)

    def _read_plaintext(self) -> None:
        assert self._ssl is not None
        while self.state != CONNECTION_STATE.DISCONNECTED:
            try:
                chunk = self._ssl.read(_READ_BYTES)
            except ssl.SSLWantReadError:
                return
            except ssl.SSLZeroReturnError:
                self.disconnect()
                return
            except ssl.SSLError as error:
                self._refuse(error)
                return
            if not chunk:
                self.disconnect()
                return
            self._TcpConnection__readBuffer += chunk

    def disconnect(self) -> None:
        self._ssl = None
        self._established = False
        self._pending.clear()
        super().disconnect()


def _same_ip(one: str, other: str) -> bool:
    return ipaddress.ip_address(one) == ipaddress.ip_address(other)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
