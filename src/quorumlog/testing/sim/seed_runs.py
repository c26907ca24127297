"""What every simulated world does with many seeds: run them (in worker processes if asked),
total them, and describe a failed one.

Each world (HA, ledger, consumer groups) has its own seed result with its own counts; they
share the fields in `SeedOutcome`, and their summaries share the head of the JSON line
that `quorumlog sim ... --json` prints, so a script reading one world's summary reads
them all.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, Self, TypeVar

import msgspec


class SeedOutcome(Protocol):
    """The fields every world's seed result has."""

    @property
    def seed(self) -> int: ...
    @property
    def ok(self) -> bool: ...
    @property
    def simulated_ms(self) -> int: ...
    @property
    def invariant_checks(self) -> int: ...
    @property
    def failure(self) -> str | None: ...
    @property
    def replay_command(self) -> str: ...
    @property
    def trace_tail(self) -> list[str]: ...


JobT = TypeVar("JobT")
ResultT = TypeVar("ResultT")
OutcomeT = TypeVar("OutcomeT", bound=SeedOutcome)


def map_seeds(run: Callable[[JobT], ResultT], jobs: Sequence[JobT], workers: int) -> list[ResultT]:
    """`run` over `jobs` in order, in `workers` processes when there is more than one job.

    `run` must be a module-level function (or a `functools.partial` of one) and carry every
    setting in its job: a pool worker sees none of the caller's defaults.
    """
    if workers <= 1 or len(jobs) <= 1:
        return [run(job) for job in jobs]
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run, jobs))


class SeedRunSummary(msgspec.Struct, Generic[OutcomeT]):
    seeds: int
    failures: list[int]
    simulated_seconds: float
    wall_seconds: float
    invariant_checks: int
    results: list[OutcomeT]

    @classmethod
    def of(cls, results: list[OutcomeT], started: float) -> Self:
        """Total `results` of a run that began at `started` (a `time.perf_counter()`)."""
        return cls(
            seeds=len(results),
            failures=[result.seed for result in results if not result.ok],
            simulated_seconds=sum(result.simulated_ms for result in results) / 1000,
            wall_seconds=time.perf_counter() - started,
            invariant_checks=sum(result.invariant_checks for result in results),
            results=results,
        )

    def to_json_line(self) -> dict[str, object]:
        return {
            "seeds": self.seeds,
            "failures": self.failures,
            "simulated_seconds": round(self.simulated_seconds, 3),
            "wall_seconds": round(self.wall_seconds, 3),
            "invariant_checks": self.invariant_checks,
            "simulated_per_wall": round(self.simulated_seconds / max(self.wall_seconds, 1e-9), 1),
            **self.world_figures(),
        }

    def world_figures(self) -> dict[str, object]:
        """The world's own totals, after the shared head of the JSON line."""
        return {}


def format_seed_failure(result: SeedOutcome, circumstances: str) -> str:
    """A failed seed's report: what it ran (`circumstances`), how to replay it, what broke,
    and the tail of its trace."""
    lines = [
        f"seed {result.seed} FAILED ({circumstances}, at {result.simulated_ms} ms)",
        f"replay: {result.replay_command}",
        str(result.failure),
    ]
    if result.trace_tail:
        lines.append(f"trace tail ({len(result.trace_tail)} lines):")
        lines.extend(result.trace_tail)
    return "\n".join(lines)
