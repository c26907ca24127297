"""`quorumlog bench scale --json --quick` runs end to end and prints its figures.

The figures are never judged (benchmarks do not pass or fail); this checks that every
phase runs and that the summary line has its keys (named by the largest partition count,
50 in the quick run, 1000 in the full one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

QUICK_LARGEST = 50
QUICK_COMMAND = [sys.executable, "-m", "quorumlog", "bench", "scale", "--json", "--quick", "--dir"]


def test_bench_scale_quick_prints_phases_and_a_summary(tmp_path: Path) -> None:
    completed = subprocess.run(
        [*QUICK_COMMAND, str(tmp_path)],
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr.decode()[-3000:]
    lines = [json.loads(line) for line in completed.stdout.decode().splitlines() if line]
    phases = [line["partitions"] for line in lines if line.get("phase") == "partitions"]
    assert phases == [1, 3, 10, QUICK_LARGEST]
    summary = lines[-1]
    assert {
        "idle_cores_1_partition",
        f"idle_cores_{QUICK_LARGEST}_partitions",
        "rss_mb_per_1000_groups",
        f"produce_records_per_s_{QUICK_LARGEST}_partitions",
        "produce_records_per_s_3_partitions",
        f"seconds_to_create_{QUICK_LARGEST}_partitions",
        f"produce_ratio_{QUICK_LARGEST}_to_3_partitions",
        "produce_records",
    } <= summary.keys()
    for line in lines[:-1]:
        assert line["produce_node_cpu_seconds"] > 0
        assert line["produce_client_cpu_seconds"] > 0
