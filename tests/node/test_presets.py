"""`populi_p2p.presets`: a ``--preset`` name picks the membership and lease timing
that go together, resolved in one place."""

from __future__ import annotations

import pytest

from populi_p2p.leases.config import LeaseConfig
from populi_p2p.presets import PRESET_NAMES, resolve_preset
from swim import SwimConfig


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_each_name_picks_its_constructors(name: str) -> None:
    preset = resolve_preset(name)
    assert preset.name == name
    assert preset.swim == getattr(SwimConfig, name)()
    assert preset.lease == getattr(LeaseConfig, name)()


def test_the_presets_differ() -> None:
    swims = {resolve_preset(n).swim for n in PRESET_NAMES}
    leases = {resolve_preset(n).lease for n in PRESET_NAMES}
    assert len(swims) == len(leases) == len(PRESET_NAMES)


def test_an_unknown_name_says_which_ones_exist() -> None:
    with pytest.raises(ValueError, match="unknown preset 'fast': use one of lan, wan, local"):
        resolve_preset("fast")
