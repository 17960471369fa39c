"""Finding peers on a trusted LAN with mDNS/DNS-SD (`--mdns`), through zeroconf.

Off by default. On a LAN without an overlay, nodes advertise a `_populi._udp.local.`
service and browse for others, so a new machine finds the mesh without `--bootstrap`.
The TXT record carries the node id, the populi port, the protocol version and a
*cluster fingerprint*: an opaque string the caller passes in (populi passes
`populi_p2p.trust.authority.cluster_fingerprint`, the one `status` shows; this package
computes none of its own). Only peers whose fingerprint matches are reported; the rest
are counted and ignored. mDNS is unauthenticated, so a discovery is
only an address to try: admission still needs a valid certificate.

Where it speaks: mDNS is link-local multicast, so it runs on the interfaces whose
addresses the caller passes (never "all interfaces"). `lan_addresses()` picks the
sensible default: up, non-loopback interfaces that are not the overlay (WireGuard,
Tailscale, other tun devices). Advertising on an overlay happens only if the caller
passes an overlay address explicitly.

Threads, honestly: zeroconf is thread based. `Zeroconf()` starts one thread running its
own asyncio loop (sockets, probing, caches); `ServiceBrowser` starts one more thread that
calls our handler. That handler does nothing but hand the service name to the Trio loop
with `TrioToken.run_sync_soon` (never blocking the zeroconf thread). The blocking calls
(start, register, resolve, unregister, close) run in Trio worker threads, at most two
at a time. On cancellation the service is unregistered (a goodbye packet) and both
zeroconf threads are stopped before `run()` returns, within a bounded time.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import trio
from zeroconf import Error as ZeroconfError
from zeroconf import (
    IPVersion,
    ServiceBrowser,
    ServiceInfo,
    ServiceStateChange,
    Zeroconf,
)

from overlay.base import Address
from overlay.detect import Interface

#: The DNS-SD service type populi advertises and browses.
MDNS_SERVICE_TYPE = "_populi._udp.local."
#: Version of the TXT layout and of the populi protocol a peer speaks; bumped together
#: with the wire format so old and new nodes do not try each other.
MDNS_PROTOCOL_VERSION = 1
#: Bound on resolving one discovered service, seconds.
DEFAULT_RESOLVE_TIMEOUT = 3.0
#: Bound on stopping zeroconf (goodbye packets, thread joins), seconds.
DEFAULT_SHUTDOWN_TIMEOUT = 5.0
#: Service names waiting to be resolved; more are dropped and counted (a noisy LAN).
DEFAULT_MAX_PENDING = 64
#: Kinds of interfaces that are overlays (or tunnels) and so never get mDNS by default.
OVERLAY_KINDS = frozenset({"wireguard", "tun", "tap", "ipip", "gre", "sit", "vxlan"})

_HOST_SAFE = re.compile(r"[^a-z0-9-]")


class MdnsError(OSError):
    """zeroconf could not start, register or browse (one line, the cause inside).

    An `OSError` so a caller that already treats "cannot open sockets" as "mDNS off"
    handles every start-up failure the same way.
    """


def lan_addresses(interfaces: Iterable[Interface], *, exclude: Iterable[str] = ()) -> list[str]:
    """Addresses to run mDNS on by default: up, not loopback, not an overlay or tunnel,
    not named in `exclude` (pass the detected overlay interface). IPv4 only: IPv6 mDNS
    needs link-local addresses with scopes, which zeroconf handles by interface index;
    pass those explicitly if wanted."""
    skip = set(exclude)
    out: list[str] = []
    for iface in interfaces:
        if (
            not iface.up
            or iface.is_loopback
            or iface.name in skip
            or iface.kind in OVERLAY_KINDS
            or iface.name.startswith(("tailscale", "wg", "zt"))
        ):
            continue
        for addr in iface.addresses:
            ip = ipaddress.ip_interface(addr).ip
            if ip.version == 4:
                out.append(str(ip))
    return out


@attrs.frozen
class MdnsPeer:
    """A peer found on the LAN with a matching cluster fingerprint.

    Attributes:
        node_id: the peer's node id (from TXT; unauthenticated until it joins).
        addresses: where to reach its populi port, IPv4 first.
        fingerprint: its cluster fingerprint (equal to ours, or it is not reported).
        version: the protocol version it advertises.
        instance: the DNS-SD instance name.
    """

    node_id: str
    addresses: tuple[Address, ...]
    fingerprint: str
    version: int
    instance: str


@attrs.frozen
class MdnsStatistics:
    """Counters of an `MdnsAnnouncer`.

    Attributes:
        peers_found: matching peers reported (an update of a known one counts again).
        mismatched_fingerprint: services of another cluster, ignored.
        version_mismatch: services of our cluster speaking another protocol version.
        malformed: services with a missing or unreadable TXT field.
        resolve_failures: services that did not resolve in time.
        removed: goodbyes seen.
        dropped_events: service names dropped because too many were pending.
    """

    peers_found: int
    mismatched_fingerprint: int
    version_mismatch: int
    malformed: int
    resolve_failures: int
    removed: int
    dropped_events: int


@attrs.define
class _Counters:
    peers_found: int = 0
    mismatched_fingerprint: int = 0
    version_mismatch: int = 0
    malformed: int = 0
    resolve_failures: int = 0
    removed: int = 0
    dropped_events: int = 0


def build_service_info(
    *,
    node_id: str,
    port: int,
    fingerprint: str,
    addresses: Sequence[str],
    version: int = MDNS_PROTOCOL_VERSION,
    service_type: str = MDNS_SERVICE_TYPE,
) -> ServiceInfo:
    """The `ServiceInfo` a node registers.

    Raises:
        ValueError: empty or oversized fields, a bad port or address.
    """
    if not node_id or len(node_id.encode()) > 200:
        raise ValueError("node_id must be 1..200 bytes")
    if not fingerprint or len(fingerprint.encode()) > 200:
        raise ValueError("fingerprint must be 1..200 bytes")
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be in 1..65535, got {port}")
    if not addresses:
        raise ValueError("advertise at least one address")
    for a in addresses:
        ipaddress.ip_address(a)
    label = node_id[:63]
    host = _HOST_SAFE.sub("-", node_id.lower())[:40].strip("-") or "node"
    return ServiceInfo(
        service_type,
        f"{label}.{service_type}",
        port=port,
        properties={"id": node_id, "port": str(port), "fp": fingerprint, "v": str(version)},
        server=f"populi-{host}.local.",
        parsed_addresses=list(addresses),
    )


def peer_from_info(info: Any, *, fingerprint: str, version: int) -> tuple[MdnsPeer | None, str]:
    """Check a resolved service against our cluster.

    Returns:
        (peer, "") when it matches; otherwise (None, reason) with reason one of
        "malformed", "fingerprint", "version".
    """
    try:
        props = {k.decode(): v.decode() for k, v in info.properties.items() if v is not None}
        node_id = props["id"]
        fp = props["fp"]
        peer_version = int(props["v"])
        port = int(props.get("port", info.port))
        raw_addresses = info.parsed_addresses()
    except (KeyError, ValueError, AttributeError, UnicodeDecodeError):
        return None, "malformed"
    if fp != fingerprint:
        return None, "fingerprint"
    if peer_version != version:
        return None, "version"
    if not node_id or not 1 <= port <= 65535 or not raw_addresses:
        return None, "malformed"
    ips = []
    for a in raw_addresses:
        try:
            ips.append(ipaddress.ip_address(a))
        except ValueError:
            continue
    if not ips:
        return None, "malformed"
    ordered = sorted(set(ips), key=lambda ip: (ip.version, ip))
    return (
        MdnsPeer(
            node_id=node_id,
            addresses=tuple((str(ip), port) for ip in ordered),
            fingerprint=fp,
            version=peer_version,
            instance=str(info.name),
        ),
        "",
    )


class MdnsAnnouncer:
    """Advertise this node and report matching peers, as a Trio component.

    Run `await nursery.start(announcer.run)`; read `announcer.discoveries` (a memory
    channel of `MdnsPeer`). Cancel to stop: it unregisters and shuts zeroconf down.

    Args:
        node_id: this node's id (TXT `id`); services with it are ourselves, not peers.
        port: the populi port peers should use (TXT `port` and SRV port).
        fingerprint: the cluster fingerprint (TXT `fp`), an opaque string the caller
            computes (populi: `populi_p2p.trust.authority.cluster_fingerprint`); only peers
            showing the same string are reported.
        addresses: the interface addresses mDNS runs on (multicast is sent and joined
            only there). Use `lan_addresses()`; never includes overlays unless you do.
        advertise_addresses: the addresses put in the A/AAAA records; default
            `addresses`.
        version: protocol version (TXT `v`); other versions are ignored and counted.
        service_type: the DNS-SD type (tests may isolate themselves with another one).
        max_pending: bound on service names waiting for resolution.
        resolve_timeout: bound on resolving one service, seconds.
    """

    def __init__(
        self,
        *,
        node_id: str,
        port: int,
        fingerprint: str,
        addresses: Sequence[str],
        advertise_addresses: Sequence[str] | None = None,
        version: int = MDNS_PROTOCOL_VERSION,
        service_type: str = MDNS_SERVICE_TYPE,
        max_pending: int = DEFAULT_MAX_PENDING,
        resolve_timeout: float = DEFAULT_RESOLVE_TIMEOUT,
    ) -> None:
        if not addresses:
            raise ValueError("mDNS needs at least one interface address to run on")
        self._addresses = [str(ipaddress.ip_address(a)) for a in addresses]
        self._info = build_service_info(
            node_id=node_id,
            port=port,
            fingerprint=fingerprint,
            addresses=list(advertise_addresses or addresses),
            version=version,
            service_type=service_type,
        )
        self._node_id = node_id
        self._fingerprint = fingerprint
        self._version = version
        self._type = service_type
        self._resolve_timeout = resolve_timeout
        self._c = _Counters()
        self._names_send, self._names_recv = trio.open_memory_channel[str](max_pending)
        self._peers_send, self.discoveries = trio.open_memory_channel[MdnsPeer](max_pending)
        self._last: dict[str, MdnsPeer] = {}
        self._limiter = trio.CapacityLimiter(2)

    def _ip_version(self) -> IPVersion:
        versions = {ipaddress.ip_address(a).version for a in self._addresses}
        if versions == {4}:
            return IPVersion.V4Only
        if versions == {6}:
            return IPVersion.V6Only
        return IPVersion.All

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start zeroconf, register, browse; report started once registered.

        Raises:
            MdnsError: zeroconf could not open its sockets on the given addresses or could
                not register (an `OSError`).
        """
        token = trio.lowlevel.current_trio_token()
        try:
            zc: Zeroconf = await trio.to_thread.run_sync(
                lambda: Zeroconf(interfaces=list(self._addresses), ip_version=self._ip_version()),
                limiter=self._limiter,
            )
        except (OSError, ZeroconfError) as exc:
            raise MdnsError(f"mDNS cannot start on {', '.join(self._addresses)}: {exc}") from exc
        browser: ServiceBrowser | None = None
        registered = False
        try:
            try:
                # allow_name_change: a clash (another live node with our id, e.g. a cloned
                # state directory) renames the instance instead of failing; the TXT id,
                # which is what peers use, stays.
                await trio.to_thread.run_sync(
                    lambda: zc.register_service(self._info, allow_name_change=True),
                    limiter=self._limiter,
                    abandon_on_cancel=True,
                )
            except ZeroconfError as exc:
                raise MdnsError(f"mDNS cannot register {self._info.name}: {exc}") from exc
            registered = True

            def on_change(
                zeroconf: Zeroconf,
                service_type: str,
                name: str,
                state_change: ServiceStateChange,
            ) -> None:
                # Runs in zeroconf's browser thread: only hand over, never block.
                try:
                    token.run_sync_soon(self._on_change, name, state_change)
                except trio.RunFinishedError:
                    pass

            browser = ServiceBrowser(zc, self._type, handlers=[on_change])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._resolve_loop, zc)
                task_status.started()
                await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(DEFAULT_SHUTDOWN_TIMEOUT):
                await trio.to_thread.run_sync(
                    _shutdown,
                    zc,
                    browser,
                    self._info if registered else None,
                    abandon_on_cancel=True,
                )
            self._peers_send.close()

    def _on_change(self, name: str, state_change: ServiceStateChange) -> None:
        if state_change is ServiceStateChange.Removed:
            self._c.removed += 1
            self._last.pop(name, None)
            return
        try:
            self._names_send.send_nowait(name)
        except trio.WouldBlock:
            self._c.dropped_events += 1
        except trio.ClosedResourceError:
            pass

    async def _resolve_loop(self, zc: Zeroconf) -> None:
        timeout_ms = int(self._resolve_timeout * 1000)
        async for name in self._names_recv:
            try:
                info = await trio.to_thread.run_sync(
                    zc.get_service_info,
                    self._type,
                    name,
                    timeout_ms,
                    limiter=self._limiter,
                    abandon_on_cancel=True,
                )
            except (ZeroconfError, ValueError, UnicodeError):
                # A LAN host can announce any name; a weird one must not stop discovery.
                self._c.malformed += 1
                continue
            if info is None:
                self._c.resolve_failures += 1
                continue
            peer, why = peer_from_info(info, fingerprint=self._fingerprint, version=self._version)
            if peer is None:
                if why == "fingerprint":
                    self._c.mismatched_fingerprint += 1
                elif why == "version":
                    self._c.version_mismatch += 1
                else:
                    self._c.malformed += 1
                continue
            if peer.node_id == self._node_id or self._last.get(name) == peer:
                continue
            self._last[name] = peer
            self._c.peers_found += 1
            try:
                self._peers_send.send_nowait(peer)
            except trio.WouldBlock:
                self._c.dropped_events += 1

    def statistics(self) -> MdnsStatistics:
        """A snapshot of the counters."""
        return MdnsStatistics(**attrs.asdict(self._c))


def _shutdown(zc: Zeroconf, browser: ServiceBrowser | None, info: ServiceInfo | None) -> None:
    """Blocking teardown, in a worker thread: stop browsing, say goodbye, stop zeroconf."""
    try:
        if browser is not None:
            browser.cancel()
        if info is not None:
            zc.unregister_service(info)
    finally:
        zc.close()
