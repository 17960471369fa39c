"""Where a member's news waited on its way to the others, from a traced start storm.

    python benchmarks/start_storm.py --n 40 --keep /tmp/storm --trace
    python benchmarks/storm_trace.py /tmp/storm

Reads the daemons' logs (`nNNN.log`) and packet traces (`<node id>.trace`,
`populi_p2p._trace`) that `start_storm.py --keep DIR --trace` leaves, and prints, for
each (observer, member) pair, when the observer first logged the member alive, split
into stages, each measured from the member's `node.ready` line:

* `join sent`: the member's first join (a push-pull) left it;
* `first heard`: the observer first received a packet naming the member (a lean
  rumor, a full record or a state exchange);
* `record in`: the member's full record reached the observer (a pull's answer, or an
  exchange);
* `core event`: the observer's core emitted `MemberJoined`;
* `logged`: the roster logged `member.joined`.

Then the same split as the wait between consecutive stages, and the epidemic's pace:
how long after the member's first join the 25th, 50th and 90th percentiles of
observers had first heard of it, and how many copies of its rumor arrived meanwhile.
Printed, not asserted.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from _mesh import log_events  # noqa: E402

_FULL = ("alive", "pushpull", "sync")
STAGES = ("join sent", "first heard", "record in", "core event", "logged")


def _quantiles(values: list[float]) -> str:
    if not values:
        return "-"
    xs = sorted(values)

    def at(q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    return f"{at(0.5):6.2f} {at(0.9):6.2f} {xs[-1]:6.2f}"


class Storm:
    """The logs and traces of one storm, indexed by daemon name."""

    def __init__(self, directory: Path) -> None:
        self.ready: dict[str, float] = {}
        self.name_of_id: dict[str, str] = {}
        self.logged: dict[tuple[str, str], float] = {}
        logs = {p.stem: log_events(p.read_text(errors="replace")) for p in directory.glob("n*.log")}
        for name, events in logs.items():
            for t, ev, fields in events:
                if ev == "node.ready":
                    self.ready[name] = t
                    self.name_of_id[fields["id"]] = name
        for name, events in logs.items():
            for t, ev, fields in events:
                member = self.name_of_id.get(fields.get("id", ""))
                if ev in ("member.joined", "member.recovered") and member:
                    self.logged.setdefault((name, member), t)
        # (observer, member) -> first time of each traced stage.
        self.heard: dict[tuple[str, str], float] = {}
        self.record: dict[tuple[str, str], float] = {}
        self.core_event: dict[tuple[str, str], float] = {}
        self.join_sent: dict[str, float] = {}
        self.copies: dict[str, list[float]] = defaultdict(list)
        self.waited: list[float] = []
        for path in directory.glob("*.trace"):
            observer = self.name_of_id.get(path.stem)
            if observer is not None:
                self._read_trace(observer, path)

    def _read_trace(self, observer: str, path: Path) -> None:
        for line in path.read_text(errors="replace").splitlines():
            fields = line.split("\t")
            if len(fields) < 4:
                continue
            t, kind = float(fields[0]), fields[1]
            if kind == "ev" and fields[2] == "MemberJoined":
                member = self.name_of_id.get(fields[3])
                if member:
                    self.core_event.setdefault((observer, member), t)
                continue
            if kind not in ("in", "out") or len(fields) < 6:
                continue
            words = fields[5].split()
            if kind == "out":
                if observer not in self.join_sent and any(
                    w.startswith(("pushpull:", "sync:")) for w in words
                ):
                    self.join_sent[observer] = t
                continue
            self.waited.append(float(fields[4]))
            for word in words:
                what, _, subject = word.partition(":")
                for entry in subject.split(",") if subject else ():
                    member = self.name_of_id.get(entry.split("/")[0])
                    if member is None or member == observer or what == "pull":
                        continue
                    key = (observer, member)
                    self.heard.setdefault(key, t)
                    if what in _FULL:
                        self.record.setdefault(key, t)
                    else:
                        self.copies[member].append(t)

    def pairs(self) -> list[tuple[str, str]]:
        return [(o, m) for o in self.ready for m in self.ready if o != m]

    def stage_times(self, observer: str, member: str) -> list[float | None]:
        key = (observer, member)
        origin = self.ready[member]
        raw = [
            self.join_sent.get(member),
            self.heard.get(key),
            self.record.get(key),
            self.core_event.get(key),
            self.logged.get(key),
        ]
        return [None if t is None else t - origin for t in raw]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    args = parser.parse_args()
    storm = Storm(args.directory)
    if not storm.ready:
        raise SystemExit(f"no node.ready line in {args.directory}/n*.log")
    first, last = min(storm.ready.values()), max(storm.ready.values())
    print(f"daemons {len(storm.ready)}, node.ready lines spread over {last - first:.2f} s")
    pairs = storm.pairs()
    print(f"{'stage, after the member is up (s)':<40} median    p90    max")
    columns: list[list[float]] = [[] for _ in STAGES]
    for o, m in pairs:
        for i, t in enumerate(storm.stage_times(o, m)):
            if t is not None:
                columns[i].append(t)
    for name, values in zip(STAGES, columns, strict=True):
        print(f"  {name:<38} {_quantiles(values)}  ({len(values)} pairs)")
    print(f"{'wait between stages (s)':<40} median    p90    max")
    for i in range(1, len(STAGES)):
        gaps = []
        for o, m in pairs:
            times = storm.stage_times(o, m)
            if times[i] is not None and times[i - 1] is not None:
                gaps.append(times[i] - times[i - 1])  # type: ignore[operator]
        print(f"  {STAGES[i - 1] + ' -> ' + STAGES[i]:<38} {_quantiles(gaps)}")
    print(f"  {'inbox wait per packet':<38} {_quantiles(storm.waited)}")
    print("the epidemic, after the member's join left (s):  25% / 50% / 90% of observers heard")
    spreads: list[list[float]] = [[], [], []]
    for m in storm.ready:
        start = storm.join_sent.get(m)
        heard = sorted(t for (o, mm), t in storm.heard.items() if mm == m)
        if start is None or len(heard) < len(storm.ready) - 1:
            continue
        for i, q in enumerate((0.25, 0.5, 0.9)):
            spreads[i].append(heard[int(q * (len(heard) - 1))] - start)
    for label, values in zip(("25 %", "50 %", "90 %"), spreads, strict=True):
        print(f"  {label:<38} {_quantiles(values)}")


if __name__ == "__main__":
    main()
