"""SASL/SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) and SASL/PLAIN, as exchanges of
bytes (pure: the caller brings the nonce and does the IO).

Credentials are what KIP-554 stores: a salt, an iteration count, StoredKey = H(HMAC(salted
password, "Client Key")) and ServerKey = HMAC(salted password, "Server Key"); never the password.
An AdminClient computes the salted password itself (AlterUserScramCredentials carries it, not the
password), so `credential_from_salted_password` is what the controller runs.

SASL/PLAIN, for tests and migrations, checks its password against the same stored credential
(either mechanism): one credential store for both.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass

from raftlog.errors import ErrorCode, KafkaError

PLAIN = "PLAIN"


class ScramMechanism(enum.IntEnum):
    """Kafka's codes in AlterUserScramCredentials / DescribeUserScramCredentials."""

    UNKNOWN = 0
    SCRAM_SHA_256 = 1
    SCRAM_SHA_512 = 2

    @property
    def mechanism_name(self) -> str:
        return self.name.replace("_", "-")

    @property
    def hash_name(self) -> str:
        return {ScramMechanism.SCRAM_SHA_256: "sha256", ScramMechanism.SCRAM_SHA_512: "sha512"}[
            self
        ]

    @property
    def min_iterations(self) -> int:
        return 4096  # Kafka's ScramMechanism.minIterations

    @property
    def max_iterations(self) -> int:
        return 16384  # Kafka refuses more (KIP-554)

    @classmethod
    def from_name(cls, name: str) -> ScramMechanism:
        for mechanism in (cls.SCRAM_SHA_256, cls.SCRAM_SHA_512):
            if mechanism.mechanism_name == name.upper():
                return mechanism
        raise KafkaError(ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"unknown SCRAM mechanism {name}")


MECHANISM_NAMES = frozenset(
    {ScramMechanism.SCRAM_SHA_256.mechanism_name, ScramMechanism.SCRAM_SHA_512.mechanism_name}
)


@dataclass(frozen=True)
class ScramCredential:
    mechanism: ScramMechanism
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def salted_password(
    mechanism: ScramMechanism, password: str, salt: bytes, iterations: int
) -> bytes:
    return hashlib.pbkdf2_hmac(mechanism.hash_name, password.encode(), salt, iterations)


def credential_from_salted_password(
    mechanism: ScramMechanism, salt: bytes, salted: bytes, iterations: int
) -> ScramCredential:
    client_key = _hmac(mechanism, salted, b"Client Key")
    return ScramCredential(
        mechanism,
        salt,
        hashlib.new(mechanism.hash_name, client_key).digest(),
        _hmac(mechanism, salted, b"Server Key"),
        iterations,
    )


def make_credential(
    mechanism: ScramMechanism, password: str, salt: bytes, iterations: int
) -> ScramCredential:
    salted = salted_password(mechanism, password, salt, iterations)
    return credential_from_salted_password(mechanism, salt, salted, iterations)


def password_matches(credential: ScramCredential, password: str) -> bool:
    expected = make_credential(
        credential.mechanism, password, credential.salt, credential.iterations
    )
    return hmac.compare_digest(expected.stored_key, credential.stored_key)


def _hmac(mechanism: ScramMechanism, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, mechanism.hash_name).digest()


def _fail(message: str) -> KafkaError:
    return KafkaError(ErrorCode.SASL_AUTHENTICATION_FAILED, message)


def _attributes(message: bytes, what: str) -> dict[str, str]:
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        raise _fail(f"the {what} is not UTF-8") from None
    out: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        if len(key) != 1 or not eq:
            raise _fail(f"the {what} has a malformed attribute {part[:40]!r}")
        out.setdefault(key, value)
    return out


def _saslname_decode(name: str) -> str:
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise _fail("the username has an invalid escape")
    return name.replace("=2C", ",").replace("=3D", "=")


def _saslname_encode(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _b64decode(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise _fail(f"the {what} is not base64") from None


class ScramServer:
    """The server side of one exchange: `first` takes client-first and answers server-first;
    `final` takes client-final and answers server-final. Any error is SASL_AUTHENTICATION_FAILED
    (an unknown user fails like a wrong password, so names cannot be probed)."""

    def __init__(
        self,
        mechanism: ScramMechanism,
        lookup: Callable[[str], ScramCredential | None],
        nonce: str,
    ) -> None:
        self.mechanism = mechanism
        self._lookup = lookup
        self._server_nonce = nonce
        self._state = "first"
        self.username: str | None = None
        self._credential: ScramCredential | None = None
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""

    @property
    def complete(self) -> bool:
        return self._state == "done"

    def first(self, client_first: bytes) -> bytes:
        if self._state != "first":
            raise KafkaError(ErrorCode.ILLEGAL_SASL_STATE, "client-first sent twice")
        self._state = "failed"
        text = client_first.decode("utf-8", errors="replace")
        gs2, sep, bare = text.partition(",")
        authzid, sep2, bare = bare.partition(",")
        if not sep or not sep2 or gs2 not in ("n", "y"):
            raise _fail("client-first lacks a GS2 header (channel binding is not supported)")
        attributes = _attributes(bare.encode(), "client-first message")
        if "m" in attributes:
            raise _fail("mandatory extension not supported")
        if "n" not in attributes or "r" not in attributes or not attributes["r"]:
            raise _fail("client-first lacks the username or nonce")
        username = _saslname_decode(attributes["n"])
        if authzid and authzid != f"a={_saslname_encode(username)}":
            raise _fail("the authorization id differs from the username")
        credential = self._lookup(username)
        if credential is None or credential.mechanism != self.mechanism:
            # carry on with a fake credential: the failure comes at the proof, as for a bad password
            credential = make_credential(self.mechanism, self._server_nonce, b"\0" * 16, 4096)
            self._credential = None
        else:
            self._credential = credential
        self.username = username
        self._client_first_bare = bare
        self._nonce = attributes["r"] + self._server_nonce
        salt = base64.b64encode(credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        self._state = "final"
        return self._server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        if self._state != "final":
            raise KafkaError(ErrorCode.ILLEGAL_SASL_STATE, "client-final out of turn")
        self._state = "failed"
        attributes = _attributes(client_final, "client-final message")
        if "c" not in attributes or "r" not in attributes or "p" not in attributes:
            raise _fail("client-final lacks channel binding, nonce or proof")
        # Kafka's ScramSaslServer checks endsWith, not equals: librdkafka before 2.1 sends the
        # client nonce twice (r=<client><client><server>), and its proof covers what it sent
        if not attributes["r"].endswith(self._nonce):
            raise _fail("the nonce does not match")
        if not _b64decode(attributes["c"], "channel binding").startswith((b"n,", b"y,")):
            raise _fail("channel binding is not supported")
        proof = _b64decode(attributes["p"], "client proof")
        without_proof = client_final.decode().rpartition(",p=")[0]
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        credential = self._credential
        if credential is None:
            raise _fail(f"authentication failed for {self.username!r}: bad credentials")
        signature = _hmac(self.mechanism, credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise _fail(f"authentication failed for {self.username!r}: bad credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        stored = hashlib.new(self.mechanism.hash_name, client_key).digest()
        if not hmac.compare_digest(stored, credential.stored_key):
            raise _fail(f"authentication failed for {self.username!r}: bad credentials")
        server_signature = _hmac(self.mechanism, credential.server_key, auth_message)
        self._state = "done"
        return f"v={base64.b64encode(server_signature).decode()}".encode()


class ScramClient:
    """The client side: `first()`, then `final(server_first)`, then `verify(server_final)`
    (which proves the server knew the credential too)."""

    def __init__(self, mechanism: ScramMechanism, username: str, password: str, nonce: str) -> None:
        self.mechanism = mechanism
        self._password = password
        self._client_first_bare = f"n={_saslname_encode(username)},r={nonce}"
        self._nonce = nonce
        self._auth_message = b""
        self._server_key = b""

    def first(self) -> bytes:
        return f"n,,{self._client_first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        attributes = _attributes(server_first, "server-first message")
        if "e" in attributes:
            raise _fail(f"the server refused: {attributes['e']}")
        nonce, salt_b64, iterations = attributes.get("r"), attributes.get("s"), attributes.get("i")
        if not nonce or not nonce.startswith(self._nonce) or salt_b64 is None:
            raise _fail("server-first has a bad nonce or no salt")
        if iterations is None or not iterations.isdigit() or int(iterations) < 1:
            raise _fail("server-first has a bad iteration count")
        salt = _b64decode(salt_b64, "salt")
        salted = salted_password(self.mechanism, self._password, salt, int(iterations))
        without_proof = f"c={base64.b64encode(b'n,,').decode()},r={nonce}"
        self._auth_message = (
            f"{self._client_first_bare},{server_first.decode()},{without_proof}".encode()
        )
        client_key = _hmac(self.mechanism, salted, b"Client Key")
        stored_key = hashlib.new(self.mechanism.hash_name, client_key).digest()
        signature = _hmac(self.mechanism, stored_key, self._auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_key = _hmac(self.mechanism, salted, b"Server Key")
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        attributes = _attributes(server_final, "server-final message")
        if "e" in attributes:
            raise _fail(f"the server refused: {attributes['e']}")
        expected = _hmac(self.mechanism, self._server_key, self._auth_message)
        if not hmac.compare_digest(_b64decode(attributes.get("v", ""), "signature"), expected):
            raise _fail("the server's signature is wrong: it does not know this credential")


def parse_plain(message: bytes) -> tuple[str, str]:
    """SASL/PLAIN's ``authzid NUL authcid NUL password`` → (username, password)."""
    parts = message.split(b"\0")
    if len(parts) != 3:
        raise _fail("a PLAIN message is authzid NUL username NUL password")
    try:
        authzid, username, password = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        raise _fail("a PLAIN message is not UTF-8") from None
    if not username or not password:
        raise _fail("a PLAIN message needs a username and a password")
    if authzid and authzid != username:
        raise _fail("the authorization id differs from the username")
    return username, password


def plain_message(username: str, password: str) -> bytes:
    return b"\0" + username.encode() + b"\0" + password.encode()
