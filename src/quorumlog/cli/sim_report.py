"""How every `quorumlog sim ...` command reports a run of seeds: each failed seed's report
(on stderr under --json, so stdout stays one JSON line), then the figures as one JSON line
or one human line, and exit status 1 if any seed failed."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping

import click


def failed_seeds(failures: list[int]) -> str:
    return ", ".join(str(seed) for seed in failures) or "none"


def report_seeds(
    failure_reports: list[str],
    figures: Mapping[str, object],
    as_json: bool,
    human_line: str,
) -> None:
    for report in failure_reports:
        click.echo(report, err=as_json)
    if as_json:
        click.echo(json.dumps(figures, sort_keys=True))
    else:
        click.echo(human_line)
    if failure_reports:
        sys.exit(1)
