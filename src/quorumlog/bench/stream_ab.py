"""Old tree against new tree on `quorumlog bench stream`'s Spark read, alternated run by run.

    python -m quorumlog.bench.stream_ab --old /work/main/src --new /work/wt/x/src --pairs 3

Each run is a fresh `quorumlog bench stream --json` process with PYTHONPATH set to one
tree's `src`, so that the tree's node processes, its Spark source and its client all run:
a 3-node cluster, `--spark-records` records produced over 4 partitions, five counts in
one Spark session (the figure is the median of runs 3-5, as in the bench). The produce
and consume phases run with the fewest records the bench takes: only the Spark read is
compared. Runs alternate old, new, new, old, ... so that both trees see the same machine
weather; each prints one JSON line with the tree, the load average at the start of the
read, the seconds of each count and the steady figure. On a shared machine compare the
trees pair by pair, not against a figure from another run.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from quorumlog.bench.tree_ab import add_tree_options, alternated_trees, run_in_tree

SPARK_RECORDS_DEFAULT = 1_000_000
PRODUCE_RECORDS_MIN = 1000
"""The fewest records `bench stream` produces for its produce and consume phases."""


def run_tree(source: Path, spark_records: int, directory: str) -> dict[str, Any]:
    """The `spark-read` phase line of one bench run of the tree under `source`."""
    command = ["-m", "quorumlog", "bench", "stream", "--json"]
    command += ["--records", str(PRODUCE_RECORDS_MIN), "--spark-records", str(spark_records)]
    if directory:
        command += ["--dir", directory]
    output = run_in_tree(source, command)
    for line in output.splitlines():
        if line.startswith("{") and '"spark-read"' in line:
            phase: dict[str, Any] = json.loads(line)
            return phase
    raise RuntimeError(f"no spark-read line in the output of {source}:\n{output}")


def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser)
    parser.add_argument("--spark-records", type=int, default=SPARK_RECORDS_DEFAULT)
    parser.add_argument("--dir", default="", help="where the clusters live (default: /tmp)")
    options = parser.parse_args(arguments)
    figures: dict[str, list[int]] = {"old": [], "new": []}
    for pair, name, source in alternated_trees(options):
        phase = run_tree(source, options.spark_records, options.dir)
        figures[name].append(int(phase["spark_read_records_per_s"]))
        print(json.dumps({"tree": name, "pair": pair, **phase}), flush=True)
    summary = {
        f"{name}_median_records_per_s": round(statistics.median(values))
        for name, values in figures.items()
        if values
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
