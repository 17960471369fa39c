"""The systemd unit in contrib/: its ExecStart is a real command with flags `up`
accepts, its sample config holds only real settings, its state directory is the one
`--state-dir` names, it carries the hardening the README describes, and
`systemd-analyze verify` (where installed) finds nothing wrong with it."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from populi_p2p.cli import _parse
from populi_p2p.config import SETTINGS, NodeConfig

from .harness import REPO

UNIT = REPO / "contrib" / "systemd" / "populi-node.service"
SAMPLE = REPO / "contrib" / "systemd" / "node.toml"
#: What the README's "Running as a service" promises the unit sets.
HARDENING = {
    "NoNewPrivileges": "yes", "ProtectSystem": "full", "ProtectHome": "read-only",
    "PrivateTmp": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
    "RestrictSUIDSGID": "yes", "LockPersonality": "yes",
}  # fmt: skip


def unit_entries(text: str) -> dict[str, dict[str, str]]:
    """section -> key -> value, as systemd reads it (no inline comments in values)."""
    sections: dict[str, dict[str, str]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, eq, value = line.partition("=")
        assert eq and current is not None, f"not a unit line: {raw!r}"
        assert "#" not in value, f"systemd has no inline comments: {raw!r}"
        assert key not in current, f"{key} set twice"
        current[key] = value
    return sections


def test_exec_start_is_up_with_flags_it_accepts(tmp_path: Path) -> None:
    service = unit_entries(UNIT.read_text())["Service"]
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).name == "populi-node" and Path(argv[0]).is_absolute()
    args = _parse(argv[1:])
    assert args.command == "up"
    assert args.state_dir == Path("/var/lib") / service["StateDirectory"]
    assert args.config == Path("/etc") / service["ConfigurationDirectory"] / SAMPLE.name
    for key, value in HARDENING.items():
        assert service.get(key) == value, key
    assert service["KillMode"] == "mixed" and "Restart" in service
    # The sample config parses as shipped (all commented out) and with every example on.
    flags = {name: getattr(args, name) for name in SETTINGS}
    assert NodeConfig.load(SAMPLE, flags) is not None
    examples = [line[2:].split("#")[0] for line in SAMPLE.read_text().splitlines()
                if line.startswith("# ") and "=" in line.split("#")[1]]  # fmt: skip
    assert len(examples) >= 4
    enabled = tmp_path / "node.toml"
    enabled.write_text("\n".join(examples) + "\n")
    assert tomllib.loads(enabled.read_text())["bootstrap"] == ["10.77.0.1:7950"]
    config = NodeConfig.load(enabled, flags)
    assert config.name == "box1" and config.mdns


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verify_finds_nothing(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: point it at this checkout's.
    program = shutil.which("populi-node") or str(REPO / ".venv" / "bin" / "populi-node")
    if not Path(program).exists():
        pytest.skip("populi-node is not installed (pip install -e .)")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/populi-node", program))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    ours = [line for line in (done.stdout + done.stderr).splitlines() if UNIT.name in line]
    assert done.returncode == 0 and ours == [], done.stdout + done.stderr
