"""Processes for `quorumlog bench ledger`: the metadata nodes and bookie-only processes.

- `MetadataNodes`: three `quorumlog node --no-bookie` processes (fsync on) that run the
  metadata group, so every ledger entry goes to the bookie-only processes and the figures
  are about those.
- `BookieProcesses`: N `quorumlog bookie` processes (fsync on), each registering itself in
  the metadata group and heartbeating there.

Ports are asked of the OS (kv_processes.free_ports); a bookie that lost its port to another
process exits at once and the start is tried again with fresh ports. Every process started
here is stopped and reaped by `stop` (the caller's `finally`).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from quorumlog.bench.kv_processes import (
    LOOPBACK,
    POLL_INTERVAL_SECONDS,
    START_ATTEMPTS_MAX,
    STOP_TIMEOUT_SECONDS,
    BenchError,
    NodeCluster,
    free_ports,
)
from quorumlog.ledger.metadata import MetadataStore

REGISTER_TIMEOUT_SECONDS = 30.0
"""Bookies open their storage, listen and register within this (a loaded machine)."""


class MetadataNodes(NodeCluster):
    """The metadata group, on nodes that host no bookie."""

    def extra_node_arguments(self, node_id: str) -> list[str]:
        return ["--no-bookie"]


class BookieProcesses:
    """`count` bookie-only processes on loopback, registered in the metadata group."""

    def __init__(
        self, directory: Path, count: int, cluster_id: str, metadata_endpoints: list[str]
    ) -> None:
        self.directory = directory
        self.count = count
        self.cluster_id = cluster_id
        self.metadata_endpoints = metadata_endpoints
        self.addresses: dict[str, str] = {}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def pids(self) -> dict[str, int]:
        return {bookie_id: process.pid for bookie_id, process in self.processes.items()}

    def start(self, store: MetadataStore) -> None:
        """Start every bookie and wait until all are registered writable in `store`."""
        for _ in range(START_ATTEMPTS_MAX):
            ports = free_ports(self.count)
            self.addresses = {
                f"bench-bookie-{number}": f"{LOOPBACK}:{port}"
                for number, port in enumerate(ports, start=1)
            }
            for bookie_id in self.addresses:
                self.launch(bookie_id)
            if self.wait_registered(store, REGISTER_TIMEOUT_SECONDS):
                return
            self.stop()  # one exited at start: most likely its port was taken
        raise BenchError(f"the bookies did not start; logs in {self.directory}")

    def launch(self, bookie_id: str) -> None:
        command = [
            sys.executable,
            "-m",
            "quorumlog",
            "bookie",
            "--id",
            bookie_id,
            "--listen",
            self.addresses[bookie_id],
            "--data-dir",
            str(self.directory / bookie_id),
            "--metadata",
            ",".join(self.metadata_endpoints),
            "--cluster-id",
            self.cluster_id,
        ]
        with open(self.directory / f"{bookie_id}.log", "ab") as log_file:
            self.processes[bookie_id] = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file
            )

    def wait_registered(self, store: MetadataStore, timeout_seconds: float) -> bool:
        """True once every bookie is writable in the registry; False if one exits first."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if any(process.poll() is not None for process in self.processes.values()):
                return False
            writable = {bookie.bookie_id for bookie in store.writable_bookies()}
            if writable >= set(self.addresses):
                return True
            time.sleep(POLL_INTERVAL_SECONDS)
        raise BenchError(f"bookies not registered in {timeout_seconds}s; logs in {self.directory}")

    def stop(self) -> None:
        """SIGTERM every bookie; SIGKILL those still up after STOP_TIMEOUT_SECONDS."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        for process in self.processes.values():
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = {}
