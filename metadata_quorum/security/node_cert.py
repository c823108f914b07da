"""``RAFTLOG-NODE-CERT``: raftlog's own SASL mechanism, by which a node (or any client holding
a certificate) proves its certificate over the gRPC Authentication service. It is not a Kafka
mechanism and is never offered on the KAFKA listener.

Why it exists: grpcio's server credentials either *require* a client certificate in the TLS
handshake or ask for none; they cannot *request* one. A SASL_SSL gRPC listener whose SCRAM
clients come without certificates therefore cannot ask the nodes for theirs in TLS, so the
nodes prove them at the application level instead, as a challenge-response:

1. the client's first SaslAuthenticate (empty auth_bytes) gets a fresh challenge
   ``raftlog-node-cert-v1 listener=<LISTENER> nonce=<random>`` and an exchange id;
2. the client answers with its certificate chain (PEM, from its keystore) and its private key's
   signature over the challenge (ECDSA with SHA-256, RSA-PSS with SHA-256, or Ed25519);
3. the server verifies the chain against its truststore (RFC 5280 path validation, the client
   certificate's validity period and its clientAuth key usage), the signature with the leaf's
   public key, maps the leaf's subject through ``ssl.principal.mapping.rules`` and issues a
   session token as after SCRAM. An exchange is used once: a replayed answer is refused.

The challenge is bound to this TLS connection's server only through TLS itself (the client
checked the server's certificate); its fixed prefix keeps the signature from meaning anything
outside this exchange. Pure functions: the verifying time is passed in.
"""

from __future__ import annotations

import base64
import datetime
import json

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.x509 import verification

from raftlog.errors import ErrorCode, KafkaError

NODE_CERT_MECHANISM = "RAFTLOG-NODE-CERT"
CHALLENGE_PREFIX = b"raftlog-node-cert-v1 "
MAX_CHAIN_DEPTH = 8
MAX_MESSAGE_BYTES = 64 * 1024  # a certificate chain and a signature

_FAILED = ErrorCode.SASL_AUTHENTICATION_FAILED


def challenge(listener: str, nonce: str) -> bytes:
    """The server's first message: what the client signs."""
    return CHALLENGE_PREFIX + f"listener={listener} nonce={nonce}".encode()


# -- the client ---------------------------------------------------------------------------------
def answer(challenge_bytes: bytes, chain_pem: bytes, key_pem: bytes) -> bytes:
    """The client's message: its chain and its signature over `challenge_bytes`. A challenge
    without raftlog's prefix is refused, so a server cannot get anything else signed."""
    if not challenge_bytes.startswith(CHALLENGE_PREFIX):
        raise KafkaError(ErrorCode.ILLEGAL_SASL_STATE, "not a RAFTLOG-NODE-CERT challenge")
    key = serialization.load_pem_private_key(key_pem, password=None)
    signature = _sign(key, challenge_bytes)
    message = {"chain": chain_pem.decode(), "signature": base64.b64encode(signature).decode()}
    return json.dumps(message).encode()


def _sign(key: object, data: bytes) -> bytes:
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(data, ec.ECDSA(hashes.SHA256()))
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(data, _pss(), hashes.SHA256())
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(data)
    raise KafkaError(_FAILED, f"{type(key).__name__}: use an EC, RSA or Ed25519 key")


def _pss() -> padding.PSS:
    return padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.DIGEST_LENGTH)


# -- the server ---------------------------------------------------------------------------------
def verify(
    message: bytes,
    challenge_bytes: bytes,
    certificate_authorities: list[x509.Certificate],
    now: datetime.datetime,
) -> str:
    """The verified leaf certificate's subject (RFC 2253, most specific first, as
    ``ssl.principal.mapping.rules`` expect), or KafkaError(SASL_AUTHENTICATION_FAILED) saying
    what failed: a malformed message, a chain not signed by a trusted CA, an expired or
    not-yet-valid certificate, a certificate not for client authentication, a bad signature."""
    chain, signature = _parse(message)
    leaf, intermediates = chain[0], chain[1:]
    policy = (
        verification.PolicyBuilder()
        .store(verification.Store(certificate_authorities))
        .time(now)
        .max_chain_depth(MAX_CHAIN_DEPTH)
        .extension_policies(
            ca_policy=verification.ExtensionPolicy.webpki_defaults_ca(),
            # a client certificate need not name a host (CN=alice has no SAN)
            ee_policy=verification.ExtensionPolicy.webpki_defaults_ee().may_be_present(
                x509.SubjectAlternativeName, verification.Criticality.AGNOSTIC, None
            ),
        )
    )
    try:
        policy.build_client_verifier().verify(leaf, intermediates)
    except verification.VerificationError as error:
        raise KafkaError(_FAILED, f"certificate {_name(leaf)} not trusted: {error}") from None
    _check_signature(leaf, signature, challenge_bytes)
    return leaf.subject.rfc4514_string()


def claimed_subject(message: bytes) -> str:
    """The subject the message's leaf certificate names, verified or not (for audit lines)."""
    try:
        return _name(_parse(message)[0][0])
    except KafkaError:
        return "(no certificate)"


def _parse(message: bytes) -> tuple[list[x509.Certificate], bytes]:
    if len(message) > MAX_MESSAGE_BYTES:
        raise KafkaError(_FAILED, f"message over {MAX_MESSAGE_BYTES} bytes")
    try:
        fields = json.loads(message)
        chain = x509.load_pem_x509_certificates(fields["chain"].encode())
        signature = base64.b64decode(fields["signature"], validate=True)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise KafkaError(
            _FAILED, f"malformed {NODE_CERT_MECHANISM} message ({error}): expected JSON "
            '{"chain": "<PEM certificates>", "signature": "<base64>"}',
        ) from None  # fmt: skip
    if not chain or len(chain) > MAX_CHAIN_DEPTH:
        raise KafkaError(_FAILED, f"the chain must hold 1 to {MAX_CHAIN_DEPTH} certificates")
    return chain, signature


def _check_signature(leaf: x509.Certificate, signature: bytes, data: bytes) -> None:
    key = leaf.public_key()
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, data, _pss(), hashes.SHA256())
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, data)
        else:
            raise KafkaError(_FAILED, f"certificate {_name(leaf)}: unsupported key type")
    except (InvalidSignature, UnsupportedAlgorithm):
        raise KafkaError(
            _FAILED, f"the signature does not match certificate {_name(leaf)}'s key"
        ) from None


def _name(certificate: x509.Certificate) -> str:
    return certificate.subject.rfc4514_string() or "(empty subject)"
