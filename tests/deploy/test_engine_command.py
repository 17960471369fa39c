"""`engine_command`: the one place that says how each kind of engine starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from populi_p2p.config import NodeConfig
from populi_p2p.deploy.engine_command import (
    ENGINE_KINDS,
    EngineNotFound,
    engine_command,
    resolve_engine,
)
from populi_p2p.settings import settings_of

SHA = "cd" * 32


def test_engine_command_for_each_kind() -> None:
    model = Path("/state/blobs/" + SHA)
    argv, env = engine_command("llama-server", model, "qwen", 8123, ctx=4096, gpus=1)
    assert argv[1:] == ["-m", str(model), "--alias", "qwen", "--host", "127.0.0.1", "--port",
                        "8123", "--jinja", "--no-webui", "-c", "4096", "-ngl", "999"]  # fmt: skip
    assert env == {}
    argv, _ = engine_command("llama-server", model, "qwen", 8123, binary="./llama-server")
    assert argv[0] == "./llama-server" and "-c" not in argv  # the engine's default context
    argv, _ = engine_command("llama-cpp-python", model, "qwen", 8123)
    assert argv[1:4] == ["-m", "llama_cpp.server", "--model"] and "--n_ctx" not in argv
    assert argv[argv.index("--n_gpu_layers") + 1] == "0"
    argv, env = engine_command("standin", model, "qwen", 8123,
                               environ={"POPULI_STANDIN_DELAY": "1", "HOME": "/root"})  # fmt: skip
    assert argv[1:3] == ["-m", "populi_p2p.testing.standin"] and "--model-file" in argv
    assert env == {"POPULI_STANDIN_DELAY": "1"}  # only the stand-in's own settings pass


def test_engine_kinds_match_the_setting_and_unknown_is_one_line() -> None:
    assert settings_of(NodeConfig)["deploy_engine"].choices == ENGINE_KINDS
    assert resolve_engine("standin") == "standin"
    with pytest.raises(EngineNotFound, match="one of auto"):
        resolve_engine("vllm")


def test_reachable_by_others_reads_every_directory_on_the_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from populi_p2p.deploy import engine_command as module

    tmp_path.chmod(0o755)
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_bytes(b"\x7fELF")
    binary.chmod(0o755)
    assert not module.reachable_by_others(binary)  # under /tmp: a task's own /tmp hides it
    monkeypatch.setattr(module, "PRIVATE_DIRS", ())
    real_mode = module._mode

    def mode(path: Path) -> int:  # above tmp_path (pytest's own dirs are 0700): open
        return real_mode(path) if path.is_relative_to(tmp_path) else 0o40755

    monkeypatch.setattr(module, "_mode", mode)
    assert module.reachable_by_others(binary)
    binary.parent.chmod(0o700)  # a directory on the way closed: .venv under /root
    assert not module.reachable_by_others(binary)
    binary.parent.chmod(0o755)
    binary.chmod(0o700)
    assert not module.reachable_by_others(binary)


def test_the_engine_binary_given_to_a_task_user_is_runnable_and_the_nodes_untouched(
    tmp_path: Path,
) -> None:
    """A binary others may run is hard-linked (same inode, no copy); one they may not
    is copied, runnable, and the node's own keeps its mode."""
    from populi_p2p.deploy.runner import _give_binary

    open_binary, closed_binary = tmp_path / "open", tmp_path / "closed"
    for path, mode in ((open_binary, 0o755), (closed_binary, 0o700)):
        path.write_bytes(b"\x7fELF" + path.name.encode())
        path.chmod(mode)
    linked = _give_binary(open_binary, tmp_path / "linked")
    assert linked.stat().st_ino == open_binary.stat().st_ino
    copied = _give_binary(closed_binary, tmp_path / "copied")
    assert copied.stat().st_ino != closed_binary.stat().st_ino
    assert copied.read_bytes() == closed_binary.read_bytes()
    assert copied.stat().st_mode & 0o777 == 0o755
    assert closed_binary.stat().st_mode & 0o777 == 0o700
