"""SwimConfig: the presets are memberlist's numbers, the Lifeguard switch, one-line validation."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from swim import SwimConfig

####################################################################################
# SwimConfig
####################################################################################


def test_lan_preset_is_memberlists_lan_defaults() -> None:
    lan = SwimConfig.lan()
    assert (lan.probe_interval, lan.probe_timeout, lan.indirect_checks) == (1.0, 0.5, 3)
    assert (lan.suspicion_mult, lan.suspicion_max_mult, lan.retransmit_mult) == (4, 6, 4)
    assert (lan.gossip_interval, lan.gossip_nodes) == (0.2, 3)
    assert (lan.awareness_max_multiplier, lan.push_pull_interval) == (8, 30.0)
    assert lan == SwimConfig()  # the defaults are the LAN preset


def test_wan_and_local_presets() -> None:
    wan, local = SwimConfig.wan(), SwimConfig.local()
    assert (wan.probe_interval, wan.probe_timeout, wan.suspicion_mult) == (5.0, 3.0, 6)
    assert (wan.gossip_nodes, wan.gossip_interval, wan.push_pull_interval) == (4, 0.5, 60.0)
    assert (local.indirect_checks, local.retransmit_mult, local.suspicion_mult) == (1, 2, 3)
    assert (local.probe_timeout, local.gossip_interval, local.push_pull_interval) == (
        0.2,
        0.1,
        15.0,
    )


def test_lifeguard_switch() -> None:
    off = SwimConfig.lan().with_lifeguard(False)
    assert not off.lifeguard
    assert not (
        off.awareness_enabled
        or off.dynamic_suspicion_enabled
        or off.buddy_enabled
        or off.nack_enabled
    )
    assert off.with_lifeguard(True).lifeguard
    assert SwimConfig.lan().lifeguard


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"probe_interval": 0.0}, "probe_interval must be > 0"),
        ({"probe_timeout": 1.0}, "probe_timeout must be shorter"),
        ({"suspicion_mult": 0}, "suspicion_mult must be >= 1"),
        ({"push_pull_interval": -1.0}, "push_pull_interval must be >= 0"),
        ({"packet_budget": 64}, "packet_budget must be >= 128"),
        ({"indirect_checks": -1}, "indirect_checks must be >= 0"),
    ],
)
def test_config_validation(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        attrs.evolve(SwimConfig.lan(), **changes)
