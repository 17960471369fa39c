"""Which overlay network this machine is on: `--overlay auto|wireguard|tailscale|none`.

populi prefers to run over an overlay the operator already trusts (WireGuard or
Tailscale): the overlay encrypts and authenticates the links, and the node then binds to,
advertises and accepts only overlay addresses. This module finds out what is there and
returns a frozen `OverlayInfo` saying what was found and what will be accepted, in words
fit for the log and for `populi-node status`.

How each overlay is found:

- WireGuard: `ip -d -j addr show` lists this network namespace's interfaces with their
  kind and addresses. Kernel WireGuard shows `kind wireguard`; userspace `wireguard-go`
  shows a plain tun device, so `wg show interfaces` (which lists UAPI sockets) names those.
  The UAPI socket directory is not per namespace, so only names that `ip` also shows
  here count. Accepted ranges: the networks of the interface's addresses plus the routes
  through it (`ip -j route show dev IF`, which is where wg-quick puts the peers'
  allowed-ips when addresses are /32), never a default route.
- Tailscale: its LocalAPI over the unix socket (`GET /localapi/v0/status` with httpx),
  falling back to `tailscale status --json`. Own addresses: `Self.TailscaleIPs`; peers to
  try: online peers' `TailscaleIPs`. Accepted ranges: Tailscale's own (100.64.0.0/10,
  fd7a:115c:a1e0::/48). If no local interface holds the Tailscale address (userspace
  networking mode) populi cannot bind it, and says so.
- `auto`: Tailscale if running and bindable, else WireGuard, else none.
- `none`: no overlay; accept loopback, private and link-local ranges (the LAN).

Every subprocess and socket call goes through an injectable runner/fetcher with a
timeout, so tests feed recorded outputs and a stuck tool cannot hang the daemon's start.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import trio

from overlay.netfilter import LAN_CIDRS, TAILSCALE_V4, TAILSCALE_V6, AcceptPolicy, parse_cidr

#: Where tailscaled listens for its LocalAPI on Linux.
TAILSCALE_SOCKET = "/var/run/tailscale/tailscaled.sock"
#: The LocalAPI status URL; the host part is a placeholder the daemon ignores.
TAILSCALE_STATUS_URL = "http://local-tailscaled.sock/localapi/v0/status"
#: Bound on each external command or LocalAPI call during detection, seconds.
DEFAULT_DETECT_TIMEOUT = 3.0


class OverlayKind(enum.StrEnum):
    """The `--overlay` choices."""

    AUTO = "auto"
    WIREGUARD = "wireguard"
    TAILSCALE = "tailscale"
    NONE = "none"


class OverlayNotFoundError(Exception):
    """An explicitly requested overlay (`--overlay wireguard|tailscale`) is not usable.

    The message is one line saying what was looked for and what was found instead.
    """


################################################################################
# Injected I/O
################################################################################


@attrs.frozen
class CommandResult:
    """What an external command printed and returned."""

    returncode: int
    stdout: str
    stderr: str = ""


#: Runs argv with a timeout. Raises FileNotFoundError if the program is missing and
#: TimeoutError if it overran; a non-zero exit is a normal result.
Runner = Callable[[Sequence[str], float], Awaitable[CommandResult]]

#: Fetches the Tailscale LocalAPI status JSON from a unix socket path with a timeout.
#: Raises OSError or httpx.HTTPError (or TimeoutError) when tailscaled is not there.
StatusFetcher = Callable[[str, float], Awaitable[dict[str, Any]]]


async def run_command(argv: Sequence[str], timeout: float) -> CommandResult:
    """The real `Runner`: `trio.run_process` with captured output and a deadline.

    Output is decoded leniently (a tool printing odd bytes must not break detection) and
    the C locale keeps messages stable.
    """
    env = {**os.environ, "LC_ALL": "C"}
    try:
        with trio.fail_after(timeout):
            proc = await trio.run_process(
                list(argv), capture_stdout=True, capture_stderr=True, check=False, env=env
            )
    except trio.TooSlowError:
        raise TimeoutError(f"{argv[0]} did not finish within {timeout:g} s") from None
    return CommandResult(
        returncode=proc.returncode,
        stdout=proc.stdout.decode("utf-8", "replace"),
        stderr=proc.stderr.decode("utf-8", "replace"),
    )


async def fetch_tailscale_status(socket_path: str, timeout: float) -> dict[str, Any]:
    """The real `StatusFetcher`: httpx over tailscaled's unix socket (imported here: a
    daemon with no Tailscale never loads the HTTP client)."""
    import httpx

    transport = httpx.AsyncHTTPTransport(uds=socket_path)
    async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
        response = await client.get(TAILSCALE_STATUS_URL, headers={"Sec-Tailscale": "localapi"})
        response.raise_for_status()
        data = response.json()
    if not isinstance(data, dict):
        raise ValueError("tailscale status is not a JSON object")
    return data


################################################################################
# Interfaces (`ip -d -j addr`)
################################################################################


@attrs.frozen
class Interface:
    """One network interface as `ip -d -j addr` describes it.

    Attributes:
        name: interface name.
        index: ifindex.
        kind: the driver kind (`wireguard`, `tun`, `veth`, `bridge`...) or "".
        up: administratively up.
        addresses: global-scope addresses with prefix, e.g. `10.77.0.1/24`, `fd77::1/64`.
        link_local: link-local addresses (for mDNS on IPv6, never for the overlay).
    """

    name: str
    index: int
    kind: str
    up: bool
    addresses: tuple[str, ...]
    link_local: tuple[str, ...] = ()

    @property
    def is_loopback(self) -> bool:
        """The loopback interface."""
        return self.name == "lo"


def parse_ip_addr(text: str) -> list[Interface]:
    """Parse the JSON of `ip -d -j addr show`, ignoring anything malformed.

    Raises:
        ValueError: the text is not JSON (the caller turns it into a note).
    """
    data = json.loads(text) if text.strip() else []
    if not isinstance(data, list):
        raise ValueError("ip -j addr output is not a JSON list")
    out: list[Interface] = []
    for link in data:
        if not isinstance(link, dict) or not isinstance(link.get("ifname"), str):
            continue
        info = link.get("linkinfo")
        kind = info.get("info_kind", "") if isinstance(info, dict) else ""
        addresses: list[str] = []
        link_local: list[str] = []
        for a in link.get("addr_info") or []:
            if not isinstance(a, dict) or a.get("family") not in ("inet", "inet6"):
                continue
            try:
                iface = ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}")
            except (KeyError, ValueError):
                continue
            if iface.ip.is_link_local:
                link_local.append(str(iface))
            elif a.get("scope", "global") != "host":
                addresses.append(str(iface))
        flags = link.get("flags") or []
        out.append(
            Interface(
                name=link["ifname"],
                index=int(link.get("ifindex", 0)),
                kind=str(kind),
                up="UP" in flags,
                addresses=tuple(addresses),
                link_local=tuple(link_local),
            )
        )
    return sorted(out, key=lambda i: i.index)


async def list_interfaces(
    runner: Runner = run_command, timeout: float = DEFAULT_DETECT_TIMEOUT
) -> list[Interface]:
    """This namespace's interfaces via `ip -d -j addr show`.

    Raises:
        OSError, TimeoutError, ValueError: `ip` missing, stuck, failing or unparsable.
    """
    result = await runner(["ip", "-d", "-j", "addr", "show"], timeout)
    if result.returncode != 0:
        raise OSError(f"ip addr failed: {result.stderr.strip() or result.returncode}")
    return parse_ip_addr(result.stdout)


################################################################################
# Result
################################################################################


@attrs.frozen
class OverlayInfo:
    """What overlay detection found and what the node will accept.

    Attributes:
        kind: `wireguard`, `tailscale` or `none`.
        interface: the overlay interface (`wg0`, `tailscale0`) or None.
        addresses: this node's overlay addresses (no prefix), IPv4 first.
        accept_cidrs: source ranges accepted by default (before `--allow-cidr`).
        peers: overlay addresses of peers worth trying (Tailscale's online peers).
        note: one human sentence on what was found, chosen and ignored.
    """

    kind: OverlayKind
    interface: str | None
    addresses: tuple[str, ...]
    accept_cidrs: tuple[str, ...]
    peers: tuple[str, ...] = ()
    note: str = ""

    def preferred_address(self) -> str | None:
        """The address to bind and advertise: the first overlay address (IPv4 first).

        None without an overlay; the daemon then binds what the operator says (or `::`).
        """
        return self.addresses[0] if self.addresses else None

    def accept_policy(self, allow_cidrs: Sequence[str] = ()) -> AcceptPolicy:
        """The `AcceptPolicy`: `accept_cidrs` plus the operator's `--allow-cidr` values.

        Raises:
            ValueError: one of `allow_cidrs` is not a CIDR range.
        """
        return AcceptPolicy.from_cidrs([*self.accept_cidrs, *allow_cidrs])

    def describe(self) -> str:
        """One line for the log."""
        if self.kind == OverlayKind.NONE:
            head = "overlay: none"
        else:
            head = f"overlay: {self.kind} on {self.interface}, address {', '.join(self.addresses)}"
        parts = [head, "accepting " + (", ".join(self.accept_cidrs) or "nothing")]
        if self.peers:
            parts.append(f"{len(self.peers)} peer addresses to try")
        if self.note:
            parts.append(self.note)
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for `status`."""
        return {
            "kind": str(self.kind),
            "interface": self.interface,
            "addresses": list(self.addresses),
            "accept_cidrs": list(self.accept_cidrs),
            "peers": list(self.peers),
            "note": self.note,
        }


def _sort_addresses(addrs: Sequence[str]) -> tuple[str, ...]:
    """IPv4 before IPv6, then numeric order; deduplicated."""
    unique = {ipaddress.ip_address(a) for a in addrs}
    return tuple(str(a) for a in sorted(unique, key=lambda a: (a.version, a)))


def none_info(note: str = "") -> OverlayInfo:
    """The result for "no overlay": accept the LAN ranges (see `LAN_CIDRS`)."""
    text = "no overlay; accepting loopback, private and link-local ranges (add --allow-cidr)"
    return OverlayInfo(
        kind=OverlayKind.NONE,
        interface=None,
        addresses=(),
        accept_cidrs=LAN_CIDRS,
        note=f"{note}; {text}" if note else text,
    )


################################################################################
# WireGuard
################################################################################


async def _wg_interface_names(runner: Runner, timeout: float, notes: list[str]) -> set[str]:
    try:
        result = await runner(["wg", "show", "interfaces"], timeout)
    except FileNotFoundError:
        notes.append("wg tool not installed, only kernel WireGuard detectable")
        return set()
    except (OSError, TimeoutError) as exc:
        notes.append(f"wg show interfaces: {exc}")
        return set()
    if result.returncode != 0:
        notes.append(f"wg show interfaces failed: {result.stderr.strip()[:120]}")
        return set()
    return set(result.stdout.split())


async def _routes_via(name: str, runner: Runner, timeout: float, notes: list[str]) -> list[str]:
    """Destinations routed through `name` (the peers' allowed-ips), no default route."""
    out: list[str] = []
    for family in ("-4", "-6"):
        try:
            result = await runner(["ip", family, "-j", "route", "show", "dev", name], timeout)
            routes = json.loads(result.stdout) if result.stdout.strip() else []
        except (OSError, TimeoutError, ValueError) as exc:
            notes.append(f"ip route on {name}: {exc}")
            continue
        if result.returncode != 0 or not isinstance(routes, list):
            continue
        for route in routes:
            dst = route.get("dst") if isinstance(route, dict) else None
            if not isinstance(dst, str) or dst == "default":
                continue
            try:
                net = parse_cidr(dst)
            except ValueError:
                continue
            if net.prefixlen == 0 or net.is_link_local or net.is_multicast:
                continue
            out.append(str(net))
    return out


async def detect_wireguard(
    *,
    runner: Runner = run_command,
    timeout: float = DEFAULT_DETECT_TIMEOUT,
    interface: str | None = None,
    interfaces: Sequence[Interface] | None = None,
) -> OverlayInfo | None:
    """Find a WireGuard interface with an address; None (with no error) if there is none.

    Args:
        runner: runs `ip` and `wg`.
        timeout: per command.
        interface: use this interface rather than the first one found.
        interfaces: already-listed interfaces (saves one `ip` call in `detect_overlay`).

    Raises:
        OverlayNotFoundError: `interface` was named but is not a WireGuard interface here.
    """
    notes: list[str] = []
    links = list(interfaces) if interfaces is not None else await list_interfaces(runner, timeout)
    uapi_names = await _wg_interface_names(runner, timeout, notes)
    wg_links = [
        link
        for link in links
        if link.kind == "wireguard" or (link.name in uapi_names and link.kind in ("tun", ""))
    ]
    usable = [link for link in wg_links if link.addresses]
    if interface is not None:
        chosen = [link for link in usable if link.name == interface]
        if not chosen:
            names = ", ".join(link.name for link in wg_links) or "none"
            raise OverlayNotFoundError(
                f"--overlay-interface {interface}: not a WireGuard interface with an address "
                f"here (WireGuard interfaces: {names})"
            )
        usable = chosen
    if not usable:
        return None
    link = usable[0]
    if not link.up:
        notes.append(f"{link.name} is down")
    others = [other.name for other in usable[1:]]
    if others:
        notes.append(f"also found {', '.join(others)} (choose with --overlay-interface)")
    cidrs = [str(ipaddress.ip_interface(a).network) for a in link.addresses]
    cidrs += await _routes_via(link.name, runner, timeout, notes)
    policy = AcceptPolicy.from_cidrs(cidrs)
    return OverlayInfo(
        kind=OverlayKind.WIREGUARD,
        interface=link.name,
        addresses=_sort_addresses([a.split("/")[0] for a in link.addresses]),
        accept_cidrs=policy.cidrs,
        peers=(),
        note="; ".join(notes),
    )


################################################################################
# Tailscale
################################################################################


async def _tailscale_status(
    runner: Runner, fetch: StatusFetcher, socket_path: str, timeout: float, notes: list[str]
) -> dict[str, Any] | None:
    try:
        return await fetch(socket_path, timeout)
    except (OSError, TimeoutError, ValueError) as exc:
        api_error = f"{type(exc).__name__}: {exc}".strip()
    except Exception as exc:
        import httpx  # only a fetch that used httpx can raise its errors

        if not isinstance(exc, httpx.HTTPError):
            raise
        api_error = f"{type(exc).__name__}: {exc}".strip()
    try:
        result = await runner(["tailscale", "status", "--json"], timeout)
    except FileNotFoundError:
        notes.append(f"tailscale not found (LocalAPI: {api_error[:100]}; no tailscale CLI)")
        return None
    except (OSError, TimeoutError) as exc:
        notes.append(f"tailscale status --json: {exc}")
        return None
    try:
        data = json.loads(result.stdout)
    except ValueError:
        notes.append(f"tailscale status --json gave no JSON: {result.stderr.strip()[:100]}")
        return None
    return data if isinstance(data, dict) else None


def _ips(value: Any) -> list[str]:
    """Valid IP strings from a JSON list, ignoring junk."""
    out: list[str] = []
    for item in value if isinstance(value, list) else []:
        try:
            out.append(str(ipaddress.ip_address(item)))
        except (TypeError, ValueError):
            continue
    return out


def parse_tailscale_status(
    status: dict[str, Any], links: Sequence[Interface]
) -> tuple[OverlayInfo | None, str]:
    """Turn a Tailscale status object into an `OverlayInfo`, or None and the reason.

    Pure, so the recorded-JSON tests cover it directly.
    """
    state = status.get("BackendState")
    if state != "Running":
        return None, f"tailscale present but not running (BackendState={state})"
    me = status.get("Self") if isinstance(status.get("Self"), dict) else {}
    own = _ips(me.get("TailscaleIPs") if isinstance(me, dict) else None)
    if not own:
        return None, "tailscale running but has no Tailscale IPs"
    holder = None
    for link in links:
        held = {a.split("/")[0] for a in link.addresses}
        if held & set(own):
            holder = link.name
            break
    if holder is None:
        return None, (
            "tailscale runs in userspace-networking mode: its addresses "
            f"({', '.join(own)}) are on no local interface, so populi cannot bind them"
        )
    peers: list[str] = []
    raw_peers = status.get("Peer")
    for peer in raw_peers.values() if isinstance(raw_peers, dict) else []:
        if not isinstance(peer, dict) or peer.get("Online") is False:
            continue
        peers.extend(_ips(peer.get("TailscaleIPs")))
    info = OverlayInfo(
        kind=OverlayKind.TAILSCALE,
        interface=holder,
        addresses=_sort_addresses(own),
        accept_cidrs=(TAILSCALE_V4, TAILSCALE_V6),
        peers=_sort_addresses([p for p in peers if p not in own]),
        note="",
    )
    return info, ""


async def detect_tailscale(
    *,
    runner: Runner = run_command,
    fetch_status: StatusFetcher = fetch_tailscale_status,
    socket_path: str = TAILSCALE_SOCKET,
    timeout: float = DEFAULT_DETECT_TIMEOUT,
    interfaces: Sequence[Interface] | None = None,
) -> tuple[OverlayInfo | None, str]:
    """Ask tailscaled (LocalAPI, then the CLI) for this node's addresses and peers.

    Returns:
        (info, "") when Tailscale is usable, else (None, why not).
    """
    notes: list[str] = []
    status = await _tailscale_status(runner, fetch_status, socket_path, timeout, notes)
    if status is None:
        return None, "; ".join(notes) or "tailscale not found"
    links = list(interfaces) if interfaces is not None else await list_interfaces(runner, timeout)
    return parse_tailscale_status(status, links)


################################################################################
# Entry point
################################################################################


async def detect_overlay(
    mode: OverlayKind | str = OverlayKind.AUTO,
    *,
    runner: Runner = run_command,
    fetch_status: StatusFetcher = fetch_tailscale_status,
    tailscale_socket: str = TAILSCALE_SOCKET,
    interface: str | None = None,
    timeout: float = DEFAULT_DETECT_TIMEOUT,
) -> OverlayInfo:
    """Detect the overlay for `--overlay MODE`.

    Args:
        mode: `auto`, `wireguard`, `tailscale` or `none`.
        runner: runs `ip`, `wg` and `tailscale` (inject a fake in tests).
        fetch_status: reads Tailscale's LocalAPI status (inject a fake in tests).
        tailscale_socket: the LocalAPI socket path.
        interface: for WireGuard, which interface to use when there are several.
        timeout: bound on each command or API call.

    Returns:
        What was found. `auto` never fails: without an overlay it returns kind `none`.

    Raises:
        ValueError: `mode` is not one of the four.
        OverlayNotFoundError: `wireguard` or `tailscale` was asked for and is not usable.
    """
    try:
        kind = OverlayKind(mode)
    except ValueError:
        raise ValueError(
            f"--overlay must be one of auto, wireguard, tailscale, none; got {mode!r}"
        ) from None
    if kind == OverlayKind.NONE:
        return none_info("--overlay none")
    links: list[Interface] | None
    try:
        links = await list_interfaces(runner, timeout)
        link_error = ""
    except (OSError, TimeoutError, ValueError) as exc:
        links, link_error = None, f"cannot list interfaces ({exc})"
    if links is None:
        if kind == OverlayKind.AUTO:
            return none_info(link_error)
        raise OverlayNotFoundError(f"--overlay {kind}: {link_error}")

    if kind == OverlayKind.WIREGUARD:
        wg = await detect_wireguard(
            runner=runner, timeout=timeout, interface=interface, interfaces=links
        )
        if wg is None:
            raise OverlayNotFoundError(
                "--overlay wireguard: no WireGuard interface with an address "
                f"(interfaces here: {', '.join(i.name for i in links) or 'none'})"
            )
        return wg
    if kind == OverlayKind.TAILSCALE:
        ts, why = await detect_tailscale(
            runner=runner,
            fetch_status=fetch_status,
            socket_path=tailscale_socket,
            timeout=timeout,
            interfaces=links,
        )
        if ts is None:
            raise OverlayNotFoundError(f"--overlay tailscale: {why}")
        return ts

    return await _detect_auto(
        links,
        runner=runner,
        fetch_status=fetch_status,
        tailscale_socket=tailscale_socket,
        interface=interface,
        timeout=timeout,
    )


async def _detect_auto(
    links: list[Interface],
    *,
    runner: Runner,
    fetch_status: StatusFetcher,
    tailscale_socket: str,
    interface: str | None,
    timeout: float,
) -> OverlayInfo:
    """`--overlay auto`: Tailscale (it also names peers), then WireGuard, then none
    (never fails)."""
    ts, ts_why = await detect_tailscale(
        runner=runner,
        fetch_status=fetch_status,
        socket_path=tailscale_socket,
        timeout=timeout,
        interfaces=links,
    )
    wg = await detect_wireguard(
        runner=runner, timeout=timeout, interface=interface, interfaces=links
    )
    if ts is not None:
        if wg is not None:
            extra = f"also found WireGuard on {wg.interface} (use --overlay wireguard for it)"
            return attrs.evolve(ts, note="; ".join(filter(None, [ts.note, extra])))
        return ts
    if wg is not None:
        return wg
    return none_info(f"auto: no WireGuard interface; {ts_why}")
