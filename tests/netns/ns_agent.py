"""A small helper run inside a lab namespace (`ip netns exec NS python ns_agent.py ...`).

It speaks JSON lines: one object per line on stdout, commands one per line on stdin, and
it exits when stdin closes (so the parent stops it by closing the pipe, no signals).

Modes:
    node --host H --port P [--accept CIDR ...] [--accept-detected] [--dual-stack]
        Runs a `Transport`. Prints {"event": "ready", "address": [h, p], "accept": [...]},
        then {"event": "packet", ...} per received packet and {"event": "stats", ...}
        whenever a drop counter changes. Commands: {"cmd": "send"|"frame",
        "to": [h, p], "payload": "text"}; answers {"event": "sent"|"send_error", ...}.
    detect [--mode M]
        Prints {"event": "detected", ...OverlayInfo.to_dict()} and exits.
    mdns --node-id ID --port P --fingerprint F --address A [--address A ...]
        Advertises and browses; prints {"event": "ready"} once registered, then
        {"event": "peer", ...} per matching peer, {"event": "stats", ...} when the
        counters change, and {"event": "stopped"} after a clean shutdown.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import trio


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def stdin_lines() -> AsyncIterator[str]:
    """Lines from stdin without a thread; ends at EOF."""
    stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    buf = b""
    async with stream:
        while True:
            chunk = await stream.receive_some(4096)
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    yield line.decode()


async def run_node(args: argparse.Namespace) -> None:
    from overlay.detect import detect_overlay
    from overlay.netfilter import AcceptPolicy
    from overlay.transport import Transport

    cidrs = list(args.accept)
    if args.accept_detected:
        info = await detect_overlay("wireguard")
        cidrs += list(info.accept_cidrs)
    policy = AcceptPolicy.from_cidrs(cidrs)
    transport = Transport(args.host, args.port, policy=policy, dual_stack=args.dual_stack)

    async def report_packets() -> None:
        async for packet in transport.inbox:
            emit(
                "packet",
                source=list(packet.source),
                payload=packet.payload.decode(errors="replace"),
                reliable=packet.reliable,
            )

    async def report_stats() -> None:
        last = None
        while True:
            s = transport.statistics()
            now = {
                "udp_received": s.udp.received,
                "refused_source": s.udp.refused_source,
                "tcp_refused_source": s.tcp.inbound_refused_source,
            }
            if now != last:
                emit("stats", **now)
                last = now
            await trio.sleep(0.05)

    async with trio.open_nursery() as nursery:
        address = await nursery.start(transport.run)
        emit("ready", address=list(address), accept=list(policy.cidrs))
        nursery.start_soon(report_packets)
        nursery.start_soon(report_stats)
        async for line in stdin_lines():
            cmd = json.loads(line)
            to = (cmd["to"][0], int(cmd["to"][1]))
            payload = cmd["payload"].encode()
            try:
                if cmd["cmd"] == "send":
                    await transport.send_datagram(to, payload)
                else:
                    await transport.send_frame(to, payload)
            except Exception as exc:
                emit("send_error", error=str(exc), payload=cmd["payload"])
            else:
                emit("sent", payload=cmd["payload"])
        nursery.cancel_scope.cancel()


async def run_detect(args: argparse.Namespace) -> None:
    from overlay.detect import detect_overlay

    info = await detect_overlay(args.mode)
    emit("detected", **info.to_dict())


async def run_mdns(args: argparse.Namespace) -> None:
    from overlay.mdns import MdnsAnnouncer

    announcer = MdnsAnnouncer(
        node_id=args.node_id,
        port=args.port,
        fingerprint=args.fingerprint,
        addresses=args.address,
        advertise_addresses=args.address,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(announcer.run)
        emit("ready")

        async def report() -> None:
            async for peer in announcer.discoveries:
                emit(
                    "peer",
                    node_id=peer.node_id,
                    addresses=[list(a) for a in peer.addresses],
                    fingerprint=peer.fingerprint,
                    version=peer.version,
                )

        async def report_stats() -> None:
            last = None
            while True:
                s = announcer.statistics()
                now = {"mismatched": s.mismatched_fingerprint, "found": s.peers_found}
                if now != last:
                    emit("stats", **now)
                    last = now
                await trio.sleep(0.05)

        nursery.start_soon(report)
        nursery.start_soon(report_stats)
        async for _line in stdin_lines():
            pass
        nursery.cancel_scope.cancel()
    emit("stopped")


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode_name", required=True)
    node = sub.add_parser("node")
    node.add_argument("--host", required=True)
    node.add_argument("--port", type=int, default=7950)
    node.add_argument("--accept", action="append", default=[])
    node.add_argument("--accept-detected", action="store_true")
    node.add_argument("--dual-stack", action="store_true")
    detect = sub.add_parser("detect")
    detect.add_argument("--mode", default="auto")
    mdns = sub.add_parser("mdns")
    mdns.add_argument("--node-id", required=True)
    mdns.add_argument("--port", type=int, required=True)
    mdns.add_argument("--fingerprint", required=True)
    mdns.add_argument("--address", action="append", required=True)
    args = parser.parse_args()
    runner = {"node": run_node, "detect": run_detect, "mdns": run_mdns}[args.mode_name]
    trio.run(runner, args)


if __name__ == "__main__":
    main()
