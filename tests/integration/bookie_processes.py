"""`quorumlog bookie` child processes for integration tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .process_cluster import _die_with_parent

STOP_TIMEOUT_SECONDS = 20.0


class BookieProcess:
    """One `quorumlog bookie` child; killed (and reaped) when the test ends."""

    def __init__(
        self,
        bookie_id: str,
        data_dir: Path,
        metadata: list[str],
        log: Path,
        cluster_id: str,
        *,
        heartbeat_ms: int,
    ) -> None:
        self.bookie_id = bookie_id
        self.data_dir = data_dir
        self.log = log
        with open(log, "ab") as log_file:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "quorumlog",
                    "bookie",
                    "--id",
                    bookie_id,
                    "--listen",
                    "127.0.0.1:0",
                    "--data-dir",
                    str(data_dir),
                    "--metadata",
                    ",".join(metadata),
                    "--cluster-id",
                    cluster_id,
                    "--heartbeat-ms",
                    str(heartbeat_ms),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                preexec_fn=_die_with_parent,
            )

    def stop(self, signal_number: int) -> int:
        self.process.send_signal(signal_number)
        return self.process.wait(timeout=STOP_TIMEOUT_SECONDS)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")
