"""Checks of a scrape against Prometheus's naming conventions: prometheus-client's parser
plus the rules below, and `promtool check metrics` where promtool is installed."""

from __future__ import annotations

import re
import shutil
import subprocess

from prometheus_client.parser import text_string_to_metric_families

PROMTOOL = shutil.which("promtool")
_NAME = re.compile(r"^(populi|process)_[a-z][a-z0-9_]*$")
#: Units Prometheus says to avoid: use the base unit (seconds, bytes) instead.
_NOT_BASE_UNITS = ("_ms", "_milliseconds", "_microseconds", "_kb", "_mb", "_gb", "_kib", "_mib")
#: Labels whose values grow with the mesh or the work: never on a metric.
_UNBOUNDED_LABELS = {"task", "task_id", "model", "member"}


def naming_problems(text: str) -> list[str]:
    """Every way `text` (one scrape) breaks the conventions; [] when none."""
    problems = []
    for family in text_string_to_metric_families(text):
        name, kind = family.name, family.type
        if not _NAME.match(name):
            problems.append(f"{name}: not populi_/process_ snake case")
        if any(name.endswith(unit) or f"{unit}_" in name for unit in _NOT_BASE_UNITS):
            problems.append(f"{name}: not in base units")
        names = {s.name for s in family.samples}
        if kind == "counter" and names and names != {name + "_total"}:
            problems.append(f"{name}: counter samples {sorted(names)} lack _total")
        if kind == "gauge" and name.endswith("_total"):
            problems.append(f"{name}: a gauge named like a counter")
        if kind == "histogram":
            for part in ("_bucket", "_count", "_sum"):
                if names and name + part not in names:
                    problems.append(f"{name}: histogram without {part}")
        if kind in ("gaugehistogram", "unknown", "untyped"):
            problems.append(f"{name}: type {kind}")
        for s in family.samples:
            if "le" in s.labels and kind != "histogram":
                problems.append(f"{name}: le label outside a histogram")
            bad = _UNBOUNDED_LABELS & set(s.labels)
            if bad:
                problems.append(f"{name}: unbounded labels {sorted(bad)}")
    return problems


def promtool_problems(text: str) -> str:
    """What ``promtool check metrics`` says of `text` ("" when it finds nothing)."""
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    return "" if done.returncode == 0 else (done.stdout + done.stderr).strip()
