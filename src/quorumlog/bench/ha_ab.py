"""Old tree against new tree on `quorumlog bench ha`, alternated run by run.

    python -m quorumlog.bench.ha_ab --old /work/main/src --new /work/wt/x/src --pairs 3

Each run is a fresh `quorumlog bench ha --json --rounds ROUNDS` process (its own three node
processes) with PYTHONPATH set to one tree's `src`. Runs alternate old, new, new, old, ...
(the order flips every pair, so neither tree always runs first) so both trees see the same
machine weather; each prints one JSON line with the tree, the pair, the one-minute load
average before the run and the run's summary. The last line gives each tree's medians of
the HA, Raft and ledger produce rates, of the HA/Raft ratio and of the failover seconds.
On a shared machine, compare the ratios inside each run rather than raw rates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from quorumlog.bench.tree_ab import add_tree_options, alternated_trees, run_in_tree

ROUNDS_DEFAULT = 1
RUN_TIMEOUT_SECONDS = 900.0
MEDIAN_KEYS = (
    "produce_records_per_s",
    "raft_topic_produce_per_s",
    "ledger_topic_produce_per_s",
    "ratio_ha_to_raft_produce",
    "failover_seconds",
)


def run_tree(source: Path, rounds: int, directory: str) -> dict[str, Any]:
    """One `bench ha` run of the tree whose package lives under `source`: its summary."""
    command = ["-m", "quorumlog", "bench", "ha", "--json", "--rounds", str(rounds)]
    if directory:
        command += ["--dir", directory]
    output = run_in_tree(source, command, RUN_TIMEOUT_SECONDS)
    summary: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return summary


def medians(summaries: list[dict[str, Any]]) -> dict[str, float]:
    return {
        key: statistics.median(summary[key] for summary in summaries)
        for key in MEDIAN_KEYS
        if all(summary.get(key) is not None for summary in summaries)
    }


def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser)
    parser.add_argument("--rounds", type=int, default=ROUNDS_DEFAULT, help="bench ha --rounds")
    parser.add_argument("--dir", default="", help="where the nodes write (default: a temp dir)")
    options = parser.parse_args(arguments)
    summaries: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for pair, name, source in alternated_trees(options):
        load = round(os.getloadavg()[0], 2)
        summary = run_tree(source, options.rounds, options.dir)
        summaries[name].append(summary)
        line = {"tree": name, "pair": pair, "load_average_before": load, **summary}
        print(json.dumps(line), flush=True)
    result = {f"{name}_medians": medians(found) for name, found in summaries.items()}
    print(json.dumps({"case": "ab-summary", "pairs": options.pairs, **result}), flush=True)


if __name__ == "__main__":
    main()
