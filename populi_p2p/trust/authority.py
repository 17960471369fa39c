"""The cluster authority: the one key that decides who is a member of a cluster.

A cluster *is* its authority key. The operator creates it once (`populi-node cluster
init`), keeps the secret half on one trusted machine (it never needs to be online: the
mesh runs without it), and copies the public half to every node. With it the operator
enrolls a machine (signs an `EnrollmentCertificate` for the machine's node public key)
and removes one (signs a `Revocation`, which the nodes gossip).

Files in the authority directory::

    authority.key   secret Ed25519 seed, armored, mode 0600 (keep it off the mesh)
    authority.pub   public key, armored: copy it to every node

The cluster fingerprint (16 hex digits, the hex of `authority_key_id`) names the cluster
in mDNS TXT records and `status`: nodes only try to join peers with their fingerprint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import attrs
import nacl.secret
import nacl.signing
import nacl.utils

from ._keyfiles import (
    KEY_BYTES,
    KeyFileError,
    encode_public_key,
    ensure_private_dir,
    read_armored,
    read_text_file,
    write_armored,
    write_text_file,
)
from .certificate import (
    CERTIFICATE_CONTEXT,
    DEFAULT_SCOPE,
    EnrollmentCertificate,
    authority_key_id,
    check_scope,
)
from .revocation import REVOCATION_CONTEXT, Revocation

__all__ = [
    "AUTHORITY_KEY_FILE",
    "AUTHORITY_PUBLIC_FILE",
    "ClusterAuthority",
    "cluster_fingerprint",
    "generate_cluster_secret",
    "read_authority_public_key",
    "read_cluster_secret",
    "write_authority_public_key",
    "write_cluster_secret",
]

#: Secret key file name inside the authority directory.
AUTHORITY_KEY_FILE: Final = "authority.key"
#: Public key file name inside the authority directory.
AUTHORITY_PUBLIC_FILE: Final = "authority.pub"
#: Bytes in a cluster secret (a `nacl.secret.SecretBox` key).
CLUSTER_SECRET_BYTES: Final = nacl.secret.SecretBox.KEY_SIZE
_SECRET_LABEL: Final = "POPULI AUTHORITY SECRET KEY"
_PUBLIC_LABEL: Final = "POPULI AUTHORITY PUBLIC KEY"


def cluster_fingerprint(authority_public_key: bytes) -> str:
    """The cluster's short name: 16 lowercase hex digits of a hash of the authority key."""
    return authority_key_id(authority_public_key).hex()


def write_authority_public_key(path: Path, public_key: bytes, *, overwrite: bool = False) -> None:
    """Write an authority public key file (what every node of the cluster needs)."""
    write_armored(
        path,
        _PUBLIC_LABEL,
        public_key,
        secret=False,
        overwrite=overwrite,
        comments=[
            f"populi cluster {cluster_fingerprint(public_key)}: authority public key",
            f"{encode_public_key(public_key)}",
        ],
    )


def read_authority_public_key(path: Path) -> bytes:
    """Read an authority public key file.

    Raises:
        KeyFileError: missing, unreadable, or not an authority public key file.
    """
    key = read_armored(path, _PUBLIC_LABEL, secret=False)
    if len(key) != KEY_BYTES:
        raise KeyFileError(f"{path}: an authority public key is {KEY_BYTES} bytes, not {len(key)}")
    return key


def generate_cluster_secret() -> bytes:
    """A fresh random cluster secret (for LANs without an overlay: see docs/security.md)."""
    return bytes(nacl.utils.random(CLUSTER_SECRET_BYTES))


def write_cluster_secret(path: Path, secret: bytes) -> None:
    """Write a cluster secret file: 64 hex digits, mode 0600.

    The format is plain hex so an operator can also make one with
    ``(umask 077; openssl rand -hex 32 > cluster.secret)``. Copy it to every node over a
    safe channel.

    Raises:
        FileExistsError: `path` exists already.
    """
    if len(secret) != CLUSTER_SECRET_BYTES:
        raise ValueError(f"a cluster secret is {CLUSTER_SECRET_BYTES} bytes")
    write_text_file(path, secret.hex() + "\n", secret=True)


def read_cluster_secret(path: Path) -> bytes:
    """Read a cluster secret file (64 hex digits), refusing one readable by others.

    Raises:
        KeyFileError: missing, malformed, or readable by group or others.
    """
    text = "".join(read_text_file(path, secret=True).split())
    if len(text) != 2 * CLUSTER_SECRET_BYTES:
        raise KeyFileError(
            f"{path}: a cluster secret is {2 * CLUSTER_SECRET_BYTES} hex digits"
            " (make one with: openssl rand -hex 32)"
        )
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise KeyFileError(f"{path}: a cluster secret is hex digits only (0-9, a-f)") from None


@attrs.frozen(repr=False)
class ClusterAuthority:
    """The authority's signing key, and the two things it signs: enrollments, revocations."""

    _signing_key: nacl.signing.SigningKey
    #: The raw 32-byte Ed25519 public key every node of the cluster carries.
    public_key: bytes = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "public_key", bytes(self._signing_key.verify_key))

    def __repr__(self) -> str:
        return f"ClusterAuthority(fingerprint={self.fingerprint!r})"

    @property
    def fingerprint(self) -> str:
        """See `cluster_fingerprint`."""
        return cluster_fingerprint(self.public_key)

    @property
    def key_id(self) -> bytes:
        """See `certificate.authority_key_id`."""
        return authority_key_id(self.public_key)

    @classmethod
    def generate(cls) -> ClusterAuthority:
        """A fresh authority in memory only (tests, simulations)."""
        return cls(nacl.signing.SigningKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> ClusterAuthority:
        """The authority with Ed25519 seed `seed` (32 bytes): deterministic, for tests."""
        if len(seed) != KEY_BYTES:
            raise ValueError(f"an Ed25519 seed is {KEY_BYTES} bytes, got {len(seed)}")
        return cls(nacl.signing.SigningKey(seed))

    @classmethod
    def create(cls, directory: Path) -> ClusterAuthority:
        """Create a new authority in `directory` (made 0700 if new); refuse to overwrite one.

        Raises:
            FileExistsError: the directory already holds an authority key.
        """
        ensure_private_dir(directory)
        authority = cls.generate()
        write_armored(
            directory / AUTHORITY_KEY_FILE,
            _SECRET_LABEL,
            bytes(authority._signing_key),
            secret=True,
            comments=[
                f"populi cluster {authority.fingerprint}: authority SECRET key",
                "whoever holds this file decides who is in the cluster; keep it offline",
            ],
        )
        write_authority_public_key(
            directory / AUTHORITY_PUBLIC_FILE, authority.public_key, overwrite=True
        )
        return authority

    @classmethod
    def load(cls, directory: Path) -> ClusterAuthority:
        """Load the authority from `directory`.

        Raises:
            KeyFileError: the key file is missing, malformed, or readable by others.
        """
        path = directory / AUTHORITY_KEY_FILE
        seed = read_armored(path, _SECRET_LABEL, secret=True)
        if len(seed) != KEY_BYTES:
            raise KeyFileError(f"{path}: an authority key holds {KEY_BYTES} bytes, not {len(seed)}")
        return cls.from_seed(seed)

    def _sign(self, context: bytes, body: bytes) -> bytes:
        return body + bytes(self._signing_key.sign(context + body).signature)

    def enroll(
        self,
        node_public_key: bytes,
        scope: str = DEFAULT_SCOPE,
        expires_in: float | None = None,
        *,
        now: float,
        serial: int | None = None,
    ) -> EnrollmentCertificate:
        """Issue a certificate admitting `node_public_key` to the cluster.

        Args:
            node_public_key: the node's raw 32-byte public key.
            scope: what the node may do; verifiers require "member" by default.
            expires_in: validity in seconds from `now`; None for no expiry.
            now: realtime, Unix seconds (becomes `issued_at`, rounded down).
            serial: the certificate serial; random 64-bit by default, so the authority
                keeps no state between enrollments.

        Raises:
            ValueError: bad key length, scope, or a non-positive `expires_in`.
        """
        if len(node_public_key) != KEY_BYTES:
            raise ValueError(f"a public key is {KEY_BYTES} bytes, got {len(node_public_key)}")
        check_scope(scope)
        if expires_in is not None and not expires_in > 0:
            raise ValueError("expires_in must be positive (or None for no expiry)")
        issued_at = int(now)
        expires_at = None if expires_in is None else int(now + expires_in)
        if serial is None:
            serial = int.from_bytes(nacl.utils.random(8), "big")
        body = EnrollmentCertificate.encode_body(
            self.key_id, node_public_key, scope, issued_at, expires_at, serial
        )
        raw = self._sign(CERTIFICATE_CONTEXT, body)
        return EnrollmentCertificate(
            self.key_id, node_public_key, scope, issued_at, expires_at, serial, raw
        )

    def sign_statement(self, context: bytes, body: bytes) -> bytes:
        """``body || signature`` over ``context + body``: for other signed statements
        of the authority (API keys, `populi_p2p.inference.keys`), each with its own
        context so that no statement can pass for another."""
        if context in (CERTIFICATE_CONTEXT, REVOCATION_CONTEXT):
            raise ValueError("certificates and revocations have their own methods")
        return self._sign(context, body)

    def revoke(
        self,
        *,
        now: float,
        serial: int | None = None,
        node_public_key: bytes | None = None,
        api_key_id: bytes | None = None,
    ) -> Revocation:
        """Sign a revocation of one certificate (`serial`) or of a node key (all its certs).

        Raises:
            ValueError: not exactly one of `serial` and `node_public_key`, or a bad key.
        """
        if node_public_key is not None and len(node_public_key) != KEY_BYTES:
            raise ValueError(f"a public key is {KEY_BYTES} bytes, got {len(node_public_key)}")
        body = Revocation.encode_body(self.key_id, serial, node_public_key, int(now), api_key_id)
        raw = self._sign(REVOCATION_CONTEXT, body)
        return Revocation(self.key_id, serial, node_public_key, int(now), raw, api_key_id)
