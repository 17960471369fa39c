"""Small text files for keys, certificates and revocations, and the file modes they need.

Operators copy these files between machines (the authority's public key to every node,
an enrollment certificate to the node it was issued for), so they are text: a few
optional `#` comment lines for humans, then a PEM-like armored block::

    # populi enrollment certificate for node 3kq9...
    -----BEGIN POPULI ENROLLMENT CERTIFICATE-----
    lAHEEPq0...
    -----END POPULI ENROLLMENT CERTIFICATE-----

Only the bytes between the BEGIN and END lines count; comments are never trusted (the
armored bytes carry their own signatures). The one exception is the cluster secret: 64
hex digits, so that `openssl rand -hex 32` makes one. Secret key files hold the 32-byte
Ed25519 seed (``node.key`` adds an 8-byte checksum after it, see
`identity.NodeIdentity.load`), are created with mode 0600 inside a 0700 directory, and
are refused on load when group or others could read them, the way ssh refuses a private
key with loose modes.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
import stat
from pathlib import Path

__all__ = [
    "KeyFileError",
    "decode_public_key",
    "encode_public_key",
    "ensure_private_dir",
    "parse_armored",
    "read_armored",
    "read_text_file",
    "write_armored",
    "write_text_file",
]

#: Mode for directories that hold secret keys: only the owner may list or enter them.
PRIVATE_DIR_MODE = 0o700
#: Mode for secret key files: only the owner may read them.
SECRET_FILE_MODE = 0o600
#: Mode for files meant to be copied around (public keys, certificates, revocations).
PUBLIC_FILE_MODE = 0o644
#: Ed25519 public keys and seeds are both 32 bytes.
KEY_BYTES = 32
#: No key, certificate or revocation file is anywhere near this; bigger is a mistake.
_MAX_FILE_BYTES = 1 << 20


class KeyFileError(Exception):
    """A key, certificate or revocation file is missing, unreadable, malformed or unsafe.

    The message is one line an operator can act on (it names the file and the fix).
    """


def encode_public_key(public_key: bytes) -> str:
    """Return the text form of an Ed25519 public key: 64 lowercase hex digits.

    Hex is what `populi-node cluster enroll NODE_PUBLIC_KEY` takes: it survives copy and
    paste, shells and e-mail without quoting.
    """
    if len(public_key) != KEY_BYTES:
        raise ValueError(f"a public key is {KEY_BYTES} bytes, got {len(public_key)}")
    return public_key.hex()


def decode_public_key(text: str) -> bytes:
    """Parse the text form written by `encode_public_key`.

    Raises:
        ValueError: with a one-line reason when `text` is not 64 hex digits.
    """
    cleaned = text.strip().lower()
    if len(cleaned) != 2 * KEY_BYTES:
        raise ValueError(f"a public key is {2 * KEY_BYTES} hex digits, got {len(cleaned)}")
    try:
        return bytes.fromhex(cleaned)
    except ValueError:
        raise ValueError("a public key is hex digits only (0-9, a-f)") from None


def ensure_private_dir(directory: Path) -> None:
    """Create `directory` (and parents) if missing; a directory we create gets mode 0700.

    An existing directory keeps its mode: it may be shared on purpose (for example the
    platform state dir), and the secret files inside carry their own 0600 guard.
    """
    if not directory.exists():
        directory.mkdir(parents=True, mode=PRIVATE_DIR_MODE)
        # mkdir's mode is filtered by the umask; make the result exact.
        os.chmod(directory, PRIVATE_DIR_MODE)
    elif not directory.is_dir():
        raise KeyFileError(f"{directory} exists and is not a directory")


def _armor(label: str, data: bytes, comments: list[str]) -> str:
    encoded = base64.b64encode(data).decode("ascii")
    body = [encoded[i : i + 64] for i in range(0, len(encoded), 64)]
    lines = [f"# {c}" for c in comments]
    lines += [f"-----BEGIN {label}-----", *body, f"-----END {label}-----", ""]
    return "\n".join(lines)


def parse_armored(label: str, text: str, path: Path) -> tuple[bytes, list[str]]:
    """Split `text` into the bytes of its armored block `label` and its ``#`` comments.

    The comments are returned for consistency checks only (see `identity`), never trusted.

    Raises:
        KeyFileError: no block, or the block is not base64.
    """
    comments = [line.strip()[1:].strip() for line in text.splitlines() if line.strip()[:1] == "#"]
    return _unarmor(label, text, path), comments


def _unarmor(label: str, text: str, path: Path) -> bytes:
    begin, end = f"-----BEGIN {label}-----", f"-----END {label}-----"
    lines = [line.strip() for line in text.splitlines()]
    try:
        start = lines.index(begin)
        stop = lines.index(end, start)
    except ValueError:
        raise KeyFileError(f"{path} is not a {label.lower()} file (no {begin} block)") from None
    try:
        return base64.b64decode("".join(lines[start + 1 : stop]), validate=True)
    except (binascii.Error, ValueError):
        raise KeyFileError(f"{path}: the {label.lower()} block is not valid base64") from None


def write_text_file(path: Path, text: str, *, secret: bool, overwrite: bool = False) -> None:
    """Write a small text file atomically, with mode 0600 (`secret`) or 0644.

    The file is written under a temporary name with its final mode already set, then
    linked (or, with `overwrite`, renamed) into place, so a reader never sees a partial
    file and two processes racing to create the same key cannot both win.

    Raises:
        FileExistsError: `path` exists and `overwrite` is false.
    """
    mode = SECRET_FILE_MODE if secret else PUBLIC_FILE_MODE
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            os.fchmod(f.fileno(), mode)  # the umask may have narrowed (or widened) it
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails with FileExistsError instead of clobbering
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def write_armored(
    path: Path,
    label: str,
    data: bytes,
    *,
    secret: bool,
    comments: list[str] | None = None,
    overwrite: bool = False,
) -> None:
    """Write `data` as an armored text file, atomically (see `write_text_file`).

    Raises:
        FileExistsError: `path` exists and `overwrite` is false.
    """
    write_text_file(path, _armor(label, data, comments or []), secret=secret, overwrite=overwrite)


def read_text_file(path: Path, *, secret: bool) -> str:
    """Read a small ASCII text file; for `secret` files, refuse one others may access.

    Raises:
        KeyFileError: missing, unreadable, unsafe mode, too big or not ASCII.
    """
    # Open first and check the open file, so the mode we judge is the file we read.
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise KeyFileError(f"{path} does not exist") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"{path} is not a regular file")
        if secret and os.name == "posix" and st.st_mode & 0o077:
            raise KeyFileError(
                f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: a secret key must not be "
                f"accessible by group or others; fix it with `chmod 600 {path}`"
            )
        try:
            text = f.read(_MAX_FILE_BYTES + 1).decode("ascii")
        except OSError as exc:
            raise KeyFileError(f"cannot read {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise KeyFileError(f"{path} is not ASCII text") from None
    if len(text) > _MAX_FILE_BYTES:
        raise KeyFileError(f"{path} is larger than {_MAX_FILE_BYTES} bytes")
    return text


def read_armored(path: Path, label: str, *, secret: bool) -> bytes:
    """Read the armored block `label` from `path` (see `read_text_file` for the checks).

    Raises:
        KeyFileError: missing, unreadable, unsafe mode, or no valid block.
    """
    return _unarmor(label, read_text_file(path, secret=secret), path)
