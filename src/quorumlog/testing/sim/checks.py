"""The always-on checks of the simulator (never `assert`, which `python -O` strips)."""

from __future__ import annotations


class SimulationError(Exception):
    """The simulator itself was misused or reached a state it cannot model."""


class InvariantViolation(SimulationError):
    """A safety or liveness property of the cluster under test did not hold."""


def require(condition: bool, message: str) -> None:
    """Raise SimulationError unless `condition` holds: a bug in the simulator's own use."""
    if not condition:
        raise SimulationError(message)


def check_invariant(condition: bool, message: str) -> None:
    """Raise InvariantViolation unless `condition` holds: a bug in the system under test."""
    if not condition:
        raise InvariantViolation(message)
