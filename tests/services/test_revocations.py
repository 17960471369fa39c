"""The revocation service: the files in STATE_DIR/revocations (bad ones skipped, not
re-read while the listing stands), the list adopted from gossip only when it grows
(listeners told, saved to disk), a digest-first push-pull section, and a broadcast on
each growth."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from populi_p2p.services import revocations as revocations_module
from populi_p2p.services.revocations import (
    REVOCATION_SUFFIX,
    RevocationFiles,
    RevocationService,
)
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.revocation import Revocation, RevocationList, write_revocation
from swim import AppMessage

NOW = 1_700_000_000.0
AUTHORITY = ClusterAuthority.generate()
OTHER = ClusterAuthority.generate()
FIRST, SECOND, THIRD = (AUTHORITY.revoke(now=NOW, serial=n) for n in (1, 2, 3))


def _write(directory: Path, name: str, revocation: Revocation) -> None:
    directory.mkdir(exist_ok=True)
    write_revocation(directory / name, revocation)


class _Service:
    """A `RevocationService` over `directory`, with its broadcasts and listeners' calls."""

    def __init__(self, directory: Path, initial: RevocationList = RevocationList()) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.heard: list[RevocationList] = []

        async def broadcast(key: str, payload: bytes) -> bool:
            self.sent.append((key, payload))
            return True

        files = RevocationFiles(directory, AUTHORITY.public_key)
        self.service = RevocationService(files, initial, AUTHORITY.public_key, broadcast=broadcast)
        self.service.on_change(self.heard.append)


def test_files_load_valid_revocations_and_skip_the_rest(tmp_path: Path) -> None:
    directory = tmp_path / "revocations"
    files = RevocationFiles(directory, AUTHORITY.public_key)
    assert len(files.load()) == 0  # no directory yet
    _write(directory, f"a{REVOCATION_SUFFIX}", FIRST)
    _write(directory, f"foreign{REVOCATION_SUFFIX}", OTHER.revoke(now=NOW, serial=9))
    (directory / f"junk{REVOCATION_SUFFIX}").write_text("not armored\n")
    _write(directory, "ignored.txt", SECOND)  # another suffix: not a revocation file
    assert files.load() == RevocationList.of([FIRST])


def test_files_are_read_again_only_when_the_listing_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "revocations"
    _write(directory, f"a{REVOCATION_SUFFIX}", FIRST)
    files = RevocationFiles(directory, AUTHORITY.public_key)
    reads: list[Path] = []
    real = revocations_module.read_revocation

    def counting(path: Path, key: bytes) -> Revocation:
        reads.append(path)
        return real(path, key)

    monkeypatch.setattr(revocations_module, "read_revocation", counting)
    first = files.load()
    assert files.load() is first and len(reads) == 1  # no crypto while nothing changed
    _write(directory, f"b{REVOCATION_SUFFIX}", SECOND)
    assert files.load() == RevocationList.of([FIRST, SECOND]) and len(reads) == 3
    os.utime(directory / f"a{REVOCATION_SUFFIX}", ns=(1, 1))  # rewritten: read again
    assert len(files.load()) == 2 and len(reads) == 5


def test_adopting_tells_the_listeners_only_when_the_list_grows(tmp_path: Path) -> None:
    held = _Service(tmp_path / "revocations", RevocationList.of([FIRST]))
    service = held.service
    service.adopt(RevocationList.of([FIRST]), source="gossip")  # nothing new
    assert held.heard == [] and not (tmp_path / "revocations").exists()
    service.adopt(RevocationList.of([FIRST, SECOND]), source="gossip")
    assert held.heard == [RevocationList.of([FIRST, SECOND])]
    assert service.current() == RevocationList.of([FIRST, SECOND])
    # What gossip brought is saved, so a restart without peers still knows it...
    saved = RevocationFiles(tmp_path / "revocations", AUTHORITY.public_key).load()
    assert saved == RevocationList.of([SECOND])
    # ...and what came from a file is not written again.
    service.adopt(RevocationList.of([THIRD]), source="file")
    assert len(list((tmp_path / "revocations").iterdir())) == 1
    assert len(held.heard) == 2 and len(service.current()) == 3


def test_a_gossiped_revocation_already_saved_is_fine(tmp_path: Path) -> None:
    for _ in range(2):  # a second service on the same directory
        _Service(tmp_path / "revocations").service.adopt(RevocationList.of([FIRST]), "gossip")
    assert len(list((tmp_path / "revocations").iterdir())) == 1


def test_a_directory_that_cannot_be_written_loses_only_the_copy(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    held = _Service(blocked / "revocations")
    held.service.adopt(RevocationList.of([FIRST]), source="gossip")
    assert held.service.current() == RevocationList.of([FIRST]) and len(held.heard) == 1


async def test_gossip_is_verified_all_or_nothing(tmp_path: Path) -> None:
    held = _Service(tmp_path / "revocations")
    service = held.service
    message = AppMessage("peer", "revocations", b"")
    await service.on_app(message, b"junk")
    await service.on_app(message, RevocationList.of([OTHER.revoke(now=NOW, serial=1)]).to_bytes())
    assert len(service.current()) == 0 and held.heard == []
    await service.on_app(message, RevocationList.of([FIRST]).to_bytes())
    assert service.current() == RevocationList.of([FIRST])


def test_the_push_pull_section_sends_the_list_only_where_digests_differ(tmp_path: Path) -> None:
    empty = _Service(tmp_path / "a").service
    assert empty.digest() == b"" and empty.state_for(b"anything") is None
    full = _Service(tmp_path / "b", RevocationList.of([FIRST, SECOND])).service
    assert full.digest() == full.current().digest() and len(full.digest()) == 16
    assert full.state_for(full.digest()) is None
    state = full.state_for(empty.digest())
    assert state == full.current().to_bytes()
    empty.merge(state)
    assert empty.current() == full.current()
    empty.merge(b"\xc1junk")  # never raises
    assert empty.current() == full.current()


async def test_growth_is_broadcast_and_files_are_watched(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    directory = tmp_path / "revocations"
    held = _Service(directory)
    async with trio.open_nursery() as nursery:
        await nursery.start(held.service.run)
        await trio.sleep(10)
        assert held.sent == []  # nothing to say yet
        _write(directory, f"op{REVOCATION_SUFFIX}", FIRST)
        await trio.sleep(revocations_module.FILE_CHECK_INTERVAL + 0.1)
        assert held.sent == [("revocations", RevocationList.of([FIRST]).to_bytes())]
        held.service.adopt(RevocationList.of([SECOND]), source="gossip")
        await trio.sleep(0.1)
        assert held.sent[-1] == ("revocations", RevocationList.of([FIRST, SECOND]).to_bytes())
        assert len(held.sent) == 2
        nursery.cancel_scope.cancel()
