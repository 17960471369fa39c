"""What the inference services' httpx clients build once instead of every time.

httpx builds a new TLS context (and reads the whole CA bundle, ~40 ms) for every
client it creates, even one that only ever speaks plain HTTP on loopback; and it parses
a URL given as text on every request (~0.1 ms, a good part of a relayed request's own
cost). Both are built once here, with the same verification and the same URLs.
"""

from __future__ import annotations

import functools
import ssl

import httpx

__all__ = ["tls_context", "url"]


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying context, built once per process."""
    return httpx.create_ssl_context()


@functools.lru_cache(maxsize=1024)
def url(base: str, path: str) -> httpx.URL:
    """``base + path`` parsed once (a node talks to a few peers, on a few paths)."""
    return httpx.URL(base + path)
