"""What the demo shows: a line per stage as it ends, progress bars, and the tables at the
end (a summary of the results, the checks, the time of each stage)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from quorumlog.demo.checks import Check
from quorumlog.demo.pipeline import RESULT_KEY_PREFIX, FlightStats, encode_stats

MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@dataclass(frozen=True)
class CarrierSummary:
    """A carrier's months folded into one line of the summary table."""

    carrier: str
    name: str
    flights: int
    cancelled: int
    mean_dep_delay: float | None
    """Over the departed flights of all its months (each month's mean weighted by them)."""
    worst_month: int
    worst_p90_dep_delay: int | None


def summarize_carriers(results: Sequence[FlightStats]) -> list[CarrierSummary]:
    """One summary per carrier, the busiest first."""
    by_carrier: dict[str, list[FlightStats]] = {}
    for stats in results:
        by_carrier.setdefault(stats.carrier, []).append(stats)
    summaries = [summarize_carrier(months) for months in by_carrier.values()]
    return sorted(summaries, key=lambda summary: (-summary.flights, summary.carrier))


def summarize_carrier(months: list[FlightStats]) -> CarrierSummary:
    delay_total = 0.0
    departed_total = 0
    for stats in months:
        departed = stats.flights - stats.cancelled
        if stats.mean_dep_delay is not None and departed:
            delay_total += stats.mean_dep_delay * departed
            departed_total += departed
    worst = max(months, key=lambda stats: (stats.p90_dep_delay or -(10**9), -stats.month))
    first = months[0]
    return CarrierSummary(
        carrier=first.carrier,
        name=first.carrier_name,
        flights=sum(stats.flights for stats in months),
        cancelled=sum(stats.cancelled for stats in months),
        mean_dep_delay=delay_total / departed_total if departed_total else None,
        worst_month=worst.month,
        worst_p90_dep_delay=worst.p90_dep_delay,
    )


def minutes(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_results(console: Console, results: Sequence[FlightStats], output_topic: str) -> None:
    if not results:
        console.print("[yellow]no results[/]")
        return
    table = Table(
        title=(
            f"Departure delays by carrier, {len(results)} carrier-months "
            f"(KV {RESULT_KEY_PREFIX}*, topic {output_topic})"
        ),
        title_justify="left",
    )
    table.add_column("carrier")
    table.add_column("name")
    table.add_column("flights", justify="right")
    table.add_column("cancelled", justify="right")
    table.add_column("mean delay (min)", justify="right")
    table.add_column("worst month by p90", justify="right")
    for summary in summarize_carriers(results):
        table.add_row(
            summary.carrier,
            summary.name,
            f"{summary.flights:,}",
            f"{summary.cancelled:,}",
            minutes(summary.mean_dep_delay),
            f"{MONTH_NAMES[summary.worst_month - 1]}: {summary.worst_p90_dep_delay} min",
        )
    console.print(table)
    sample = max(results, key=lambda stats: stats.flights)
    console.print(f"  e.g. {sample.kv_key} = {sample_json(sample)}", soft_wrap=True)


def sample_json(stats: FlightStats) -> str:
    return encode_stats(stats).decode()


def print_checks(console: Console, checks: Sequence[Check]) -> None:
    table = Table(title="Checks", title_justify="left")
    table.add_column("check")
    table.add_column("expected", justify="right")
    table.add_column("actual", justify="right")
    table.add_column("")
    for check in checks:
        verdict = "[green]ok[/]" if check.passed else "[bold red]FAILED[/]"
        table.add_row(check.name, check.expected, check.actual, verdict)
    console.print(table)


@dataclass
class StageTime:
    name: str
    seconds: float
    detail: str = ""
    overlapped: bool = False
    """Ran alongside other stages (in a thread), so it does not add to the total."""


def print_stages(console: Console, stages: Sequence[StageTime], total_seconds: float) -> None:
    table = Table(title="Stage timings", title_justify="left")
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for stage in stages:
        share = stage.seconds / total_seconds if total_seconds else 0.0
        name = f"{stage.name} (alongside)" if stage.overlapped else stage.name
        table.add_row(name, f"{stage.seconds:.1f}", f"{share:.0%}")
    table.add_section()
    table.add_row("total (wall)", f"{total_seconds:.1f}", "")
    console.print(table)


@dataclass
class StageClock:
    """Times the stages and prints a line as each one ends (from any thread)."""

    console: Console
    stages: list[StageTime] = field(default_factory=list)
    started_seconds: float = field(default_factory=time.monotonic)

    @contextlib.contextmanager
    def stage(self, name: str, overlapped: bool = False) -> Iterator[StageTime]:
        stage = StageTime(name, 0.0, overlapped=overlapped)
        started = time.monotonic()
        yield stage
        stage.seconds = time.monotonic() - started
        self.stages.append(stage)
        marker = "∥" if overlapped else "✓"
        # soft_wrap: a long detail wraps where the terminal does, not at rich's guess.
        self.console.print(
            f"[green]{marker}[/] {name:<14} {stage.seconds:5.1f} s  {stage.detail}",
            soft_wrap=True,
        )

    def total_seconds(self) -> float:
        return time.monotonic() - self.started_seconds


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("  {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
