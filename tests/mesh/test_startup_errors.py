"""Every start-up failure of `populi-node up` is one line on stderr, naming the problem
and the fix, with a non-zero exit (issue 7 §3). Real processes, real refusals: a
read-only mount, a full tmpfs, a port held by another socket, a path too long for a
unix socket, a certificate that cannot be read.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.harness import REPO, Mesh

UP_TIMEOUT = 60.0


def up(state: Path, *flags: str, port: str = "0") -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable, "-m", "populi_p2p.cli", "up", "--state-dir", str(state),
        "--bind", "127.0.0.1", "--port", port, "--overlay", "none", *flags,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=UP_TIMEOUT, env=env)


def assert_one_line(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode != 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def mesh(tmp_path: Path) -> Mesh:
    return Mesh(tmp_path)


def _mount(*argv: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a read-only or tiny file system")
    done = subprocess.run(["mount", *argv], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")


@pytest.fixture
def read_only(mesh: Mesh) -> Iterator[Path]:
    state = mesh.prepare("ro")
    _mount("--bind", str(state), str(state))
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(state)], check=True)
        yield state
    finally:
        subprocess.run(["umount", str(state)], check=False)


def test_read_only_state_dir(read_only: Path) -> None:
    line = assert_one_line(up(read_only), "read-only", str(read_only), "--state-dir")
    assert "Traceback" not in line


@pytest.fixture
def full_disk(mesh: Mesh, tmp_path: Path) -> Iterator[Path]:
    prepared = mesh.prepare("full")
    mount = tmp_path / "tiny"
    mount.mkdir()
    _mount("-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount))
    try:
        state = mount / "state"
        state.mkdir()
        for item in prepared.iterdir():
            (state / item.name).write_bytes(item.read_bytes())
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass  # full: that is the point
        finally:
            os.close(fd)
        yield state
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_full_disk(full_disk: Path) -> None:
    assert_one_line(up(full_disk), "disk is full", str(full_disk))


def test_port_in_use(mesh: Mesh) -> None:
    state = mesh.prepare("busy")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        port = udp.getsockname()[1]
        with socket.socket() as tcp:
            tcp.bind(("127.0.0.1", port))
            tcp.listen()
            result = up(state, port=str(port))
    assert_one_line(result, "Address already in use", str(port), "--port")


def test_socket_path_too_long(mesh: Mesh, tmp_path: Path) -> None:
    prepared = mesh.prepare("long")
    state = tmp_path / ("d" * (120 - len(str(tmp_path))))
    state.mkdir()
    for item in prepared.iterdir():
        (state / item.name).write_bytes(item.read_bytes())
    assert len(str(state / "api.sock")) > 107
    assert_one_line(up(state), "107-byte limit", "api.sock", "shorter --state-dir")


def test_certificate_unreadable(mesh: Mesh) -> None:
    state = mesh.prepare("cert")
    cert = state / "node.cert"
    if os.geteuid() == 0:  # root reads any mode: make it something no one can read
        cert.unlink()
        cert.mkdir()
    else:
        cert.chmod(0)
    assert_one_line(up(state), "cannot read the enrollment certificate", str(cert))
