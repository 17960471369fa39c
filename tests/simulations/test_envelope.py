"""The daemon's envelope priced per packet: fixed part always, certificate when needed."""

from __future__ import annotations

from typing import Any

import pytest

from simulations import RunResult, ScenarioError, _runner, parse_scenario, run_once
from simulations._engine import NodeStatus, Simulator
from simulations._envelope import EnvelopeModel, EnvelopeSpec
from simulations._metrics import Metrics
from swim import Event, MemberJoined, MemberRecovered

QUIET: dict[str, Any] = {
    "name": "t",
    "members": 12,
    "seed": 2,
    "duration": 20.0,
    "formation": {"mode": "prime", "settle": 1.0},
    # No stream frames: every packet is a datagram, priced by the introduction rule.
    "swim": {"push_pull_interval": 0.0, "reliable_probe_enabled": False},
}


def run(**fields: Any) -> RunResult:
    data = dict(QUIET)
    data.update(fields)
    result = run_once(parse_scenario(data))
    assert result.ok, result.failure
    return result


def test_a_settled_cluster_pays_exactly_the_fixed_envelope_per_packet() -> None:
    result = run(envelope={"base": 100, "certificate": 1000})
    m = result.measures
    assert m["messages"] > 0
    assert m["sealed_bytes"] == m["bytes"] + 100 * m["messages"]
    assert m["sealed_bytes_per_member_second"] == pytest.approx(
        m["bytes_per_member_second"] + 100 * m["messages_per_member_second"]
    )


def test_a_restarted_member_is_sent_the_certificate_again() -> None:
    faults = [{"kind": "crash", "at": 3.0, "members": [4], "restart_after": 5.0}]
    result = run(envelope={"base": 100, "certificate": 1000}, fault=faults)
    m = result.measures
    extra = m["sealed_bytes"] - m["bytes"] - 100 * m["messages"]
    # Some packets carried the certificate (to the suspect, the restarted member, and
    # from it while it introduced itself), but far from all of them.
    assert extra > 0 and extra % 1000 == 0
    assert extra // 1000 < m["messages"] // 2


def test_a_packet_addressed_to_us_ends_our_introduction_to_its_sender() -> None:
    """After a cluster forms by joining, every member introduces itself to every other;
    the daemon ends each introduction at the first packet the peer addresses to it, so
    far fewer packets carry the certificate than under the 5 s and 3 packets rule."""
    joined = {"formation": {"mode": "join", "settle": 1.0}, "duration": 30.0, "members": 20}
    sizes = {"base": 100, "certificate": 1000}
    early = run(**joined, envelope=sizes)
    late = run(**joined, envelope={**sizes, "addressed_ends": False})
    assert early.digest == late.digest  # pricing changes no packet

    def certificates(r: RunResult) -> int:
        m = r.measures
        return int((m["sealed_bytes"] - m["bytes"] - 100 * m["messages"]) // 1000)

    assert 0 < certificates(early) < certificates(late) // 2, (
        certificates(early),
        certificates(late),
    )


def test_the_sizes_are_parameters_and_the_model_can_be_switched_off() -> None:
    small = run(envelope={"base": 10, "certificate": 0})
    large = run(envelope={"base": 200, "certificate": 0})
    assert small.digest == large.digest  # pricing changes no packet
    m = small.measures
    assert large.measures["sealed_bytes"] - m["sealed_bytes"] == 190 * m["messages"]
    off = run(envelope={"enabled": False})
    assert off.measures["sealed_bytes"] is None
    assert off.measures["sealed_bytes_per_member_second"] is None


def test_default_sizes_are_the_overlays_114_and_250() -> None:
    scenario = parse_scenario({"name": "t"})
    assert scenario.envelope is not None
    assert scenario.envelope.base == 114
    assert scenario.envelope.base + scenario.envelope.certificate == 250


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"base": -1}, "base must be >= 0"),
        ({"certificate": "big"}, "certificate must be an integer"),
        ({"colour": 1}, "colour"),
    ],
)
def test_bad_envelope_tables_are_one_line_errors(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message) as info:
        parse_scenario({"name": "t", "envelope": table})
    assert "\n" not in str(info.value)


class _PlainEnvelope(EnvelopeModel):
    """The envelope rule written plainly, as it was before the per-packet fast path:
    the addressed rule, then `_certificate`; introductions through `_introduce`."""

    def on_event(self, now: float, node: int, event: Event) -> None:
        cls = event.__class__
        if cls is MemberJoined or cls is MemberRecovered:
            subject = self._index_of(event.member.name)  # type: ignore[union-attr]
            if subject is not None and subject != node:
                self._introduce(node, subject, now)
        else:
            super().on_event(now, node, event)

    def plain_overhead(self, src: int, dst: int | None, reliable: bool, t: float) -> int:
        if dst is not None and self.spec.addressed_ends:
            view = self._metrics.beliefs[src]
            if dst < len(view) and view[dst] != 0 and dst < len(self._owed):
                owed = self._owed[dst]
                if src < len(owed) and owed[src] > 0:
                    owed[src] = 0.0
                    self._until[dst][src] = -1.0
        if self._certificate(src, dst, reliable, t):
            return self.spec.base + self.spec.certificate
        return self.spec.base


class _CheckedEnvelope(EnvelopeModel):
    """The shipped model, with a plain twin fed the same events; every packet's price
    must agree."""

    def __init__(self, spec: EnvelopeSpec, sim: Simulator, metrics: Metrics) -> None:
        super().__init__(spec, sim, metrics)
        self.twin = _PlainEnvelope(spec, sim, metrics)
        self.priced = 0
        _checked.append(self)

    def on_event(self, now: float, node: int, event: Event) -> None:
        super().on_event(now, node, event)
        self.twin.on_event(now, node, event)

    def on_status(self, now: float, node: int, old: NodeStatus, new: NodeStatus) -> None:
        super().on_status(now, node, old, new)
        self.twin.on_status(now, node, old, new)

    def overhead(self, src: int, dst: int | None, reliable: bool, t: float) -> int:
        got = super().overhead(src, dst, reliable, t)
        assert got == self.twin.plain_overhead(src, dst, reliable, t), (src, dst, reliable, t)
        self.priced += 1
        return got


_checked: list[_CheckedEnvelope] = []


def test_the_per_packet_fast_path_prices_every_packet_as_the_plain_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Formation by joining (introductions, the addressed rule), a crash and restart (a
    new life), a slow member (suspicions, refutes): the inline pricing agrees with the
    plain rule on every packet."""
    monkeypatch.setattr(_runner, "EnvelopeModel", _CheckedEnvelope)
    _checked.clear()
    faults = [
        {"kind": "crash", "at": 4.0, "members": [3], "restart_after": 6.0},
        {"kind": "slow", "at": 2.0, "members": [5], "delay": 1.0, "jitter": 1.0, "duration": 15.0},
    ]
    result = run(
        formation={"mode": "join", "settle": 1.0},
        members=24,
        duration=30.0,
        envelope={"base": 100, "certificate": 1000},
        fault=faults,
    )
    (model,) = _checked
    assert model.priced == result.engine["messages_sent"] > 0  # every packet, formation too
    assert 0 < model.with_certificate < model.priced
