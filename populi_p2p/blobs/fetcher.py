"""Fetching a blob in chunks from several holders at once (the trio driver of the plan).

`fetch_blob` asks holders for the manifest (`MANIFEST_QUORUM` of them; the manifest most
of them agree on wins and the dissenters are skipped), opens or resumes the partial file
(`BlobStore.begin_partial`; chunks marked done are checked again), then drives a
`FetchPlan`: each chunk is streamed from its holder straight to its offset in the part
file. A holder's chunks are hashed as they come until one of them matched the
manifest (a holder that sends garbage is skipped at its first chunk); after that its
chunks are checked by the whole hash, which saves one sha256 pass over the blob. A
corrupt chunk, a holder that lies about holding the blob, an unreachable or busy holder
are the plan's to handle.

The whole file's sha256 is computed in order as the prefix of written chunks grows
(`_PrefixHash`, a worker thread beside the transfers, reading the part file), so when
the last chunk lands only the chunks after the first gap are left to hash; the blob is
moved into place only if it is the blob's digest. If it is not, every chunk written
unchecked is checked: the corrupt ones are fetched again from other holders, their
senders skipped, and the whole hash is redone (a holder that turned corrupt costs one
more pass). If none is corrupt, the manifest lied, and the partial is discarded.

Memory is bounded: a chunk is never held whole, only the transport's pieces (64 KiB),
with at most the plan's `total` chunks in flight. The bandwidth cap is a token bucket
shared by every transfer. A cancelled fetch (the daemon killed or stopped) leaves its
partial file and done map for the next `fetch_blob`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Final, Protocol

import attrs
import trio

from .manifest import Manifest, ManifestError
from .planner import ChunkFailure, FetchPlan
from .store import BlobEntry, BlobStore, Partial

__all__ = ["ChunkSource", "FetchError", "FetchProgress", "SourceError", "TokenBucket", "fetch_blob"]

#: How many holders are asked for the manifest.
MANIFEST_QUORUM: Final = 3
#: Most bytes the whole hash reads in one worker-thread call (a stop waits for one).
HASH_SPAN: Final = 64 * 1024 * 1024
#: The largest manifest read (512 GiB of 4 MiB chunks: 4 MiB of hashes, plus framing).
MAX_MANIFEST_BYTES: Final = 4 * 1024 * 1024 + 1024


class SourceError(Exception):
    """A holder did not deliver; `failure` says how the plan should take it."""

    def __init__(self, failure: ChunkFailure, detail: str) -> None:
        super().__init__(f"{failure.value}: {detail}")
        self.failure = failure


class FetchError(Exception):
    """The fetch cannot finish (one line: why, and what the holders did)."""


class ChunkSource(Protocol):
    """Where chunks come from (the peer API; a fake in tests)."""

    async def manifest(self, holder: str, digest: bytes) -> bytes:
        """The encoded manifest. Raises `SourceError`."""
        ...

    def chunk(
        self, holder: str, digest: bytes, index: int
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """The chunk's bytes as they come. Raises `SourceError` (entering or reading)."""
        ...


class TokenBucket:
    """At most `rate` bytes a second on average (0: no cap), in bursts of `burst`."""

    def __init__(self, rate: int, burst: int = 1024 * 1024) -> None:
        self.rate = rate
        self._burst = max(burst, 1)
        self._tokens = float(self._burst)
        self._at = trio.current_time() if rate else 0.0

    async def take(self, n: int) -> None:
        if not self.rate:
            return
        now = trio.current_time()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= n
        if self._tokens < 0:
            await trio.sleep(-self._tokens / self.rate)


@attrs.define
class FetchProgress:
    """What a fetch has done so far (the CLI's progress line)."""

    digest: bytes
    name: str
    size: int = 0
    chunks: int = 0
    done: int = 0
    state: str = "manifest"  # manifest, fetching, verifying, done, failed
    error: str | None = None
    bytes_fetched: int = 0
    started: float = 0.0
    holders: dict[str, dict[str, object]] = attrs.field(factory=dict)

    def row(self) -> dict[str, object]:
        elapsed = max(trio.current_time() - self.started, 1e-9) if self.started else 0.0
        return {
            "hash": self.digest.hex(), "name": self.name, "size": self.size,
            "chunks": self.chunks, "done": self.done, "state": self.state,
            "error": self.error, "bytes_fetched": self.bytes_fetched,
            "rate": self.bytes_fetched / elapsed if elapsed else 0.0,
            "holders": self.holders,
        }  # fmt: skip


async def _agreed_manifest(
    source: ChunkSource, digest: bytes, holders: Sequence[str], skipped: dict[str, str]
) -> Manifest:
    """The manifest most of the first `MANIFEST_QUORUM` answering holders agree on."""
    answers: dict[str, Manifest] = {}
    for start in range(0, len(holders), MANIFEST_QUORUM):
        batch = holders[start : start + MANIFEST_QUORUM]

        async def ask(holder: str) -> None:
            try:
                raw = await source.manifest(holder, digest)
                answers[holder] = Manifest.decode(raw, digest)
            except SourceError as exc:
                skipped[holder] = f"manifest: {exc}"
            except ManifestError as exc:
                skipped[holder] = f"sent a bad manifest: {exc}"

        async with trio.open_nursery() as nursery:
            for holder in batch:
                nursery.start_soon(ask, holder)
        if answers:
            break
    if not answers:
        detail = "; ".join(f"{h[:12]}: {why}" for h, why in sorted(skipped.items()))
        raise FetchError(f"no holder gave the manifest of {digest.hex()} ({detail or 'none'})")
    votes = Counter(m.key() for m in answers.values())
    winner_key = max(sorted(votes), key=lambda k: votes[k])
    for holder, manifest in answers.items():
        if manifest.key() != winner_key:
            skipped[holder] = "its manifest disagreed with the other holders'"
    return next(m for m in answers.values() if m.key() == winner_key)


async def fetch_blob(
    store: BlobStore,
    source: ChunkSource,
    digest: bytes,
    holders: Sequence[str],
    *,
    name: str,
    kind: str,
    bucket: TokenBucket | None = None,
    progress: FetchProgress | None = None,
    per_holder: int = 4,
    total: int = 12,
) -> BlobEntry:
    """Fetch blob `digest` from `holders` into `store` (resuming a partial fetch).

    Raises:
        FetchError: no holder could serve it, or its whole hash did not match.
        QuotaError: no room under the quota.
    """
    held = store.get(digest)
    if held is not None and held.complete:
        return held
    progress = progress or FetchProgress(digest, name)
    progress.started = trio.current_time()
    skipped: dict[str, str] = {}
    manifest = store.partial_manifest(digest) if held is not None else None
    if manifest is None:
        manifest = await _agreed_manifest(source, digest, list(holders), skipped)
    partial = store.begin_partial(manifest, name, kind)
    try:
        await trio.to_thread.run_sync(partial.recheck)
        entry = await _fetch_chunks(
            store, source, partial, holders, skipped, bucket or TokenBucket(0), progress,
            per_holder=per_holder, total=total,
        )  # fmt: skip
    except BaseException:
        with trio.CancelScope(shield=True):
            store.drop_partial(partial, discard=False)
        progress.state = "failed"
        raise
    progress.state = "done"
    return entry


class _PrefixHash:
    """The blob's sha256, fed in order from the part file as the prefix of written
    chunks grows (a worker thread, beside the transfers), so the whole-hash check at
    the end costs the last chunks, not a second pass over the blob."""

    def __init__(self, partial: Partial) -> None:
        self._partial = partial
        self._whole = hashlib.sha256()
        self._hashed = 0
        self._grew = trio.Event()

    def grew(self) -> None:
        """A chunk was marked done (the written prefix may be longer)."""
        self._grew.set()

    def _prefix_end(self) -> int:
        first_missing = self._partial.done.find(0)
        if first_missing < 0:
            return self._partial.manifest.size
        return self._partial.manifest.chunk_span(first_missing)[0]

    async def run(self) -> None:
        """Hash the written prefix as it grows, until the whole blob is hashed."""
        size = self._partial.manifest.size
        while self._hashed < size:
            end = min(self._prefix_end(), self._hashed + HASH_SPAN)
            if end > self._hashed:
                await trio.to_thread.run_sync(
                    self._partial.hash_span, self._whole, self._hashed, end
                )
                self._hashed = end
            else:
                await self._grew.wait()
                self._grew = trio.Event()

    def digest(self) -> bytes:
        if self._hashed != self._partial.manifest.size:
            raise AssertionError("the whole hash is not finished")
        return self._whole.digest()


async def _fetch_chunks(
    store: BlobStore,
    source: ChunkSource,
    partial: Partial,
    holders: Sequence[str],
    skipped: dict[str, str],
    bucket: TokenBucket,
    progress: FetchProgress,
    *,
    per_holder: int,
    total: int,
) -> BlobEntry:
    """Fetch every chunk not done, in rounds: a round ends with the whole hash; if it
    is not the digest, the chunks written unchecked are checked, the corrupt ones are
    fetched again from other holders (their senders skipped), and the hash is redone.
    Each such round skips at least one holder, so the rounds end."""
    manifest = partial.manifest
    done = [i for i, flag in enumerate(partial.done) if flag]
    plan = FetchPlan(manifest.chunks, done, holders, per_holder=per_holder, total=total)
    for holder, why in skipped.items():
        plan.skip(holder, why)
    progress.size, progress.chunks = manifest.size, manifest.chunks
    while True:
        progress.state = "fetching"
        digest = await _fetch_round(source, partial, plan, bucket, progress)
        if digest == manifest.digest:
            return store.finish_partial(partial)
        corrupt = await trio.to_thread.run_sync(partial.refute_unchecked)
        if not corrupt:
            store.drop_partial(partial, discard=True)
            givers = ", ".join(h[:12] for h, s in plan.holders.items() if s.skipped is None)
            raise FetchError(
                f"blob {manifest.hex}: every chunk matched the manifest but the whole sha256"
                f" did not: the manifest was false (given by {givers}); the partial was"
                " discarded"
            )
        for chunk in corrupt:
            plan.refuted(chunk)
        _report(progress, plan)


def _report(progress: FetchProgress, plan: FetchPlan) -> None:
    progress.done = plan.done_count
    progress.holders = {h: attrs.asdict(s) for h, s in plan.holders.items()}


async def _fetch_round(
    source: ChunkSource,
    partial: Partial,
    plan: FetchPlan,
    bucket: TokenBucket,
    progress: FetchProgress,
) -> bytes:
    """Fetch until every chunk is written; returns the whole sha256, computed as the
    written prefix grows. A holder's chunks are checked on the way in until one of
    them matched (a holder that sends garbage is caught at once); later ones are
    checked by the whole hash. Raises `FetchError` when no holder is left."""
    wake = trio.Event()
    whole = _PrefixHash(partial)

    async def one(chunk: int, holder: str) -> None:
        nonlocal wake
        check = plan.holders[holder].served == 0
        try:
            await _fetch_one(source, partial, chunk, holder, bucket, progress, check=check)
        except SourceError as exc:
            plan.failed(chunk, holder, exc.failure, trio.current_time())
        else:
            partial.mark_done(chunk, verified=check)
            plan.succeeded(chunk, holder)
            whole.grew()
        _report(progress, plan)
        wake.set()

    _report(progress, plan)
    stuck: str | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(whole.run)
        while not plan.finished:
            stuck = plan.stuck()
            if stuck is not None and not plan.inflight():
                # Raised below, outside the nursery: raised here it would come out
                # wrapped in an ExceptionGroup (the whole hash's task still runs).
                nursery.cancel_scope.cancel()
                break
            stuck = None
            for a in plan.assign(trio.current_time()):
                nursery.start_soon(one, a.chunk, a.holder)
            deadline = plan.next_deadline(trio.current_time())
            with trio.move_on_at(deadline if deadline is not None else float("inf")):
                await wake.wait()
            wake = trio.Event()
        progress.state = "verifying"  # the nursery waits for the last of the whole hash
    if stuck is not None:
        raise FetchError(f"blob {partial.manifest.hex}: {stuck}")
    return whole.digest()


async def _fetch_one(
    source: ChunkSource,
    partial: Partial,
    chunk: int,
    holder: str,
    bucket: TokenBucket,
    progress: FetchProgress,
    *,
    check: bool,
) -> None:
    """Stream one chunk to its offset (and `check` its sha256 on the way). Raises
    `SourceError`."""
    manifest = partial.manifest
    offset, length = manifest.chunk_span(chunk)
    h = hashlib.sha256() if check else None
    got = 0
    async with source.chunk(holder, manifest.digest, chunk) as pieces:
        async for piece in pieces:
            if got + len(piece) > length:
                raise SourceError(ChunkFailure.CORRUPT, f"chunk {chunk} is too long")
            await bucket.take(len(piece))
            if h is not None:
                h.update(piece)
            partial.write(offset + got, piece)
            got += len(piece)
            progress.bytes_fetched += len(piece)
    if got != length:
        raise SourceError(ChunkFailure.CORRUPT, f"chunk {chunk} is too short")
    if h is not None and h.digest() != manifest.chunk_hashes[chunk]:
        raise SourceError(ChunkFailure.CORRUPT, f"chunk {chunk} does not match its hash")
