"""`make demo`: a 5-node mesh on loopback as real processes, one killed, then cleaned up.

What it shows, in about 15 seconds: a fresh cluster authority enrolls five machines
(here five state directories), five `populi-node up` daemons find each other through one
bootstrap peer, the members table, then a node killed with SIGKILL (no goodbye) and the
table once the survivors agree it is dead. It prints the dashboard's address (the first
node's page, through a loopback relay to its API socket); run in a terminal, it waits for
Enter before the kill and again before stopping the mesh, so the page can be watched.
Every wait polls the daemons' control API with a deadline; nothing sleeps for a guessed
time. Everything lives in a temporary directory
that is removed at the end, and every process started is stopped, even on Ctrl-C.

Run it with ``python -m populi_p2p.demo`` (``--nodes N`` for another size).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .api import ApiClient, ApiError
from .authority import AUTHORITY_PUBLIC_FILE, ClusterAuthority
from .certificate import write_certificate
from .cli import format_members
from .identity import NodeIdentity
from .observe.relay import UnixRelay

__all__ = ["main"]

#: Longest the demo waits for any one step, seconds.
STEP_TIMEOUT = 40.0


class DemoError(Exception):
    """A step did not happen in time; the message says which."""


def _wait(condition: Callable[[], Any], what: str, timeout: float = STEP_TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = condition()
        except ApiError:
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def _pause(prompt: str) -> None:
    """Wait for Enter when a person runs the demo in a terminal; never in CI."""
    stdin = sys.stdin
    if stdin is None or not stdin.isatty():
        return
    try:
        input(f"{prompt} ")
    except EOFError:
        pass


class _Demo:
    def __init__(self, root: Path, nodes: int) -> None:
        self.root = root
        self.count = nodes
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.clients: dict[str, ApiClient] = {}
        self.ids: dict[str, str] = {}
        self.relay: UnixRelay | None = None

    def enroll(self, name: str, authority: ClusterAuthority) -> Path:
        state = self.root / name
        identity = NodeIdentity.load_or_create(state)
        cert = authority.enroll(identity.public_key, now=time.time())
        write_certificate(state / "node.cert", cert)
        shutil.copy(self.root / "authority" / AUTHORITY_PUBLIC_FILE, state / AUTHORITY_PUBLIC_FILE)
        return state

    def start(self, name: str, state: Path, *flags: str) -> dict[str, Any]:
        log = (self.root / f"{name}.log").open("wb")
        argv = [
            sys.executable, "-m", "populi_p2p.cli", "up", "--state-dir", str(state),
            "--name", name, "--bind", "127.0.0.1", "--port", "0", "--overlay", "none",
            "--preset", "local", "--label", f"demo/role={name}", *flags,
        ]  # fmt: skip
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        client = ApiClient(state / "api.sock", timeout=5.0)
        self.clients[name] = client

        def answered() -> dict[str, Any] | None:
            if self.procs[name].poll() is not None:
                tail = (self.root / f"{name}.log").read_text(errors="replace")[-500:]
                raise DemoError(f"{name} exited at start: {tail}")
            return client.get("/v1/status") if client.socket_path.exists() else None

        status: dict[str, Any] = _wait(answered, f"{name} to start")
        self.ids[name] = status["node"]["node_id"]
        return status

    def views(self, names: list[str]) -> dict[str, dict[str, str]]:
        out = {}
        for name in names:
            members = self.clients[name].get("/v1/members")
            out[name] = {m["node_id"]: m["state"] for m in members}
        return out

    def stop(self) -> None:
        if self.relay is not None:
            self.relay.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def run(self) -> None:
        t0 = time.monotonic()
        authority = ClusterAuthority.create(self.root / "authority")
        print(f"cluster {authority.fingerprint}: authority created in {self.root / 'authority'}")
        names = [f"node{i}" for i in range(1, self.count + 1)]
        states = {name: self.enroll(name, authority) for name in names}
        print(f"enrolled {len(names)} nodes; starting them as separate processes on 127.0.0.1")
        first = self.start(names[0], states[names[0]])
        seed = first["node"]["address"]
        for name in names[1:]:
            self.start(name, states[name], "--bootstrap", seed)
        every = set(self.ids.values())
        _wait(
            lambda: all(
                {k for k, v in view.items() if v == "alive"} == every
                for view in self.views(names).values()
            ),
            "every node to see every other alive",
        )
        took = time.monotonic() - t0
        print(f"\nconverged after {took:.1f} s; members as {names[0]} sees them:\n")
        print(format_members(self.clients[names[0]].get("/v1/members")))
        self.relay = UnixRelay(self.clients[names[0]].socket_path)
        print(f"\ndashboard: {self.relay.url} ({names[0]}'s page, live; metrics at /metrics)")
        _pause(f"press Enter to kill {names[2]} and watch the page show it dead")

        victim = names[2]
        survivors = [n for n in names if n != victim]
        print(f"\nkill -9 {victim} (pid {self.procs[victim].pid}): no goodbye, just gone")
        killed = time.monotonic()
        self.procs[victim].send_signal(signal.SIGKILL)
        self.procs[victim].wait(timeout=10)
        victim_id = self.ids[victim]
        _wait(
            lambda: all(view.get(victim_id) == "dead" for view in self.views(survivors).values()),
            f"the survivors to agree {victim} is dead",
        )
        took = time.monotonic() - killed
        print(f"all {len(survivors)} survivors agree {victim} is dead after {took:.1f} s;")
        print(f"members as {names[0]} sees them:\n")
        print(format_members(self.clients[names[0]].get("/v1/members")))
        _pause(f"the mesh stays up; press Enter to stop it (dashboard: {self.relay.url})")
        print(f"\ndemo done in {time.monotonic() - t0:.1f} s; stopping the mesh")


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m populi_p2p.demo", description=__doc__)
    parser.add_argument("--nodes", type=int, default=5, help="mesh size (default 5, at least 3)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if args.nodes < 3:
        parser.error("--nodes must be at least 3")
    root = Path(tempfile.mkdtemp(prefix="populi-demo-"))
    demo = _Demo(root, args.nodes)
    try:
        demo.run()
    except DemoError as exc:
        print(f"demo failed: {exc} (logs in {root})", file=sys.stderr)
        args.keep = True
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        demo.stop()
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
