"""The model commands of `populi-node`: model add, ls, rm, pull (docs/models.md).

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


MODEL_COMMANDS: Final = {"model": _cmd_model}
