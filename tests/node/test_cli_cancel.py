"""Who may cancel, at the CLI and the control API (issue 18): `cluster operator` makes an
operator key; `cancel --operator-key FILE` signs a proof for that one task and sends it;
a cancel this node may not make is a 403 and one line on stderr (the backend's part:
tests/services/test_api_backend.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from populi_p2p.api import ForbiddenError, make_app, serve_api
from populi_p2p.cli import main
from populi_p2p.trust.authority import ClusterAuthority
from populi_p2p.trust.operator import OperatorKey, operator_checker

TID = "0123456789abcdef0123456789abcdef"
FORBIDDEN = (
    f"task {TID} may be cancelled only by the node that accepted it (6b1e0000) or with an"
    " operator key: run populi-node cancel on that node, or pass --operator-key FILE (made"
    " by populi-node cluster operator)"
)


def _err_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {err!r}"
    return lines[0]


class _Tasks:
    """A task backend that refuses a cancel without an operator proof, as a node that
    did not accept the task does, and keeps what it was sent."""

    def __init__(self) -> None:
        self.operators: list[object] = []

    def status(self) -> dict[str, Any]:
        return {}

    def members(self) -> list[dict[str, Any]]:
        return []

    def gpus(self) -> dict[str, Any]:
        return {}

    async def probe_gpus(self) -> dict[str, Any]:
        return {}

    def request_leave(self) -> None:
        pass

    async def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return {"id": TID, "acks": 1}

    def tasks(self) -> list[dict[str, Any]]:
        return []

    def task(self, task_id: str) -> dict[str, Any]:
        if not TID.startswith(task_id):
            raise KeyError(f"no single task matches {task_id!r}")
        return {"id": TID}

    def explain(self, task_id: str) -> dict[str, Any]:
        return {}

    async def cancel(self, task_id: str, operator: object = None) -> dict[str, Any]:
        self.operators.append(operator)
        if operator is None:
            raise ForbiddenError(FORBIDDEN)
        return {"id": TID, "cancelled": True}

    async def logs(self, task_id: str, stream: object, offset: object) -> dict[str, Any]:
        return {}

    async def drain(self, handoff: bool) -> dict[str, Any]:
        return {}

    async def undrain(self) -> dict[str, Any]:
        return {}


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_a_forbidden_cancel_is_a_403_and_one_line_and_an_operator_key_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    authority_dir = tmp_path / "authority"
    state = tmp_path / "state"
    state.mkdir()
    backend = _Tasks()
    code, out, err = await trio.to_thread.run_sync(
        _cli, capsys, "cluster", "init", "--authority-dir", str(authority_dir)
    )
    assert code == 0, err
    key_file = tmp_path / "op.key"
    code, out, err = await trio.to_thread.run_sync(
        _cli, capsys, "cluster", "operator", "--expires", "30d",
        "--authority-dir", str(authority_dir), "--out", str(key_file),
    )  # fmt: skip
    assert code == 0, err
    assert f"written to {key_file}" in out and "--operator-key" in out
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_api, make_app(backend), state / "api.sock")
        code, out, err = await trio.to_thread.run_sync(
            _cli, capsys, "cancel", "--state-dir", str(state), TID[:8]
        )
        assert (code, out) == (1, "")
        assert _err_line(err) == f"populi-node: error: {FORBIDDEN}"
        code, out, err = await trio.to_thread.run_sync(
            _cli, capsys, "cancel", "--state-dir", str(state), TID[:8],
            "--operator-key", str(key_file),
        )  # fmt: skip
        assert (code, out, err) == (0, f"cancelled {TID}\n", "")
        # A key file others may read, or one that is not a key: one line, nothing sent.
        os.chmod(key_file, 0o644)
        code, out, err = await trio.to_thread.run_sync(
            _cli, capsys, "cancel", "--state-dir", str(state), TID, "--operator-key", str(key_file)
        )
        assert code == 1 and "chmod 600" in _err_line(err)
        code, out, err = await trio.to_thread.run_sync(
            _cli, capsys, "cancel", "--state-dir", str(state), TID,
            "--operator-key", str(tmp_path / "missing.key"),
        )  # fmt: skip
        assert code == 1 and "does not exist" in _err_line(err)
        nursery.cancel_scope.cancel()
    # The proof the daemon got holds for the whole task id, under this authority, and
    # the secret key never went to the daemon.
    assert backend.operators[0] is None and len(backend.operators) == 2
    sent = backend.operators[1]
    assert isinstance(sent, dict) and set(sent) == {"certificate", "signed_at", "signature"}
    authority = ClusterAuthority.load(authority_dir)
    check = operator_checker(authority.public_key, lambda: None)
    from populi_p2p.trust.operator import proof_from_json

    proof = proof_from_json(sent)
    assert check(TID, proof, True) is None
    assert check("f" * 32, proof, True) == "the operator signature does not verify for this task"


def test_cluster_operator_needs_an_authority_and_a_good_expiry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _cli(capsys, "cluster", "operator", "--authority-dir", str(tmp_path / "no"))
    assert code == 1 and "no cluster authority" in _err_line(err)
    code, _, err = _cli(capsys, "cluster", "operator", "--expires", "soon")
    assert code == 2 and "--expires" in _err_line(err)
    assert _cli(capsys, "cluster", "init", "--authority-dir", str(tmp_path / "a"))[0] == 0
    out = tmp_path / "op.key"
    args = ("cluster", "operator", "--authority-dir", str(tmp_path / "a"), "--out", str(out))
    assert _cli(capsys, *args)[0] == 0
    code, _, err = _cli(capsys, *args)
    assert code == 1 and "exists already" in _err_line(err)
    key = OperatorKey.read(out)
    assert key.certificate and key.key_id in out.read_text()
