"""The inference host's own logic: the router's view of the mesh (only members with a
verified record are candidates; a peer address needs a port in the record), the peer
API's port (the swim port + 1, else the kernel's; an explicit one is one clear error
when taken), and what it reports before anything started. The inference services
themselves: tests/inference/."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio

from populi_p2p.inference.peer_api import PeerRoutes
from populi_p2p.inference.route import Candidate
from populi_p2p.services.errors import NodeStartError
from populi_p2p.services.inference_host import InferenceHost, _RouteView
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.record import NodeStatus
from swim import Member, MemberState

MODELS = {"llama": {"ctx": 4096}}


def _record(**sections: Any) -> Any:
    status = sections.pop("status", NodeStatus.AVAILABLE)
    return SimpleNamespace(name="name-" + sections.pop("who", "x"), status=status,
                           address="10.0.0.9", sections=sections)  # fmt: skip


def _view(members: list[Member], records: dict[str, Any], refused: set[str]) -> _RouteView:
    roster = SimpleNamespace(
        records=records,
        unverified_reason=lambda node: "bad_signature" if node in refused else None,
    )
    by_name = {m.name: m for m in members}
    return _RouteView("me", lambda: members, by_name.get, cast(Any, roster))


def test_candidates_are_the_members_with_a_verified_record() -> None:
    members = [
        Member("me", ("10.0.0.1", 1), MemberState.ALIVE, 1),
        Member("drain", ("10.0.0.2", 1), MemberState.SUSPECT, 1, rtt=0.01),
        Member("forged", ("10.0.0.3", 1), MemberState.ALIVE, 1),
        Member("new", ("10.0.0.4", 1), MemberState.ALIVE, 1),  # no record yet
        Member("odd", ("10.0.0.5", 1), MemberState.ALIVE, 1),
    ]
    records = {
        "me": _record(who="me", models=MODELS),
        "drain": _record(who="drain", status=NodeStatus.DRAINING),
        "forged": _record(who="forged", models=MODELS),
        "odd": _record(who="odd", models=["not", "a", "map"]),
    }
    view = _view(members, records, refused={"forged"})
    assert view.candidates() == [
        Candidate("me", "name-me", "alive", False, MODELS, None, is_self=True),
        Candidate("drain", "name-drain", "suspect", True, {}, 0.01),
        Candidate("odd", "name-odd", "alive", False, {}),
    ]


def test_a_peer_address_needs_a_record_with_an_integer_port() -> None:
    records = {
        "good": _record(peer={"port": 8001}),
        "text": _record(peer={"port": "8001"}),
        "flat": _record(peer=8001),
        "none": _record(),
    }
    view = _view([], records, refused=set())
    assert view.address_of("good") == ("10.0.0.9", 8001)
    for node in ("text", "flat", "none", "unknown"):
        assert view.address_of(node) is None, node


def test_state_of_is_the_cores() -> None:
    view = _view([Member("a", ("10.0.0.1", 1), MemberState.DEAD, 1)], {}, set())
    assert view.state_of("a") == "dead" and view.state_of("b") is None


########################################################################################
# The peer API's port


class _Publisher:
    def __init__(self) -> None:
        self.sections: dict[str, Any] = {}

    async def set_section(self, name: str, value: Any) -> None:
        self.sections[name] = value


def _host(tmp_path: Path, peer_port: int | None, swim_port: int) -> tuple[InferenceHost, Any]:
    creds = SimpleNamespace(identity=NodeIdentity.load_or_create(tmp_path), certificate=b"c")
    publisher = _Publisher()
    config = SimpleNamespace(peer_port=peer_port, port=swim_port)
    parts: list[Any] = [config, creds, None, publisher, PeerRoutes()]
    host = InferenceHost(*parts, lease_config=cast(Any, None))
    return host, publisher


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback TCP port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


async def test_the_peer_port_is_the_swim_port_plus_one_else_the_kernels(
    tmp_path: Path, taken: int
) -> None:
    host, publisher = _host(tmp_path, peer_port=None, swim_port=taken - 1)
    async with trio.open_nursery() as nursery:
        await host._start_peer_api(nursery, "127.0.0.1", taken - 1)
        assert host.peer_api is not None and host.peer_client is not None
        bound = host.peer_api.port
        assert bound not in (None, taken)  # taken: the kernel chose
        assert publisher.sections == {"peer": {"port": bound}}
        assert host.http_statistics()["peer"]["port"] == bound
        nursery.cancel_scope.cancel()


async def test_a_taken_explicit_peer_port_is_one_clear_error(tmp_path: Path, taken: int) -> None:
    host, publisher = _host(tmp_path, peer_port=taken, swim_port=7946)
    async with trio.open_nursery() as nursery:
        with pytest.raises(NodeStartError) as caught:
            await host._start_peer_api(nursery, "127.0.0.1", 7946)
    assert str(caught.value).startswith(f"cannot listen for peer calls on 127.0.0.1 port {taken}")
    assert "(pick another with --peer-port; 0 lets the kernel choose)" in str(caught.value)
    assert publisher.sections == {}


def test_before_anything_started_it_reports_nothing(tmp_path: Path) -> None:
    host, _ = _host(tmp_path, peer_port=None, swim_port=0)
    assert host.requests() == {"listening": None, "requests": [], "engines": []}
    assert host.http_statistics() == {"peer": None, "api": None}
