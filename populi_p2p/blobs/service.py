"""The blob service: the node's store, the peer routes that serve chunks, and pulls.

Peer routes (signed calls, `inference/peer_api.py`; the caller's certificate, freshness
and nonce are checked from the headers before anything else):

- ``GET MANIFEST_PATH?h=HEX``: the blob's manifest, 404 when not held here;
- ``GET CHUNK_PATH?h=HEX&i=N``: chunk N's bytes, streamed from the file in
  `SERVE_PIECE` pieces.

A blob being fetched here is served too, as far as it goes: its manifest, and each
chunk its fetch has verified (after the done map was checked again on resumption);
a chunk not fetched yet is 409, which the fetcher takes as "ask again later", not as
a lie. The record advertises such blobs apart (``p``), after the complete ones.

Both first check that the caller is a current member (alive or suspect in our
membership): a certificate alone reads nothing. Only then is the store looked at. At
most `max_transfers` chunks are served at once; beyond it the answer is 503 at once
(the fetcher backs off and asks another holder), so a flood costs a counter, not memory.

Commands out: the record's ``blobs`` section (`holders.advert_section`) whenever the
store changes. Queries: `rows` (``model ls``), `progress` (``model pull``),
`statistics`.
"""

from __future__ import annotations

import contextlib
import os
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Final

import httpx
import trio

from .._log import event, get_logger
from ..inference.peer_api import PeerRequest, PeerResponse, PeerRoutes
from ..inference.peer_client import PeerClient, peer_base_url
from .fetcher import FetchError, FetchProgress, SourceError, TokenBucket, fetch_blob
from .holders import MODEL_KIND, SECTION, advert_section, mesh_catalogue, resolve
from .manifest import ManifestError, parse_digest
from .planner import ChunkFailure
from .store import GOOD, UNCHECKED, BlobStore, Partial, QuotaError, check_name

__all__ = ["CHUNK_PATH", "MANIFEST_PATH", "BlobService", "PeerChunkSource"]

MANIFEST_PATH: Final = "/populi/v1/blobs/manifest"
CHUNK_PATH: Final = "/populi/v1/blobs/chunk"
#: Bytes read from disk and written to the socket at a time, per transfer.
SERVE_PIECE: Final = 1024 * 1024
#: Default: most chunks served at once.
MAX_TRANSFERS: Final = 8
#: Most pulls remembered for ``model pull`` progress (finished ones go first).
MAX_PULLS: Final = 64
_log = get_logger("blobs")


class PeerChunkSource:
    """Chunks and manifests from members' peer APIs (`fetcher.ChunkSource`)."""

    def __init__(
        self, client: PeerClient, address_of: Callable[[str], tuple[str, int] | None]
    ) -> None:
        self._client = client
        self._address_of = address_of

    def _base(self, holder: str) -> str:
        address = self._address_of(holder)
        if address is None:
            raise SourceError(ChunkFailure.UNREACHABLE, "no peer address in its record")
        return peer_base_url(*address)

    async def manifest(self, holder: str, digest: bytes) -> bytes:
        path = f"{MANIFEST_PATH}?h={digest.hex()}"
        try:
            async with self._client.stream(holder, self._base(holder), "GET", path) as resp:
                _check_status(resp.status_code)
                body = b""
                async for piece in resp.aiter_raw():
                    body += piece
                    if len(body) > 5 * 1024 * 1024:
                        raise SourceError(ChunkFailure.CORRUPT, "manifest too large")
                return body
        except httpx.HTTPError as exc:
            raise SourceError(ChunkFailure.UNREACHABLE, repr(exc)) from None

    @contextlib.asynccontextmanager
    async def chunk(
        self, holder: str, digest: bytes, index: int
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        path = f"{CHUNK_PATH}?h={digest.hex()}&i={index}"
        try:
            async with self._client.stream(holder, self._base(holder), "GET", path) as resp:
                _check_status(resp.status_code)
                yield _pieces(resp)
        except httpx.HTTPError as exc:
            raise SourceError(ChunkFailure.UNREACHABLE, repr(exc)) from None


async def _pieces(resp: httpx.Response) -> AsyncIterator[bytes]:
    async for piece in resp.aiter_raw():
        yield piece


def _check_status(status: int) -> None:
    if status == 200:
        return
    if status == 404:
        raise SourceError(ChunkFailure.MISSING, "the holder does not hold it")
    if status == 503:
        raise SourceError(ChunkFailure.BUSY, "the holder is at its transfer cap")
    if status == 409:
        raise SourceError(ChunkFailure.LACKS, "the holder is fetching it and lacks this chunk")
    raise SourceError(ChunkFailure.UNREACHABLE, f"answered {status}")


class BlobService:
    """The node's blobs.

    Args:
        store: the blob store.
        me: this node's id.
        is_member: whether a node id is a current member (peer calls from others: 403).
        sections: {node id: its record's ``blobs`` section} of the verified members.
        address_of: a member's peer API address.
        peer_client: signed calls (None until the peer API runs).
        set_section: where our ``blobs`` section goes.
        bandwidth: bytes a second all fetches together may take (0: no cap).
        max_transfers: most chunks served at once.
    """

    def __init__(
        self,
        store: BlobStore,
        *,
        me: str,
        is_member: Callable[[str], bool],
        sections: Callable[[], Mapping[str, Any]],
        address_of: Callable[[str], tuple[str, int] | None],
        peer_client: Callable[[], PeerClient | None],
        set_section: Callable[[str, dict[str, Any] | None], Awaitable[None]],
        bandwidth: int = 0,
        max_transfers: int = MAX_TRANSFERS,
    ) -> None:
        self.store = store
        self._me = me
        self._is_member = is_member
        self._sections = sections
        self._address_of = address_of
        #: A member's peer address from its verified record (task outputs use it too).
        self.address_of = address_of
        self._peer_client = peer_client
        self._set_section = set_section
        self._bandwidth = bandwidth
        self._max_transfers = max_transfers
        self._transfers = 0
        #: On-demand checks of a fetch's unchecked chunks run one at a time, so that a
        #: member asking for one chunk many times at once has it hashed once.
        self._checking = trio.Lock()
        self._changed = trio.Event()
        #: For `add`'s worker thread to say "changed" without waiting for the loop (it
        #: holds the store's lock then, which the loop may be waiting for).
        self._token: trio.lowlevel.TrioToken | None = None
        with contextlib.suppress(RuntimeError):  # built outside trio (some tests)
            self._token = trio.lowlevel.current_trio_token()
        self._nursery: trio.Nursery | None = None
        self._pulls: dict[bytes, FetchProgress] = {}
        #: Fetches running, by digest: a second fetch of the same blob waits for the first.
        self._fetching: dict[bytes, trio.Event] = {}
        self.stats = {
            "served_chunks": 0, "served_bytes": 0, "refused_not_member": 0, "refused_busy": 0,
            "not_held": 0, "lacked": 0, "fetched_blobs": 0, "fetch_failures": 0,
            "fetched_bytes": 0,
        }  # fmt: skip
        store.on_change = self._store_changed

    ####################################################################################
    # The service

    def _store_changed(self) -> None:
        """Re-advertise soon (called on the trio thread, or from `add`'s worker thread)."""
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            # Never wait for the loop here: this thread holds the store's lock, and the
            # loop may be waiting for that lock (a deadlock seen under load in CI-like runs).
            if self._token is not None:
                self._token.run_sync_soon(self._changed.set)
            return
        self._changed.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._set_section(SECTION, self._advert())
            task_status.started()
            while True:
                await self._changed.wait()
                self._changed = trio.Event()
                await self._set_section(SECTION, self._advert())

    def _advert(self) -> dict[str, Any] | None:
        return advert_section(self.store.entries(), self.store.fetching_digests())

    def register_peer_routes(self, routes: PeerRoutes) -> None:
        routes.add("GET", MANIFEST_PATH, self._serve_manifest)
        routes.add("GET", CHUNK_PATH, self._serve_chunk)

    def statistics(self) -> dict[str, Any]:
        return {
            **self.stats, "transfers": self._transfers, "used": self.store.used(),
            "quota": self.store.quota, "evicted": self.store.evicted,
        }  # fmt: skip

    ####################################################################################
    # Peer routes

    def _refusal(self, request: PeerRequest) -> PeerResponse | None:
        if not self._is_member(request.caller):
            self.stats["refused_not_member"] += 1
            return _json(403, {"error": "only a current member may fetch blobs"})
        return None

    async def _serve_manifest(self, request: PeerRequest) -> PeerResponse:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        try:
            digest = parse_digest(_param(request, "h"))
        except ManifestError as exc:
            return _json(400, {"error": str(exc)})
        manifest = self.store.manifest(digest)
        if manifest is None:
            partial = self.store.fetching(digest)
            manifest = None if partial is None else partial.manifest
        if manifest is None:
            self.stats["not_held"] += 1
            return _json(404, {"error": "not held here"})
        return PeerResponse(200, manifest.encode(), content_type="application/msgpack")

    async def _serve_chunk(self, request: PeerRequest) -> PeerResponse:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        try:
            digest = parse_digest(_param(request, "h"))
            index = int(_param(request, "i")) if _param(request, "i").isdigit() else -1
        except ManifestError as exc:
            return _json(400, {"error": str(exc)})
        if self._transfers >= self._max_transfers:
            self.stats["refused_busy"] += 1
            return _json(503, {"error": "at the transfer cap; ask another holder"})
        manifest = self.store.manifest(digest)
        path = self.store.path(digest)
        partial = None if manifest is not None else self.store.fetching(digest)
        if partial is not None:
            manifest, path = partial.manifest, partial.part
        if manifest is None or path is None:
            self.stats["not_held"] += 1
            return _json(404, {"error": "not held here"})
        if not 0 <= index < manifest.chunks:
            return _json(400, {"error": f"chunk index is 0 to {manifest.chunks - 1}"})
        if partial is not None and not await self._checked_chunk(partial, index):
            return self._lacks()
        offset, length = manifest.chunk_span(index)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # a partial may just have been moved into place: ask again
            return self._lacks() if partial is not None else _json(404, {"error": "not held here"})
        self._transfers += 1
        return PeerResponse(
            200, _ChunkStream(self, fd, offset, length), content_type="application/octet-stream",
            headers={"content-length": str(length)}, coalesce=False,
        )  # fmt: skip

    async def _checked_chunk(self, partial: Partial, index: int) -> bool:
        """Whether a fetch in progress may serve chunk `index`: written and its sha256
        checked (a chunk written unchecked is checked now, once; one that failed is
        not checked again)."""
        if not partial.checked or not partial.done[index]:
            return False
        if partial.verified[index] == UNCHECKED:
            async with self._checking:  # the result is kept: a second asker finds it
                await trio.to_thread.run_sync(partial.verify_chunk, index)
        return partial.verified[index] == GOOD

    def _lacks(self) -> PeerResponse:
        self.stats["lacked"] += 1
        return _json(409, {"error": "this chunk is not fetched here yet; ask again later"})

    ####################################################################################
    # The API (``populi-node model ...``)

    async def add(self, body: Any) -> dict[str, Any]:
        """``model add``: copy a local file into the store. Raises ValueError (400)."""
        path = body.get("path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not os.path.isabs(path):
            raise ValueError("give the model file's absolute path")
        name = body.get("name") or Path(path).name
        kind = body.get("kind", MODEL_KIND)
        if not isinstance(name, str) or not isinstance(kind, str):
            raise ValueError("name and kind are strings")
        check_name(name)
        if not os.path.isfile(path):
            raise ValueError(f"{path} is not a file")
        try:
            entry = await trio.to_thread.run_sync(self.store.add_file, Path(path), name, kind)
        except (QuotaError, ManifestError) as exc:
            raise ValueError(str(exc)) from None
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror}") from None
        event(_log, 20, "blob.added", hash=entry.hex, name=name, size=entry.size)
        return entry.row()

    def rows(self) -> dict[str, Any]:
        """``model ls``: the blobs held here, and the ones members advertise."""
        catalogue = mesh_catalogue(self._sections())
        local = []
        for entry in self.store.entries():
            row = entry.row()
            blob = catalogue.get(entry.digest)
            row["holders"] = [] if blob is None else [h for h in blob.holders if h != self._me]
            row["fetching"] = [] if blob is None else [h for h in blob.partial if h != self._me]
            local.append(row)
        held = {e.digest for e in self.store.entries()}
        mesh = [
            {"hash": d.hex(), "names": sorted(b.names), "size": max(b.sizes),
             "holders": b.holders, "fetching": b.partial}
            for d, b in sorted(catalogue.items()) if d not in held
        ]  # fmt: skip
        return {"local": local, "mesh": mesh, "used": self.store.used(), "quota": self.store.quota}

    def remove(self, body: Any) -> dict[str, Any]:
        """``model rm``. Raises LookupError (404), ValueError (400: pinned)."""
        blob = body.get("blob") if isinstance(body, dict) else None
        if not isinstance(blob, str):
            raise ValueError("name the blob (its name or hash)")
        entry = self.store.remove(self.store.find(blob).digest)
        return entry.row()

    def pin(self, body: Any, *, pinned: bool = True) -> dict[str, Any]:
        """Pin (or unpin) a blob for a deployment or task (``{"blob", "by"}``)."""
        blob, by = (body.get("blob"), body.get("by")) if isinstance(body, dict) else (None, None)
        if not (isinstance(blob, str) and isinstance(by, str) and 0 < len(by) <= 128):
            raise ValueError("give blob (name or hash) and by (who pins it)")
        entry = self.store.find(blob)
        (self.store.pin if pinned else self.store.unpin)(entry.digest, by)
        return entry.row()

    def _holders(self, digest: bytes) -> list[str]:
        blob = mesh_catalogue(self._sections()).get(digest)
        return [] if blob is None else [h for h in blob.sources() if h != self._me]

    holders_of = _holders  # the members to fetch `digest` from (deployments, tasks)

    def locate(self, name_or_hash: str) -> tuple[bytes, int, str]:
        """(digest, size, name) of a complete blob held here or advertised by a member.

        Raises:
            LookupError: none, or ambiguous (one line).
        """
        try:
            entry = self.store.find(name_or_hash)
            if entry.complete:
                return entry.digest, entry.size, entry.name
        except LookupError:
            pass
        catalogue = mesh_catalogue(self._sections())
        digest = resolve(name_or_hash, catalogue)
        blob = catalogue[digest]
        names = sorted(blob.names)
        return digest, max(blob.sizes), names[0] if names else digest.hex()[:16]

    async def pull(self, body: Any) -> dict[str, Any]:
        """``model pull``: start fetching a blob the mesh advertises (or hand back its
        progress when it is being fetched already)."""
        blob = body.get("blob") if isinstance(body, dict) else None
        if not isinstance(blob, str):
            raise ValueError("name the blob (its name or hash)")
        catalogue = mesh_catalogue(self._sections())
        try:
            digest = resolve(blob, catalogue)
        except LookupError:
            digest = self.store.find(blob).digest  # a partial one here, by name
        held = self.store.get(digest)
        if held is not None and held.complete:
            return {"hash": digest.hex(), "name": held.name, "state": "done",
                    "size": held.size, "chunks": 0, "done": 0}  # fmt: skip
        running = self._pulls.get(digest)
        if running is not None and running.state not in ("done", "failed"):
            return running.row()
        names = sorted(catalogue[digest].names) if digest in catalogue else []
        name = held.name if held is not None else (names[0] if names else digest.hex()[:16])
        progress = FetchProgress(digest, name)
        self._remember(progress)
        assert self._nursery is not None, "the blob service is not running"
        self._nursery.start_soon(self._pull, digest, progress)
        return progress.row()

    def _remember(self, progress: FetchProgress) -> None:
        self._pulls[progress.digest] = progress
        while len(self._pulls) > MAX_PULLS:
            old = next((d for d, p in self._pulls.items() if p.state in ("done", "failed")), None)
            if old is None:
                break
            del self._pulls[old]

    async def fetch(self, digest: bytes, holders: list[str], *, name: str, kind: str,
                    progress: FetchProgress | None = None) -> None:  # fmt: skip
        """Fetch a blob from `holders` (the API for deployments and tasks); the bytes
        received count in ``fetched_bytes`` (a fetch that fails too). A fetch of a blob
        that is being fetched here already waits for that one (and tries itself only
        when that one failed): a task's owner and a member asked to keep the same input
        may fetch it at once."""
        client = self._peer_client()
        if client is None:
            raise FetchError("the peer API is not running yet")
        while (running := self._fetching.get(digest)) is not None:
            await running.wait()
        held = self.store.get(digest)
        if held is not None and held.complete:
            if progress is not None:
                progress.state = "done"
            return
        source = PeerChunkSource(client.bulk(), self._address_of)
        progress = progress or FetchProgress(digest, name)
        before = progress.bytes_fetched
        done = self._fetching[digest] = trio.Event()
        try:
            await fetch_blob(
                self.store, source, digest, holders, name=name, kind=kind,
                bucket=TokenBucket(self._bandwidth), progress=progress,
            )  # fmt: skip
        finally:
            del self._fetching[digest]
            done.set()
            self.stats["fetched_bytes"] += progress.bytes_fetched - before

    async def _pull(self, digest: bytes, progress: FetchProgress) -> None:
        try:
            await self.fetch(digest, self._holders(digest), name=progress.name,
                             kind=MODEL_KIND, progress=progress)  # fmt: skip
        except (FetchError, QuotaError, ValueError, OSError) as exc:
            progress.state, progress.error = "failed", str(exc)
            self.stats["fetch_failures"] += 1
            event(_log, 30, "blob.fetch_failed", hash=digest.hex(), error=str(exc))
            return
        self.stats["fetched_blobs"] += 1
        event(_log, 20, "blob.fetched", hash=digest.hex(), name=progress.name)

    def progress(self, query: Any) -> dict[str, Any]:
        blob = query.get("blob") if isinstance(query, dict) else None
        try:
            digest = parse_digest(blob) if isinstance(blob, str) else b""
        except ManifestError as exc:
            raise ValueError(str(exc)) from None
        found = self._pulls.get(digest)
        if found is None:
            raise LookupError(f"no pull of {blob} on this node")
        return found.row()


class _ChunkStream:
    """One chunk's bytes, read in `SERVE_PIECE` pieces; the transfer slot and the file
    are freed by `aclose` (`PeerApi` calls it however the answer ends, even when it
    never started) or at the end."""

    def __init__(self, service: BlobService, fd: int, offset: int, length: int) -> None:
        self._service = service
        self._fd: int | None = fd
        self._offset = offset
        self._left = length

    def __aiter__(self) -> _ChunkStream:
        return self

    async def __anext__(self) -> bytes:
        fd = self._fd
        if fd is None or self._left <= 0:
            if fd is not None:
                self._service.stats["served_chunks"] += 1
            await self.aclose()
            raise StopAsyncIteration
        piece = await trio.to_thread.run_sync(os.pread, fd, min(SERVE_PIECE, self._left),
                                              self._offset)  # fmt: skip
        if not piece:
            await self.aclose()
            raise StopAsyncIteration
        self._offset += len(piece)
        self._left -= len(piece)
        self._service.stats["served_bytes"] += len(piece)
        return piece

    async def aclose(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._service._transfers -= 1


def _param(request: PeerRequest, name: str) -> str:
    values = urllib.parse.parse_qs(request.query[:512]).get(name, [""])
    return values[-1]


def _json(status: int, body: dict[str, Any]) -> PeerResponse:
    import json

    return PeerResponse(status, json.dumps(body).encode())
