"""The model commands of `populi-node`: model add, ls, rm, pull, and deploy,
deployments, undeploy (docs/models.md).

Each talks to the local daemon's API; the daemon does the copying and fetching, so a
pull goes on when the command is interrupted (running it again shows the progress).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from ._terminal import format_table, terminal_safe
from .api import ApiClient, ApiError

__all__ = ["MODEL_COMMANDS", "add_model_commands"]

#: Seconds between progress polls of ``model pull``.
PULL_POLL: Final = 0.5
#: How long ``model add`` waits for the daemon to copy and hash the file.
ADD_TIMEOUT: Final = 3600.0
#: How long ``deploy`` waits for every replica's submit (each acknowledged by a
#: majority of its replicas, at most 10 s each).
DEPLOY_TIMEOUT: Final = 120.0


def add_model_commands(sub: Any, add_state_dir: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``model`` and its actions to `populi-node`'s subparsers."""
    model = sub.add_parser("model", help="model files on the mesh: add, ls, rm, pull")
    msub = model.add_subparsers(
        dest="model_command", metavar="ACTION", required=True, parser_class=type(model)
    )
    add = msub.add_parser("add", help="store a model file as a blob the mesh can fetch")
    add_state_dir(add)
    add.add_argument("file", type=Path, help="the model file (e.g. a .gguf)")
    add.add_argument("--name", help="its name (default: the file's name)")
    ls = msub.add_parser("ls", help="the models held here and those members hold")
    add_state_dir(ls)
    ls.add_argument("--json", action="store_true", help="print JSON for scripts")
    rm = msub.add_parser("rm", help="delete a model blob held here")
    add_state_dir(rm)
    rm.add_argument("blob", help="name or hash")
    pull = msub.add_parser("pull", help="fetch a model from the members that hold it")
    add_state_dir(pull)
    pull.add_argument("blob", help="name or hash")
    pull.add_argument("--no-wait", action="store_true", help="start it and return")
    _add_deploy_commands(sub, add_state_dir)


def _add_deploy_commands(
    sub: Any, add_state_dir: Callable[[argparse.ArgumentParser], None]
) -> None:
    deploy = sub.add_parser("deploy", help="serve a model from N replicas placed on the mesh")
    add_state_dir(deploy)
    deploy.add_argument("model", help="a model name or blob hash the mesh holds (model ls)")
    deploy.add_argument("--replicas", type=int, default=1, help="how many (default 1)")
    deploy.add_argument("--gpus", type=int, default=0, help="GPUs per replica (default 0)")
    deploy.add_argument("--vram", help="VRAM per GPU a replica needs, e.g. 8GiB")
    deploy.add_argument("--ctx", type=int, default=0, help="context length (default: engine's)")
    deploy.add_argument("--as", dest="name", help="the model id clients use (default: its name)")
    deploy.add_argument("--wait", type=float, metavar="SECONDS",
                        help="wait until every replica serves, at most this long")  # fmt: skip
    deps = sub.add_parser("deployments", help="each deployed replica: its node and state")
    add_state_dir(deps)
    deps.add_argument("--json", action="store_true", help="print JSON for scripts")
    undeploy = sub.add_parser("undeploy", help="stop every replica of a deployment")
    add_state_dir(undeploy)
    undeploy.add_argument("name", help="the deployment (deployments lists them)")


def _client(args: argparse.Namespace, timeout: float | None = None) -> ApiClient:
    from .config import default_state_dir

    path = (args.state_dir if args.state_dir is not None else default_state_dir()) / "api.sock"
    return ApiClient(path) if timeout is None else ApiClient(path, timeout=timeout)


def _size(n: object) -> str:
    size = float(n) if isinstance(n, int | float) else 0.0
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _cmd_add(args: argparse.Namespace) -> None:
    path = args.file.expanduser().resolve()
    if not path.is_file():
        raise ApiError(f"{args.file} is not a file (give a model file, e.g. model.gguf)")
    row = _client(args, ADD_TIMEOUT).post(
        "/v1/blobs/add", {"path": str(path), "name": args.name or path.name}
    )
    print(f"{terminal_safe(row['name'])} {row['hash']} {_size(row['size'])}")


def _cmd_ls(args: argparse.Namespace) -> None:
    data = _client(args).get("/v1/blobs")
    if args.json:
        import json

        print(json.dumps(data, indent=2))
        return
    rows = []
    for r in data["local"]:
        where = "local" if r["complete"] else "partial"
        holders = f"+{len(r['holders'])}" if r["holders"] else ""
        rows.append([r["name"], r["hash"][:16], _size(r["size"]), where + holders,
                     ",".join(r["pins"][:2])])  # fmt: skip
    for r in data["mesh"]:
        rows.append([",".join(r["names"]), r["hash"][:16], _size(r["size"]),
                     f"{len(r['holders'])} holder(s)", ""])  # fmt: skip
    print(format_table(rows, ["NAME", "HASH", "SIZE", "WHERE", "PINNED BY"]))
    quota = _size(data["quota"]) if data["quota"] else "no quota"
    print(f"used {_size(data['used'])} of {quota}")


def _cmd_rm(args: argparse.Namespace) -> None:
    row = _client(args).post("/v1/blobs/rm", {"blob": args.blob})
    print(f"removed {terminal_safe(row['name'])} {row['hash']}")


def progress_line(row: dict[str, Any]) -> str:
    """One line: name, state, percent, MiB/s, holders used and skipped."""
    pct = 100.0 * row.get("done", 0) / max(row.get("chunks", 0) or 1, 1)
    holders = row.get("holders") or {}
    skipped = sum(1 for s in holders.values() if s.get("skipped"))
    rate = float(row.get("rate", 0.0)) / 2**20
    return (
        f"{terminal_safe(row['name'])} {row['state']} {pct:5.1f}% of {_size(row.get('size', 0))}"
        f" at {rate:.1f} MiB/s from {len(holders) - skipped} holder(s)"
        + (f", {skipped} skipped" if skipped else "")
    )


def _cmd_pull(args: argparse.Namespace) -> int:
    client = _client(args)
    row = client.post("/v1/blobs/pull", {"blob": args.blob})
    tty = sys.stdout.isatty()
    while not args.no_wait and row["state"] not in ("done", "failed"):
        print(("\r" if tty else "") + progress_line(row), end="" if tty else "\n", flush=True)
        time.sleep(PULL_POLL)
        row = client.get(f"/v1/blobs/progress?blob={row['hash']}")
    print(("\r" if tty else "") + progress_line(row), flush=True)
    if row["state"] == "failed":
        print(f"populi-node: error: {terminal_safe(row.get('error'))}", file=sys.stderr)
        return 1
    return 0


def _cmd_model(args: argparse.Namespace) -> int | None:
    actions = {"add": _cmd_add, "ls": _cmd_ls, "rm": _cmd_rm, "pull": _cmd_pull}
    return actions[args.model_command](args)


def _cmd_deploy(args: argparse.Namespace) -> int:
    from .gpu._labels import parse_size

    try:
        vram = parse_size(args.vram) if args.vram else 0
    except ValueError as exc:
        raise ApiError(f"--vram: {exc}") from None
    body = {"model": args.model, "replicas": args.replicas, "gpus": args.gpus, "vram": vram,
            "ctx": args.ctx, "name": args.name}  # fmt: skip
    client = _client(args, DEPLOY_TIMEOUT)
    done = client.post("/v1/deploy", body)
    print(f"deployed {terminal_safe(done['name'])}: {len(done['tasks'])} replica(s) of blob"
          f" {done['blob'][:16]} ({_size(done['size'])})")  # fmt: skip
    if args.wait is None:
        return 0
    deadline, shown = time.monotonic() + args.wait, ""
    while True:
        rows = _replicas_of(client.get("/v1/deployments"), done["name"])
        line = ", ".join(f"#{r['index']} {r['state']}" for r in rows)
        if line != shown:
            print(terminal_safe(line), flush=True)
            shown = line
        if rows and all(r["state"] == "serving" for r in rows):
            return 0
        if time.monotonic() >= deadline:
            print(f"populi-node: error: not every replica serves after {args.wait:.0f} s"
                  " (see populi-node deployments)", file=sys.stderr)  # fmt: skip
            return 1
        time.sleep(PULL_POLL)


def _replicas_of(data: dict[str, Any], name: str) -> list[dict[str, Any]]:
    found = [d["replicas"] for d in data["deployments"] if d["name"] == name]
    return found[0] if found else []


def _cmd_deployments(args: argparse.Namespace) -> None:
    data = _client(args).get("/v1/deployments")
    if args.json:
        import json

        print(json.dumps(data, indent=2))
        return
    rows = [[d["name"], f"#{r['index']}", r["node"] or "-", r["task"][:12], r["state"]]
            for d in data["deployments"] for r in d["replicas"]]  # fmt: skip
    print(format_table(rows, ["MODEL", "REPLICA", "NODE", "TASK", "STATE"]) if rows
          else "no deployments (populi-node deploy NAME --replicas N)")  # fmt: skip


def _cmd_undeploy(args: argparse.Namespace) -> None:
    done = _client(args, DEPLOY_TIMEOUT).post("/v1/undeploy", {"name": args.name})
    print(f"undeployed {terminal_safe(done['name'])}: {len(done['cancelled'])} replica(s) stopped")


MODEL_COMMANDS: Final = {
    "model": _cmd_model,
    "deploy": _cmd_deploy,
    "deployments": _cmd_deployments,
    "undeploy": _cmd_undeploy,
}
