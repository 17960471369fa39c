"""What the benchmarks share: N real `populi-node up` daemons on loopback.

`Mesh` enrolls each daemon with a fresh cluster authority, starts them in paced batches
(each joining through a member already up), answers "has every daemon converged", and
kills them all at the end. `mesh_bench.py` and `task_bench.py` both start their daemons
this way.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from populi_p2p.api import ApiClient, ApiError  # noqa: E402
from populi_p2p.trust.authority import AUTHORITY_PUBLIC_FILE, ClusterAuthority  # noqa: E402
from populi_p2p.trust.certificate import write_certificate  # noqa: E402
from populi_p2p.trust.identity import NodeIdentity  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def wait_for(condition: Callable[[], Any], what: str, timeout: float, interval: float) -> float:
    """Poll until `condition()` is truthy; return the seconds it took."""
    start = time.monotonic()
    while True:
        try:
            if condition():
                return time.monotonic() - start
        except ApiError:
            pass
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def log_events(text: str) -> list[tuple[float, str, dict[str, str]]]:
    """(unix time, event, fields) for each structured line of a daemon log."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or not parts[0].endswith("Z"):
            continue
        try:
            stamp = datetime.strptime(parts[0], "%Y-%m-%dT%H:%M:%S.%fZ")
        except ValueError:
            continue
        when = stamp.replace(tzinfo=UTC).timestamp()
        fields = dict(p.split("=", 1) for p in parts[3:] if "=" in p)
        out.append((when, parts[2], fields))
    return out


class Daemon:
    def __init__(self, name: str, state: Path, proc: subprocess.Popen[bytes]) -> None:
        self.name = name
        self.state = state
        self.proc = proc
        self.client = ApiClient(state / "api.sock", timeout=30.0)
        self.node_id = ""
        self.address = ""

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def view(self) -> dict[str, str]:
        return {m["node_id"]: m["state"] for m in self.client.get("/v1/members")}


class Mesh:
    """N `populi-node up` daemons on loopback in one directory: start, query, stop."""

    def __init__(self, root: Path, n: int, preset: str, pace: bool = True) -> None:
        self.root = root
        self.n = n
        self.preset = preset
        self.pace = pace
        self.authority = ClusterAuthority.create(root / "authority")
        self.daemons: list[Daemon] = []

    def spawn(self, i: int, bootstrap: list[str]) -> Daemon:
        name = f"b{i:03d}"
        state = self.root / name
        identity = NodeIdentity.load_or_create(state)
        write_certificate(
            state / "node.cert", self.authority.enroll(identity.public_key, now=time.time())
        )
        shutil.copy(self.root / "authority" / AUTHORITY_PUBLIC_FILE, state / AUTHORITY_PUBLIC_FILE)
        argv = [
            sys.executable, "-m", "populi_p2p.cli", "up", "--state-dir", str(state),
            "--name", name, "--bind", "127.0.0.1", "--port", "0", "--overlay", "none",
            "--preset", self.preset, "--log-level", "info",
        ]  # fmt: skip
        for b in bootstrap:
            argv += ["--bootstrap", b]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with (self.root / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        d = Daemon(name, state, proc)
        self.daemons.append(d)
        return d

    def ready(self, d: Daemon) -> None:
        def up() -> bool:
            if d.proc.poll() is not None:
                raise RuntimeError(f"{d.name} exited: {(self.root / f'{d.name}.log').read_text()}")
            if not d.client.socket_path.exists():
                return False
            status = d.client.get("/v1/status")
            d.node_id = status["node"]["node_id"]
            d.address = status["node"]["address"]
            return True

        wait_for(up, f"{d.name} to start", 120, 0.1)

    def start_all(self) -> None:
        first = self.spawn(0, [])
        self.ready(first)
        batch = 10  # start in batches: 2 cores cannot import 100 interpreters at once
        rng = random.Random(self.n)
        for start in range(1, self.n, batch):
            # Each daemon joins through one member already up, picked at random, so no
            # single member answers every join's push-pull (a join storm).
            up = list(self.daemons)
            pending = [
                self.spawn(i, [rng.choice(up).address])
                for i in range(start, min(start + batch, self.n))
            ]
            for d in pending:
                self.ready(d)
            if self.pace:
                # Start the next batch only once this one is in: joins are the costly
                # part (a full state exchange, every record verified, gossip to all),
                # and on 2 cores they must not overlap the next batch's start-up.
                joined = functools.partial(self.converged, pending, expect=len(self.daemons))
                wait_for(joined, f"batch {start // batch + 1} to join", 300, 0.5)

    def all_see(self, daemons: list[Daemon], node_id: str, state: str) -> bool:
        return all(d.view().get(node_id) == state for d in daemons)

    def converged(self, daemons: list[Daemon], expect: int | None = None) -> bool:
        """Every daemon counts `expect` (default len(daemons)) alive members (cheap:
        status, not tables)."""
        want = len(daemons) if expect is None else expect
        for d in daemons:
            if d.client.get("/v1/status")["cluster"]["members"]["alive"] != want:
                return False
        return True

    def events(self, d: Daemon) -> list[tuple[float, str, dict[str, str]]]:
        return log_events((self.root / f"{d.name}.log").read_text(errors="replace"))

    def stop(self) -> None:
        for d in self.daemons:
            if d.proc.poll() is None:
                d.proc.send_signal(signal.SIGKILL)
        for d in self.daemons:
            try:
                d.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
