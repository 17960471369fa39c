"""Start-up checks that turn the operating system's refusals into one line each.

Run before anything is written or bound, so that a read-only or full state dir, a
socket path too long for a unix socket, or an address in use is reported as what it
is, with the fix, rather than as a traceback from whichever library hit it first.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from .errors import NodeStartError, describe_os_error

__all__ = ["UNIX_PATH_MAX", "check_state_dir", "describe_os_error"]

#: Longest unix socket path the kernel accepts, bytes (``sun_path`` less the NUL).
UNIX_PATH_MAX: Final = 107
#: Bytes written (and removed) to prove the state dir takes data, not only names.
_PROBE_BYTES: Final = 4096
_PROBE_NAME: Final = ".populi-write-test"


def check_state_dir(state_dir: Path, api_socket: Path) -> None:
    """The state dir exists or can be made, takes a small write, and the API socket
    path fits a unix socket.

    Raises:
        NodeStartError: one line naming the problem and the fix.
    """
    fix = "pass a writable --state-dir, or remount it read-write"
    size = len(os.fsencode(str(api_socket)))
    if size > UNIX_PATH_MAX:
        raise NodeStartError(
            f"the API socket path {str(api_socket)!r} is {size} bytes, over the"
            f" {UNIX_PATH_MAX}-byte limit of unix sockets (use a shorter --state-dir)"
        )
    try:
        if not state_dir.exists():
            state_dir.mkdir(parents=True, mode=0o700)
            os.chmod(state_dir, 0o700)
        elif not state_dir.is_dir():
            raise NodeStartError(f"state dir {state_dir} is not a directory (check --state-dir)")
        probe = state_dir / _PROBE_NAME
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * _PROBE_BYTES)
        finally:
            os.close(fd)
            try:
                probe.unlink()
            except OSError:
                pass
    except OSError as exc:
        raise NodeStartError(describe_os_error(exc, f"state dir {state_dir}", fix)) from None
