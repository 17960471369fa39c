"""Real daemons, a recorded history, a check: the ownership scenarios (issue 17).

A `Lab` starts N `populi-node up` daemons on loopback (``tests/node/harness.py``'s
`Mesh`, in batches of 10, each joining through a member already up), submits probe
tasks (`probe.py`) through the control API, as the CLI does, or through the CLI itself,
from several threads, kills owners with SIGKILL and restarts them, waits until every
task is finished and agreed on every live daemon, and hands the history to
`checker.check`. It also keeps the client's measures: how long each submit took,
submit-to-start, and failover (kill to the task's next start).

Everything is measured from outside: the owner to kill is the daemon whose pid is the
parent of a live probe (the executor's wrapper execs the command), and a killed
daemon's task process groups are the groups of its children, watched in /proc until
gone. Waits poll with deadlines. A wait that runs out does not raise: the history is
checked as it stands and the checker says what is missing (I3, I4).

Partitions: loopback daemons share one address and cannot be cut apart, so
``test_partition_netns.py`` runs this lab's daemons in network namespaces (root only;
`Lab.spawn` is the one place that says where a daemon runs) and cuts them with iptables.

The probe reads the run from outside: it appends to a log in the lab's directory and
names the daemon that started it by its parent pid, which needs the host's view of
processes and files. So when the daemons run as root their tasks run as root without
namespaces (`TASK_FLAGS`: ``--task-user root``, isolation level ``none``); each task's
own uid, PID namespace and private ``/tmp`` are tested in tests/attacks/
test_attacks_tasks.py and tests/executor/test_isolation.py. The lab lives in a
directory of its own under the system temp dir, traversable by all, with a sticky,
world-writable log directory and a readable copy of the probe.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import attrs

from populi_p2p.api import ApiClient, ApiError
from tests.node.harness import REPO, Daemon, Mesh

from . import probe
from .checker import Ack, Killed, NodeTable, ProbeEvent, Report, Submit, check, load_events

__all__ = ["Lab", "group_alive", "live_groups", "percentile", "poll", "task_python"]

#: The daemon's answer when a task is stored but too few members acked it in time.
_STORED = re.compile(r"task ([0-9a-f]{32}) is stored on this node, but only")
#: Longer than the daemon's 10 s wait for acks, so a shortfall reads as its one line.
SUBMIT_TIMEOUT_S = 30.0
#: How long a killed daemon's task groups are watched (I5's grace is 1 s).
WATCH_S = 3.0
#: Daemons started at once (2 cores cannot import 20 interpreters at once).
BATCH = 10

Via = Literal["api", "cli"]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.999999) - 1))]


def _others_may_run(path: str) -> bool:
    """Anyone (the task user, nobody) may execute `path`: every directory on its real
    path is searchable by others and the file is executable by them."""
    real = Path(os.path.realpath(path))
    if not real.is_file():
        return False
    dirs_ok = all(p.stat().st_mode & 0o001 for p in real.parents)
    return dirs_ok and bool(real.stat().st_mode & 0o001)


def task_python() -> str:
    """A Python the tasks can run: ours, unless the daemons run as root (tasks then run
    as nobody) and ours lives where nobody may not go (a pyenv under /root)."""
    if os.geteuid() != 0 or _others_may_run(sys.executable):
        return sys.executable
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if _others_may_run(candidate):
            return candidate
    raise RuntimeError(f"no Python that the task user may run ({sys.executable} is not)")


def live_groups() -> set[int]:
    """The live (non-zombie) processes and the process groups with one in them: a
    killed task's zombie, whose parent is gone, waits for init to reap it but runs
    nothing. A probe is not its group's leader (the executor's wrapper is), so its
    own pid is looked up too."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            out.add(int(fields[2]))
            out.add(int(stat.parent.name))
    return out


def group_alive(pgid: int) -> bool:
    return pgid in live_groups()


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def poll(condition: Callable[[], Any], timeout: float, interval: float) -> bool:
    """Poll `condition` until truthy (True) or `timeout` passes (False); API errors of a
    busy daemon count as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return True
        except ApiError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


#: What every lab daemon runs with (see the module doc): tasks in the host's view.
TASK_FLAGS: tuple[str, ...] = ("--task-user", "root") if os.geteuid() == 0 else ()


@attrs.define
class Lab:
    """N daemons, the probe, and the history of one scenario."""

    n: int
    preset: str = "local"
    flags: tuple[str, ...] = TASK_FLAGS
    seed: int = 1
    root: Path = attrs.field(factory=lambda: Path(tempfile.mkdtemp(prefix="populi-hist-")))
    rng: random.Random = attrs.field(init=False)
    mesh: Mesh = attrs.field(init=False)
    logdir: Path = attrs.field(init=False)
    probe: Path = attrs.field(init=False)
    live: dict[str, Daemon] = attrs.field(init=False, factory=dict)
    names: dict[int, str] = attrs.field(init=False, factory=dict)  # daemon pid -> name
    submits: list[Submit] = attrs.field(init=False, factory=list)
    submit_s: list[float] = attrs.field(init=False, factory=list)  # each submit's call
    returned: dict[str, float] = attrs.field(init=False, factory=dict)  # task -> when
    sent: dict[str, float] = attrs.field(init=False, factory=dict)  # task -> call began
    acks: list[Ack] = attrs.field(init=False, factory=list)
    killed: list[Killed] = attrs.field(init=False, factory=list)
    failovers: list[tuple[str, float]] = attrs.field(init=False, factory=list)
    seen_gone: dict[int, float] = attrs.field(init=False, factory=dict)  # probe pid -> when
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.root.chmod(0o711)
        (self.root / "mesh").mkdir()
        (self.root / "mesh").chmod(0o711)
        self.mesh = Mesh(self.root / "mesh", preset=self.preset)
        self.logdir = self.root / "runs"
        self.logdir.mkdir()
        self.logdir.chmod(0o1777)
        self.probe = self.root / "probe.py"
        shutil.copy(probe.__file__, self.probe)
        self.probe.chmod(0o644)

    ####
    # Daemons

    def start(self, timeout: float = 300.0) -> float:
        """Start every daemon; seconds until all see all alive (raises if they never do)."""
        t0 = time.monotonic()
        self._track(self.mesh.ready(self.spawn("d00")))
        for first in range(1, self.n, BATCH):
            up = list(self.live.values())
            batch = [
                self.spawn(f"d{i:02d}", "--bootstrap", self.rng.choice(up).address)
                for i in range(first, min(first + BATCH, self.n))
            ]
            for d in batch:
                self._track(self.mesh.ready(d, timeout=120.0))
            if not poll(self.converged, timeout, 0.5):
                raise TimeoutError(f"the first {len(self.live)} daemons never converged")
        return time.monotonic() - t0

    def spawn(self, name: str, *flags: str, **kwargs: Any) -> Daemon:
        """Start daemon `name` with the lab's flags, not waiting for it. A lab whose
        daemons live elsewhere (network namespaces) overrides this one place."""
        return self.mesh.spawn(name, *flags, *self.flags, **kwargs)

    def _track(self, d: Daemon) -> None:
        with self._lock:
            self.live[d.name] = d
            self.names[d.proc.pid] = d.name

    def converged(self) -> bool:
        """Every live daemon counts every live daemon alive."""
        want = len(self.live)
        return all(d.status()["cluster"]["members"]["alive"] == want for d in self.live.values())

    def kill(self, d: Daemon) -> Killed:
        """SIGKILL `d`, then watch its task process groups (its children, as the
        executor starts each task in a session of its own) until gone, for `WATCH_S`."""
        pid = d.proc.pid
        groups = children(pid)
        killed_at = time.time()
        d.proc.send_signal(signal.SIGKILL)
        with self._lock:
            del self.live[d.name]
        gone: dict[int, float | None] = dict.fromkeys(groups)
        while time.time() < killed_at + WATCH_S and None in gone.values():
            alive = live_groups()
            for g in [g for g, when in gone.items() if when is None and g not in alive]:
                gone[g] = time.time()
            time.sleep(0.01)  # polling /proc, bounded by WATCH_S
        d.proc.wait(timeout=10)
        record = Killed(d.name, pid, killed_at, gone, time.time())
        self.killed.append(record)
        return record

    def restart(self, name: str) -> Daemon:
        """Start `name` again on its state dir, joining through a live daemon."""
        seed = self.rng.choice(list(self.live.values()))
        state = self.mesh.root / name
        d = self.spawn(name, "--bootstrap", seed.address, state=state, prepare=False)
        self._track(self.mesh.ready(d, timeout=120.0))
        return d

    def stop(self, keep: bool = False) -> None:
        """Kill every daemon and every probe still running; remove the lab."""
        self.mesh.stop_all()
        for e in load_events(self.logdir):
            try:
                os.killpg(e.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)

    ####
    # Tasks

    def command(self, seconds: float, exit_code: int = 0) -> list[str]:
        python = task_python()
        return [python, str(self.probe), str(self.logdir), str(seconds), str(exit_code)]

    def submit(self, i: int, seconds: float, via: Via = "api", **spec: Any) -> str | None:
        """Submit task number `i` (a probe of `seconds`) through a live daemon picked by
        `i`; the task id, or None when no id came back."""
        with self._lock:  # kills and restarts change `live` from another thread
            daemons = sorted(self.live.values(), key=lambda d: d.name)
        d = daemons[i % len(daemons)]
        body = {"command": self.command(seconds), "env": {"HISTORY_SEQ": str(i)}, **spec}
        t0 = time.time()
        tid, acked = self._submit_cli(d, body) if via == "cli" else self._submit_api(d, body)
        t1 = time.time()
        with self._lock:
            self.submits.append(Submit(tid, acked, t1))
            self.submit_s.append(t1 - t0)
            if tid is not None:
                self.returned[tid] = t1
                self.sent[tid] = t0
        return tid

    @staticmethod
    def _submit_api(d: Daemon, body: dict[str, Any]) -> tuple[str | None, bool]:
        try:
            answer = ApiClient(d.client.socket_path, timeout=SUBMIT_TIMEOUT_S).post(
                "/v1/tasks", body
            )
        except ApiError as exc:
            stored = _STORED.search(str(exc))
            return (stored.group(1) if stored else None), False
        return str(answer["id"]), True

    @staticmethod
    def _submit_cli(d: Daemon, body: dict[str, Any]) -> tuple[str | None, bool]:
        env = [f"--env={k}={v}" for k, v in body.get("env", {}).items()]
        argv = [sys.executable, "-m", "populi_p2p.cli", "submit", "--state-dir",
                str(d.state_dir), *env, "--", *body["command"]]  # fmt: skip
        environ = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run(argv, capture_output=True, text=True, env=environ, timeout=60)
        if done.returncode == 0:
            return done.stdout.strip(), True
        stored = _STORED.search(done.stderr)
        return (stored.group(1) if stored else None), False

    def burst(self, tasks: int, submitters: int, seconds: float, via: Via = "api") -> list[str]:
        """`tasks` probes of `seconds` from `submitters` threads at once; the ids."""

        def submitter(k: int) -> list[str | None]:
            return [self.submit(i, seconds, via) for i in range(k, tasks, submitters)]

        with ThreadPoolExecutor(submitters) as pool:
            ids = [tid for batch in pool.map(submitter, range(submitters)) for tid in batch]
        return [tid for tid in ids if tid is not None]

    def cancel(self, tid: str) -> None:
        """Cancel through any live daemon, with an operator key of the lab's authority
        (without one only the accepting daemon may, and it may be dead); an
        acknowledged cancel joins the history."""
        from populi_p2p.cli_tasks import CANCEL_TIMEOUT
        from populi_p2p.trust.operator import OperatorKey, proof_to_json

        d = self.rng.choice(list(self.live.values()))
        operator, _ = OperatorKey.create(self.mesh.authority, now=time.time())
        proof = proof_to_json(operator.prove_cancel(tid, time.time()))
        # As `populi-node cancel` waits: a cancel that meets a running task is answered
        # once its owner stopped it (up to a lease's wait), not within the harness's 5 s.
        client = ApiClient(d.client.socket_path, timeout=CANCEL_TIMEOUT)
        client.post(f"/v1/tasks/{tid}/cancel", {"operator": proof})
        with self._lock:
            self.acks.append(Ack(tid, "cancel", time.time()))

    ####
    # Watching

    def events(self) -> list[ProbeEvent]:
        """The probe lines so far, each named by the daemon that started the run."""
        return [
            e if e.node else attrs.evolve(e, node=self.names.get(e.ppid))
            for e in load_events(self.logdir)
        ]

    def live_runs(self, tids: Iterable[str] | None = None) -> list[ProbeEvent]:
        """Start lines of runs of `tids` (default all) with no end line yet whose process
        is still alive. A run found dead without its end line is noted in `seen_gone`."""
        want = None if tids is None else set(tids)
        events = self.events()
        ended = {(e.task, e.pid) for e in events if e.event == "end"}
        alive, now = live_groups(), time.time()
        out = []
        for e in events:
            if e.event != "start" or (e.task, e.pid) in ended:
                continue
            if e.pid not in alive:  # it died without its end line: by now at the latest
                with self._lock:
                    self.seen_gone.setdefault(e.pid, now)
            elif want is None or e.task in want:
                out.append(e)
        return out

    def wait_running(self, tids: Iterable[str], timeout: float) -> bool:
        """Wait until each of `tids` has a live run; False on timeout."""
        want = set(tids)
        return poll(lambda: {e.task for e in self.live_runs(want)} >= want, timeout, 0.05)

    def kill_owner(self, tids: Iterable[str], restart: bool = False) -> str | None:
        """Kill -9 the daemon running one of `tids` now (by the probe's parent pid); the
        killed task's id. Its failover (kill to its next start) is measured by
        `failover_times`."""
        runs = [e for e in self.live_runs(tids) if e.node in self.live]
        if not runs:
            return None
        run = self.rng.choice(runs)
        record = self.kill(self.live[str(run.node)])
        with self._lock:
            self.failovers.append((run.task, record.killed_at))
        if restart:
            self.restart(record.node)
        return run.task

    def tables(self) -> list[NodeTable]:
        return [NodeTable.from_api(d.name, d.client.get("/v1/tasks")) for d in self.live.values()]

    def _settled(self, tids: Sequence[str]) -> bool:
        """Every task finished on every live daemon, all agreeing; successes first seen
        here become acks (the client learnt of them now)."""
        tables = []
        known = {a.task for a in self.acks}
        for d in list(self.live.values()):
            table = NodeTable.from_api(d.name, d.client.get("/v1/tasks"))
            now = time.time()  # when this answer reached the client
            tables.append(table)
            for tid in tids:
                row = table.rows.get(tid)
                if tid not in known and row is not None and row.phase == "succeeded":
                    self.acks.append(Ack(tid, "success", now))
                    known.add(tid)
        for tid in tids:
            rows = {t.rows.get(tid) for t in tables}
            if len(rows) != 1:
                return False
            (row,) = rows
            if row is None or not row.finished:
                return False
        return True

    def settle(self, tids: Sequence[str], timeout: float, interval: float = 0.2) -> bool:
        """Wait until every task is finished and agreed everywhere, then until no probe
        of them is still alive (its end line or its death recorded). False on timeout."""
        finished = poll(lambda: self._settled(tids), timeout, interval)
        quiet = poll(lambda: not self.live_runs(tids), timeout if finished else 1.0, 0.1)
        return finished and quiet

    def report(self) -> Report:
        self.live_runs()  # note the runs that died since the last look
        tables = self.tables()
        return check(self.events(), self.submits, self.acks, tables, self.killed,
                     seen_gone=self.seen_gone)  # fmt: skip

    ####
    # Measures

    def submit_to_start(self) -> list[float]:
        """First start of each task minus the moment its submit returned."""
        first: dict[str, float] = {}
        for e in self.events():
            if e.event == "start":
                first.setdefault(e.task, e.time)
        return [first[t] - r for t, r in self.returned.items() if t in first]

    def failover_times(self) -> list[float]:
        """For each killed owner: kill to its task's next start (nan: never again)."""
        starts = [e for e in self.events() if e.event == "start"]
        out = []
        for tid, at in self.failovers:
            later = [e.time for e in starts if e.task == tid and e.time > at]
            out.append(min(later) - at if later else float("nan"))
        return out
