"""An httpx transport whose connections read large pieces, for bulk transfers (blobs).

httpcore reads a response 64 KiB at a time, and each read passes through a dozen
Python layers (httpcore, h11, httpx) before its bytes reach the caller. For a blob
that was a large part of the fetching daemon's CPU: measured with
`benchmarks/blob_fetch.py` (1 GiB from 3 holders, interleaved runs on one machine),
reads of up to 512 KiB took the fetcher from 2.4-2.7 to 2.0-2.1 CPU seconds and the
fetch from about 340 to about 510 MiB/s (1 MiB reads: the same speed, 40 MiB of extra
memory instead of 25). Small answers are unaffected (a read returns what is there), but
each read allocates its full size first, so this transport is for bulk transfers only.

httpx does not take a network backend, so the transport's connection pool is built
again with one (`_pool`, the only private name used; `_transport.transport_over` checks it is
there, and `tests/inference/test_bulk_reads.py` that pieces do come larger).
"""

from __future__ import annotations

import ssl

import httpcore
import httpx

from ._transport import DelegatingStream, WrappingBackend, transport_over

__all__ = ["bulk_transport"]


class _BulkStream(DelegatingStream):
    def __init__(self, inner: httpcore.AsyncNetworkStream, read_bytes: int) -> None:
        super().__init__(inner)
        self._read_bytes = read_bytes

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max(max_bytes, self._read_bytes), timeout)

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        return _BulkStream(stream, self._read_bytes)


class _BulkBackend(WrappingBackend):
    """httpcore's trio backend, its streams reading up to `read_bytes` at a time."""

    def __init__(self, read_bytes: int) -> None:
        super().__init__()
        self._read_bytes = read_bytes

    def wrap(self, stream: httpcore.AsyncNetworkStream) -> httpcore.AsyncNetworkStream:
        return _BulkStream(stream, self._read_bytes)


def bulk_transport(
    read_bytes: int, *, limits: httpx.Limits, ssl_context: ssl.SSLContext
) -> httpx.AsyncHTTPTransport:
    """A transport like httpx's default (no proxies from the environment) whose
    connections read up to `read_bytes` at a time."""
    return transport_over(_BulkBackend(read_bytes), limits, ssl_context)
