"""Task inputs and outputs on real daemons (docs/artifacts.md).

Four daemons on loopback. A 100 MiB file and a directory submitted as inputs on
node a run on node b (a label puts it there): the task checks the file's sha256 and
reads the directory from ``$POPULI_INPUT_DIR``. Its outputs (a file and a directory)
are held by b and two other members before the task is succeeded; the result names
them. Then b is killed with kill -9, and a node that does not hold them fetches them
from the remaining holders with ``populi-node fetch``; once b is dead, the lowest
remaining holder has the fourth node hold them (pinned), so three copies remain, and
``populi-node task`` shows who holds them now.

A second test kills the accepting node itself: a task submitted on a with an input,
for a label no live node has, is acknowledged only once two other members hold the
input; a is killed with kill -9, a node with the label joins, and the task runs there
with its input (hash checked), fetched from those holders.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.mesh.test_metrics import get, scrape, value
from tests.node.harness import REPO, Daemon, Mesh, wait_until

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
#: The first test's input file, in MiB: the issue's 100 (``POPULI_INPUT_MIB`` sets another).
INPUT_MIB = int(os.environ.get("POPULI_INPUT_MIB", "100"))

SCRIPT = """set -e
sha256sum "$POPULI_INPUT_DIR/data.bin" | cut -d' ' -f1 > result.txt
cat "$POPULI_INPUT_DIR/tree/sub/note.txt" >> result.txt
mkdir -p outdir/deep
echo made > outdir/deep/x.txt
ln -s /etc/hostname sneaky
"""


def _cli(d: Daemon, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "populi_p2p.cli", command, "--state-dir", str(d.state_dir), *args],
        capture_output=True, text=True, cwd=REPO, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def _task(d: Daemon, tid: str) -> dict[str, Any]:
    return d.client.get(f"/v1/tasks/{tid}")  # type: ignore[no-any-return]


def _pins(d: Daemon, sha256: str) -> list[str]:
    """The pins `d` holds on a blob (none: it does not hold it)."""
    rows = d.client.get("/v1/blobs")["local"]
    return next((r["pins"] for r in rows if r["hash"] == sha256 and r["complete"]), [])


def _holders_now(d: Daemon, tid: str) -> dict[str, list[str]]:
    rows = d.client.get(f"/v1/artifacts/holders?task={tid}")["blobs"]
    return {r["sha256"]: r["holders"] for r in rows}


def test_inputs_run_elsewhere_and_outputs_outlive_their_owner(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    try:
        data = tmp_path / "data.bin"
        whole = hashlib.sha256()
        with data.open("wb") as f:
            for size in [MiB] * INPUT_MIB + [12345]:
                piece = os.urandom(size)
                whole.update(piece)
                f.write(piece)
        digest = whole.hexdigest()
        tree = tmp_path / "tree"
        (tree / "sub").mkdir(parents=True)
        (tree / "sub" / "note.txt").write_text("from the tree\n")
        a = mesh.start("a", "--peer-port", "0", "--label", "zone=a")
        seed = ("--peer-port", "0", "--bootstrap", a.address)
        b = mesh.start("b", *seed, "--label", "zone=b")
        others = [mesh.start(n, *seed, "--label", "zone=a") for n in ("c", "d")]
        wait_until(lambda: len(a.members()) >= 4, 30, "four members")
        t0 = time.monotonic()
        out = _cli(
            a, "submit", "--label", "zone=b", "--input", str(data), "--input", f"{tree}:tree",
            "--output", "result.txt", "--output", "outdir", "--output", "sneaky",
            "--", "sh", "-c", SCRIPT,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        tid = out.stdout.strip()
        t1 = time.monotonic()
        task = wait_until(lambda: (t := _task(a, tid))["finished"] and t, 120, "the task")
        print(f"{INPUT_MIB} MiB input: submit (stored, held by 2) {t1 - t0:.2f} s,"
              f" then run on b with outputs held {time.monotonic() - t1:.2f} s")  # fmt: skip
        assert task["phase"] == "succeeded", task
        assert task["owner"] == b.node_id
        result = task["result"]
        # The symlink was refused, not followed; the two real outputs were kept.
        assert "sneaky is a symbolic link" in result["output_tail"], result
        assert [o["path"] for o in result["outputs"]] == ["outdir", "result.txt"]
        holders = result["holders"]
        assert holders[0] == b.node_id and len(holders) == 3, holders
        shown = _cli(a, "task", tid)
        assert "output   result.txt" in shown.stdout and "input    data.bin" in shown.stdout

        # The owner dies; a member that holds nothing fetches from the other holders.
        b.kill()
        fetcher = next(d for d in (a, *others) if d.node_id not in holders)
        # The result reaches each table by gossip: the fetcher's may lag a's.
        wait_until(lambda: _task(fetcher, tid)["result"], 30, "the result on the fetcher")
        dest = tmp_path / "fetched"
        dest.mkdir()
        got = _cli(fetcher, "fetch", tid, "--to", str(dest))
        assert got.returncode == 0, got.stderr
        lines = (dest / "result.txt").read_text().splitlines()
        assert lines == [digest, "from the tree"]  # the input's hash, checked on b
        assert (dest / "outdir" / "deep" / "x.txt").read_text() == "made\n"
        assert not (dest / "sneaky").exists()
        again = _cli(fetcher, "fetch", tid, "--to", str(dest))
        assert again.returncode == 1 and "exists" in again.stderr

        # Re-replication: b is gone, so the fourth node is asked to hold (pin) them.
        outputs = [o["sha256"] for o in result["outputs"]]
        wait_until(
            lambda: all(any(p.startswith(f"out:{tid}:") for p in _pins(fetcher, o))
                        for o in outputs), 60, "the outputs re-replicated on the fourth node",
        )  # fmt: skip
        live = sorted(d.node_id for d in (a, *others))
        now = _holders_now(fetcher, tid)
        assert all(now[o] == live for o in outputs), (now, live)
        shown = _cli(fetcher, "task", tid).stdout
        assert shown.count("held now output") == 2, shown
    finally:
        mesh.stop_all()


def test_inputs_outlive_the_node_that_accepted_them(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    try:
        data = tmp_path / "data.bin"
        data.write_bytes(os.urandom(2 * MiB + 7))
        digest = hashlib.sha256(data.read_bytes()).hexdigest()
        a = mesh.start("a", "--peer-port", "0", "--label", "zone=a")
        seed = ("--peer-port", "0", "--bootstrap", a.address)
        c, d = (mesh.start(n, *seed, "--label", "zone=a") for n in ("c", "d"))
        wait_until(lambda: len(a.members()) >= 3, 30, "three members")
        out = _cli(
            a, "submit", "--label", "zone=b", "--input", str(data), "--output", "result.txt",
            "--", "sh", "-c", 'sha256sum "$POPULI_INPUT_DIR/data.bin" | cut -d" " -f1 > result.txt',
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        tid = out.stdout.strip()
        # Acknowledged: two members besides a hold (pin) the input already.
        assert all(f"in:{tid}" in _pins(n, digest) for n in (c, d)), [
            _pins(n, digest) for n in (c, d)
        ]
        assert _task(c, tid)["phase"] == "pending"
        a.kill()
        b = mesh.start("b", "--peer-port", "0", "--bootstrap", c.address, "--label", "zone=b")
        try:
            task = wait_until(lambda: (t := _task(c, tid))["finished"] and t, 90, "the task")
        except AssertionError:
            why = c.client.get(f"/v1/tasks/{tid}/explain")
            raise AssertionError(f"{_task(c, tid)}\n{why}\n{b.log()[-3000:]}") from None
        assert task["phase"] == "succeeded", task
        assert task["owner"] == b.node_id
        dest = tmp_path / "fetched"
        dest.mkdir()
        wait_until(lambda: _task(d, tid)["result"], 30, "the result on d")
        got = _cli(d, "fetch", tid, "--to", str(dest))
        assert got.returncode == 0, got.stderr
        assert (dest / "result.txt").read_text().split() == [digest]

        # Seeing it: b fetched the input (in), c and d served it (out).
        size = data.stat().st_size
        moved = "populi_blob_transferred_bytes_total"
        assert value(scrape(b), moved, direction="in") >= size
        assert sum(value(scrape(n), moved, direction="out") for n in (c, d)) >= size
        assert value(scrape(b), "populi_blob_bytes") >= size
        page = get(b, "/api/mesh").json()["blobs"]
        assert page["in"] >= size and page["held"] >= size, page
    finally:
        mesh.stop_all()
