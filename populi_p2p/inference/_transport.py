"""An httpx transport whose request goes out in one write, for the relay's hops.

httpcore writes a request's head and its body as two sends. On the relay's path each
send wakes the receiving process, which then finds half a request and waits for the
rest: a wake-up, and on a busy machine a preemption of the sender, for nothing. The
profile of a full daemon put a third of the added time to first token in socket sends
(docs/inference.md, "Performance"). Here the connection's writes are held until it
next reads (as it does right after the request is sent), so head and body leave in one
send; a large body is flushed every `FLUSH_BYTES`, so memory stays bounded.

HTTP itself stays httpcore's and h11's: this only changes when bytes are handed to
the socket.
"""

from __future__ import annotations

import ssl
import typing
from typing import Final

import httpcore
import httpx

__all__ = [
    "FLUSH_BYTES",
    "CoalescingBackend",
    "DelegatingStream",
    "WrappingBackend",
    "coalescing_transport",
    "open_response",
    "request_timeouts",
    "transport_over",
]

#: Held writes go out once they reach this many bytes.
FLUSH_BYTES: Final = 64 * 1024


class DelegatingStream(httpcore.AsyncNetworkStream):
    """A network stream that hands every call to `inner`; subclasses change one."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return await self._inner.start_tls(ssl_context, server_hostname, timeout)

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class WrappingBackend(httpcore.AsyncNetworkBackend):
    """httpcore's Trio backend, each connection's stream passed through `wrap`."""

    def __init__(self) -> None:
        self._inner = httpcore.TrioBackend()

    def wrap(self, stream: httpcore.AsyncNetworkStream) -> httpcore.AsyncNetworkStream:
        return stream

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        inner = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return self.wrap(inner)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        inner = await self._inner.connect_unix_socket(path, timeout, socket_options)
        return self.wrap(inner)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def transport_over(
    backend: httpcore.AsyncNetworkBackend, limits: httpx.Limits, ssl_context: ssl.SSLContext
) -> httpx.AsyncHTTPTransport:
    """httpx's own transport over a pool that uses `backend`.

    httpx does not take a network backend, so its pool (``_pool``, the one attribute
    its transport sends through) is replaced with httpcore's, built the way httpx
    builds it; `tests/inference/test_transport.py` fails if that stops working.
    """
    transport = httpx.AsyncHTTPTransport(verify=ssl_context, limits=limits, trust_env=False)
    if not isinstance(getattr(transport, "_pool", None), httpcore.AsyncConnectionPool):
        raise RuntimeError("this httpx keeps its connection pool elsewhere: update transport_over")
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=ssl_context,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=backend,
    )
    return transport


class _CoalescingStream(DelegatingStream):
    def __init__(self, inner: httpcore.AsyncNetworkStream, backend: CoalescingBackend) -> None:
        super().__init__(inner)
        self._backend = backend
        self._held: list[bytes] = []
        self._size = 0
        self._timeout: float | None = None

    async def _flush(self) -> None:
        if self._held:
            data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held.clear()
            self._size = 0
            self._backend.sends += 1
            await self._inner.write(data, self._timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        self._held.append(buffer)
        self._size += len(buffer)
        self._timeout = timeout
        if self._size >= FLUSH_BYTES:
            await self._flush()

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        await self._flush()
        return await self._inner.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._held.clear()
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        await self._flush()
        return await self._inner.start_tls(ssl_context, server_hostname, timeout)


class CoalescingBackend(WrappingBackend):
    """httpcore's Trio backend, with each connection's writes held until it reads."""

    def __init__(self) -> None:
        super().__init__()
        #: Sends made on all its connections (a test checks: one per request).
        self.sends = 0

    def wrap(self, stream: httpcore.AsyncNetworkStream) -> httpcore.AsyncNetworkStream:
        return _CoalescingStream(stream, self)


def coalescing_transport(
    limits: httpx.Limits, ssl_context: ssl.SSLContext
) -> tuple[httpx.AsyncHTTPTransport, CoalescingBackend]:
    """httpx's own transport over a pool that uses `CoalescingBackend`."""
    backend = CoalescingBackend()
    return transport_over(backend, limits, ssl_context), backend


async def open_response(
    transport: httpx.AsyncBaseTransport, request: httpx.Request
) -> httpx.Response:
    """`request` sent through `transport`, its answer left to be read as it comes.

    What ``AsyncClient.send(request, stream=True)`` does, less its auth, redirect,
    cookie, event-hook and timer steps, which no peer or engine call uses: about 0.1 ms
    of CPU a request on each hop of the relay. The request carries its own timeouts
    (``extensions["timeout"]``, as `request_timeouts` gives them); the answer is closed
    by the caller (``await response.aclose()``).
    """
    response = await transport.handle_async_request(request)
    response.request = request
    return response


def request_timeouts(timeout: httpx.Timeout) -> dict[str, dict[str, float | None]]:
    """The extensions a request needs for `timeout` to hold through `open_response`."""
    return {"timeout": timeout.as_dict()}
