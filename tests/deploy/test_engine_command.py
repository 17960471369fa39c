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
                        "8123", "-c", "4096", "-ngl", "999"] and env == {}  # fmt: skip
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
