"""What the inference services' httpx clients build once instead of every time.

httpx builds a new TLS context (and reads the whole CA bundle, ~40 ms) for every
client it creates, even one that only ever speaks plain HTTP on loopback; and it parses
a URL given as text on every request (~0.1 ms, a good part of a relayed request's own
cost). Both are built once here, with the same verification and the same URLs.

The context reads its CA bundle at its first TLS connection, not when it is built: the
peer API is plain HTTP (its calls are signed), so a node whose engines are all
``http://`` never needs it, and the bundle held in memory costs about 2 MiB resident.
"""

from __future__ import annotations

import functools
import os
import ssl
import sys
from typing import Any

import httpx

__all__ = ["tls_context", "url"]


class _VerifyingContext(ssl.SSLContext):
    """`httpx.create_ssl_context()`'s context (a TLS client, certificates and host names
    checked, the CAs of ``SSL_CERT_FILE``, else ``SSL_CERT_DIR``, else certifi's bundle),
    which loads those CAs when it first wraps a connection."""

    _cas_loaded = False

    def _load_cas(self) -> None:
        if self._cas_loaded:
            return
        if os.environ.get("SSL_CERT_FILE"):
            self.load_verify_locations(cafile=os.environ["SSL_CERT_FILE"])
        elif os.environ.get("SSL_CERT_DIR"):
            self.load_verify_locations(capath=os.environ["SSL_CERT_DIR"])
        else:
            import certifi

            self.load_verify_locations(cafile=certifi.where())
        self._cas_loaded = True

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        self._load_cas()
        return super().wrap_bio(*args, **kwargs)

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        self._load_cas()
        return super().wrap_socket(*args, **kwargs)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying context, built once per process (its CAs are read at
    the first TLS connection)."""
    context = _VerifyingContext(ssl.PROTOCOL_TLS_CLIENT)
    context.verify_mode = ssl.CERT_REQUIRED
    context.check_hostname = True
    keylog = os.environ.get("SSLKEYLOGFILE")  # as ssl.create_default_context does
    if keylog and not sys.flags.ignore_environment:
        context.keylog_filename = keylog
    return context


@functools.lru_cache(maxsize=1024)
def url(base: str, path: str) -> httpx.URL:
    """``base + path`` parsed once (a node talks to a few peers, on a few paths)."""
    return httpx.URL(base + path)
