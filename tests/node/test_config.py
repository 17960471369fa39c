"""NodeConfig: defaults, TOML file, flags win, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.config import DEFAULT_PORT, ConfigError, NodeConfig, parse_host_port


def test_defaults(tmp_path: Path) -> None:
    config = NodeConfig.load(None, {"state_dir": tmp_path})
    assert config.port == DEFAULT_PORT
    assert config.preset == "lan"
    assert config.overlay == "auto"
    assert config.cert_path == tmp_path / "node.cert"
    assert config.authority_pubkey_path == tmp_path / "authority.pub"
    assert config.api_socket == tmp_path / "api.sock"
    assert not config.mdns
    assert config.gpu_probe_interval == 30.0


def test_file_then_flags_win(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text(
        'name = "from-file"\nport = 1234\nbootstrap = ["10.0.0.1:7950", "[fd00::1]:7"]\n'
        'allow-cidr = ["10.0.0.0/8"]\nmdns = true\ncert = "certs/n.cert"\n'
        'reserve-vram = "2GiB"\npreset = "wan"\n[labels]\nzone = "a"\n'
    )
    config = NodeConfig.load(toml, {"port": 999, "name": None, "bootstrap": ["127.0.0.1:1"]})
    assert config.name == "from-file"
    assert config.port == 999  # flag wins
    assert config.bootstrap == ("127.0.0.1:1",)  # flags replace lists, do not append
    assert config.allow_cidr == ("10.0.0.0/8",)
    assert config.mdns is True
    assert config.cert == (tmp_path / "certs" / "n.cert").resolve()  # relative to the file
    assert config.reserve_vram == 2 * 1024**3
    assert config.labels == (("zone", "a"),)
    assert config.preset == "wan"


@pytest.mark.parametrize(
    ("toml", "flags", "needle"),
    [
        ("colour = 1\n", {}, "not a populi-node setting"),
        ("port = 'x'\n", {}, "port"),
        ("", {"port": 70000}, "port"),
        ("", {"overlay": "zerotier"}, "overlay"),
        ("", {"bootstrap": ["host:notaport"]}, "port must be a number"),
        ("", {"allow_cidr": ["10.0.0.0/33"]}, "allow-cidr"),
        ("", {"labels": ["bad label=1"]}, "label"),
        ("", {"bind": "not-an-ip"}, "bind"),
        ("", {"reserve_vram": "lots"}, "reserve-vram"),
        ("mdns = 'yes'\n", {}, "mdns"),
        ("gpu_probe_interval = 0\n", {}, "gpu-probe-interval"),
        ("", {"gpu_probe_interval": -5.0}, "gpu-probe-interval"),
        ("", {"gpu_probe_interval": "soon"}, "gpu-probe-interval"),
        ("", {"gpu_probe_interval": "inf"}, "gpu-probe-interval"),
        ("gpu_probe_interval = true\n", {}, "gpu-probe-interval"),
        ("this is not toml", {}, "not valid TOML"),
    ],
)
def test_errors_are_one_line(
    tmp_path: Path, toml: str, flags: dict[str, object], needle: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        NodeConfig.load(path, {"state_dir": tmp_path, **flags})
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_gpu_probe_interval_from_file_and_flag(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text("gpu_probe_interval = 5\n")
    assert NodeConfig.load(toml, {"state_dir": tmp_path}).gpu_probe_interval == 5.0
    flagged = NodeConfig.load(toml, {"state_dir": tmp_path, "gpu_probe_interval": 2.5})
    assert flagged.gpu_probe_interval == 2.5  # the flag wins


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        NodeConfig.load(tmp_path / "nope.toml", {})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:80", ("127.0.0.1", 80)),
        ("example.org", ("example.org", DEFAULT_PORT)),
        ("[::1]:9", ("::1", 9)),
        ("[fd00::1]", ("fd00::1", DEFAULT_PORT)),
    ],
)
def test_parse_host_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(text) == expected


def test_parse_host_port_wants_brackets_around_ipv6() -> None:
    with pytest.raises(ConfigError, match="brackets"):
        parse_host_port("fd00::1")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_parse_host_port_never_crashes(text: str) -> None:
    try:
        host, port = parse_host_port(text)
    except ConfigError as exc:
        assert "\n" not in str(exc)
    else:
        assert host and 0 < port < 65536
