"""Real `quorumlog node` processes on loopback, for integration tests.

    with ProcessCluster(tmp_path, node_count=3) as cluster:
        leader = cluster.wait_for_leader()
        cluster.kill(leader)
        cluster.wait_for_leader(excluding={leader})

Each node runs `python -m quorumlog node` with its own data directory under the test's
temporary directory, fsync on, and its log (stderr) in `<node>.log` next to it. Ports are
asked of the OS (bind port 0, read it, close); another process may take one between our
close and the node's bind, so a start that fails on a taken port is retried with fresh
ports (and a restart, which must keep its port, retries until the port is free).

Nothing here sleeps in place of a condition: `wait_until` polls a condition with a short
interval until it holds or a deadline passes. Every process is stopped (SIGCONT if paused,
SIGTERM, then SIGKILL after a deadline) and reaped when the `with` block ends, whatever
happened inside it; each child also gets SIGKILL from the kernel if the test process dies
first (PR_SET_PDEATHSIG), so no node outlives its test.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from quorumlog.codec.frame import FrameDecoder, encode_frame
from quorumlog.codec.wire import Frame, StatusRequest, StatusResponse, decode, encode
from quorumlog.errors import TLSHandshakeError
from quorumlog.kv.client import KVClient
from quorumlog.kv.connection import hello_frame
from quorumlog.tls.config import TLSConfig
from quorumlog.tls.handshake import open_blocking

ConditionValue = TypeVar("ConditionValue")

LOOPBACK = "127.0.0.1"
TICK_MS_DEFAULT = 25
"""Short ticks make elections (10 to 20 ticks) take a fraction of a second, so a test that
kills a leader waits little; long enough that a loaded 2-core machine does not churn."""
START_TIMEOUT_SECONDS = 20.0
STOP_TIMEOUT_SECONDS = 5.0
POLL_INTERVAL_SECONDS = 0.02
STATUS_TIMEOUT_SECONDS = 0.5
START_ATTEMPTS_MAX = 4
PORT_IN_USE_MARKERS = ("address already in use", "errno 98")
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _die_with_parent() -> None:
    """Runs in the child before exec: the kernel kills it when the test process dies."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


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


def wait_until(
    condition: Callable[[], ConditionValue | None],
    timeout_seconds: float,
    what: str,
    interval_seconds: float = POLL_INTERVAL_SECONDS,
) -> ConditionValue:
    """Poll `condition` until it returns something truthy (returned); AssertionError naming
    `what` if the deadline passes first."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_seconds}s waiting for {what}")
        time.sleep(interval_seconds)


def request_frame(
    address: str,
    request: StatusRequest,
    cluster_id: str,
    timeout_seconds: float,
    tls: TLSConfig | None = None,
) -> Frame:
    """One handshake and one request on a fresh connection (TLS with `tls`); raises
    OSError/TimeoutError (TLSHandshakeError if TLS fails)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_seconds
    with open_blocking(host, int(port), tls, timeout_seconds, address) as sock:
        sock.sendall(hello_frame(cluster_id, "integration-test-status"))
        sock.sendall(encode_frame(encode(request)))
        decoder = FrameDecoder()
        frames: list[Frame] = []
        while len(frames) < 2:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{address} did not answer in {timeout_seconds}s")
            sock.settimeout(remaining)
            data = sock.recv(65536)
            if not data:
                raise ConnectionError(f"{address} closed the connection")
            frames.extend(decode(payload) for payload in decoder.feed(data))
        return frames[1]


def query_status(
    address: str,
    cluster_id: str,
    timeout_seconds: float = STATUS_TIMEOUT_SECONDS,
    tls: TLSConfig | None = None,
) -> StatusResponse | None:
    """The node's status, or None if it does not answer in time (down, paused, starting)."""
    try:
        frame = request_frame(
            address, StatusRequest(request_id=1), cluster_id, timeout_seconds, tls
        )
    except (OSError, TimeoutError, ValueError, TLSHandshakeError):
        return None
    return frame if isinstance(frame, StatusResponse) else None


class NodeProcess:
    """One node: its id, address, files, and the process running it (if any)."""

    def __init__(self, node_id: str, port: int, base_directory: Path, host: str = LOOPBACK) -> None:
        self.node_id = node_id
        self.port = port
        self.host = host
        self.data_dir = base_directory / node_id
        self.log_path = base_directory / f"{node_id}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.log_offset_at_launch = 0
        """Where this run's lines start in the log file (earlier runs append before)."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise AssertionError(f"{self.node_id} is not running")
        return self.process.pid


class ProcessCluster:
    """N node processes of one cluster. Use as a context manager: leaving it stops all."""

    def __init__(
        self,
        base_directory: Path,
        node_count: int = 3,
        tick_ms: int = TICK_MS_DEFAULT,
        cluster_id: str = "integration",
        extra_arguments: Iterable[str] = (),
        tls: TLSConfig | None = None,
    ) -> None:
        """`tls`: how the cluster's own checks and clients reach nodes started with TLS
        flags (in `extra_arguments`)."""
        self.tls = tls
        self.base_directory = base_directory
        self.node_count = node_count
        self.tick_ms = tick_ms
        self.cluster_id = cluster_id
        self.extra_arguments = list(extra_arguments)
        self.nodes: dict[str, NodeProcess] = {}
        self.clients: list[KVClient] = []

    # --- life cycle ---------------------------------------------------------------------

    def __enter__(self) -> ProcessCluster:
        try:
            self.start()
        except BaseException:
            self.stop_all()
            raise
        return self

    def __exit__(
        self,
        exception_type: type[BaseException] | None,
        exception: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop_all()

    def start(self, timeout_seconds: float = START_TIMEOUT_SECONDS) -> None:
        """Start every node on fresh ports and wait until each answers a status request."""
        self.base_directory.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, START_ATTEMPTS_MAX + 1):
            self.nodes = self.new_nodes()
            for node in self.nodes.values():
                self.launch(node)
            if self.wait_all_answer(timeout_seconds):
                return
            # A node lost its port to another process between our probe and its bind.
            self.stop_all()
            if attempt == START_ATTEMPTS_MAX:
                raise AssertionError(f"ports kept being taken; {START_ATTEMPTS_MAX} starts failed")

    def new_nodes(self) -> dict[str, NodeProcess]:
        """Nodes n1..nN on loopback ports the OS hands out now (a subclass may place them
        elsewhere)."""
        ports = free_ports(self.node_count)
        return {
            f"n{number}": NodeProcess(f"n{number}", port, self.base_directory)
            for number, port in enumerate(ports, start=1)
        }

    def wait_all_answer(self, timeout_seconds: float) -> bool:
        """True once every node answers; False if one exited because its port was taken."""
        waiting = set(self.nodes)
        deadline = time.monotonic() + timeout_seconds
        while waiting:
            for node_id in sorted(waiting):
                node = self.nodes[node_id]
                if not node.running:
                    if self.port_was_taken(node):
                        return False
                    raise AssertionError(f"{node_id} exited at start:\n{self.log_tail(node_id)}")
                if query_status(node.address, self.cluster_id, tls=self.tls) is not None:
                    waiting.discard(node_id)
            if waiting and time.monotonic() >= deadline:
                raise AssertionError(f"nodes {sorted(waiting)} did not answer in time")
            if waiting:
                time.sleep(POLL_INTERVAL_SECONDS)
        return True

    def port_was_taken(self, node: NodeProcess) -> bool:
        text = self.log_text(node.node_id)[node.log_offset_at_launch :].lower()
        return any(marker in text for marker in PORT_IN_USE_MARKERS)

    def command(self, node: NodeProcess) -> list[str]:
        peers = ",".join(
            f"{other.node_id}={other.address}"
            for other in self.nodes.values()
            if other.node_id != node.node_id
        )
        return [
            sys.executable,
            "-m",
            "quorumlog",
            "node",
            "--id",
            node.node_id,
            "--listen",
            node.address,
            "--peers",
            peers,
            "--data-dir",
            str(node.data_dir),
            "--cluster-id",
            self.cluster_id,
            "--tick-ms",
            str(self.tick_ms),
            *self.extra_arguments,
        ]

    def launch(self, node: NodeProcess) -> None:
        node.log_offset_at_launch = len(self.log_text(node.node_id))
        with open(node.log_path, "ab") as log_file:
            node.process = subprocess.Popen(
                self.command(node),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                preexec_fn=_die_with_parent,
            )
        node.paused = False

    def stop_all(self, timeout_seconds: float = STOP_TIMEOUT_SECONDS) -> None:
        """SIGTERM every node, SIGKILL those still up at the deadline; reap all of them."""
        for client in self.clients:
            client.close()
        self.clients = []
        for node in self.nodes.values():
            if node.running and node.process is not None:
                if node.paused:
                    node.process.send_signal(signal.SIGCONT)  # a stopped process ignores TERM
                    node.paused = False
                node.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_seconds
        for node in self.nodes.values():
            process = node.process
            if process is None:
                continue
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    # --- faults -------------------------------------------------------------------------

    def kill(self, node_id: str, signal_number: int = signal.SIGKILL) -> None:
        """Send `signal_number` (SIGKILL: a crash) and reap the process."""
        node = self.nodes[node_id]
        process = node.process
        if process is None:
            raise AssertionError(f"{node_id} is not running")
        process.send_signal(signal_number)
        process.wait(timeout=STOP_TIMEOUT_SECONDS)
        node.paused = False

    def pause(self, node_id: str) -> None:
        node = self.nodes[node_id]
        os.kill(node.pid, signal.SIGSTOP)
        node.paused = True

    def resume(self, node_id: str) -> None:
        node = self.nodes[node_id]
        os.kill(node.pid, signal.SIGCONT)
        node.paused = False

    def restart(self, *node_ids: str, timeout_seconds: float = START_TIMEOUT_SECONDS) -> None:
        """Start stopped nodes again, all at once: same ids, ports and data directories.
        Waits until each answers; one whose port is briefly held by another socket is
        started again until the deadline."""
        nodes = [self.nodes[node_id] for node_id in node_ids]
        for node in nodes:
            if node.running:
                raise AssertionError(f"{node.node_id} is still running; kill it first")
        deadline = time.monotonic() + timeout_seconds
        for node in nodes:
            self.launch(node)
        for node in nodes:
            while True:
                answered = wait_until(
                    functools.partial(self.answer_or_exit, node),
                    max(deadline - time.monotonic(), 0.1),
                    f"{node.node_id} to answer after a restart",
                )
                if answered == "answered":
                    break
                if not self.port_was_taken(node) or time.monotonic() >= deadline:
                    raise AssertionError(
                        f"{node.node_id} exited at restart:\n{self.log_tail(node.node_id)}"
                    )
                self.launch(node)

    def answer_or_exit(self, node: NodeProcess) -> str | None:
        if query_status(node.address, self.cluster_id, tls=self.tls) is not None:
            return "answered"
        if not node.running:
            if node.process is not None:
                node.process.wait()
            return "exited"
        return None

    # --- observing ----------------------------------------------------------------------

    @property
    def endpoints(self) -> list[str]:
        return [node.address for node in self.nodes.values()]

    def address(self, node_id: str) -> str:
        return self.nodes[node_id].address

    def status(self, node_id: str) -> StatusResponse | None:
        node = self.nodes[node_id]
        if not node.running or node.paused:
            return None
        return query_status(node.address, self.cluster_id, tls=self.tls)

    def statuses(self) -> dict[str, StatusResponse]:
        """The status of every node that answers now."""
        answers = {node_id: self.status(node_id) for node_id in self.nodes}
        return {node_id: status for node_id, status in answers.items() if status is not None}

    def leader(self) -> str | None:
        """The node that says it leads, in the highest term any answering node reports."""
        statuses = self.statuses()
        leaders = [status for status in statuses.values() if status.is_leader]
        if not leaders:
            return None
        newest = max(status.term for status in statuses.values())
        current = [status.node_id for status in leaders if status.term == newest]
        return current[0] if current else None

    def wait_for_leader(self, excluding: Iterable[str] = (), timeout_seconds: float = 10.0) -> str:
        excluded = set(excluding)

        def elected() -> str | None:
            leader = self.leader()
            return leader if leader is not None and leader not in excluded else None

        return wait_until(elected, timeout_seconds, f"a leader other than {sorted(excluded)}")

    def client(self, timeout: float = 5.0) -> KVClient:
        """A blocking client of every node, closed with the cluster."""
        client = KVClient(self.endpoints, timeout=timeout, cluster_id=self.cluster_id, tls=self.tls)
        self.clients.append(client)
        return client

    def log_text(self, node_id: str) -> str:
        path = self.nodes[node_id].log_path
        return path.read_text(errors="replace") if path.exists() else ""

    def log_tail(self, node_id: str, lines: int = 30) -> str:
        return "\n".join(self.log_text(node_id).splitlines()[-lines:])
