"""An optional trace of what happened, in order, for replaying a failing seed by eye.

Tracing is off in ordinary runs (the simulator checks `trace is not None` before building
a line), and a failure is re-run with tracing on: the seed reproduces the run exactly, so
the trace costs nothing until it is wanted.
"""

from __future__ import annotations

import collections


class TraceRecorder:
    """Keeps every line (for byte-for-byte comparison) or only the last `lines_max`."""

    def __init__(self, lines_max: int | None = None) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=lines_max)
        self.line_count = 0

    def record(self, time_ms: int, text: str) -> None:
        self.line_count += 1
        self.lines.append(f"{time_ms:>9} {text}")

    def tail(self, line_count: int) -> list[str]:
        lines = list(self.lines)
        return lines[-line_count:]

    def to_bytes(self) -> bytes:
        return ("\n".join(self.lines) + "\n").encode()
