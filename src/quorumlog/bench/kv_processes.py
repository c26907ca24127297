"""Processes for `quorumlog bench kv`: a node cluster, load processes, /proc figures.

Ports are asked of the OS (bind port 0, read it, close); a node that loses its port to
another process before binding makes the start fail and try again with fresh ports.
Every process started here is stopped and reaped by whoever started it (`NodeCluster.stop`,
`LoadProcesses.kill`), also when the benchmark fails half-way.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from quorumlog.bench.kv_load import READY_LINE
from quorumlog.codec.frame import FrameDecoder, encode_frame
from quorumlog.codec.wire import (
    ClientRequest,
    Frame,
    StatusRequest,
    StatusResponse,
    decode,
    encode,
)
from quorumlog.errors import ClientError
from quorumlog.kv.connection import hello_frame
from quorumlog.tls.config import TLSConfig
from quorumlog.tls.handshake import open_blocking

LOOPBACK = "127.0.0.1"
START_ATTEMPTS_MAX = 3
START_TIMEOUT_SECONDS = 20.0
STOP_TIMEOUT_SECONDS = 10.0
POLL_INTERVAL_SECONDS = 0.05
READY_TIMEOUT_SECONDS = 60.0
"""Load processes connect and PySyncObj elects within this (generous: a loaded machine)."""
FINISH_SLACK_SECONDS = 30.0
CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
RECEIVE_BYTES = 1 << 20


class BenchError(RuntimeError):
    """The benchmark could not run (a process failed); the message says which and why."""


def free_ports(count: int) -> list[int]:
    """Ports the OS hands out now; held open together so they differ, then released."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


def request_once(
    address: str,
    cluster_id: str,
    request: ClientRequest,
    timeout_seconds: float,
    client_id: str,
    tls: TLSConfig | None = None,
) -> Frame | None:
    """The node's answer to `request` on a fresh connection (TLS with `tls`); None if it
    gives none in time."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_seconds
    try:
        with open_blocking(host, int(port), tls, timeout_seconds, address) as sock:
            sock.sendall(hello_frame(cluster_id, client_id))
            sock.sendall(encode_frame(encode(request)))
            decoder = FrameDecoder()
            payloads: list[bytes] = []
            while len(payloads) < 2:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                data = sock.recv(RECEIVE_BYTES)
                if not data:
                    return None
                payloads.extend(decoder.feed(data))
    except (OSError, ClientError):
        return None
    return decode(payloads[1])


def query_status(
    address: str, cluster_id: str, timeout_seconds: float, tls: TLSConfig | None = None
) -> StatusResponse | None:
    """One node's status on a fresh connection, or None if it does not answer in time."""
    frame = request_once(
        address, cluster_id, StatusRequest(request_id=1), timeout_seconds, "bench-status", tls
    )
    return frame if isinstance(frame, StatusResponse) else None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far (from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, utime 14 and stime 15 (1-based, man proc).
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_SECOND


def peak_rss_megabytes(pid: int) -> float:
    """The process's peak resident set size so far (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise BenchError(f"no VmHWM in /proc/{pid}/status")


class NodeCluster:
    """Three (or N) `quorumlog node` processes on loopback, fsync on, logs in files."""

    def __init__(self, directory: Path, node_count: int, cluster_id: str) -> None:
        self.directory = directory
        self.node_count = node_count
        self.cluster_id = cluster_id
        self.addresses: dict[str, str] = {}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.tls: TLSConfig | None = None
        """How to reach the nodes when a subclass makes them require TLS."""

    @property
    def endpoints(self) -> list[str]:
        return list(self.addresses.values())

    @property
    def pids(self) -> dict[str, int]:
        return {node_id: process.pid for node_id, process in self.processes.items()}

    def start(self) -> str:
        """Start every node; returns the leader's id once one is elected."""
        for _ in range(START_ATTEMPTS_MAX):
            ports = free_ports(self.node_count)
            self.addresses = {
                f"n{number}": f"{LOOPBACK}:{port}" for number, port in enumerate(ports, start=1)
            }
            for node_id in self.addresses:
                self.launch(node_id)
            leader = self.wait_for_leader(START_TIMEOUT_SECONDS)
            if leader is not None:
                return leader
            self.stop()  # a node exited at start: most likely its port was taken
        raise BenchError(f"the node cluster did not start; logs in {self.directory}")

    def launch(self, node_id: str) -> None:
        peers = ",".join(f"{other}={a}" for other, a in self.addresses.items() if other != node_id)
        command = [
            sys.executable,
            "-m",
            "quorumlog",
            "node",
            "--id",
            node_id,
            "--listen",
            self.addresses[node_id],
            "--peers",
            peers,
            "--data-dir",
            str(self.directory / node_id),
            "--cluster-id",
            self.cluster_id,
            *self.extra_node_arguments(node_id),
        ]
        with open(self.directory / f"{node_id}.log", "ab") as log_file:
            self.processes[node_id] = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file
            )

    def extra_node_arguments(self, node_id: str) -> list[str]:
        """`quorumlog node` flags after the common ones (a hook for subclasses)."""
        return []

    def wait_for_leader(self, timeout_seconds: float) -> str | None:
        """The leader's id once one is elected; None if a node exits first."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if any(process.poll() is not None for process in self.processes.values()):
                return None
            for node_id, address in self.addresses.items():
                status = query_status(address, self.cluster_id, 0.5, self.tls)
                if status is not None and status.is_leader:
                    return node_id
            time.sleep(POLL_INTERVAL_SECONDS)
        raise BenchError(f"no leader elected in {timeout_seconds}s; logs in {self.directory}")

    def stop(self) -> None:
        """SIGTERM every node; SIGKILL those still up after STOP_TIMEOUT_SECONDS; reap all."""
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


class LoadProcesses:
    """Load processes started together: each says when it is ready, then all get one start
    time, so a process that came up slowly does not miss the window.

    Every process is killed and reaped by `finish` (also after a failure)."""

    def __init__(self, commands: Sequence[list[str]]) -> None:
        self.commands = list(commands)
        # Closed in kill(), which every user reaches through a finally.
        self.error_files = [tempfile.TemporaryFile() for _ in self.commands]  # noqa: SIM115
        self.processes = [
            subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=error_file,
            )
            for command, error_file in zip(self.commands, self.error_files, strict=True)
        ]

    def name(self, position: int) -> str:
        return " ".join(self.commands[position][2:5])

    def error_tail(self, position: int) -> str:
        error_file = self.error_files[position]
        error_file.seek(0)
        lines = error_file.read().decode(errors="replace").strip().splitlines()
        return " | ".join(lines[-5:])

    def wait_ready(self, timeout_seconds: float) -> None:
        """Wait for every process's ready line; BenchError naming one that fails first."""
        deadline = time.monotonic() + timeout_seconds
        for position, process in enumerate(self.processes):
            assert process.stdout is not None
            while True:
                remaining = deadline - time.monotonic()
                readable, _, _ = select.select([process.stdout], [], [], max(remaining, 0))
                if not readable:
                    raise BenchError(f"{self.name(position)}: not ready in {timeout_seconds}s")
                line = process.stdout.readline()
                if not line:
                    process.wait()
                    raise BenchError(
                        f"{self.name(position)}: exit {process.returncode}: "
                        f"{self.error_tail(position)}"
                    )
                if line.strip() == READY_LINE.strip():
                    break

    def start(self, start_at: float) -> None:
        line = msgspec.json.encode({"start_at": start_at}) + b"\n"
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(line)
            process.stdin.flush()  # communicate() closes it later

    def finish(self, timeout_seconds: float) -> list[bytes]:
        """Each process's remaining stdout once it exits; BenchError if one fails."""
        outputs: list[bytes] = []
        failures: list[str] = []
        deadline = time.monotonic() + timeout_seconds
        try:
            for position, process in enumerate(self.processes):
                try:
                    stdout, _ = process.communicate(timeout=max(deadline - time.monotonic(), 0.01))
                except subprocess.TimeoutExpired:
                    failures.append(f"{self.name(position)}: timed out")
                    continue
                if process.returncode != 0:
                    failures.append(
                        f"{self.name(position)}: exit {process.returncode}: "
                        f"{self.error_tail(position)}"
                    )
                outputs.append(stdout)
        finally:
            self.kill()
        if failures:
            raise BenchError("; ".join(failures))
        return outputs

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None and not stream.closed:
                    stream.close()
        for error_file in self.error_files:
            error_file.close()


def run_load_processes(
    commands: Sequence[list[str]],
    seconds: float,
    lead_seconds: float,
    on_start: Callable[[float, list[int]], None] | None = None,
) -> tuple[float, list[bytes]]:
    """Start the processes, wait until all are ready, start their window `lead_seconds`
    later; returns its start and each process's stdout. `on_start` gets the start and
    the processes' ids just before they are told."""
    load = LoadProcesses(commands)
    try:
        load.wait_ready(READY_TIMEOUT_SECONDS)
        start_at = time.monotonic() + lead_seconds
        if on_start is not None:
            on_start(start_at, [process.pid for process in load.processes])
        load.start(start_at)
        return start_at, load.finish(lead_seconds + seconds + FINISH_SLACK_SECONDS)
    finally:
        load.kill()


def last_json_line(output: bytes, kind: type[msgspec.Struct]) -> msgspec.Struct:
    lines = [line for line in output.decode().splitlines() if line.strip()]
    if not lines:
        raise BenchError("a load process printed nothing")
    return msgspec.json.decode(lines[-1], type=kind)
