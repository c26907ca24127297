"""Old tree against new tree on `mmap-vs-segment-append-100`, alternated run by run.

    python -m quorumlog.bench.storage_ab --old /work/main/src --new /work/wt/x/src --pairs 3

Each run is a fresh process with PYTHONPATH set to one tree's `src`, running the
side-by-side case (`bench.storage.bench_side_by_side`: the segment and the mmap store take
the same batches, alternating batch by batch) of the tree it imports. Runs alternate old,
new, old, new, ... so that both trees see the same disk weather; each prints one JSON line
with the tree, the one-minute load average at its end, both stores' entries/s and their
ratio. The segment store is the yardstick inside each run: compare the ratios, not the
raw rates, on a machine that others share.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from quorumlog.bench.tree_ab import add_tree_options, alternated_trees, run_in_tree

RUN_CODE = """
import json, os, sys, tempfile
from pathlib import Path
from quorumlog.bench.storage import bench_side_by_side
entries, repeats, directory = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] or None
with tempfile.TemporaryDirectory(prefix="quorumlog-ab-", dir=directory) as root:
    result = bench_side_by_side(Path(root) / "work", 100, entries, repeats)
result["load_average_1m"] = round(os.getloadavg()[0], 2)
print(json.dumps(result))
"""
ENTRIES_DEFAULT = 256 * 800
REPEATS_DEFAULT = 3


def run_tree(source: Path, entries: int, repeats: int, directory: str) -> dict[str, object]:
    """One side-by-side run of the tree whose package lives under `source`."""
    output = run_in_tree(source, ["-c", RUN_CODE, str(entries), str(repeats), directory])
    result: dict[str, object] = json.loads(output.strip().splitlines()[-1])
    return result


def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser)
    parser.add_argument("--entries", type=int, default=ENTRIES_DEFAULT)
    parser.add_argument("--repeats", type=int, default=REPEATS_DEFAULT, help="runs per process")
    parser.add_argument("--dir", default="", help="where to write (default: a temporary dir)")
    options = parser.parse_args(arguments)
    for pair, name, source in alternated_trees(options):
        result = run_tree(source, options.entries, options.repeats, options.dir)
        print(json.dumps({"tree": name, "pair": pair, **result}), flush=True)


if __name__ == "__main__":
    main()
