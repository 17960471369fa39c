"""`Keeper`: a task's blobs that the lease table still needs stay on k + 1 members.

What the table needs kept (`wanted`): the inputs of a task that has not finished, the
latest recorded snapshot of a task that has not finished, and the outputs of an
accepted result (for the retention). Nothing else can be asked for.

Peer routes (signed calls; the caller must be a current member):

- ``POST KEEP_PATH`` ``{"task", "sha256", "until"?}``: hold that blob of that task.
  The member holds it only when its own table says the blob is needed (`wanted`), and
  within the share of the quota others' blobs may take (the service's ``room``); it
  fetches it from the caller and the holders the table names (chunks and whole hash
  checked) and pins it (``in:<task>``, ``ckpt:<task>`` or ``out:<task>:<expiry>``,
  the expiry at most the retention from now). The answer is the job's state
  (``fetching``, ``held``, ``failed``); the caller asks again until it is held.
- ``POST HELD_PATH`` ``{"sha256": [HEX, ...]}`` (at most `HELD_QUERY_MAX`): which of
  them are held here, complete and pinned (an unpinned copy may go at any time).

Who asks:

- **Submit**: the accepting node has the inputs held by k members (the task's replicas
  first) before the submit is acknowledged (`spread`).
- **Repair**: when a member leaves the live set (SWIM dead or left), each node looks
  at the blobs it holds pinned for a task whose table entry still needs them, asks the
  live members which of them hold each (`holders_now`), and, when fewer than k + 1
  hold one and it is the holder with the lowest id, has the missing ones held by
  other members. A pass that left something short runs again a little later.
- **Seeing it**: ``populi-node task`` shows who holds each blob now (`task_holders`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import httpx
import trio

from .._log import event, get_logger
from ..inference.peer_api import PeerRequest, PeerResponse, PeerRoutes
from ..inference.peer_client import peer_base_url
from ..leases import TaskEntry
from .checkpoints import CHECKPOINT_KIND, CHECKPOINT_PIN
from .runner import INPUT_KIND, OUTPUT_KIND, output_pin

if TYPE_CHECKING:
    from ..blobs.service import BlobService
    from ..inference.peer_client import PeerClient

__all__ = ["HELD_PATH", "HELD_QUERY_MAX", "KEEP_PATH", "Keeper", "wanted"]

KEEP_PATH: Final = "/populi/v1/artifacts/keep"
HELD_PATH: Final = "/populi/v1/artifacts/held"
#: Digests one ``held`` query may name.
HELD_QUERY_MAX: Final = 64
#: Keep jobs remembered at most (the ended ones go first), and running at once at most.
KEEP_JOBS_MAX: Final = 256
KEEP_RUNNING_MAX: Final = 16
#: Seconds between asks to a member that is fetching (or does not know the task yet).
ASK_EVERY: Final = 0.3
#: Seconds a keep request waits for its fetch before it answers.
KEEP_WAIT: Final = 2.0
#: Rounds a member may answer "not needed here" (its table lags) before it is passed over.
UNKNOWN_ROUNDS: Final = 20
#: Seconds a submit waits for its inputs to be held, and a repair for one blob.
SPREAD_TIMEOUT: Final = 120.0
#: Seconds between repair passes while something is short of holders.
REPAIR_RETRY: Final = 2.0
#: Seconds between looks at the live set.
WATCH_EVERY: Final = 0.5
_log = get_logger("artifacts")
_PREFIXES: Final = ("in:", "out:", CHECKPOINT_PIN)


def wanted(entry: TaskEntry | None, sha256: str) -> tuple[str, int] | None:
    """(what, size) when the table entry needs blob `sha256` kept: ``input`` or
    ``checkpoint`` of a task that has not finished, ``output`` of its accepted result;
    None otherwise."""
    if entry is None or entry.spec is None:
        return None
    if not entry.finished():
        for item in entry.spec.inputs:
            if item.sha256 == sha256:
                return "input", item.size
        ck = entry.checkpoint
        if ck is not None and ck.sha256 == sha256:
            return "checkpoint", ck.size
    result = entry.accepted_result
    if result is not None:
        for out in result.outputs:
            if out.sha256 == sha256:
                return "output", out.size
    return None


def named_holders(entry: TaskEntry, sha256: str) -> list[str]:
    """The nodes the table names as holders of a blob of the task (a hint)."""
    names: list[str] = []
    result = entry.accepted_result
    if result is not None and any(o.sha256 == sha256 for o in result.outputs):
        names += result.holders
    if entry.checkpoint is not None and entry.checkpoint.sha256 == sha256:
        names += entry.checkpoint.holders
    if entry.spec is not None and any(i.sha256 == sha256 for i in entry.spec.inputs):
        names += [entry.spec.submitted_by, *entry.spec.replicas]
    return list(dict.fromkeys(names))


class Keeper:
    """Args:
    blobs: the blob service, once it runs.
    me: this node's id.
    k: members besides the first holder that hold each blob.
    retention: seconds outputs stay pinned.
    is_live: whether a node is a current member.
    live_members: the live members other than us.
    entry_of: the lease table's entry of a task.
    address_of: a member's peer address.
    peer_client: signed calls (None until the peer API runs).
    room: why blobs of a size and count may not be held here for others (None: room).
    """

    def __init__(
        self, *, blobs: Callable[[], BlobService | None], me: str, k: int, retention: float,
        is_live: Callable[[str], bool], live_members: Callable[[], list[str]],
        entry_of: Callable[[str], TaskEntry | None],
        address_of: Callable[[str], tuple[str, int] | None],
        peer_client: Callable[[], PeerClient | None],
        room: Callable[[int, int], str | None],
    ) -> None:  # fmt: skip
        self._blobs, self.me, self.k, self.retention = blobs, me, k, retention
        self._is_live, self._live_members, self._entry_of = is_live, live_members, entry_of
        self._address_of, self._peer_client, self._room = address_of, peer_client, room
        self._jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self._nursery: trio.Nursery | None = None
        self.stats = dict.fromkeys((
            "keeps_refused_not_member", "keeps_refused_bad", "keeps_refused_unwanted",
            "keeps_refused_room", "keeps_refused_busy", "kept", "repairs", "repaired",
            "inputs_spread",
        ), 0)  # fmt: skip

    def register_peer_routes(self, routes: PeerRoutes) -> None:
        routes.add("POST", KEEP_PATH, self._serve_keep)
        routes.add("POST", HELD_PATH, self._serve_held)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Repair passes whenever a member leaves the live set (and again while one left
        something short of holders)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            live = set(self._live_members())
            again: float | None = None
            while True:
                await trio.sleep(WATCH_EVERY)
                now_live = set(self._live_members())
                lost, live = live - now_live, now_live
                due = again is not None and trio.current_time() >= again
                if (lost or due) and self._blobs() is not None:
                    short = await self.repair()
                    again = trio.current_time() + REPAIR_RETRY if short else None

    ####################################################################################
    # Peer routes

    def _refuse(self, why: str, status: int, line: str) -> PeerResponse:
        self.stats[f"keeps_refused_{why}"] += 1
        return PeerResponse(status, json.dumps({"error": line}).encode())

    async def _serve_held(self, request: PeerRequest) -> PeerResponse:
        if not self._is_live(request.caller):
            return self._refuse("not_member", 403, "only a current member may ask")
        try:
            shas = json.loads(request.body[: 16 * 1024])["sha256"]
            digests = [bytes.fromhex(s) for s in shas[:HELD_QUERY_MAX] if isinstance(s, str)]
        except (ValueError, KeyError, TypeError) as exc:
            return self._refuse("bad", 400, f"bad held query: {exc}")
        store = self._store().store
        held = [d.hex() for d in digests if _kept(store.get(d))]
        return PeerResponse(200, json.dumps({"held": held}).encode())

    async def _serve_keep(self, request: PeerRequest) -> PeerResponse:
        if not self._is_live(request.caller):
            return self._refuse("not_member", 403, "only a current member may ask")
        try:
            body = json.loads(request.body[: 4 * 1024])
            tid, sha = str(body["task"]), str(body["sha256"])
            digest = bytes.fromhex(sha)
            until = float(body.get("until") or time.time() + self.retention)
            if len(digest) != 32:
                raise ValueError("sha256 is 64 hex characters")
            if not math.isfinite(until):
                raise ValueError("until is a time in seconds")
        except (ValueError, KeyError, TypeError) as exc:
            return self._refuse("bad", 400, f"bad keep request: {exc}")
        entry = self._entry_of(tid)
        need = wanted(entry, sha)
        if entry is None or need is None:
            line = f"task {tid[:12]} needs no blob {sha[:12]} kept (unknown, finished, not its)"
            return self._refuse("unwanted", 404, line)
        what, size = need
        pin = _pin(what, tid, min(until, time.time() + self.retention))
        store = self._store().store
        held = store.get(digest)
        if held is not None and held.complete:
            store.pin(digest, pin)
            return PeerResponse(200, json.dumps({"state": "held"}).encode())
        job = self._jobs.get((tid, sha))
        if job is None or (job["ended"] and job["row"]["state"] == "failed"):
            if sum(not j["ended"] for j in self._jobs.values()) >= KEEP_RUNNING_MAX:
                return self._refuse("busy", 503, "too many keeps at once; ask another member")
            room = self._room(size, 1)
            if room is not None:
                return self._refuse("room", 503, room)
            job = {"row": {"state": "fetching"}, "ended": False, "done": trio.Event()}
            self._remember((tid, sha), job)
            sources = [request.caller, *named_holders(entry, sha)]
            sources = [n for n in dict.fromkeys(sources) if n != self.me]
            assert self._nursery is not None
            self._nursery.start_soon(self._keep, tid, digest, what, pin, sources, job)
        with trio.move_on_after(KEEP_WAIT):
            await job["done"].wait()
        return PeerResponse(200, json.dumps(job["row"]).encode())

    def _remember(self, key: tuple[str, str], job: dict[str, Any]) -> None:
        self._jobs[key] = job
        while len(self._jobs) > KEEP_JOBS_MAX:
            old = next((k for k, j in self._jobs.items() if j["ended"]), None)
            if old is None:
                break
            del self._jobs[old]

    async def _keep(self, tid: str, digest: bytes, what: str, pin: str, sources: list[str],
                    job: dict[str, Any]) -> None:  # fmt: skip
        from ..blobs.fetcher import FetchError
        from ..blobs.store import QuotaError

        blobs = self._store()
        kind = {"input": INPUT_KIND, "checkpoint": CHECKPOINT_KIND}.get(what, OUTPUT_KIND)
        try:
            await blobs.fetch(digest, sources, name=f"{tid[:16]}-{what[:4]}", kind=kind)
            blobs.store.pin(digest, pin)
            job["row"] = {"state": "held"}
            self.stats["kept"] += 1
        except (FetchError, QuotaError, ValueError, LookupError, OSError) as exc:
            job["row"] = {"state": "failed", "error": str(exc)[:300]}
        job["ended"] = True
        job["done"].set()

    def _store(self) -> Any:
        blobs = self._blobs()
        if blobs is None:
            raise LookupError("the node is still starting; try again in a second")
        return blobs

    ####################################################################################
    # Asking members

    async def _call(self, target: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        client, address = self._peer_client(), self._address_of(target)
        if client is None or address is None:
            return 0, {"error": "no peer address"}
        try:
            raw = json.dumps(body).encode()
            resp = await client.call(target, peer_base_url(*address), "POST", path, raw)
            return resp.status_code, resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            return 0, {"error": repr(exc)[:200]}

    async def holders_now(self, shas: list[str]) -> dict[str, list[str]]:
        """Who holds each blob now (complete and pinned): us and every live member that
        says so."""
        found: dict[str, list[str]] = {s: [] for s in shas}
        store = self._store().store
        for sha in shas:
            if _kept(store.get(bytes.fromhex(sha))):
                found[sha].append(self.me)

        async def ask(member: str, batch: list[str]) -> None:
            status, answer = await self._call(member, HELD_PATH, {"sha256": batch})
            if status == 200 and isinstance(answer, dict):
                for sha in answer.get("held", []):
                    if sha in found and member not in found[sha]:
                        found[sha].append(member)

        with trio.move_on_after(10):
            async with trio.open_nursery() as nursery:
                for member in sorted(set(self._live_members()) - {self.me}):
                    for i in range(0, len(shas), HELD_QUERY_MAX):
                        nursery.start_soon(ask, member, shas[i : i + HELD_QUERY_MAX])
        return {sha: sorted(nodes) for sha, nodes in found.items()}

    async def spread(
        self, tid: str, sha: str, targets: list[str], need: int, *, until: float | None = None,
        timeout: float = SPREAD_TIMEOUT,
    ) -> list[str]:  # fmt: skip
        """Have `need` of `targets` (in order) hold blob `sha` of task `tid`; the members
        that hold it (fewer when the others failed or `timeout` passed)."""
        body: dict[str, Any] = {"task": tid, "sha256": sha}
        if until is not None:
            body["until"] = int(until)
        held: list[str] = []
        spare = list(targets)
        asking = [spare.pop(0) for _ in range(min(need, len(spare)))]
        unknown: dict[str, int] = {}
        with trio.move_on_after(timeout):
            while asking:
                states: dict[str, str] = {}
                async with trio.open_nursery() as nursery:
                    for target in asking:
                        nursery.start_soon(self._ask_keep, target, body, states)
                for target, state in states.items():
                    unknown[target] = unknown.get(target, 0) + (state == "unknown")
                    if state == "held":
                        held.append(target)
                    if state == "held" or state == "failed" or unknown[target] > UNKNOWN_ROUNDS:
                        asking.remove(target)
                        if state != "held" and spare:
                            asking.append(spare.pop(0))
                if asking:
                    await trio.sleep(ASK_EVERY)
        return held

    async def _ask_keep(self, target: str, body: dict[str, Any], states: dict[str, str]) -> None:
        """One keep request; its state in `states` (``unknown``: ask again later)."""
        status, answer = await self._call(target, KEEP_PATH, body)
        state = answer.get("state", "failed") if status == 200 else "failed"
        states[target] = "unknown" if status in (404, 503) else str(state)

    ####################################################################################
    # Repair

    def _candidates(self) -> dict[str, tuple[str, str, float | None]]:
        """{sha256: (task, what, output expiry)} of the blobs held here that a task's
        table entry still needs."""
        found: dict[str, tuple[str, str, float | None]] = {}
        for entry in self._store().store.entries():
            if not entry.complete:
                continue
            for pin in entry.pins:
                if not pin.startswith(_PREFIXES):
                    continue
                parts = pin.split(":")
                tid = parts[1] if len(parts) > 1 else ""
                need = wanted(self._entry_of(tid), entry.hex)
                if need is not None:
                    until = float(parts[2]) if len(parts) == 3 and parts[2].isdigit() else None
                    found[entry.hex] = (tid, need[0], until)
                    break
        return found

    async def repair(self) -> int:
        """One pass: blobs held here that fewer than k + 1 live members hold, and of
        which we are the lowest holder, are held by more; how many are still short."""
        candidates = self._candidates()
        if not candidates:
            return 0
        live = sorted(set(self._live_members()) - {self.me})
        holders = await self.holders_now(sorted(candidates))
        short = 0
        for sha, (tid, what, until) in sorted(candidates.items()):
            have = set(holders[sha]) | {self.me}
            need = min(self.k + 1, len(live) + 1) - len(have)
            if need <= 0 or min(have) != self.me:
                continue
            entry = self._entry_of(tid)
            replicas = [] if entry is None or entry.spec is None else list(entry.spec.replicas)
            targets = [n for n in dict.fromkeys([*replicas, *live]) if n in live and n not in have]
            self.stats["repairs"] += 1
            got = await self.spread(tid, sha, targets, need, until=until, timeout=30.0)
            self.stats["repaired"] += len(got)
            event(_log, 20, "artifacts.repaired", task=tid, sha256=sha, what=what,
                  holders=len(have) + len(got))  # fmt: skip
            short += len(got) < need
        return short

    ####################################################################################
    # Seeing it

    async def task_holders(self, entry: TaskEntry) -> dict[str, Any]:
        """Who holds each of a task's inputs, outputs and latest snapshot now."""
        rows: list[dict[str, Any]] = []
        if entry.spec is not None:
            rows += [{"what": "input", "name": i.name, "sha256": i.sha256, "size": i.size}
                     for i in entry.spec.inputs]  # fmt: skip
        result = entry.accepted_result
        if result is not None:
            rows += [{"what": "output", "name": o.path, "sha256": o.sha256, "size": o.size}
                     for o in result.outputs]  # fmt: skip
        ck = entry.checkpoint
        if ck is not None and ck.sha256:
            rows.append({"what": "checkpoint", "name": f"epoch {ck.taken_in}",
                         "sha256": ck.sha256, "size": ck.size})  # fmt: skip
        found = await self.holders_now(list(dict.fromkeys(r["sha256"] for r in rows)))
        for row in rows:
            row["holders"] = found.get(row["sha256"], [])
        return {"task": entry.task_id, "blobs": rows}


def _kept(entry: Any) -> bool:
    """Held on purpose: complete and pinned (an unpinned copy may be evicted any time)."""
    return entry is not None and entry.complete and bool(entry.pins)


def _pin(what: str, tid: str, until: float) -> str:
    if what == "input":
        return f"in:{tid}"
    if what == "checkpoint":
        return CHECKPOINT_PIN + tid
    return output_pin(tid, until)
