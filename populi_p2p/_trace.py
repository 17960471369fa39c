"""A trace of every packet and membership event of one daemon, for finding where news waits.

Off unless ``POPULI_TRACE_DIR`` names a directory: each daemon then appends one line per
packet in, packet out, and membership event to ``<dir>/<node id>.trace``, stamped with
realtime (all daemons of one host share that clock, so lines from different daemons
line up). `benchmarks/storm_trace.py` reads the files of a start storm and says, for
each (observer, member) pair, how long each stage of the member's news took: the lean
rumor's arrival, the pull, the record's arrival, the core's event, the roster's log line.

Line format, tab-separated::

    <unix time>  in    <peer>  <reliable 0/1>  <waited>  <messages>
    <unix time>  out   <peer>  <reliable 0/1>  <bytes>   <messages>
    <unix time>  ev    <kind>  <member>        <incarnation>
    <unix time>  evd   <kind>  <member>        <incarnation>

`waited` is how long the packet sat between the socket reader and the driver, seconds.
`messages` lists what the swim packet carried, space-separated, each ``type`` or
``type:subject`` (``aliveref:<name>/<incarnation>``, ``pull:<name>,<name>``,
``pushpull:<name>/<incarnation>,...`` and ``sync:...`` with the full entries carried).
`ev` is when the core emitted an event, `evd` when the driver handed it to the node's
subscribers. Writing costs a decode per packet: a debugging aid, never on in production.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TextIO

from swim import Event, SelfRefuted
from swim.wire import (
    Alive,
    AliveRef,
    Dead,
    DecodeError,
    Left,
    Pull,
    PushPull,
    Suspect,
    Sync,
    decode_packet,
)

__all__ = ["TRACE_DIR_ENV", "PacketTrace"]

#: The environment variable that turns the trace on (a directory, created if missing).
TRACE_DIR_ENV = "POPULI_TRACE_DIR"


def _summary(payload: bytes) -> str:
    """What a swim packet carries, one word per message."""
    try:
        messages = decode_packet(payload)
    except DecodeError:
        return "undecodable"
    words = []
    for message in messages:
        kind = type(message).__name__.lower()
        if isinstance(message, Alive | AliveRef | Suspect | Dead | Left):
            words.append(f"{kind}:{message.name}/{message.incarnation}")
        elif isinstance(message, Pull):
            words.append(f"{kind}:{','.join(message.names)}")
        elif isinstance(message, PushPull | Sync):
            # The full entries it carries: each one tells the receiver of a member.
            entries = ",".join(f"{entry[0]}/{entry[2]}" for entry in message.members)
            words.append(f"{kind}:{entries}")
        else:
            words.append(kind)
    return " ".join(words)


class PacketTrace:
    """Appends the trace lines of one daemon to one file (line-buffered).

    Args:
        stream: where the lines go.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    @classmethod
    def from_environment(cls, node_id: str) -> PacketTrace | None:
        """The trace `POPULI_TRACE_DIR` asks for, or None (the default: no trace)."""
        directory = os.environ.get(TRACE_DIR_ENV)
        if not directory:
            return None
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        return cls((path / f"{node_id}.trace").open("a", buffering=1, encoding="utf-8"))

    def packet_in(
        self, source: tuple[str, int], reliable: bool, waited: float, payload: bytes
    ) -> None:
        self._line("in", _peer(source), int(reliable), f"{waited:.4f}", _summary(payload))

    def packet_out(self, destination: tuple[str, int], reliable: bool, payload: bytes) -> None:
        self._line("out", _peer(destination), int(reliable), len(payload), _summary(payload))

    def event(self, stage: str, ev: Event) -> None:
        if isinstance(ev, SelfRefuted) or not hasattr(ev, "member"):
            self._line(stage, type(ev).__name__, "-", "-")
            return
        member = ev.member
        self._line(stage, type(ev).__name__, member.name, member.incarnation)

    def _line(self, *fields: object) -> None:
        self._stream.write(f"{time.time():.6f}\t" + "\t".join(map(str, fields)) + "\n")


def _peer(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"
