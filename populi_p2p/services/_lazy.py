"""Importing what a service needs late, without stalling the event loop.

A node answers its API and its probes before it loads the GPU probe modules, the
inference package or the HTTP client, so start-up costs less CPU. When they are loaded, a
worker thread does it, so that the Trio loop goes on acking pings and answering the
API meanwhile (the import lock makes a concurrent import from the loop wait safely).
"""

from __future__ import annotations

import importlib

import trio

__all__ = ["import_in_thread"]


def _import_all(names: tuple[str, ...]) -> None:
    for name in names:
        importlib.import_module(name)


async def import_in_thread(*names: str) -> None:
    """Import the modules `names` (absolute) in a worker thread; return once loaded."""
    await trio.to_thread.run_sync(_import_all, names)
