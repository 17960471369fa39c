"""Seeded chaos over the relay: three serving nodes, each with a random fault (engine
errors, a stall, none), and random kills at random tokens. Whatever happens, the
client's stream is whole words ``w0 w1 ...`` in order (no repeat, no gap); it ends with
exactly one [DONE] when some node could finish, or else with an error event and no
[DONE], or is refused (503) before it starts. `CHAOS_RUNS` runs (env, default 8)."""

from __future__ import annotations

import json
import os
import random

import pytest
import trio

from populi_p2p.identity import NodeIdentity
from populi_p2p.inference.standin import StandinConfig

from .conftest import ALICE, AUTHORITY, BOB, CERTS, NOW
from .harness import Mesh, stream_chat, words
from .test_relay import CAROL

DAVE = NodeIdentity.from_seed(b"d" * 32)
CERTS.setdefault(DAVE.node_id, AUTHORITY.enroll(DAVE.public_key, now=NOW - 60, serial=9).raw)
RUNS = int(os.environ.get("CHAOS_RUNS", "8"))
TOKENS = 25


@pytest.mark.parametrize("seed", range(RUNS))
async def test_chaos_stream_is_whole_or_clearly_broken(seed: int) -> None:
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
        await mesh.start_front(nursery, CAROL, stall_timeout=0.2)
        kills = {rng.randrange(1, TOKENS): rng.choice(nodes) for _ in range(rng.randrange(3))}

        async def on_token(i: int) -> None:
            if i in kills:
                kills[i].kill()

        with trio.fail_after(20):
            r, text, lines = await stream_chat(mesh.url, "m", on_token=on_token)
        if r.status_code == 503:
            assert all(n.engine is not None and n.engine.config.error for n in nodes) or kills
            return
        assert r.status_code == 200
        assert words(TOKENS).startswith(text), text  # in order, no repeat, no gap
        if lines and lines[-1] == "[DONE]":
            assert text == words(TOKENS) and lines.count("[DONE]") == 1
        else:
            assert "[DONE]" not in lines
            assert "error" in json.loads(lines[-1])
        nursery.cancel_scope.cancel()
