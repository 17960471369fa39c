"""Fixtures for the overlay tests: transports on loopback, and the envelope tests'
authenticators (`auth_cluster.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio

from overlay.auth import PacketAuthenticator
from overlay.transport import Transport

from .auth_cluster import ALICE, BOB, make_authenticator
from .ovtest_support import LOOPBACK

StartTransport = Callable[..., Any]


@pytest.fixture
async def start_transport(nursery: trio.Nursery) -> AsyncIterator[StartTransport]:
    """Start `Transport(host, 0, ...)` instances in the test's nursery; they stop with it."""

    async def start(host: str = "127.0.0.1", **kwargs: Any) -> Transport:
        kwargs.setdefault("policy", LOOPBACK)
        transport = Transport(host, 0, **kwargs)
        await nursery.start(transport.run)
        return transport

    yield start


@pytest.fixture
def alice() -> PacketAuthenticator:
    return make_authenticator(ALICE)


@pytest.fixture
def bob() -> PacketAuthenticator:
    return make_authenticator(BOB)
