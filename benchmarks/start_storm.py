"""N daemons started at once on loopback: how long until every API answers, how long
until everyone sees everyone alive, and what the logs said meanwhile.

    python benchmarks/start_storm.py --n 20 [--preset lan] [--base-port 27000]

Every daemon gets fixed ports (swim on `--base-port` + 2i, its peer API on the next
one: the default peer port is the swim port + 1, which would race the next daemon's
bind) and bootstraps through daemons 0 and 1, so all can be exec'd in the same instant.
Reported: when the last API answers, when every member first sees all N alive, and
whether that still holds `--hold` seconds later. Counted in the logs over the whole run
(until the end of the hold): `member.suspected`, `member.failed`, `self.refuted` and
`udp.blocked` lines (none of them is true here: nothing fails and nothing blocks UDP).
A daemon that exits ends the run with its log. Printed, not asserted; on a shared
machine the times are noisy.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from populi_p2p.api import ApiClient, ApiError  # noqa: E402
from tests.node.harness import Mesh  # noqa: E402

COUNTED = ("member.suspected", "member.failed", "self.refuted", "udp.blocked")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--preset", choices=("lan", "wan", "local"), default="lan")
    parser.add_argument("--base-port", type=int, default=27000)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--hold", type=float, default=15.0, help="seconds watched after")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    port = [args.base_port + 2 * i for i in range(args.n)]
    seeds = [f"127.0.0.1:{port[i]}" for i in range(min(2, args.n))]
    with tempfile.TemporaryDirectory() as tmp:
        mesh = Mesh(Path(tmp))
        states = [mesh.prepare(f"n{i:03d}") for i in range(args.n)]
        procs: list[subprocess.Popen[bytes]] = []
        logs = [Path(tmp) / f"n{i:03d}.log" for i in range(args.n)]
        started = time.monotonic()
        try:
            for i, state in enumerate(states):
                argv = [
                    sys.executable, "-m", "populi_p2p.cli", "up", "--state-dir", str(state),
                    "--name", f"n{i:03d}", "--bind", "127.0.0.1",
                    "--port", str(port[i]), "--peer-port", str(port[i] + 1),
                    "--overlay", "none", "--preset", args.preset,
                    *[x for s in seeds if s != f"127.0.0.1:{port[i]}"
                      for x in ("--bootstrap", s)],
                ]  # fmt: skip
                with logs[i].open("wb") as out:
                    procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=out))
            clients = [ApiClient(s / "api.sock", timeout=5.0) for s in states]

            def check_running() -> None:
                for i, proc in enumerate(procs):
                    if proc.poll() is not None:
                        tail = logs[i].read_text(errors="replace")[-2000:]
                        raise SystemExit(f"n{i:03d} exited ({proc.returncode}):\n{tail}")

            answered: set[int] = set()
            while len(answered) < args.n:
                for i, client in enumerate(clients):
                    if i not in answered and client.socket_path.exists():
                        try:
                            client.get("/v1/status")
                            answered.add(i)
                        except ApiError:
                            pass
                check_running()
                if time.monotonic() - started > args.timeout:
                    raise SystemExit(f"only {len(answered)} of {args.n} APIs answered")
                time.sleep(0.05)
            apis = time.monotonic() - started

            def all_alive() -> bool:
                try:
                    return all(
                        c.get("/v1/status")["cluster"]["members"]["alive"] == args.n
                        for c in clients
                    )
                except ApiError:
                    return False

            while not all_alive():
                check_running()
                if time.monotonic() - started > args.timeout:
                    raise SystemExit("no convergence within the timeout")
                time.sleep(0.1)
            converged = time.monotonic() - started
            lines_at_convergence = sum(
                1 for log in logs for line in log.read_text(errors="replace").splitlines()
                if any(what + " " in line for what in COUNTED)
            )  # fmt: skip
            # Watch a while longer: a false failure often comes after the first moment
            # at which everyone happened to see everyone.
            held_until = time.monotonic() + args.hold
            broken = 0
            while time.monotonic() < held_until:
                check_running()
                broken += not all_alive()
                time.sleep(0.5)
            still = all_alive()
            text = "".join(
                f"{log.stem} {line}\n"
                for log in logs
                for line in log.read_text(errors="replace").splitlines()
            )
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGKILL)
            for proc in procs:
                proc.wait()
    print(f"daemons                        {args.n} ({args.preset})")
    print(f"every API answers after        {apis:.2f} s")
    print(f"all see {args.n} alive after        {converged:.2f} s ({converged - apis:.2f} s more)")
    print(f"{args.hold:.0f} s later, all alive         {still} (not all alive at {broken} polls)")
    print(f"counted lines by convergence   {lines_at_convergence}")
    print(f"load average                   {os.getloadavg()}")
    for what in COUNTED:
        print(f"{what:<30} {text.count(what + ' ')}")
    for line in text.splitlines():
        if any(what + " " in line for what in COUNTED[1:]):
            print("  " + line[:160])


if __name__ == "__main__":
    main()
