"""A node's Ed25519 identity: the key pair it signs with and the node id derived from it.

Why the node id is derived from the public key rather than chosen: a name or an address
can be claimed by anybody and changes when a laptop moves between networks, but only
the holder of the secret key can sign as its public key. Deriving the id from the key
makes "this record / packet is from node X" checkable by anyone with no lookup, and
keeps the id stable across restarts and address changes as long as the key file stays.

The id is the first 80 bits of a personalised BLAKE2b of the public key, in lowercase
RFC 4648 base32 without padding (16 characters, for example ``"3kq9..."``). 80 bits make
a second preimage (a new key whose id equals a victim's) cost about 2**80 hashes, while
keeping the id short enough to travel in every gossip message as the member name. It is
a name, not a credential: everything that matters is checked against the full key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path
from typing import Final

import attrs
import nacl.exceptions
import nacl.signing

from ._keyfiles import (
    KEY_BYTES,
    KeyFileError,
    decode_public_key,
    encode_public_key,
    ensure_private_dir,
    parse_armored,
    read_text_file,
    write_armored,
)

__all__ = [
    "NODE_ID_LENGTH",
    "SIGNATURE_BYTES",
    "KeyFileError",
    "NodeIdentity",
    "decode_public_key",
    "encode_public_key",
    "node_id_from_public_key",
    "verify_signature",
]

#: Bytes in an Ed25519 signature.
SIGNATURE_BYTES: Final = 64
#: File name of the node's secret key inside its state directory.
KEY_FILE_NAME: Final = "node.key"
#: Armor label of a node secret key file.
_SECRET_LABEL: Final = "POPULI NODE SECRET KEY"
#: Bytes of the checksum after the seed in a ``node.key`` block (see `NodeIdentity.load`).
KEY_CHECKSUM_BYTES: Final = 8
#: BLAKE2b personalisation of that checksum.
_KEY_CHECKSUM_PERSON: Final = b"populi-key-sum\x00\x00"
#: Bytes of hash kept for the node id (80 bits: see the module docstring).
_NODE_ID_DIGEST_BYTES: Final = 10
#: Characters in a node id (10 bytes in unpadded base32).
NODE_ID_LENGTH: Final = 16
#: BLAKE2b personalisation, so the id hash never equals a hash used elsewhere.
_NODE_ID_PERSON: Final = b"populi-node-id\x00\x00"


def node_id_from_public_key(public_key: bytes) -> str:
    """Return the node id for an Ed25519 public key (16 lowercase base32 characters).

    Raises:
        ValueError: `public_key` is not 32 bytes.
    """
    if len(public_key) != KEY_BYTES:
        raise ValueError(f"a public key is {KEY_BYTES} bytes, got {len(public_key)}")
    # hashlib's BLAKE2b is the same function as libsodium's (a test checks they agree)
    # without pynacl's per-call argument checking, which cost 30 us on every packet.
    digest = hashlib.blake2b(
        public_key, digest_size=_NODE_ID_DIGEST_BYTES, person=_NODE_ID_PERSON
    ).digest()
    return base64.b32encode(digest).decode("ascii").lower()


def verify_signature(public_key: bytes, context: bytes, message: bytes, signature: bytes) -> bool:
    """Return whether `signature` is `public_key`'s Ed25519 signature of context+message.

    Every signature in populi covers a context string first (``b"populi/record/v1"``,
    ``b"populi/packet/v1"``, ...), which is not sent, so a signature made for one purpose
    can never be replayed as another (a packet as a record, a record as a certificate).
    Never raises for bad input: a malformed key or signature is simply not valid.
    """
    if len(signature) != SIGNATURE_BYTES or len(public_key) != KEY_BYTES:
        return False
    try:
        nacl.signing.VerifyKey(public_key).verify(context + message, signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.CryptoError, ValueError):
        return False
    return True


@attrs.frozen(repr=False)
class NodeIdentity:
    """A node's Ed25519 key pair and the node id derived from it.

    Build one with `load_or_create` (the daemon), `load`, or `generate` (tests and the
    simulator, in memory only). The secret key never leaves this object except through
    `save`.
    """

    _signing_key: nacl.signing.SigningKey
    #: The raw 32-byte Ed25519 public key.
    public_key: bytes = attrs.field(init=False)
    #: The id other nodes know this node by (see `node_id_from_public_key`).
    node_id: str = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        public_key = bytes(self._signing_key.verify_key)
        object.__setattr__(self, "public_key", public_key)
        object.__setattr__(self, "node_id", node_id_from_public_key(public_key))

    def __repr__(self) -> str:
        # Never print the secret key, even by accident in a log or a traceback.
        return f"NodeIdentity(node_id={self.node_id!r})"

    @classmethod
    def generate(cls) -> NodeIdentity:
        """A fresh random identity, in memory only."""
        return cls(nacl.signing.SigningKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> NodeIdentity:
        """The identity whose Ed25519 seed is `seed` (32 bytes): deterministic, for tests."""
        if len(seed) != KEY_BYTES:
            raise ValueError(f"an Ed25519 seed is {KEY_BYTES} bytes, got {len(seed)}")
        return cls(nacl.signing.SigningKey(seed))

    @classmethod
    def load(cls, key_file: Path) -> NodeIdentity:
        """Load the identity stored in `key_file`, refusing a corrupted file.

        Why a checksum: any 32 bytes are a valid Ed25519 seed, so without one a single
        flipped character loads as a *different* key, and the failure shows up much
        later as a certificate ``key_mismatch``. The block holds the seed followed by
        `KEY_CHECKSUM_BYTES` of a personalised BLAKE2b of it. Files written before the
        checksum existed (a bare 32-byte seed) still load; for them the ``# public key``
        comment line, when present, is compared with the key the seed gives (a
        consistency check, not trust: whoever can write the file owns the node anyway).

        Raises:
            KeyFileError: the file is missing, corrupt, malformed, or readable by others.
        """
        text = read_text_file(key_file, secret=True)
        fix = (
            "restore it from a backup, or move it away and run `populi-node key` to make a"
            " new key (which must be enrolled again)"
        )
        try:
            block, comments = parse_armored(_SECRET_LABEL, text, key_file)
        except KeyFileError as exc:
            raise KeyFileError(f"{exc}: the node key is corrupt; {fix}") from None
        if len(block) == KEY_BYTES + KEY_CHECKSUM_BYTES:
            seed, checksum = block[:KEY_BYTES], block[KEY_BYTES:]
            if not hmac.compare_digest(checksum, _key_checksum(seed)):
                raise KeyFileError(f"{key_file} is corrupt (checksum mismatch); {fix}")
            return cls.from_seed(seed)
        if len(block) != KEY_BYTES:
            raise KeyFileError(
                f"{key_file} is corrupt: a node key holds {KEY_BYTES + KEY_CHECKSUM_BYTES}"
                f" bytes (or {KEY_BYTES} in the old format), not {len(block)}; {fix}"
            )
        identity = cls.from_seed(block)  # the old format: no checksum
        claimed = [c.split()[-1] for c in comments if c.startswith("public key ")]
        if claimed and claimed[0].lower() != encode_public_key(identity.public_key):
            raise KeyFileError(
                f"{key_file} is corrupt (its key does not match its '# public key' line); {fix}"
            )
        return identity

    @classmethod
    def load_or_create(cls, state_dir: Path) -> NodeIdentity:
        """Load ``state_dir/node.key``, creating the directory and a new key on first start.

        Creating is race-free: if two processes start at once, one key wins and both
        load it.

        Raises:
            KeyFileError: the existing key file is malformed or readable by others.
        """
        ensure_private_dir(state_dir)
        key_file = state_dir / KEY_FILE_NAME
        if not key_file.exists():
            try:
                cls.generate().save(key_file)
            except FileExistsError:
                pass  # somebody else created it between our check and our link
        return cls.load(key_file)

    def save(self, key_file: Path) -> None:
        """Write the secret key to `key_file` (mode 0600); never overwrites.

        Raises:
            FileExistsError: `key_file` exists already.
        """
        seed = bytes(self._signing_key)
        write_armored(
            key_file,
            _SECRET_LABEL,
            seed + _key_checksum(seed),
            secret=True,
            comments=[
                f"populi node {self.node_id}: keep this file secret (mode 0600)",
                f"public key {encode_public_key(self.public_key)}",
            ],
        )

    def sign(self, context: bytes, message: bytes) -> bytes:
        """Return the 64-byte Ed25519 signature of context+message (see `verify_signature`)."""
        return bytes(self._signing_key.sign(context + message).signature)


def _key_checksum(seed: bytes) -> bytes:
    """The checksum stored after the seed in ``node.key`` (detects corruption, not forgery)."""
    return hashlib.blake2b(
        seed, digest_size=KEY_CHECKSUM_BYTES, person=_KEY_CHECKSUM_PERSON
    ).digest()
