"""The calling side of peer calls: httpx with every request signed (`PeerCallSigner`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx

from ._tls import tls_context, url
from ._transport import coalescing_transport
from .peer_auth import PeerCallSigner

__all__ = ["PeerClient", "peer_base_url"]


def peer_base_url(host: str, port: int) -> str:
    """``http://host:port`` with IPv6 hosts bracketed."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class PeerClient:
    """Signed calls to other members' peer APIs, over one connection pool.

    Args:
        signer: signs each request for its callee.
        connect_timeout: seconds to open a connection (a dead peer is seen this fast).
        read_timeout: seconds between bytes of an answer (None: the caller watches).
    """

    def __init__(
        self,
        signer: PeerCallSigner,
        *,
        connect_timeout: float = 2.0,
        read_timeout: float | None = 30.0,
    ) -> None:
        self._signer = signer
        # Each request in one write (`_transport`): the relay's hop to the serving node.
        transport, self.backend = coalescing_transport(
            httpx.Limits(max_connections=256, max_keepalive_connections=64), tls_context()
        )
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
            transport=transport,
            trust_env=False,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def _build(
        self, callee: str, base_url: str, method: str, path: str, body: bytes
    ) -> httpx.Request:
        headers = self._signer.headers(method, path, body, callee)
        headers["content-type"] = "application/json"
        return self._client.build_request(
            method, url(base_url, path), content=body, headers=headers
        )

    async def call(
        self, callee: str, base_url: str, method: str, path: str, body: bytes = b""
    ) -> httpx.Response:
        """One whole call to node `callee` at `base_url`. Raises `httpx.HTTPError`."""
        return await self._client.send(self._build(callee, base_url, method, path, body))

    @contextlib.asynccontextmanager
    async def stream(
        self, callee: str, base_url: str, method: str, path: str, body: bytes = b""
    ) -> AsyncIterator[httpx.Response]:
        """A call whose answer is read as it comes (``response.aiter_raw()``)."""
        response = await self._client.send(
            self._build(callee, base_url, method, path, body), stream=True
        )
        try:
            yield response
        finally:
            await response.aclose()
