"""The calling side of peer calls: httpx with every request signed (`PeerCallSigner`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Final

import httpx

from ._bulk_reads import bulk_transport
from ._tls import tls_context, url
from ._transport import CoalescingBackend, coalescing_transport, open_response, request_timeouts
from .peer_auth import PeerCallSigner

__all__ = ["BULK_READ_BYTES", "PeerClient", "peer_base_url"]

#: Bytes a bulk client's connection reads at a time (`PeerClient.bulk`).
BULK_READ_BYTES: Final = 512 * 1024


def peer_base_url(host: str, port: int) -> str:
    """``http://host:port`` with IPv6 hosts bracketed."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class PeerClient:
    """Signed calls to other members' peer APIs, over one connection pool.

    Args:
        signer: signs each request for its callee.
        connect_timeout: seconds to open a connection (a dead peer is seen this fast).
        read_timeout: seconds between bytes of an answer (None: the caller watches).
        read_bytes: read answers up to this many bytes at a time (bulk transfers; None:
            httpx's 64 KiB).
    """

    def __init__(
        self,
        signer: PeerCallSigner,
        *,
        connect_timeout: float = 2.0,
        read_timeout: float | None = 30.0,
        read_bytes: int | None = None,
    ) -> None:
        self._signer = signer
        self._timeouts = (connect_timeout, read_timeout)
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        transport: httpx.AsyncHTTPTransport
        #: The coalescing backend of a relay client (its send count), None for bulk.
        self.backend: CoalescingBackend | None = None
        if read_bytes is None:
            # Each request in one write (`_transport`): the relay's hop to the serving node.
            transport, self.backend = coalescing_transport(limits, tls_context())
        else:
            transport = bulk_transport(read_bytes, limits=limits, ssl_context=tls_context())
        timeout = httpx.Timeout(read_timeout, connect=connect_timeout)
        self._client = httpx.AsyncClient(timeout=timeout, transport=transport, trust_env=False)
        self._transport = transport
        self._extensions = request_timeouts(timeout)
        self._bulk: PeerClient | None = None

    def bulk(self) -> PeerClient:
        """A client with the same signer for bulk transfers (blob chunks): its
        connections read `BULK_READ_BYTES` at a time. Closed with this one."""
        if self._bulk is None:
            connect, read = self._timeouts
            self._bulk = PeerClient(
                self._signer, connect_timeout=connect, read_timeout=read,
                read_bytes=BULK_READ_BYTES,
            )  # fmt: skip
        return self._bulk

    async def aclose(self) -> None:
        await self._client.aclose()
        if self._bulk is not None:
            await self._bulk.aclose()

    def _build(
        self, callee: str, base_url: str, method: str, path: str, body: bytes
    ) -> httpx.Request:
        """The signed request, with only the headers the callee reads and its own
        timeouts (`stream` sends it past httpx's client)."""
        headers = self._signer.headers(method, path, body, callee)
        headers["content-type"] = "application/json"
        return httpx.Request(
            method, url(base_url, path), content=body, headers=headers,
            extensions=self._extensions,
        )  # fmt: skip

    async def call(
        self, callee: str, base_url: str, method: str, path: str, body: bytes = b""
    ) -> httpx.Response:
        """One whole call to node `callee` at `base_url`. Raises `httpx.HTTPError`."""
        return await self._client.send(self._build(callee, base_url, method, path, body))

    @contextlib.asynccontextmanager
    async def stream(
        self, callee: str, base_url: str, method: str, path: str, body: bytes = b""
    ) -> AsyncIterator[httpx.Response]:
        """A call whose answer is read as it comes (``response.aiter_raw()``).

        Sent through the transport itself (`open_response`): the relay's hop to the
        serving node is on every stream's path."""
        request = self._build(callee, base_url, method, path, body)
        response = await open_response(self._transport, request)
        try:
            yield response
        finally:
            await response.aclose()
