"""GpuMonitor: keeps the node's GPU report current and says when it changed.

Theory of operation
-------------------
The daemon owns a nursery and starts ``monitor.run`` in it. The loop:

1. probes (every applicable probe, each in a thread with a timeout; see ``_runner.py``),
   feeds thermal-throttle observations into the :class:`ThrottleHistory`, and
2. builds the report (health, capacity, labels) and compares its *significant* part with
   the last one emitted; only a change calls ``on_change`` (which signs and gossips a new
   NodeRecord), then
3. sleeps until the next interval (default 30 s) or until woken.

Two ways to wake it early: :meth:`request_probe` (re-probe now, e.g. the operator ran
``populi-node gpus --probe``; :meth:`probe_now` also waits for that round's report) and
:meth:`update` (new allocations, error rates or labels: re-evaluate against the latest
facts *without* probing, so capacity drops the moment a lease starts).

What counts as significant (:func:`report_changed`): the set of devices, every health
state and reason, every device's capacity (ignoring moves smaller than
``capacity_change_min``, default 256 MiB, unless it becomes or stops being zero), probe
errors, the driver version, labels and declared GPUs. Temperature, utilization
and power are *not*: they change every probe and would turn gossip into a telemetry feed;
they matter through health (high temperature, throttling) when they cross a threshold.

Time: ``trio.current_time()`` drives both the interval and the throttle history, so
tests run it under ``MockClock(autojump_threshold=0)`` in virtual time.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from ._capacity import Allocation, CapacityPolicy
from ._facts import HardwareFacts, ProbeStatus, Source
from ._health import HealthConfig, ThrottleHistory
from ._labels import DeclaredGpu
from ._report import GpuReport, build_report
from ._runner import LocalProber

DEFAULT_INTERVAL = 30.0
DEFAULT_CAPACITY_CHANGE_MIN = 256 * 1024 * 1024


def _shape(report: GpuReport) -> tuple[Any, ...]:
    """Everything significant except capacity (compared with a tolerance). Capacity
    reasons are left out on purpose: "in use" flickers with every allocation, and the
    ones that matter (unhealthy, withheld, ...) move capacity to or from zero anyway."""
    devices = tuple(
        (
            d.uuid,
            str(d.source),
            d.lost,
            d.error,
            h.state,
            h.reasons,
            d.mig_enabled,
            tuple(m.uuid for m in d.mig_devices),
            len(c.partitions),
        )
        for d, h, c in zip(
            report.facts.devices, report.health, report.capacity.devices, strict=True
        )
    )
    probes = tuple((p.source, p.error, p.devices) for p in report.facts.probes)
    return (devices, probes, report.facts.driver_version, report.labels, report.declared)


def _amounts(report: GpuReport) -> list[int]:
    out: list[int] = []
    for c in report.capacity.devices:
        out.append(c.vram)
        out.extend(p.vram for p in c.partitions)
    return out


def report_changed(
    previous: GpuReport | None, current: GpuReport, capacity_change_min: int = 0
) -> bool:
    """Whether ``current`` differs from ``previous`` enough to re-sign the NodeRecord.

    Capacity counts as changed when any device's (or MIG partition's) amount moves by at
    least ``capacity_change_min`` bytes, or becomes zero or non-zero; smaller moves are
    allocator jitter, not news.
    """
    if previous is None or _shape(previous) != _shape(current):
        return True
    for old, new in zip(_amounts(previous), _amounts(current), strict=True):
        if (old > 0) != (new > 0) or abs(old - new) >= max(1, capacity_change_min):
            return True
    return False


@attrs.frozen
class MonitorStatistics:
    #: Probe rounds run.
    probes: int
    #: Reports handed to ``on_change`` (first one included).
    emits: int
    #: Probe attempts (per source) that reported an error.
    probe_errors: int


class GpuMonitor:
    """Re-probes on an interval and on demand; calls ``on_change`` when it matters.

    Args:
        on_change: awaited with the new report after the first evaluation and after
            every significant change. To get a channel instead, pass
            ``send_channel.send``.
        prober: runs the probes (default: a :class:`LocalProber` for this machine). Any
            object with ``async probe() -> HardwareFacts`` will do.
        interval: seconds between probes (default 30).
        health_config: thresholds and disqualification rules.
        policy: reservations and withheld devices.
        labels, declared: Layer C, carried into every report.
        capacity_change_min: capacity moves smaller than this (bytes) are not a change.
    """

    def __init__(
        self,
        on_change: Callable[[GpuReport], Awaitable[object]],
        *,
        prober: Any = None,
        interval: float = DEFAULT_INTERVAL,
        health_config: HealthConfig | None = None,
        policy: CapacityPolicy | None = None,
        labels: Mapping[str, str] | None = None,
        declared: Sequence[DeclaredGpu] = (),
        capacity_change_min: int = DEFAULT_CAPACITY_CHANGE_MIN,
    ) -> None:
        if not (interval > 0 and math.isfinite(interval)):
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        self._on_change = on_change
        self._prober = prober if prober is not None else LocalProber()
        self.interval = interval
        self.health_config = health_config or HealthConfig()
        self.policy = policy or CapacityPolicy()
        self._labels = dict(labels or {})
        self._declared = tuple(declared)
        self._allocations: tuple[Allocation, ...] = ()
        self._error_rates: dict[str, float] = {}
        self.capacity_change_min = capacity_change_min
        self.history = ThrottleHistory(self.health_config.throttle_window_s)
        self._facts: HardwareFacts | None = None
        self._latest: GpuReport | None = None
        self._emitted: GpuReport | None = None
        self._probing = False
        self._probe_requested = True
        self._wake = trio.Event()
        #: Set after the evaluation that follows the next probe round to start.
        self._next_round = trio.Event()
        self.probes = 0
        self.emits = 0
        self.probe_errors = 0

    # ------------------------------------------------------------------ inputs
    def statistics(self) -> MonitorStatistics:
        """Counters for the daemon's metrics endpoint."""
        return MonitorStatistics(self.probes, self.emits, self.probe_errors)

    @property
    def latest(self) -> GpuReport | None:
        """The most recent report (emitted or not); ``None`` before the first probe."""
        return self._latest

    def request_probe(self) -> None:
        """Re-probe now rather than at the next interval. Call from the Trio thread."""
        self._probe_requested = True
        self._wake.set()

    async def probe_now(self) -> GpuReport:
        """Re-probe now and return the report built from that probe, once ``on_change``
        (if it changed) has returned. A round already running when this is called does
        not count: its probe may have started before the request."""
        round_done = self._next_round
        self.request_probe()
        await round_done.wait()
        assert self._latest is not None
        return self._latest

    def update(
        self,
        *,
        allocations: Sequence[Allocation] | None = None,
        error_rates: Mapping[str, float] | None = None,
        labels: Mapping[str, str] | None = None,
        declared: Sequence[DeclaredGpu] | None = None,
        policy: CapacityPolicy | None = None,
    ) -> None:
        """Change a local input and re-evaluate against the latest facts, without
        probing. ``None`` leaves an input as it was."""
        if allocations is not None:
            self._allocations = tuple(allocations)
        if error_rates is not None:
            self._error_rates = dict(error_rates)
        if labels is not None:
            self._labels = dict(labels)
        if declared is not None:
            self._declared = tuple(declared)
        if policy is not None:
            self.policy = policy
        self._wake.set()

    # -------------------------------------------------------------------- loop
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled. ``task_status.started()`` fires after the first report
        has been emitted, so ``await nursery.start(monitor.run)`` returns with
        :attr:`latest` set."""
        started = False
        next_probe = trio.current_time()
        try:
            while True:
                now = trio.current_time()
                round_done: trio.Event | None = None
                if self._probe_requested or now >= next_probe or self._facts is None:
                    self._probe_requested = False
                    round_done, self._next_round = self._next_round, trio.Event()
                    await self._probe()
                    next_probe = trio.current_time() + self.interval
                await self._evaluate()
                if round_done is not None:
                    round_done.set()
                if not started:
                    started = True
                    task_status.started()
                with trio.move_on_at(next_probe):
                    await self._wake.wait()
                self._wake = trio.Event()
        finally:
            # Never shut NVML down under a probe thread that was abandoned mid-call.
            close = getattr(self._prober, "close", None)
            if callable(close) and not self._probing:
                close()

    async def _probe(self) -> None:
        self._probing = True
        try:
            facts: HardwareFacts = await self._prober.probe()
        except Exception as exc:  # LocalProber never raises; a custom prober might
            # Nothing verified this round: offer nothing rather than stale capacity.
            status = ProbeStatus(Source.RUNNER, f"prober crashed: {type(exc).__name__}: {exc}")
            facts = HardwareFacts(probes=(status,))
        self._probing = False
        now = trio.current_time()
        for device in facts.devices:
            self.history.observe(device.uuid, device.throttle_thermal, now)
        self._facts = facts
        self.probes += 1
        self.probe_errors += sum(1 for p in facts.probes if p.error is not None)

    async def _evaluate(self) -> None:
        assert self._facts is not None
        now = trio.current_time()
        report = build_report(
            self._facts,
            health_config=self.health_config,
            policy=self.policy,
            allocations=self._allocations,
            throttle_events={d.uuid: self.history.count(d.uuid, now) for d in self._facts.devices},
            error_rates=self._error_rates,
            labels=self._labels,
            declared=self._declared,
        )
        self._latest = report
        if report_changed(self._emitted, report, self.capacity_change_min):
            self._emitted = report
            self.emits += 1
            await self._on_change(report)
