"""What ``GET /v1/status`` shows, built from stand-ins for the services it reads: the
warnings in their order (notices, name clashes, discovery, blocked UDP, unverified
members capped), the summary, and every section in a JSON-ready form."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import attrs

from populi_p2p._version import protocol_version, software_version
from populi_p2p.services.status import UNVERIFIED_WARNINGS_MAX, StatusView, asdict
from populi_p2p.trust._keyfiles import encode_public_key
from populi_p2p.trust.authority import ClusterAuthority, cluster_fingerprint
from populi_p2p.trust.identity import NodeIdentity

AUTHORITY = ClusterAuthority.generate()


@attrs.frozen
class _Stats:
    sent: int = 3
    peers: tuple[str, ...] = ("a", "b")


def _drops(**counts: int) -> Any:
    return SimpleNamespace(as_dict=lambda: counts)


def _unverified(n: int) -> list[dict[str, str]]:
    return [
        {"node_id": f"id{i}", "name": f"n{i}", "state": "alive", "reason": "no record yet"}
        for i in range(n)
    ]


def _view(tmp_path: Path, unverified: int = 0, **changes: Any) -> StatusView:
    roster = SimpleNamespace(
        state_counts=lambda: {"alive": 2, "suspect": 1, "dead": 0},
        name_clashes=lambda: [{"name": "gpu1", "node_ids": ["aa", "bb"]}],
        unverified_members=lambda: _unverified(unverified),
        records=SimpleNamespace(drops=_drops(stale=2)),
    )
    membership = SimpleNamespace(
        incarnation=4, has_left=False, awareness=1, statistics=_Stats, driver_statistics=_Stats
    )
    transport = SimpleNamespace(statistics=lambda: SimpleNamespace(
        udp=_Stats(), tcp=_Stats(sent=9), udp_blocked_peers=[("10.0.0.2", 7946)],
    ))  # fmt: skip
    codec = SimpleNamespace(
        auth=SimpleNamespace(drops=_drops(bad_signature=1)), bytes_out=10, frame_bytes_out=12,
        bytes_in=20, datagrams_with_certificate=1, datagrams_without_certificate=5,
    )  # fmt: skip
    overlay = SimpleNamespace(to_dict=lambda: {"kind": "none"}, describe=lambda: "no overlay")
    parts: dict[str, Any] = {
        "config": SimpleNamespace(name="node-a", preset="lan"),
        "identity": NodeIdentity.load_or_create(tmp_path),
        "authority_key": AUTHORITY.public_key,
        "started_at": time.time() - 60,
        "advertise": ("10.0.0.1", 7946),
        "overlay": overlay,
        "policy": SimpleNamespace(cidrs=("10.0.0.0/8",)),
        "codec": codec,
        "transport": transport,
        "membership": membership,
        "roster": roster,
        "discovery": SimpleNamespace(warnings=lambda: ["mDNS is off"], statistics=_Stats),
        "left": lambda: False,
        "notices": lambda: ["clock skew of 3 s"],
    }
    return StatusView(**cast(Any, {**parts, **changes}))


def test_the_warnings_in_order_and_the_summary(tmp_path: Path) -> None:
    status = _view(tmp_path).status()
    assert status["warnings"] == [
        "clock skew of 3 s",
        "name 'gpu1' is used by nodes aa, bb",
        "mDNS is off",
        "UDP to 10.0.0.2:7946 seems blocked; TCP works",
    ]
    assert status["cluster"]["summary"] == "2 alive, 1 suspect"  # no "0 dead"
    assert status["udp_blocked"] == ["10.0.0.2:7946"]
    assert status["name_clashes"] == [{"name": "gpu1", "node_ids": ["aa", "bb"]}]


def test_unverified_members_are_named_up_to_the_cap_then_counted(tmp_path: Path) -> None:
    extra = 3
    status = _view(tmp_path, unverified=UNVERIFIED_WARNINGS_MAX + extra).status()
    named = [w for w in status["warnings"] if w.startswith("member ")]
    assert named[0] == "member id0 (n0, alive) is unverified: no record yet"
    assert len(named) == UNVERIFIED_WARNINGS_MAX
    assert status["warnings"][-1] == f"... and {extra} more unverified members"
    count = UNVERIFIED_WARNINGS_MAX + extra
    assert status["cluster"]["summary"] == f"2 alive, 1 suspect; {count} unverified"
    assert status["cluster"]["unverified"] == count and len(status["unverified"]) == count
    at_cap = _view(tmp_path, unverified=UNVERIFIED_WARNINGS_MAX).status()["warnings"]
    assert not any("more unverified" in w for w in at_cap)


def test_the_node_section(tmp_path: Path) -> None:
    view = _view(tmp_path)
    node = view.status()["node"]
    assert node["name"] == "node-a" and node["node_id"] == view.identity.node_id
    assert node["public_key"] == encode_public_key(view.identity.public_key)
    assert node["address"] == "10.0.0.1:7946" and node["incarnation"] == 4
    assert 60 <= node["uptime_s"] < 3600 and node["pid"] == os.getpid()
    assert (node["software_version"], node["protocol_version"]) == (
        software_version(), protocol_version(),
    )  # fmt: skip
    assert node["preset"] == "lan" and node["left"] is False


def test_left_is_ours_or_the_membership_s(tmp_path: Path) -> None:
    assert _view(tmp_path, left=lambda: True).status()["node"]["left"] is True
    membership = SimpleNamespace(incarnation=1, has_left=True, awareness=0,
                                 statistics=_Stats, driver_statistics=_Stats)  # fmt: skip
    assert _view(tmp_path, membership=membership).status()["node"]["left"] is True


def test_every_section_is_json_ready(tmp_path: Path) -> None:
    status = _view(tmp_path).status()
    assert json.loads(json.dumps(status)) == status  # tuples made lists, nothing opaque
    assert status["cluster"]["fingerprint"] == cluster_fingerprint(AUTHORITY.public_key)
    assert status["overlay"] == {"kind": "none", "accept": ["10.0.0.0/8"],
                                 "description": "no overlay"}  # fmt: skip
    assert status["transport"] == {"udp": {"sent": 3, "peers": ["a", "b"]},
                                   "tcp": {"sent": 9, "peers": ["a", "b"]}}  # fmt: skip
    assert status["drops"] == {"auth": {"bad_signature": 1}, "records": {"stale": 2}}
    assert status["traffic"]["datagrams_without_certificate"] == 5
    assert status["swim"] == status["driver"] == status["bootstrap"] == asdict(_Stats())


def test_asdict_makes_tuples_lists() -> None:
    assert asdict(_Stats()) == {"sent": 3, "peers": ["a", "b"]}
