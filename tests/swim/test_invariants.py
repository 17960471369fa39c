"""`swim._invariants`: a healthy core passes, and each kind of corruption is caught
with a line that says what broke."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from swim import Membership, MemberState
from swim.wire import Alive, Suspect, encode

from .helpers import TEST_CONFIG

SOURCE = ("10.9.9.9", 1)


def core() -> Membership:
    c = Membership(TEST_CONFIG, "me", ("10.0.0.1", 1), random.Random(2), 0.0)
    c.receive(
        SOURCE,
        encode(
            Alive("a", 0, ("10.0.1.1", 1), b""),
            Alive("b", 0, ("10.0.1.2", 1), b""),
            Suspect("b", 0, "a"),
        ),
        0.0,
    )
    return c


def test_a_core_driven_through_its_api_passes() -> None:
    c = core()
    while (deadline := c.next_deadline()) is not None and deadline < 20.0:
        c.tick(deadline)
        c._check_invariants()
    c._view_cache().digest()
    c._check_invariants()


def _count(c: Membership) -> None:
    c._counts[0] += 1


def _suspicion(c: Membership) -> None:
    c._members["b"].suspicion = None


def _entry(c: Membership) -> None:
    c._members["a"].encoded_entry()
    c._members["a"].incarnation = 9  # changed without `_changed`


def _name_list(c: Membership) -> None:
    c._names.extra.remove("a")


def _rtt(c: Membership) -> None:
    c._rtt["ghost"] = 0.1


def _view(c: Membership) -> None:
    c._view_cache().digest()
    c._members["a"].state = MemberState.DEAD  # behind the cache's back
    c._members["a"].entry = None
    c._counts[0] -= 1
    c._counts[2] += 1


def _own_state(c: Membership) -> None:
    c._self.state = MemberState.SUSPECT
    c._counts[0] -= 1
    c._counts[1] += 1
    c._self.suspicion = c._members["b"].suspicion


def _pull_batch(c: Membership) -> None:
    c._pull_batch[("h", 1)] = ["a"]


def _gossip_idle(c: Membership) -> None:
    c._gossip_at = None


CORRUPTIONS: dict[str, tuple[Callable[[Membership], None], str]] = {
    "count": (_count, "state counts"),
    "suspicion": (_suspicion, "suspicion timer does not match"),
    "entry": (_entry, "stale push-pull entry"),
    "name list": (_name_list, "missing from the sampling list"),
    "rtt": (_rtt, "an RTT is kept"),
    "view": (_view, "cached sync digest is stale"),
    "own state": (_own_state, "our own state is SUSPECT"),
    "pull batch": (_pull_batch, "pulls gathered but not sent"),
    "gossip idle": (_gossip_idle, "gossip is idle"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_each_corruption_is_caught_and_named(kind: str) -> None:
    c = core()
    c._check_invariants()
    corrupt, words = CORRUPTIONS[kind]
    corrupt(c)
    with pytest.raises(AssertionError, match="swim invariant violated on 'me'") as caught:
        c._check_invariants()
    assert words in str(caught.value)
