"""The simulator's driver runs the daemon's join and reconnect policy (`swim.RejoinPolicy`)."""

from __future__ import annotations

from typing import Any

from simulations import parse_scenario, run_once
from swim import RejoinConfig, SwimConfig


def scenario(**fields: Any) -> Any:
    data: dict[str, Any] = {"name": "t", "members": 16, "duration": 120.0, "seed": 3}
    data.update(fields)
    return parse_scenario(data)


def healed_after(result: Any) -> float | None:
    healed = [c for c in result.measures["convergence"] if c["label"].startswith("partition")]
    return healed[0]["converged_after"] if healed else None


def test_a_long_partition_heals_within_one_check_of_the_daemons_policy() -> None:
    """Members seen failing are retried every check_interval (5 s on a LAN) plus the
    join wait, as the daemon's Bootstrapper does; the old simulator-only loop (every
    30 s, one member with probability failed/alive) took 16 to 31 s at 64 members."""
    for seed in (1, 2, 3):
        result = run_once(scenario(seed=seed, partition=[{"at": 5.0, "heal": 65.0}]))
        assert result.ok, result.failure
        after = healed_after(result)
        check = RejoinConfig.for_probe_interval(SwimConfig.lan().probe_interval).check_interval
        assert after is not None and after <= check + 2.0 + 5.0, (seed, after)


def test_without_reconnects_a_partition_longer_than_retention_never_heals() -> None:
    result = run_once(
        scenario(partition=[{"at": 5.0, "heal": 65.0}], driver={"reconnect_interval": 0})
    )
    assert healed_after(result) is None
