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
again with one (`_pool`, the only private name used; `bulk_transport` checks it is
there, and `tests/blobs/test_partial_serving.py` that pieces do come larger).
"""

from __future__ import annotations

import ssl
import typing
from typing import Any

import httpcore
import httpx

__all__ = ["bulk_transport"]


class _BulkStream(httpcore.AsyncNetworkStream):
    def __init__(self, stream: httpcore.AsyncNetworkStream, read_bytes: int) -> None:
        self._stream = stream
        self._read_bytes = read_bytes

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max(max_bytes, self._read_bytes), timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._stream.start_tls(ssl_context, server_hostname, timeout)
        return _BulkStream(stream, self._read_bytes)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _BulkBackend(httpcore.AsyncNetworkBackend):
    """httpcore's trio backend, its streams reading up to `read_bytes` at a time."""

    def __init__(self, read_bytes: int) -> None:
        self._backend = httpcore.TrioBackend()
        self._read_bytes = read_bytes

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._backend.connect_tcp(
            host, port, timeout=timeout, local_address=local_address,
            socket_options=socket_options,
        )  # fmt: skip
        return _BulkStream(stream, self._read_bytes)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._backend.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options
        )
        return _BulkStream(stream, self._read_bytes)

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


def bulk_transport(
    read_bytes: int, *, limits: httpx.Limits, ssl_context: ssl.SSLContext
) -> httpx.AsyncHTTPTransport:
    """A transport like httpx's default (no proxies from the environment) whose
    connections read up to `read_bytes` at a time."""
    transport = httpx.AsyncHTTPTransport(verify=ssl_context, limits=limits, trust_env=False)
    if not isinstance(getattr(transport, "_pool", None), httpcore.AsyncConnectionPool):
        raise RuntimeError("this httpx keeps its connection pool elsewhere: update bulk_transport")
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=ssl_context, max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry, network_backend=_BulkBackend(read_bytes),
    )  # fmt: skip
    return transport
