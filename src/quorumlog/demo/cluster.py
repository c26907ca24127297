"""The demo's local cluster: the embedded default (`quorumlog dev`), plus killing a node.

The cluster is `start_dev_cluster`'s: node processes in the background, their data and
logs under one directory, their pids in its state file, stopped by `stop_dev_cluster`.
The demo adds two things a fault demo needs: SIGKILL of one node (the leader of a
partition), and a restart of that node exactly as it was launched — same id, address and
data directory — so that it catches up and the cluster ends whole.

The restart reuses the killed process's own command line (read from /proc before the
kill) rather than rebuilding it, so it cannot drift from how `start_dev_cluster` launches
nodes. Where /proc is missing the node stays down: three replicas keep working with two.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from quorumlog.cli.node_commands import (
    dev_state_path,
    load_dev_state,
    process_alive,
    start_dev_cluster,
    stop_dev_cluster,
)
from quorumlog.errors import ClientError, QuorumLogError

NODE_COUNT = 3
CLUSTER_ID = "quorumlog-demo"
MARKER_FILE = "quorumlog-demo.json"
"""Written into the demo directory, so a later run knows the directory is its own to reset."""
POLL_SECONDS = 0.05
KILL_REAP_SECONDS_MAX = 5.0

ConditionValue = TypeVar("ConditionValue")


class DemoDirectoryError(QuorumLogError):
    """The demo directory holds something that is not the demo's (so it is left alone)."""


def wait_until(
    condition: Callable[[], ConditionValue | None], timeout_seconds: float, what: str
) -> ConditionValue:
    """Poll `condition` until it returns a value that is not None; TimeoutError after the
    deadline, naming `what` and the last client error seen."""
    deadline = time.monotonic() + timeout_seconds
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
            if value is not None:
                return value
        except ClientError as error:
            last_error = error
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"{what}: not done after {timeout_seconds:g}s{detail}")
        time.sleep(POLL_SECONDS)


def reset_demo_directory(directory: Path) -> None:
    """Make `directory` an empty demo directory: stop a cluster a previous run left up
    (--keep-cluster), and delete what that run wrote. A directory that is neither empty nor
    marked as the demo's is refused, so a mistyped --dir never deletes someone's files."""
    if directory.exists():
        if not directory.is_dir():
            raise DemoDirectoryError(f"{directory} exists and is not a directory")
        marked = (directory / MARKER_FILE).exists()
        if not marked and any(directory.iterdir()):
            raise DemoDirectoryError(
                f"{directory} is not empty and was not made by `quorumlog demo`; "
                "give another --dir (the demo resets its directory at each run)"
            )
        cluster_directory = directory / "cluster"
        if load_dev_state(str(cluster_directory)) is not None:
            stop_dev_cluster(str(cluster_directory))
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    (directory / MARKER_FILE).write_text(json.dumps({"made_by": "quorumlog demo"}) + "\n")
    # As pytest does for its cache: the directory keeps itself out of a git checkout.
    (directory / ".gitignore").write_text("# made by quorumlog demo\n*\n")


@dataclass(frozen=True)
class KilledNode:
    node_id: str
    pid: int
    command: list[str] | None
    """The process's command line, to restart it with; None where /proc is missing."""


class DemoCluster:
    """A dev cluster of NODE_COUNT nodes under `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory.resolve()
        self.endpoints: list[str] = []
        self.addresses: dict[str, str] = {}
        self.started = False

    def start(self) -> None:
        state = start_dev_cluster(str(self.directory), NODE_COUNT, CLUSTER_ID)
        self.started = True
        self.addresses = dict(state["addresses"])  # type: ignore[call-overload]
        self.endpoints = list(self.addresses.values())

    def pids(self) -> dict[str, int]:
        state = load_dev_state(str(self.directory))
        if state is None:
            return {}
        pids: dict[str, int] = state["pids"]  # type: ignore[assignment]
        return pids

    def kill(self, node_id: str) -> KilledNode:
        """SIGKILL the node (no clean shutdown: as a crash or a pulled plug) and reap it."""
        pid = self.pids()[node_id]
        command = read_command_line(pid)
        os.kill(pid, signal.SIGKILL)
        reap(pid, KILL_REAP_SECONDS_MAX)
        return KilledNode(node_id, pid, command)

    def restart(self, killed: KilledNode) -> int | None:
        """Start the killed node again as it was launched; its new pid, or None if its
        command line is unknown. Its log continues in the same file."""
        if killed.command is None:
            return None
        with open(self.directory / f"{killed.node_id}.log", "ab") as log_file:
            process = subprocess.Popen(
                killed.command,
                stdout=log_file,
                stderr=log_file,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.record_pid(killed.node_id, process.pid)
        return process.pid

    def record_pid(self, node_id: str, pid: int) -> None:
        # The state file is how `stop_dev_cluster` (and `quorumlog dev down`) find nodes.
        state = load_dev_state(str(self.directory))
        if state is None:
            raise QuorumLogError(f"no dev cluster state under {self.directory}")
        pids: dict[str, int] = state["pids"]  # type: ignore[assignment]
        pids[node_id] = pid
        dev_state_path(str(self.directory)).write_text(json.dumps(state, indent=2))

    def stop(self) -> list[str]:
        if not self.started:
            return []
        self.started = False
        return stop_dev_cluster(str(self.directory))

    def all_alive(self) -> bool:
        return all(process_alive(pid) for pid in self.pids().values())


def read_command_line(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    arguments = [part.decode() for part in raw.split(b"\0") if part]
    return arguments or None


def reap(pid: int, timeout_seconds: float) -> None:
    """Wait for a killed child to exit, so it leaves no zombie and its port is free."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            finished, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            # Not our child (another process started the cluster): wait for it to vanish.
            if not process_alive(pid):
                return
            finished = 0
        if finished:
            return
        time.sleep(POLL_SECONDS)
