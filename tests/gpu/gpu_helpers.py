"""Helpers for the GPU tests: fixture paths, the fake NVML child runner.

The fake ``libnvidia-ml.so.1`` (``fake_nvml.c``) is compiled once per session with gcc
and loaded through the *real* nvidia-ml-py binding in a child process whose
``LD_LIBRARY_PATH`` points at it (pynvml opens the library by soname, and the loader reads
``LD_LIBRARY_PATH`` only at process start, hence the subprocess).
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
from hypothesis import strategies as st

import populi_p2p
from populi_p2p.gpu import (
    GIB,
    MIB,
    CpuInfo,
    GpuDevice,
    GpuReport,
    HardwareFacts,
    MigDevice,
    ProbeResult,
    ProbeStatus,
    Source,
    Vendor,
    build_report,
)

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
REPO_ROOT = Path(populi_p2p.__file__).resolve().parent.parent

#: The child: probe N times with one NvmlProbe, print every ProbeResult as JSON.
_CHILD = r"""
import json, sys, attrs
from populi_p2p.gpu import NvmlProbe
probe = NvmlProbe()
out = [attrs.asdict(probe.probe(), recurse=True) for _ in range(int(sys.argv[1]))]
probe.close()
print(json.dumps(out))
"""


def fixture_path(name: str) -> Path:
    return FIXTURES / name


def child_env(**extra: str) -> dict[str, str]:
    """A clean environment for a child Python that can import the repo."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "LD_LIBRARY"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def real_nvml_present() -> bool:
    return ctypes.util.find_library("nvidia-ml") is not None


def result_from_json(data: dict[str, Any]) -> ProbeResult:
    """Rebuild a ProbeResult from ``attrs.asdict`` output."""
    devices = []
    for d in data["devices"]:
        fields = dict(d)
        fields["vendor"] = Vendor(d["vendor"])
        fields["source"] = Source(d["source"])
        fields["compute_capability"] = (
            tuple(d["compute_capability"]) if d["compute_capability"] else None
        )
        fields["mig_devices"] = tuple(MigDevice(**m) for m in d["mig_devices"])
        fields["xids"] = tuple(d["xids"])
        devices.append(GpuDevice(**fields))
    return ProbeResult(
        Source(data["source"]),
        tuple(devices),
        data["driver_version"],
        data["cuda_driver_version"],
        data["error"],
    )


def run_nvml_child(
    lib_dir: Path, fixture: str | None, probes: int = 1, timeout: float = 30.0
) -> list[ProbeResult]:
    """Run NvmlProbe ``probes`` times in a child against the fake library."""
    extra = {"LD_LIBRARY_PATH": str(lib_dir)}
    if fixture is not None:
        extra["FAKE_NVML_FIXTURE"] = str(fixture_path(fixture))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(probes)],
        env=child_env(**extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [result_from_json(r) for r in json.loads(proc.stdout)]


########################################################################################
# Hypothesis strategies shared by the property tests
########################################################################################

_memory = st.sampled_from([8 * GIB, 24 * GIB, 48 * GIB, 80 * GIB]) | st.integers(0, 200 * GIB)


@st.composite
def mig_devices(draw: st.DrawFn, gpu: int) -> tuple[MigDevice, ...]:
    out = []
    for slot in range(draw(st.integers(0, 4))):
        total = draw(st.none() | _memory)
        free = draw(st.none() | st.integers(0, total if total is not None else 200 * GIB))
        out.append(MigDevice(slot, f"MIG-{gpu}-{slot}", total, free, slot, 0))
    return tuple(out)


@st.composite
def gpu_devices(draw: st.DrawFn, index: int) -> GpuDevice:
    total = draw(_memory | st.none())
    eighths = draw(st.sampled_from([1, 2, 4, 7, 0, 8]) | st.none())
    used = None if eighths is None else (total if total is not None else 8 * GIB) * eighths // 8
    # The driver's own reservation, as NVML's v2 memory info reports it (not in `used`).
    reserved = draw(st.sampled_from([None, None, 0, 512 << 20, 615 << 20]))
    if reserved and total is not None and (used or 0) + reserved > total:
        reserved = None
    free = None
    if total is not None and used is not None and draw(st.integers(0, 4)):
        free = total - (reserved or 0) - used  # usually known, as from NVML
    lost = draw(st.booleans()) if draw(st.integers(0, 5)) == 0 else False
    mig = draw(st.sampled_from([None, False, True]))
    return GpuDevice(
        index=index,
        uuid=f"GPU-{index}",
        name=draw(st.sampled_from(["NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB", "L4"])),
        vendor=Vendor.NVIDIA,
        source=draw(st.sampled_from([Source.NVML, Source.NVIDIA_SMI])),
        compute_capability=draw(st.none() | st.tuples(st.integers(3, 9), st.integers(0, 9))),
        memory_total=total,
        memory_used=used,
        memory_free=free,
        memory_reserved=reserved,
        unified_memory=draw(st.booleans()),
        temperature_c=draw(st.none() | st.integers(0, 110)),
        throttle_thermal=draw(st.none() | st.booleans()),
        throttle_power=draw(st.none() | st.booleans()),
        ecc_corrected=draw(st.none() | st.integers(0, 5)),
        ecc_uncorrected=draw(st.sampled_from([None, 0, 0, 0, 1])),
        mig_enabled=mig,
        mig_devices=draw(mig_devices(index)) if mig else (),
        xids=tuple(draw(st.sampled_from([(), (), (), (13,), (79,), (48, 13)]))),
        error="GPU is lost" if lost else draw(st.sampled_from([None, None, None, "probe error"])),
        lost=lost,
    )


@st.composite
def hardware_facts(draw: st.DrawFn, max_devices: int = 8) -> HardwareFacts:
    n = draw(st.integers(0, max_devices))
    return HardwareFacts(
        devices=tuple(draw(gpu_devices(i)) for i in range(n)),
        driver_version=draw(st.none() | st.sampled_from(["550.54.14", "470.57.02"])),
    )


def h100(i: int, **changes: Any) -> GpuDevice:
    """An H100 as NVML sees it, healthy, with `changes`."""
    device = GpuDevice(
        index=i,
        uuid=f"GPU-{i:08x}-aaaa-4bbb-8ccc-dddddddddddd",
        name="NVIDIA H100 80GB HBM3",
        vendor=Vendor.NVIDIA,
        source=Source.NVML,
        pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
        compute_capability=(9, 0),
        memory_total=81559 * MIB,
        memory_used=1234 * MIB,
        memory_free=(81559 - 1234) * MIB,
        utilization_gpu=97,
        utilization_memory=45,
        temperature_c=67,
        power_draw_w=612.0,
        power_limit_w=700.0,
        throttle_thermal=False,
        throttle_power=True,
        ecc_corrected=0,
        ecc_uncorrected=0,
        mig_enabled=False,
    )
    return attrs.evolve(device, **changes)


CPU = CpuInfo(
    model="AMD EPYC 9654 96-Core Processor",
    arch="x86_64",
    cores_logical=384,
    cores_physical=192,
    avx=True,
    avx2=True,
    avx512=True,
    ram_total=2048 * GIB,
)


def eight_gpu_report(**kwargs: Any) -> GpuReport:
    """The report of an 8xH100 box probed by NVML (`build_report`'s keywords pass on)."""
    facts = HardwareFacts(
        devices=tuple(h100(i) for i in range(8)),
        cpu=CPU,
        probes=(ProbeStatus(Source.NVML, None, 8),),
        driver_version="550.54.14",
        cuda_driver_version="12.4",
    )
    return build_report(facts, **kwargs)
