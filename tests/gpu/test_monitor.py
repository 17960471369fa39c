"""GpuMonitor under Trio's MockClock: emits on change only, on demand, stops cleanly."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from populi_p2p.gpu import (
    GIB,
    MIB,
    Allocation,
    CapacityReason,
    GpuDevice,
    GpuMonitor,
    GpuReport,
    HardwareFacts,
    HealthState,
    Reason,
    Source,
    Vendor,
    build_report,
    report_changed,
)

GPU = GpuDevice(
    index=0,
    uuid="GPU-a",
    name="NVIDIA L4",
    vendor=Vendor.NVIDIA,
    source=Source.NVML,
    memory_total=24 * GIB,
    memory_used=0,
    memory_free=24 * GIB,
    temperature_c=40,
    throttle_thermal=False,
)


def facts(**changes) -> HardwareFacts:
    return HardwareFacts(devices=(attrs.evolve(GPU, **changes),))


class ScriptedProber:
    """Returns the scripted facts in turn, then repeats the last."""

    def __init__(self, *script: HardwareFacts) -> None:
        self.script = list(script)
        self.calls = 0
        self.closed = False

    async def probe(self) -> HardwareFacts:
        self.calls += 1
        return self.script[min(self.calls, len(self.script)) - 1]

    def close(self) -> None:
        self.closed = True


class Harness:
    def __init__(self, prober: ScriptedProber, **kwargs) -> None:
        self.send, self.receive = trio.open_memory_channel[GpuReport](100)
        self.prober = prober
        self.monitor = GpuMonitor(self.send.send, prober=prober, **kwargs)

    def drain(self) -> list[GpuReport]:
        out = []
        while True:
            try:
                out.append(self.receive.receive_nowait())
            except trio.WouldBlock:
                return out


async def test_emits_first_report_then_only_on_change(autojump_clock):
    prober = ScriptedProber(
        facts(),
        facts(temperature_c=55),  # telemetry only: not news
        facts(memory_used=100 * MIB, memory_free=24 * GIB - 100 * MIB),  # jitter < 256 MiB
        facts(throttle_thermal=True),  # health changed: news
        facts(throttle_thermal=True, memory_used=4 * GIB, memory_free=20 * GIB),  # capacity
    )
    h = Harness(prober, interval=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.monitor.run)
        first = await h.receive.receive()
        assert first.health[0].state is HealthState.HEALTHY
        assert first.capacity.devices[0].vram == 24 * GIB
        start = trio.current_time()
        second = await h.receive.receive()
        # Two quiet probes (30 s, 60 s) produced nothing; the third did.
        assert trio.current_time() - start == pytest.approx(90.0)
        assert prober.calls == 4
        assert second.health[0].reasons == (Reason.THERMAL_THROTTLE,)
        third = await h.receive.receive()
        assert third.capacity.devices[0].vram == 20 * GIB
        await trio.sleep(300)  # ten more identical probes in virtual time
        await trio.testing.wait_all_tasks_blocked()
        assert prober.calls == 15
        assert h.drain() == []
        assert h.monitor.emits == 3
        nursery.cancel_scope.cancel()
    assert prober.closed  # the prober (NVML) is released on the way out


async def test_request_probe_reprobes_now(autojump_clock):
    prober = ScriptedProber(facts(), facts(lost=True, error="GPU is lost"))
    h = Harness(prober, interval=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.monitor.run)
        await h.receive.receive()
        start = trio.current_time()
        h.monitor.request_probe()
        report = await h.receive.receive()
        assert trio.current_time() == start  # no waiting for the interval
        assert report.health[0].state is HealthState.UNHEALTHY
        assert report.capacity.devices[0].vram == 0
        nursery.cancel_scope.cancel()


async def test_probe_now_returns_the_report_of_a_fresh_probe(autojump_clock):
    prober = ScriptedProber(facts(), facts(lost=True, error="GPU is lost"))
    h = Harness(prober, interval=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.monitor.run)
        await h.receive.receive()
        start = trio.current_time()
        report = await h.monitor.probe_now()
        assert trio.current_time() == start
        assert prober.calls == 2
        assert report.health[0].state is HealthState.UNHEALTHY
        assert report.capacity.devices[0].vram == 0
        # on_change had the new report before probe_now returned.
        assert h.drain() == [report]
        nursery.cancel_scope.cancel()


async def test_probe_now_during_a_probe_waits_for_the_next_round(autojump_clock):
    class GatedProber(ScriptedProber):
        def __init__(self, *script: HardwareFacts) -> None:
            super().__init__(*script)
            self.in_probe = trio.Event()
            self.gate = trio.Event()

        async def probe(self) -> HardwareFacts:
            if self.calls == 1:  # the second probe (an interval one) hangs until let go
                self.in_probe.set()
                await self.gate.wait()
            return await super().probe()

    prober = GatedProber(facts(), facts(temperature_c=50), facts(lost=True, error="lost"))
    h = Harness(prober, interval=30.0)
    results: list[GpuReport] = []

    async def ask() -> None:
        results.append(await h.monitor.probe_now())

    async with trio.open_nursery() as nursery:
        await nursery.start(h.monitor.run)
        await prober.in_probe.wait()  # the interval probe has started
        nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        prober.gate.set()
        while not results:
            await trio.sleep(1)
        # Not the round that was already running (its facts may predate the request).
        assert prober.calls == 3
        assert results[0].health[0].state is HealthState.UNHEALTHY
        nursery.cancel_scope.cancel()


async def test_update_reevaluates_without_probing(autojump_clock):
    prober = ScriptedProber(facts())
    h = Harness(prober, interval=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.monitor.run)
        await h.receive.receive()
        h.monitor.update(allocations=[Allocation("GPU-a", 10 * GIB)])
        leased = await h.receive.receive()
        assert leased.capacity.devices[0].vram == 14 * GIB
        assert CapacityReason.LEASED in leased.capacity.devices[0].reasons
        h.monitor.update(error_rates={"GPU-a": 0.2})
        bad = await h.receive.receive()
        assert Reason.ERROR_RATE in bad.health[0].reasons
        assert bad.capacity.devices[0].vram == 0
        h.monitor.update(labels={"region": "eu"})
        labelled = await h.receive.receive()
        assert labelled.label_dict == {"region": "eu"}
        assert prober.calls == 1  # all of that without touching the hardware
        nursery.cancel_scope.cancel()


async def test_three_throttle_events_in_24h_disqualify(autojump_clock):
    on, off = facts(throttle_thermal=True), facts()
    prober = ScriptedProber(off, on, off, on, off, on)
    h = Harness(prober, interval=60.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.monitor.run)
        while True:
            report = await h.receive.receive()
            if Reason.REPEATED_THROTTLE in report.health[0].reasons:
                break
        assert prober.calls == 6
        assert report.capacity.devices[0].vram == 0
        assert report.capacity.devices[0].reasons == (CapacityReason.DISQUALIFIED,)
        assert h.monitor.history.count("GPU-a", trio.current_time()) == 3
        nursery.cancel_scope.cancel()


async def test_cancel_while_waiting_and_while_probing(autojump_clock):
    class SlowProber(ScriptedProber):
        async def probe(self) -> HardwareFacts:
            if self.calls >= 1:
                await trio.sleep_forever()  # a probe stuck in its thread
            return await super().probe()

    prober = SlowProber(facts())
    h = Harness(prober, interval=30.0)
    with trio.move_on_after(100) as scope:
        async with trio.open_nursery() as nursery:
            await nursery.start(h.monitor.run)
    assert scope.cancelled_caught
    assert prober.calls == 1
    # Cancelled mid-probe: NVML is not shut down under a thread that may still use it.
    assert not prober.closed


def test_interval_validation():
    with pytest.raises(ValueError, match="interval"):
        GpuMonitor(lambda r: trio.sleep(0), prober=ScriptedProber(facts()), interval=0)


def test_report_changed_tolerance():
    base = build_report(facts())
    small = build_report(facts(memory_used=255 * MIB, memory_free=24 * GIB - 255 * MIB))
    big = build_report(facts(memory_used=256 * MIB, memory_free=24 * GIB - 256 * MIB))
    full = build_report(facts(memory_used=24 * GIB, memory_free=0))
    assert report_changed(None, base)
    assert not report_changed(base, small, 256 * MIB)
    assert report_changed(base, big, 256 * MIB)
    assert report_changed(base, small, 0)
    # Reaching zero is always news, however small the step.
    almost = build_report(facts(memory_used=24 * GIB - MIB, memory_free=MIB))
    assert report_changed(almost, full, 256 * MIB)


async def test_crashing_prober_offers_nothing_and_is_counted(autojump_clock):
    class Crashing(ScriptedProber):
        async def probe(self) -> HardwareFacts:
            await super().probe()
            if self.calls > 1:
                raise RuntimeError("driver exploded")
            return facts()

    h = Harness(Crashing(facts()), interval=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.monitor.run)
        assert (await h.receive.receive()).capacity.vram_total == 24 * GIB
        crashed = await h.receive.receive()
        assert crashed.capacity.vram_total == 0
        assert crashed.facts.probes[0].error == "prober crashed: RuntimeError: driver exploded"
        stats = h.monitor.statistics()
        assert (stats.probes, stats.emits, stats.probe_errors) == (2, 2, 1)
        nursery.cancel_scope.cancel()
