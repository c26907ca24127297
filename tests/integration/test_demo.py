"""`quorumlog demo` end to end, as `make demo` runs it, on the first 5,000 flights.

Real node processes, a real Spark (local mode), the real dataset; the demo checks itself
(see quorumlog/demo/checks.py) and says PASS or FAIL, which is what this test reads.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from quorumlog.cli.node_commands import load_dev_state, stop_dev_cluster

RECORDS = 5_000
DEMO_TIMEOUT_SECONDS = 240.0
"""Far above the ~30 s a run takes on an idle 2-core machine: CI machines are busy."""

pytestmark = pytest.mark.slow


def run_demo(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quorumlog", "demo", *arguments],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_SECONDS,
        check=False,
    )


def test_demo_passes_and_stops_its_cluster(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    cluster_directory = directory / "cluster"
    try:
        result = run_demo("--records", str(RECORDS), "--dir", str(directory))
    finally:
        # Only if the demo died before stopping its nodes (a timeout, say).
        stop_dev_cluster(str(cluster_directory))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"PASS {RECORDS:,} records produced, stored and counted exactly once" in output
    assert "records counted by Spark" in output
    assert "stop cluster" in output
    assert load_dev_state(str(cluster_directory)) is None  # stopped: its state file is gone
    assert (directory / "spark.log").exists()


def test_demo_refuses_a_directory_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not the demo's")
    result = run_demo("--records", "10", "--dir", str(tmp_path))
    assert result.returncode == 1
    assert "was not made by `quorumlog demo`" in result.stderr
    assert (tmp_path / "notes.txt").read_text() == "not the demo's"
