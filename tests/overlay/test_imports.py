"""`overlay/` never imports `populi_p2p/` (issue 8): dependencies point one way."""

from __future__ import annotations

import ast
from pathlib import Path

import overlay
import overlay.verifier
import populi_p2p.trust.identity

OVERLAY = Path(overlay.__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_overlay_does_not_import_populi_p2p() -> None:
    files = sorted(OVERLAY.glob("*.py"))
    assert len(files) > 10  # really scanning the package
    offenders = {
        f.name: sorted(m for m in imported_modules(f) if m.split(".")[0] == "populi_p2p")
        for f in files
    }
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_the_scan_sees_an_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nfrom populi_p2p.trust.identity import NodeIdentity\n")
    assert "populi_p2p.trust.identity" in imported_modules(sample)


def test_envelope_constants_agree_with_populi_identities() -> None:
    assert overlay.verifier.NODE_ID_LENGTH == populi_p2p.trust.identity.NODE_ID_LENGTH
    assert overlay.verifier.SIGNATURE_BYTES == populi_p2p.trust.identity.SIGNATURE_BYTES
