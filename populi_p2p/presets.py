"""What a ``--preset`` name picks, resolved once: the membership and the lease timing.

Why one place: the name picks a `swim.SwimConfig` and a `LeaseConfig` that must agree
(the lease ttl is sized for the membership's detection time). `Node` resolves it once
and hands each service its part; the simulator resolves a scenario's names here too, so
a simulated ``local`` node runs the daemon's ``local`` numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

import attrs

if TYPE_CHECKING:
    from swim import SwimConfig

    from .leases.config import LeaseConfig

__all__ = ["PRESET_NAMES", "Preset", "Presets", "resolve_preset"]

#: ``--preset`` choices: the names of the `SwimConfig` and `LeaseConfig` constructors.
PRESET_NAMES: Final = ("lan", "wan", "local")
Preset = Literal["lan", "wan", "local"]


@attrs.frozen
class Presets:
    """One preset: its name, the membership timing and the lease timing."""

    name: str
    swim: SwimConfig
    lease: LeaseConfig


def resolve_preset(name: str) -> Presets:
    """The configs `name` picks (``lan``, ``wan`` or ``local``).

    Raises:
        ValueError: not a preset name.
    """
    # Imported here: the config module names the presets without loading the lease code.
    from swim import SwimConfig

    from .leases.config import LeaseConfig

    constructors = {
        "lan": (SwimConfig.lan, LeaseConfig.lan),
        "wan": (SwimConfig.wan, LeaseConfig.wan),
        "local": (SwimConfig.local, LeaseConfig.local),
    }
    if name not in constructors:
        raise ValueError(f"unknown preset {name!r}: use one of {', '.join(PRESET_NAMES)}")
    swim, lease = constructors[name]
    return Presets(name, swim(), lease())
