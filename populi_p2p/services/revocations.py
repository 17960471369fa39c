"""The revocation service: revocation files in STATE_DIR/revocations, gossiped as a
grow-only set.

Events in: revocation files appearing (checked on every housekeeping interval) and
control messages from peers (`on_control`). Commands out: every listener registered
with `on_change` is handed the merged list (the packet authenticator and the record
book), and the list is sent to a few live members when it grows, and to one every
push-pull interval (anti-entropy).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Final

import trio

from overlay.base import Address, TransportError

from .._keyfiles import KeyFileError
from .._log import event, get_logger
from ..certificate import CertificateError
from ..revocation import RevocationList, read_revocation, write_revocation
from .codec import CONTROL_PREFIX, CONTROL_REVOCATIONS

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


Peers = Callable[[], Sequence[Address]]
SendFrame = Callable[[Address, bytes], Awaitable[None]]


class RevocationService:
    """Holds the cluster's revocation list, adopts what it hears, gossips what it has.

    Args:
        files: the revocation directory.
        initial: the list verified at start-up.
        authority_key: revocations must be signed by it.
        gossip_interval: seconds between anti-entropy sends (the push-pull interval).
        rng: picks the members gossiped to.
    """

    def __init__(
        self,
        files: RevocationFiles,
        initial: RevocationList,
        authority_key: bytes,
        *,
        gossip_interval: float,
        rng: random.Random | None = None,
    ) -> None:
        self._files = files
        self.revocations = initial
        self._authority_key = authority_key
        self._interval = max(1.0, gossip_interval)
        self._rng = rng if rng is not None else random.Random()
        self._listeners: list[Callable[[RevocationList], None]] = []
        self._now = trio.Event()
        self._peers: Peers = list
        self._send: SendFrame | None = None

    def on_change(self, listener: Callable[[RevocationList], None]) -> None:
        """Call `listener` with the merged list every time it grows."""
        self._listeners.append(listener)

    def attach(self, peers: Peers, send_frame: SendFrame) -> None:
        """Where gossip goes: live peers' addresses, and a sealed reliable send."""
        self._peers = peers
        self._send = send_frame

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

    def on_control(self, message: bytes) -> None:
        """A control message from a peer (already authenticated)."""
        if message[:1] != CONTROL_REVOCATIONS:
            return  # a kind from a newer version: ignore
        try:
            heard = RevocationList.from_bytes(message[1:], self._authority_key)
        except CertificateError as exc:
            event(_log, 30, "revocation.refused", reason=str(exc))
            return
        self.adopt(heard, source="gossip")

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
        while True:
            with trio.move_on_after(self._interval):
                await self._now.wait()
            burst = self._now.is_set()
            self._now = trio.Event()
            if not len(self.revocations) or self._send is None:
                continue
            peers = list(self._peers())
            self._rng.shuffle(peers)
            payload = CONTROL_PREFIX + CONTROL_REVOCATIONS + self.revocations.to_bytes()
            for address in peers[: 3 if burst else 1]:
                try:
                    await self._send(address, payload)
                except TransportError as exc:
                    event(_log, 10, "revocation.send_failed", to=str(address), reason=str(exc))
