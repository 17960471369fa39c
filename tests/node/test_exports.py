"""The package's public surface: `populi_p2p` re-exports its pure parts, as swim does."""

from __future__ import annotations

import importlib
import subprocess
import sys

import populi_p2p

from .harness import REPO

#: Where each re-exported name lives (the module's own `__all__` lists it too).
HOMES = {
    "trust.authority": {"ClusterAuthority", "cluster_fingerprint"},
    "trust.certificate": {
        "CertificateError",
        "EnrollmentCertificate",
        "read_certificate",
        "verify_certificate",
        "write_certificate",
    },
    "config": {"ConfigError", "NodeConfig"},
    "trust.identity": {"KeyFileError", "NodeIdentity", "node_id_from_public_key"},
    "trust.record": {"Capabilities", "NodeRecord", "NodeStatus", "RecordError", "SignedNodeRecord"},
    "trust.record_book": {"RecordBook"},
    "trust.revocation": {"Revocation", "RevocationList"},
    "store": {"KnownMember", "MemberStore", "StoreError"},
}


def test_all_is_sorted_unique_and_complete() -> None:
    names = populi_p2p.__all__
    assert names == sorted(set(names))
    assert set(names) == set().union(*HOMES.values())
    for name in names:
        assert hasattr(populi_p2p, name), name


def test_every_export_is_its_modules_own_object() -> None:
    for module_name, names in HOMES.items():
        module = importlib.import_module(f"populi_p2p.{module_name}")
        for name in names:
            assert name in module.__all__, (module_name, name)
            assert getattr(populi_p2p, name) is getattr(module, name), name


def test_every_public_type_of_those_modules_is_exported() -> None:
    # A new public class in one of these modules must be exported (or deliberately not).
    for module_name in HOMES:
        module = importlib.import_module(f"populi_p2p.{module_name}")
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type):
                assert name in populi_p2p.__all__, (module_name, name)


def run_python(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_importing_the_package_is_light_and_not_circular() -> None:
    # The daemon, its API stack and the envelope are not pulled in by the package ...
    loaded = run_python(
        "import sys, populi_p2p\n"
        "print(sorted(m for m in ('populi_p2p.node', 'populi_p2p.api', 'hypercorn', 'httpx',"
        " 'overlay.auth') if m in sys.modules))"
    )
    assert loaded.strip() == "[]"
    # ... and either import order works (overlay.auth imports populi_p2p.trust.certificate).
    run_python("import overlay.auth, populi_p2p.node, populi_p2p; populi_p2p.NodeIdentity")
    run_python("import populi_p2p, populi_p2p.node, overlay.auth")
