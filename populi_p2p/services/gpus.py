"""The GPU service: runs the GPU monitor and keeps the latest report.

Events in: the monitor's reports. Commands out: each report is handed to `on_report`
(the record publisher). The probe modules are imported only when the service runs, so
a node answers its API before they load.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import trio

from ._lazy import import_in_thread

__all__ = ["GPU_PROBE_WAIT_MAX", "GpuService"]

#: Longest ``POST /v1/gpus/probe`` waits for the re-probe it asked for, seconds.
GPU_PROBE_WAIT_MAX: Final = 8.0


class GpuService:
    """Args mirror the `up` flags: `--reserve-vram`, `--withhold-gpu`, `--label`,
    `--advertise-gpu`, `--gpu-probe-interval`."""

    def __init__(
        self,
        on_report: Callable[[Any], Awaitable[None]],
        *,
        reserve_vram: Any,
        withheld: Sequence[str],
        labels: dict[str, str],
        declared: Any,
        interval: float,
    ) -> None:
        self._on_report = on_report
        self._reserve_vram = reserve_vram
        self._withheld = frozenset(withheld)
        self._labels = labels
        self._declared = declared
        self._interval = interval
        self.report: Any = None
        self.ready = trio.Event()
        self._monitor: Any = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Off the loop (pings are answered meanwhile); `gpu` itself loads lazily.
        await import_in_thread("populi_p2p.gpu._monitor", "populi_p2p.gpu._labels")
        from ..gpu import CapacityPolicy, GpuMonitor, parse_declared

        self._monitor = GpuMonitor(
            self._changed,
            policy=CapacityPolicy(reserve_vram=self._reserve_vram, withheld=self._withheld),
            labels=self._labels,
            declared=parse_declared(self._declared),
            interval=self._interval,
        )
        task_status.started()
        await self._monitor.run()

    async def _changed(self, report: Any) -> None:
        self.report = report
        self.ready.set()
        await self._on_report(report)

    def allocate(self, held: Sequence[tuple[str, int]]) -> None:
        """What running tasks hold, as (GPU uuid, VRAM bytes): Layer B shrinks by it, and
        the re-evaluated report is signed and gossiped like any change."""
        if self._monitor is None:
            return
        from ..gpu import Allocation

        self._monitor.update(allocations=[Allocation(uuid, vram) for uuid, vram in held])

    def gpus(self) -> dict[str, Any]:
        """The latest report, as a table and as the `gpus --json` form."""
        from ..gpu import format_gpu_table, report_to_dict

        if self.report is None:
            return {"table": "GPU probe has not finished yet", "report": None}
        return {"table": format_gpu_table(self.report), "report": report_to_dict(self.report)}

    async def probe_now(self) -> dict[str, Any]:
        """Re-probe now; a change has been published before this returns."""
        if self._monitor is not None:
            # Every probe is bounded by its own timeout; this is belt and braces.
            with trio.move_on_after(GPU_PROBE_WAIT_MAX):
                await self._monitor.probe_now()
        return self.gpus()
