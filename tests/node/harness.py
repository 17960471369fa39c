"""Real daemons as separate processes on loopback, for the process-level tests.

A `Mesh` owns a temporary cluster authority and starts `populi-node up` processes, each
with its own state dir (key, certificate, authority public key), bound to 127.0.0.1 on a
kernel-chosen port. Every wait is a poll of the daemons' control API (or the process
table) bounded by a deadline: never a bare sleep used as synchronisation.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from populi_p2p.api import ApiClient, ApiError
from populi_p2p.trust.authority import AUTHORITY_PUBLIC_FILE, ClusterAuthority
from populi_p2p.trust.certificate import write_certificate
from populi_p2p.trust.identity import NodeIdentity

REPO = Path(__file__).resolve().parents[2]
#: Network flags of a loopback daemon: kernel-chosen port, no overlay detection.
LOOPBACK = ("--bind", "127.0.0.1", "--port", "0", "--overlay", "none")
T = TypeVar("T")


class WaitTimeout(AssertionError):
    pass


def wait_until(
    condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05
) -> T:
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = condition()
            if result:
                return result
        except ApiError as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.1f} s waiting for {what} ({last_error})")
        time.sleep(interval)


class Daemon:
    """One `populi-node up` process."""

    def __init__(self, name: str, state_dir: Path, proc: subprocess.Popen[bytes], log: Path):
        self.name = name
        self.state_dir = state_dir
        self.proc = proc
        self.log_path = log
        self.client = ApiClient(state_dir / "api.sock", timeout=5.0)
        self.node_id = ""
        self.address = ""

    def status(self) -> dict[str, Any]:
        return self.client.get("/v1/status")  # type: ignore[no-any-return]

    def members(self) -> list[dict[str, Any]]:
        return self.client.get("/v1/members")  # type: ignore[no-any-return]

    def view(self) -> dict[str, str]:
        """node id -> state, as this daemon sees it (itself excluded)."""
        return {m["node_id"]: m["state"] for m in self.members() if not m["self"]}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)


class Mesh:
    """A cluster authority and the daemons started under it."""

    def __init__(self, root: Path, preset: str = "local") -> None:
        self.root = root
        self.preset = preset
        self.authority = ClusterAuthority.create(root / "authority")
        self.daemons: list[Daemon] = []

    def prepare(self, name: str, authority: ClusterAuthority | None = None) -> Path:
        """A state dir with a node key, an enrollment certificate and the authority key."""
        state = self.root / name
        identity = NodeIdentity.load_or_create(state)
        signer = authority if authority is not None else self.authority
        cert = signer.enroll(identity.public_key, now=time.time())
        if (state / "node.cert").exists():
            (state / "node.cert").unlink()
        write_certificate(state / "node.cert", cert)
        pub = self.root / "authority" / AUTHORITY_PUBLIC_FILE
        (state / AUTHORITY_PUBLIC_FILE).write_bytes(pub.read_bytes())
        return state

    def spawn(
        self,
        name: str,
        *flags: str,
        state: Path | None = None,
        prepare: bool = True,
        network: Sequence[str] = LOOPBACK,
        wrap: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Daemon:
        """Start a daemon without waiting for it.

        `network` replaces the loopback flags (bind, port, overlay); `wrap` prefixes the
        command (``ip netns exec NS``); `env` adds to (or overrides) the environment, e.g.
        ``LD_LIBRARY_PATH`` to the fake NVML.
        """
        if state is None:
            state = self.prepare(name) if prepare else self.root / name
        log = self.root / f"{name}.log"
        argv = [
            *wrap, sys.executable, "-m", "populi_p2p.cli", "up", "--state-dir", str(state),
            "--name", name, *network, "--preset", self.preset, *flags,
        ]  # fmt: skip
        environ = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
        environ.update(env or {})
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=environ)
        daemon = Daemon(name, state, proc, log)
        self.daemons.append(daemon)
        return daemon

    def ready(self, daemon: Daemon, timeout: float = 30.0) -> Daemon:
        """Wait until the daemon's API answers; fill in its node id and address."""

        def up() -> dict[str, Any] | None:
            if not daemon.running:
                raise AssertionError(f"{daemon.name} exited: {daemon.log()[-2000:]}")
            return daemon.status() if daemon.client.socket_path.exists() else None

        status: dict[str, Any] = wait_until(up, timeout, f"{daemon.name} to answer")
        daemon.node_id = status["node"]["node_id"]
        daemon.address = status["node"]["address"]
        return daemon

    def start(self, name: str, *flags: str, **kwargs: Any) -> Daemon:
        return self.ready(self.spawn(name, *flags, **kwargs))

    def stop_all(self) -> None:
        for d in self.daemons:
            if d.running:
                d.proc.send_signal(signal.SIGKILL)
        for d in self.daemons:
            try:
                d.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def converged(self, daemons: Iterable[Daemon], expect: dict[str, str]) -> bool:
        """Every daemon sees exactly `expect` (node id -> state) about the others."""
        for d in daemons:
            view = d.view()
            wanted = {k: v for k, v in expect.items() if k != d.node_id}
            if {k: view.get(k) for k in wanted} != wanted:
                return False
        return True
