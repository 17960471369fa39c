"""Counters read from a daemon's `status --json` (the API behind it), for the attack tests."""

from __future__ import annotations

from tests.node.harness import Daemon, wait_until


def auth_drops(daemon: Daemon) -> dict[str, int]:
    """Packets refused by the envelope, by reason."""
    return {k: int(v) for k, v in daemon.status()["drops"]["auth"].items()}


def counted(daemon: Daemon) -> int:
    """Every datagram or frame this daemon dropped before the core saw it."""
    status = daemon.status()
    udp = status["transport"]["udp"]
    return (
        sum(int(v) for v in status["drops"]["auth"].values())
        + int(udp["oversize"])
        + int(udp["queue_full"])
    )


def swim_counter(daemon: Daemon, name: str) -> int:
    return int(daemon.status()["swim"][name])


def tcp_counter(daemon: Daemon, name: str) -> int:
    return int(daemon.status()["transport"]["tcp"][name])


def wait_for_drops(
    daemon: Daemon, before: dict[str, int], expect: dict[str, int], timeout: float = 15.0
) -> dict[str, int]:
    """Wait until every reason in `expect` rose by at least that much; the new table."""

    def risen() -> dict[str, int] | None:
        now = auth_drops(daemon)
        ok = all(now[reason] - before[reason] >= n for reason, n in expect.items())
        return now if ok else None

    return wait_until(risen, timeout, f"{daemon.name} to count {expect}")
