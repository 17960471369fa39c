"""``node.key`` carries a checksum: a corrupted file is refused as corrupt (issue 7 §5).

Before the checksum any 32 bytes loaded as a (different) key, and the failure surfaced
later as a certificate ``key_mismatch``.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.trust._keyfiles import write_armored
from populi_p2p.trust.identity import KeyFileError, NodeIdentity, encode_public_key

_LABEL = "POPULI NODE SECRET KEY"
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _body_lines(text: str) -> list[int]:
    lines = text.splitlines()
    start = lines.index(f"-----BEGIN {_LABEL}-----")
    stop = lines.index(f"-----END {_LABEL}-----")
    return list(range(start + 1, stop))


@settings(max_examples=60)
@given(data=st.data())
def test_any_one_character_change_is_refused_as_corrupt(tmp_path_factory, data) -> None:
    # A fixed key: the strategies below depend on the file's shape, which must not change
    # between runs of one example (a fresh random key made Hypothesis report it flaky).
    state = tmp_path_factory.mktemp("k")
    original = NodeIdentity.from_seed(bytes(range(32)))
    key = state / "node.key"
    original.save(key)
    lines = key.read_text().splitlines()
    row = data.draw(st.sampled_from(_body_lines(key.read_text())))
    col = data.draw(st.integers(0, len(lines[row].rstrip("=")) - 1))
    new = data.draw(st.sampled_from(_B64).filter(lambda c: c != lines[row][col]))
    lines[row] = lines[row][:col] + new + lines[row][col + 1 :]
    key.write_text("\n".join(lines) + "\n")
    os.chmod(key, 0o600)
    try:
        loaded = NodeIdentity.load(key)
    except KeyFileError as exc:
        assert "corrupt" in str(exc)
        assert "populi-node key" in str(exc)  # says how to recover
        assert "\n" not in str(exc)
    else:
        # Only a change in base64's unused low bits can leave the bytes unchanged.
        assert loaded.public_key == original.public_key


def test_new_files_carry_the_checksum(tmp_path: Path) -> None:
    NodeIdentity.load_or_create(tmp_path)
    text = (tmp_path / "node.key").read_text()
    body = "".join(text.splitlines()[i] for i in _body_lines(text))
    assert len(base64.b64decode(body)) == 40  # 32-byte seed + 8-byte checksum


def _write_old_format(path: Path, seed: bytes, public_comment: str | None) -> None:
    comments = ["populi node x: keep this file secret (mode 0600)"]
    if public_comment is not None:
        comments.append(f"public key {public_comment}")
    write_armored(path, _LABEL, seed, secret=True, comments=comments)


def test_old_format_without_checksum_still_loads(tmp_path: Path) -> None:
    seed = bytes(range(32))
    expected = NodeIdentity.from_seed(seed)
    _write_old_format(tmp_path / "a.key", seed, encode_public_key(expected.public_key))
    assert NodeIdentity.load(tmp_path / "a.key").node_id == expected.node_id
    _write_old_format(tmp_path / "b.key", seed, None)  # no comment: nothing to compare
    assert NodeIdentity.load(tmp_path / "b.key").node_id == expected.node_id


def test_old_format_disagreeing_with_its_public_key_line_is_corrupt(tmp_path: Path) -> None:
    seed = bytes(range(32))
    other = NodeIdentity.from_seed(bytes(32))
    _write_old_format(tmp_path / "node.key", seed, encode_public_key(other.public_key))
    with pytest.raises(KeyFileError, match="corrupt"):
        NodeIdentity.load(tmp_path / "node.key")


def test_wrong_length_is_corrupt(tmp_path: Path) -> None:
    write_armored(tmp_path / "node.key", _LABEL, b"x" * 33, secret=True)
    with pytest.raises(KeyFileError, match="corrupt"):
        NodeIdentity.load(tmp_path / "node.key")
