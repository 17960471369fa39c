"""`AppState`: the application's section of anti-entropy, as memberlist's delegate.

memberlist lets Serf add its own state to push-pull (`LocalState`,
`MergeRemoteState`). Here the exchange is digest-first: the opener sends only
`digest()`, the peer answers with `state_for(that digest)`, which is None when the opener
is already up to date, and the opener does the same in return. So two peers that agree
exchange two digests and nothing else. The core calls these synchronously, in the same
call that handled the packet: keep them quick and never block (sans-IO).
"""

from __future__ import annotations

from typing import Protocol


class AppState(Protocol):
    """What the core asks of the application during a sync (see docs/protocol.md)."""

    def digest(self) -> bytes:
        """A short summary of our state (a hash, a version vector), at most
        `SwimConfig.app_digest_size_max` bytes."""
        ...

    def state_for(self, remote_digest: bytes) -> bytes | None:
        """What a peer whose digest is `remote_digest` lacks, or None if nothing.

        `remote_digest` is untrusted input (b"" when the peer sent none). The result is
        not sent when it exceeds `SwimConfig.app_state_size_max` (counted).
        """
        ...

    def merge(self, payload: bytes) -> None:
        """Merge a peer's `state_for` answer. Untrusted input: validate, never raise."""
        ...
