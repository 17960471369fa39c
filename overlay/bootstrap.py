"""Getting into the mesh and back into it: `--bootstrap HOST:PORT`, backoff, re-joining.

A node joins through any peer it can reach: the bootstrap peers given on the command
line and the members it remembers from its last run. Until one answers it retries with
exponential backoff (1 s doubling to 60 s), so a fleet started all at once does not
hammer the first machine up, and one started before its peers joins them when they come.

A join is not done once. After a partition the node may find itself alone, or in a
minority, with its old peers declared dead. The `Bootstrapper` keeps asking the daemon
"do I need to (re)join?" and, while the answer is yes, keeps trying the known members
and the bootstrap peers again, so the two halves find each other when the network heals
without an operator.

The pieces are separate so each is testable on its own: `parse_host_port` (pure),
`Backoff` (pure, rng injected), `resolve` (Trio DNS), `Bootstrapper` (a Trio loop driven
by callbacks; its sleeps use Trio's clock, so tests run it under a `MockClock`). The
schedule and the choice of targets are `swim.RejoinPolicy`, the sans-IO policy the
simulator's driver runs too, so simulated partition-heal times describe the daemon.
"""

from __future__ import annotations

import ipaddress
import random
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence

import attrs
import trio

from overlay.base import Address, TransportError, format_address
from swim.rejoin import RejoinConfig, RejoinPolicy

#: First retry delay, seconds.
DEFAULT_BACKOFF_INITIAL = 1.0
#: Longest retry delay, seconds.
DEFAULT_BACKOFF_MAXIMUM = 60.0
#: How often a joined node asks whether it still has enough peers, seconds.
DEFAULT_CHECK_INTERVAL = 5.0
#: Bound on one DNS resolution, seconds.
DEFAULT_RESOLVE_TIMEOUT = 5.0

_LABEL_OK = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


####################################################################################
# HOST:PORT
####################################################################################


def parse_host_port(text: str, *, default_port: int | None = None) -> tuple[str, int]:
    """Parse `host:port`, `[v6]:port`, an IPv4 or hostname with a port, or (with
    `default_port`) a bare host.

    The host may be an IPv4 literal, a bracketed IPv6 literal (optionally with a
    `%zone`) or a DNS name; it is returned without brackets and not resolved.

    Raises:
        ValueError: one line saying what is wrong and what is expected.
    """
    raw = text.strip()
    hint = "expected HOST:PORT, e.g. 10.77.0.2:7950, [fd77::2]:7950 or node1.example:7950"
    if not raw:
        raise ValueError(f"empty address; {hint}")
    port_text: str | None
    if raw.startswith("["):
        close = raw.find("]")
        if close < 0:
            raise ValueError(f"unclosed '[' in {text!r}; {hint}")
        host = raw[1:close]
        rest = raw[close + 1 :]
        if rest == "":
            port_text = None
        elif rest.startswith(":"):
            port_text = rest[1:]
        else:
            raise ValueError(f"unexpected {rest!r} after ']' in {text!r}; {hint}")
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise ValueError(f"not an IPv6 address inside brackets: {host!r}; {hint}") from None
    elif raw.count(":") > 1:
        raise ValueError(f"IPv6 addresses need brackets, e.g. {f'[{raw}]:7950'!r}; got {text!r}")
    else:
        host, sep, port_text_or_empty = raw.partition(":")
        port_text = port_text_or_empty if sep else None
        _check_host(host, text, hint)
    if port_text is None:
        if default_port is None:
            raise ValueError(f"missing port in {text!r}; {hint}")
        return host, default_port
    return host, _parse_port(port_text, text, hint)


def _check_host(host: str, text: str, hint: str) -> None:
    if not host:
        raise ValueError(f"missing host in {text!r}; {hint}")
    try:
        ipaddress.IPv4Address(host)
        return
    except ValueError:
        pass
    if all(part.isdigit() for part in host.split(".")):
        raise ValueError(f"not a valid IPv4 address: {host!r}; {hint}")
    labels = host.rstrip(".").split(".")
    if len(host) > 253 or not all(_LABEL_OK.match(label) for label in labels):
        raise ValueError(f"not a valid host name: {host!r}; {hint}")


def _parse_port(port_text: str, text: str, hint: str) -> int:
    if not port_text.isdigit():
        raise ValueError(f"port must be a number, got {port_text!r} in {text!r}; {hint}")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} out of range 1..65535 in {text!r}")
    return port


async def resolve(
    host: str, port: int, *, timeout: float = DEFAULT_RESOLVE_TIMEOUT
) -> list[Address]:
    """Numeric addresses for `host:port`, IPv4 and IPv6, in resolver order, deduplicated.

    A literal resolves to itself without a DNS query (Trio short-circuits numeric
    hosts). Names go through `trio.socket.getaddrinfo` (the system resolver, in a
    thread, bounded by `timeout`).

    Raises:
        TransportError: the name does not resolve or resolution timed out.
    """
    try:
        with trio.fail_after(timeout):
            infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except trio.TooSlowError:
        raise TransportError(f"resolving {host!r} timed out after {timeout:g} s") from None
    except OSError as exc:
        raise TransportError(f"cannot resolve {host!r}: {exc.strerror or exc}") from exc
    out: list[Address] = []
    for family, _type, _proto, _canon, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        addr = (str(sockaddr[0]), int(sockaddr[1]))
        if addr not in out:
            out.append(addr)
    return out


####################################################################################
# Backoff
####################################################################################


class Backoff:
    """Exponential retry delays: `initial`, doubling, capped at `maximum`.

    Pure: no clock, no global random. With `jitter` j in [0, 1], each delay is drawn
    uniformly from [d * (1 - j), d] with the injected `rng`, so a fleet restarted at once
    spreads its retries; the undithered schedule still bounds the wait.

    Args:
        initial: first delay, seconds.
        maximum: cap, seconds.
        factor: growth per failure.
        jitter: fraction of the delay that may be shaved off at random (0 = none).
        rng: source of jitter; required when `jitter > 0`.
    """

    def __init__(
        self,
        initial: float = DEFAULT_BACKOFF_INITIAL,
        maximum: float = DEFAULT_BACKOFF_MAXIMUM,
        *,
        factor: float = 2.0,
        jitter: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"need 0 < initial <= maximum, got {initial} and {maximum}")
        if factor < 1:
            raise ValueError(f"factor must be at least 1, got {factor}")
        if not 0 <= jitter <= 1:
            raise ValueError(f"jitter must be in [0, 1], got {jitter}")
        if jitter > 0 and rng is None:
            raise ValueError("jitter needs an injected rng (random.Random)")
        self._initial = initial
        self._maximum = maximum
        self._factor = factor
        self._jitter = jitter
        self._rng = rng
        self._current = initial

    def next_delay(self) -> float:
        """The delay before the next attempt; the one after it grows."""
        delay = self._current
        self._current = min(self._current * self._factor, self._maximum)
        if self._jitter and self._rng is not None:
            delay *= 1.0 - self._jitter * self._rng.random()
        return delay

    def reset(self) -> None:
        """Start again from `initial` (after a success)."""
        self._current = self._initial

    def policy(self, check_interval: float) -> RejoinPolicy:
        """The shared `RejoinPolicy` with this schedule (its clock starts at 0)."""
        config = RejoinConfig(
            check_interval=check_interval,
            backoff_initial=self._initial,
            backoff_max=self._maximum,
            backoff_factor=self._factor,
            jitter=self._jitter if self._rng is not None else 0.0,
        )
        return RejoinPolicy(config, self._rng or random.Random(0), 0.0)


####################################################################################
# Bootstrapper
####################################################################################

#: Tries to join through the given addresses; True when the node is now in the mesh.
TryJoin = Callable[[Sequence[Address]], Awaitable[bool]]


@attrs.frozen
class BootstrapStatistics:
    """What the bootstrapper has done, for `status` and logs.

    Attributes:
        attempts: join attempts made.
        successes: attempts after which the node was joined.
        failures: attempts that failed (callback said no or raised `TransportError`).
        resolve_failures: bootstrap names that did not resolve (each try counts).
        last_error: the last failure, one line, or None.
        next_delay: the delay before the coming retry, or None while joined.
    """

    attempts: int
    successes: int
    failures: int
    resolve_failures: int
    last_error: str | None
    next_delay: float | None


class Bootstrapper:
    """Keeps the node joined: retries `try_join` with backoff while `needs_join()` is true.

    Each round gathers candidates (`known_members()` first, they were in the mesh most
    recently, then the bootstrap peers resolved afresh, since DNS may have changed) and
    calls `try_join(candidates)`. On failure it waits the next backoff delay; on success
    it resets the backoff and goes back to checking `needs_join()` every
    `check_interval`. The daemon's `needs_join` says "I am alone, or below the size I
    expect", which is how a partition shows up, so healing needs no operator. `poke()`
    cuts a wait short (for example when mDNS finds a peer).

    Args:
        try_join: the daemon's join: sends the core's join to the candidates and reports
            whether the node is now joined. May raise `TransportError`.
        bootstrap: `--bootstrap` values (`HOST:PORT` strings or `(host, port)` tuples).
        known_members: the current or remembered members' addresses.
        needs_join: True when the node should (re)join now.
        backoff: retry schedule (1 s doubling to 60 s by default).
        check_interval: seconds between `needs_join` checks while joined.
        policy: the shared `swim.RejoinPolicy` to run instead of one built from
            `backoff` and `check_interval` (the simulator runs the same class).
        resolve_timeout: bound on resolving one bootstrap name.
        alone: True when the node sees no other live member: only then are the
            bootstrap peers tried too. A node that is in a mesh and only misses members
            it saw fail rejoins through those (a healed partition); sending its whole
            digest to live bootstrap peers every check would cost O(n^2) bytes in the
            mesh. None: always alone (the bootstrap peers are always tried).
        holds: True when the node holds the member at this address as alive or
            suspect. With it, a node that is not alone still joins a bootstrap peer it
            does not hold, a few times, backed off (`RejoinPolicy.bootstrap_targets`):
            two seeds each joined by their own joiners before they reached each other
            would otherwise stay two meshes. The addresses are those the bootstrap peers
            resolved to when the node was last alone (no DNS query while joined).
    """

    def __init__(
        self,
        try_join: TryJoin,
        *,
        bootstrap: Iterable[str | Address] = (),
        known_members: Callable[[], Iterable[Address]] = list,
        needs_join: Callable[[], bool],
        backoff: Backoff | None = None,
        check_interval: float = DEFAULT_CHECK_INTERVAL,
        resolve_timeout: float = DEFAULT_RESOLVE_TIMEOUT,
        policy: RejoinPolicy | None = None,
        alone: Callable[[], bool] | None = None,
        holds: Callable[[Address], bool] | None = None,
    ) -> None:
        if check_interval <= 0:
            raise ValueError(f"check_interval must be positive, got {check_interval}")
        self._try_join = try_join
        self._bootstrap: list[Address] = [
            parse_host_port(b) if isinstance(b, str) else (b[0], int(b[1])) for b in bootstrap
        ]
        self._known = known_members
        self._needs_join = needs_join
        self._policy = (
            policy
            if policy is not None
            else (backoff if backoff is not None else Backoff()).policy(check_interval)
        )
        self._resolve_timeout = resolve_timeout
        self._alone = alone
        self._holds = holds
        #: What the bootstrap peers resolved to when last resolved (while alone).
        self._resolved: list[Address] = []
        self._wake = trio.Event()
        self._attempts = 0
        self._successes = 0
        self._failures = 0
        self._resolve_failures = 0
        self._last_error: str | None = None
        self._next_delay: float | None = None

    @property
    def bootstrap(self) -> tuple[Address, ...]:
        """The parsed bootstrap peers (hosts unresolved)."""
        return tuple(self._bootstrap)

    @property
    def resolved(self) -> tuple[Address, ...]:
        """What the bootstrap peers resolved to when last resolved."""
        return tuple(self._resolved)

    def poke(self) -> None:
        """Retry now instead of at the end of the current wait."""
        self._wake.set()

    async def candidates(self) -> list[Address]:
        """Known members, then bootstrap peers resolved now: `RejoinPolicy.targets`
        (deduplicated, order kept, at most `targets_max`)."""
        known = [(addr[0], int(addr[1])) for addr in self._known()]
        alone = self._alone is None or self._alone()
        out: list[Address] = []
        for host, port in self._bootstrap if alone else ():
            try:
                resolved = await resolve(host, port, timeout=self._resolve_timeout)
            except TransportError as exc:
                self._resolve_failures += 1
                self._last_error = str(exc)
                continue
            out.extend(resolved)
        if alone and out:
            self._resolved = list(dict.fromkeys(out))
        # `known` is what the daemon chose: members seen failing, plus remembered ones
        # when alone (see populi_p2p); bootstrap peers only when alone.
        return self._policy.targets(known, out, alone=alone)

    def missing_bootstrap(self, now: float) -> list[Address]:
        """Bootstrap peers a node that is not alone should join again now: those it
        does not hold, as `RejoinPolicy.bootstrap_targets` paces them (`now` on the
        policy's clock). Empty without `holds`, or while alone (then every attempt
        tries all of them anyway)."""
        if self._holds is None or self._alone is None or self._alone():
            return []
        holds = self._holds
        return self._policy.bootstrap_targets(now, [a for a in self._resolved if not holds(a)])

    async def attempt(self, extra: Sequence[Address] = ()) -> bool:
        """One join attempt through the current candidates (and `extra`, bootstrap
        peers missing from the view); True when joined."""
        self._attempts += 1
        self._last_error = None
        candidates = list(dict.fromkeys([*await self.candidates(), *extra]))
        if not candidates:
            self._failures += 1
            self._last_error = self._last_error or "no known members and no bootstrap peers"
            return False
        try:
            joined = await self._try_join(candidates)
        except TransportError as exc:
            joined = False
            self._last_error = str(exc)
        if joined:
            self._successes += 1
            self._last_error = None
        else:
            self._failures += 1
            if self._last_error is None:
                shown = ", ".join(format_address(a) for a in candidates[:5])
                self._last_error = f"no answer from {shown}"
        return joined

    async def run(self) -> None:
        """Loop forever: join while needed, back off between failures. Cancel to stop."""
        policy = self._policy
        offset = trio.current_time()  # the policy's clock starts at 0
        while True:
            missing = self.missing_bootstrap(trio.current_time() - offset)
            if missing or self._needs_join():
                joined = await self.attempt(missing)
                delay = policy.on_result(trio.current_time() - offset, joined)
                self._next_delay = None if joined else delay
            else:
                policy.on_not_needed(trio.current_time() - offset)
                self._next_delay = None
            await self._wait_until(policy.next_deadline() + offset)

    async def _wait_until(self, deadline: float) -> None:
        with trio.move_on_at(deadline):
            await self._wake.wait()
        if self._wake.is_set():
            self._wake = trio.Event()

    def statistics(self) -> BootstrapStatistics:
        """A snapshot of the counters."""
        return BootstrapStatistics(
            attempts=self._attempts,
            successes=self._successes,
            failures=self._failures,
            resolve_failures=self._resolve_failures,
            last_error=self._last_error,
            next_delay=self._next_delay,
        )
