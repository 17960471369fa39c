"""`import_in_thread`: a late import runs in a worker thread, never on the Trio loop."""

from __future__ import annotations

import importlib
import sys
import threading
from types import ModuleType

import pytest

from populi_p2p.services import _lazy
from populi_p2p.services._lazy import import_in_thread


async def test_the_modules_are_imported_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    imported: list[tuple[str, int]] = []
    real = importlib.import_module

    def recording(name: str) -> ModuleType:
        imported.append((name, threading.get_ident()))
        return real(name)

    monkeypatch.setattr(_lazy.importlib, "import_module", recording)
    await import_in_thread("json", "populi_p2p.gpu")
    assert [name for name, _ in imported] == ["json", "populi_p2p.gpu"]  # in order
    assert {thread for _, thread in imported} != {threading.get_ident()}
    assert "populi_p2p.gpu" in sys.modules


async def test_a_missing_module_raises_in_the_caller() -> None:
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        await import_in_thread("populi_p2p.no_such_module")
