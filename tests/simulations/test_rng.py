"""`simulations._rng`: child seeds by label, the same in every process."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from simulations._rng import child_rng, child_seed


def test_a_label_path_gives_a_fixed_64_bit_seed() -> None:
    seed = child_seed(7, "node", 3)
    assert 0 <= seed < 2**64
    assert seed == child_seed(7, "node", 3)
    # BLAKE2b of "7/node/3", not Python's hash() (randomized per process): every
    # process and platform gets this number.
    assert seed == 5940240558084526947


@given(st.integers(0, 2**32), st.lists(st.integers(0, 99), min_size=1, max_size=3))
def test_the_root_and_every_label_matter(root: int, labels: list[int]) -> None:
    seed = child_seed(root, *labels)
    assert seed != child_seed(root + 1, *labels)
    assert seed != child_seed(root, *labels, 0)
    assert seed != child_seed(root, *labels[:-1], labels[-1] + 1)


def test_adding_a_component_does_not_shift_another() -> None:
    before = child_rng(1, "network").random()
    child_rng(1, "a-new-fault").random()
    assert child_rng(1, "network").random() == before


def test_child_rng_is_seeded_with_the_child_seed() -> None:
    assert child_rng(5, "x").getrandbits(64) == random.Random(child_seed(5, "x")).getrandbits(64)
