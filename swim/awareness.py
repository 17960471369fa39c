"""Lifeguard's Local Health Multiplier (section 4.1 of Dadgar, Phillips, Currey 2018).

A node that is itself slow (CPU starved, GC paused, on a congested link) misses acks and
then accuses healthy members. Awareness lets it notice: the score goes up when its own
probes fail without the nacks that would prove it healthy, or when it has to refute a
suspicion about itself, and down with every successful probe. Probe interval and probe
timeout are multiplied by score + 1, so a struggling node slows down and waits longer
instead of spreading false suspicions.
"""

from __future__ import annotations


class Awareness:
    """A saturating health score in 0..max_multiplier-1 (0 is healthy).

    The deltas follow memberlist: -1 for a successful probe; for a failed probe +1 per
    missing nack, or +1 when no nacks were expected; +1 for having to refute.
    """

    __slots__ = ("_max", "_score")

    def __init__(self, max_multiplier: int) -> None:
        """Args:
        max_multiplier: S; the score never reaches it, so timeouts scale by at most S.
        """
        if max_multiplier < 1:
            raise ValueError(f"max_multiplier must be >= 1, got {max_multiplier}")
        self._max = max_multiplier
        self._score = 0

    @property
    def score(self) -> int:
        """The current health score; 0 is healthy."""
        return self._score

    def apply_delta(self, delta: int) -> int:
        """Move the score by `delta`, clamped to 0..max-1.

        Returns:
            The new score.
        """
        score = self._score + delta
        if score < 0:
            score = 0
        elif score > self._max - 1:
            score = self._max - 1
        self._score = score
        return score

    def scale(self, timeout: float) -> float:
        """`timeout * (score + 1)`."""
        return timeout * (self._score + 1)
