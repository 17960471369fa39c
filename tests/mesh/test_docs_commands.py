"""Every `populi-node` command in the README's quick start and in docs/operations.md runs.

Issue 7 §7: the docs once ran `cluster enroll` without the `--authority-dir` that
`cluster init` had been given, and nobody noticed. This test takes the fenced ``sh``
blocks of `README.md` (the "Quick start" section) and of `docs/operations.md`, and runs
their commands in order, each document on a fresh temporary HOME (so `~`, the default
state dir and the default authority dir are all temporary), on loopback only.

What is run, and what is changed on the way (nothing else is):

* ``populi-node ...``: run in this process through `populi_p2p.cli.main`, and must exit
  0; so a command or flag that no longer exists fails the test. ``up`` is the exception:
  it runs as a real daemon in the background, with `_UP_EXTRA` appended (loopback,
  kernel-chosen port, no overlay detection, the fast preset), and is waited for through
  its control API. ``leave`` must then end it with exit status 0.
* ``cp``: copied with `shutil.copy`.
* the commands in `_NOT_RUN` (installing, copying to another machine) are skipped.
  Any other command fails the test: classify it here first.
* tokens in `_SUBSTITUTED` are replaced (the placeholders for a public key, and the
  documentation's example address of another member), and ``~`` is the temporary HOME.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from populi_p2p.api import ApiClient
from populi_p2p.cli import main
from tests.node.harness import REPO, wait_until

#: The documents and, for each, the section to take commands from (None: all of it).
DOCUMENTS = [(REPO / "README.md", "## Quick start"), (REPO / "docs" / "operations.md", None)]
#: Commands shown in the docs that this test does not run, and why.
_NOT_RUN = {
    "pip": "installing: the suite runs on the installed checkout",
    "scp": "copies to another machine",
}
#: Placeholder tokens in the docs -> what they stand for here ("KEY": the public key the
#: last `populi-node key` printed; "SEED": the address of a member to join through,
#: here a loopback port nobody listens on, so the node keeps retrying in the background).
_SUBSTITUTED = {
    "PUBLIC_KEY": "KEY",  # README
    "6b1e...": "KEY",  # docs/operations.md
    "10.77.0.1:7950": "SEED",
}
_SEED = "127.0.0.1:9"
#: Flags added to every documented `up`: loopback only, a free port, no overlay probing.
_UP_EXTRA = ("--bind", "127.0.0.1", "--port", "0", "--overlay", "none", "--preset", "local")


def documented_commands(path: Path, section: str | None) -> list[list[str]]:
    """The commands of the ``sh`` blocks of `path` (in `section`), as argv lists."""
    text = path.read_text()
    if section is not None:
        start = text.index(section)
        end = text.find("\n## ", start + len(section))
        text = text[start : end if end >= 0 else len(text)]
    commands: list[list[str]] = []
    in_sh = False
    for line in text.splitlines():
        fence = re.match(r"\s*```(\w*)", line)
        if fence:
            in_sh = not in_sh and fence[1] == "sh"
            continue
        if in_sh:
            argv = shlex.split(line, comments=True)
            if argv:
                commands.append(argv)
    return commands


def test_both_documents_show_commands() -> None:
    for path, section in DOCUMENTS:
        argvs = documented_commands(path, section)
        assert sum(argv[0] == "populi-node" for argv in argvs) >= 8, path
        assert ["populi-node", "leave"] in argvs, f"{path}: the test needs a leave"


class _Runner:
    """Runs one document's commands on one temporary HOME."""

    def __init__(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.home = home
        self.capsys = capsys
        self.public_key: str | None = None
        self.daemon: subprocess.Popen[bytes] | None = None
        self.daemon_state: Path | None = None
        self.used: set[str] = set()

    def expand(self, token: str) -> str:
        if token in _SUBSTITUTED:
            self.used.add(token)
            if _SUBSTITUTED[token] == "SEED":
                return _SEED
            assert self.public_key is not None, f"{token} used before `populi-node key`"
            return self.public_key
        if token == "~" or token.startswith("~/"):
            return str(self.home) + token[1:]
        return token

    def run(self, where: str, argv: list[str]) -> None:
        if argv[0] in _NOT_RUN:
            return
        words = [self.expand(w) for w in argv]
        if argv[0] == "cp":
            assert len(words) == 3, f"{where}: only `cp SOURCE DEST` is supported"
            shutil.copy(words[1], words[2])
            return
        assert argv[0] == "populi-node", f"{where}: unclassified command {argv[0]!r}"
        if argv[1] == "up":
            self.start(where, words[1:])
            return
        self.capsys.readouterr()
        code = main(words[1:])
        out, err = self.capsys.readouterr()
        assert code == 0, f"{where}: {shlex.join(argv)} exited {code}: {err.strip()}"
        if argv[1] == "key":
            self.public_key = out.strip()
        if argv[1] == "leave":
            assert self.daemon is not None, f"{where}: leave without a running daemon"
            assert self.daemon.wait(timeout=15) == 0
            self.daemon = None

    def state_dir(self, args: list[str]) -> Path:
        if "--state-dir" in args:
            return Path(args[args.index("--state-dir") + 1])
        return self.home / ".local" / "state" / "populi"  # the documented default

    def start(self, where: str, args: list[str]) -> None:
        assert self.daemon is None, f"{where}: a second `up` while one runs"
        state = self.state_dir(args)
        log = self.home / "daemon.log"
        with log.open("ab") as out:
            self.daemon = subprocess.Popen(
                [sys.executable, "-m", "populi_p2p.cli", *args, *_UP_EXTRA],
                stdout=out, stderr=subprocess.STDOUT, env=_environment(self.home),
                cwd=os.getcwd(),
            )  # fmt: skip
        daemon, client = self.daemon, ApiClient(state / "api.sock", timeout=5.0)

        def answering() -> bool:
            if daemon.poll() is not None:
                raise AssertionError(f"{where}: up exited: {log.read_text()[-1500:]}")
            return client.is_running()

        wait_until(answering, 30, f"{where}: the daemon's API")

    def stop(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.kill()
            self.daemon.wait(timeout=10)


def _environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env.update(HOME=str(home), PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    return env


@pytest.mark.parametrize(("path", "section"), DOCUMENTS, ids=["README", "operations"])
def test_documented_commands_run_in_order(
    path: Path,
    section: str | None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    for name in [k for k in os.environ if k.startswith("XDG_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    runner = _Runner(home, capsys)
    try:
        for number, argv in enumerate(documented_commands(path, section), 1):
            runner.run(f"{path.name} command {number}", argv)
    finally:
        runner.stop()
    assert runner.daemon is None, "the documented daemon was not ended by `leave`"
    placeholders = {t for t in _SUBSTITUTED if any(t in a for a in _all_tokens(path, section))}
    assert placeholders <= runner.used


def _all_tokens(path: Path, section: str | None) -> list[str]:
    return [t for argv in documented_commands(path, section) for t in argv]
