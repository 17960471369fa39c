"""The AMD probes: rocm-smi and amd-smi JSON, odd and invalid output, a fake tool."""

from __future__ import annotations

import pytest

from populi_p2p.gpu import (
    MIB,
    RocmProbe,
    Source,
    Vendor,
    parse_amd_smi_json,
    parse_rocm_smi_json,
)

from .gpu_helpers import fixture_path

########################################################################################
# AMD
########################################################################################


def test_parse_rocm_smi():
    devices, driver = parse_rocm_smi_json(fixture_path("rocm_smi_two.json").read_text())
    assert driver == "6.7.0"
    xtx, mi210 = devices
    assert xtx.vendor is Vendor.AMD and xtx.source is Source.ROCM_SMI
    assert xtx.name == "Radeon RX 7900 XTX"
    assert xtx.uuid == "AMD-0x5c8e4f1a2b3c4d5e"
    assert xtx.memory_total == 25753026560
    assert xtx.memory_free == 25753026560 - 3087007744
    assert xtx.temperature_c == 52  # junction preferred over edge
    assert xtx.power_draw_w == 41.0 and xtx.power_limit_w == 327.0
    assert xtx.utilization_gpu == 7 and xtx.utilization_memory == 12
    assert xtx.compute_capability is None  # not CUDA: the FP16 rule does not apply
    assert mi210.uuid == "rocm-0000:c1:00.0"  # no unique id: fall back to the bus
    assert mi210.name == "AMD Instinct MI210"
    assert mi210.power_draw_w == 42.0


def test_parse_amd_smi():
    (mi300,) = parse_amd_smi_json(
        fixture_path("amd_smi_static.json").read_text(),
        fixture_path("amd_smi_metric.json").read_text(),
    )
    assert mi300.source is Source.AMD_SMI
    assert mi300.name == "AMD Instinct MI300X"
    assert mi300.uuid == "AMD-0x1F2E3D4C5B6A7988"
    assert mi300.memory_total == 196592 * MIB
    assert mi300.memory_free == 196307 * MIB
    assert mi300.temperature_c == 44
    assert mi300.power_draw_w == 140.0


@pytest.mark.parametrize("text", ["{}", '{"card0": "nope"}', '{"system": {}}', '{"cardX": {}}'])
def test_parse_rocm_smi_empty_or_odd(text):
    devices, _ = parse_rocm_smi_json(text)
    assert devices == ()


@pytest.mark.parametrize("text", ["", "not json", "[1, 2", "[]", "3"])
def test_parse_rocm_smi_invalid_raises_value_error(text):
    with pytest.raises(ValueError):
        parse_rocm_smi_json(text)


def test_rocm_probe_bad_output_is_reported(tmp_path):
    tool = tmp_path / "rocm-smi"
    tool.write_text("#!/bin/sh\necho 'this is not json'\n")
    tool.chmod(0o755)
    result = RocmProbe(rocm_smi=str(tool), amd_smi="/nonexistent/amd-smi").probe()
    assert result.devices == ()
    assert result.error is not None and "unparseable" in result.error


def test_rocm_probe_via_fake_tool(tmp_path):
    tool = tmp_path / "rocm-smi"
    tool.write_text(f"#!/bin/sh\ncat '{fixture_path('rocm_smi_two.json')}'\n")
    tool.chmod(0o755)
    result = RocmProbe(rocm_smi=str(tool)).probe()
    assert result.error is None and len(result.devices) == 2
