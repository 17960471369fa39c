"""The table of `up` settings: one declaration per setting makes the flags, the coercion
and the docs table; the preset is resolved once and every service gets its part."""

from __future__ import annotations

import argparse
from pathlib import Path

import attrs
import pytest
import trio

from populi_p2p.cli import _build_parser
from populi_p2p.config import SETTINGS, ConfigError, NodeConfig
from populi_p2p.leases import LeaseConfig
from populi_p2p.presets import PRESET_NAMES, resolve_preset
from populi_p2p.settings import docs_with_table, settings_table, up
from swim import SwimConfig

from .harness import Mesh

REPO = Path(__file__).resolve().parents[2]


def _up_parser() -> argparse.ArgumentParser:
    sub = next(a for a in _build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices["up"]
    return parser


def test_the_docs_table_is_the_declarations() -> None:
    """docs/configuration.md shows what the declarations say (rewrite it with
    ``python scripts/settings_table.py``)."""
    docs = (REPO / "docs" / "configuration.md").read_text()
    assert docs_with_table(docs, settings_table(NodeConfig)) == docs, (
        "docs/configuration.md's settings table is stale: run python scripts/settings_table.py"
    )


def test_every_field_is_a_setting_with_a_flag_and_a_row() -> None:
    fields = [f.name for f in attrs.fields(NodeConfig)]
    assert list(SETTINGS) == fields  # a field without up(...) metadata would be missed
    by_dest = {a.dest: a for a in _up_parser()._actions}
    table = settings_table(NodeConfig)
    for name, setting in SETTINGS.items():
        action = by_dest[name]  # the flag lands in the field's name
        flag = setting.flag or "--" + name.replace("_", "-")
        assert action.option_strings == [flag]
        assert action.default is None  # not given: the file or the default applies
        assert f"| `{flag}" in table


def test_flags_reach_the_config(tmp_path: Path) -> None:
    """Each kind of flag, parsed and loaded as `up` does (`_cmd_up`)."""
    args = _up_parser().parse_args([
        "--state-dir", str(tmp_path), "--port", "0", "--label", "zone=a", "--mdns",
        "--gpu-probe-interval", "2.5", "--preset", "wan", "--reserve-vram", "1GiB",
        "--bootstrap", "10.0.0.1:7950", "--bootstrap", "10.0.0.2", "--cert", "~/n.cert",
    ])  # fmt: skip
    config = NodeConfig.load(None, {name: getattr(args, name) for name in SETTINGS})
    assert config.state_dir == tmp_path and config.port == 0
    assert config.labels == (("zone", "a"),) and config.mdns is True
    assert config.gpu_probe_interval == 2.5 and config.preset == "wan"
    assert config.reserve_vram == 1024**3
    assert config.bootstrap == ("10.0.0.1:7950", "10.0.0.2")
    assert config.cert == Path("~/n.cert").expanduser()


@pytest.mark.parametrize(
    ("values", "line"),
    [
        ({"overlay": "ZeroTier"}, "overlay: 'zerotier' is not one of auto, wireguard,"),
        ({"preset": 3}, "preset: expected a string"),
        ({"log_level": "loud"}, "log-level: 'loud' is not one of debug, info, warning, error"),
        ({"require_api_keys": "yes"}, "require-api-keys: expected true or false"),
        ({"engine": [1]}, "engine: expected a list of strings"),
        ({"advertise_gpu": ["0xA100"]}, "advertise-gpu: "),
        ({"peer_port": "x"}, "peer-port: 'x' is not a number (0 to 65535)"),
        ({"max_clock_skew": "soon"}, "max-clock-skew: 'soon' is not a number of seconds"),
        ({"state_dir": 5}, "state-dir: expected a path"),
    ],
)
def test_each_kind_refuses_in_one_line(values: dict[str, object], line: str) -> None:
    with pytest.raises(ConfigError) as info:
        NodeConfig.load(None, values)
    assert str(info.value).startswith(line) and "\n" not in str(info.value)


def test_a_choice_is_checked_on_the_class_too() -> None:
    with pytest.raises(ConfigError, match="preset: 'moon' is not one of lan, wan, local"):
        NodeConfig(preset="moon")  # type: ignore[arg-type]


def test_a_choice_names_its_choices() -> None:
    with pytest.raises(ValueError, match="names its choices"):
        up("choice", "no choices given")
    with pytest.raises(ValueError, match="names its choices"):
        up("text", "a text with choices", choices=("a",))


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_a_preset_names_both_timings(name: str) -> None:
    presets = resolve_preset(name)
    assert presets.swim == getattr(SwimConfig, name)()
    assert presets.lease == getattr(LeaseConfig, name)()


def test_an_unknown_preset_is_one_line() -> None:
    with pytest.raises(ValueError, match="unknown preset 'moon': use one of lan, wan, local"):
        resolve_preset("moon")


async def test_the_node_hands_its_preset_to_every_service(tmp_path: Path) -> None:
    """A node started with ``--preset local``: the membership, the lease agent and the
    inference service (which used to fall back to the LAN lease config) all run the
    local numbers, resolved once."""
    state = Mesh(tmp_path).prepare("a")
    config = NodeConfig(state_dir=state, bind="127.0.0.1", port=0, overlay="none", preset="local")
    from populi_p2p.node import Node

    node = Node(config)
    local = resolve_preset("local")
    assert node.presets == local
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        parts = node._parts
        assert parts is not None
        assert parts.swim_config.probe_timeout == local.swim.probe_timeout
        assert node.leases.config is node.presets.lease
        assert node.inference is not None
        assert node.inference._lease_config is node.presets.lease
        nursery.cancel_scope.cancel()
