"""`gpu._facts`: Layer A values, and how probe results merge into one node's facts."""

from __future__ import annotations

import attrs
import pytest

from populi_p2p.gpu import CpuInfo, HardwareFacts, ProbeResult, ProbeStatus, Source

from .gpu_helpers import h100


def test_a_probe_result_reports_its_status() -> None:
    found = ProbeResult(Source.NVML, devices=(h100(0), h100(1)))
    assert found.status == ProbeStatus(Source.NVML, None, 2)
    failed = ProbeResult(Source.ROCM_SMI, error="rocm-smi: not found")
    assert failed.status == ProbeStatus(Source.ROCM_SMI, "rocm-smi: not found", 0)


def test_results_merge_devices_in_order_and_the_first_driver_wins() -> None:
    cpu = CpuInfo(model="EPYC", cores_logical=8)
    results = (
        ProbeResult(Source.ROCM_SMI, error="rocm-smi: timed out after 20s"),
        ProbeResult(Source.NVML, devices=(h100(0),), driver_version="", cuda_driver_version=""),
        ProbeResult(Source.NVIDIA_SMI, devices=(h100(1, source=Source.NVIDIA_SMI),),
                    driver_version="550.54.14", cuda_driver_version="12.4"),
        ProbeResult(Source.NVML, driver_version="470.57.02", cuda_driver_version="11.4"),
    )  # fmt: skip
    facts = HardwareFacts.from_results(results, cpu)
    assert [d.index for d in facts.devices] == [0, 1]
    assert [d.source for d in facts.devices] == [Source.NVML, Source.NVIDIA_SMI]
    assert facts.driver_version == "550.54.14"  # "" is no version: the next one counts
    assert facts.cuda_driver_version == "12.4"
    assert facts.cpu is cpu
    assert facts.probes == tuple(r.status for r in results)  # failed probes kept


def test_no_results_is_no_devices_and_no_versions() -> None:
    facts = HardwareFacts.from_results((), CpuInfo())
    assert facts == HardwareFacts()


def test_facts_are_frozen_and_compare_by_value() -> None:
    """The monitor gossips only on change: equal probes must compare (and hash) equal."""
    a = HardwareFacts(devices=(h100(0),))
    b = HardwareFacts(devices=(h100(0),))
    assert a == b and hash(a) == hash(b)
    assert a != HardwareFacts(devices=(h100(0, temperature_c=90),))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        a.devices = ()  # type: ignore[misc]
