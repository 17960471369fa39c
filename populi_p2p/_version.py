"""This build's version: the package's, and the membership protocol's.

Kept apart from the services so that `populi-node --version` imports nothing else.
"""

from __future__ import annotations

import importlib.metadata

__all__ = ["protocol_version", "software_version"]


def software_version() -> str:
    """The installed package's version (``0.1.0+src`` when run from a bare checkout)."""
    try:
        return importlib.metadata.version("populi-p2p")
    except importlib.metadata.PackageNotFoundError:
        return "0.1.0+src"


def protocol_version() -> int:
    """The membership wire format's version (`swim.PROTOCOL_VERSION`): members with
    different ones cannot talk."""
    from swim import PROTOCOL_VERSION

    return int(PROTOCOL_VERSION)
