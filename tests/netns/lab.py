"""A reusable lab of Linux network namespaces joined by a bridge, with real WireGuard.

Used by the overlay tests and meant for the daemon's end-to-end tests too::

    reason = missing_requirements()
    if reason: pytest.skip(reason)
    with NetnsLab(3) as lab:
        a, b, c = lab.nodes
        child = lab.spawn_python(a, "tests/netns/ns_agent.py", "node", "--host", a.overlay_v4)
        child.expect(lambda m: m.get("event") == "ready", timeout=10)
        lab.cut(c)    # iptables DROP on c's underlay veth
        lab.heal(c)

Topology (every name carries the prefix `pop<pid>x<n>`, so parallel runs and leftovers
never collide)::

        ns <prefix>br:  br0 (bridge) --- p0, p1, p2 ...
                                          |   |   |        veth pairs
        ns <prefix>n0:  ul0 10.66.0.1/24  |   |            (underlay)
                        <wg> 10.77.0.1/24, fd77::1/64      (WireGuard overlay)
        ns <prefix>n1:  ul0 10.66.0.2/24 ...

Each node runs `wireguard-go -f <wg>` (userspace WireGuard, so no kernel module is
needed); its pid is tracked and killed on teardown. Keys come from `wg genkey` and
`wg pubkey`; every node has every other as a peer with allowed-ips its /32 and /128 and
an endpoint on the underlay. wireguard-go's control sockets live in /var/run/wireguard,
which is not per namespace, hence the globally unique interface names.

Teardown (in `__exit__`, also after a failed setup) kills every process the lab started,
by pid, then deletes the namespaces (which removes the veths and the bridge). Namespaces
left by a killed test run are removed by `cleanup_stale()` (their owner pid is gone).

Everything here runs commands synchronously with timeouts; the child Python processes
talk JSON lines on stdout, and `ChildProcess.expect` waits for a matching line (a
reader thread feeds a queue), so tests wait on events, not on sleeps.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
UNDERLAY_PREFIX = "10.66.0."
OVERLAY_V4_PREFIX = "10.77.0."
OVERLAY_V6_PREFIX = "fd77::"
OVERLAY_V4_CIDR = "10.77.0.0/24"
OVERLAY_V6_CIDR = "fd77::/64"
WG_LISTEN_PORT = 51820
UNDERLAY_IF = "ul0"
COMMAND_TIMEOUT = 15.0
_WG_RUN_DIR = Path("/var/run/wireguard")
_NAME_RE = re.compile(r"^pop(\d+)x\d+")
_counter = itertools.count()


class LabError(RuntimeError):
    """A lab command failed; the message has the command and its stderr."""


def missing_requirements(*, wireguard: bool = True) -> str | None:
    """Why the lab cannot run here, or None if it can. Use as a pytest skip reason."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespace tests need root"
    tools = ["ip", "iptables", "ip6tables"] + (["wireguard-go", "wg"] if wireguard else [])
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        return f"missing tools: {', '.join(missing)} (run scripts/install-sysdeps.sh)"
    if wireguard and not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun: wireguard-go cannot create its interface"
    probe = f"pop{os.getpid()}probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(
    argv: Sequence[str],
    *,
    input: str | None = None,
    timeout: float = COMMAND_TIMEOUT,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        list(argv), input=input, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def cleanup_stale() -> list[str]:
    """Delete namespaces of earlier lab runs whose owning process has died.

    Processes still inside such a namespace were started by that dead run; they are
    killed by pid (from `ip netns pids`) before the namespace is deleted.
    """
    removed: list[str] = []
    listing = _run(["ip", "netns", "list"], check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = _NAME_RE.match(name)
        if not m or _pid_alive(int(m.group(1))):
            continue
        for pid in _run(["ip", "netns", "pids", name], check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _run(["ip", "netns", "del", name], check=False)
        removed.append(name)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class NetnsNode:
    """One namespace of the lab and its addresses."""

    index: int
    netns: str
    wg: str
    underlay: str
    overlay_v4: str
    overlay_v6: str
    veth: str = UNDERLAY_IF
    public_key: str = ""
    private_key_file: str = ""
    wg_process: subprocess.Popen[bytes] | None = None
    is_cut: bool = False


class ChildProcess:
    """A process in a namespace whose stdout is JSON lines (non-JSON lines are kept too).

    A reader thread parses stdout into a queue; `expect` waits for a matching message.
    """

    def __init__(self, popen: subprocess.Popen[str], name: str, stderr_path: Path) -> None:
        self.popen = popen
        self.name = name
        self.stderr_path = stderr_path
        self.messages: list[dict[str, Any]] = []
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"reader-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            line = line.strip()
            if not line:
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                msg = {"event": "text", "text": line}
            if not isinstance(msg, dict):
                msg = {"event": "text", "text": line}
            self._queue.put(msg)
        self._queue.put(None)

    def send_line(self, line: str) -> None:
        """Write one command line to the child's stdin."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(line.rstrip("\n") + "\n")
        self.popen.stdin.flush()

    def send_json(self, message: dict[str, Any]) -> None:
        """Write one JSON command to the child's stdin."""
        self.send_line(json.dumps(message))

    def expect(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10.0
    ) -> dict[str, Any]:
        """Wait for the next message matching `predicate` (earlier ones are kept in
        `messages`). Raises TimeoutError or EOFError with the child's stderr."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"{self.name}: no matching message in {timeout} s; "
                    f"got {self.messages[-5:]}; stderr: {self.stderr_tail()}"
                )
            try:
                msg = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if msg is None:
                self._queue.put(None)
                raise EOFError(
                    f"{self.name} exited ({self.popen.poll()}); stderr: {self.stderr_tail()}"
                )
            self.messages.append(msg)
            if predicate(msg):
                return msg

    def drain(self) -> list[dict[str, Any]]:
        """Messages already received and not yet consumed by `expect`."""
        out: list[dict[str, Any]] = []
        while True:
            try:
                msg = self._queue.get_nowait()
            except queue.Empty:
                return out
            if msg is None:
                self._queue.put(None)
                return out
            self.messages.append(msg)
            out.append(msg)

    def stderr_tail(self) -> str:
        """The end of what the child wrote to stderr (kept in a file, never a full pipe)."""
        try:
            return self.stderr_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        """Close stdin (the agents exit on EOF), then terminate, then kill, by pid."""
        if self.popen.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert self.popen.stdin is not None
                self.popen.stdin.close()
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.terminate()
                try:
                    self.popen.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait()
        self._reader.join(timeout=2)


class NetnsLab:
    """N namespaces on one bridge, optionally with a full WireGuard mesh between them.

    Args:
        n: number of node namespaces (1..200).
        wireguard: run wireguard-go and configure the overlay.
        keepalive: WireGuard persistent-keepalive seconds, or None.
    """

    def __init__(self, n: int, *, wireguard: bool = True, keepalive: int | None = None) -> None:
        if not 1 <= n <= 200:
            raise ValueError("a lab has 1..200 nodes")
        serial = next(_counter)
        pid = os.getpid()
        self.prefix = f"pop{pid}x{serial}"
        self.bridge_ns = f"{self.prefix}br"
        self.wireguard = wireguard
        self.keepalive = keepalive
        # Interface names are at most 15 bytes: "pw" + 5 pid digits + 2 serial + 3 index.
        wg_stem = f"pw{pid % 100000:05d}{serial % 100:02d}"
        self.nodes = [
            NetnsNode(
                index=i,
                netns=f"{self.prefix}n{i}",
                wg=f"{wg_stem}{i:03d}",
                underlay=f"{UNDERLAY_PREFIX}{i + 1}",
                overlay_v4=f"{OVERLAY_V4_PREFIX}{i + 1}",
                overlay_v6=f"{OVERLAY_V6_PREFIX}{i + 1:x}",
            )
            for i in range(n)
        ]
        self._children: list[ChildProcess] = []
        self._namespaces: list[str] = []
        self._tmp: str | None = None

    # -- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> NetnsLab:
        try:
            self.setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.teardown()

    def setup(self) -> None:
        cleanup_stale()
        self._tmp = tempfile.mkdtemp(prefix=f"{self.prefix}-")
        self._add_netns(self.bridge_ns)
        self.exec_root(self.bridge_ns, "ip", "link", "add", "br0", "type", "bridge")
        self.exec_root(self.bridge_ns, "ip", "link", "set", "br0", "up")
        for node in self.nodes:
            self._add_netns(node.netns)
            self.exec(node, "ip", "link", "set", "lo", "up")
            peer = f"p{node.index}"
            _run(
                [
                    "ip",
                    "link",
                    "add",
                    UNDERLAY_IF,
                    "netns",
                    node.netns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    peer,
                    "netns",
                    self.bridge_ns,
                ]
            )
            self.exec_root(self.bridge_ns, "ip", "link", "set", peer, "master", "br0")
            self.exec_root(self.bridge_ns, "ip", "link", "set", peer, "up")
            self.exec(node, "ip", "addr", "add", f"{node.underlay}/24", "dev", UNDERLAY_IF)
            self.exec(node, "ip", "link", "set", UNDERLAY_IF, "up")
        if self.wireguard:
            for node in self.nodes:
                self._start_wireguard(node)
            for node in self.nodes:
                self._configure_peers(node)

    def teardown(self) -> None:
        """Kill what the lab started (by pid) and delete its namespaces. Idempotent."""
        for child in self._children:
            with contextlib.suppress(Exception):
                child.stop(timeout=3)
        self._children.clear()
        for node in self.nodes:
            proc = node.wg_process
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            node.wg_process = None
            with contextlib.suppress(FileNotFoundError):
                (_WG_RUN_DIR / f"{node.wg}.sock").unlink()
        for name in reversed(self._namespaces):
            for pid in _run(["ip", "netns", "pids", name], check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)  # only processes this lab put there
            _run(["ip", "netns", "del", name], check=False)
        self._namespaces.clear()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _add_netns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._namespaces.append(name)

    # -- WireGuard ---------------------------------------------------------------------

    def _start_wireguard(self, node: NetnsNode) -> None:
        assert self._tmp is not None
        private = _run(["wg", "genkey"]).stdout.strip()
        node.public_key = _run(["wg", "pubkey"], input=private + "\n").stdout.strip()
        key_file = Path(self._tmp) / f"{node.wg}.key"
        key_file.touch(mode=0o600)
        key_file.write_text(private + "\n")
        node.private_key_file = str(key_file)
        log = open(Path(self._tmp) / f"{node.wg}.log", "wb")  # noqa: SIM115
        env = {**os.environ, "WG_PROCESS_FOREGROUND": "1", "LOG_LEVEL": "error"}
        node.wg_process = subprocess.Popen(
            ["ip", "netns", "exec", node.netns, "wireguard-go", "-f", node.wg],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        log.close()
        # The control socket appears once wireguard-go is ready for `wg set`.
        sock = _WG_RUN_DIR / f"{node.wg}.sock"
        deadline = time.monotonic() + 10
        while not sock.exists():
            if node.wg_process.poll() is not None:
                raise LabError(f"wireguard-go for {node.wg} exited: {self.wireguard_log(node)}")
            if time.monotonic() > deadline:
                raise LabError(f"wireguard-go for {node.wg} not ready after 10 s")
            time.sleep(0.02)
        self.exec(
            node,
            "wg",
            "set",
            node.wg,
            "listen-port",
            str(WG_LISTEN_PORT),
            "private-key",
            node.private_key_file,
        )
        self.exec(node, "ip", "addr", "add", f"{node.overlay_v4}/24", "dev", node.wg)
        self.exec(node, "ip", "-6", "addr", "add", f"{node.overlay_v6}/64", "dev", node.wg, "nodad")
        self.exec(node, "ip", "link", "set", node.wg, "up")

    def _configure_peers(self, node: NetnsNode) -> None:
        for other in self.nodes:
            if other is node:
                continue
            argv = [
                "wg",
                "set",
                node.wg,
                "peer",
                other.public_key,
                "allowed-ips",
                f"{other.overlay_v4}/32,{other.overlay_v6}/128",
                "endpoint",
                f"{other.underlay}:{WG_LISTEN_PORT}",
            ]
            if self.keepalive:
                argv += ["persistent-keepalive", str(self.keepalive)]
            self.exec(node, *argv)

    def wireguard_log(self, node: NetnsNode) -> str:
        if self._tmp is None:
            return ""
        path = Path(self._tmp) / f"{node.wg}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    # -- running things ------------------------------------------------------------------

    def exec_root(
        self, netns: str, *argv: str, check: bool = True, timeout: float = COMMAND_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside the namespace named `netns`."""
        return _run(["ip", "netns", "exec", netns, *argv], check=check, timeout=timeout)

    def exec(
        self, node: NetnsNode, *argv: str, check: bool = True, timeout: float = COMMAND_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside `node`'s namespace and wait for it."""
        return self.exec_root(node.netns, *argv, check=check, timeout=timeout)

    def spawn(
        self,
        node: NetnsNode,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        name: str | None = None,
    ) -> ChildProcess:
        """Start argv in `node`'s namespace with pipes; stopped on teardown."""
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), full_env.get("PYTHONPATH", "")) if p
        )
        assert self._tmp is not None, "spawn needs a set-up lab"
        stderr_path = Path(self._tmp) / f"child{len(self._children)}-{node.netns}.stderr"
        with open(stderr_path, "wb") as stderr:
            popen = subprocess.Popen(
                ["ip", "netns", "exec", node.netns, *argv],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                bufsize=1,
                env=full_env,
                cwd=REPO_ROOT,
            )
        label = name or " ".join(Path(a).name for a in argv[:3])
        child = ChildProcess(popen, f"{node.netns}: {label}", stderr_path)
        self._children.append(child)
        return child

    def spawn_python(
        self, node: NetnsNode, script: str | Path, *args: str, env: dict[str, str] | None = None
    ) -> ChildProcess:
        """Run a Python script (this interpreter, unbuffered) in `node`'s namespace."""
        return self.spawn(node, [sys.executable, "-u", str(script), *args], env=env)

    # -- faults ------------------------------------------------------------------------

    def _rules(self, node: NetnsNode, action: str) -> None:
        for tool in ("iptables", "ip6tables"):
            self.exec(node, tool, action, "INPUT", "-i", node.veth, "-j", "DROP")
            self.exec(node, tool, action, "OUTPUT", "-o", node.veth, "-j", "DROP")

    def cut(self, node: NetnsNode) -> None:
        """Drop everything in and out of `node`'s underlay veth (so its overlay dies too)."""
        if not node.is_cut:
            self._rules(node, "-I")
            node.is_cut = True

    def heal(self, node: NetnsNode) -> None:
        """Remove the DROP rules `cut` added."""
        if node.is_cut:
            self._rules(node, "-D")
            node.is_cut = False
