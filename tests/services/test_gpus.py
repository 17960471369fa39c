"""The GPU service: the `up` flags reach the monitor it builds, each report is kept and
handed on, what tasks hold reaches the monitor, and a re-probe is bounded. The monitor
is a stand-in (the probes themselves: tests/gpu/)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import populi_p2p.gpu as gpu
from populi_p2p.gpu import Allocation, build_report, format_gpu_table, report_to_dict
from populi_p2p.gpu._facts import GpuDevice, HardwareFacts, Source, Vendor
from populi_p2p.services.gpus import GPU_PROBE_WAIT_MAX, GpuService

DEVICE = GpuDevice(
    index=0, uuid="GPU-aaaa", name="H100", vendor=Vendor.NVIDIA, source=Source.NVML,
    compute_capability=(9, 0), memory_total=80 << 30, memory_used=0, memory_free=80 << 30,
)  # fmt: skip
REPORT = build_report(HardwareFacts(devices=(DEVICE,)))


class _Monitor:
    """Stands in for `GpuMonitor`: reports once when run, records updates, and probes
    until `probe_done` is set."""

    built: list[_Monitor] = []

    def __init__(self, on_change: Any, **kwargs: Any) -> None:
        self.on_change, self.kwargs = on_change, kwargs
        self.updates: list[dict[str, Any]] = []
        self.probe_done = trio.Event()
        _Monitor.built.append(self)

    async def run(self) -> None:
        await self.on_change(REPORT)
        await trio.sleep_forever()

    def update(self, **changes: Any) -> None:
        self.updates.append(changes)

    async def probe_now(self) -> None:
        await self.probe_done.wait()


@pytest.fixture
def monitor(monkeypatch: pytest.MonkeyPatch) -> type[_Monitor]:
    _Monitor.built = []
    monkeypatch.setattr(gpu, "GpuMonitor", _Monitor)
    return _Monitor


def _service(handed: list[Any]) -> GpuService:
    async def on_report(report: Any) -> None:
        handed.append(report)

    return GpuService(
        on_report, reserve_vram=2 << 30, withheld=["1", "GPU-bbbb"], labels={"zone": "a"},
        declared=["2xA100:80GiB"], interval=30.0,
    )  # fmt: skip


async def test_before_the_first_probe_it_says_so_and_commands_wait() -> None:
    service = _service([])
    assert service.gpus() == {"table": "GPU probe has not finished yet", "report": None}
    service.allocate([("GPU-aaaa", 1 << 30)])  # no monitor yet: nothing to tell
    assert await service.probe_now() == service.gpus()
    assert not service.ready.is_set()


async def test_the_flags_reach_the_monitor_and_reports_are_kept_and_handed_on(
    monitor: type[_Monitor],
) -> None:
    handed: list[Any] = []
    service = _service(handed)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await service.ready.wait()
        (built,) = monitor.built
        policy = built.kwargs["policy"]
        assert policy.reserve_vram == 2 << 30 and policy.withheld == frozenset({"1", "GPU-bbbb"})
        assert built.kwargs["labels"] == {"zone": "a"} and built.kwargs["interval"] == 30.0
        assert built.kwargs["declared"] == gpu.parse_declared(["2xA100:80GiB"])
        assert handed == [REPORT] and service.report is REPORT
        assert service.gpus() == {
            "table": format_gpu_table(REPORT), "report": report_to_dict(REPORT),
        }  # fmt: skip
        service.allocate([("GPU-aaaa", 1 << 30)])
        assert built.updates == [{"allocations": [Allocation("GPU-aaaa", 1 << 30)]}]
        nursery.cancel_scope.cancel()


async def test_a_reprobe_is_bounded(
    monitor: type[_Monitor], autojump_clock: trio.testing.MockClock
) -> None:
    service = _service([])
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        (built,) = monitor.built
        start = trio.current_time()
        assert (await service.probe_now())["report"] is not None  # a probe that hangs
        assert trio.current_time() - start == GPU_PROBE_WAIT_MAX
        built.probe_done.set()
        start = trio.current_time()
        await service.probe_now()
        assert trio.current_time() == start  # a probe that answers is waited for only
        nursery.cancel_scope.cancel()
