"""``python -m populi_p2p.gpu [--json]``: probe this machine once and print the report.

Usable before the daemon exists, and the same code path ``populi-node gpus`` uses:
LocalProber (every probe bounded by ``--timeout``), build_report, then the table or JSON.
Bad flags exit with status 2 and one line; a failed probe is part of the output, not an
error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import msgpack
import trio

from ._capacity import CapacityPolicy
from ._labels import parse_declared, parse_labels, parse_size
from ._present import format_gpu_table, report_to_json
from ._report import GpuReport, build_report
from ._runner import DEFAULT_PROBE_TIMEOUT, LocalProber


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m populi_p2p.gpu", description=__doc__.splitlines()[0]
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--record", action="store_true", help="print the NodeRecord form and its msgpack size"
    )
    p.add_argument(
        "--timeout", type=float, default=DEFAULT_PROBE_TIMEOUT, help="per-probe timeout, seconds"
    )
    p.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="operator label (layer C)"
    )
    p.add_argument(
        "--advertise-gpu",
        action="append",
        default=[],
        metavar="[Nx]MODEL[:MEM]",
        help="declared GPU (layer C, never capacity)",
    )
    p.add_argument(
        "--reserve-vram", default="0", metavar="SIZE", help="VRAM kept back per GPU, e.g. 2GiB"
    )
    p.add_argument(
        "--withhold", action="append", default=[], metavar="INDEX|UUID", help="GPU never offered"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        labels = parse_labels(args.label)
        declared = parse_declared(args.advertise_gpu)
        policy = CapacityPolicy(
            reserve_vram=parse_size(args.reserve_vram), withheld=frozenset(args.withhold)
        )
    except ValueError as exc:
        parser.error(str(exc))
    if not args.timeout > 0:
        parser.error("--timeout must be > 0")

    async def probe() -> GpuReport:
        prober = LocalProber(timeout=args.timeout)
        facts = await prober.probe()
        return build_report(facts, policy=policy, labels=labels, declared=declared)

    report = trio.run(probe)
    if args.record:
        record = report.to_record()
        text = f"{record!r}\nmsgpack size: {len(msgpack.packb(record))} bytes"
    elif args.json:
        text = report_to_json(report)
    else:
        text = format_gpu_table(report)
    try:
        print(text)
    except BrokenPipeError:  # `... | head`: not an error
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
