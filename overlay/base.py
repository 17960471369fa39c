"""Shared vocabulary of the transports: addresses, the one error type, socket helpers.

The UDP endpoint, the TCP endpoint and the combined `Transport` all speak in
`Address = (host, port)` tuples with a numeric host, the same shape the `swim/` core uses,
so the daemon can hand the core's `Send.destination` straight to a transport. Sockets
report sources in their own shapes (IPv6 4-tuples, IPv4-mapped `::ffff:a.b.c.d` on a
dual-stack socket); `normalize_source` folds them back into that one shape so that a
peer reached over IPv4 has the same address whichever socket heard it.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from typing import Any

#: Where a peer can be reached: (numeric host, port). Same shape as `swim.Address`.
Address = tuple[str, int]

#: populi's default port, for UDP and TCP alike. Not memberlist's 7946: GPU hosts often
#: already run a memberlist-based agent there (Consul, Nomad, Serf, MetalLB speakers), and
#: two gossip protocols on one port would drop each other's packets as malformed.
DEFAULT_PORT = 7950

_MAPPED_PREFIX = "::ffff:"


class TransportError(Exception):
    """Moving bytes to or from a peer failed for an operating reason (not our bug).

    Raised by `send_datagram` and `send_frame` when a socket call, a connect or a send
    fails or times out. The daemon turns it into the core's `send_failed(destination)`.
    The message is one line naming the peer and the cause.

    Attributes:
        address: the peer the failed operation was for, or None when binding failed.
    """

    def __init__(self, message: str, address: Address | None = None) -> None:
        super().__init__(message)
        self.address = address


def format_address(address: Address) -> str:
    """`1.2.3.4:7950` or `[fd00::1]:7950`, for logs and error messages."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def normalize_source(sockaddr: Any) -> Address:
    """Fold what `recvfrom`/`getpeername` returned into a plain `(host, port)`.

    Drops IPv6 flow info and scope id (a link-local host keeps its `%iface` suffix, which
    Python puts in the host string) and unmaps `::ffff:a.b.c.d` so IPv4 peers look the
    same on a dual-stack socket as on an IPv4 one. Cheap: string checks only, because it
    runs once per packet.
    """
    host = sockaddr[0]
    if host.startswith(_MAPPED_PREFIX) and "." in host:
        host = host[len(_MAPPED_PREFIX) :]
    return (host, int(sockaddr[1]))


def is_ipv6_host(host: str) -> bool:
    """True for an IPv6 literal. Hosts are numeric, so a colon is enough."""
    return ":" in host


def family_for_host(host: str) -> socket.AddressFamily:
    """The address family to bind `host` with (`::` and IPv6 literals are IPv6)."""
    return socket.AF_INET6 if is_ipv6_host(host) else socket.AF_INET


def check_bind_host(host: str) -> None:
    """Refuse a bind host that is not a numeric IPv4 or IPv6 address.

    Binding a name would resolve it once, silently pick one family and hide the choice; the
    caller (detection, the CLI) knows which address it means.

    Raises:
        ValueError: `host` is empty or not an IP literal.
    """
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        raise ValueError(
            f"bind host must be a numeric IPv4 or IPv6 address (e.g. 0.0.0.0 or ::), got {host!r}"
        ) from None


def destination_for(family: socket.AddressFamily, address: Address) -> Address:
    """Adapt a destination to the socket's family.

    An IPv4 destination on an IPv6 (dual-stack) socket becomes `::ffff:a.b.c.d`; an IPv6
    destination on an IPv4 socket cannot be reached and raises.

    Raises:
        TransportError: an IPv6 destination on an IPv4-only socket.
    """
    host, port = address
    if family == socket.AF_INET6:
        if not is_ipv6_host(host):
            return (_MAPPED_PREFIX + host, port)
        return address
    if is_ipv6_host(host):
        raise TransportError(
            f"cannot reach IPv6 peer {format_address(address)} from an IPv4 socket", address
        )
    return address


def make_socket(
    host: str, port: int, kind: socket.SocketKind, *, dual_stack: bool
) -> socket.socket:
    """Create and bind a non-blocking socket for `host:port`.

    Returns a stdlib socket: the UDP reader drives it directly with
    `trio.lowlevel.wait_readable` so it can drain a burst without a checkpoint per
    datagram; TCP wraps it with `trio.socket.from_stdlib_socket`.

    `dual_stack` only matters for an IPv6 host: it clears IPV6_V6ONLY so `::` also takes
    IPv4 traffic (sources arrive IPv4-mapped and `normalize_source` unmaps them). TCP gets
    SO_REUSEADDR so a restarted daemon can rebind while old connections sit in TIME_WAIT;
    UDP does not, so two daemons cannot silently share one port.

    Raises:
        ValueError: `host` is not a numeric address.
        TransportError: the bind failed (address in use, not an address of this machine).
    """
    check_bind_host(host)
    family = family_for_host(host)
    raw = socket.socket(family, kind)
    try:
        if family == socket.AF_INET6:
            raw.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
        if kind == socket.SOCK_STREAM:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # A literal needs no resolution, so a plain synchronous bind is enough; it lets the
        # UDP and TCP halves be bound back to back on one port with no await between.
        raw.bind((host, port))
        raw.setblocking(False)
    except OSError as exc:
        raw.close()
        proto = "tcp" if kind == socket.SOCK_STREAM else "udp"
        raise TransportError(
            f"cannot bind {proto} {format_address((host, port))}: {exc.strerror or exc}"
        ) from exc
    except BaseException:
        raw.close()
        raise
    return raw


def check_destination(host: str) -> None:
    """Refuse a destination that is not an IP literal, cheaply (runs per packet).

    A name here would make the socket call resolve it, blocking the Trio thread on DNS.
    Destinations come from peers' records, so this is an operating error, not a bug.

    Raises:
        TransportError: `host` is not a numeric IPv4 or IPv6 address.
    """
    bare = host.split("%", 1)[0]
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in bare else socket.AF_INET, bare)
    except OSError:
        raise TransportError(f"destination must be a numeric IP address, got {host!r}") from None


def is_address_in_use(exc: BaseException) -> bool:
    """True when `exc` (a TransportError from `make_socket`) means EADDRINUSE."""
    cause = exc.__cause__
    return isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE
