"""`populi-node`: run a node (`up`), ask it questions, and manage the cluster authority.

Every command either succeeds or prints exactly ONE line on stderr that says what is
wrong and how to fix it, and exits non-zero (2 for a bad command line, 1 for everything
else). A traceback reaching an operator is a bug. The commands that talk to a running
daemon use its control API over the unix socket in the state directory (see `api`).

Commands::

    populi-node up [flags]                 run the daemon in the foreground
    populi-node status [--json]            this node, overlay, cluster summary
    populi-node members [--json]           the member table
    populi-node gpus [--json] [--probe]    this node's GPUs (--probe: re-probe now)
    populi-node leave                      graceful leave, then the daemon exits
    populi-node submit [flags] -- CMD ARGS run a task on the mesh (--wait: follow it)
    populi-node tasks [--phase P] [--json] the tasks the mesh holds
    populi-node task|explain|cancel TASK   one task; why it went where; cancel it
    populi-node drain [--handoff]|undrain  take no new work / take work again
    populi-node key                        print this node's public key (to enroll it)
    populi-node cluster init               create a cluster authority
    populi-node cluster enroll KEY         issue an enrollment certificate
    populi-node cluster revoke             sign a revocation (by serial, node key or API key)
    populi-node cluster apikey create      sign an API key for the inference API
    populi-node cluster operator           make an operator key (may cancel any task)
    populi-node requests                   the inference API's recent routes
    populi-node model add FILE [--name N]  store a model file as a blob the mesh can fetch
    populi-node model ls|rm|pull           list, delete, fetch from holders (progress line)
    populi-node version [--json]           this program's version and the daemon's
    populi-node --version                  this program's version
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

import platformdirs

from ._duration import parse_duration
from ._terminal import format_table, terminal_safe
from .api import ApiClient, ApiError
from .cli_models import MODEL_COMMANDS, add_model_commands
from .cli_tasks import TASK_COMMANDS, add_task_commands
from .config import (
    SETTINGS,
    ConfigError,
    NodeConfig,
    check_arguments,
    default_state_dir,
    shown,
)
from .settings import add_argument
from .trust._keyfiles import KeyFileError, decode_public_key, encode_public_key

__all__ = ["main", "parse_duration"]

_PROG = "populi-node"


class CliError(Exception):
    """A one-line failure to print on stderr (exit 1)."""


class _UsageError(Exception):
    """A bad command line (exit 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line instead of usage text plus the error."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message} (see {self.prog} --help)")


def _default_authority_dir() -> Path:
    return Path(platformdirs.user_data_dir("populi", appauthor=False)) / "authority"


########################################################################################
# The parser


def _add_state_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"the node's state directory (default {default_state_dir()})",
    )


def _add_up(up: argparse.ArgumentParser) -> None:
    """The `up` flags: one per setting, each made from its declaration (`NodeConfig`)."""
    for position, name in enumerate(SETTINGS):
        add_argument(up, NodeConfig, name)
        if position == 0:  # after --state-dir, as ever
            up.add_argument("--config", type=Path, help="a TOML config file (flags override it)")


def _build_parser() -> _Parser:
    parser = _Parser(prog=_PROG, description="A peer-to-peer mesh of GPU machines.")
    parser.add_argument("--version", action="version", version=_version_line())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    _add_up(sub.add_parser("up", help="run the daemon in the foreground"))
    _add_queries(sub)
    _add_cluster(sub)
    add_task_commands(sub, _add_state_dir)
    add_model_commands(sub, _add_state_dir)
    return parser


def _add_queries(sub: argparse._SubParsersAction[_Parser]) -> None:
    """The commands that ask the running daemon: status, members, gpus, version,
    requests, events, leave; and key, which reads the state dir."""
    for name, text in (
        ("status", "this node, overlay, cluster summary"),
        ("members", "the member table"),
        ("gpus", "this node's GPUs"),
    ):
        p = sub.add_parser(name, help=text)
        _add_state_dir(p)
        p.add_argument("--json", action="store_true", help="print JSON for scripts")
        if name == "members":
            p.add_argument(
                "--status", action="append", metavar="STATE",
                help="only members in this state (alive, suspect, dead, left, or draining);"
                " repeat or separate with commas for several",
            )  # fmt: skip
            p.add_argument(
                "--label", action="append", metavar="K=V",
                help="only members with this label (repeat: all of them must match)",
            )  # fmt: skip
        if name == "gpus":
            p.add_argument(
                "--probe",
                action="store_true",
                help="re-probe the GPUs now (a change gossips a new signed record)",
            )

    version = sub.add_parser("version", help="this program's version and the daemon's")
    _add_state_dir(version)
    version.add_argument("--json", action="store_true", help="print JSON for scripts")

    requests = sub.add_parser("requests", help="the inference API's recent routes")
    _add_state_dir(requests)
    requests.add_argument("--json", action="store_true", help="print JSON for scripts")

    events = sub.add_parser("events", help="membership and GPU events, one line each")
    _add_state_dir(events)
    events.add_argument("--json", action="store_true", help="one JSON object per line")
    events.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new events until interrupted"
    )

    leave = sub.add_parser("leave", help="leave the mesh gracefully; the daemon exits")
    _add_state_dir(leave)

    key = sub.add_parser("key", help="print this node's public key (creates it if missing)")
    _add_state_dir(key)
    key.add_argument("--json", action="store_true", help="print node id and key as JSON")


def _add_cluster(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`cluster init|enroll|revoke|apikey create|operator`: the authority's commands."""
    cluster = sub.add_parser("cluster", help="manage the cluster authority")
    csub = cluster.add_subparsers(dest="cluster_command", metavar="ACTION", parser_class=_Parser)
    csub.required = True
    init = csub.add_parser("init", help="create a cluster authority key")
    enroll = csub.add_parser("enroll", help="issue an enrollment certificate for a node key")
    enroll.add_argument("node_public_key", metavar="NODE_PUBLIC_KEY")
    enroll.add_argument("--scope", default="member", help="what the node may do (default member)")
    enroll.add_argument("--expires", metavar="DURATION", help="validity, e.g. 90d (default never)")
    enroll.add_argument("--out", type=Path, help="certificate file (default NODEID.cert)")
    revoke = csub.add_parser("revoke", help="sign a revocation of a certificate or a node key")
    group = revoke.add_mutually_exclusive_group(required=True)
    group.add_argument("--serial", type=int, help="revoke the certificate with this serial")
    group.add_argument("--key", metavar="NODE_PUBLIC_KEY", help="revoke every cert of a key")
    group.add_argument("--api-key", metavar="KEY_ID", help="revoke an API key (its hex id)")
    revoke.add_argument("--out", type=Path, help="revocation file (default revoke-*.rev)")
    apikey = csub.add_parser("apikey", help="API keys for the inference API")
    asub = apikey.add_subparsers(dest="apikey_command", metavar="ACTION", parser_class=_Parser)
    asub.required = True
    create = asub.add_parser("create", help="sign a new API key (verifiable offline)")
    create.add_argument("--name", required=True, help="who the key is for (shown in logs)")
    create.add_argument("--models", nargs="+", metavar="MODEL", help="only these models")
    create.add_argument("--rate", metavar="N/min", help="requests per minute per node, e.g. 60/min")
    create.add_argument("--expires", metavar="DURATION", help="validity, e.g. 30d (default never)")
    operator = csub.add_parser("operator", help="make an operator key: it may cancel any task")
    operator.add_argument(
        "--expires", metavar="DURATION", help="validity, e.g. 30d (default never)"
    )
    operator.add_argument("--out", type=Path, help="key file (default operator-ID.key)")
    for p in (init, enroll, revoke, create, operator):
        p.add_argument(
            "--authority-dir",
            type=Path,
            default=None,
            help=f"where the authority key lives (default {_default_authority_dir()})",
        )


########################################################################################
# Commands that talk to a running daemon


def _client(args: argparse.Namespace) -> ApiClient:
    state_dir = args.state_dir if args.state_dir is not None else default_state_dir()
    return ApiClient(state_dir / "api.sock")


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def _table(rows: list[list[str]], header: list[str]) -> str:
    """Every table the CLI prints: cells made terminal-safe (`_terminal`)."""
    return format_table(rows, header)


#: What `members --status` takes: the member states, and `draining` (a live member
#: whose record says it takes no new work).
_MEMBER_FILTER_STATES: Final = ("alive", "suspect", "dead", "left", "draining")


def _state_cell(member: dict[str, Any]) -> str:
    """`alive`, `alive,draining`, or `alive,unverified(revoked)` for a member whose
    record did not verify."""
    state = str(member.get("state", "?"))
    if member.get("status") == "draining" and state in ("alive", "suspect"):
        state += ",draining"
    reason = member.get("unverified")
    return state if not reason else f"{state},unverified({reason})"


def _ago(seconds: float) -> str:
    """``42s ago``, ``5m ago``, ``3h ago``, ``2d ago``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f}{unit} ago"
    return f"{max(seconds, 0):.0f}s ago"


def _seen_cell(member: dict[str, Any], now: float) -> str:
    """RTT for a live member; for a dead or left one, when it was last seen."""
    seen = member.get("last_seen")
    if isinstance(seen, (int, float)):
        return f"seen {_ago(now - seen)}"
    rtt = member.get("rtt_ms")
    return "-" if rtt is None else f"{rtt:.1f}ms"


def format_members(members: list[dict[str, Any]], now: float | None = None) -> str:
    """The `members` table (also used by the demo)."""
    now = time.time() if now is None else now
    header = ["NAME", "NODE ID", "ADDRESS", "STATE", "INC", "RTT/SEEN", "VERSION",
              "CAPABILITIES", "LABELS"]  # fmt: skip
    rows = []
    for m in sorted(members, key=lambda m: (m.get("name", ""), m.get("node_id", ""))):
        labels = m.get("labels") or {}
        rows.append(
            [
                m.get("name", "?") + (" *" if m.get("self") else ""),
                m.get("node_id", "?"),
                m.get("address", "?"),
                _state_cell(m),
                str(m.get("incarnation", "?")),
                _seen_cell(m, now),
                m.get("version") or "-",
                m.get("capabilities") or "-",
                ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-",
            ]
        )
    return _table(rows, header)


def _member_filter(args: argparse.Namespace) -> Callable[[dict[str, Any]], bool]:
    """`members --status` and `--label`, as `serf members` takes them.

    Raises:
        _UsageError: a state that does not exist, or a label without ``=``.
    """
    states = {s.strip() for value in args.status or () for s in value.split(",") if s.strip()}
    unknown = sorted(states - set(_MEMBER_FILTER_STATES))
    if unknown:
        raise _UsageError(
            f"--status: unknown state {', '.join(map(repr, unknown))}"
            f" (one of {', '.join(_MEMBER_FILTER_STATES)})"
        )
    labels: dict[str, str] = {}
    for text in args.label or ():
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise _UsageError(f"--label: expected K=V, got {text!r}")
        labels[key] = value

    def keep(member: dict[str, Any]) -> bool:
        if states:
            draining = member.get("status") == "draining" and member.get("state") in (
                "alive", "suspect",
            )  # fmt: skip
            if member.get("state") not in states and not (draining and "draining" in states):
                return False
        have = member.get("labels") or {}
        return all(have.get(k) == v for k, v in labels.items())

    return keep


def _cmd_status(args: argparse.Namespace) -> None:
    status = _client(args).get("/v1/status")
    if args.json:
        _print_json(status)
        return
    node = status.get("node", {})
    overlay = status.get("overlay", {})
    cluster = status.get("cluster", {})
    tasks = status.get("tasks")
    draining = "  draining: takes no new work" if tasks and tasks.get("draining") else ""
    lines = [
        f"node      {node.get('name')} ({node.get('node_id')}){draining}",
        f"address   {node.get('address')}  incarnation {node.get('incarnation')}",
        f"cluster   {cluster.get('fingerprint')}  {cluster.get('summary')}",
        f"overlay   {overlay.get('kind')}  accepting {', '.join(overlay.get('accept', []))}",
    ]
    if tasks:
        state = "draining (takes no new work)" if tasks.get("draining") else "taking work"
        lines.append(f"tasks     {state}; {tasks.get('running')} running here")
    lines.extend(f"warning   {warning}" for warning in status.get("warnings", []))
    for line in lines:
        print(terminal_safe(line))


def _cmd_members(args: argparse.Namespace) -> None:
    keep = _member_filter(args)  # a bad filter is reported before the daemon is asked
    members = [m for m in _client(args).get("/v1/members") if keep(m)]
    if args.json:
        _print_json(members)
    else:
        print(format_members(members))


def _cmd_events(args: argparse.Namespace) -> None:
    from .observe.client import format_event, read_events

    for event in read_events(_client(args).socket_path, follow=args.follow):
        line = json.dumps(event, sort_keys=True) if args.json else format_event(event)
        print(terminal_safe(line), flush=True)


def _daemon_absent(socket_path: Path) -> bool:
    """Whether no daemon listens on `socket_path` (no socket file, or nobody accepting).

    Only these two answers count as absent: a permission problem or a hung daemon is
    reported by the API client as usual.
    """
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(str(socket_path))
        except (FileNotFoundError, ConnectionRefusedError):
            return True
        except OSError:
            return False
    return False


def _local_gpus() -> dict[str, Any]:
    """Probe this machine's GPUs in this process: what the daemon would report at start.

    Uses the daemon's default capacity policy (no ``--reserve-vram`` or
    ``--withhold-gpu``: those are `up` flags).
    """
    import trio

    from .gpu import LocalProber, build_report, format_gpu_table, report_to_dict

    async def probe() -> Any:
        return build_report(await LocalProber().probe())

    report = trio.run(probe)
    return {"table": format_gpu_table(report), "report": report_to_dict(report), "source": "local"}


def _cmd_gpus(args: argparse.Namespace) -> None:
    client = _client(args)
    if _daemon_absent(client.socket_path):
        # A new user's first question, before any cluster exists: what does populi see?
        gpus = _local_gpus()
        print(
            f"{_PROG}: no daemon running for state dir {client.socket_path.parent}:"
            " probed this machine directly",
            file=sys.stderr,
        )
    else:
        gpus = client.post("/v1/gpus/probe") if args.probe else client.get("/v1/gpus")
        gpus.setdefault("source", "daemon")
    if args.json:
        _print_json(gpus)
    else:
        print(terminal_safe(gpus.get("table") or "no GPUs found", keep_newlines=True))


def _version_line() -> str:
    from ._version import protocol_version, software_version

    return f"{_PROG} {software_version()} (protocol {protocol_version()})"


def _cmd_version(args: argparse.Namespace) -> None:
    """This program's version, and the running daemon's when there is one (they may
    differ after an upgrade until the daemon restarts)."""
    from ._version import protocol_version, software_version

    client = _client(args)
    daemon: dict[str, Any] | None = None
    if not _daemon_absent(client.socket_path):
        node = client.get("/v1/status").get("node", {})
        daemon = {
            "software_version": node.get("software_version"),
            "protocol_version": node.get("protocol_version"),
            "pid": node.get("pid"),
        }
    mine = {"software_version": software_version(), "protocol_version": protocol_version()}
    if args.json:
        _print_json({"client": mine, "daemon": daemon})
        return
    print(f"client  {_version_line()}")
    if daemon is None:
        print(f"daemon  not running for state dir {client.socket_path.parent}")
    else:
        print(terminal_safe(
            f"daemon  {daemon['software_version']} (protocol {daemon['protocol_version']},"
            f" pid {daemon['pid']})"
        ))  # fmt: skip


def _cmd_leave(args: argparse.Namespace) -> None:
    _client(args).post("/v1/leave")
    print("leaving: the daemon announces its departure and exits")


########################################################################################
# Local commands


def _cmd_key(args: argparse.Namespace) -> None:
    from .trust.identity import NodeIdentity

    state_dir = args.state_dir if args.state_dir is not None else default_state_dir()
    try:
        identity = NodeIdentity.load_or_create(state_dir)
    except PermissionError:
        raise CliError(
            f"no permission to use state dir {shown(state_dir)} (check --state-dir)"
        ) from None
    if args.json:
        _print_json(
            {"node_id": identity.node_id, "public_key": encode_public_key(identity.public_key)}
        )
    else:
        print(encode_public_key(identity.public_key))


def _authority_dir(args: argparse.Namespace) -> Path:
    return args.authority_dir if args.authority_dir is not None else _default_authority_dir()


def _load_authority(args: argparse.Namespace) -> Any:
    from .trust.authority import ClusterAuthority

    directory = _authority_dir(args)
    if not (directory / "authority.key").exists():
        raise CliError(
            f"no cluster authority in {shown(directory)} (pass the --authority-dir given to"
            " `populi-node cluster init`; if this cluster has no authority yet, create one"
            f" with: populi-node cluster init --authority-dir {shown(directory)})"
        )
    return ClusterAuthority.load(directory)


def _cmd_cluster_init(args: argparse.Namespace) -> None:
    from .trust.authority import AUTHORITY_PUBLIC_FILE, ClusterAuthority

    directory = _authority_dir(args)
    try:
        authority = ClusterAuthority.create(directory)
    except FileExistsError:
        raise CliError(
            f"{shown(directory)} already holds a cluster authority (use another --authority-dir)"
        ) from None
    print(f"cluster {authority.fingerprint}: authority key created in {directory}")
    print(f"copy {directory / AUTHORITY_PUBLIC_FILE} to every node's state dir")


def _cmd_cluster_enroll(args: argparse.Namespace) -> None:
    from .trust.certificate import write_certificate

    try:
        node_key = decode_public_key(args.node_public_key)
    except ValueError as exc:
        raise _UsageError(f"NODE_PUBLIC_KEY: {exc} (print it with: populi-node key)") from None
    try:
        expires = parse_duration(args.expires) if args.expires is not None else None
    except ValueError as exc:
        raise _UsageError(f"--expires: {exc}") from None
    authority = _load_authority(args)
    try:
        cert = authority.enroll(node_key, args.scope, expires, now=time.time())
    except ValueError as exc:
        raise _UsageError(f"--scope: {exc}") from None
    out = args.out if args.out is not None else Path(f"{cert.node_id}.cert")
    try:
        write_certificate(out, cert)
    except FileExistsError:
        raise CliError(f"{shown(out)} exists already (remove it or pass --out)") from None
    print(f"certificate for node {cert.node_id} (serial {cert.serial}) written to {out}")
    print("copy it to the node as STATE_DIR/node.cert, or pass it with --cert")


def _cmd_cluster_revoke(args: argparse.Namespace) -> None:
    from .trust.revocation import write_revocation

    node_key = None
    if args.key is not None:
        try:
            node_key = decode_public_key(args.key)
        except ValueError as exc:
            raise _UsageError(f"--key: {exc}") from None
    api_key_id = None
    if args.api_key is not None:
        try:
            api_key_id = bytes.fromhex(args.api_key)
            if len(api_key_id) != 16:
                raise ValueError
        except ValueError:
            raise _UsageError(
                "--api-key: expected the key's 32-hex-digit id (apikey create prints it)"
            ) from None
    authority = _load_authority(args)
    revocation = authority.revoke(
        now=time.time(), serial=args.serial, node_public_key=node_key, api_key_id=api_key_id
    )
    name = (
        str(args.serial) if args.serial is not None
        else args.key[:16] if args.key is not None else f"apikey-{args.api_key[:12]}"
    )  # fmt: skip
    out = args.out if args.out is not None else Path(f"revoke-{name}.rev")
    try:
        write_revocation(out, revocation)
    except FileExistsError:
        raise CliError(f"{shown(out)} exists already (remove it or pass --out)") from None
    print(f"{revocation.describe()}: written to {out}")
    print("copy it into STATE_DIR/revocations/ of any node; nodes gossip it to the rest")


def _cmd_cluster_apikey(args: argparse.Namespace) -> None:
    from .inference.keys import issue_api_key

    rate = 0
    if args.rate is not None:
        match = re.fullmatch(r"(\d+)(?:/min)?", args.rate.strip())
        if match is None:
            raise _UsageError(f"--rate: {args.rate!r} is not N/min (e.g. 60/min)")
        rate = int(match.group(1))
    try:
        expires = parse_duration(args.expires) if args.expires is not None else None
    except ValueError as exc:
        raise _UsageError(f"--expires: {exc}") from None
    authority = _load_authority(args)
    try:
        key = issue_api_key(authority, args.name, now=time.time(), models=args.models or (),
                            rate_per_minute=rate, expires_in=expires)  # fmt: skip
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    print(key.token)
    print(
        f"key {key.name!r} id {key.key_id.hex()}: send it as Authorization: Bearer KEY;"
        f" revoke with populi-node cluster revoke --api-key {key.key_id.hex()}",
        file=sys.stderr,
    )


def _cmd_cluster_operator(args: argparse.Namespace) -> None:
    """A new operator key and its certificate, in one 0600 file for the operator."""
    from .trust.operator import OperatorKey

    try:
        expires = parse_duration(args.expires) if args.expires is not None else None
    except ValueError as exc:
        raise _UsageError(f"--expires: {exc}") from None
    authority = _load_authority(args)
    key, cert = OperatorKey.create(authority, now=time.time(), expires_in=expires)
    out = args.out if args.out is not None else Path(f"operator-{key.key_id[:16]}.key")
    expiry = "never" if cert.expires_at is None else f"at Unix time {cert.expires_at}"
    try:
        key.write(out, f" (serial {cert.serial}, expires {expiry})")
    except FileExistsError:
        raise CliError(f"{shown(out)} exists already (remove it or pass --out)") from None
    print(f"operator key {key.key_id} (serial {cert.serial}, expires {expiry}) written to {out}")
    print(
        "keep it off the mesh; cancel any task with: populi-node cancel ID --operator-key"
        f" {out}; revoke it with: populi-node cluster revoke --serial {cert.serial}"
    )


def _cmd_requests(args: argparse.Namespace) -> None:
    data = _client(args).get("/v1/inference/requests")
    if args.json:
        _print_json(data)
        return
    if data.get("listening") is None:
        print("this node serves no inference API (start it with --api-listen HOST:PORT)")
    rows = [
        [time.strftime("%H:%M:%S", time.localtime(r.get("at", 0))), str(r.get("model")),
         str(r.get("node") or "-"), "stream" if r.get("stream") else "whole",
         str(r.get("tokens", "-")), "; ".join(r.get("attempts") or []) or "-"]
        for r in data.get("requests", [])
    ]  # fmt: skip
    print(_table(rows, ["TIME", "MODEL", "NODE", "MODE", "TOKENS", "ATTEMPTS"]))


def _cmd_up(args: argparse.Namespace) -> None:
    flags = {name: getattr(args, name) for name in SETTINGS}
    config = NodeConfig.load(args.config, flags)
    # Every argument is checked before the node looks at its state (key, certificate).
    check_arguments(config)
    from .node import NodeStartError, run_node

    try:
        run_node(config)
    except NodeStartError as exc:
        raise CliError(str(exc)) from None


_COMMANDS = {
    "up": _cmd_up,
    "status": _cmd_status,
    "members": _cmd_members,
    "gpus": _cmd_gpus,
    "events": _cmd_events,
    "leave": _cmd_leave,
    "requests": _cmd_requests,
    "version": _cmd_version,
    "key": _cmd_key,
    **TASK_COMMANDS,
    **MODEL_COMMANDS,
}
_CLUSTER_COMMANDS = {
    "init": _cmd_cluster_init,
    "enroll": _cmd_cluster_enroll,
    "revoke": _cmd_cluster_revoke,
    "apikey": _cmd_cluster_apikey,
    "operator": _cmd_cluster_operator,
}


def _error(message: object) -> None:
    """Print `message` as the one error line; a stray control character is escaped
    (belt and braces: the messages already quote what the user typed)."""
    print(f"{_PROG}: error: {terminal_safe(message)}", file=sys.stderr)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse `argv`; an unknown option before the command is named as such.

    argparse reports a missing required COMMAND before unknown options, so
    ``populi-node --bogus`` would say "the following arguments are required: COMMAND".
    """
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        return _build_parser().parse_args(words)
    except _UsageError as exc:
        if "required: COMMAND" in str(exc):
            unknown = [w for w in words if w.startswith("-") and w not in ("-h", "--help")]
            if unknown:
                raise _UsageError(
                    f"unrecognized arguments: {' '.join(shown(u) for u in unknown)}"
                    f" (options go after the command; see {_PROG} --help)"
                ) from None
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `populi-node` console script; returns the exit code."""
    try:
        words = list(sys.argv[1:] if argv is None else argv)
        if words[:1] == ["--version"]:  # argparse's own would raise SystemExit here
            print(_version_line())
            return 0
        args = _parse(words)
        if args.command == "cluster":
            _CLUSTER_COMMANDS[args.cluster_command](args)
        else:
            code = _COMMANDS[args.command](args)
            if isinstance(code, int):  # `submit --wait`: the task's exit code
                return code
    except _UsageError as exc:
        _error(exc)
        return 2
    except (CliError, ApiError, ConfigError, KeyFileError) as exc:
        _error(exc)
        return 1
    except PermissionError as exc:
        _error(f"no permission: {shown(exc.filename or exc)}")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
