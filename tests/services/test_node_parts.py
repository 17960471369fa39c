"""`MembershipParts` and `NodeParts`: the services the node builds on either side of the
membership, each handed its collaborators."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from overlay.inbox import URGENT, Incoming
from populi_p2p.config import NodeConfig
from populi_p2p.services.codec import WIRE_PACKET_BUDGET
from populi_p2p.services.credentials import Credentials, load_credentials
from populi_p2p.services.membership import MembershipService
from populi_p2p.services.memory import StoreService
from populi_p2p.services.node_parts import MembershipParts, NodeParts
from populi_p2p.trust.authority import ClusterAuthority, write_authority_public_key
from populi_p2p.trust.certificate import write_certificate
from populi_p2p.trust.identity import NodeIdentity
from swim import SwimConfig

AUTHORITY = ClusterAuthority.from_seed(b"A" * 32)
ALICE_AT = ("10.0.0.1", 7946)
BOB_AT = ("10.0.0.2", 7946)


def enrolled(state: Path, name: str) -> tuple[NodeConfig, Credentials]:
    identity = NodeIdentity.load_or_create(state)
    write_authority_public_key(state / "authority.pub", AUTHORITY.public_key)
    cert = AUTHORITY.enroll(identity.public_key, now=time.time() - 60, serial=1)
    write_certificate(state / "node.cert", cert)
    config = NodeConfig.load(None, {"state_dir": state, "name": name})
    return config, load_credentials(config)


def parts(tmp_path: Path, name: str) -> tuple[NodeConfig, Credentials, MembershipParts]:
    config, creds = enrolled(tmp_path / name, name)
    return config, creds, MembershipParts(config, SwimConfig.lan(), creds, started_at=1.0)


def test_the_swim_packets_fit_a_sealed_datagram(tmp_path: Path) -> None:
    _, _, core = parts(tmp_path, "alice")
    overhead = core.codec.auth.overhead()
    assert core.swim_config.packet_budget == WIRE_PACKET_BUDGET - overhead
    assert core.swim_config.app_channel_enabled
    assert core.swim_config.app_payload_size_max == core.swim_config.packet_budget - 256
    assert core.swim_config.probe_interval == SwimConfig.lan().probe_interval  # the preset's
    assert len(core.signer.sign().raw) <= core.swim_config.packet_budget - 64


def test_a_frame_that_authenticates_is_tcp_evidence_in_the_shared_path_health(
    tmp_path: Path,
) -> None:
    """The codec (built before any socket) and the transport (bound later, with
    `core.paths`) share one `PathHealth`: "UDP blocked, TCP works" needs both."""
    _, _, alice = parts(tmp_path, "alice")
    _, bob_creds, bob = parts(tmp_path, "bob")
    alice.codec.recipients[BOB_AT] = bob_creds.identity.node_id
    for second in range(11):  # our probes to bob, unanswered over UDP for 10 s
        alice.paths.record_udp_sent(BOB_AT, float(second))
    assert not alice.paths.udp_seems_blocked(BOB_AT)
    frame = bob.codec.seal(ALICE_AT, b"\x01state", True)
    assert alice.codec.open(Incoming(("10.0.0.2", 40001), frame, True, URGENT)) == b"\x01state"
    assert alice.paths.udp_seems_blocked(BOB_AT)


def test_a_bad_clock_is_named_by_the_skew_watch(tmp_path: Path) -> None:
    _, _, alice = parts(tmp_path, "alice")
    _, _, bob = parts(tmp_path, "bob")
    sealed = bob.codec.auth.seal(b"\x01late", time.time() - 3600)
    assert alice.codec.open(Incoming(BOB_AT, sealed, False, URGENT)) is None
    (notice,) = alice.skew.notices()
    assert notice.startswith("packets from 10.0.0.2 are 3600 s in the past")


class NoTransport:
    async def receive(self) -> Incoming:
        raise AssertionError("not run")

    def receive_nowait(self) -> Incoming:
        raise trio.WouldBlock

    async def send_datagram(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("not run")

    async def send_frame(self, *args: object) -> None:
        raise AssertionError("not run")


def test_node_parts_start_from_our_first_record(tmp_path: Path) -> None:
    config, creds, core = parts(tmp_path, "alice")
    core.signer.advertise = ALICE_AT
    own = core.signer.sign()
    membership = MembershipService(
        core.swim_config, creds.identity.node_id, ALICE_AT, meta=own.raw, incarnation=1,
        transport=NoTransport(), codec=core.codec, max_datagram_size=1400, now=0.0,
        app_state=core.sections,
    )  # fmt: skip
    node = NodeParts(config, creds, core, membership, StoreService(None, membership), own)
    assert node.codec is core.codec and node.skew is core.skew
    assert node.roster.name_of(creds.identity.node_id) == "alice"  # handed the first record
    assert node.gpus.report is None and node.certificate.notices() == []
