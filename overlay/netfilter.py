"""Which source addresses a node listens to at all: the `AcceptPolicy`.

This is the cheapest gate and so it runs first, before a byte of the packet is decoded
or a signature checked: a datagram or connection from outside the accepted ranges costs
one dict lookup and a counter increment. It is not authentication (source addresses are
forgeable on a LAN); it keeps the internet and the underlay out when the mesh runs over
an overlay, so that only packets that came through the overlay's own crypto get as far
as populi's.

The ranges come from overlay detection (`OverlayInfo.accept_cidrs`) plus whatever the
operator adds with `--allow-cidr`. IPv4 and IPv6 are handled alike; an IPv4 peer seen on
a dual-stack socket arrives already unmapped (see `overlay.base.normalize_source`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

import attrs

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Tailscale's CGNAT range for IPv4 node addresses.
TAILSCALE_V4 = "100.64.0.0/10"
#: Tailscale's ULA prefix for IPv6 node addresses.
TAILSCALE_V6 = "fd7a:115c:a1e0::/48"

#: What a node without an overlay accepts by default: loopback, private and link-local
#: ranges of both families, that is "this machine and its LAN". Reaching peers across the
#: internet without an overlay needs an explicit `--allow-cidr` (and packet encryption).
LAN_CIDRS: tuple[str, ...] = (
    "127.0.0.0/8",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
    "::1/128",
    "fc00::/7",
    "fe80::/10",
)

#: How many distinct source hosts `allows` remembers; cleared when full so a storm of
#: spoofed sources costs bounded memory.
_CACHE_MAX = 4096


def parse_cidr(text: str) -> IPNetwork:
    """Parse one CIDR (`10.77.0.0/24`, `fd77::/64`, or a bare address as a /32 or /128).

    Host bits are tolerated and cleared (`10.77.0.3/24` means `10.77.0.0/24`), because an
    interface address with its prefix length is the natural thing to paste.

    Raises:
        ValueError: one line naming the bad text.
    """
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(
            f"not a CIDR range: {text!r} (expected e.g. 10.77.0.0/24 or fd77::/64)"
        ) from None


@attrs.frozen
class AcceptPolicy:
    """A set of CIDR ranges; a source is accepted if it lies in any of them.

    Build with `AcceptPolicy.from_cidrs([...])`. An empty policy refuses everything.
    `allow_all()` accepts everything (for `--allow-cidr 0.0.0.0/0 --allow-cidr ::/0`
    setups and tests).

    Attributes:
        networks: the accepted ranges, deduplicated and sorted for stable logs.
    """

    networks: tuple[IPNetwork, ...]
    _cache: dict[str, bool] = attrs.field(factory=dict, eq=False, repr=False)

    @classmethod
    def from_cidrs(cls, cidrs: Iterable[str]) -> AcceptPolicy:
        """Build a policy from CIDR strings.

        Raises:
            ValueError: one of them is not a CIDR range.
        """
        networks = {parse_cidr(c) for c in cidrs}
        ordered = sorted(networks, key=lambda n: (n.version, n.network_address, n.prefixlen))
        return cls(networks=tuple(ordered))

    @classmethod
    def allow_all(cls) -> AcceptPolicy:
        """Accept every IPv4 and IPv6 source."""
        return cls.from_cidrs(["0.0.0.0/0", "::/0"])

    def with_cidrs(self, cidrs: Iterable[str]) -> AcceptPolicy:
        """A new policy with `cidrs` added (for `--allow-cidr` on top of detection)."""
        return AcceptPolicy.from_cidrs([*map(str, self.networks), *cidrs])

    @property
    def cidrs(self) -> tuple[str, ...]:
        """The ranges as strings, for logs and `status`."""
        return tuple(str(n) for n in self.networks)

    def allows(self, host: str) -> bool:
        """True if the numeric `host` lies in an accepted range.

        Runs once per packet, so results are cached per host string (bounded). A host that
        is not an IP literal is refused, as is an IPv6 link-local host whose scope
        (`%eth0`) is stripped before matching.
        """
        cached = self._cache.get(host)
        if cached is not None:
            return cached
        try:
            addr = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            result = False
        else:
            if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                addr = addr.ipv4_mapped
            result = any(addr in net for net in self.networks if net.version == addr.version)
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[host] = result
        return result

    def describe(self) -> str:
        """One line for logs: `accepting 10.77.0.0/24, fd77::/64`."""
        if not self.networks:
            return "accepting nothing"
        return "accepting " + ", ".join(self.cidrs)
