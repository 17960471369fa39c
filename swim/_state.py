"""Member-state precedence: what a rumor does to our view of a member.

Theory of operation
===================

Every member has an *incarnation* number that only its owner may raise (SWIM section
4.2). Rumors about a member carry the incarnation they are about. A rumor is compared
with what we hold for that member, in three steps, and this table is the whole rule:

1. The *subject*: what we currently believe. A member we have never heard of (or have
   reaped) is UNKNOWN; otherwise its state ALIVE, SUSPECT, DEAD or LEFT. Rumors about
   ourselves are special (SELF, or SELF_LEFT once we left): nobody but us may decide our
   state, so an accusation is answered by a *refute*, never applied.
2. The *rumor*: alive, suspect, dead or left.
3. The *order*: the rumor's incarnation against ours: OLDER, SAME or NEWER.

SWIM's precedence (section 4.2), as memberlist implements it:

* `alive(i)` overrides `suspect(j)`, `dead(j)` and `alive(j)` only when i > j: only the
  member itself raises its incarnation, so a higher one proves it was alive after the
  accusation. This is also how a restarted or returning member comes back.
* `suspect(i)` overrides `alive(j)` when i >= j, and `suspect(j)` when i > j. A suspect
  rumor about a member we already suspect at the same incarnation is a *confirmation*,
  which Lifeguard's dynamic suspicion counts (Lifeguard section 4.2). A newer one (the
  member refuted once, we missed its alive, and it is suspected again) starts a new
  suspicion at the newer incarnation, with its own timer: the old timer's accusers
  accused an incarnation the member has since outbid. Confirming it instead, with the
  newer incarnation, declared the member dead at that incarnation when the *old* timer
  ran out, which beats the member's own alive at it everywhere: in a 100-daemon start
  storm, one such death of a starved seed, seconds after it had refuted, was 93 of the
  94 `member.failed` lines. (memberlist confirms and keeps the stale incarnation, so its
  death is about the refuted incarnation and harms nobody but the node that declares it.)
* `dead(i)` and `left(i)` override alive and suspect when i >= j. Dead and left are
  final for that incarnation: nothing but a newer alive undoes them, and a suspect or a
  second death changes nothing.
* Suspect, dead and left rumors about members we do not know are ignored: there is
  nothing to accuse, and a dead rumor must not create a member (memberlist does the
  same). An alive rumor about an unknown member is a join.
* About ourselves: an accusation (suspect, dead or left) at our incarnation or newer is
  refuted by raising our incarnation above it and gossiping alive; older ones were
  already refuted. An alive rumor about us with a newer incarnation means a previous
  run of ours got further than we did (we restarted): we refute above it too. At the
  same incarnation, an alive rumor is our own echo unless its address or metadata
  differ, which again means an older run of ours: refute. After we left, nothing about
  us changes anything.

The table is data, so a test can check every one of its 84 cells against this text.
"""

from __future__ import annotations

import enum


class Subject(enum.IntEnum):
    """What we hold for the member a rumor is about."""

    UNKNOWN = 0
    ALIVE = 1
    SUSPECT = 2
    DEAD = 3
    LEFT = 4
    SELF = 5
    SELF_LEFT = 6


class Rumor(enum.IntEnum):
    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    LEFT = 3


class Order(enum.IntEnum):
    """The rumor's incarnation compared with the one we hold."""

    OLDER = 0
    SAME = 1
    NEWER = 2


class Action(enum.IntEnum):
    IGNORE = 0
    #: Set alive at the rumor's incarnation, address and metadata.
    BECOME_ALIVE = 1
    #: Set suspect at the rumor's incarnation and start a (new) suspicion timer.
    BECOME_SUSPECT = 2
    #: Count a confirmation of the running suspicion (same incarnation).
    CONFIRM = 3
    BECOME_DEAD = 4
    BECOME_LEFT = 5
    #: Raise our own incarnation above the rumor's and gossip alive.
    REFUTE = 6
    #: REFUTE if the rumor's address or metadata differ from ours, else IGNORE.
    REFUTE_IF_CHANGED = 7


_I = Action.IGNORE
_ALL_IGNORED = (_I, _I, _I)

#: (subject, rumor) -> actions for (OLDER, SAME, NEWER).
PRECEDENCE: dict[tuple[Subject, Rumor], tuple[Action, Action, Action]] = {
    (Subject.UNKNOWN, Rumor.ALIVE): (Action.BECOME_ALIVE,) * 3,
    (Subject.UNKNOWN, Rumor.SUSPECT): _ALL_IGNORED,
    (Subject.UNKNOWN, Rumor.DEAD): _ALL_IGNORED,
    (Subject.UNKNOWN, Rumor.LEFT): _ALL_IGNORED,
    (Subject.ALIVE, Rumor.ALIVE): (_I, _I, Action.BECOME_ALIVE),
    (Subject.ALIVE, Rumor.SUSPECT): (_I, Action.BECOME_SUSPECT, Action.BECOME_SUSPECT),
    (Subject.ALIVE, Rumor.DEAD): (_I, Action.BECOME_DEAD, Action.BECOME_DEAD),
    (Subject.ALIVE, Rumor.LEFT): (_I, Action.BECOME_LEFT, Action.BECOME_LEFT),
    (Subject.SUSPECT, Rumor.ALIVE): (_I, _I, Action.BECOME_ALIVE),
    (Subject.SUSPECT, Rumor.SUSPECT): (_I, Action.CONFIRM, Action.BECOME_SUSPECT),
    (Subject.SUSPECT, Rumor.DEAD): (_I, Action.BECOME_DEAD, Action.BECOME_DEAD),
    (Subject.SUSPECT, Rumor.LEFT): (_I, Action.BECOME_LEFT, Action.BECOME_LEFT),
    (Subject.DEAD, Rumor.ALIVE): (_I, _I, Action.BECOME_ALIVE),
    (Subject.DEAD, Rumor.SUSPECT): _ALL_IGNORED,
    (Subject.DEAD, Rumor.DEAD): _ALL_IGNORED,
    (Subject.DEAD, Rumor.LEFT): _ALL_IGNORED,
    (Subject.LEFT, Rumor.ALIVE): (_I, _I, Action.BECOME_ALIVE),
    (Subject.LEFT, Rumor.SUSPECT): _ALL_IGNORED,
    (Subject.LEFT, Rumor.DEAD): _ALL_IGNORED,
    (Subject.LEFT, Rumor.LEFT): _ALL_IGNORED,
    (Subject.SELF, Rumor.ALIVE): (_I, Action.REFUTE_IF_CHANGED, Action.REFUTE),
    (Subject.SELF, Rumor.SUSPECT): (_I, Action.REFUTE, Action.REFUTE),
    (Subject.SELF, Rumor.DEAD): (_I, Action.REFUTE, Action.REFUTE),
    (Subject.SELF, Rumor.LEFT): (_I, Action.REFUTE, Action.REFUTE),
    (Subject.SELF_LEFT, Rumor.ALIVE): _ALL_IGNORED,
    (Subject.SELF_LEFT, Rumor.SUSPECT): _ALL_IGNORED,
    (Subject.SELF_LEFT, Rumor.DEAD): _ALL_IGNORED,
    (Subject.SELF_LEFT, Rumor.LEFT): _ALL_IGNORED,
}

#: The same table as nested tuples of ints, indexed [subject][rumor][order], for the
#: hot path (a dict lookup on an enum tuple costs more than three index operations).
PRECEDENCE_FAST: tuple[tuple[tuple[int, int, int], ...], ...] = tuple(
    tuple(
        tuple(int(action) for action in PRECEDENCE[(subject, rumor)])  # type: ignore[misc]
        for rumor in Rumor
    )
    for subject in Subject
)


def decide(subject: Subject, rumor: Rumor, order: Order) -> Action:
    """The action for one rumor: a lookup in `PRECEDENCE`."""
    return PRECEDENCE[(subject, rumor)][order]


def order_of(rumor_incarnation: int, held_incarnation: int) -> Order:
    """Compare a rumor's incarnation with the one we hold."""
    if rumor_incarnation < held_incarnation:
        return Order.OLDER
    if rumor_incarnation == held_incarnation:
        return Order.SAME
    return Order.NEWER
