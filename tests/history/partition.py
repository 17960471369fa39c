"""Daemons in network namespaces, and a partition between two groups of them.

Shared by `test_partition_netns.py` and `benchmarks/ownership_bench.py --partition`.
Each daemon `dNN` of a `NetnsLab` lives in namespace NN of tests/netns/lab.py (one
bridge, no WireGuard), bound to its underlay address. A cut drops every packet between
the sides where it arrives, in both directions (an iptables rule in each namespace's
INPUT chain naming the other side's addresses), so senders see no error, as in a real
partition (an OUTPUT rule would fail their sendto with EPERM instead).

Needs root, `ip` and `iptables` (`netns_missing` says what is missing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs

from tests.node.harness import Daemon

from .scenario import Lab


def load_netns() -> ModuleType:
    """The namespace lab, tests/netns/lab.py."""
    from tests.netns import lab

    return lab


def netns_missing() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    reason: str | None = load_netns().missing_requirements(wireguard=False)
    return reason or None


@attrs.define
class NetnsLab(Lab):
    """A `Lab` whose daemon `dNN` lives in namespace NN, bound to its underlay address;
    `env` goes to every daemon's environment; `net` is tests/netns/lab.py's lab."""

    nodes: Sequence[Any] = attrs.field(kw_only=True)
    env: Mapping[str, str] = attrs.field(kw_only=True, factory=dict)
    net: Any = attrs.field(kw_only=True, default=None)  # the namespaces' lab, for cuts

    def spawn(self, name: str, *flags: str, **kwargs: Any) -> Daemon:
        node = self.nodes[int(name[1:])]
        network = ("--overlay", "none", "--bind", node.underlay)
        wrap = ("ip", "netns", "exec", node.netns)
        return self.mesh.spawn(
            name, *flags, *self.flags, network=network, wrap=wrap, env=self.env, **kwargs
        )

    def namespaces(self, daemons: Sequence[str]) -> list[Any]:
        """The namespaces of daemons named `dNN`."""
        return [self.nodes[int(d[1:])] for d in sorted(daemons)]


def drop_between(net: Any, sides: tuple[list[Any], list[Any]], action: str) -> None:
    """Add (``-I``) or remove (``-D``) the rules that drop, in each namespace of either
    side, every packet arriving from the other side."""
    side, other = sides
    for here, there in ((side, other), (other, side)):
        sources = ",".join(n.underlay for n in there)
        for node in here:
            net.exec(node, "iptables", action, "INPUT", "-s", sources, "-j", "DROP")


def process_alive(pid: int) -> bool:
    """`pid` runs (a zombie has stopped running: its parent has not reaped it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
