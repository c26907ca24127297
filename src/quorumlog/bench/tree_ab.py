"""What the old-against-new bench tools share (`storage_ab`, `ha_ab`, `stream_ab`).

Each compares two source trees on one benchmark: every run is a fresh process importing
one tree's `src` (PYTHONPATH), and runs alternate old, new, new, old, ... (the order flips
every pair, so neither tree always runs first and both see the same machine weather).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


def add_tree_options(parser: argparse.ArgumentParser) -> None:
    """`--old`, `--new` (each a tree's src directory) and `--pairs`."""
    parser.add_argument("--old", type=Path, required=True, help="the old tree's src directory")
    parser.add_argument("--new", type=Path, required=True, help="the new tree's src directory")
    parser.add_argument("--pairs", type=int, default=3, help="old/new pairs to run")


def alternated_trees(options: argparse.Namespace) -> Iterator[tuple[int, str, Path]]:
    """(pair number from 1, "old" or "new", the tree's src), in the order to run them."""
    for pair in range(options.pairs):
        trees = [("old", options.old), ("new", options.new)]
        if pair % 2:
            trees.reverse()
        for name, source in trees:
            yield pair + 1, name, source


def run_in_tree(source: Path, arguments: list[str], timeout_seconds: float | None = None) -> str:
    """Run `python ARGUMENTS` importing the tree under `source`; its standard output."""
    completed = subprocess.run(
        [sys.executable, *arguments],
        env=dict(os.environ, PYTHONPATH=str(source)),
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout_seconds,
    )
    return completed.stdout
