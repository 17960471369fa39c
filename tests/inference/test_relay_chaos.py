"""Seeded chaos over the relay (`chaos.chaos_run`): `CHAOS_RUNS` seeds (env, default 8;
``benchmarks/inference_chaos.py`` runs 1,000)."""

from __future__ import annotations

import os

import pytest

from .chaos import chaos_run

RUNS = int(os.environ.get("CHAOS_RUNS", "8"))


@pytest.mark.parametrize("seed", range(RUNS))
async def test_chaos_stream_is_whole_or_clearly_broken(seed: int) -> None:
    assert await chaos_run(seed) in ("whole", "broken", "refused")
