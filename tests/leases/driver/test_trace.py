"""`LeaseTrace` (POPULI_LEASE_TRACE): off unless asked, one JSON line per event, and a
message named by its kind, task and epoch without trusting it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from populi_p2p.leases.agent_wire import GrantRequest, Renew, encode
from populi_p2p.leases.driver.trace import ENV, LeaseTrace

TASK = "ab" * 16


def _lines(directory: Path) -> list[dict[str, object]]:
    (path,) = directory.glob("*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_off_unless_the_variable_names_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    trace = LeaseTrace("n" * 20)
    trace.note("submit")
    trace.message("in", "peer", b"junk")
    assert not trace.enabled and list(tmp_path.iterdir()) == []
    monkeypatch.setenv(ENV, str(tmp_path))
    assert LeaseTrace("n" * 20).enabled


def test_messages_and_notes_become_json_lines(tmp_path: Path) -> None:
    trace = LeaseTrace("node-a-with-a-long-id", str(tmp_path))
    trace.message("out", "peer-b-long-id", encode(GrantRequest(TASK, 3, "o")))
    trace.message("out", "peer-b-long-id", encode(Renew(7, ((TASK, 3),))))
    trace.message("in", "peer-b-long-id", b"\xc1junk")
    trace.note("commit", rows=2, ms=1.5)
    trace.close()
    grant, renew, junk, commit = _lines(tmp_path)
    assert grant["kind"] == "GrantRequest" and grant["task"] == TASK and grant["epoch"] == 3
    assert grant["node"] == "node-a-with-" and grant["peer"] == "peer-b-long-"
    assert renew["kind"] == "Renew" and renew["seq"] == 7 and renew["leases"] == [TASK]
    assert junk["kind"] == "junk"
    assert commit["ev"] == "commit" and commit["rows"] == 2 and isinstance(commit["t"], float)
