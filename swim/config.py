"""`SwimConfig`: every knob of the membership protocol, with presets.

One frozen attrs class, so a config can be shared between cores, hashed, compared and
tweaked with `attrs.evolve`. Durations are seconds as float. Each bound is named with
the qualifier last (`probe_timeout`, `meta_size_max`). The presets copy memberlist's
`DefaultLANConfig`, `DefaultWANConfig` and `DefaultLocalConfig`, whose values come from
years of production use; the comments say why each differs.
"""

from __future__ import annotations

from typing import Any

import attrs


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"SwimConfig.{attribute.name} must be > 0, got {value!r}")


def _non_negative(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value >= 0:
        raise ValueError(f"SwimConfig.{attribute.name} must be >= 0, got {value!r}")


def _at_least_one(instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if value < 1:
        raise ValueError(f"SwimConfig.{attribute.name} must be >= 1, got {value!r}")


@attrs.frozen
class SwimConfig:
    """Configuration of one `Membership`.

    The defaults are the LAN preset. Use `SwimConfig.lan()`, `.wan()` or `.local()`,
    and `attrs.evolve(config, field=value)` to change single fields.
    """

    #: Time between two probes of this node (one protocol period, SWIM section 3).
    #: Detection time is about e/(e-1) periods; shorter periods detect sooner but cost
    #: one ping+ack per member per period. Scaled by the awareness score + 1.
    probe_interval: float = attrs.field(default=1.0, validator=_positive)
    #: How long to wait for a direct ack before asking `indirect_checks` members to
    #: probe for us. Should exceed the 99th percentile round-trip time; too short sends
    #: needless indirect probes, too long delays them. Scaled by awareness score + 1.
    probe_timeout: float = attrs.field(default=0.5, validator=_positive)
    #: Members asked to ping a target that missed its direct ack (SWIM's k). More
    #: helpers tolerate more packet loss on paths other than our own, at k+1 messages.
    indirect_checks: int = attrs.field(default=3, validator=_non_negative)
    #: Suspicion timeout minimum = `suspicion_mult * log10(max(n,1)+1) * probe_interval`.
    #: Higher gives a suspect more time to refute (fewer false positives), at slower
    #: detection. K, the expected confirmations, is `suspicion_mult - 2`.
    suspicion_mult: int = attrs.field(default=4, validator=_at_least_one)
    #: Lifeguard: the suspicion timeout starts at `suspicion_max_mult * minimum` and
    #: falls towards the minimum as independent confirmations arrive.
    suspicion_max_mult: int = attrs.field(default=6, validator=_at_least_one)
    #: Each update is piggybacked `retransmit_mult * ceil(log10(n+1))` times. Higher
    #: spreads more reliably under loss, at more bytes per update.
    retransmit_mult: int = attrs.field(default=4, validator=_at_least_one)
    #: Time between gossip rounds, which push queued updates to `gossip_nodes` random
    #: members when there is something to send. Faster spreads sooner, more packets.
    gossip_interval: float = attrs.field(default=0.2, validator=_positive)
    #: Members a gossip round sends to (the fan-out of the epidemic).
    gossip_nodes: int = attrs.field(default=3, validator=_non_negative)
    #: Dead and left members are remembered this long, so a late rumor about them
    #: cannot bring them back, and gossip still reaches them (they may be alive behind
    #: a partition and need to refute); then they are reaped and forgotten.
    dead_retention: float = attrs.field(default=30.0, validator=_positive)
    #: Full-state anti-entropy exchange with one random member every this many seconds
    #: (scaled up by log2(n/32) above 32 members); 0 disables. Repairs whatever gossip
    #: missed, e.g. after a partition, at O(n) bytes per exchange.
    push_pull_interval: float = attrs.field(default=30.0, validator=_non_negative)
    #: After a join is answered, one state exchange with a random member this much
    #: later (0: none; nothing either while push-pull is off). A join's answer is the
    #: seed's view when it answered: a member whose record the seed was still pulling,
    #: or that started meanwhile, reaches us only by gossip, from members that may not
    #: know us yet, and its rumor stops being sent after `retransmit_mult` rounds. In
    #: a start storm such pairs waited for the periodic push-pull (9 to 20 s after the
    #: last daemon was up, at 50 daemons). Longer: the partner has heard more of what
    #: was in flight; shorter: a straggler waits less. One exchange per join.
    join_sync_delay: float = attrs.field(default=2.0, validator=_non_negative)
    #: Lifeguard's S: the awareness score ranges over 0..S-1 and multiplies probe
    #: interval and timeout by score + 1, so a struggling node slows itself down.
    awareness_max_multiplier: int = attrs.field(default=8, validator=_at_least_one)
    #: Largest datagram the core emits: normal gossip fits in this many bytes as one
    #: compound packet; a single message larger than this goes out as a reliable send.
    #: 1400 leaves room for IP, UDP and WireGuard headers under a 1500-byte MTU.
    packet_budget: int = attrs.field(default=1400)
    #: Largest per-member metadata payload, bytes. Larger metadata is refused locally
    #: and dropped (and counted) when received.
    meta_size_max: int = attrs.field(default=4096, validator=_non_negative)
    #: Bound on queued broadcasts; beyond it the most-transmitted (then oldest) are
    #: evicted, and push-pull repairs what they would have told.
    broadcast_queue_max: int = attrs.field(default=16384, validator=_at_least_one)
    #: Bound on reaped members whose last incarnation we still remember, so that a stale
    #: rumor arriving after `dead_retention` cannot bring a member back at an older
    #: incarnation (the oldest entries are forgotten first). A member that really
    #: restarted with a lower incarnation is told it is dead and refutes above it.
    reaped_memory_max: int = attrs.field(default=16384, validator=_at_least_one)
    #: Bound on indirect probes we run for other members at once; requests beyond it
    #: are dropped and counted (the requester simply gets no ack from us).
    indirect_pending_max: int = attrs.field(default=1024, validator=_at_least_one)
    #: Metadata longer than this many bytes is gossiped lean: the broadcast queue
    #: carries an `AliveRef` (the metadata's 8-byte digest) instead of the `Alive`, so
    #: several times more rumors fit a datagram; a receiver lacking the metadata pulls
    #: it from the sender once (see docs/protocol.md, "Lean alive rumors"). Set it to
    #: `meta_size_max` to always gossip the full record (every peer must know the lean
    #: form, message types 11 and 12, before it is used).
    lean_alive_meta_min: int = attrs.field(default=64, validator=_non_negative)
    #: A pull not answered within this long is sent again (at most three sends, the
    #: later ones to the member itself); then it is given up and anti-entropy repairs.
    pull_timeout: float = attrs.field(default=0.5, validator=_positive)
    #: Bound on members we are pulling at once; lean rumors beyond it wait for a later
    #: copy (or a sync) and are counted in `pulls_dropped_full`.
    pull_pending_max: int = attrs.field(default=1024, validator=_at_least_one)
    #: Most names one pull asks for, and most full records one pull is answered with,
    #: whatever it asked: bounds what a flood of pulls can make us send.
    pull_names_max: int = attrs.field(default=32, validator=_at_least_one)
    #: The application channel (`Membership.broadcast_app`, `AppMessage`, the `AppState`
    #: push-pull section). Off: received application broadcasts are dropped and
    #: counted, so a driver that does not handle `AppMessage` never sees one.
    app_channel_enabled: bool = False
    #: Bound on queued application broadcasts, apart from membership rumors (which go
    #: first in every packet); beyond it the most-sent, then oldest, are evicted.
    app_broadcast_queue_max: int = attrs.field(default=1024, validator=_at_least_one)
    #: Largest application broadcast payload, bytes; the encoded message (source, key
    #: and payload) must also fit one packet. Larger ones are refused by
    #: `broadcast_app` and dropped (counted) on receipt. Bigger state goes in `AppState`.
    app_payload_size_max: int = attrs.field(default=1024, validator=_non_negative)
    #: Largest application message sent to one member (`send_app`), bytes: one that
    #: does not fit a datagram goes over a stream. Received messages are dropped
    #: (counted) above the larger of this and `app_payload_size_max`.
    app_direct_size_max: int = attrs.field(default=65536, validator=_non_negative)
    #: Largest application digest in a sync (`AppState.digest()`), bytes. A digest is
    #: sent on every anti-entropy exchange, so keep it a hash or a version vector.
    app_digest_size_max: int = attrs.field(default=256, validator=_non_negative)
    #: Largest application state section in a sync (`AppState.state_for()`), bytes;
    #: it travels reliably (TCP). Larger sections are not sent, and dropped if received.
    app_state_size_max: int = attrs.field(default=1 << 20, validator=_non_negative)
    #: After the datagram probe times out, also ask the driver for a reliable (TCP)
    #: ping, as memberlist does: tells "UDP is blocked" apart from "node is down".
    reliable_probe_enabled: bool = True
    #: Lifeguard Local Health Multiplier (awareness). Off: the score stays 0.
    awareness_enabled: bool = True
    #: Lifeguard dynamic suspicion. Off: every suspicion lasts the fixed minimum, as in
    #: SWIM, and confirmations change nothing.
    dynamic_suspicion_enabled: bool = True
    #: Lifeguard buddy system: a probe of a suspect member carries the suspicion first,
    #: so the suspect learns of it directly and can refute at once.
    buddy_enabled: bool = True
    #: Lifeguard nacks: indirect probers report "no ack from the target", so a failed
    #: probe raises our awareness only by the nacks that did not come back.
    nack_enabled: bool = True
    #: Stall guard (populi's addition to Lifeguard; docs/protocol.md, "Stalls"): when a
    #: tick comes more than `stall_threshold` after the earliest deadline it was due
    #: for, this node was starved (no CPU, a long GC pause) and its own lateness, not
    #: the members', is why answers are missing. Such a tick raises awareness by one, a
    #: probe round that ends in it gets the stall once more instead of failing, and a
    #: suspicion that expires in it is pushed back by the stall (at most its minimum
    #: timeout in all). Off: timers act whenever the driver gets to run them.
    stall_guard_enabled: bool = True
    #: Lateness of a tick, seconds after its earliest due deadline, above which the
    #: node counts as stalled. A healthy event loop is milliseconds late; too low
    #: treats scheduling noise as a stall (costing an awareness point and delaying
    #: verdicts by that lateness), too high misses stalls that eat an ack's time.
    stall_threshold: float = attrs.field(default=0.25, validator=_positive)
    #: Run `Membership._check_invariants()` at the end of every call (tests, simulation).
    check_invariants: bool = False

    def __attrs_post_init__(self) -> None:
        if self.probe_timeout >= self.probe_interval:
            raise ValueError(
                "SwimConfig.probe_timeout must be shorter than probe_interval "
                f"({self.probe_timeout!r} >= {self.probe_interval!r})"
            )
        if self.packet_budget < 128:
            raise ValueError(f"SwimConfig.packet_budget must be >= 128, got {self.packet_budget}")

    @property
    def lifeguard(self) -> bool:
        """True when all four Lifeguard mechanisms are on."""
        return (
            self.awareness_enabled
            and self.dynamic_suspicion_enabled
            and self.buddy_enabled
            and self.nack_enabled
        )

    def with_lifeguard(self, enabled: bool) -> SwimConfig:
        """This config with every Lifeguard mechanism switched on or off together.

        Off gives the SWIM baseline the Lifeguard paper compares against; the stall
        guard, our extension of local health, goes with them.
        """
        return attrs.evolve(
            self,
            awareness_enabled=enabled,
            dynamic_suspicion_enabled=enabled,
            buddy_enabled=enabled,
            nack_enabled=enabled,
            stall_guard_enabled=enabled,
        )

    @classmethod
    def lan(cls) -> SwimConfig:
        """memberlist's DefaultLANConfig: a data-center or home LAN."""
        return cls(
            probe_interval=1.0,  # failure check every second
            probe_timeout=0.5,  # generous LAN round trip, half a period
            indirect_checks=3,  # three helpers ride out loss on any single path
            suspicion_mult=4,  # 4 * log10(n+1) periods of minimum suspicion
            suspicion_max_mult=6,  # Lifeguard starts 6x higher; ~120 s at 10k members
            retransmit_mult=4,  # 4 * ceil(log10(n+1)) transmissions per update
            gossip_interval=0.2,  # gossip faster than probing to spread updates
            gossip_nodes=3,  # fan-out of three per gossip round
            dead_retention=30.0,  # same as push-pull: one exchange to hear the news
            push_pull_interval=30.0,  # low-frequency full-state repair
            join_sync_delay=2.0,  # ten gossip rounds: what was in flight has spread
            awareness_max_multiplier=8,  # probe interval backs off to at most 8 s
            pull_timeout=0.5,  # as the probe timeout: a LAN round trip, generously
            stall_threshold=0.25,  # half a probe timeout: a stall that eats half an ack's time
        )

    @classmethod
    def wan(cls) -> SwimConfig:
        """memberlist's DefaultWANConfig: members across the Internet or an overlay."""
        return cls(
            probe_interval=5.0,  # round trips of 100+ ms and costly traffic: probe less
            probe_timeout=3.0,  # long-haul paths have high and variable latency
            indirect_checks=3,  # as LAN
            suspicion_mult=6,  # longer suspicion: refutes travel further and slower
            suspicion_max_mult=6,  # as LAN
            retransmit_mult=4,  # as LAN
            gossip_interval=0.5,  # gossip less often ...
            gossip_nodes=4,  # ... but to one more member per round
            dead_retention=60.0,  # slower gossip: remember the dead longer
            push_pull_interval=60.0,  # full-state exchange is expensive across the WAN
            join_sync_delay=5.0,  # ten gossip rounds, as LAN
            awareness_max_multiplier=8,  # as LAN
            pull_timeout=3.0,  # as the probe timeout: long-haul round trips
            stall_threshold=1.5,  # half a probe timeout, as LAN
        )

    @classmethod
    def local(cls) -> SwimConfig:
        """memberlist's DefaultLocalConfig: every member on one host (loopback, tests)."""
        return cls(
            probe_interval=1.0,  # as LAN
            probe_timeout=0.2,  # loopback answers in microseconds
            indirect_checks=1,  # no lossy paths to route around: one helper suffices
            suspicion_mult=3,  # shorter suspicion: refutes arrive almost at once
            suspicion_max_mult=6,  # as LAN
            retransmit_mult=2,  # no loss, fewer retransmissions needed
            gossip_interval=0.1,  # cheap packets: spread fast
            gossip_nodes=3,  # as LAN
            dead_retention=15.0,  # as push-pull
            push_pull_interval=15.0,  # cheap full-state exchange
            join_sync_delay=1.0,  # ten gossip rounds, as LAN
            awareness_max_multiplier=8,  # as LAN
            pull_timeout=0.2,  # as the probe timeout: loopback
            stall_threshold=0.1,  # half a probe timeout, as LAN; one gossip interval
        )
