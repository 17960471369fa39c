"""The deterministic churn simulator: thousands of `swim` cores in virtual time.

A discrete-event engine (`Simulator`) drives the very same `swim.Membership` the
daemon runs, over a simulated `Network` with latency, loss, duplication and
partitions, while faults (crash, restart, leave, pause, slow members) and churn happen
on a schedule. One seed reproduces a whole run, down to a trace digest. `Metrics`
measures what the SWIM and Lifeguard papers measure: detection time, false positives,
dissemination time, traffic per member, convergence after a partition heals.

Entry points: ``populi-sim run SCENARIO.toml`` (`simulations.cli`), and
``python -m simulations.demo``. See docs/simulations.md for the results.
"""

from ._engine import Core as Core
from ._engine import CoreFactory as CoreFactory
from ._engine import EngineStatistics as EngineStatistics
from ._engine import Invariant as Invariant
from ._engine import InvariantViolation as InvariantViolation
from ._engine import NodeStatus as NodeStatus
from ._engine import Observer as Observer
from ._engine import Simulator as Simulator
from ._engine import address_for as address_for
from ._engine import name_for as name_for
from ._envelope import EnvelopeModel as EnvelopeModel
from ._envelope import EnvelopeSpec as EnvelopeSpec
from ._invariants import IncarnationCheck as IncarnationCheck
from ._metrics import ConvergenceRecord as ConvergenceRecord
from ._metrics import Detection as Detection
from ._metrics import Metrics as Metrics
from ._metrics import Sample as Sample
from ._metrics import UpdateRecord as UpdateRecord
from ._network import Network as Network
from ._network import NetworkConfig as NetworkConfig
from ._network import NetworkStatistics as NetworkStatistics
from ._report import format_report as format_report
from ._report import format_sweep as format_sweep
from ._rng import child_rng as child_rng
from ._rng import child_seed as child_seed
from ._runner import RunResult as RunResult
from ._runner import run_once as run_once
from ._runner import run_scenario as run_scenario
from ._runner import swim_config as swim_config
from ._runner import swim_factory as swim_factory
from ._scenario import ChurnSpec as ChurnSpec
from ._scenario import FaultSpec as FaultSpec
from ._scenario import FormationSpec as FormationSpec
from ._scenario import LossSpec as LossSpec
from ._scenario import PartitionSpec as PartitionSpec
from ._scenario import Scenario as Scenario
from ._scenario import ScenarioError as ScenarioError
from ._scenario import SweepSpec as SweepSpec
from ._scenario import load_scenario as load_scenario
from ._scenario import override as override
from ._scenario import parse_scenario as parse_scenario
from ._seeds import SeedSummary as SeedSummary
from ._seeds import mean_ci as mean_ci
from ._seeds import run_seeds as run_seeds
from ._seeds import summarize as summarize

__all__ = [
    "ChurnSpec",
    "ConvergenceRecord",
    "Core",
    "CoreFactory",
    "Detection",
    "EngineStatistics",
    "EnvelopeModel",
    "EnvelopeSpec",
    "FaultSpec",
    "FormationSpec",
    "IncarnationCheck",
    "Invariant",
    "InvariantViolation",
    "LossSpec",
    "Metrics",
    "Network",
    "NetworkConfig",
    "NetworkStatistics",
    "NodeStatus",
    "Observer",
    "PartitionSpec",
    "RunResult",
    "Sample",
    "Scenario",
    "ScenarioError",
    "SeedSummary",
    "Simulator",
    "SweepSpec",
    "UpdateRecord",
    "address_for",
    "child_rng",
    "child_seed",
    "format_report",
    "format_sweep",
    "load_scenario",
    "mean_ci",
    "name_for",
    "override",
    "parse_scenario",
    "run_once",
    "run_scenario",
    "run_seeds",
    "summarize",
    "swim_config",
    "swim_factory",
]
