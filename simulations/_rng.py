"""Child seeds: one root seed makes a whole run reproducible.

Every component that draws random numbers (the network, the fault schedule, the churn
processes, each node's `random.Random`) gets its own generator, seeded from the root
seed and a label. Deriving seeds by label, rather than drawing them one after another
from a parent generator, means that adding a component or a node does not shift the
numbers every other component sees: a scenario that gains one extra fault still sends
the same packets with the same latencies up to that fault.

The derivation hashes with BLAKE2b, never Python's `hash()`, which PYTHONHASHSEED
randomizes between processes.
"""

from __future__ import annotations

import hashlib
import random


def child_seed(root: int, *labels: object) -> int:
    """A 64-bit seed for the component named by `labels`, derived from `root`.

    Args:
        root: the run's seed.
        labels: a path naming the component, such as ``("node", 17, 2)``; each label is
            rendered with `str`, so use ints and plain strings.

    Returns:
        An int in ``[0, 2**64)``, the same in every process and on every platform.
    """
    text = "/".join([str(root), *(str(label) for label in labels)])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def child_rng(root: int, *labels: object) -> random.Random:
    """A `random.Random` seeded with `child_seed(root, *labels)`."""
    return random.Random(child_seed(root, *labels))
