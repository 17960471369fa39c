"""`LeaseConfig`: presets are valid and ordered sensibly; bad values are one-line errors."""

from __future__ import annotations

import attrs
import pytest

from populi_p2p.leases import LeaseConfig


def test_presets() -> None:
    lan, wan, local = LeaseConfig.lan(), LeaseConfig.wan(), LeaseConfig.local()
    assert lan == LeaseConfig()
    assert local.lease_ttl < lan.lease_ttl < wan.lease_ttl
    for c in (lan, wan, local):
        assert c.lease_ttl >= 2 * c.lease_renew_interval
        # A missed steady round is tried again before the owner's fence.
        steady, retry = c.lease_renew_steady, c.lease_renew_interval
        assert retry <= steady and steady + retry + c.fence_grace <= c.lease_ttl
        assert c.tombstone_retention >= c.finished_retention


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"lease_ttl": 0}, "lease_ttl must be > 0"),
        ({"lease_ttl": 3.0}, "lease_ttl must be >= 2"),
        ({"settle_time": -1}, "settle_time"),
        ({"lease_renew_steady": 1.0}, "lease_renew_steady must be in"),
        ({"lease_renew_steady": 6.5}, "lease_renew_steady must be in"),
        ({"tombstone_retention": 1.0}, "tombstone_retention"),
    ],
)
def test_validation(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        attrs.evolve(LeaseConfig(), **changes)
    assert "\n" not in str(info.value)
