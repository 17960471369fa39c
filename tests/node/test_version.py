"""`populi_p2p._version`: the package's version and the membership protocol's."""

from __future__ import annotations

import importlib.metadata

import pytest

import swim
from populi_p2p import _version


def test_the_software_version_is_the_installed_packages() -> None:
    assert _version.software_version() == importlib.metadata.version("populi-p2p")


def test_a_bare_checkout_says_the_same_without_package_metadata(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The version is written once, in the module: no metadata lookup at all."""

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert _version.software_version() == _version.VERSION


def test_the_protocol_version_is_swims() -> None:
    assert _version.protocol_version() == int(swim.PROTOCOL_VERSION)
    assert type(_version.protocol_version()) is int
