"""What the CLI prints cannot drive the terminal (issue 18, row 5).

A member's signed name with an escape sequence and a newline made `members` recolour
the terminal and print a forged "ghost" row. Records are now refused on decode, but the
CLI escapes what it shows anyway: these tests feed it hostile rows as a daemon (old,
or not ours) could serve them, through the real commands.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from populi_p2p import cli, cli_tasks
from populi_p2p._terminal import format_table, terminal_safe
from populi_p2p.cli import main

GHOST = "ghost  ffffffffffffffff  10.6.6.6:7950  alive"
HOSTILE_NAME = f"box\x1b[31m\x1b[2J\n{GHOST}\u202e\x9b0m\u2028"


def member(name: str, node_id: str, **more: Any) -> dict[str, Any]:
    row = {
        "name": name, "node_id": node_id, "address": "10.0.0.1:7950", "state": "alive",
        "incarnation": 1, "rtt_ms": 0.5, "capabilities": "8 cpu", "labels": {},
        "verified": True, "unverified": None,
    }  # fmt: skip
    row.update(more)
    return row


class FakeClient:
    """`ApiClient` answering from a table of paths."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers

    def get(self, path: str) -> Any:
        return self.answers[path]


def served(monkeypatch: pytest.MonkeyPatch, answers: dict[str, Any]) -> None:
    client = FakeClient(answers)
    monkeypatch.setattr(cli, "_client", lambda _args: client)
    monkeypatch.setattr(cli_tasks, "_client", lambda _args, timeout=None: client)


def assert_terminal_safe(text: str) -> None:
    for line in text.split("\n"):
        assert line.isprintable(), repr(line)


def test_members_prints_a_hostile_name_escaped_on_its_own_row(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        member("a", "a" * 16),
        member(HOSTILE_NAME, "b" * 16, labels={"rack\x1b[8m": "b2\nhidden"}),
    ]
    served(monkeypatch, {"/v1/members": rows})
    assert main(["members"]) == 0
    out = capsys.readouterr().out
    assert_terminal_safe(out)
    lines = out.rstrip("\n").split("\n")
    assert len(lines) == 3  # the header and two members: no ghost row
    assert not any(line.startswith("ghost") for line in lines)
    hostile = next(line for line in lines if "b" * 16 in line)
    assert hostile.startswith("box\\x1b[31m\\x1b[2J\\n" + GHOST + "\\u202e\\x9b0m\\u2028")
    assert "rack\\x1b[8m=b2\\nhidden" in hostile
    # The columns after the name still line up with the header's.
    header = lines[0]
    assert hostile.index("b" * 16) == header.index("NODE ID")


def test_the_tasks_table_and_a_task_escape_what_they_show(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    task = {
        "id": "t" * 32, "kind": "run\x1b[1m", "phase": "succeeded", "epoch": 1,
        "owner": "a" * 16, "age": 5.0, "why": "no\rnode", "finished": True,
    }  # fmt: skip
    detail = dict(
        task,
        spec={
            "command": ["echo", "\x1b]0;title\x07"],
            "kind": "run",
            "replicas": ["p" * 16, "b\x1b" * 8],
        },
        epochs=[{"epoch": 1, "owner": "a" * 16, "phase": "succeeded", "exit_code": 0}],
        result={"exit_code": 0, "duration": 0.1, "output_tail": "one\ntwo\x1b[2K\rthree\n"},
    )
    served(
        monkeypatch,
        {
            "/v1/tasks": [task],
            "/v1/members": [member(HOSTILE_NAME, "a" * 16)],
            f"/v1/tasks/{task['id']}": detail,
            f"/v1/artifacts/holders?task={task['id']}": {
                "blobs": [
                    {
                        "what": "output",
                        "name": "out\x1b[2J",
                        "sha256": "ab" * 32,
                        "holders": ["a" * 16],
                    },
                ]
            },
        },
    )
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert_terminal_safe(out)
    assert len(out.rstrip("\n").split("\n")) == 2 and "run\\x1b[1m" in out
    assert main(["task", str(task["id"])]) == 0
    out = capsys.readouterr().out
    assert_terminal_safe(out)
    assert "echo \\x1b]0;title\\x07" in out
    assert "held now output out\\x1b[2J" in out
    assert "replicas pppppppppppp b\\x1bb\\x1bb\\x1bb\\x1bb\\x1bb\\x1b\n" in out  # primary first
    # The output keeps its lines; what would move the cursor is shown escaped.
    assert out.endswith("one\ntwo\\x1b[2K\\rthree\n\n")


def test_a_table_cell_cannot_add_a_row_or_shift_a_column() -> None:
    table = format_table([["x\ny", "1"], ["\u202eab", "2"]], ["NAME", "N"])
    lines = table.split("\n")
    assert lines == ["NAME      N", "x\\ny      1", "\\u202eab  2"]


@given(st.text())
def test_terminal_safe_text_is_printable_and_printable_text_is_kept(text: str) -> None:
    safe = terminal_safe(text)
    assert safe.isprintable()
    if text.isprintable():
        assert safe == text
    kept = terminal_safe(text, keep_newlines=True)
    assert kept.count("\n") == text.count("\n")
    assert all(line.isprintable() for line in kept.split("\n"))
