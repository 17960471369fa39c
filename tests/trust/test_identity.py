"""Node identity on disk: file modes, restarts keep the node id, unsafe files are refused."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.trust.identity import (
    NODE_ID_LENGTH,
    KeyFileError,
    NodeIdentity,
    decode_public_key,
    encode_public_key,
    node_id_from_public_key,
    verify_signature,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_first_start_creates_private_dir_and_key(tmp_path: Path) -> None:
    state = tmp_path / "state" / "populi"
    identity = NodeIdentity.load_or_create(state)
    assert _mode(state) == 0o700
    assert _mode(state / "node.key") == 0o600
    assert len(identity.node_id) == NODE_ID_LENGTH


def test_restart_keeps_node_id(tmp_path: Path) -> None:
    first = NodeIdentity.load_or_create(tmp_path)
    second = NodeIdentity.load_or_create(tmp_path)
    assert second.node_id == first.node_id
    assert second.public_key == first.public_key
    # The reloaded key signs what the first one's public key verifies.
    assert verify_signature(first.public_key, b"ctx", b"msg", second.sign(b"ctx", b"msg"))


def test_umask_does_not_loosen_key_mode(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        NodeIdentity.load_or_create(tmp_path / "s")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "s") == 0o700
    assert _mode(tmp_path / "s" / "node.key") == 0o600


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_key_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    NodeIdentity.load_or_create(tmp_path)
    os.chmod(tmp_path / "node.key", mode)
    with pytest.raises(KeyFileError, match="chmod 600"):
        NodeIdentity.load_or_create(tmp_path)


def test_malformed_key_file_is_a_clear_error(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    key.write_text("not a key\n")
    os.chmod(key, 0o600)
    with pytest.raises(KeyFileError, match=r"node\.key"):
        NodeIdentity.load_or_create(tmp_path)


def test_save_never_overwrites(tmp_path: Path) -> None:
    NodeIdentity.generate().save(tmp_path / "k")
    with pytest.raises(FileExistsError):
        NodeIdentity.generate().save(tmp_path / "k")


def test_concurrent_first_starts_agree(tmp_path: Path) -> None:
    results: list[str] = []

    def start() -> None:
        results.append(NodeIdentity.load_or_create(tmp_path).node_id)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and len(set(results)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.key"]  # no temp files left


def test_repr_never_shows_the_secret() -> None:
    seed = b"s" * 32
    identity = NodeIdentity.from_seed(seed)
    assert repr(identity) == f"NodeIdentity(node_id={identity.node_id!r})"
    assert seed.hex() not in repr(identity)


def test_node_id_depends_only_on_public_key() -> None:
    a, b = NodeIdentity.from_seed(b"a" * 32), NodeIdentity.from_seed(b"b" * 32)
    assert a.node_id == node_id_from_public_key(a.public_key)
    assert a.node_id != b.node_id
    assert a.node_id.isalnum() and a.node_id == a.node_id.lower()


@settings(max_examples=50, deadline=None)
@given(st.binary(min_size=32, max_size=32))
def test_public_key_text_round_trip(key: bytes) -> None:
    assert decode_public_key(encode_public_key(key)) == key
    assert decode_public_key("  " + encode_public_key(key).upper() + "\n") == key


@pytest.mark.parametrize("text", ["", "abc", "zz" * 32, "00" * 33])
def test_bad_public_key_text_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        decode_public_key(text)


def test_signature_contexts_do_not_mix(node: NodeIdentity) -> None:
    signature = node.sign(b"populi/record/v1", b"body")
    assert verify_signature(node.public_key, b"populi/record/v1", b"body", signature)
    assert not verify_signature(node.public_key, b"populi/packet/v1", b"body", signature)
    assert not verify_signature(node.public_key, b"populi/record/v1", b"bodx", signature)
    assert not verify_signature(b"\x00" * 31, b"populi/record/v1", b"body", signature)
    assert not verify_signature(node.public_key, b"populi/record/v1", b"body", signature[:-1])


def test_node_id_hash_is_libsodium_blake2b(node: NodeIdentity) -> None:
    """The id uses hashlib's BLAKE2b for speed; it must equal libsodium's, byte for byte."""
    import base64

    import nacl.encoding
    import nacl.hash

    digest = nacl.hash.blake2b(
        node.public_key,
        digest_size=10,
        person=b"populi-node-id\x00\x00",
        encoder=nacl.encoding.RawEncoder,
    )
    assert node.node_id == base64.b32encode(digest).decode().lower()
