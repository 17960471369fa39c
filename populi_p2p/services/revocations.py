"""The revocation service: revocation files in STATE_DIR/revocations, gossiped as a
grow-only set over the swim application channel (`AppKind.REVOCATIONS`).

Events in: revocation files appearing (checked every `FILE_CHECK_INTERVAL`), lists
broadcast by peers (`on_app`), and the push-pull section (this service is the kind's
`swim.AppState`: a 16-byte digest of the list first; the list itself only to a peer
whose digest differs). Commands out: every listener registered with `on_change` is
handed the merged list (the packet authenticator and the record book), and the list is
broadcast on the channel when it grows (a list too big for one packet travels in the
push-pull section only).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import trio

from swim import AppMessage

from .._log import event, get_logger
from ..trust._keyfiles import KeyFileError
from ..trust.certificate import CertificateError
from ..trust.revocation import RevocationList, read_revocation, write_revocation

__all__ = ["REVOCATION_SUFFIX", "RevocationFiles", "RevocationService"]

#: Supported revocation file suffix in STATE_DIR/revocations/.
REVOCATION_SUFFIX: Final = ".rev"
#: How often the revocation directory is looked at, seconds.
FILE_CHECK_INTERVAL: Final = 2.0

_log = get_logger("node")


class RevocationFiles:
    """Every valid revocation file in a directory; re-read only when the listing changes."""

    def __init__(self, directory: Path, authority_key: bytes) -> None:
        self.directory = directory
        self._authority_key = authority_key
        self._snapshot: tuple[tuple[str, int], ...] = ()
        self._last = RevocationList()

    def load(self) -> RevocationList:
        """The revocations the files hold (bad files logged and skipped)."""
        if not self.directory.is_dir():
            return RevocationList()
        try:
            paths = sorted(self.directory.glob(f"*{REVOCATION_SUFFIX}"))
            snapshot = tuple((p.name, p.stat().st_mtime_ns) for p in paths)
        except OSError:
            return self._last  # changing under our feet: look again next time
        if snapshot == self._snapshot:
            return self._last  # nothing changed since the last look: no crypto
        self._snapshot = snapshot
        revocations = RevocationList()
        for path in paths:
            try:
                revocations = revocations.with_revocation(
                    read_revocation(path, self._authority_key)
                )
            except (KeyFileError, CertificateError) as exc:
                event(_log, 30, "revocation.ignored", file=str(path), reason=str(exc))
        self._last = revocations
        return revocations


#: Queue a payload on the application channel (`AppChannel.broadcast` bound to the
#: kind); False when it was refused (too big: the push-pull section carries it).
Broadcast = Callable[[str, bytes], Awaitable[bool]]


class RevocationService:
    """Holds the cluster's revocation list, adopts what it hears, gossips what it has.

    Args:
        files: the revocation directory.
        initial: the list verified at start-up.
        authority_key: revocations must be signed by it.
        broadcast: where gossip goes: the application channel, under
            `AppKind.REVOCATIONS`.
    """

    def __init__(
        self,
        files: RevocationFiles,
        initial: RevocationList,
        authority_key: bytes,
        *,
        broadcast: Broadcast,
    ) -> None:
        self._files = files
        self.revocations = initial
        self._authority_key = authority_key
        self._listeners: list[Callable[[RevocationList], None]] = []
        self._now = trio.Event()
        self._broadcast = broadcast

    def current(self) -> RevocationList:
        """The merged list as it is now (`operator.operator_checker` reads it)."""
        return self.revocations

    def on_change(self, listener: Callable[[RevocationList], None]) -> None:
        """Call `listener` with the merged list every time it grows."""
        self._listeners.append(listener)

    def adopt(self, heard: RevocationList, source: str) -> None:
        merged = self.revocations.merge(heard)
        if merged is self.revocations or len(merged) == len(self.revocations):
            return
        new = [r for r in merged if r not in self.revocations.revocations]
        self.revocations = merged
        for listener in self._listeners:
            listener(merged)
        directory = self._files.directory
        for revocation in new:
            event(_log, 30, "revocation.adopted", what=revocation.describe(), source=source)
            if source != "file":
                try:
                    directory.mkdir(mode=0o700, exist_ok=True)
                    name = hashlib.sha256(revocation.raw).hexdigest()[:16]
                    write_revocation(directory / f"gossip-{name}{REVOCATION_SUFFIX}", revocation)
                except FileExistsError:
                    pass
                except OSError as exc:
                    event(_log, 30, "revocation.not_saved", reason=str(exc))
        self._now.set()

    def _heard(self, payload: bytes) -> None:
        try:
            heard = RevocationList.from_bytes(payload, self._authority_key)
        except CertificateError as exc:
            event(_log, 30, "revocation.refused", reason=str(exc))
            return
        self.adopt(heard, source="gossip")

    async def on_app(self, message: AppMessage, body: bytes) -> None:
        """A list broadcast by a peer (the channel's envelope authenticated the packet;
        each revocation is verified against the authority key)."""
        self._heard(body)

    ####################################################################################
    # swim.AppState: the push-pull section, digest first

    def digest(self) -> bytes:
        return self.revocations.digest() if len(self.revocations) else b""

    def state_for(self, remote_digest: bytes) -> bytes | None:
        if not len(self.revocations) or remote_digest == self.revocations.digest():
            return None
        return self.revocations.to_bytes()

    def merge(self, payload: bytes) -> None:
        self._heard(payload)

    ####################################################################################

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_files)
            task_status.started()
            await self._gossip()

    async def _watch_files(self) -> None:
        while True:
            await trio.sleep(FILE_CHECK_INTERVAL)
            self.adopt(self._files.load(), source="file")

    async def _gossip(self) -> None:
        """Broadcast the list each time it grows; peers that miss it (or that join
        later) get it from the push-pull section."""
        while True:
            await self._now.wait()
            self._now = trio.Event()
            if len(self.revocations):
                await self._broadcast("revocations", self.revocations.to_bytes())
