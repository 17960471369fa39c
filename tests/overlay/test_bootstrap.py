"""HOST:PORT parsing, the backoff schedule, and the Bootstrapper loop under a mock clock."""

from __future__ import annotations

import ipaddress
import itertools
import random
import socket

import pytest
import trio
import trio.testing
from hypothesis import example, given, settings
from hypothesis import strategies as st

from overlay.base import TransportError
from overlay.bootstrap import Backoff, Bootstrapper, parse_host_port, resolve
from swim.rejoin import RejoinConfig


class FakeResolver(trio.abc.HostnameResolver):
    """Resolves a fixed table and nothing else, so no test query ever leaves the machine."""

    TABLE = {"gpu1.test": [("10.77.0.5", 0), ("fd77::5", 0)]}

    async def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):
        name = host.decode() if isinstance(host, bytes) else host
        if name not in self.TABLE:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        out = []
        for addr, _ in self.TABLE[name]:
            fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
            sockaddr = (addr, port, 0, 0) if fam == socket.AF_INET6 else (addr, port)
            out.append((fam, socket.SOCK_DGRAM, 17, "", sockaddr))
        return out

    async def getnameinfo(self, sockaddr, flags):
        raise NotImplementedError


@pytest.fixture
async def fake_dns() -> None:
    trio.socket.set_custom_hostname_resolver(FakeResolver())


################################################################################
# parse_host_port
################################################################################


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.77.0.2:7950", ("10.77.0.2", 7950)),
        ("[fd77::2]:7950", ("fd77::2", 7950)),
        ("[::1]:1", ("::1", 1)),
        ("[fe80::1%eth0]:7950", ("fe80::1%eth0", 7950)),
        ("node-1.example.org:65535", ("node-1.example.org", 65535)),
        ("localhost:7950", ("localhost", 7950)),
        ("  gpu7:80  ", ("gpu7", 80)),
        ("FQDN.example.:7950", ("FQDN.example.", 7950)),
    ],
)
def test_parse_host_port_accepts(text, expected) -> None:
    assert parse_host_port(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty address"),
        ("10.0.0.1", "missing port"),
        ("[fd77::1]", "missing port"),
        ("fd77::1:7950", "IPv6 addresses need brackets"),
        ("::1", "IPv6 addresses need brackets"),
        ("[fd77::1:7950", "unclosed"),
        ("[fd77::1]7950", "unexpected"),
        ("[not-v6]:7950", "not an IPv6 address"),
        ("10.0.0.1:http", "port must be a number"),
        ("10.0.0.1:", "port must be a number"),
        ("10.0.0.1:0", "out of range"),
        ("10.0.0.1:65536", "out of range"),
        (":7950", "missing host"),
        ("300.1.1.1:7950", "not a valid IPv4"),
        ("bad_name:7950", "not a valid host name"),
        ("-lead.example:7950", "not a valid host name"),
    ],
)
def test_parse_host_port_rejects_with_one_clear_line(text, message) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_host_port(text)
    assert "\n" not in str(info.value)


def test_parse_host_port_default_port() -> None:
    assert parse_host_port("gpu1", default_port=7950) == ("gpu1", 7950)
    assert parse_host_port("[fd77::1]", default_port=7950) == ("fd77::1", 7950)
    assert parse_host_port("gpu1:8000", default_port=7950) == ("gpu1", 8000)


@settings(max_examples=200, deadline=None)
@given(
    addr=st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)),
    port=st.integers(min_value=1, max_value=65535),
)
def test_parse_host_port_round_trips_formatted_literals(addr, port) -> None:
    text = f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"
    host, got_port = parse_host_port(text)
    assert ipaddress.ip_address(host) == addr and got_port == port


@settings(max_examples=300, deadline=None)
@example(":\n:")  # found by hypothesis: the message embedded the raw newline (issue 7 §6)
@example("a\r:b:\x1b")
@given(st.text(max_size=40))
def test_parse_host_port_never_raises_anything_but_value_error(text) -> None:
    try:
        parse_host_port(text)
    except ValueError as exc:
        # One printable line: what the user typed is quoted, never echoed raw.
        assert str(exc).isprintable()


async def test_resolve_literals_and_names(fake_dns) -> None:
    assert await resolve("10.77.0.2", 7950) == [("10.77.0.2", 7950)]
    assert await resolve("fd77::2", 7950) == [("fd77::2", 7950)]
    assert await resolve("gpu1.test", 7950) == [("10.77.0.5", 7950), ("fd77::5", 7950)]


async def test_resolve_failure_is_transport_error(fake_dns) -> None:
    with pytest.raises(TransportError, match=r"cannot resolve 'no-such-host\.invalid'"):
        await resolve("no-such-host.invalid", 7950)


################################################################################
# Backoff
################################################################################


def test_backoff_doubles_to_sixty_and_resets() -> None:
    b = Backoff()
    seq = [b.next_delay() for _ in range(9)]
    assert seq == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    b.reset()
    assert b.next_delay() == 1


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32), jitter=st.floats(0.01, 1.0))
def test_backoff_jitter_bounded_and_reproducible(seed, jitter) -> None:
    plain = Backoff()
    a = Backoff(jitter=jitter, rng=random.Random(seed))
    b = Backoff(jitter=jitter, rng=random.Random(seed))
    for _ in range(10):
        d = plain.next_delay()
        x = a.next_delay()
        assert d * (1 - jitter) <= x <= d
        assert x == b.next_delay()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial": 0}, "initial"),
        ({"initial": 5, "maximum": 1}, "initial"),
        ({"factor": 0.5}, "factor"),
        ({"jitter": 2.0}, "jitter"),
        ({"jitter": 0.5}, "rng"),
    ],
)
def test_backoff_rejects_bad_settings(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        Backoff(**kwargs)


################################################################################
# Bootstrapper (autojump clock: the schedule is checked in virtual seconds)
################################################################################


class FakeMesh:
    """A mesh that lets the node join only while `reachable`, recording attempt times."""

    def __init__(self) -> None:
        self.reachable = False
        self.joined = False
        self.attempts: list[tuple[float, list[tuple[str, int]]]] = []

    async def try_join(self, candidates):
        self.attempts.append((trio.current_time(), list(candidates)))
        await trio.sleep(0)
        self.joined = self.reachable
        return self.joined

    def needs_join(self) -> bool:
        return not self.joined


async def test_retries_with_backoff_until_joined(autojump_clock) -> None:
    mesh = FakeMesh()
    boot = Bootstrapper(
        mesh.try_join, bootstrap=["10.77.0.2:7950", "[fd77::3]:7950"], needs_join=mesh.needs_join
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(boot.run)
        start = trio.current_time()
        await trio.sleep(100)  # virtual: 0, 1, 3, 7, 15, 31, 63 and then +60
        assert [round(t - start) for t, _ in mesh.attempts] == [0, 1, 3, 7, 15, 31, 63]
        assert mesh.attempts[0][1] == [("10.77.0.2", 7950), ("fd77::3", 7950)]
        mesh.reachable = True
        await trio.sleep(60)
        assert mesh.joined
        stats = boot.statistics()
        assert stats.successes == 1 and stats.failures == 7 and stats.last_error is None
        nursery.cancel_scope.cancel()


async def test_rejoins_after_partition_with_known_members_first(autojump_clock) -> None:
    mesh = FakeMesh()
    mesh.reachable = True
    members = [("10.77.0.9", 7950)]
    boot = Bootstrapper(
        mesh.try_join,
        bootstrap=[("10.77.0.2", 7950)],
        known_members=lambda: members,
        needs_join=mesh.needs_join,
        check_interval=5,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(boot.run)
        await trio.sleep(1)
        assert len(mesh.attempts) == 1 and mesh.joined
        await trio.sleep(30)
        assert len(mesh.attempts) == 1  # joined: no more attempts
        # Partition: the daemon notices it is alone; the peers are unreachable for a while.
        mesh.reachable = False
        mesh.joined = False
        cut = trio.current_time()
        await trio.sleep(40)
        after_cut = [t - cut for t, _ in mesh.attempts[1:]]
        assert 0 < after_cut[0] <= 5  # noticed at the next check
        gaps = [round(b - a) for a, b in itertools.pairwise(after_cut)]
        assert gaps[:4] == [1, 2, 4, 8]
        assert mesh.attempts[-1][1] == [("10.77.0.9", 7950), ("10.77.0.2", 7950)]
        mesh.reachable = True  # heal
        await trio.sleep(60)
        assert mesh.joined
        nursery.cancel_scope.cancel()


async def test_poke_retries_at_once_and_errors_are_reported(autojump_clock) -> None:
    calls = 0
    joined = False

    async def flaky(candidates):
        nonlocal calls, joined
        calls += 1
        if calls == 1:
            raise TransportError("tcp connect to 10.77.0.2:7950 failed: Connection refused")
        joined = True  # a join that took is no longer needed (the check right after it)
        return True

    def needs_join() -> bool:
        return not joined

    boot = Bootstrapper(
        flaky, bootstrap=["10.77.0.2:7950"], needs_join=needs_join, backoff=Backoff(30, 60)
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(boot.run)
        await trio.sleep(1)
        stats = boot.statistics()
        assert stats.failures == 1 and stats.next_delay == 30
        assert stats.last_error is not None and "Connection refused" in stats.last_error
        before = trio.current_time()
        boot.poke()
        await trio.testing.wait_all_tasks_blocked()
        assert calls == 2 and trio.current_time() == before
        nursery.cancel_scope.cancel()


async def test_unresolvable_bootstrap_name_counts_and_keeps_going(fake_dns) -> None:
    seen: list[list[tuple[str, int]]] = []
    tried = trio.Event()

    async def try_join(candidates):
        seen.append(list(candidates))
        tried.set()
        return False

    boot = Bootstrapper(
        try_join,
        bootstrap=["no-such-host.invalid:7950", "gpu1.test:7950", "10.77.0.2:7950"],
        needs_join=lambda: True,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(boot.run)
        with trio.fail_after(10):
            await tried.wait()
        nursery.cancel_scope.cancel()
    assert seen[0] == [("10.77.0.5", 7950), ("fd77::5", 7950), ("10.77.0.2", 7950)]
    stats = boot.statistics()
    assert stats.resolve_failures == 1 and stats.failures == 1
    assert stats.last_error is not None and "no-such-host.invalid" in stats.last_error


def test_bootstrapper_rejects_bad_bootstrap_text() -> None:
    with pytest.raises(ValueError, match="IPv6 addresses need brackets"):
        Bootstrapper(FakeMesh().try_join, bootstrap=["fd77::1:7950"], needs_join=lambda: True)


async def test_bootstrap_peers_are_tried_only_when_alone() -> None:
    """In a mesh that misses a failed member, only that member is asked; the live
    bootstrap peers get our digest only when we are alone (no O(n^2) syncs)."""
    alone = False

    async def try_join(_candidates: list[tuple[str, int]]) -> bool:
        return False

    failed = [("10.77.0.9", 7950)]
    boot = Bootstrapper(
        try_join,
        bootstrap=[("10.77.0.2", 7950)],
        known_members=lambda: failed,
        needs_join=lambda: True,
        alone=lambda: alone,
    )
    assert await boot.candidates() == [("10.77.0.9", 7950)]
    alone = True
    assert await boot.candidates() == [("10.77.0.9", 7950), ("10.77.0.2", 7950)]


async def test_a_joined_node_joins_a_bootstrap_peer_it_does_not_hold_a_few_times(
    autojump_clock,
) -> None:
    """Joined through seed A while seed B was not yet up: B is asked again at the next
    check (not at the check right after the join: that join went to B too, whose
    answer may still come), then backed off, and never again once the node holds it
    (two seeds each joined by their own joiners otherwise stay two meshes)."""
    a, b = ("10.77.0.2", 7950), ("10.77.0.3", 7950)
    held: set[tuple[str, int]] = set()
    attempts: list[tuple[float, list[tuple[str, int]]]] = []

    async def try_join(candidates):
        attempts.append((trio.current_time(), list(candidates)))
        held.add(a)  # A answers; B does not (yet)
        return True

    boot = Bootstrapper(
        try_join,
        bootstrap=[a, b],
        needs_join=lambda: not held,
        alone=lambda: not held,
        holds=lambda address: address in held,
        check_interval=5,
        backoff=Backoff(1, 60),
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(boot.run)
        start = trio.current_time()
        await trio.sleep(21)
        assert [(round(t - start), c) for t, c in attempts] == [
            (0, [a, b]),  # alone: every bootstrap peer
            (5, [b]),  # joined, B missing: once more at the next check
            (10, [b]),  # then check_interval later,
            (20, [b]),  # then twice that: not at every check
        ]
        held.add(b)  # B came in (gossip, or that join)
        await trio.sleep(200)
        assert len(attempts) == 4
        nursery.cancel_scope.cancel()


async def test_a_bootstrap_peer_that_stays_down_gets_a_bounded_number_of_joins(
    autojump_clock,
) -> None:
    a, b = ("10.77.0.2", 7950), ("10.77.0.3", 7950)
    held: set[tuple[str, int]] = set()
    attempts: list[list[tuple[str, int]]] = []

    async def try_join(candidates):
        attempts.append(list(candidates))
        held.add(a)
        return True

    boot = Bootstrapper(
        try_join,
        bootstrap=[a, b],
        needs_join=lambda: not held,
        alone=lambda: not held,
        holds=lambda address: address in held,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(boot.run)
        await trio.sleep(3600)
        nursery.cancel_scope.cancel()
    assert attempts[1:] == [[b]] * RejoinConfig().bootstrap_retry_max
