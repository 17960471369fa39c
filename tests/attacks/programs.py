"""The programs of the task-against-task attack (issue 18, row 3), and reading them.

Used by `test_attacks_tasks.py` against a real daemon and by
`tests/executor/test_isolation.py` against each isolation level.
"""

from __future__ import annotations

from pathlib import Path

SECRET = "populi-victim-secret-7f3a"

#: The victim: its secret in its environment and in a file of its work dir; then waits.
VICTIM = (
    "import os, time\n"
    "open('secret', 'w').write(os.environ['POPULI_SECRET'])\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)

#: The attacker, given the victim's pid as the daemon sees it and its secret file's
#: path: every way in, then a scan of every process it can see. One line per try.
ATTACKER = r"""
import errno, os, signal, sys
pid, secret, path = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]

def attempt(what, action):
    try:
        got = action()
    except OSError as exc:
        print(what, "refused", errno.errorcode.get(exc.errno, exc.errno))
        return
    print(what, "LEAK" if got is True or secret in got else "read-nothing")

def stop(target):
    os.kill(target, signal.SIGSTOP)
    return True

attempt("environ", lambda: open(f"/proc/{pid}/environ", "rb").read())
attempt("cwd-file", lambda: open(f"/proc/{pid}/cwd/secret", "rb").read())
attempt("work-file", lambda: open(path, "rb").read())
attempt("stop", lambda: stop(pid))
for name in os.listdir("/proc"):
    if name.isdigit() and int(name) != os.getpid():
        attempt(f"scan-{name}", lambda: open(f"/proc/{name}/environ", "rb").read())
        attempt(f"stop-{name}", lambda: stop(int(name)))
"""


def holding(secret: str) -> list[int]:
    """Live processes with `secret` in their environment (we are root: we may look)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if secret.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def state(pid: int) -> str:
    """The process's state letter (``T``: stopped)."""
    return (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0]


def refusals(output: str) -> dict[str, str]:
    """The attacker's tries that were refused, with the errno's name."""
    tries = dict(line.split(" ", 1) for line in output.splitlines() if " " in line)
    return {way: how.split()[1] for way, how in tries.items() if how.startswith("refused ")}
