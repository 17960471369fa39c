"""The probe runner: threads, timeouts, crashes, and which probes LocalProber runs."""

from __future__ import annotations

import threading

import pytest
import trio

from populi_p2p.gpu import GpuDevice, LocalProber, ProbeResult, Source, Vendor, run_probe
from populi_p2p.gpu._runner import run_cpu_probe


class HangingProbe:
    """Blocks in its thread until released, like NVML on a wedged driver."""

    source = Source.NVML

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def probe(self) -> ProbeResult:
        self.calls += 1
        self.release.wait(60)
        return ProbeResult(Source.NVML)


class CrashingProbe:
    source = Source.ROCM_SMI

    def probe(self) -> ProbeResult:
        raise RuntimeError("boom")


class StaticProbe:
    def __init__(self, source: Source, result: ProbeResult, available: bool = True) -> None:
        self.source = source
        self.result = result
        self._available = available
        self.calls = 0

    def available(self) -> bool:
        return self._available

    def probe(self) -> ProbeResult:
        self.calls += 1
        return self.result


@pytest.fixture
def hanging():
    probe = HangingProbe()
    yield probe
    probe.release.set()  # let the abandoned thread finish


async def test_hanging_probe_is_cut_off_and_reported(hanging, autojump_clock):
    limiter = trio.CapacityLimiter(1)
    start = trio.current_time()
    result = await run_probe(hanging, timeout=5.0, limiter=limiter)
    assert trio.current_time() - start == pytest.approx(5.0)
    assert result.source is Source.NVML
    assert result.error == "nvml: timed out after 5s"
    assert result.devices == ()
    # The stuck thread still holds the limiter: the next attempt does not start a second
    # stuck thread, it times out waiting and says why.
    again = await run_probe(hanging, timeout=5.0, limiter=limiter)
    assert again.error == "nvml: timed out after 5s (previous probe still running)"
    assert limiter.borrowed_tokens == 1  # still only the first, abandoned, thread
    assert hanging.calls <= 1


async def test_crashing_probe_is_reported_not_raised():
    result = await run_probe(CrashingProbe(), timeout=5.0)
    assert result.source is Source.ROCM_SMI
    assert result.error == "probe crashed: RuntimeError: boom"


async def test_crashing_cpu_probe_is_reported_not_raised():
    class Broken:
        def probe(self):
            raise OSError("no /proc")

    cpu = await run_cpu_probe(Broken(), timeout=5.0)  # type: ignore[arg-type]
    assert cpu.error == "probe crashed: OSError: no /proc"


GPU = GpuDevice(0, "GPU-x", "NVIDIA L4", Vendor.NVIDIA, Source.NVML, memory_total=1)


async def test_prober_skips_nvidia_smi_when_nvml_works():
    nvml = StaticProbe(Source.NVML, ProbeResult(Source.NVML, (GPU,), "550.1", "12.4"))
    smi = StaticProbe(Source.NVIDIA_SMI, ProbeResult(Source.NVIDIA_SMI))
    rocm = StaticProbe(Source.ROCM_SMI, ProbeResult(Source.ROCM_SMI), available=False)
    facts = await LocalProber(nvml=nvml, nvidia_smi=smi, rocm=rocm, apple=None).probe()
    assert smi.calls == 0 and rocm.calls == 0
    assert facts.devices == (GPU,)
    assert facts.driver_version == "550.1" and facts.cuda_driver_version == "12.4"
    assert [p.source for p in facts.probes] == [Source.NVML]


async def test_prober_falls_back_only_when_nvml_cannot_start():
    failed = ProbeResult(Source.NVML, error="nvmlInit: Driver Not Loaded")
    nvml = StaticProbe(Source.NVML, failed)
    smi = StaticProbe(Source.NVIDIA_SMI, ProbeResult(Source.NVIDIA_SMI, (GPU,)))
    facts = await LocalProber(nvml=nvml, nvidia_smi=smi, rocm=None, apple=None).probe()
    assert smi.calls == 1
    assert [(p.source, p.error) for p in facts.probes] == [
        (Source.NVML, "nvmlInit: Driver Not Loaded"),
        (Source.NVIDIA_SMI, None),
    ]
    # NVML started but found nothing: trust it, no fallback.
    empty = StaticProbe(Source.NVML, ProbeResult(Source.NVML))
    smi.calls = 0
    await LocalProber(nvml=empty, nvidia_smi=smi, rocm=None, apple=None).probe()
    assert smi.calls == 0


async def test_prober_runs_amd_and_merges_devices():
    amd_gpu = GpuDevice(0, "AMD-1", "MI300X", Vendor.AMD, Source.ROCM_SMI)
    nvml = StaticProbe(Source.NVML, ProbeResult(Source.NVML, (GPU,)))
    rocm = StaticProbe(Source.ROCM_SMI, ProbeResult(Source.ROCM_SMI, (amd_gpu,), "6.7.0"))
    facts = await LocalProber(nvml=nvml, nvidia_smi=None, rocm=rocm, apple=None).probe()
    assert facts.devices == (GPU, amd_gpu)
    assert facts.driver_version == "6.7.0"
    assert [p.devices for p in facts.probes] == [1, 1]
