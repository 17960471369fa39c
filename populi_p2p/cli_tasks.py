"""The task commands of `populi-node`: submit, tasks, task, explain, cancel, drain.

Each talks to the local daemon's API (see `api`), and every bad argument is caught
here, before the daemon is asked, as one line saying what is wrong: the spec is built
and validated locally (`leases.TaskSpec`), so a bad spec is never stored anywhere.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from ._duration import parse_duration
from ._terminal import format_table, terminal_safe
from .api import ApiClient, ApiError

__all__ = ["TASK_COMMANDS", "add_task_commands"]

#: Seconds between polls of `submit --wait`.
WAIT_POLL: Final = 0.2
#: How long `submit` waits for the daemon (the acks wait up to 10 s).
SUBMIT_TIMEOUT: Final = 30.0
#: A submit with inputs also waits for k members to hold them (docs/artifacts.md).
INPUT_SUBMIT_TIMEOUT: Final = 300.0
#: Seconds `cancel` waits for the daemon: a cancel that meets a live lease is final once
#: the owner stopped, or after the lease and its margin (the wan preset: 37.5 s) if the
#: owner died.
CANCEL_TIMEOUT: Final = 60.0
#: Seconds `submit --wait` keeps copying output after the task ended (its last bytes).
DRAIN_WAIT: Final = 10.0
#: The longest `fetch` waits for the daemon to fetch and write a task's outputs.
FETCH_TIMEOUT: Final = 600.0


class TaskCliError(Exception):
    """One line for stderr (exit 1)."""


def add_task_commands(sub: Any, add_state_dir: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the task subcommands to `populi-node`'s subparsers."""
    s = sub.add_parser("submit", help="run a command on the mesh: submit [flags] -- CMD ARGS")
    add_state_dir(s)
    s.add_argument("--gpus", type=int, default=0, help="GPUs on one node (default 0)")
    s.add_argument("--vram", metavar="SIZE", help="VRAM per GPU (with --gpus), e.g. 16GiB")
    s.add_argument("--min-cc", metavar="X.Y", default="0.0", help="minimum compute capability")
    s.add_argument("--cpus", type=float, default=0.0, help="CPU cores")
    s.add_argument("--ram", metavar="SIZE", help="RAM, e.g. 8GiB")
    s.add_argument("--label", action="append", default=[], metavar="K=V", help="required label")
    s.add_argument("--prefer", action="append", default=[], metavar="K=V", help="preferred label")
    s.add_argument("--kind", choices=("batch", "inference", "training", "agent"), default="batch")
    s.add_argument("--timeout", default="1h", help="run time limit, e.g. 90s, 30m, 1h")
    s.add_argument(
        "--retries", type=int, default=2,
        help="retries after a non-zero exit (none for a command not found or not executable)",
    )  # fmt: skip
    s.add_argument("--env", action="append", default=[], metavar="K=V", help="environment")
    s.add_argument(
        "--no-network", action="store_true", help="run without network (or fail to start)"
    )
    s.add_argument(
        "--input", action="append", default=[], metavar="FILE|DIR[:NAME]",
        help="a file or directory the task finds in $POPULI_INPUT_DIR/NAME (stored here,"
        " fetched by the owner; repeatable)",
    )  # fmt: skip
    s.add_argument(
        "--output", action="append", default=[], metavar="PATH",
        help="a file or directory (relative to the work dir) kept when the task succeeds,"
        " held by k members: populi-node fetch TASK (repeatable)",
    )  # fmt: skip
    s.add_argument(
        "--checkpoint", action="store_true",
        help="snapshot $POPULI_CHECKPOINT_DIR when the task touches its .request file and"
        " on a handoff; the next owner restores the latest (docs/artifacts.md)",
    )  # fmt: skip
    s.add_argument(
        "--checkpoint-every", metavar="DURATION",
        help="--checkpoint, and a snapshot every DURATION too (e.g. 60s, 10m)",
    )  # fmt: skip
    s.add_argument("--wait", action="store_true", help="follow the task; exit with its code")
    s.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND", help="-- COMMAND ARGS...")
    t = sub.add_parser("tasks", help="the tasks the mesh holds")
    add_state_dir(t)
    t.add_argument("--phase", help="only tasks in this phase (pending, running, ...)")
    t.add_argument("--owner", help="only tasks owned by this node (name or id prefix)")
    t.add_argument("--json", action="store_true", help="print JSON for scripts")
    for name, text in (
        ("task", "one task: spec, epochs, result"),
        ("explain", "why a task went where it did"),
        ("cancel", "cancel a task everywhere (it never restarts)"),
    ):
        p = sub.add_parser(name, help=text)
        add_state_dir(p)
        p.add_argument("task", help="task id (or a unique prefix)")
        p.add_argument("--json", action="store_true", help="print JSON for scripts")
        if name == "cancel":
            p.add_argument(
                "--operator-key",
                type=Path,
                metavar="FILE",
                help="an operator key (populi-node cluster operator): cancel a task that"
                " another node accepted",
            )
    f = sub.add_parser("fetch", help="a finished task's outputs, from any node that holds them")
    add_state_dir(f)
    f.add_argument("task", help="task id (or a unique prefix)")
    f.add_argument("--to", type=Path, default=Path("."), help="directory (default: here)")
    g = sub.add_parser("logs", help="a task's full output (fetched from the node that ran it)")
    add_state_dir(g)
    g.add_argument("task", help="task id (or a unique prefix)")
    g.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    g.add_argument("--stderr", action="store_true", help="stderr instead of stdout")
    d = sub.add_parser("drain", help="take no new work (--handoff: move running tasks on)")
    add_state_dir(d)
    d.add_argument("--handoff", action="store_true", help="stop running tasks; re-place them")
    u = sub.add_parser("undrain", help="take work again")
    add_state_dir(u)


def build_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON spec from `submit`'s flags, validated like the daemon will.

    Raises:
        TaskCliError: one line naming the bad flag.
    """
    from .gpu._labels import parse_size
    from .leases import Requirements, TaskKind, TaskSpec, check_new_requirements

    command = list(args.argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise TaskCliError("no command given: put it after --, e.g. submit -- python job.py")
    try:
        vram = parse_size(args.vram) if args.vram else 0
        ram = parse_size(args.ram) if args.ram else 0
    except ValueError as exc:
        raise TaskCliError(f"--vram/--ram: {exc}") from None
    try:
        timeout = parse_duration(args.timeout)
    except ValueError as exc:
        raise TaskCliError(f"--timeout: {exc}") from None
    env = {}
    for item in args.env:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise TaskCliError(f"--env {item!r}: expected K=V")
        env[key] = value
    for flag, labels in (("--label", args.label), ("--prefer", args.prefer)):
        for label in labels:
            if "=" not in label or label.startswith("="):
                raise TaskCliError(f"{flag} {label!r}: expected k=v")
    # Namespaces built by callers other than the parser may lack the artifact flags.
    inputs, outputs = getattr(args, "input", []), getattr(args, "output", [])
    checkpoint_every = _checkpoint_every(args)
    major, dot, minor = args.min_cc.partition(".")
    if not (major.isdigit() and (not dot or minor.isdigit())):
        raise TaskCliError(f"--min-cc {args.min_cc!r}: expected a version like 8.0")
    spec = {
        "kind": args.kind, "gpus": args.gpus, "vram": vram, "min_cc": args.min_cc,
        "cpus": args.cpus, "ram": ram, "labels": args.label, "prefer": args.prefer,
        "timeout": timeout, "retries": args.retries, "env": env, "command": command,
        "no_network": args.no_network, "outputs": outputs,
    }  # fmt: skip
    if checkpoint_every is not None:
        spec["checkpoint_every"] = checkpoint_every
    if inputs:
        from .artifacts.service import parse_input_arg

        spec["input_files"] = [parse_input_arg(arg) for arg in inputs]
    try:  # the daemon validates the same way: check here so nothing bad is sent
        cc = (int(major), int(minor or 0))
        req = Requirements(args.gpus, vram, cc, args.cpus, ram, args.label, args.prefer)
        TaskSpec(
            kind=TaskKind(args.kind),
            requirements=req,
            command=tuple(command),
            env=env,
            timeout=timeout,
            retry_limit=args.retries,
            submitted_by="cli",
            outputs=outputs,
            checkpoint_every=checkpoint_every,
        )
    except ValueError as exc:
        raise TaskCliError(f"bad task: {exc}") from None
    try:
        check_new_requirements(req)
    except ValueError as exc:  # its line already names the flags and the fix
        raise TaskCliError(str(exc)) from None
    return spec


def _checkpoint_every(args: argparse.Namespace) -> float | None:
    """``--checkpoint-every`` in seconds, 0.0 for ``--checkpoint`` alone, None: off."""
    every = getattr(args, "checkpoint_every", None)
    if every is None:
        return 0.0 if getattr(args, "checkpoint", False) else None
    try:
        seconds = parse_duration(every)
    except ValueError as exc:
        raise TaskCliError(f"--checkpoint-every: {exc}") from None
    if seconds <= 0:
        raise TaskCliError("--checkpoint-every: give a duration above 0, e.g. 60s")
    return float(seconds)


def _client(args: argparse.Namespace, timeout: float | None = None) -> ApiClient:
    from .config import default_state_dir

    state_dir = args.state_dir if args.state_dir is not None else default_state_dir()
    if timeout is None:
        return ApiClient(state_dir / "api.sock")
    return ApiClient(state_dir / "api.sock", timeout=timeout)


def _cmd_submit(args: argparse.Namespace) -> int | None:
    spec = build_spec(args)
    timeout = INPUT_SUBMIT_TIMEOUT if spec.get("input_files") else SUBMIT_TIMEOUT
    client = _client(args, timeout=timeout)
    answer = client.post("/v1/tasks", spec)
    task_id = str(answer["id"])
    print(task_id, flush=True)
    if not args.wait:
        return None
    try:
        return _follow(client, task_id)
    except KeyboardInterrupt:
        # The task lives in the mesh, not in this command: say how to stop it.
        where = f" --state-dir {args.state_dir}" if args.state_dir is not None else ""
        print(f"\nstill running: populi-node cancel {task_id}{where}", file=sys.stderr)
        raise


#: Claim phases at which an epoch has run (its output exists on its owner).
_RAN: Final = ("running", "released", "failed", "succeeded")


class _Output:
    """A task's stdout and stderr copied to ours as the owner writes them, as
    `logs --follow` does; a new epoch (a retry, possibly elsewhere) starts from 0."""

    def __init__(self, client: ApiClient, task_id: str) -> None:
        self._client, self._task_id = client, task_id
        self._epoch = 0
        self._offsets = {"stdout": 0, "stderr": 0}
        self._done = {"stdout": False, "stderr": False}
        #: Why the output could not be read at the last try (its owner is gone or
        #: silent): tried again at the next poll, said once the task has ended.
        self.error: str | None = None

    def follow_epoch(self, task: dict[str, Any]) -> bool:
        """Switch to the task's latest epoch once it has run; True when it is new."""
        ran = [e["epoch"] for e in task.get("epochs", []) if e.get("phase") in _RAN]
        latest = max(ran, default=0)
        if latest <= self._epoch:
            return False
        self._epoch = latest
        self._offsets = {"stdout": 0, "stderr": 0}
        self._done = {"stdout": False, "stderr": False}
        return True

    @property
    def started(self) -> bool:
        """Whether an epoch of the task has run (there is output to copy)."""
        return self._epoch > 0

    def copy(self) -> bool:
        """Copy what is new on both streams; True once both have ended."""
        if self._epoch == 0:
            return False
        for stream, out in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            while not self._done[stream]:
                query = f"stream={stream}&offset={self._offsets[stream]}"
                try:
                    chunk = self._client.get(f"/v1/tasks/{self._task_id}/logs?{query}")
                except ApiError as exc:
                    self.error = str(exc)
                    return False
                self.error = None
                data = base64.b64decode(chunk["data"])
                out.flush()
                out.buffer.write(data)
                out.buffer.flush()
                self._offsets[stream] = int(chunk["offset"])
                self._done[stream] = bool(chunk["done"])
                if not data:
                    break
        return all(self._done.values())


def _member_names(client: ApiClient) -> dict[str, str]:
    """Node id -> name, for the members this node lists: people read names, scripts
    read the ids in ``--json``."""
    return {m["node_id"]: m["name"] for m in client.get("/v1/members") if m.get("name") != "?"}


def _named(text: str, names: dict[str, str]) -> str:
    """`text` with each node id in it written as its member's name."""
    for node_id, name in names.items():
        text = text.replace(node_id, name)
    return text


def _owner_name(owner: str | None, names: dict[str, str]) -> str:
    return "-" if not owner else names.get(owner, owner[:12])


def _follow(client: ApiClient, task_id: str) -> int:
    """Stream the task's output until it ends, with a line on stderr at each change of
    phase, epoch or owner; its exit code."""
    started = time.monotonic()
    last = ""
    output = _Output(client, task_id)
    names = _member_names(client)
    while True:
        task = client.get(f"/v1/tasks/{task_id}")
        owner = task.get("owner")
        if owner and owner not in names:
            names = _member_names(client)  # a member we had not heard of when we began
        owner_name = _owner_name(owner, names)
        line = terminal_safe(f"{task['phase']} epoch {task['epoch']} owner {owner_name}")
        if line != last:
            print(f"{line} {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
            last = line
        output.follow_epoch(task)
        ended = output.copy()
        if task.get("finished"):
            # The last bytes written before the end (bounded: an owner that keeps
            # saying "not done" does not hold the exit code back).
            deadline = time.monotonic() + DRAIN_WAIT
            while not ended and output.started and time.monotonic() < deadline:
                time.sleep(WAIT_POLL)
                ended = output.copy()
            if not ended and output.error is not None:
                print(terminal_safe(f"output not read to its end: {output.error}"), file=sys.stderr)
            code = task.get("exit_code")
            return int(code) if isinstance(code, int) and 0 <= code < 256 else 1
        time.sleep(WAIT_POLL)  # a poll of the daemon's API, not synchronisation


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _cmd_tasks(args: argparse.Namespace) -> None:
    client = _client(args)
    rows: list[dict[str, Any]] = client.get("/v1/tasks")
    names = _member_names(client)
    if args.phase:
        rows = [r for r in rows if r["phase"] == args.phase]
    if args.owner:
        rows = [
            r for r in rows
            if r["owner"] and (r["owner"].startswith(args.owner)
                               or names.get(r["owner"]) == args.owner)
        ]  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return
    table = [
        [r["id"][:12], r["kind"] or "?", r["phase"], str(r["epoch"]),
         _owner_name(r["owner"], names), _age(r["age"]), r["why"] or ""]
        for r in rows
    ]  # fmt: skip
    print(format_table(table, ["ID", "KIND", "PHASE", "EPOCH", "OWNER", "AGE", "WHY PENDING"]))


def _cmd_task(args: argparse.Namespace) -> None:
    client = _client(args)
    task = client.get(f"/v1/tasks/{args.task}")
    if args.json:
        print(json.dumps(task, indent=2, sort_keys=True))
        return
    spec = task.get("spec") or {}
    lines = [
        f"task     {task['id']}",
        f"phase    {task['phase']} (epoch {task['epoch']})",
        f"command  {' '.join(spec.get('command', []))}",
        f"kind     {spec.get('kind')}",
        f"needs    {json.dumps(spec.get('requirements', {}), sort_keys=True)}",
    ]
    names = _member_names(client)
    if spec.get("replicas"):  # the primary first (docs/leases.md, "Small meshes, quorums")
        shown = " ".join(_owner_name(r, names) for r in spec["replicas"])
        lines.append(f"replicas {shown}")
    for i in spec.get("inputs", []):
        kind = "dir" if i.get("dir") else "file"
        lines.append(f"input    {i['name']} ({kind}, {i['size']} bytes) sha256 {i['sha256'][:16]}")
    for e in task["epochs"]:
        code = "" if e["exit_code"] is None else f" exit {e['exit_code']}"
        lines.append(f"epoch {e['epoch']}: {_owner_name(e['owner'], names)} {e['phase']}{code}")
    if task.get("why"):
        lines.append(f"pending  {task['why']}")
    lines += _checkpoint_lines(task.get("checkpoint"), spec, names)
    lines += _holder_lines(client, task["id"], names)
    result = task.get("result")
    if result is not None:
        lines.append(f"result   exit {result['exit_code']} in {result['duration']:.1f}s")
        held = " ".join(_owner_name(h, names) for h in result.get("holders", []))
        for o in result.get("outputs", []):
            kind = "dir" if o["dir"] else "file"
            lines.append(f"output   {o['path']} ({kind}, {o['size']} bytes) sha256"
                         f" {o['sha256'][:16]} held by {held}")  # fmt: skip
    for line in lines:
        print(terminal_safe(line))
    if result is not None:
        # The task's own output: its lines kept, anything that would drive the terminal
        # (escapes, carriage returns) shown escaped.
        print(terminal_safe(result["output_tail"], keep_newlines=True))


def _holder_lines(client: ApiClient, task_id: str, names: dict[str, str]) -> list[str]:
    """``held now`` lines of ``task``: who holds each input, output and snapshot now
    (the members asked at this moment, not the names the result or record gives)."""
    try:
        answer = client.get(f"/v1/artifacts/holders?task={task_id}")
    except ApiError:
        return []
    lines = []
    for row in answer.get("blobs", []):
        held = " ".join(_owner_name(h, names) for h in row["holders"]) or "nobody reachable"
        lines.append(f"held now {row['what']} {row['name']} sha256 {row['sha256'][:16]}: {held}")
    return lines


def _checkpoint_lines(ck: Any, spec: dict[str, Any], names: dict[str, str]) -> list[str]:
    """``checkpoint`` lines of ``task``: the latest snapshot, or why there is none."""
    if spec.get("checkpoint_every") is None:
        return []
    if not ck:
        return ["checkpoint none recorded yet"]
    if not ck["sha256"]:
        return [f"checkpoint none: epoch {ck['epoch']} started with nothing to restore"]
    held = " ".join(_owner_name(h, names) for h in ck["holders"])
    return [f"checkpoint epoch {ck['taken_in']} (recorded at epoch {ck['epoch']}, #{ck['seq']})"
            f" {ck['size']} bytes sha256 {ck['sha256'][:16]} held by {held}"]  # fmt: skip


def _cmd_explain(args: argparse.Namespace) -> None:
    client = _client(args)
    answer = client.get(f"/v1/tasks/{args.task}/explain")
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True))
        return
    names = _member_names(client)
    for line in (
        f"task {answer['id']} ({answer['phase']})",
        f"lease:     {_named(answer['claim'] or 'never claimed', names)}",
        f"placement: {_named(answer['placement'] or 'not placed by this node yet', names)}",
    ):
        print(terminal_safe(line))


def _cmd_cancel(args: argparse.Namespace) -> None:
    """Cancel; with --operator-key, sign a proof for this one task here (the secret key
    never goes to the daemon) and send the proof with the cancel. A cancel that meets a
    live lease waits for its owner to stop, or for the lease to lapse if it died."""
    client = _client(args, CANCEL_TIMEOUT)
    body = None
    if args.operator_key is not None:
        from .trust.operator import OperatorKey, proof_to_json

        key = OperatorKey.read(args.operator_key)  # KeyFileError: main prints one line
        tid = str(client.get(f"/v1/tasks/{args.task}")["id"])  # a prefix: the whole id
        body = {"operator": proof_to_json(key.prove_cancel(tid, time.time()))}
    answer = client.post(f"/v1/tasks/{args.task}/cancel", body)
    print(terminal_safe(f"cancelled {answer['id']}"))


def _cmd_logs(args: argparse.Namespace) -> None:
    """Print the output from offset 0; with --follow, keep asking until it ended."""
    client = _client(args)
    stream = "stderr" if args.stderr else "stdout"
    offset = 0
    out = sys.stdout.buffer
    while True:
        chunk = client.get(f"/v1/tasks/{args.task}/logs?stream={stream}&offset={offset}")
        data = base64.b64decode(chunk["data"])
        out.write(data)
        out.flush()
        offset = int(chunk["offset"])
        if chunk["done"] or (not data and not args.follow):
            return
        if not data:
            time.sleep(WAIT_POLL)  # a poll of the daemon's API, not synchronisation


def _cmd_fetch(args: argparse.Namespace) -> None:
    client = _client(args)
    task_id = str(client.get(f"/v1/tasks/{args.task}")["id"])
    to = str(args.to.resolve())
    answer = _client(args, timeout=FETCH_TIMEOUT).post(
        "/v1/artifacts/fetch", {"task": task_id, "to": to}
    )
    for row in answer["outputs"]:
        kind = "dir " if row["dir"] else "file"
        print(f"{kind} {row['to']}  {row['size']} bytes  sha256 {row['sha256'][:16]}")


def _cmd_drain(args: argparse.Namespace) -> None:
    answer = _client(args).post("/v1/drain", {"handoff": args.handoff})
    more = f", handing off {answer['running']} running" if args.handoff else ""
    print(f"draining: no new work lands here{more}")


def _cmd_undrain(args: argparse.Namespace) -> None:
    _client(args).post("/v1/undrain")
    print("taking work again")


def _wrap(
    command: Callable[[argparse.Namespace], int | None],
) -> Callable[[argparse.Namespace], int | None]:
    def run(args: argparse.Namespace) -> int | None:
        try:
            return command(args)
        except TaskCliError as exc:
            raise ApiError(str(exc)) from None  # main prints it as one line, exit 1

    return run


TASK_COMMANDS: Final = {
    "submit": _wrap(_cmd_submit),
    "tasks": _wrap(_cmd_tasks),
    "task": _wrap(_cmd_task),
    "explain": _wrap(_cmd_explain),
    "cancel": _wrap(_cmd_cancel),
    "logs": _wrap(_cmd_logs),
    "fetch": _wrap(_cmd_fetch),
    "drain": _wrap(_cmd_drain),
    "undrain": _wrap(_cmd_undrain),
}
