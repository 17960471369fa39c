"""One real `populi-node up` on a machine with a GPU, checked as a user would check it.

Run by `scripts/device_gpu_check.sh` (which installs the wheels and tees the output);
it drives the daemon only through the `populi-node` command line. Steps, each printed
as one ``PASS``/``FAIL``/``SKIP`` line:

1. a cluster authority, a node key and its certificate (the `cluster`/`key` commands);
   the daemon starts and its API answers;
2. ``gpus --json`` shows what ``nvidia-smi`` shows (UUID, name, total memory from NVML);
3. a CPU task runs (the executor's path without a GPU);
4. a ``--gpus 1`` task gets the GPU by UUID in ``CUDA_VISIBLE_DEVICES`` and allocates
   memory on it with torch; while it holds the memory, ``gpus --probe --json`` shows it
   used; a second ``--gpus 1`` task stays pending (one GPU) until the first ends, then
   runs on the same GPU; the memory is free again afterwards;
5. with ``--deploy``: the tiny test model deployed with ``--gpus 1`` on llama.cpp's
   ``llama-server`` answers one chat completion through the OpenAI API.

Without a GPU (or without torch) the GPU steps say ``SKIP`` and why; with the fake NVML
(``LD_LIBRARY_PATH`` + ``FAKE_NVML_FIXTURE``, see tests/conftest.py) the placement steps
run with a shell holder instead of torch. Every wait has a deadline inside ``--budget``.
The holder task ends when the check writes ``release`` into its work directory (or at
its own cap), so nothing here sleeps for synchronization.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
GIB = 1 << 30
#: Bytes the holder task allocates on the GPU.
HOLD_BYTES = 2 * GIB
#: The longest the holder keeps the GPU if nobody releases it (seconds).
HOLD_CAP = 150

#: The torch holder: says what it was given, allocates HOLD_BYTES, and holds them until
#: the check writes ``release`` in its work directory (its cwd) or the cap passes.
TORCH_HOLDER = """
import os, sys, time
print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), flush=True)
import torch
print("torch=%s cuda=%s" % (torch.__version__, torch.version.cuda), flush=True)
print("device=" + torch.cuda.get_device_name(0), flush=True)
x = torch.ones(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("allocated=%d" % torch.cuda.memory_allocated(), flush=True)
end = time.monotonic() + float(sys.argv[2])
while not os.path.exists("release") and time.monotonic() < end:
    time.sleep(0.2)
ok = int(x.sum().item()) == x.numel()
print("released" if os.path.exists("release") else "cap", "sum_ok=%s" % ok, flush=True)
sys.exit(0 if ok else 3)
"""
#: The same holder without torch (no GPU memory): for the fake NVML and a GPU without torch.
SHELL_HOLDER = (
    'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; echo allocated=0; i=0;'
    ' while [ ! -e release ] && [ "$i" -lt "$1" ]; do sleep 0.2; i=$((i+1)); done; echo released'
)


class Checker:
    """The daemon under test, the results so far, and what goes to $OUT."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out
        self.root: Path = args.work
        self.state = self.root / "state"
        self.deadline = time.monotonic() + args.budget
        found = shutil.which("populi-node")
        self.node_cmd = [found] if found else [sys.executable, "-m", "populi_p2p.cli"]
        self.results: list[tuple[str, str, str]] = []
        self.daemon: subprocess.Popen[bytes] | None = None
        self.artifacts: dict[str, Any] = {"gpus": {}, "tasks": {}, "deploy": {}}

    # --- helpers ---------------------------------------------------------------------

    def result(self, step: str, verdict: str, detail: str) -> bool:
        self.results.append((step, verdict, detail))
        print(f"{verdict} {step}: {detail}", flush=True)
        return verdict != "FAIL"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def wait(self, what: str, probe: Callable[[], T | None], limit: float) -> T | None:
        """Poll `probe` (every 0.3 s) until it returns a value or `limit` (capped by the
        budget) passes; None then, and a line saying what was waited for."""
        limit = max(0.0, min(limit, self.left() - 5))
        end = time.monotonic() + limit
        while True:
            value = probe()
            if value is not None:
                return value
            if self.daemon is not None and self.daemon.poll() is not None:
                print(f"  (the daemon exited {self.daemon.returncode} while waiting for {what})")
                return None
            if time.monotonic() >= end:
                print(f"  (gave up waiting for {what} after {limit:.0f} s)", flush=True)
                return None
            time.sleep(0.3)  # a poll interval, not synchronization

    def cli(
        self, command: str, *args: str, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        argv = [*self.node_cmd, *command.split(), "--state-dir", str(self.state), *args]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout} s")

    def cli_json(self, command: str, *args: str, timeout: float = 60) -> Any:
        proc = self.cli(command, *args, "--json", timeout=timeout)
        if proc.returncode != 0:
            print(f"  ({command} --json: exit {proc.returncode}: {proc.stderr.strip()})")
            return None
        return json.loads(proc.stdout)

    # --- 1. the daemon ---------------------------------------------------------------

    def start_daemon(self) -> bool:
        auth = self.root / "authority"
        steps = [
            [*self.node_cmd, "cluster", "init", "--authority-dir", str(auth)],
            [*self.node_cmd, "key", "--state-dir", str(self.state)],
        ]
        outs = []
        for argv in steps:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                return self.result("enroll", "FAIL", f"{argv[1:3]}: {proc.stderr.strip()}")
            outs.append(proc.stdout.strip())
        enroll = [
            *self.node_cmd,
            "cluster",
            "enroll",
            outs[1],
            "--authority-dir",
            str(auth),
            "--out",
            str(self.state / "node.cert"),
        ]
        proc = subprocess.run(enroll, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            return self.result("enroll", "FAIL", proc.stderr.strip())
        shutil.copy(auth / "authority.pub", self.state / "authority.pub")
        flags = [
            "--name",
            "gpucheck",
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--peer-port",
            "0",
            "--overlay",
            "none",
            "--preset",
            "local",
        ]
        if self.args.deploy:
            flags += ["--api-listen", "127.0.0.1:0", "--deploy-engine", "llama-server"]
        if self.args.task_user:
            flags += ["--task-user", self.args.task_user]
        log = (self.root / "daemon.log").open("ab")
        argv = [*self.node_cmd, "up", "--state-dir", str(self.state), *flags]
        print("  $ " + " ".join(argv), flush=True)
        self.daemon = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        status = self.wait("the API to answer", self._status, 60)
        if status is None:
            return self.result("daemon_up", "FAIL", f"no answer; log: {self._daemon_tail()}")
        node = status["node"]
        return self.result("daemon_up", "PASS", f"node {node['node_id']} at {node['address']}")

    def _status(self) -> dict[str, Any] | None:
        if not (self.state / "api.sock").exists():
            return None
        proc = self.cli("status", "--json", timeout=10)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def _daemon_tail(self) -> str:
        path = self.root / "daemon.log"
        return path.read_text(errors="replace")[-1500:] if path.exists() else "(no log)"

    def stop_daemon(self) -> None:
        if self.daemon is None or self.daemon.poll() is not None:
            return
        self.daemon.send_signal(signal.SIGTERM)
        try:
            self.daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait(timeout=10)

    # --- 2. the GPU report -----------------------------------------------------------

    def gpus(self, probe: bool = False) -> list[dict[str, Any]] | None:
        data = self.cli_json("gpus", *(["--probe"] if probe else []), timeout=60)
        if data is None:
            return None
        report = data.get("report", data)
        gpus: list[dict[str, Any]] = report.get("gpus") or []
        return gpus

    def check_report(self, smi: list[dict[str, str]]) -> list[dict[str, Any]]:
        """The daemon's GPUs; PASS when they are nvidia-smi's, one for one."""
        gpus = self.wait("a GPU report", self.gpus, 30) or []
        self.artifacts["gpus"]["idle"] = gpus
        shown = [
            f"{g['name']} {g['memory_total'] / GIB:.1f} GiB used {g['memory_used']} B"
            f" ({g['provenance']['source']}, {g['health']['state']})"
            for g in gpus
        ]
        if not smi:
            verdict = "SKIP"
            why = "no nvidia-smi GPU here (fake NVML or none) to compare with"
            self.result("gpu_report", verdict, f"{why}; the daemon shows {shown or 'no GPU'}")
            return gpus
        wrong = []
        for row in smi:
            match = next((g for g in gpus if g["uuid"] == row["uuid"]), None)
            if match is None:
                wrong.append(f"{row['uuid']} missing")
                continue
            mib = match["memory_total"] // (1 << 20)
            if match["name"] != row["name"] or abs(mib - int(row["memory.total"])) > 1:
                wrong.append(
                    f"{match['name']}/{mib} MiB vs smi {row['name']}/{row['memory.total']}"
                )
            if match["provenance"]["source"] != "nvml" or match["health"]["state"] != "healthy":
                wrong.append(f"{match['uuid']}: {match['provenance']} {match['health']}")
        if len(gpus) != len(smi):
            wrong.append(f"{len(gpus)} GPUs in the report, {len(smi)} in nvidia-smi")
        verdict = "FAIL" if wrong else "PASS"
        self.result("gpu_report", verdict, "; ".join(wrong) or "; ".join(shown))
        return gpus

    # --- 3. a CPU task ---------------------------------------------------------------

    def submit(self, *args: str) -> str | None:
        proc = self.cli("submit", *args, timeout=60)
        if proc.returncode != 0:
            print(f"  (submit {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()})")
            return None
        return proc.stdout.strip().splitlines()[-1]

    def task(self, tid: str) -> dict[str, Any] | None:
        data: dict[str, Any] | None = self.cli_json("task", tid, timeout=20)
        return data

    def finished(self, tid: str, limit: float) -> dict[str, Any] | None:
        def ended() -> dict[str, Any] | None:
            task = self.task(tid)
            return task if task is not None and task["finished"] else None

        return self.wait(f"task {tid[:12]} to end", ended, limit)

    def record_task(self, label: str, tid: str) -> None:
        logs = {
            s: self.cli("logs", tid, *(["--stderr"] if s == "stderr" else []), timeout=30)
            for s in ("stdout", "stderr")
        }
        self.artifacts["tasks"][label] = {
            "task": self.task(tid),
            **{s: p.stdout[-20000:] for s, p in logs.items()},
        }

    def check_cpu_task(self) -> bool:
        say = 'echo "cpu task as uid $(id -u), CVD=[$CUDA_VISIBLE_DEVICES]"'
        tid = self.submit("--retries", "0", "--timeout", "60", "--", "sh", "-c", say)
        if tid is None:
            return self.result("cpu_task", "FAIL", "submit failed")
        done = self.finished(tid, 60)
        self.record_task("cpu", tid)
        if done is None or done["phase"] != "succeeded":
            return self.result("cpu_task", "FAIL", json.dumps(done)[-800:])
        tail = done["result"]["output_tail"].strip()
        return self.result("cpu_task", "PASS", tail)

    # --- 4. GPU tasks ----------------------------------------------------------------

    def release(self, tid: str) -> bool:
        """Write ``release`` in the task's work directory (root may; the task sees it)."""
        works = sorted((self.state / "tasks" / tid).glob("*/work"))
        if not works:
            print(f"  (no work directory for {tid[:12]} under {self.state / 'tasks'})")
            return False
        (works[-1] / "release").write_text("")
        return True

    def holder_argv(self) -> list[str]:
        """``--env`` flags, ``--``, and the holder command."""
        env = [f"--env={kv}" for kv in self.args.task_env]
        return [*env, "--", *self.holder_command()]

    def holder_command(self) -> list[str]:
        if self.args.torch_python:
            code = TORCH_HOLDER
            return [self.args.torch_python, "-c", code, str(HOLD_BYTES), str(HOLD_CAP)]
        return ["sh", "-c", SHELL_HOLDER, "holder", str(HOLD_CAP * 5)]

    def holder_output(self, tid: str) -> str | None:
        """The holder's stdout once it allocated; '' if it ended before that."""
        out = self.cli("logs", tid, timeout=20).stdout
        if "allocated=" in out:
            return out
        task = self.task(tid)
        return "" if task is not None and task["finished"] else None

    def used(self, uuid: str) -> int | None:
        gpus = self.gpus(probe=True) or []
        return next((int(g["memory_used"]) for g in gpus if g["uuid"] == uuid), None)

    def check_gpu_tasks(self, gpus: list[dict[str, Any]]) -> None:
        steps = (
            "gpu_task_uuid",
            "gpu_task_torch",
            "gpu_memory_used",
            "second_task_waits",
            "first_task_ends",
            "second_task_runs",
            "gpu_memory_freed",
        )
        if not gpus:
            for step in steps:
                self.result(step, "SKIP", "no GPU in the daemon's report (no GPU here)")
            return
        uuids = {g["uuid"]: g for g in gpus}
        first = self.submit(
            "--gpus",
            "1",
            "--kind",
            "training",
            "--retries",
            "0",
            "--timeout",
            str(HOLD_CAP + 60),
            *self.holder_argv(),
        )
        if first is None:
            self.result("gpu_task_uuid", "FAIL", "submit --gpus 1 failed")
            return
        started = time.monotonic()
        out = self.wait("the holder to allocate", lambda: self.holder_output(first), 150)
        if not out:
            self.record_task("first", first)
            self.result(
                "gpu_task_uuid",
                "FAIL",
                f"the holder never allocated: "
                f"{json.dumps(self.artifacts['tasks']['first'])[-1500:]}",
            )
            return
        lines = dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
        cvd = lines.get("CUDA_VISIBLE_DEVICES", "")
        gpu = uuids.get(cvd)
        self.result(
            "gpu_task_uuid",
            "PASS" if gpu else "FAIL",
            f"CUDA_VISIBLE_DEVICES={cvd} (report: {sorted(uuids)}),"
            f" allocated after {time.monotonic() - started:.1f} s",
        )
        self.check_torch_line(lines, gpu)
        self.check_memory_used(cvd, gpu, rising=True)
        second = self.check_second_waits(first, len(gpus))
        self.release(first)
        done = self.finished(first, 60)
        self.record_task("first", first)
        stdout = self.artifacts["tasks"]["first"]["stdout"]
        ok = done is not None and done["phase"] == "succeeded" and "released" in stdout
        self.result(
            "first_task_ends",
            "PASS" if ok else "FAIL",
            f"phase {done and done['phase']}, exit {done and done['exit_code']},"
            f" last line {stdout.strip().splitlines()[-1:]}",
        )
        self.check_second_runs(second, cvd)
        self.check_memory_used(cvd, gpu, rising=False)

    def check_torch_line(self, lines: dict[str, str], gpu: dict[str, Any] | None) -> None:
        if not self.args.torch_python:
            self.result("gpu_task_torch", "SKIP", "no torch with CUDA here: a shell holder ran")
            return
        name = lines.get("device", "")
        allocated = int(lines.get("allocated", "0"))
        ok = gpu is not None and name == gpu["name"] and allocated >= HOLD_BYTES
        self.result(
            "gpu_task_torch",
            "PASS" if ok else "FAIL",
            f"torch in the task: device {name!r} (report {gpu and gpu['name']!r}),"
            f" {allocated / GIB:.2f} GiB allocated, torch={lines.get('torch')}",
        )

    def check_memory_used(self, uuid: str, gpu: dict[str, Any] | None, rising: bool) -> None:
        step = "gpu_memory_used" if rising else "gpu_memory_freed"
        if not self.args.torch_python or gpu is None:
            self.result(step, "SKIP", "no GPU memory was taken (no torch with CUDA here)")
            return
        idle = int(gpu["memory_used"])

        def seen() -> int | None:
            now = self.used(uuid)
            if now is None:
                return None
            held = now - idle >= HOLD_BYTES * 3 // 4
            return now if held == rising else None

        started = time.monotonic()
        now = self.wait(
            "the report to show the memory " + ("used" if rising else "freed"), seen, 45
        )
        took = time.monotonic() - started
        report = self.gpus() or []
        self.artifacts["gpus"]["busy" if rising else "after"] = report
        last = next((g for g in report if g["uuid"] == uuid), None)
        used = int(last["memory_used"]) if last else -1
        offered = f"{last['capacity']['vram'] / GIB:.1f}" if last else "?"
        verdict = "PASS" if now is not None else "FAIL"
        self.result(
            step,
            verdict,
            f"idle {idle / GIB:.2f} GiB used, now {used / GIB:.2f} GiB (after {took:.1f} s of"
            f" gpus --probe); offered [B] {offered} GiB, idle {gpu['capacity']['vram'] / GIB:.1f}",
        )

    def check_second_waits(self, first: str, n_gpus: int) -> str | None:
        """A second ``--gpus 1`` task, submitted while the first holds the only GPU, must
        stay pending, saying why, as long as the first runs (more GPUs: it may run)."""
        second = self.submit(
            "--gpus",
            "1",
            "--retries",
            "0",
            "--timeout",
            "120",
            "--",
            "sh",
            "-c",
            'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"',
        )
        if second is None:
            self.result("second_task_waits", "FAIL", "submit failed")
            return None
        seen: list[str] = []
        end = time.monotonic() + 4
        while time.monotonic() < end:
            task, holder = self.task(second), self.task(first)
            if task is None or holder is None:
                break
            seen.append(f"{task['phase']}({task.get('why')})")
            if task["phase"] != "pending" or holder["phase"] != "running":
                break
        why = seen[-1] if seen else "no answer"
        ok = len(seen) >= 3 and all(s.startswith("pending") for s in seen)
        if n_gpus > 1:
            self.result("second_task_waits", "SKIP", f"{n_gpus} GPUs: it may run; {seen}")
            return second
        self.result(
            "second_task_waits",
            "PASS" if ok else "FAIL",
            f"{len(seen)} looks over 4 s while the first ran: last {why}",
        )
        return second

    def check_second_runs(self, second: str | None, cvd: str) -> None:
        if second is None:
            self.result("second_task_runs", "FAIL", "no second task")
            return
        done = self.finished(second, 60)
        self.record_task("second", second)
        tail = (done or {}).get("result") or {}
        got = (tail.get("output_tail") or "").strip()
        ok = (
            done is not None
            and done["phase"] == "succeeded"
            and got == f"CUDA_VISIBLE_DEVICES={cvd}"
        )
        self.result(
            "second_task_runs",
            "PASS" if ok else "FAIL",
            f"phase {done and done['phase']}, output {got!r}",
        )

    # --- 5. a deployment on llama-server --------------------------------------------

    def check_deploy(self, gpus: list[dict[str, Any]]) -> None:
        """The tiny model deployed with ``--gpus 1`` (0 without a GPU) answers a chat
        completion through this node's OpenAI API."""
        try:
            from populi_p2p.testing.tiny_gguf import write_tiny_llama

            model = write_tiny_llama(self.root / "tiny.gguf", seed=23)
        except Exception as exc:  # gguf missing, numpy missing: say so and go on
            self.result("deploy", "FAIL", f"cannot write the tiny model: {exc!r}")
            return
        record = self.artifacts["deploy"]
        add = self.cli("model add", str(model), "--name", "tiny", timeout=60)
        record["model_add"] = add.stdout + add.stderr
        n = "1" if gpus else "0"
        started = time.monotonic()
        wait = max(10.0, min(120.0, self.left() - 30))
        dep = self.cli("deploy", "tiny", "--gpus", n, "--wait", f"{wait:.0f}", timeout=wait + 30)
        took = time.monotonic() - started
        record["deploy"] = dep.stdout + dep.stderr
        record["deployments"] = self.cli_json("deployments")
        if add.returncode != 0 or dep.returncode != 0:
            self.result("deploy", "FAIL", f"model add/deploy: {(add.stderr + dep.stderr)[-800:]}")
            return
        replicas = [r for d in record["deployments"]["deployments"] for r in d["replicas"]]
        spec = self.task(replicas[0]["task"]) if replicas and replicas[0].get("task") else None
        record["replica_task"] = spec
        asked = spec["spec"]["requirements"]["gpus"] if spec else None
        self.result(
            "deploy",
            "PASS" if str(asked) == n or spec is None else "FAIL",
            f"serving after {took:.1f} s with --gpus {n} (replica task asks {asked})",
        )
        self.check_chat()
        gone = self.cli("undeploy", "tiny", timeout=60)
        record["undeploy"] = gone.stdout + gone.stderr

    def check_chat(self) -> None:
        record = self.artifacts["deploy"]
        requests = self.cli_json("requests") or {}
        port = requests.get("listening")
        body = {
            "model": "tiny",
            "max_tokens": 16,
            "temperature": 0,
            "messages": [{"role": "user", "content": "say something"}],
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=60) as answer:
                reply = json.loads(answer.read())
                node = answer.headers.get("x-populi-node")
        except Exception as exc:  # one line: what failed
            self.result("chat_completion", "FAIL", f"POST on port {port}: {exc!r}")
            return
        record["chat"] = reply
        text = reply["choices"][0]["message"]["content"]
        self.result(
            "chat_completion",
            "PASS" if text else "FAIL",
            f"{len(text)} chars from node {node}: {text!r}",
        )

    # --- the end ---------------------------------------------------------------------

    def save(self) -> None:
        """What comes back: at most four files in $OUT from here."""
        (self.out / "gpus.json").write_text(json.dumps(self.artifacts["gpus"], indent=1))
        (self.out / "tasks.json").write_text(json.dumps(self.artifacts["tasks"], indent=1))
        if self.args.deploy:
            (self.out / "deploy.json").write_text(json.dumps(self.artifacts["deploy"], indent=1))
        log = self.root / "daemon.log"
        if log.exists():
            (self.out / "daemon.log").write_bytes(log.read_bytes()[-8_000_000:])


def read_smi() -> list[dict[str, str]]:
    """nvidia-smi's GPUs (uuid, name, memory.total in MiB); none without it."""
    if shutil.which("nvidia-smi") is None:
        return []
    fields = ("uuid", "name", "memory.total")
    try:
        proc = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return []
    rows = [[c.strip() for c in line.split(",")] for line in proc.stdout.splitlines()]
    return [dict(zip(fields, row, strict=True)) for row in rows if len(row) == len(fields)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where results go ($OUT)")
    parser.add_argument("--work", type=Path, required=True, help="an empty directory")
    parser.add_argument("--budget", type=float, default=240, help="seconds for everything")
    parser.add_argument("--torch-python", help="a python whose torch sees CUDA, for the task")
    parser.add_argument("--deploy", action="store_true", help="also deploy on llama-server")
    parser.add_argument("--task-user", help="up --task-user (default: a uid per task)")
    parser.add_argument(
        "--task-env", action="append", default=[], metavar="K=V", help="the holder's --env"
    )
    args = parser.parse_args()
    # `timeout` stops this with SIGTERM: end through `finally` (the daemon, the files).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    checker = Checker(args)
    smi = read_smi()
    print(
        f"nvidia-smi GPUs: {smi or 'none'}; torch python: {args.torch_python or 'none'};"
        f" budget {args.budget:.0f} s",
        flush=True,
    )
    try:
        if checker.start_daemon():
            gpus = checker.check_report(smi)
            checker.check_cpu_task()
            checker.check_gpu_tasks(gpus)
            if args.deploy:
                checker.check_deploy(gpus)
    except Exception as exc:  # report the step that broke, then the summary
        checker.result("check_script", "FAIL", f"{exc!r}")
        raise
    finally:
        checker.stop_daemon()
        checker.save()
        failed = [step for step, verdict, _ in checker.results if verdict == "FAIL"]
        counts = {v: sum(r[1] == v for r in checker.results) for v in ("PASS", "FAIL", "SKIP")}
        print(f"daemon checks: {counts}; failed: {failed or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
