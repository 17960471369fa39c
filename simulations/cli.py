"""`populi-sim`: run simulation scenarios from the command line.

    populi-sim run SCENARIO.toml [--members N] [--duration S] [--loss P] [--seed N]
                                 [--seeds S] [--lifeguard on|off] [--json OUT] [--plot OUT.png]
    populi-sim list
    populi-sim plot RESULTS.json --plot OUT.png
    populi-sim --compiled run ...     (the same on the mypyc build, `simulations.compiled`)

SCENARIO may also be the name of a shipped scenario (``populi-sim run partition-heal``).
A bad argument gets one line on stderr and exit status 2; a run that breaks a safety
or liveness property prints what broke, "reproduce with --seed N", and exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from ._report import format_report, format_sweep
from ._runner import RunResult, run_scenario
from ._scenario import Scenario, ScenarioError, load_scenario, override
from ._seeds import as_json, format_seeds, run_seeds

__all__ = ["main"]

#: Where the shipped scenarios live.
SCENARIOS = Path(__file__).parent / "scenarios"

_EXIT_USAGE = 2
_EXIT_FAILED = 1


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (and exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(_EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer seed, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _duration(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a probability, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _on_off(text: str) -> bool:
    if text in ("on", "true", "yes", "1"):
        return True
    if text in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


def _parser() -> _Parser:
    parser = _Parser(
        prog="populi-sim",
        description="Deterministic simulation of populi's SWIM/Lifeguard membership.",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="run on swim/ and the engine compiled by mypyc (built once into build/mypyc; "
        "the same digests, about 1.3x faster; needs a C compiler)",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = commands.add_parser("run", help="run a scenario (or a sweep of them)")
    run.add_argument("scenario", help="a scenario TOML file, or the name of a shipped one")
    run.add_argument("--members", type=_positive_int, help="cluster size")
    run.add_argument("--duration", type=_duration, help="seconds of timeline after formation")
    run.add_argument("--loss", type=_probability, help="datagram loss probability on every link")
    run.add_argument("--seed", type=_seed, help="root seed; the same seed replays the same run")
    run.add_argument(
        "--seeds",
        type=_positive_int,
        metavar="S",
        help="run S seeds (--seed, or the scenario's, and the S-1 after it) and print each "
        "measure's mean and 95%% confidence interval",
    )
    run.add_argument("--lifeguard", type=_on_off, metavar="on|off", help="Lifeguard mechanisms")
    run.add_argument("--json", type=Path, metavar="OUT", help="write the results as JSON")
    run.add_argument("--plot", type=Path, metavar="OUT.png", help="write a PNG figure")
    run.add_argument("--safety", type=_on_off, metavar="on|off", help="check invariants")
    run.add_argument("--quiet", action="store_true", help="print only failures")
    commands.add_parser("list", help="list the shipped scenarios")
    plot = commands.add_parser("plot", help="draw the figure of a results JSON file again")
    plot.add_argument("results", type=Path, help="a file written by run --json")
    plot.add_argument("--plot", type=Path, metavar="OUT.png", required=True, help="the PNG")
    return parser


def _resolve(name: str) -> Path:
    path = Path(name)
    if path.exists() or path.suffix == ".toml" or "/" in name:
        return path
    return SCENARIOS / f"{name}.toml"


def _list() -> int:
    for path in sorted(SCENARIOS.glob("*.toml")):
        try:
            scenario = load_scenario(path)
        except ScenarioError as exc:  # pragma: no cover - shipped files are tested
            print(f"{path.stem:<20} (invalid: {exc})")
            continue
        first = scenario.description.splitlines()[0] if scenario.description else ""
        print(f"{path.stem:<20} {first}")
    return 0


def _replot(source: Path, output: Path) -> int:
    from ._plot import plot_results

    try:
        document = json.loads(source.read_text(encoding="utf-8"))
        results = [RunResult.from_dict(run) for run in document["runs"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"populi-sim: error: {source}: not a results file ({exc})", file=sys.stderr)
        return _EXIT_USAGE
    plot_results(results, output)
    return 0


def _document(scenario: Scenario, source: Path, results: Sequence[RunResult]) -> dict[str, object]:
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "source": str(source),
        "ok": all(r.ok for r in results),
        "runs": [r.as_dict() for r in results],
    }


def _run_seeds(
    scenario: Scenario, count: int, *, quiet: bool
) -> tuple[list[RunResult], list[dict[str, object]]]:
    """Each variant of `scenario` (its seed sweep dropped) over `count` seeds."""
    first = scenario.seed
    seeds = range(first, first + count)
    results: list[RunResult] = []
    summaries: list[dict[str, object]] = []
    for variant in override(scenario, seed=first).variants():

        def progress(result: RunResult) -> None:
            if not quiet:
                print(format_sweep([result]).splitlines()[-1], flush=True)

        if not quiet:
            print(format_sweep([]), flush=True)
        runs = run_seeds(variant, seeds, progress=progress)
        print(format_seeds(runs), flush=True)
        results.extend(runs)
        summaries.append(
            {"members": variant.members, "lifeguard": variant.lifeguard, "measures": as_json(runs)}
        )
    return results, summaries


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `populi-sim` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.compiled:
        from .compiled import run_compiled

        rest = [arg for arg in (sys.argv[1:] if argv is None else argv) if arg != "--compiled"]
        return run_compiled("simulations.cli", rest)
    if args.command == "list":
        return _list()
    if args.command == "plot":
        return _replot(args.results, args.plot)
    source = _resolve(args.scenario)
    try:
        scenario = override(
            load_scenario(source),
            members=args.members,
            duration=args.duration,
            loss=args.loss,
            seed=args.seed,
            lifeguard=args.lifeguard,
            safety=args.safety,
        )
        for output in (args.json, args.plot):
            if output is not None and not output.parent.is_dir():
                raise ScenarioError(f"cannot write {output}: no directory {output.parent}")
        variants = scenario.variants()
        if not args.quiet and len(variants) > 1:
            print(f"{scenario.name}: {len(variants)} runs", flush=True)

        def progress(result: RunResult) -> None:
            if args.quiet:
                return
            if len(variants) > 1:
                print(format_sweep([result]).splitlines()[-1], flush=True)
            else:
                print(format_report(result), flush=True)

        if args.seeds is not None:
            results, summaries = _run_seeds(scenario, args.seeds, quiet=args.quiet)
        else:
            if not args.quiet and len(variants) > 1:
                print(format_sweep([]), flush=True)
            results = run_scenario(scenario, progress=progress)
            summaries = []
    except ScenarioError as exc:
        print(f"populi-sim: error: {exc}", file=sys.stderr)
        return _EXIT_USAGE
    if args.json is not None:
        document = _document(scenario, source, results)
        if summaries:
            document["seeds"] = summaries
        args.json.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    if args.plot is not None:
        from ._plot import plot_results

        plot_results(results, args.plot)
    failed = [r for r in results if not r.ok]
    for result in failed:
        message = f"populi-sim: {result.scenario} seed {result.seed}: {result.failure}"
        print(message, file=sys.stderr)
    return _EXIT_FAILED if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
