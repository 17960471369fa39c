"""Real daemons on loopback: a model added on some nodes is fetched by another in
verified chunks from several at once; a holder whose copy is corrupt is refused and
the chunk fetched elsewhere; a holder that advertises a blob it no longer has is
skipped; a fetch killed with kill -9 resumes where it stopped; the quota is never
exceeded and pinned blobs are kept."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from populi_p2p.api import ApiError
from populi_p2p.blobs import CHUNK_BYTES
from tests.node.harness import REPO, Daemon, Mesh, wait_until

pytestmark = pytest.mark.slow

MiB = 1024 * 1024


def _model(tmp: Path, name: str, size: int) -> Path:
    path = tmp / name
    with open(path, "wb") as f:
        for i in range(-(-size // MiB)):
            f.write(hashlib.sha256(f"{name}{i}".encode()).digest() * (MiB // 32))
        f.truncate(size)
    return path


def _cli(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "populi_p2p.cli", "model", *args, "--state-dir", str(d.state_dir)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip


def _holders_seen(d: Daemon, digest: str) -> int:
    rows = d.client.get("/v1/blobs")
    both = rows["mesh"] + rows["local"]  # a partial fetch is local, its holders listed
    return max((len(r["holders"]) for r in both if r["hash"] == digest), default=0)


def _pull(d: Daemon, blob: str, timeout: float = 120) -> dict[str, Any]:
    row = d.client.post("/v1/blobs/pull", {"blob": blob})
    return wait_until(  # type: ignore[no-any-return]
        lambda: (p := d.client.get(f"/v1/blobs/progress?blob={row['hash']}"))["state"]
        in ("done", "failed") and p, timeout, "the pull to end",
    )  # fmt: skip


def test_fetch_from_holders_refuses_corrupt_and_skips_a_liar(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    try:
        src = _model(tmp_path, "tiny.gguf", 3 * CHUNK_BYTES + 4321)
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        a = mesh.start("a", "--peer-port", "0")
        seed = ("--bootstrap", a.address)
        good, bad, liar = a, mesh.start("b", "--peer-port", "0", *seed), \
            mesh.start("c", "--peer-port", "0", *seed)  # fmt: skip
        d = mesh.start("d", "--peer-port", "0", *seed)
        for holder in (good, bad, liar):
            out = _cli(holder, "add", str(src), "--name", "tiny")
            assert out.returncode == 0, out.stderr
            assert digest in out.stdout
        # bad's copy rots on disk (its manifest is right, its chunks 0 and 1 are not);
        # liar's files vanish while its record still advertises the blob.
        with open(bad.state_dir / "blobs" / digest, "r+b") as f:
            for chunk in (0, 1):
                f.seek(chunk * CHUNK_BYTES + 100)
                f.write(b"\0rot\0")
        for suffix in ("", ".manifest"):
            os.unlink(liar.state_dir / "blobs" / f"{digest}{suffix}")
        wait_until(lambda: _holders_seen(d, digest) == 3, 30, "d to see three holders")
        ls = _cli(d, "ls")
        assert ls.returncode == 0 and "tiny" in ls.stdout and "3 holder(s)" in ls.stdout
        out = _cli(d, "pull", "tiny")
        assert out.returncode == 0, out.stderr
        assert "done" in out.stdout and "100.0%" in out.stdout
        fetched = d.state_dir / "blobs" / digest
        assert hashlib.sha256(fetched.read_bytes()).hexdigest() == digest
        row = d.client.get(f"/v1/blobs/progress?blob={digest}")
        by = {h: row["holders"][n] for h, n in
              ((x.node_id, x.node_id) for x in (good, bad, liar))}  # fmt: skip
        assert by[good.node_id]["served"] >= 1 and not by[good.node_id]["skipped"]
        # The corrupt holder's chunk was refused and fetched elsewhere; it was skipped.
        assert by[bad.node_id]["corrupt"] >= 1 and by[bad.node_id]["skipped"]
        assert by[bad.node_id]["served"] + by[good.node_id]["served"] == 4
        # The liar was skipped (at the manifest or at its first chunk), never trusted.
        assert by[liar.node_id]["skipped"] and by[liar.node_id]["served"] == 0
        local = d.client.get("/v1/blobs")["local"]
        assert [r["hash"] for r in local] == [digest] and local[0]["complete"]
    finally:
        mesh.stop_all()


def test_kill_mid_fetch_resumes_and_quota_keeps_pins(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    try:
        size = 12 * CHUNK_BYTES
        src = _model(tmp_path, "big.gguf", size)
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        a = mesh.start("a", "--peer-port", "0")
        flags = ("--peer-port", "0", "--bootstrap", a.address, "--blob-bandwidth", "8MiB",
                 "--blob-quota", str(size + 3 * MiB))  # fmt: skip
        d = mesh.start("d", *flags)
        assert _cli(a, "add", str(src), "--name", "big").returncode == 0
        wait_until(lambda: _holders_seen(d, digest) == 1, 30, "d to see the holder")
        d.client.post("/v1/blobs/pull", {"blob": "big"})
        wait_until(
            lambda: d.client.get(f"/v1/blobs/progress?blob={digest}")["done"] >= 3, 60,
            "three chunks",
        )  # fmt: skip
        d.kill()
        done_file = d.state_dir / "blobs" / "partial" / f"{digest}.done"
        kept = sum(done_file.read_bytes())
        assert 3 <= kept < 12
        d = mesh.ready(mesh.spawn("d", *flags, state=d.state_dir))
        wait_until(lambda: _holders_seen(d, digest) == 1, 30, "d to see the holder again")
        row = _pull(d, "big")
        assert row["state"] == "done", row
        assert row["bytes_fetched"] <= size - kept * CHUNK_BYTES  # done chunks not refetched
        fetched = d.state_dir / "blobs" / digest
        assert hashlib.sha256(fetched.read_bytes()).hexdigest() == digest
        # The quota (12 chunks + 3 MiB): pinned "big" stays; small ones come and go.
        d.client.post("/v1/blobs/pin", {"blob": "big", "by": "deploy:x"})
        small = [_model(tmp_path, f"s{i}", 2 * MiB) for i in range(2)]
        assert _cli(d, "add", str(small[0])).returncode == 0
        out = _cli(d, "add", str(small[1]))  # evicts s0 (unpinned), never big
        assert out.returncode == 0, out.stderr
        names = {r["name"] for r in d.client.get("/v1/blobs")["local"]}
        assert names == {"big", "s1"}
        status = d.status()["blobs"]
        assert status["used"] <= status["quota"] and status["evicted"] == 1
        d.client.post("/v1/blobs/pin", {"blob": "s1", "by": "task:t"})
        out = _cli(d, "add", str(_model(tmp_path, "s2", 2 * MiB)))
        assert out.returncode == 1 and "quota" in out.stderr and out.stderr.count("\n") == 1
        with pytest.raises(ApiError, match="pinned"):
            d.client.post("/v1/blobs/rm", {"blob": "big"})
        used = sum(p.stat().st_size for p in (d.state_dir / "blobs").iterdir()
                   if len(p.name) == 64)  # fmt: skip
        assert used <= size + 3 * MiB
    finally:
        mesh.stop_all()
