"""`quorumlog bench stream` runs end to end and prints its summary line (figures only)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_stream_prints_phases_and_summary() -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "quorumlog",
            "bench",
            "stream",
            "--json",
            "--records",
            "2000",
            "--skip-spark",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    phases = {line.get("phase") for line in lines}
    assert {"produce", "consume"} <= phases
    summary = lines[-1]
    assert summary["produce_records_per_s"] > 0
    assert summary["consume_records_per_s"] > 0
    consumed = next(line for line in lines if line.get("phase") == "consume")
    assert consumed["records"] == 2001  # every record produced, the warm-up one included
