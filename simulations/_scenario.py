"""Scenarios: what a simulation run does, read from a TOML file.

A scenario describes a cluster (size, SWIM preset, Lifeguard on or off), a network
(latency, loss, duplication), and a timeline of faults, partitions and churn. Every
time in the timeline is in virtual seconds from the moment the cluster has formed (all
members see each other alive), so a scenario reads the same whatever the size.

A `[sweep]` table turns one scenario into a family of runs (for example sizes 8 to
4,096, or Lifeguard on and off), which the runner executes one by one.

Parsing is strict: an unknown key, a wrong type or an impossible value raises
`ScenarioError` with one line that names the file, the table and the key, because a
silently ignored typo in an experiment is a wrong result nobody notices.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from populi_p2p.presets import PRESET_NAMES

from ._envelope import EnvelopeSpec
from ._network import NetworkConfig
from ._tasks import TasksSpec, parse_tasks

__all__ = [
    "ChurnSpec",
    "FaultSpec",
    "FormationSpec",
    "LossSpec",
    "PartitionSpec",
    "Scenario",
    "ScenarioError",
    "SweepSpec",
    "load_scenario",
    "override",
    "parse_scenario",
]

FAULT_KINDS = ("crash", "restart", "leave", "pause", "slow", "stall", "update")
PRESETS = PRESET_NAMES


class ScenarioError(ValueError):
    """A scenario file that cannot be run; the message is one line naming the culprit."""


@attrs.frozen
class FormationSpec:
    """How the cluster forms before the timeline starts."""

    #: "join": members start at random times within `window`, each joining through
    #: `seeds` members that started before it (the protocol forms the cluster).
    #: "prime": every member starts at once, already knowing all the others
    #: (`Membership.prime`); for large clusters, where formation would dominate.
    mode: str = "join"
    #: Members start at uniformly random times within this many seconds.
    window: float = 5.0
    #: Each member joins through this many members that started before it.
    seeds: int = 3
    #: Give up (and fail the run) if the cluster has not converged this long after the
    #: last member started.
    timeout: float = 300.0
    #: Extra quiet time after convergence before the timeline starts.
    settle: float = 2.0


@attrs.frozen
class FaultSpec:
    """One fault on the timeline, possibly repeated `every` seconds."""

    kind: str
    at: float
    #: Explicit node numbers (0 .. members-1); empty means pick `count` at random.
    members: tuple[int, ...] = ()
    count: int = 1
    #: Repeat every this many seconds until `until` (default: the end of the timeline).
    every: float | None = None
    until: float | None = None
    #: crash: restart the member this long after the crash (None: stays down).
    restart_after: float | None = None
    #: pause: how long the member sleeps; slow: how long it stays slow (None: forever);
    #: stall: how long it gets no CPU (its clock runs, what arrives waits).
    duration: float | None = None
    #: slow: processing delay of each incoming message, plus uniform [0, jitter).
    delay: float = 0.0
    jitter: float = 0.0
    #: pause: whether the sleeper's monotonic clock stops while it sleeps.
    clock_stops: bool = True
    #: leave: how long a leaving member keeps running to spread its goodbye.
    linger: float = 1.0


@attrs.frozen
class PartitionSpec:
    """A partition that forms at `at` and heals at `heal` (None: at the end)."""

    at: float
    heal: float | None
    #: Fractions of the nodes in each group (normalized), or explicit node lists.
    groups: tuple[float, ...] = (0.5, 0.5)
    members: tuple[tuple[int, ...], ...] = ()
    one_way: bool = False


@attrs.frozen
class LossSpec:
    """Asymmetric loss on some members' links from `at` to `until`."""

    at: float = 0.0
    until: float | None = None
    members: tuple[int, ...] = ()
    count: int = 1
    ingress: float = 0.0
    egress: float = 0.0


@attrs.frozen
class ChurnSpec:
    """Poisson join, leave and crash processes (cluster-wide rates)."""

    joins_per_minute: float = 0.0
    leaves_per_minute: float = 0.0
    crashes_per_minute: float = 0.0
    #: A crashed member restarts this long after its crash; None: it stays down.
    restart_after: float | None = 30.0
    #: Leaves and crashes are skipped while the cluster has this many members or fewer.
    min_members: int = 3
    start: float = 0.0
    stop: float | None = None


@attrs.frozen
class SweepSpec:
    """Run the scenario for every combination of these values."""

    members: tuple[int, ...] = ()
    lifeguard: tuple[bool, ...] = ()
    seeds: tuple[int, ...] = ()
    loss: tuple[float, ...] = ()


@attrs.frozen
class Scenario:
    """Everything one run needs. Build it with `load_scenario` or `parse_scenario`."""

    name: str
    description: str = ""
    seed: int = 1
    members: int = 32
    duration: float = 60.0
    preset: str = "lan"
    lifeguard: bool = True
    swim: Mapping[str, Any] = attrs.field(factory=dict)
    network: NetworkConfig = attrs.field(factory=NetworkConfig)
    lossy: tuple[LossSpec, ...] = ()
    formation: FormationSpec = attrs.field(factory=FormationSpec)
    faults: tuple[FaultSpec, ...] = ()
    partitions: tuple[PartitionSpec, ...] = ()
    churn: ChurnSpec | None = None
    sample_interval: float = 1.0
    #: The driver's reconnect to members seen failing (as Serf's), run on the daemon's
    #: schedule (`swim.RejoinPolicy`), so a partition longer than `dead_retention`
    #: still heals. 0: off; any other value: on (the cadence is the policy's).
    #: `reconnect_timeout`: how long a failure stays a reconnect target, seconds.
    reconnect_interval: float = 30.0
    reconnect_timeout: float = 3600.0
    safety: bool = True
    core_invariants: bool = False
    liveness: bool = True
    liveness_bound: float = 300.0
    sweep: SweepSpec | None = None
    #: The daemon's packet envelope, priced per packet (`[envelope]`); None: not
    #: modelled (`enabled = false`), and only bare payload bytes are reported.
    envelope: EnvelopeSpec | None = attrs.field(factory=EnvelopeSpec)
    #: Tasks for the lease table run in every node (`[tasks]`, see `_leases.py`);
    #: None: no lease table is simulated.
    tasks: TasksSpec | None = None

    def __attrs_post_init__(self) -> None:
        if self.members < 1:
            raise ScenarioError(f"{self.name}: members must be >= 1, got {self.members}")
        if not self.duration >= 0:
            raise ScenarioError(f"{self.name}: duration must be >= 0, got {self.duration}")
        if self.preset not in PRESETS:
            raise ScenarioError(
                f"{self.name}: preset must be one of {PRESETS}, got {self.preset!r}"
            )
        if not self.sample_interval > 0:
            raise ScenarioError(f"{self.name}: sample_interval must be > 0")
        if not self.liveness_bound > 0:
            raise ScenarioError(f"{self.name}: liveness_bound must be > 0")
        for fault in self.faults:
            for member in fault.members:
                if not 0 <= member < self.members:
                    raise ScenarioError(
                        f"{self.name}: {fault.kind} fault names member {member}, "
                        f"but the cluster has members 0..{self.members - 1}"
                    )

    def variants(self) -> list[Scenario]:
        """The runs a `[sweep]` expands to (just this scenario when there is none)."""
        if self.sweep is None:
            return [self]
        sweep = self.sweep
        runs: list[Scenario] = []
        for members in sweep.members or (self.members,):
            for lifeguard in sweep.lifeguard or (self.lifeguard,):
                for loss in sweep.loss or (self.network.loss,):
                    for seed in sweep.seeds or (self.seed,):
                        runs.append(
                            attrs.evolve(
                                self,
                                members=members,
                                lifeguard=lifeguard,
                                seed=seed,
                                network=attrs.evolve(self.network, loss=loss),
                                sweep=None,
                            )
                        )
        return runs


########################################################################################
# Parsing
########################################################################################


class _Table:
    """A TOML table being read: typed getters, and a check that nothing was left unread."""

    def __init__(self, where: str, data: Mapping[str, Any]) -> None:
        if not isinstance(data, Mapping):
            raise ScenarioError(f"{where}: expected a table, got {type(data).__name__}")
        self.where = where
        self.data = data
        self.used: set[str] = set()

    def _get(self, key: str) -> Any:
        self.used.add(key)
        return self.data.get(key)

    def number(self, key: str, default: float | None, *, minimum: float | None = 0.0) -> Any:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ScenarioError(f"{self.where}: {key} must be a number, got {value!r}")
        if minimum is not None and value < minimum:
            raise ScenarioError(f"{self.where}: {key} must be >= {minimum}, got {value!r}")
        return float(value)

    def integer(self, key: str, default: int, *, minimum: int = 0) -> int:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(f"{self.where}: {key} must be an integer, got {value!r}")
        if value < minimum:
            raise ScenarioError(f"{self.where}: {key} must be >= {minimum}, got {value!r}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ScenarioError(f"{self.where}: {key} must be true or false, got {value!r}")
        return value

    def string(self, key: str, default: str) -> str:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ScenarioError(f"{self.where}: {key} must be a string, got {value!r}")
        return value

    def ints(self, key: str) -> tuple[int, ...]:
        value = self._get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ScenarioError(f"{self.where}: {key} must be a list of integers, got {value!r}")
        return tuple(value)

    def table(self, key: str) -> _Table | None:
        value = self._get(key)
        return None if value is None else _Table(f"{self.where}[{key}]", value)

    def tables(self, key: str) -> list[_Table]:
        value = self._get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise ScenarioError(f"{self.where}: {key} must be an array of tables ([[{key}]])")
        return [_Table(f"{self.where}[[{key}]] #{i + 1}", item) for i, item in enumerate(value)]

    def raw(self, key: str) -> Any:
        return self._get(key)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise ScenarioError(f"{self.where}: unknown key {unknown[0]!r}")


def _network(table: _Table | None) -> NetworkConfig:
    if table is None:
        return NetworkConfig()
    defaults = NetworkConfig()
    fields = {}
    for field in attrs.fields(NetworkConfig):
        fields[field.name] = table.number(field.name, getattr(defaults, field.name))
    try:
        config = NetworkConfig(**fields)
    except ValueError as exc:
        raise ScenarioError(f"{table.where}: {exc}") from None
    return config


def _lossy(table: _Table) -> LossSpec:
    spec = LossSpec(
        at=table.number("at", 0.0),
        until=table.number("until", None),
        members=table.ints("members"),
        count=table.integer("count", 1, minimum=1),
        ingress=table.number("ingress", 0.0),
        egress=table.number("egress", 0.0),
    )
    for label, value in (("ingress", spec.ingress), ("egress", spec.egress)):
        if value > 1.0:
            raise ScenarioError(f"{table.where}: {label} must be <= 1, got {value}")
    table.done()
    return spec


def _fault(table: _Table) -> FaultSpec:
    kind = table.string("kind", "")
    if kind not in FAULT_KINDS:
        raise ScenarioError(f"{table.where}: kind must be one of {FAULT_KINDS}, got {kind!r}")
    at = table.number("at", None)
    if at is None:
        raise ScenarioError(f"{table.where}: missing key 'at'")
    spec = FaultSpec(
        kind=kind,
        at=at,
        members=table.ints("members"),
        count=table.integer("count", 1, minimum=1),
        every=table.number("every", None),
        until=table.number("until", None),
        restart_after=table.number("restart_after", None),
        duration=table.number("duration", None),
        delay=table.number("delay", 0.0),
        jitter=table.number("jitter", 0.0),
        clock_stops=table.boolean("clock_stops", True),
        linger=table.number("linger", 1.0),
    )
    if spec.every is not None and spec.every <= 0:
        raise ScenarioError(f"{table.where}: every must be > 0, got {spec.every}")
    if kind in ("pause", "stall") and spec.duration is None:
        raise ScenarioError(f"{table.where}: a {kind} needs a duration")
    if kind == "slow" and spec.delay <= 0:
        raise ScenarioError(f"{table.where}: a slow fault needs delay > 0")
    table.done()
    return spec


def _partition(table: _Table) -> PartitionSpec:
    at = table.number("at", None)
    if at is None:
        raise ScenarioError(f"{table.where}: missing key 'at'")
    heal = table.number("heal", None)
    if heal is not None and heal < at:
        raise ScenarioError(f"{table.where}: heal ({heal}) is before at ({at})")
    groups_raw = table.raw("groups")
    groups: tuple[float, ...] = (0.5, 0.5)
    members: tuple[tuple[int, ...], ...] = ()
    if groups_raw is not None:
        if not isinstance(groups_raw, list) or len(groups_raw) < 2:
            raise ScenarioError(f"{table.where}: groups must list at least two groups")
        if all(isinstance(g, int | float) and not isinstance(g, bool) for g in groups_raw):
            if any(g <= 0 for g in groups_raw):
                raise ScenarioError(f"{table.where}: group fractions must be > 0")
            groups = tuple(float(g) for g in groups_raw)
        elif all(isinstance(g, list) for g in groups_raw):
            members = tuple(tuple(int(m) for m in g) for g in groups_raw)
            groups = ()
        else:
            raise ScenarioError(
                f"{table.where}: groups must be fractions like [0.5, 0.5] or node lists"
            )
    spec = PartitionSpec(
        at=at, heal=heal, groups=groups, members=members, one_way=table.boolean("one_way", False)
    )
    table.done()
    return spec


def _churn(table: _Table | None) -> ChurnSpec | None:
    if table is None:
        return None
    spec = ChurnSpec(
        joins_per_minute=table.number("joins_per_minute", 0.0),
        leaves_per_minute=table.number("leaves_per_minute", 0.0),
        crashes_per_minute=table.number("crashes_per_minute", 0.0),
        restart_after=table.number("restart_after", 30.0),
        min_members=table.integer("min_members", 3, minimum=1),
        start=table.number("start", 0.0),
        stop=table.number("stop", None),
    )
    table.done()
    return spec


def _sweep(table: _Table | None) -> SweepSpec | None:
    if table is None:
        return None
    members = table.ints("members")
    if any(m < 1 for m in members):
        raise ScenarioError(f"{table.where}: members must all be >= 1")
    lifeguard_raw = table.raw("lifeguard") or []
    if not isinstance(lifeguard_raw, list) or not all(isinstance(v, bool) for v in lifeguard_raw):
        raise ScenarioError(f"{table.where}: lifeguard must be a list like [true, false]")
    loss_raw = table.raw("loss") or []
    if not isinstance(loss_raw, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 1 for v in loss_raw
    ):
        raise ScenarioError(f"{table.where}: loss must be a list of probabilities in [0, 1)")
    spec = SweepSpec(
        members=members,
        lifeguard=tuple(lifeguard_raw),
        seeds=table.ints("seeds"),
        loss=tuple(float(v) for v in loss_raw),
    )
    table.done()
    return spec


def parse_scenario(data: Mapping[str, Any], *, source: str = "scenario") -> Scenario:
    """Build a `Scenario` from parsed TOML (a dict).

    Raises:
        ScenarioError: anything unknown, mistyped or impossible, in one line.
    """
    top = _Table(source, data)
    name = top.string("name", Path(source).stem)
    formation_table = top.table("formation")
    formation = FormationSpec()
    if formation_table is not None:
        mode = formation_table.string("mode", formation.mode)
        if mode not in ("join", "prime"):
            raise ScenarioError(f"{formation_table.where}: mode must be 'join' or 'prime'")
        formation = FormationSpec(
            mode=mode,
            window=formation_table.number("window", formation.window),
            seeds=formation_table.integer("seeds", formation.seeds, minimum=1),
            timeout=formation_table.number("timeout", formation.timeout),
            settle=formation_table.number("settle", formation.settle),
        )
        formation_table.done()
    driver = top.table("driver")
    reconnect_interval, reconnect_timeout = 30.0, 3600.0
    if driver is not None:
        reconnect_interval = driver.number("reconnect_interval", reconnect_interval)
        reconnect_timeout = driver.number("reconnect_timeout", reconnect_timeout)
        driver.done()
    check = top.table("check")
    safety, core_invariants, liveness, liveness_bound = True, False, True, 300.0
    if check is not None:
        safety = check.boolean("safety", safety)
        core_invariants = check.boolean("core_invariants", core_invariants)
        liveness = check.boolean("liveness", liveness)
        liveness_bound = check.number("liveness_bound", liveness_bound)
        check.done()
    swim_table = top.raw("swim") or {}
    if not isinstance(swim_table, dict):
        raise ScenarioError(f"{source}: [swim] must be a table of SwimConfig fields")
    network_table = top.table("network")
    lossy: list[LossSpec] = []
    if network_table is not None:
        lossy = [_lossy(t) for t in network_table.tables("lossy")]
    network = _network(network_table)
    if network_table is not None:
        network_table.done()
    scenario = Scenario(
        name=name,
        description=top.string("description", ""),
        seed=top.integer("seed", 1),
        members=top.integer("members", 32, minimum=1),
        duration=top.number("duration", 60.0),
        preset=top.string("preset", "lan"),
        lifeguard=top.boolean("lifeguard", True),
        swim=dict(swim_table),
        network=network,
        lossy=tuple(lossy),
        formation=formation,
        faults=tuple(_fault(t) for t in top.tables("fault")),
        partitions=tuple(_partition(t) for t in top.tables("partition")),
        churn=_churn(top.table("churn")),
        sample_interval=top.number("sample_interval", 1.0),
        reconnect_interval=reconnect_interval,
        reconnect_timeout=reconnect_timeout,
        safety=safety,
        core_invariants=core_invariants,
        liveness=liveness,
        liveness_bound=liveness_bound,
        sweep=_sweep(top.table("sweep")),
        envelope=_envelope(top.table("envelope")),
        tasks=_tasks(top.table("tasks")),
    )
    top.done()
    return scenario


def _tasks(table: _Table | None) -> TasksSpec | None:
    try:
        return parse_tasks(table)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None


def _envelope(table: _Table | None) -> EnvelopeSpec | None:
    default = EnvelopeSpec()
    if table is None:
        return default
    enabled = table.boolean("enabled", True)
    try:
        spec = EnvelopeSpec(
            base=table.integer("base", default.base, minimum=0),
            certificate=table.integer("certificate", default.certificate, minimum=0),
            introduction_seconds=table.number("introduction_seconds", default.introduction_seconds),
            introduction_packets=table.integer(
                "introduction_packets", default.introduction_packets, minimum=0
            ),
            addressed_ends=table.boolean("addressed_ends", default.addressed_ends),
        )
    except ValueError as exc:
        raise ScenarioError(f"{table.where}: {exc}") from None
    table.done()
    return spec if enabled else None


def load_scenario(path: str | Path) -> Scenario:
    """Read and parse a scenario file.

    Raises:
        ScenarioError: the file is missing, is not TOML, or describes an impossible run.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from None
    return parse_scenario(data, source=str(path))


def override(scenario: Scenario, **changes: Any) -> Scenario:
    """A copy of `scenario` with command-line overrides applied (None means unchanged).

    An override also takes that dimension out of the scenario's sweep: ``--members 50``
    on a size sweep runs just 50 members.

    Raises:
        ScenarioError: an override makes the scenario impossible.
    """
    kept = {k: v for k, v in changes.items() if v is not None}
    try:
        loss = kept.pop("loss", None)
        if loss is not None:
            kept["network"] = attrs.evolve(scenario.network, loss=loss)
        if scenario.sweep is not None:
            sweep = scenario.sweep
            dimensions = {"members": "members", "lifeguard": "lifeguard", "seed": "seeds"}
            cleared = {dim: () for key, dim in dimensions.items() if key in kept}
            if loss is not None:
                cleared["loss"] = ()
            kept["sweep"] = attrs.evolve(sweep, **cleared)
        return attrs.evolve(scenario, **kept)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
