"""Fixtures for the overlay tests.

This directory deliberately has no `__init__.py`: the tests root has none either, so a
package here would be imported as `overlay` and shadow the real package. Its modules
are imported by their file names (`netns`, `ns_agent`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
from ovtest_support import LOOPBACK

from overlay.transport import Transport

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
