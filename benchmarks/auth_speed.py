"""How much the packet envelope costs: microseconds per seal/open, and bytes per packet.

Run: ``python benchmarks/auth_speed.py [--packets N]``. Printed, not asserted. The
numbers that matter for the daemon: per-packet CPU at the swim packet rate (a few hundred
packets per second per node at LAN defaults), the cost of refusing junk (what an
unauthenticated source can make us spend), and the bytes the envelope takes out of the
1400-byte packet budget.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from overlay.auth import AuthError, PacketAuthenticator
from populi_p2p.trust.authority import ClusterAuthority, generate_cluster_secret
from populi_p2p.trust.envelope_keys import packet_authenticator
from populi_p2p.trust.identity import NodeIdentity
from populi_p2p.trust.record import Capabilities, NodeRecord, NodeStatus, next_sequence
from populi_p2p.trust.record_book import RecordBook

NOW = time.time()


def per_item_us(run: Callable[[], object], count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        run()
    return (time.perf_counter() - start) / count * 1e6


def bench_envelope(label: str, count: int, payload_size: int, **options: object) -> None:
    authority = ClusterAuthority.generate()
    alice, bob = NodeIdentity.generate(), NodeIdentity.generate()

    def make(identity: NodeIdentity) -> PacketAuthenticator:
        cert = authority.enroll(identity.public_key, now=NOW).raw
        return packet_authenticator(identity, cert, authority.public_key, **options)  # type: ignore[arg-type]

    sender, receiver = make(alice), make(bob)
    payload = os.urandom(payload_size)
    start = time.perf_counter()
    packets = [sender.seal(payload, NOW, recipient=bob.node_id) for _ in range(count)]
    seal_us = (time.perf_counter() - start) / count * 1e6
    receiver.open(packets[0], NOW)  # warm the certificate cache, as a steady stream does
    start = time.perf_counter()
    for packet in packets[1:]:
        receiver.open(packet, NOW)
    open_us = (time.perf_counter() - start) / (count - 1) * 1e6

    # Forgeries must carry fresh counters, or the replay window refuses them for free.
    forged = [
        p[:-1] + bytes([p[-1] ^ 1]) for p in (sender.seal(payload, NOW) for _ in range(count))
    ]
    junk = [os.urandom(len(packets[0])) for _ in range(count)]

    def refuse_all(batch: list[bytes]) -> float:
        start = time.perf_counter()
        for packet in batch:
            try:
                receiver.open(packet, NOW)
            except AuthError:
                pass
        return (time.perf_counter() - start) / len(batch) * 1e6

    forged_us, junk_us = refuse_all(forged), refuse_all(junk)
    print(
        f"{label:<34} payload {payload_size:>4} B  overhead {sender.overhead():>3} B  "
        f"seal {seal_us:6.1f} us  open {open_us:6.1f} us  "
        f"refuse forged {forged_us:6.1f} us  refuse junk {junk_us:5.1f} us"
    )


def bench_records(count: int) -> None:
    authority = ClusterAuthority.generate()
    node = NodeIdentity.generate()
    cert = authority.enroll(node.public_key, now=NOW).raw
    book = RecordBook(authority.public_key)
    records = [
        NodeRecord(
            node.node_id,
            node.public_key,
            "gpu-box-1",
            "100.101.102.103",
            7946,
            "0.1.0",
            1,
            NOW,
            next_sequence(None, NOW) + i,
            NodeStatus.AVAILABLE,
            Capabilities(64, 512 << 30),
            {"rack": "b2"},
            cert,
        )
        for i in range(count)
    ]
    start = time.perf_counter()
    signed = [r.sign(node).raw for r in records]
    sign_us = (time.perf_counter() - start) / count * 1e6
    start = time.perf_counter()
    for raw in signed:
        book.accept(raw, NOW)
    accept_us = (time.perf_counter() - start) / count * 1e6
    repeat_us = per_item_us(lambda: book.accept(signed[-1], NOW, node_id=node.node_id), count)
    print(
        f"NodeRecord ({len(signed[0])} B, no GPU)  sign {sign_us:6.1f} us  "
        f"accept new {accept_us:6.1f} us  accept repeat {repeat_us:5.2f} us"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=2000)
    args = parser.parse_args()
    n = args.packets
    secret = generate_cluster_secret()
    print(f"populi envelope cost, {n} packets per case (one core, pynacl/libsodium)")
    for size in (64, 1000):
        bench_envelope("signed, certificate in every packet", n, size)
    bench_envelope("signed + SecretBox (cluster secret)", n, 1000, cluster_secret=secret)
    bench_records(max(n // 4, 10))


if __name__ == "__main__":
    main()
