"""What an operator reads (issue 20): versions, member filters, last seen, draining, -f.

The commands run through `populi_p2p.cli.main`; where they ask a daemon, its answer is
a fixed list of rows (the API client's `get` replaced), so each test checks the CLI's
own work: filtering, formatting and one-line errors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from populi_p2p import cli
from populi_p2p._version import protocol_version, software_version
from populi_p2p.cli import format_members, main

NOW = 1_700_000_000.0


def row(name: str, state: str = "alive", **extra: Any) -> dict[str, Any]:
    return {"name": name, "node_id": name * 16, "address": "10.0.0.1:7950", "state": state,
            "incarnation": 1, "rtt_ms": 0.5, "capabilities": "8 cpu", "labels": {},
            "status": "available", "version": "0.1.0", "verified": True, "unverified": None,
            "last_seen": None} | extra  # fmt: skip


ROWS = [
    row("a", labels={"zone": "attic", "gpu": "yes"}),
    row("b", "dead", rtt_ms=None, last_seen=NOW - 7200, version="0.0.9"),
    row("c", "left", rtt_ms=None, last_seen=NOW - 90, labels={"zone": "attic"}),
    row("d", status="draining", labels={"zone": "cellar"}),
]


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    def get(self: object, path: str) -> Any:
        assert path == "/v1/members"
        return ROWS

    monkeypatch.setattr(cli.ApiClient, "get", get)


def members(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, list[str], str]:
    code = main(["members", "--json", *flags])
    out, err = capsys.readouterr()
    names = [m["name"] for m in json.loads(out)] if code == 0 else []
    return code, names, err


def test_version_flag_and_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    line = f"populi-node {software_version()} (protocol {protocol_version()})"
    assert capsys.readouterr().out.strip() == line
    assert main(["version", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"client  {line}"
    assert out[1].startswith("daemon  not running for state dir")
    assert main(["version", "--json", "--state-dir", str(tmp_path)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["client"]["software_version"] == software_version()
    assert answer["daemon"] is None


def test_members_filter_by_state_and_label(
    daemon: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert members(capsys)[1] == ["a", "b", "c", "d"]
    assert members(capsys, "--status", "dead")[1] == ["b"]
    assert members(capsys, "--status", "dead,left")[1] == ["b", "c"]
    assert members(capsys, "--status", "alive", "--status", "left")[1] == ["a", "c", "d"]
    assert members(capsys, "--status", "draining")[1] == ["d"]
    assert members(capsys, "--label", "zone=attic")[1] == ["a", "c"]
    assert members(capsys, "--label", "zone=attic", "--label", "gpu=yes")[1] == ["a"]
    assert members(capsys, "--label", "zone=attic", "--status", "alive")[1] == ["a"]


@pytest.mark.parametrize(
    ("flags", "says"),
    [(["--status", "gone"], "--status: unknown state 'gone'"), (["--label", "zone"], "K=V")],
)
def test_a_bad_members_filter_is_one_line(
    daemon: None, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    code, _, err = members(capsys, *flags)
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err


def test_the_table_shows_version_last_seen_and_draining() -> None:
    table = format_members(ROWS, now=NOW).splitlines()
    assert re.split(r"\s{2,}", table[0])[5:7] == ["RTT/SEEN", "VERSION"]
    cells = {line.split()[0]: re.split(r"\s{2,}", line) for line in table[1:]}
    assert cells["a"][3:7] == ["alive", "1", "0.5ms", "0.1.0"]
    assert cells["b"][3:7] == ["dead", "1", "seen 2h ago", "0.0.9"]  # no stale RTT
    assert cells["c"][5] == "seen 1m ago"
    assert cells["d"][3] == "alive,draining"


def test_events_takes_f_like_logs() -> None:
    args = cli._build_parser().parse_args(["events", "-f"])
    assert args.follow is True
