"""The node's configuration: one frozen object built from a TOML file and flags (flags win).

Why one object: every part of the daemon (transports, bootstrap, mDNS, records, API)
reads the same `NodeConfig`, built and validated once before anything starts, so a typo
in a config file is a one-line error at start-up rather than a surprise an hour later.

Sources, lowest precedence first:

1. built-in defaults (below);
2. the TOML file given with ``--config FILE`` (keys are the long flag names, with ``-``
   or ``_``: ``bootstrap = ["10.0.0.1:7950"]``, ``allow-cidr = [...]``,
   ``[labels] zone = "a"``);
3. command-line flags, for every flag actually given.

Lists from flags replace lists from the file (they do not append), the way most tools
behave, so an operator can always override the file from the command line.

Each setting is declared once, as a `NodeConfig` field whose metadata makes its flag,
its coercion and its row in docs/configuration.md (`populi_p2p.settings`). The
``preset`` names the membership and lease timing; the node resolves it once
(`populi_p2p.presets.resolve_preset`).
"""

from __future__ import annotations

import errno
import ipaddress
import math
import socket
import threading
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

import attrs
import platformdirs

from overlay.base import DEFAULT_PORT as _TRANSPORT_DEFAULT_PORT
from overlay.bootstrap import parse_host_port as _parse_host_port

from ._log import LOG_LEVELS
from .presets import PRESET_NAMES, Preset
from .settings import ConfigError, add_checks, coerce, settings_of, up

__all__ = [
    "DEFAULT_PORT",
    "OVERLAYS",
    "PRESETS",
    "SETTINGS",
    "ConfigError",
    "NodeConfig",
    "check_arguments",
    "default_state_dir",
    "parse_host_port",
    "shown",
]

#: UDP and TCP port a node listens on unless told otherwise (both protocols, one
#: number). Defined by the transport (`overlay.base.DEFAULT_PORT`, not memberlist's 7946,
#: which Consul and Serf agents on GPU hosts already hold).
DEFAULT_PORT: Final = _TRANSPORT_DEFAULT_PORT
#: `--overlay` choices.
OVERLAYS: Final = ("auto", "wireguard", "tailscale", "none")
#: `--preset` choices: names of `swim.SwimConfig` and `LeaseConfig` constructors.
PRESETS: Final = PRESET_NAMES
#: Default file names inside the state directory.
CERT_FILE_NAME: Final = "node.cert"
AUTHORITY_PUBKEY_FILE_NAME: Final = "authority.pub"

Overlay = Literal["auto", "wireguard", "tailscale", "none"]


def shown(value: object) -> str:
    """`value` as it may appear in a one-line error: as is when plainly printable,
    else quoted with `repr` (so a newline or a control character in a hostile or
    mistyped argument cannot break the line, and trailing spaces show)."""
    text = str(value)
    if text and text.isprintable() and text.strip() == text and "'" not in text:
        return text
    return repr(text)


def default_state_dir() -> Path:
    """The platform's per-user state directory for populi (``~/.local/state/populi``)."""
    return Path(platformdirs.user_state_dir("populi", appauthor=False))


def parse_host_port(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """Parse ``HOST``, ``HOST:PORT`` or ``[V6]:PORT`` with the transport's own parser.

    Raises:
        ConfigError: one line saying what is wrong and what is expected.
    """
    try:
        return _parse_host_port(text, default_port=default_port)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _port(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 0 <= value < 65536:
        raise ConfigError(f"{attribute.name}: {value!r} is not a port (0 to 65535; 0 picks one)")


def _positive_seconds(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (0 < value < math.inf):
        name = attribute.name.replace("_", "-")
        raise ConfigError(f"{name}: {value!r} is not a positive number of seconds")


def _ip_or_none(
    instance: object, attribute: attrs.Attribute[str | None], value: str | None
) -> None:
    if value is None:
        return
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ConfigError(
            f"{attribute.name}: {value!r} is not an IP address (give an IPv4 or IPv6 address)"
        ) from None


def _cidrs(
    instance: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
) -> None:
    for cidr in value:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ConfigError(
                f"allow-cidr: {cidr!r} is not a network (expected e.g. 10.0.0.0/8 or fd00::/8)"
            ) from None


def _bootstraps(
    instance: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
) -> None:
    for item in value:
        parse_host_port(item)


def _optional_port(instance: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        _port(instance, attribute, value)


def _optional_seconds(
    instance: object, attribute: attrs.Attribute[Any], value: float | None
) -> None:
    if value is not None:
        _positive_seconds(instance, attribute, value)


def _engines(instance: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    if not value:
        return  # the inference package (and httpx) is not loaded without --engine
    from .inference.engine_url import check_engine_url

    for url in value:
        try:
            check_engine_url(url)
        except ValueError as exc:
            raise ConfigError(f"engine: {exc}") from None


def _ggufs(instance: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    if not value:
        return
    from .inference.llama_server import parse_gguf

    names: set[str] = set()
    for text in value:
        try:
            name = parse_gguf(text).name
        except ValueError as exc:
            raise ConfigError(f"gguf: {exc}") from None
        if name in names:
            raise ConfigError(f"gguf: two models named {name!r}: name one NAME=FILE.gguf")
        names.add(name)


def _uid_range(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    from .executor._isolation import parse_uid_range

    try:
        parse_uid_range(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _api_listen(instance: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None:
        parse_api_listen(value)


def parse_api_listen(text: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[V6]:PORT`` for --api-listen (host 127.0.0.1).

    Raises:
        ConfigError: not an address and port.
    """
    if text.isdigit():
        text = f"127.0.0.1:{text}"
    host, _, port_text = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    try:
        if ":" in host and not bracketed:
            raise ValueError("an IPv6 address needs brackets")
        ipaddress.ip_address(host)
        port = int(port_text) if port_text.isdigit() else -1
    except ValueError:
        port = -1
    if not 0 <= port <= 0xFFFF:
        raise ConfigError(
            f"api-listen: {text!r} is not IP:PORT (e.g. 127.0.0.1:8080, or [::1]:8080)"
        )
    return host, port


def _name(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not (0 < len(value) <= 64 and value.isprintable() and " " not in value):
        raise ConfigError(f"name: {value!r} must be 1 to 64 printable characters without spaces")


@attrs.frozen(field_transformer=add_checks)
class NodeConfig:
    """Everything `populi-node up` needs, validated. Build with `NodeConfig.load`.

    Each field is one ``up`` setting: its ``metadata`` (`settings.up`) makes the flag,
    the coercion of TOML and flag values, and the row of docs/configuration.md.
    """

    #: Where the key, certificate, SQLite store, API socket and logs live (mode 0700).
    state_dir: Path = attrs.field(
        factory=default_state_dir, converter=Path,
        metadata=up("path", "the node's state directory (default {default})",
                    default="platform user state dir (`~/.local/state/populi`)",
                    doc="the key, certificate, stores, API socket and task files"
                    " (operations.md, \"Files in the state directory\")"),
    )  # fmt: skip
    #: Human name shown in tables. Not an identity: two nodes may clash (reported).
    name: str = attrs.field(
        factory=lambda: socket.gethostname()[:64] or "node", validator=_name,
        metadata=up("text", "name shown in tables (default: the host name)",
                    default="host name",
                    doc="shown in tables; not an identity (clashes are reported)"),
    )  # fmt: skip
    #: Address to bind UDP and TCP on; None means the overlay's address, or all.
    bind: str | None = attrs.field(
        default=None, validator=_ip_or_none,
        metadata=up("text", "address to listen on (default: overlay address, or all)",
                    default="overlay address, else `0.0.0.0`",
                    doc="where UDP and TCP listen"),
    )  # fmt: skip
    #: UDP and TCP port (one number for both). 0 lets the kernel pick (tests).
    port: int = attrs.field(
        default=DEFAULT_PORT, validator=_port,
        metadata=up("port", "UDP and TCP port (default {default}; 0 picks one)",
                    doc="UDP and TCP, the same number; 0 lets the kernel pick"),
    )  # fmt: skip
    #: Address other nodes should use to reach this one; None means the bind address
    #: (or the overlay's address when bound to all).
    advertise: str | None = attrs.field(
        default=None, validator=_ip_or_none,
        metadata=up("text", "address other nodes use to reach this one",
                    default="bind address (overlay address when bound to all)",
                    doc="what peers dial"),
    )  # fmt: skip
    #: ``HOST:PORT`` of nodes to join through, tried with exponential backoff.
    bootstrap: tuple[str, ...] = attrs.field(
        default=(), converter=tuple, validator=_bootstraps,
        metadata=up("list", "a node to join through", metavar="HOST:PORT",
                    doc="a node to join through; retried 1 s doubling to 60 s. A name that"
                    " does not exist is refused at start; a resolver that is down or slow"
                    " is not (the retries cover it)"),
    )  # fmt: skip
    #: Which overlay to look for and bind to.
    overlay: Overlay = attrs.field(
        default="auto",
        metadata=up("choice", "which overlay to use (default {default})", choices=OVERLAYS,
                    doc="which overlay to look for and bind to"),
    )  # fmt: skip
    #: Extra source networks accepted besides the overlay's ranges.
    allow_cidr: tuple[str, ...] = attrs.field(
        default=(), converter=tuple, validator=_cidrs,
        metadata=up("list", "also accept packets from CIDR", metavar="CIDR",
                    doc="accept packets from this range too, besides the overlay's"),
    )  # fmt: skip
    #: Advertise and browse ``_populi._udp`` on the LAN (trusted LANs only).
    mdns: bool = attrs.field(
        default=False,
        metadata=up("switch", "find peers on the LAN with mDNS",
                    doc="advertise and browse `_populi._udp` on LAN interfaces"
                    " (trusted LANs only)"),
    )  # fmt: skip
    #: The enrollment certificate this node presents; default ``state_dir/node.cert``.
    cert: Path | None = attrs.field(
        default=None, converter=attrs.converters.optional(Path),
        metadata=up("path", "enrollment certificate (default STATE/node.cert)",
                    default="`STATE/node.cert`",
                    doc="the enrollment certificate this node presents (admission)"),
    )  # fmt: skip
    #: The cluster authority's public key; default ``state_dir/authority.pub``.
    authority_pubkey: Path | None = attrs.field(
        default=None, converter=attrs.converters.optional(Path),
        metadata=up("path", "cluster authority public key (default STATE/authority.pub)",
                    default="`STATE/authority.pub`",
                    doc="the cluster authority's public key (admission)"),
    )  # fmt: skip
    #: File holding a shared cluster secret: packets are then encrypted too.
    cluster_secret: Path | None = attrs.field(
        default=None, converter=attrs.converters.optional(Path),
        metadata=up("path", "file with a secret to encrypt packets",
                    doc="a file of 64 hex digits; encrypts every packet (SecretBox)"),
    )  # fmt: skip
    #: Operator labels carried in the NodeRecord, sorted by key.
    labels: tuple[tuple[str, str], ...] = attrs.field(
        default=(),
        metadata=up("labels", "an operator label", flag="--label", metavar="K=V",
                    doc="an operator label, carried in the signed record"),
    )  # fmt: skip
    #: Operator-declared GPUs (``[COUNTx]MODEL[:MEMORY]``), shown as claims only.
    advertise_gpu: tuple[str, ...] = attrs.field(
        default=(), converter=tuple,
        metadata=up("gpus", "declare a GPU no probe can see (a claim, never capacity)",
                    metavar="[NxMODEL[:MEM]]",
                    doc="a GPU no probe can see: a claim shown to people, never capacity"),
    )  # fmt: skip
    #: VRAM kept back for the owner on every GPU, in bytes.
    reserve_vram: int = attrs.field(
        default=0,
        metadata=up("size", "VRAM kept for the owner, e.g. 2GiB", metavar="SIZE",
                    doc="VRAM kept for the owner on every GPU (bytes, or a size like 2GiB)"),
    )  # fmt: skip
    #: GPUs kept for local use and never offered (device index, GPU UUID or MIG UUID):
    #: they stay visible as facts, with zero allocatable capacity.
    withhold_gpu: tuple[str, ...] = attrs.field(
        default=(), converter=tuple,
        metadata=up("list", "a GPU kept for local use: never offered as capacity (repeatable)",
                    metavar="INDEX|UUID",
                    doc="a GPU kept for local use, never offered (device index, GPU UUID or"
                    " MIG UUID): still shown, with zero allocatable capacity"),
    )  # fmt: skip
    #: Seconds between GPU re-probes (``populi-node gpus --probe`` re-probes at once).
    gpu_probe_interval: float = attrs.field(
        default=30.0, validator=_positive_seconds,
        metadata=up("seconds", "seconds between GPU re-probes (default {default:g})",
                    metavar="SECONDS",
                    doc="how often the GPUs are re-probed; a change in health or capacity"
                    " re-signs and gossips the record"),
    )  # fmt: skip
    #: Seconds a dead or left member stays listed (`members`, `status`, the page) with
    #: its "last seen", after the protocol has forgotten it (`services.departed`).
    departed_retention: float = attrs.field(
        default=86400.0, validator=_positive_seconds,
        metadata=up("seconds", "seconds a dead or left member stays listed (default"
                    " {default:g}, a day)", metavar="SECONDS",
                    doc="how long a dead or left member stays in `members`, `status` and"
                    " the page, with when it was last seen (as Serf keeps failed and left"
                    " members); the protocol itself forgets it after the preset's"
                    " `dead_retention`"),
    )  # fmt: skip
    #: Membership and lease timing preset (`presets.resolve_preset`, resolved once by
    #: the node): ``lan``, ``wan`` or ``local`` (one machine, fast).
    preset: Preset = attrs.field(
        default="lan",
        metadata=up("choice", "membership timing (default {default})", choices=PRESETS,
                    doc="membership and lease timing, `SwimConfig` and `LeaseConfig` of that"
                    " name: `wan` for the internet or an overlay across sites, `local` for"
                    " one host"),
    )  # fmt: skip
    #: The user tasks run as when the daemon is root: None means a uid of its own per
    #: task (``task_uids``); a name runs every task as that user; ``root`` keeps root
    #: (the operator's explicit choice). A daemon that is not root runs tasks as itself
    #: and may only name itself.
    task_user: str | None = attrs.field(
        default=None,
        metadata=up("text", "user every task runs as when the daemon is root (default: a uid"
                    " of its own per task, from --task-uids; root keeps root)", metavar="USER",
                    default="a uid of its own per task when root, else the daemon's user",
                    doc="who every task command runs as (only root can switch; `root` keeps"
                    " root and gives up isolation; a named user shares one uid between"
                    " tasks); an unknown user is one line at start"),
    )  # fmt: skip
    #: ``FIRST-LAST``: the uids handed to tasks one each when the daemon is root and no
    #: ``task_user`` is named (systemd's dynamic-user range by default).
    task_uids: str = attrs.field(
        default="61184-65519", validator=_uid_range,
        metadata=up("text", "uids handed to tasks one each when root and no --task-user"
                    " (default {default})", metavar="FIRST-LAST",
                    doc="uids handed to tasks one each when root and no `--task-user` (names"
                    " and uids in use are skipped); bounds the tasks running at once"),
    )  # fmt: skip
    #: Log verbosity.
    log_level: str = attrs.field(
        default="info",
        metadata=up("choice", "log verbosity (default {default})", choices=LOG_LEVELS,
                    doc="log verbosity"),
    )  # fmt: skip
    #: TCP port of the peer API (signed node-to-node HTTP) on the bind address.
    #: None: the swim port + 1; 0: the kernel picks. Advertised in the NodeRecord.
    peer_port: int | None = attrs.field(
        default=None, validator=_optional_port,
        metadata=up("port", "peer API TCP port (default: --port + 1; 0 picks one)",
                    default="swim port + 1",
                    doc="signed node-to-node HTTP (inference relay, task logs); taken: the"
                    " kernel picks one; advertised in the record"),
    )  # fmt: skip
    #: Local inference engines (OpenAI-compatible base URLs, loopback only).
    engine: tuple[str, ...] = attrs.field(
        default=(), converter=tuple, validator=_engines,
        metadata=up("list", "a local OpenAI-compatible engine, loopback only, e.g."
                    " http://127.0.0.1:8080", metavar="URL",
                    doc="a local OpenAI-compatible engine, loopback `http://` only; see"
                    " inference.md"),
    )  # fmt: skip
    #: GGUF files this node serves by running llama.cpp's ``llama-server`` on each.
    gguf: tuple[str, ...] = attrs.field(
        default=(), converter=tuple, validator=_ggufs,
        metadata=up("list", "serve a GGUF model: the node runs llama.cpp's llama-server on"
                    " it (the name defaults to the file's stem)", metavar="[NAME=]FILE",
                    doc="a GGUF model the node serves by running llama.cpp's `llama-server`"
                    " on it (name: the file's stem); see inference.md"),
    )  # fmt: skip
    #: The ``llama-server`` binary for ``gguf``; None: found (see inference.md).
    llama_server: str | None = attrs.field(
        default=None,
        metadata=up("text", "the llama-server binary for --gguf (default: .venv/bin's, then"
                    " PATH's)", metavar="PATH", default="found",
                    doc="the `llama-server` for `gguf`: default `$POPULI_LLAMA_SERVER`, the"
                    " one beside the running Python (`make engine`), then `PATH`'s"),
    )  # fmt: skip
    #: ``HOST:PORT`` for the OpenAI-compatible API (host defaults to 127.0.0.1); None: off.
    api_listen: str | None = attrs.field(
        default=None, validator=_api_listen,
        metadata=up("text", "serve the OpenAI-compatible API here (default off; host default"
                    " 127.0.0.1)", metavar="HOST:PORT", default="off",
                    doc="the OpenAI-compatible API (host default 127.0.0.1); off loopback it"
                    " demands API keys"),
    )  # fmt: skip
    #: Demand API keys even on a loopback listener (always demanded elsewhere).
    require_api_keys: bool = attrs.field(
        default=False,
        metadata=up("switch", "demand API keys on a loopback listener too (always demanded"
                    " elsewhere)"),
    )  # fmt: skip
    #: Seconds without a token before a stream fails over; None: max(3x p99 gap, 2 s).
    stall_timeout: float | None = attrs.field(
        default=None, validator=_optional_seconds,
        metadata=up("seconds", "token gap that fails a stream over (default max(3x p99 gap,"
                    " 2 s))", metavar="SECONDS", default="max(3x p99 gap, 2 s)",
                    doc="a token gap that moves a stream to the next node"),
    )  # fmt: skip
    #: Most bytes of blobs (models; complete and partial) kept in ``STATE/blobs``; 0: no quota.
    blob_quota: int = attrs.field(
        default=0,
        metadata=up("size", "most bytes of blobs (models) kept here, e.g. 200GiB (default 0:"
                    " no quota)", metavar="SIZE", default="0 (no quota)",
                    doc="most bytes of blobs kept in STATE/blobs, partial fetches counted at"
                    " full size; never exceeded: the least recently used unpinned blobs are"
                    " evicted, else the add or fetch is refused; see models.md"),
    )  # fmt: skip
    #: Bytes a second that all blob fetches together may take; 0: no cap.
    blob_bandwidth: int = attrs.field(
        default=0,
        metadata=up("size", "bytes a second all blob fetches may take, e.g. 50MiB (default 0:"
                    " no cap)", metavar="SIZE", default="0 (no cap)",
                    doc="bytes a second that all blob fetches together may take (a token"
                    " bucket); see models.md"),
    )  # fmt: skip
    #: Members besides a task's owner that must hold its outputs before the result is
    #: posted (docs/artifacts.md); fewer when the mesh has fewer other live members.
    output_replicas: int = attrs.field(
        default=2, validator=attrs.validators.in_(range(0, 8)),
        metadata=up("count", "members besides the owner that must hold a task's outputs"
                    " before it succeeds (default {default})", metavar="K",
                    doc="members besides the owner that hold a task's outputs before its"
                    " result is posted (0 to 7; fewer when the mesh is smaller); see"
                    " artifacts.md"),
    )  # fmt: skip
    #: Seconds a task's outputs stay pinned on their holders, then they are removed.
    output_retention: float = attrs.field(
        default=7 * 86400.0, validator=_positive_seconds,
        metadata=up("seconds", "seconds a task's outputs are kept on their holders (default"
                    " {default})", metavar="SECONDS",
                    doc="how long a task's outputs stay pinned on the owner and its k"
                    " holders; then each holder removes them; see artifacts.md"),
    )  # fmt: skip
    #: The engine that runs a deployed model's replicas here (`deploy.engine_command`).
    deploy_engine: str = attrs.field(
        default="auto",
        metadata=up("choice", "engine that runs deployed models here (default {default})",
                    choices=("auto", "llama-server", "llama-cpp-python", "standin"),
                    doc="the engine a deployed replica runs on this node; auto: llama-server,"
                    " else llama-cpp-python; standin: the test engine; see models.md"),
    )  # fmt: skip
    #: Seconds a request for a deployed model that no node serves yet waits for one.
    load_wait: float = attrs.field(
        default=60.0, validator=_positive_seconds,
        metadata=up("seconds", "seconds a request for a deployed, still loading model waits"
                    " (default {default})", metavar="SECONDS",
                    doc="how long a request for a model that is deployed but not yet served"
                    " waits for a replica before it fails; see models.md"),
    )  # fmt: skip
    #: Seconds a packet's timestamp may differ from our clock, either way, before it is
    #: refused as stale (the replay defence's window; a peer past it is named in `status`).
    #: None: `overlay.auth.DEFAULT_FRESHNESS` (120 s).
    max_clock_skew: float | None = attrs.field(
        default=None, validator=_optional_seconds,
        metadata=up("seconds", "how far a peer's clock may be off before its packets are"
                    " refused (default 120)", metavar="SECONDS", default="120",
                    doc="how far a peer's clock may be off, either way, before its packets"
                    " are refused as `stale` (and the peer named in `status`); keep clocks"
                    " on NTP rather than raising it: the window is also how long a captured"
                    " packet could be replayed against a restarted node"),
    )  # fmt: skip

    @property
    def cert_path(self) -> Path:
        """The certificate file to present (the flag, or ``state_dir/node.cert``)."""
        return self.cert if self.cert is not None else self.state_dir / CERT_FILE_NAME

    @property
    def authority_pubkey_path(self) -> Path:
        """The authority public key file (the flag, or ``state_dir/authority.pub``)."""
        if self.authority_pubkey is not None:
            return self.authority_pubkey
        return self.state_dir / AUTHORITY_PUBKEY_FILE_NAME

    @property
    def api_socket(self) -> Path:
        """The local control API's unix socket."""
        return self.state_dir / "api.sock"

    @property
    def store_path(self) -> Path:
        """The SQLite file of known members."""
        return self.state_dir / "members.sqlite3"

    @classmethod
    def load(
        cls, config_file: Path | None = None, flags: Mapping[str, object] | None = None
    ) -> NodeConfig:
        """Build a config from defaults, then `config_file` (TOML), then `flags`.

        Args:
            config_file: a TOML file whose keys are long flag names.
            flags: values given on the command line; None values mean "not given".

        Raises:
            ConfigError: an unreadable file, an unknown key, or a bad value (one line).
        """
        values: dict[str, object] = {}
        if config_file is not None:
            values.update(_read_toml(config_file))
        for key, value in (flags or {}).items():
            if value is None or (isinstance(value, list | tuple) and not value):
                continue
            values[_key(key, "flag")] = value
        return cls._from_values(values)

    @classmethod
    def _from_values(cls, values: dict[str, object]) -> NodeConfig:
        kwargs: dict[str, Any] = {
            key: coerce(key, SETTINGS[key], value) for key, value in values.items()
        }
        try:
            return cls(**kwargs)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(str(exc).splitlines()[0]) from None


#: Seconds `check_arguments` waits for one bootstrap name to resolve before giving up
#: on the check (a slow resolver is not an argument error; the bootstrapper retries).
RESOLVE_CHECK_TIMEOUT: Final = 3.0


def check_arguments(config: NodeConfig, *, resolve_timeout: float = RESOLVE_CHECK_TIMEOUT) -> None:
    """Check what `up` was told that needs this machine but not the state directory.

    Why: the node checks its state (key, authority key, certificate) first when it
    starts, so without this an operator who mistyped ``--bootstrap`` or ``--bind`` is
    told about a missing key instead, fixes that, and only then learns of the typo.
    Run it after `NodeConfig.load` and before starting the node. Checks:

    * ``bind``: an address of this machine (a test bind on port 0);
    * ``bootstrap``: each name resolves. Only a definitive "no such name" is an error;
      a resolver that is slow or temporarily failing is left to the bootstrapper,
      which retries;
    * ``cert``, ``authority-pubkey``, ``cluster-secret`` given explicitly: the file
      exists;
    * ``task-user``: the user exists, and this daemon may switch to it (root only).

    Raises:
        ConfigError: one line naming the argument and the fix.
    """
    if config.bind is not None:
        _check_local_address(config.bind)
    for item in config.bootstrap:
        host, _ = parse_host_port(item)
        _check_resolves(host, resolve_timeout)
    for name, path in (
        ("cert", config.cert),
        ("authority-pubkey", config.authority_pubkey),
        ("cluster-secret", config.cluster_secret),
    ):
        if path is not None and not path.exists():
            raise ConfigError(f"{name}: {shown(path)} does not exist (check --{name})")
    if config.task_user is not None:
        from .executor.service import resolve_task_user

        try:
            resolve_task_user(config.task_user)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def _check_local_address(address: str) -> None:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((address, 0))
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(
                f"bind: {address!r} is not an address of this machine"
                " (see `ip addr`, or leave --bind out to use the overlay's address)"
            ) from None
        # Anything else (a permission, an exotic kernel) is for the node to report.


def _check_resolves(host: str, timeout: float) -> None:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return  # a literal needs no resolver
    except ValueError:
        pass
    outcome: list[BaseException | None] = []

    def resolve() -> None:
        try:
            socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
            outcome.append(None)
        except (OSError, UnicodeError) as exc:
            outcome.append(exc)

    # A daemon thread, so a resolver that hangs cannot hold the CLI past `timeout`.
    worker = threading.Thread(target=resolve, name="populi-resolve-check", daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        return
    exc = outcome[0]
    if isinstance(exc, socket.gaierror) and exc.errno == socket.EAI_NONAME:
        raise ConfigError(
            f"bootstrap: host name {host!r} does not resolve"
            " (check the spelling, or give an IP address as HOST:PORT)"
        )


#: Every ``up`` setting, by field name, in declaration order.
SETTINGS: Final = settings_of(NodeConfig)


def _key(key: str, where: str) -> str:
    name = key.replace("-", "_")
    if name in SETTINGS:
        return name
    raise ConfigError(f"{where} {key!r} is not a populi-node setting (see populi-node up --help)")


def _read_toml(path: Path) -> dict[str, object]:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {shown(path)} does not exist (check --config)") from None
    except PermissionError:
        raise ConfigError(f"config file {shown(path)} is not readable by this user") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {shown(path)} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"config file {shown(path)} cannot be read: {exc.strerror}") from None
    values: dict[str, object] = {}
    for key, value in data.items():
        name = _key(key, f"{path}: key")
        if SETTINGS[name].kind == "path" and isinstance(value, str):
            # Relative paths in a config file are relative to the file, not the cwd.
            value = str((path.parent / Path(value).expanduser()).resolve())
        values[name] = value
    return values
