"""Always-on checks: a violated Raft invariant stops the node instead of corrupting data."""

from __future__ import annotations


class InvariantViolation(RuntimeError):
    """A fact the protocol relies on did not hold. This is a bug, never bad input."""


def require(condition: bool, message: str, *arguments: object) -> None:
    """Raise InvariantViolation unless `condition` holds (unlike assert, never stripped).

    With `arguments`, `message` is a %-format filled in only when the check fails: checks
    on the per-message path then cost no string formatting while they hold."""
    if not condition:
        raise InvariantViolation(message % arguments if arguments else message)
