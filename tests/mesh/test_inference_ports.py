"""A daemon whose --peer-port or --api-listen port is taken says so in one line."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.node.harness import Mesh


@pytest.mark.parametrize("flag", ["--peer-port", "--api-listen"])
def test_taken_port_is_one_line(tmp_path: Path, flag: str) -> None:
    mesh = Mesh(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        value = str(port) if flag == "--peer-port" else f"127.0.0.1:{port}"
        daemon = mesh.spawn("a", flag, value)
        try:
            assert daemon.wait_exit(30) != 0
        finally:
            mesh.stop_all()
    lines = [line for line in daemon.log().splitlines() if "error" in line]
    assert lines and flag in lines[-1] and "in use" in lines[-1].lower(), daemon.log()[-800:]
