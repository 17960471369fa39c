"""`--gguf`: the node's own ``llama-server`` (`populi_p2p.inference.llama_server`).

These run a fake ``llama-server`` (a script that logs the line the real one logs when
its port is open, then waits), so they need no build: the argument checks, where the
binary is looked for, the restart on the same port, the kill when the node stops, and
one clear line at start. The real binary is run by test_real_engine.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from populi_p2p.config import ConfigError, NodeConfig
from populi_p2p.inference.llama_server import (
    LLAMA_SERVER_ENV,
    GgufSpec,
    LlamaServer,
    LlamaServerError,
    find_llama_server,
    llama_server_argv,
    parse_gguf,
)
from tests.node.harness import REPO, Mesh

#: Logs what llama-server logs once its port is open (port 0 becomes 40123), its argv
#: on the next line, then waits; exits at once if told to by the env.
FAKE = """#!{python}
import os, sys, time
port = sys.argv[sys.argv.index("--port") + 1]
port = "40123" if port == "0" else port
print("main: HTTP server is listening, hostname: 127.0.0.1, port: " + port
      + ", http threads: 3", flush=True)
print("argv " + " ".join(sys.argv[1:]), flush=True)
if os.environ.get("FAKE_EXIT"):
    sys.exit(3)
time.sleep(600)
"""


def fake_server(tmp_path: Path) -> Path:
    path = tmp_path / "llama-server"
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(0o755)
    return path


def test_parse_gguf_names_and_refusals(tmp_path: Path) -> None:
    model = tmp_path / "tiny-llama.Q4.gguf"
    model.write_bytes(b"GGUF")
    assert parse_gguf(str(model)) == GgufSpec("tiny-llama.Q4", model.resolve())
    assert parse_gguf(f"my/model:7b={model}").name == "my/model:7b"
    with pytest.raises(ValueError, match="is not a file"):
        parse_gguf(str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match="is not a model name"):
        parse_gguf(f"bad name={model}")


def test_config_refuses_a_missing_file_and_a_name_twice(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert NodeConfig(gguf=[str(model)]).gguf == (str(model),)
    with pytest.raises(ConfigError, match=r"^gguf: '.*nope.gguf' is not a file"):
        NodeConfig(gguf=[str(tmp_path / "nope.gguf")])
    with pytest.raises(ConfigError, match="two models named 'm'"):
        NodeConfig(gguf=[str(model), f"m={model}"])


def test_find_llama_server_order_and_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_server(tmp_path)
    assert find_llama_server(str(fake)) == fake
    monkeypatch.setenv(LLAMA_SERVER_ENV, str(fake))
    assert find_llama_server() == fake
    monkeypatch.setenv(LLAMA_SERVER_ENV, str(tmp_path / "none"))
    with pytest.raises(LlamaServerError, match="is not an executable file"):
        find_llama_server()
    monkeypatch.delenv(LLAMA_SERVER_ENV)
    # Beside the running Python (where `make engine` puts it), then PATH's.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    fake.rename(bin_dir / "llama-server")
    assert find_llama_server() == bin_dir / "llama-server"
    (bin_dir / "llama-server").rename(fake)
    assert find_llama_server() == fake
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(LlamaServerError, match="run `make engine`"):
        find_llama_server()


def test_argv_serves_the_model_under_its_name_on_loopback(tmp_path: Path) -> None:
    argv = llama_server_argv(Path("/x/llama-server"), GgufSpec("m", Path("/m.gguf")), threads=2)
    assert argv[:3] == ["/x/llama-server", "--model", "/m.gguf"]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert pairs["--alias"] == "m" and pairs["--host"] == "127.0.0.1"
    assert pairs["--port"] == "0" and pairs["--threads"] == "2"
    assert "--jinja" in argv


async def test_restarted_on_the_same_port_and_killed_when_cancelled(tmp_path: Path) -> None:
    """The URL comes from the log; a server that dies is started again with the port
    it had (so the engine poll's URL stays right); cancelling kills it."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    server = LlamaServer(fake_server(tmp_path), parse_gguf(str(model)), tmp_path / "m.log")
    async with trio.open_nursery() as nursery:
        url = await nursery.start(server.run)
        assert url == "http://127.0.0.1:40123" and server.starts == 1
        first = server.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        with trio.fail_after(20):
            while server.starts < 2 or server.pid is None or "argv" not in server.tail():
                await trio.sleep(0.05)
        assert "--port 40123" in server.tail()
        second = server.pid
        nursery.cancel_scope.cancel()
    assert second != first and server.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(second, 0)


async def test_a_first_start_that_fails_says_why(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    broken = tmp_path / "llama-server"
    broken.write_text(f"#!{sys.executable}\nimport sys\nprint('bad model file')\nsys.exit(1)\n")
    broken.chmod(0o755)
    server = LlamaServer(broken, parse_gguf(str(model)), tmp_path / "m.log")
    with pytest.raises(LlamaServerError, match=r"exited \(1\) before opening its port.*bad model"):
        await server.run()


def test_up_without_llama_server_is_one_line(tmp_path: Path) -> None:
    """``populi-node up --gguf`` with no llama-server to run: one line, and the node stops."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    state = Mesh(tmp_path).prepare("a")
    env = {**os.environ, LLAMA_SERVER_ENV: str(tmp_path / "missing"), "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "populi_p2p.cli", "up", "--state-dir", str(state),
         "--bind", "127.0.0.1", "--port", "0", "--gguf", str(model)],
        capture_output=True, text=True, env=env, timeout=60, cwd=REPO,
    )  # fmt: skip
    lines = [line for line in out.stderr.splitlines() if "llama-server" in line]
    assert out.returncode != 0 and lines, out.stderr[-2000:]
    assert "is not an executable file" in lines[0], out.stderr[-2000:]
