"""Overlay detection with recorded command outputs (fixtures/) and fake runners.

`ip_addr_wireguard_go.json` was recorded in a namespace running wireguard-go (a tun
device with link_type none), `ip_addr_kernel_wireguard.json` is the same with the kind a
kernel WireGuard interface reports, and `ip_addr_tailscale.json` / `tailscale_status.json`
follow tailscaled's formats.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from overlay.detect import (
    CommandResult,
    Interface,
    OverlayKind,
    OverlayNotFoundError,
    detect_overlay,
    fetch_tailscale_status,
    parse_ip_addr,
    run_command,
)
from overlay.netfilter import LAN_CIDRS

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


WG_ROUTES_V4 = '[{"dst":"10.77.0.0/24","scope":"link","flags":[]}]'
WG_ROUTES_V6 = (
    '[{"dst":"fd77::/64","protocol":"kernel","metric":256,"flags":[],"pref":"medium"},'
    '{"dst":"fe80::/64","protocol":"kernel","metric":256,"flags":[],"pref":"medium"}]'
)


class FakeRunner:
    """Answers argv from a table; unknown programs are missing (FileNotFoundError)."""

    def __init__(self, table: dict[tuple[str, ...], CommandResult | Exception]) -> None:
        self.table = table
        self.calls: list[tuple[tuple[str, ...], float]] = []

    async def __call__(self, argv: Sequence[str], timeout: float) -> CommandResult:
        key = tuple(argv)
        self.calls.append((key, timeout))
        await trio.lowlevel.checkpoint()
        answer = self.table.get(key)
        if answer is None:
            raise FileNotFoundError(argv[0])
        if isinstance(answer, Exception):
            raise answer
        return answer


def ok(stdout: str) -> CommandResult:
    return CommandResult(0, stdout, "")


async def no_tailscaled(path: str, timeout: float) -> dict[str, Any]:
    raise httpx.ConnectError(f"[Errno 2] No such file or directory: {path}")


def status_fetcher(status: dict[str, Any]):
    async def fetch(path: str, timeout: float) -> dict[str, Any]:
        return status

    return fetch


def wireguard_go_runner(**extra: CommandResult | Exception) -> FakeRunner:
    table: dict[tuple[str, ...], CommandResult | Exception] = {
        ("ip", "-d", "-j", "addr", "show"): ok(fixture("ip_addr_wireguard_go.json")),
        ("wg", "show", "interfaces"): ok("pwgcap0\n"),
        ("ip", "-4", "-j", "route", "show", "dev", "pwgcap0"): ok(WG_ROUTES_V4),
        ("ip", "-6", "-j", "route", "show", "dev", "pwgcap0"): ok(WG_ROUTES_V6),
    }
    table.update({tuple(k.split()): v for k, v in extra.items()})
    return FakeRunner(table)


################################################################################
# Parsing
################################################################################


def test_parse_ip_addr_recorded_output() -> None:
    links = {i.name: i for i in parse_ip_addr(fixture("ip_addr_wireguard_go.json"))}
    assert set(links) == {"lo", "eth0", "eth1", "pwgcap0"}
    wg = links["pwgcap0"]
    assert wg.kind == "tun" and wg.up
    assert wg.addresses == ("10.77.0.1/32", "fd77::1/64")  # link-local kept apart
    assert wg.link_local and wg.link_local[0].startswith("fe80::")
    assert links["lo"].addresses == ()  # host scope is not an address to use
    assert links["eth0"].addresses == ("192.168.50.2/24",)


@pytest.mark.parametrize("text", ["", "[]", '[{"nope": 1}, 3, {"ifname": "x", "addr_info": [{}]}]'])
def test_parse_ip_addr_tolerates_junk(text) -> None:
    links = parse_ip_addr(text)
    assert all(isinstance(i, Interface) for i in links)


def test_parse_ip_addr_rejects_non_json() -> None:
    with pytest.raises(ValueError):
        parse_ip_addr("Error: ip: not json")


################################################################################
# WireGuard
################################################################################


async def test_wireguard_go_detected_with_route_ranges() -> None:
    runner = wireguard_go_runner()
    info = await detect_overlay("auto", runner=runner, fetch_status=no_tailscaled)
    assert info.kind == OverlayKind.WIREGUARD
    assert info.interface == "pwgcap0"
    assert info.addresses == ("10.77.0.1", "fd77::1")
    # /32 address alone would accept only ourselves; the route gives the peers' range.
    assert info.accept_cidrs == ("10.77.0.0/24", "10.77.0.1/32", "fd77::/64")
    assert info.preferred_address() == "10.77.0.1"
    policy = info.accept_policy(["192.168.50.0/24"])
    assert policy.allows("10.77.0.9") and policy.allows("fd77::9")
    assert policy.allows("192.168.50.7") and not policy.allows("192.168.51.7")
    assert "fe80" not in " ".join(info.accept_cidrs)
    assert all(timeout == 3.0 for _, timeout in runner.calls)
    line = info.describe()
    assert line.startswith("overlay: wireguard on pwgcap0, address 10.77.0.1, fd77::1")
    assert "accepting 10.77.0.0/24" in line


async def test_kernel_wireguard_found_without_wg_tool() -> None:
    runner = FakeRunner(
        {
            ("ip", "-d", "-j", "addr", "show"): ok(fixture("ip_addr_kernel_wireguard.json")),
            ("ip", "-4", "-j", "route", "show", "dev", "wg0"): ok("[]"),
            ("ip", "-6", "-j", "route", "show", "dev", "wg0"): ok("[]"),
        }
    )
    info = await detect_overlay("wireguard", runner=runner, fetch_status=no_tailscaled)
    assert info.interface == "wg0"
    assert info.accept_cidrs == ("10.77.0.1/32", "fd77::/64")
    assert "wg tool not installed" in info.note


async def test_uapi_socket_of_another_namespace_is_ignored() -> None:
    # `wg show interfaces` lists UAPI sockets of every namespace; only local links count.
    runner = wireguard_go_runner(**{"wg show interfaces": ok("pwgcap0 pwgother7\n")})
    info = await detect_overlay("wireguard", runner=runner, fetch_status=no_tailscaled)
    assert info.interface == "pwgcap0" and "pwgother7" not in info.describe()


async def test_default_route_through_wireguard_is_not_accepted() -> None:
    runner = wireguard_go_runner(
        **{"ip -4 -j route show dev pwgcap0": ok('[{"dst":"default"},{"dst":"0.0.0.0/0"}]')}
    )
    info = await detect_overlay("wireguard", runner=runner, fetch_status=no_tailscaled)
    assert "0.0.0.0/0" not in info.accept_cidrs and "10.77.0.1/32" in info.accept_cidrs


async def test_wireguard_requested_but_absent_is_a_clear_error() -> None:
    runner = FakeRunner(
        {
            ("ip", "-d", "-j", "addr", "show"): ok(fixture("ip_addr_tailscale.json")),
            ("wg", "show", "interfaces"): ok(""),
        }
    )
    with pytest.raises(OverlayNotFoundError, match="no WireGuard interface with an address"):
        await detect_overlay("wireguard", runner=runner, fetch_status=no_tailscaled)


async def test_named_interface_must_be_wireguard() -> None:
    with pytest.raises(OverlayNotFoundError, match="eth0: not a WireGuard interface"):
        await detect_overlay(
            "wireguard", runner=wireguard_go_runner(), fetch_status=no_tailscaled, interface="eth0"
        )


################################################################################
# Tailscale
################################################################################


def tailscale_runner() -> FakeRunner:
    return FakeRunner({("ip", "-d", "-j", "addr", "show"): ok(fixture("ip_addr_tailscale.json"))})


async def test_tailscale_via_localapi() -> None:
    status = json.loads(fixture("tailscale_status.json"))
    info = await detect_overlay(
        "auto", runner=tailscale_runner(), fetch_status=status_fetcher(status)
    )
    assert info.kind == OverlayKind.TAILSCALE
    assert info.interface == "tailscale0"
    assert info.addresses == ("100.101.102.103", "fd7a:115c:a1e0::1234")
    assert info.accept_cidrs == ("100.64.0.0/10", "fd7a:115c:a1e0::/48")
    # Online peers only, junk dropped, IPv4 first.
    assert info.peers == ("100.90.1.2", "100.90.1.4", "fd7a:115c:a1e0::2")
    assert info.to_dict()["kind"] == "tailscale"


async def test_tailscale_via_cli_when_localapi_unreachable() -> None:
    runner = tailscale_runner()
    runner.table[("tailscale", "status", "--json")] = ok(fixture("tailscale_status.json"))
    info = await detect_overlay("tailscale", runner=runner, fetch_status=no_tailscaled)
    assert info.kind == OverlayKind.TAILSCALE and info.peers


async def test_tailscale_stopped_falls_back_in_auto_and_fails_when_asked() -> None:
    status = json.loads(fixture("tailscale_status.json")) | {"BackendState": "Stopped"}
    info = await detect_overlay(
        "auto", runner=tailscale_runner(), fetch_status=status_fetcher(status)
    )
    assert info.kind == OverlayKind.NONE and "BackendState=Stopped" in info.note
    with pytest.raises(OverlayNotFoundError, match="not running"):
        await detect_overlay(
            "tailscale", runner=tailscale_runner(), fetch_status=status_fetcher(status)
        )


async def test_tailscale_userspace_networking_is_not_bindable() -> None:
    status = json.loads(fixture("tailscale_status.json"))
    runner = FakeRunner(
        {("ip", "-d", "-j", "addr", "show"): ok(fixture("ip_addr_wireguard_go.json"))}
    )
    with pytest.raises(OverlayNotFoundError, match="userspace-networking"):
        await detect_overlay("tailscale", runner=runner, fetch_status=status_fetcher(status))


async def test_auto_prefers_tailscale_and_mentions_wireguard() -> None:
    status = json.loads(fixture("tailscale_status.json"))
    links = json.loads(fixture("ip_addr_tailscale.json")) + [
        link
        for link in json.loads(fixture("ip_addr_wireguard_go.json"))
        if link["ifname"] == "pwgcap0"
    ]
    runner = wireguard_go_runner(**{"ip -d -j addr show": ok(json.dumps(links))})
    info = await detect_overlay("auto", runner=runner, fetch_status=status_fetcher(status))
    assert info.kind == OverlayKind.TAILSCALE
    assert "also found WireGuard on pwgcap0" in info.note


################################################################################
# None, and failures of the tools themselves
################################################################################


async def test_nothing_found_means_none_with_lan_ranges() -> None:
    runner = FakeRunner(
        {
            ("ip", "-d", "-j", "addr", "show"): ok(
                fixture("ip_addr_tailscale.json").replace("tailscale0", "tun7")
            ),
            ("wg", "show", "interfaces"): ok(""),
        }
    )
    info = await detect_overlay("auto", runner=runner, fetch_status=no_tailscaled)
    assert info.kind == OverlayKind.NONE
    assert info.accept_cidrs == LAN_CIDRS
    assert info.preferred_address() is None
    assert "tailscale not found" in info.note and "no WireGuard interface" in info.note
    assert info.describe().startswith("overlay: none; accepting 127.0.0.0/8")


async def test_none_mode_runs_nothing() -> None:
    runner = FakeRunner({})
    info = await detect_overlay("none", runner=runner)
    assert info.kind == OverlayKind.NONE and runner.calls == []


async def test_bad_mode_and_broken_ip() -> None:
    with pytest.raises(ValueError, match="--overlay must be one of"):
        await detect_overlay("zerotier")
    hung = FakeRunner({("ip", "-d", "-j", "addr", "show"): TimeoutError("ip stuck")})
    info = await detect_overlay("auto", runner=hung, fetch_status=no_tailscaled)
    assert info.kind == OverlayKind.NONE and "cannot list interfaces (ip stuck)" in info.note
    with pytest.raises(OverlayNotFoundError, match="cannot list interfaces"):
        await detect_overlay("wireguard", runner=hung)


################################################################################
# The real runner and the real LocalAPI client
################################################################################


async def test_run_command_times_out_and_reports_missing_programs() -> None:
    result = await run_command(["sh", "-c", "echo hi; echo err >&2; exit 3"], 5)
    assert result == CommandResult(3, "hi\n", "err\n")
    with pytest.raises(TimeoutError, match=r"within 0\.2 s"):
        await run_command(["sleep", "10"], 0.2)
    with pytest.raises(FileNotFoundError):
        await run_command(["populi-no-such-program"], 1)


async def test_fetch_tailscale_status_over_a_unix_socket(nursery) -> None:
    """A stand-in tailscaled (hypercorn on a unix socket) answers the real httpx client."""
    import hypercorn.config
    import hypercorn.trio

    status = json.loads(fixture("tailscale_status.json"))
    seen: list[tuple[str, dict[str, str]]] = []

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].removeprefix("lifespan.")
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        seen.append((scope["path"], headers))
        body = json.dumps(status).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "tailscaled.sock")
        config = hypercorn.config.Config()
        config.bind = [f"unix:{sock}"]
        config.accesslog = None
        config.errorlog = None
        done = trio.Event()
        await nursery.start(
            lambda task_status: hypercorn.trio.serve(
                app, config, shutdown_trigger=done.wait, task_status=task_status
            )
        )
        got = await fetch_tailscale_status(sock, 5)
        done.set()
        assert got == status
        assert seen[0][0] == "/localapi/v0/status"
        assert seen[0][1]["host"] == "local-tailscaled.sock"
        with pytest.raises(httpx.HTTPError):
            await fetch_tailscale_status(os.path.join(tmp, "missing.sock"), 1)
