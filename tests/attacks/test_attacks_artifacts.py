"""Attacks on task outputs (docs/artifacts.md): a stale owner's late outputs are not
held by anyone, and a task cannot make the daemon read a file through a link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from populi_p2p.artifacts.files import OutputError, open_output
from populi_p2p.leases.grants import GrantRecord
from tests.artifacts.test_service import _spec, hold, service


async def test_a_stale_owners_late_outputs_are_refused_and_counted(tmp_path: Path) -> None:
    # n1 owned epoch 1 and was cut off; epoch 2 was granted to n3 since.
    grants = {"t": GrantRecord("t", _spec(), b"", epoch=2, owner="n3")}
    svc, blobs = service(tmp_path, grants)
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        answer = await svc._serve_hold(hold("n1", 1))
        assert answer.status == 409 and b"stale epoch 1" in answer.body  # type: ignore[operator]
        assert svc.stats["holds_refused_stale"] == 1 and blobs.fetched == []
        nursery.cancel_scope.cancel()


def test_an_output_cannot_read_the_daemons_files_through_a_link(tmp_path: Path) -> None:
    secret = tmp_path / "key"
    secret.write_text("node key")
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    (work / "out" / "k").symlink_to(secret)
    os.link(secret, work / "hard")
    for path in ("out", "out/k", "hard"):
        with pytest.raises(OutputError), open_output(work, path, tmp_path / "t.tar"):
            pass
