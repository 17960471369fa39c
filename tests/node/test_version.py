"""`populi_p2p._version`: the package's version and the membership protocol's."""

from __future__ import annotations

import importlib.metadata

import pytest

import swim
from populi_p2p import _version


def test_the_software_version_is_the_installed_packages() -> None:
    assert _version.software_version() == importlib.metadata.version("populi-p2p")


def test_a_bare_checkout_says_src(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert _version.software_version() == "0.1.0+src"


def test_the_protocol_version_is_swims() -> None:
    assert _version.protocol_version() == int(swim.PROTOCOL_VERSION)
    assert type(_version.protocol_version()) is int
