"""One TLS context for every httpx client of the inference services.

httpx builds a new context (and reads the whole CA bundle, ~40 ms) for every client it
creates, even one that only ever speaks plain HTTP on loopback. Building it once keeps
the verification the same and makes a client cheap to create.
"""

from __future__ import annotations

import functools
import ssl

import httpx

__all__ = ["tls_context"]


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying context, built once per process."""
    return httpx.create_ssl_context()
