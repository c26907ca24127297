"""Errors the Spark source and sink raise on purpose; each names what to fix."""

from __future__ import annotations

from quorumlog.errors import QuorumLogError


class OptionError(QuorumLogError, ValueError):
    """A bad option value (or a bad combination); the message starts with the option name."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"quorumlog option {option!r}: {problem}")
        self.option = option
        self.problem = problem


class DataLossError(QuorumLogError):
    """Offsets the query needs are gone (retention removed them, or a topic was deleted).

    Raised only with `failOnDataLoss` true; with it false the reader skips what is gone."""

    def __init__(self, problem: str) -> None:
        super().__init__(
            f"{problem}. Some data may have been lost (retention removed it, or the topic was "
            "deleted and recreated). If you want the query to go on and skip what is gone, set "
            "the option 'failOnDataLoss' to false."
        )
