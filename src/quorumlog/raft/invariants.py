"""Always-on checks: a violated Raft invariant stops the node instead of corrupting data."""

from __future__ import annotations


class InvariantViolation(RuntimeError):
    """A fact the protocol relies on did not hold. This is a bug, never bad input."""


def require(condition: bool, message: str) -> None:
    """Raise InvariantViolation unless `condition` holds (unlike assert, never stripped)."""
    if not condition:
        raise InvariantViolation(message)
