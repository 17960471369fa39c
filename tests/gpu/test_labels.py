"""Layer C: label and --advertise-gpu parsing, with one clear ValueError per bad input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from populi_p2p.gpu import (
    GIB,
    MIB,
    DeclaredGpu,
    format_size,
    parse_advertise_gpu,
    parse_declared,
    parse_label,
    parse_labels,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("region=eu-west", ("region", "eu-west")),
        ("pool=", ("pool", "")),
        ("cost.tier=spot_2", ("cost.tier", "spot_2")),
        ("example.com/team=ml", ("example.com/team", "ml")),
        ("A=B", ("A", "B")),
    ],
)
def test_parse_label_ok(text, expected):
    assert parse_label(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("region", "expected key=value"),
        ("=x", "key must be"),
        ("-bad=x", "key must be"),
        ("bad-=x", "key must be"),
        ("has space=x", "key must be"),
        ("UPPER/x=1", "key must be"),
        ("k" * 64 + "=x", "key must be"),
        ("k=bad value", "value must be"),
        ("k=-x", "value must be"),
        ("k=" + "v" * 64, "value must be"),
        ("k=a=b", "value must be"),
        ("k=\u00e9", "value must be"),
    ],
)
def test_parse_label_errors_are_one_line(text, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_label(text)
    assert "\n" not in str(info.value)
    assert repr(text)[:20] in str(info.value)  # the message names the bad input


def test_parse_labels_sorted_duplicates_and_limit():
    assert parse_labels(["z=1", "a=2", "a=2"]) == {"a": "2", "z": "1"}
    assert list(parse_labels(["z=1", "a=2"])) == ["a", "z"]
    with pytest.raises(ValueError, match="given twice"):
        parse_labels(["a=1", "a=2"])
    with pytest.raises(ValueError, match="too many labels"):
        parse_labels([f"k{i}=v" for i in range(33)])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A100", DeclaredGpu("A100")),
        ("2xRTX 4090:24GiB", DeclaredGpu("RTX 4090", 2, 24 * GIB)),
        ("1\u00d7H100:80GB", DeclaredGpu("H100", 1, 80 * 1000**3)),
        ("4*MI300X", DeclaredGpu("MI300X", 4)),
        (" 8 x L4 : 24 GiB ", DeclaredGpu("L4", 8, 24 * GIB)),
    ],
)
def test_parse_advertise_gpu(text, expected):
    assert parse_advertise_gpu(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected \\[COUNTx\\]MODEL"),
        (":24GiB", "expected \\[COUNTx\\]MODEL"),
        ("0xA100", "GPU count"),
        ("65xA100", "GPU count"),
        ("A100:lots", "invalid size"),
        ("A100:24XB", "invalid size"),
        ("M" * 49, "GPU model"),
        ("A100:1:2", "expected"),
    ],
)
def test_parse_advertise_gpu_errors(text, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_advertise_gpu(text)
    assert str(info.value).startswith("invalid --advertise-gpu")


def test_parse_declared_limit():
    assert parse_declared(["A100", "2xH100"]) == (DeclaredGpu("A100"), DeclaredGpu("H100", 2))
    with pytest.raises(ValueError, match="too many"):
        parse_declared(["A100"] * 9)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("1048576", MIB),
        ("512MiB", 512 * MIB),
        ("512MB", 512 * 10**6),
        ("1.5GiB", int(1.5 * GIB)),
        ("2g", 2 * 10**9),
        ("1TiB", 1024 * GIB),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "-1GiB", "GiB", "1 parsec", "1e9"])
def test_parse_size_errors(text):
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_format_size():
    assert format_size(None) == "?"
    assert format_size(512 * MIB) == "512MiB"
    assert format_size(25757220864) == "24GiB"  # an RTX 4090's 23.99 GiB
    assert format_size(int(1.5 * GIB)) == "1.5GiB"


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=80))
def test_label_parser_never_raises_anything_but_value_error(text):
    try:
        key, value = parse_label(text)
    except ValueError as exc:
        assert "\n" not in str(exc)
    else:
        assert f"{key}={value}" == text


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=80))
def test_advertise_parser_never_raises_anything_but_value_error(text):
    try:
        gpu = parse_advertise_gpu(text)
    except ValueError:
        return
    assert 1 <= gpu.count <= 64 and gpu.model
