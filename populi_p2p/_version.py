"""This build's version: the package's, and the membership protocol's.

Kept apart from the services so that `populi-node --version` imports nothing else.
`VERSION` is the one place the package's version is written: pyproject.toml reads it
from here at build time, so the daemon needs no `importlib.metadata` (and the email,
zipfile and csv modules it loads, about 1.5 MiB resident) to know it.
"""

from __future__ import annotations

from typing import Final

__all__ = ["VERSION", "protocol_version", "software_version"]

#: The package's version (pyproject.toml's ``[tool.setuptools.dynamic]`` reads it).
VERSION: Final = "0.1.0"


def software_version() -> str:
    """The package's version, as installed and as in the checkout."""
    return VERSION


def protocol_version() -> int:
    """The membership wire format's version (`swim.PROTOCOL_VERSION`): members with
    different ones cannot talk."""
    from swim import PROTOCOL_VERSION

    return int(PROTOCOL_VERSION)
