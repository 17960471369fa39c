"""The simulator's exceptions, in a module the compiled build leaves interpreted
(`simulations.compiled`: mypyc cannot compile a subclass of `AssertionError`)."""

from __future__ import annotations


class InvariantViolation(AssertionError):
    """A safety property broke; the message names the time, the node and the property."""
