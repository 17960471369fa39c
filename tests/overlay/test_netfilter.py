"""AcceptPolicy: only its ranges, both families, a bounded cache; CIDRs parsed with
one-line errors."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.netfilter import LAN_CIDRS, AcceptPolicy, parse_cidr

################################################################################
# AcceptPolicy
################################################################################


def test_policy_accepts_only_its_ranges_both_families() -> None:
    p = AcceptPolicy.from_cidrs(["10.77.0.0/24", "fd77::/64"])
    assert p.allows("10.77.0.200") and p.allows("fd77::abcd")
    assert not p.allows("10.77.1.1") and not p.allows("fd78::1")
    assert not p.allows("127.0.0.1") and not p.allows("::1")
    assert p.allows("::ffff:10.77.0.5")  # IPv4-mapped is judged as IPv4
    assert not p.allows("not-an-address") and not p.allows("")
    assert p.describe() == "accepting 10.77.0.0/24, fd77::/64"


def test_policy_link_local_scope_and_lan_defaults() -> None:
    lan = AcceptPolicy.from_cidrs(LAN_CIDRS)
    assert lan.allows("fe80::1%eth0") and lan.allows("192.168.1.9") and lan.allows("::1")
    assert not lan.allows("8.8.8.8") and not lan.allows("2001:db8::1")
    assert not lan.allows("100.64.0.1")  # Tailscale's range is not "the LAN"


def test_policy_building() -> None:
    assert AcceptPolicy.from_cidrs(["10.77.0.3/24"]).cidrs == ("10.77.0.0/24",)
    assert AcceptPolicy.from_cidrs(["10.0.0.1"]).cidrs == ("10.0.0.1/32",)
    assert AcceptPolicy.from_cidrs(["fd77::/64", "10.0.0.0/8", "10.0.0.0/8"]).cidrs == (
        "10.0.0.0/8",
        "fd77::/64",
    )
    assert AcceptPolicy.from_cidrs([]).describe() == "accepting nothing"
    assert AcceptPolicy.allow_all().allows("203.0.113.7")
    grown = AcceptPolicy.from_cidrs(["10.0.0.0/8"]).with_cidrs(["192.168.0.0/16"])
    assert grown.allows("192.168.3.3") and grown.allows("10.1.1.1")
    assert AcceptPolicy.from_cidrs(["10.0.0.0/8"]) == AcceptPolicy.from_cidrs(["10.0.0.0/8"])


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "fd77::/129", "ten.zero", "10.0.0.0/8/8", ""])
def test_parse_cidr_rejects_with_one_line(bad) -> None:
    with pytest.raises(ValueError, match="not a CIDR range") as info:
        parse_cidr(bad)
    assert "\n" not in str(info.value)


@settings(max_examples=200, deadline=None)
@given(
    net=st.one_of(
        st.builds(
            lambda a, n: ipaddress.ip_network(f"{a}/{n}", strict=False),
            st.ip_addresses(v=4),
            st.integers(0, 32),
        ),
        st.builds(
            lambda a, n: ipaddress.ip_network(f"{a}/{n}", strict=False),
            st.ip_addresses(v=6),
            st.integers(0, 128),
        ),
    ),
    addr=st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)),
)
def test_policy_agrees_with_ipaddress(net, addr) -> None:
    policy = AcceptPolicy.from_cidrs([str(net)])
    mapped = addr.ipv4_mapped if addr.version == 6 else None
    addr_judged = mapped or addr  # ::ffff:a.b.c.d is judged as a.b.c.d, by design
    expected = addr_judged.version == net.version and addr_judged in net
    assert policy.allows(str(addr)) == expected
    assert policy.allows(str(addr)) == expected  # cached answer is the same


def test_policy_cache_is_bounded() -> None:
    p = AcceptPolicy.from_cidrs(["10.0.0.0/8"])
    for i in range(10_000):
        p.allows(f"192.0.{i // 256 % 256}.{i % 256}")
    assert len(p._cache) <= 4096
