"""Layer C: operator labels and declared GPUs. Policy, never capacity.

Theory of operation
-------------------
``--label key=value`` tags a node for affinity, pools, regions and cost tiers.
``--advertise-gpu 2xA100:80GiB`` lets an operator say what a machine has when no probe
can see it (a GPU behind a driver we cannot load, a node being set up). ADR 018 is clear
that neither may invent capacity: declared GPUs travel in the record's Layer C section,
marked ``"declared"``, and :func:`compute_capacity` never reads them. The scheduler may
use them to *prefer* or *restrict* candidates, never to place work.

Everything here validates strictly and fails with one ``ValueError`` line naming the bad
input, because these strings come from a command line or a config file written by hand.
The bounds (63-character keys and values, 32 labels, 8 declared entries) keep the signed
NodeRecord inside its 4 KiB of member metadata.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

from ._facts import MIB

MAX_LABELS = 32
MAX_DECLARED = 8
MAX_LABEL_PART = 63
MAX_MODEL = 48
MAX_DECLARED_COUNT = 64

_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?"
_KEY_RE = re.compile(rf"(?:(?P<prefix>{_PREFIX})/)?(?P<name>{_NAME})")
_VALUE_RE = re.compile(rf"(?:{_NAME})?")
_SIZE_RE = re.compile(r"\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]i?B?|B)?\s*", re.IGNORECASE)
_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024, "ki": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2, "mi": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "gi": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4, "ti": 1024**4,
}  # fmt: skip
_DECLARED_RE = re.compile(
    r"\s*(?:(?P<count>\d+)\s*[x\u00d7*]\s*)?(?P<model>[^:]+?)\s*(?::\s*(?P<mem>[^:]+))?\s*"
)


def parse_size(text: str) -> int:
    """Parse a byte size: ``"24GiB"``, ``"512MB"``, ``"1.5G"``, ``"1048576"``.

    Decimal units (KB, MB, GB, TB; bare K, M, G, T too) are powers of 1000, binary units
    (KiB, MiB, GiB, TiB) powers of 1024, as the IEC prefixes say.

    Raises:
        ValueError: not a non-negative size with a known unit.
    """
    match = _SIZE_RE.fullmatch(text)
    if match is None:
        raise ValueError(
            f"invalid size {text!r}: expected a number with an optional unit like 512MiB or 24GB"
        )
    unit = (match["unit"] or "").lower()
    if unit not in _UNITS:
        raise ValueError(f"invalid size {text!r}: unknown unit {match['unit']!r}")
    return int(float(match["num"]) * _UNITS[unit])


def parse_label(text: str) -> tuple[str, str]:
    """Parse one ``key=value`` label.

    Keys are ``[prefix/]name``: name is 1-63 of ``A-Z a-z 0-9 - _ .`` beginning and
    ending alphanumeric; the optional prefix is a lowercase DNS-like name of at most 63.
    Values are empty or follow the name rule. (These are Kubernetes' label rules, so
    labels copy across.)

    Raises:
        ValueError: one line naming the label and what is wrong with it.
    """
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"invalid label {text!r}: expected key=value")
    match = _KEY_RE.fullmatch(key)
    if (
        match is None
        or len(match["name"]) > MAX_LABEL_PART
        or len(match["prefix"] or "") > MAX_LABEL_PART
    ):
        raise ValueError(
            f"invalid label {text!r}: key must be [prefix/]name, name 1-{MAX_LABEL_PART} chars of "
            "A-Z a-z 0-9 - _ . starting and ending alphanumeric"
        )
    if len(value) > MAX_LABEL_PART or _VALUE_RE.fullmatch(value) is None:
        raise ValueError(
            f"invalid label {text!r}: value must be empty or 1-{MAX_LABEL_PART} chars of "
            "A-Z a-z 0-9 - _ . starting and ending alphanumeric"
        )
    return key, value


def parse_labels(items: Iterable[str]) -> dict[str, str]:
    """Parse many labels (repeated ``--label`` flags or config lines), sorted by key.

    Repeating a key with the same value is allowed; with a different value it is an error,
    because silently keeping one would hide an operator's mistake.

    Raises:
        ValueError: a bad label, a conflicting duplicate, or more than 32 labels.
    """
    labels: dict[str, str] = {}
    for item in items:
        key, value = parse_label(item)
        if labels.get(key, value) != value:
            raise ValueError(f"label {key!r} given twice: {labels[key]!r} and {value!r}")
        labels[key] = value
    if len(labels) > MAX_LABELS:
        raise ValueError(f"too many labels: {len(labels)} > {MAX_LABELS}")
    return dict(sorted(labels.items()))


def _check_model(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not value or len(value) > MAX_MODEL or not value.isprintable() or value != value.strip():
        raise ValueError(f"invalid GPU model {value!r}: 1-{MAX_MODEL} printable characters")


def _check_count(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 1 <= value <= MAX_DECLARED_COUNT:
        raise ValueError(f"invalid GPU count {value!r}: 1-{MAX_DECLARED_COUNT}")


def _check_vram(
    instance: object, attribute: attrs.Attribute[int | None], value: int | None
) -> None:
    if value is not None and value < 0:
        raise ValueError(f"invalid GPU memory {value!r}: must be >= 0")


@attrs.frozen
class DeclaredGpu:
    """A GPU the operator says the node has (``--advertise-gpu``). Layer C, source
    ``declared``: shown to people and schedulers as a claim, never as capacity."""

    model: str = attrs.field(validator=_check_model)
    count: int = attrs.field(default=1, validator=_check_count)
    vram: int | None = attrs.field(default=None, validator=_check_vram)


def parse_advertise_gpu(text: str) -> DeclaredGpu:
    """Parse ``[COUNTx]MODEL[:MEMORY]``, e.g. ``A100``, ``2xRTX 4090:24GiB``, ``1*H100:80GB``.

    The count separator is ``x``, ``*`` or the multiplication sign (U+00D7).

    Raises:
        ValueError: one line naming the input and what is wrong.
    """
    match = _DECLARED_RE.fullmatch(text)
    if match is None or not match["model"].strip():
        raise ValueError(
            f"invalid --advertise-gpu {text!r}: expected [COUNTx]MODEL[:MEMORY], e.g. 2xA100:80GiB"
        )
    try:
        vram = parse_size(match["mem"]) if match["mem"] else None
        count = int(match["count"]) if match["count"] else 1
        return DeclaredGpu(model=match["model"].strip(), count=count, vram=vram)
    except ValueError as exc:
        raise ValueError(f"invalid --advertise-gpu {text!r}: {exc}") from None


def parse_declared(items: Iterable[str]) -> tuple[DeclaredGpu, ...]:
    """Parse repeated ``--advertise-gpu`` flags.

    Raises:
        ValueError: a bad entry or more than 8 entries.
    """
    declared = tuple(parse_advertise_gpu(item) for item in items)
    if len(declared) > MAX_DECLARED:
        raise ValueError(f"too many --advertise-gpu entries: {len(declared)} > {MAX_DECLARED}")
    return declared


def format_size(n: int | None) -> str:
    """``25769803776`` -> ``"24GiB"``; whole GiB when large, MiB otherwise."""
    if n is None:
        return "?"
    if n >= 1024 * MIB:
        gib = n / (1024 * MIB)
        return f"{gib:.0f}GiB" if gib >= 10 or gib == int(gib) else f"{gib:.1f}GiB"
    return f"{n // MIB}MiB"
