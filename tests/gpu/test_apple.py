"""The Apple probe: system_profiler JSON, unified memory offered as a fraction, absent off macOS."""

from __future__ import annotations

import pytest

from populi_p2p.gpu import (
    GIB,
    AppleProbe,
    Source,
    Vendor,
    build_report,
    parse_system_profiler_json,
)

from .gpu_helpers import fixture_path

########################################################################################
# Apple
########################################################################################


def test_parse_system_profiler_apple_silicon_unified():
    (gpu,) = parse_system_profiler_json(fixture_path("system_profiler_m2max.json").read_text())
    assert gpu.vendor is Vendor.APPLE and gpu.source is Source.SYSTEM_PROFILER
    assert gpu.name == "Apple M2 Max"
    assert gpu.unified_memory is True
    assert gpu.memory_total == 64 * GIB  # the machine's RAM, shared
    assert gpu.uuid == "apple-8F1A2B3C-4D5E-6F70-8192-A3B4C5D6E7F8-0"


def test_parse_system_profiler_intel_mac_discrete_amd():
    igpu, dgpu = parse_system_profiler_json(
        fixture_path("system_profiler_intel_amd.json").read_text()
    )
    assert dgpu.vendor is Vendor.AMD and dgpu.unified_memory is False
    assert dgpu.memory_total == 8 * GIB
    assert igpu.unified_memory is False


def test_apple_unified_memory_offers_a_fraction():
    from populi_p2p.gpu import HardwareFacts

    devices = parse_system_profiler_json(fixture_path("system_profiler_m2max.json").read_text())
    report = build_report(HardwareFacts(devices=devices))
    assert report.capacity.devices[0].vram == int(64 * GIB * 0.75)


def test_apple_probe_not_available_off_macos():
    import sys

    if sys.platform == "darwin":
        pytest.skip("on macOS the probe is available")
    assert AppleProbe().available() is False
