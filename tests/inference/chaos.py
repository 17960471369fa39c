"""One seeded chaos run over the relay, shared by `test_relay_chaos.py` (a few seeds in CI)
and `benchmarks/inference_chaos.py` (1,000 seeds).

Three serving nodes, each with a random fault (engine errors, a stall, none), and
random kills at random tokens. Whatever happens, the client's stream is whole words
``w0 w1 ...`` in order (no repeat, no gap); it ends with exactly one [DONE] when some
node could finish, or else with an error event and no [DONE], or is refused (503)
before it starts. In-process nodes over loopback: real sockets, real signed peer
calls, real stand-in engines (the kill -9 of a real process is `tests/mesh/test_inference.py`).
"""

from __future__ import annotations

import json
import random
from typing import Final, Literal

import trio

from populi_p2p.testing.standin import StandinConfig
from populi_p2p.trust.identity import NodeIdentity

from .conftest import ALICE, AUTHORITY, BOB, CERTS, NOW
from .harness import Mesh, stream_chat, words

CAROL = NodeIdentity.from_seed(b"c" * 32)
CERTS.setdefault(CAROL.node_id, AUTHORITY.enroll(CAROL.public_key, now=NOW - 60, serial=7).raw)
DAVE = NodeIdentity.from_seed(b"d" * 32)
CERTS.setdefault(DAVE.node_id, AUTHORITY.enroll(DAVE.public_key, now=NOW - 60, serial=9).raw)
TOKENS: Final = 25

Outcome = Literal["whole", "broken", "refused"]


async def chaos_run(seed: int) -> Outcome:
    """Run seed `seed`; what the client saw. Raises AssertionError on duplicated or
    lost text, a second [DONE], or a stream that ends with neither [DONE] nor error."""
    rng = random.Random(seed)
    async with trio.open_nursery() as nursery:
        mesh = Mesh()
        nodes = []
        for identity, name in ((ALICE, "alice"), (BOB, "bob"), (DAVE, "dave")):
            fault = rng.choice(["none", "none", "error", "stall"])
            cfg = StandinConfig(
                model="m", tokens=TOKENS, delay=0.002, error=fault == "error",
                stall_at=rng.randrange(1, TOKENS) if fault == "stall" else None,
            )  # fmt: skip
            nodes.append(await mesh.add_serving(nursery, identity, name, cfg))
        # The stand-in has no prefill: a node that stalls before its first token (a
        # continuation landing past its stall point) is given up after 1 s, not 10.
        await mesh.start_front(nursery, CAROL, stall_timeout=0.2, first_token_timeout=1.0)
        kills = {rng.randrange(1, TOKENS): rng.choice(nodes) for _ in range(rng.randrange(3))}

        async def on_token(i: int) -> None:
            if i in kills:
                kills[i].kill()

        with trio.fail_after(20):
            r, text, lines = await stream_chat(mesh.url, "m", on_token=on_token)
        nursery.cancel_scope.cancel()
    if r.status_code == 503:
        assert all(n.engine is not None and n.engine.config.error for n in nodes) or kills
        return "refused"
    assert r.status_code == 200, r.status_code
    assert words(TOKENS).startswith(text), text  # in order, no repeat, no gap
    if lines and lines[-1] == "[DONE]":
        assert text == words(TOKENS) and lines.count("[DONE]") == 1, (text, lines)
        return "whole"
    assert "[DONE]" not in lines, lines
    assert "error" in json.loads(lines[-1]), lines[-1]
    return "broken"
