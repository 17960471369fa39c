"""The CLI: cluster init/enroll/revoke, key, and one-line errors with non-zero exits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from populi_p2p.cli import format_members, main, parse_duration
from populi_p2p.trust.identity import NodeIdentity

REPO = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {err!r}"
    assert lines[0].startswith("populi-node: error: ")
    return lines[0]


def test_cluster_init_enroll_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    authority = tmp_path / "authority"
    state = tmp_path / "state"
    code, out, _ = run(capsys, "cluster", "init", "--authority-dir", str(authority))
    assert code == 0 and "authority key created" in out
    assert (authority / "authority.key").stat().st_mode & 0o077 == 0

    code, _, err = run(capsys, "cluster", "init", "--authority-dir", str(authority))
    assert code == 1 and "already holds" in one_line_error(err)

    code, out, _ = run(capsys, "key", "--state-dir", str(state))
    assert code == 0
    public_key = out.strip()
    identity = NodeIdentity.load(state / "node.key")
    assert public_key == identity.public_key.hex()

    cert = tmp_path / "n.cert"
    code, out, _ = run(
        capsys, "cluster", "enroll", public_key, "--expires", "30d",
        "--authority-dir", str(authority), "--out", str(cert),
    )  # fmt: skip
    assert code == 0 and identity.node_id in out
    from populi_p2p.trust.authority import read_authority_public_key
    from populi_p2p.trust.certificate import read_certificate, verify_certificate

    verified = verify_certificate(
        read_certificate(cert),
        read_authority_public_key(authority / "authority.pub"),
        identity.public_key,
        now=__import__("time").time(),
    )
    assert verified.expires_at is not None

    rev = tmp_path / "r.rev"
    code, out, _ = run(
        capsys, "cluster", "revoke", "--serial", str(verified.serial),
        "--authority-dir", str(authority), "--out", str(rev),
    )  # fmt: skip
    assert code == 0 and rev.exists()


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["frobnicate"], 2, "invalid choice"),
        (["cluster", "enroll", "zz"], 2, "NODE_PUBLIC_KEY"),
        (["cluster", "enroll", "ab" * 32, "--expires", "soon"], 2, "--expires"),
        (["cluster", "enroll", "ab" * 32], 1, "no cluster authority"),
        (["cluster", "revoke"], 2, "one of the arguments"),
        (["status"], 1, "does not exist"),
        (["members", "--json"], 1, "does not exist"),
        (["leave"], 1, "does not exist"),
        (["up", "--port", "notanumber"], 2, "--port"),
        (["up", "--bootstrap", "host:99999"], 1, "port 99999 out of range"),
        (["--bogus"], 2, "unrecognized arguments: --bogus"),
        ([], 2, "required: COMMAND"),
        (["up", "--bind", "192.0.2.1"], 1, "not an address of this machine"),
        (["up", "--cert", "/nonexistent/n.cert"], 1, "cert: /nonexistent/n.cert does not"),
        (["up", "--authority-pubkey", "/nonexistent/a.pub"], 1, "authority-pubkey:"),
        (["up", "--cluster-secret", "/nonexistent/s"], 1, "cluster-secret:"),
        (["up", "--label", "=x"], 1, "label"),
        (["up", "--config", "/nonexistent/populi.toml"], 1, "does not exist"),
    ],
)
def test_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, needle: str
) -> None:
    # Every command gets a state dir that does not exist, so nothing touches the user's.
    extra: list[str] = []
    if argv and argv[0] in {"status", "members", "gpus", "leave", "up"}:
        extra = ["--state-dir", str(tmp_path / "missing")]
    if argv and argv[0] == "cluster" and argv[1] in {"enroll", "revoke"} and len(argv) > 2:
        extra = ["--authority-dir", str(tmp_path / "no-authority")]
    got, _, err = run(capsys, *argv, *extra)
    assert got == code
    assert needle in one_line_error(err)


def test_up_checks_arguments_before_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 7 §5: with no authority key AND a bad --bootstrap name, the name is reported."""
    import socket

    from populi_p2p import config

    def no_such_name(host: str, *args: object, **kwargs: object) -> object:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(config.socket, "getaddrinfo", no_such_name)  # no DNS in the test
    state = tmp_path / "state"  # empty: no key, no authority.pub, no certificate
    code, _, err = run(capsys, "up", "--state-dir", str(state), "--bootstrap", "host")
    line = one_line_error(err)
    assert code == 1
    assert "'host' does not resolve" in line and "authority" not in line


def test_up_resolver_trouble_is_not_an_argument_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A temporary resolver failure is left to the bootstrapper: the state check speaks."""
    import socket

    from populi_p2p import config

    def try_again(host: str, *args: object, **kwargs: object) -> object:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(config.socket, "getaddrinfo", try_again)
    code, _, err = run(capsys, "up", "--state-dir", str(tmp_path / "s"), "--bootstrap", "h1")
    assert code == 1 and "no cluster authority key" in one_line_error(err)


@pytest.mark.parametrize("as_json", [False, True])
def test_gpus_without_a_daemon_probes_locally(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    """Issue 7 §5: `gpus` with no daemon runs the probe itself and says so on stderr."""
    import json

    argv = ["gpus", "--state-dir", str(tmp_path / "no-daemon")] + (["--json"] if as_json else [])
    code, out, err = run(capsys, *argv)
    assert code == 0
    assert err.strip().splitlines() == [
        f"populi-node: no daemon running for state dir {tmp_path / 'no-daemon'}:"
        " probed this machine directly"
    ]
    if as_json:
        body = json.loads(out)
        assert body["source"] == "local"
        assert body["report"]["cpu"]["cores_logical"] >= 1
    else:
        assert "CPU:" in out


def test_gpus_with_a_dead_socket_probes_locally(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A socket file left by a killed daemon (nobody accepting) counts as no daemon."""
    import json
    import socket

    state = tmp_path / "s"
    state.mkdir()
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(state / "api.sock"))  # bound, never listening: connect is refused
        code, out, err = run(capsys, "gpus", "--json", "--state-dir", str(state))
    assert code == 0 and json.loads(out)["source"] == "local"
    assert "probed this machine directly" in err


def test_daemon_not_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "status", "--state-dir", str(tmp_path))
    line = one_line_error(err)
    assert code == 1 and "not running" in line and "populi-node up" in line


def test_no_permission(capsys: pytest.CaptureFixture[str]) -> None:
    """A socket owned by another user (mode 0600) gives the permission line."""
    import shutil
    import socket
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    state = Path(tempfile.mkdtemp(prefix="populi-perm-"))
    server = socket.socket(socket.AF_UNIX)
    try:
        state.chmod(0o755)
        server.bind(str(state / "api.sock"))
        os.chmod(state / "api.sock", 0o600)
        server.listen(1)
        run(capsys, "status", "--state-dir", str(state / "warm-up"))  # import everything first
        os.seteuid(65534)  # nobody: the socket is root's, 0600
        try:
            code, _, err = run(capsys, "status", "--state-dir", str(state))
        finally:
            os.seteuid(0)
    finally:
        server.close()
        shutil.rmtree(state)
    assert code == 1
    assert "no permission" in one_line_error(err)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("45s", 45), ("30m", 1800), ("1d12h", 129600), ("1y", 31536000)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "x", "5q", "-1d", "1d x"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_console_entry_point_runs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "populi_p2p.cli", "status", "--state-dir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "not running" in proc.stderr


@pytest.mark.slow
def test_commands_against_a_running_daemon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from .harness import Mesh, wait_until

    mesh = Mesh(tmp_path)
    try:
        d = mesh.start("solo", "--label", "zone=attic")
        peer = mesh.start("peer", "--bootstrap", d.address)
        state = str(d.state_dir)
        code, out, _ = run(capsys, "status", "--state-dir", state)
        assert code == 0 and d.node_id in out and "overlay" in out

        def probed() -> bool:
            rows = {m["node_id"]: m for m in d.members()}
            return peer.node_id in rows and rows[peer.node_id]["rtt_ms"] is not None

        wait_until(probed, 30, "solo to probe peer")
        code, out, _ = run(capsys, "members", "--json", "--state-dir", state)
        rows = {m["node_id"]: m for m in json.loads(out)}
        assert code == 0 and rows[d.node_id]["self"] and rows[d.node_id]["rtt_ms"] is None
        assert rows[d.node_id]["labels"] == {"zone": "attic"}
        # Loopback: a round trip through two daemons takes well under the probe timeout.
        assert 0 < rows[peer.node_id]["rtt_ms"] < 200
        code, out, _ = run(capsys, "members", "--state-dir", state)
        assert code == 0 and out.splitlines()[0].split()[:3] == ["NAME", "NODE", "ID"]
        assert "zone=attic" in out
        (peer_line,) = [line for line in out.splitlines() if peer.node_id in line]
        assert f"{rows[peer.node_id]['rtt_ms']:.1f}ms" in peer_line.split()
        code, out, _ = run(capsys, "gpus", "--json", "--state-dir", state)
        assert code == 0 and "table" in json.loads(out)
        assert json.loads(out)["source"] == "daemon"
        code, out, _ = run(capsys, "leave", "--state-dir", state)
        assert code == 0 and "leaving" in out
        assert d.wait_exit(timeout=10) == 0
        assert not (d.state_dir / "api.sock").exists()
        code, _, err = run(capsys, "status", "--state-dir", state)
        assert code == 1 and "not running" in one_line_error(err)
    finally:
        mesh.stop_all()


def test_members_table_marks_unverified_members() -> None:
    rows = [
        {"name": "a", "node_id": "a" * 16, "address": "10.0.0.1:7950", "state": "alive",
         "incarnation": 3, "rtt_ms": 0.42, "capabilities": "8 cpu", "labels": {},
         "verified": True, "unverified": None},
        {"name": "?", "node_id": "b" * 16, "address": "10.0.0.2:7950", "state": "alive",
         "incarnation": 1, "rtt_ms": None, "capabilities": "-", "labels": {},
         "verified": False, "unverified": "revoked"},
    ]  # fmt: skip
    cells = {line.split()[1]: line.split() for line in format_members(rows).splitlines()[1:]}
    assert cells["a" * 16][3:6] == ["alive", "3", "0.4ms"]
    assert cells["b" * 16][3:6] == ["alive,unverified(revoked)", "1", "-"]


@pytest.mark.parametrize(
    "argv",
    [
        ["up", "--config", "/nonexistent/a\nb.toml"],
        ["up", "--bootstrap", ":\n:"],
        ["up", "--name", "two\nlines"],
        ["up", "--cert", "/no/such\ncert"],
        ["cluster", "enroll", "ab" * 32, "--authority-dir", "/no/such\nauthority"],
        ["--bogus\nflag"],
        ["status", "--state-dir", "/no/such\nstate"],
    ],
)
def test_user_input_with_newlines_stays_on_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """Issue 7 §6: an error that echoes what the user typed quotes it."""
    code, _, err = run(capsys, *argv)
    assert code in (1, 2)
    assert one_line_error(err).isprintable()
