"""Running probes without letting them hurt the daemon: threads, timeouts, no raises.

Theory of operation
-------------------
Every probe is a blocking, synchronous object with a ``probe()`` method. The runner calls
it in a worker thread (``trio.to_thread.run_sync``) under ``trio.move_on_after(timeout)``
with ``abandon_on_cancel=True``: a probe stuck in the kernel (a wedged driver can block
NVML for minutes) is abandoned, its result synthesised as an error, and the caller goes
on. A thread cannot be killed, so each probe has its own ``CapacityLimiter(1)``: while
an abandoned call is still stuck, the next attempt for that probe waits on the limiter
and times out too (reported as "previous probe still running") instead of piling up
more stuck threads.

:class:`LocalProber` decides which probes apply to this machine:

* NVML always (it is how we learn there is no NVIDIA GPU);
* ``nvidia-smi`` only when NVML could not initialise and the tool exists;
* ``rocm-smi``/``amd-smi`` when either tool exists, ``system_profiler`` on macOS;
* the CPU probe always.

Each attempt's source and error go into :attr:`HardwareFacts.probes`, so "found nothing"
and "could not look" read differently in the record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import attrs
import trio

from ._apple import AppleProbe
from ._cpu import CpuProbe
from ._facts import CpuInfo, HardwareFacts, ProbeResult, Source
from ._nvml import NvmlProbe
from ._rocm import RocmProbe
from ._smi import NvidiaSmiProbe

T = TypeVar("T")

#: Per-probe bound. NVML answers in well under a second on a healthy machine; the
#: CLI tools take a few seconds cold. 20 s is "clearly stuck".
DEFAULT_PROBE_TIMEOUT = 20.0


class GpuProbe(Protocol):
    """The interface every GPU probe implements: a blocking call that never raises."""

    @property
    def source(self) -> Source: ...

    def probe(self) -> ProbeResult: ...


def _guarded(probe: GpuProbe) -> ProbeResult:
    try:
        return probe.probe()
    except Exception as exc:  # a bug in a probe must not become a bug in the daemon
        return ProbeResult(probe.source, error=f"probe crashed: {type(exc).__name__}: {exc}")


async def _run_in_thread(
    call: Callable[[], T],
    *,
    timeout: float,
    limiter: trio.CapacityLimiter | None,
    on_timeout: Callable[[str], T],
) -> T:
    busy = limiter is not None and limiter.borrowed_tokens >= limiter.total_tokens
    with trio.move_on_after(timeout):
        return await trio.to_thread.run_sync(call, abandon_on_cancel=True, limiter=limiter)
    detail = " (previous probe still running)" if busy else ""
    return on_timeout(f"timed out after {timeout:g}s{detail}")


async def run_probe(
    probe: GpuProbe,
    *,
    timeout: float = DEFAULT_PROBE_TIMEOUT,
    limiter: trio.CapacityLimiter | None = None,
) -> ProbeResult:
    """Run one GPU probe off the event loop, bounded by ``timeout``. Never raises
    (except ``trio.Cancelled`` when the caller is cancelled).

    Args:
        probe: the probe.
        timeout: seconds before the probe is abandoned and reported as timed out.
        limiter: one per probe, so a stuck probe cannot spawn a second stuck thread.
    """
    return await _run_in_thread(
        lambda: _guarded(probe),
        timeout=timeout,
        limiter=limiter,
        on_timeout=lambda msg: ProbeResult(probe.source, error=f"{probe.source}: {msg}"),
    )


async def run_cpu_probe(
    probe: CpuProbe,
    *,
    timeout: float = DEFAULT_PROBE_TIMEOUT,
    limiter: trio.CapacityLimiter | None = None,
) -> CpuInfo:
    """:func:`run_probe` for the CPU probe."""

    def call() -> CpuInfo:
        try:
            return probe.probe()
        except Exception as exc:
            return CpuInfo(
                source=Source.RUNNER, error=f"probe crashed: {type(exc).__name__}: {exc}"
            )

    return await _run_in_thread(
        call,
        timeout=timeout,
        limiter=limiter,
        on_timeout=lambda msg: CpuInfo(source=Source.RUNNER, error=f"cpu: {msg}"),
    )


def _nvml_unavailable(result: ProbeResult) -> bool:
    """True when NVML itself could not start (library missing, driver not loaded)."""
    return result.error is not None and result.error.startswith(
        ("nvmlInit", "nvml: timed out", "nvml: probe crashed")
    )


@attrs.define
class LocalProber:
    """Picks the probes that apply to this machine and runs them, each bounded.

    Args:
        nvml: the NVML probe (kept across calls: it holds the XID event set).
        nvidia_smi: fallback when NVML cannot initialise.
        rocm: AMD, run when its tools exist.
        apple: macOS, run when ``system_profiler`` exists.
        cpu: always run.
        timeout: per-probe bound, seconds.
    """

    nvml: GpuProbe | None = attrs.field(factory=NvmlProbe)
    nvidia_smi: GpuProbe | None = attrs.field(factory=NvidiaSmiProbe)
    rocm: GpuProbe | None = attrs.field(factory=RocmProbe)
    apple: GpuProbe | None = attrs.field(factory=AppleProbe)
    cpu: CpuProbe | None = attrs.field(factory=CpuProbe)
    timeout: float = DEFAULT_PROBE_TIMEOUT
    _limiters: dict[int, trio.CapacityLimiter] = attrs.field(factory=dict, init=False)

    def _limiter(self, probe: object) -> trio.CapacityLimiter:
        return self._limiters.setdefault(id(probe), trio.CapacityLimiter(1))

    async def _run(self, probe: GpuProbe) -> ProbeResult:
        return await run_probe(probe, timeout=self.timeout, limiter=self._limiter(probe))

    async def probe(self) -> HardwareFacts:
        """One round of every applicable probe. Never raises (except Cancelled)."""
        results: list[ProbeResult] = []
        if self.nvml is not None:
            nvml = await self._run(self.nvml)
            results.append(nvml)
            if (
                _nvml_unavailable(nvml)
                and self.nvidia_smi is not None
                and _available(self.nvidia_smi)
            ):
                results.append(await self._run(self.nvidia_smi))
        for optional in (self.rocm, self.apple):
            if optional is not None and _available(optional):
                results.append(await self._run(optional))
        cpu = CpuInfo(source=Source.RUNNER, error="cpu probe disabled")
        if self.cpu is not None:
            cpu = await run_cpu_probe(
                self.cpu, timeout=self.timeout, limiter=self._limiter(self.cpu)
            )
        return HardwareFacts.from_results(tuple(results), cpu)

    def close(self) -> None:
        """Release NVML. Call from the thread that owns the prober, after the last probe."""
        close = getattr(self.nvml, "close", None)
        if callable(close):
            close()


def _available(probe: object) -> bool:
    available = getattr(probe, "available", None)
    if not callable(available):
        return True
    try:
        return bool(available())
    except Exception:
        return False
