"""Real network partitions between node processes: one network namespace per node.

    network = NodeNetwork(["n1", "n2", "n3"])
    with network, network.client_side():
        with NamespacedProcessCluster(tmp_path, network) as cluster:
            nemesis = Nemesis(network)
            nemesis.isolate(cluster.wait_for_leader())
            ...
            nemesis.heal()

The layout, built with iproute2 alone (nftables is not assumed, and `tc netem` is missing
from some kernels):

    hub namespace      a bridge, and one veth port for each node and for the clients
    node namespaces    eth0 at 10.213.7.11, .12, ... on the bridge; the node listens there
    client namespace   eth0 at 10.213.7.100; the test's own sockets (clients, status
                       queries) are made here, by a thread that `client_side` moved in

Every address lives only inside namespaces the run created, so runs in parallel use the
same addresses without meeting, and nothing is ever sent to an address outside them. The
root namespace is never changed. Names carry the test process's pid and a run number; a
network is removed when its `with` ends, whatever happened inside, and namespaces left by a
test process that no longer exists (it was SIGKILLed) are removed by the next run.

Faults are routes in a node's namespace: `blackhole <peer>/32` drops everything that node
sends to that peer (its new connections there fail at once; the peer hears nothing).
Cutting one direction is all IP can do alone; over TCP it stalls both directions of that
pair's connection (acknowledgements cannot go back), so a one-way cut differs from a full
one in who notices first and how, which is the point of having both. `unplug` takes a
node's link down: it then reaches no one, clients included, and their packets to it
vanish without an error.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import itertools
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import pytest

from .process_cluster import TICK_MS_DEFAULT, NodeProcess, ProcessCluster

NAMESPACE_PREFIX = "qlnet-"
"""Every namespace this module makes starts with this, then `<pid>-<run>-<member>`."""
NAMESPACE_DIRECTORY = Path("/run/netns")
SUBNET_PREFIX = "10.213.7."
SUBNET_PREFIX_LENGTH = 24
NODE_ADDRESS_FIRST_HOST = 11
CLIENT_ADDRESS_HOST = 100
NODE_COUNT_MAX = CLIENT_ADDRESS_HOST - NODE_ADDRESS_FIRST_HOST
HUB_MEMBER = "hub"
CLIENT_MEMBER = "client"
BRIDGE = "br0"
NODE_INTERFACE = "eth0"
IP_COMMAND_TIMEOUT_SECONDS = 10.0
CLONE_NEWNET = 0x40000000

Result = TypeVar("Result")

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_run_numbers = itertools.count(1)


class NamespaceError(RuntimeError):
    """An `ip` command failed, or a namespace could not be entered."""


def run_ip(arguments: str) -> str:
    """`ip <arguments>` (split at spaces; no name here has one): its output, or
    NamespaceError with what it printed."""
    completed = subprocess.run(
        ["ip", *arguments.split()],
        capture_output=True,
        text=True,
        timeout=IP_COMMAND_TIMEOUT_SECONDS,
        check=False,
    )
    if completed.returncode != 0:
        raise NamespaceError(f"ip {arguments}: {completed.stderr.strip()}")
    return completed.stdout


def _setns(descriptor: int) -> None:
    if _libc.setns(descriptor, CLONE_NEWNET) != 0:
        error_number = ctypes.get_errno()
        raise NamespaceError(f"setns failed: {os.strerror(error_number)}")


@contextlib.contextmanager
def inside(namespace: str) -> Iterator[None]:
    """The calling thread in `namespace` for the block, then back where it was.

    A network namespace belongs to a thread, not to the process: only sockets this thread
    opens meanwhile (and those of threads it starts meanwhile, which inherit it) are in
    `namespace`; a socket keeps its namespace for life, whichever thread uses it later."""
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(NAMESPACE_DIRECTORY / namespace, os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(original)
    finally:
        os.close(original)


def run_inside(namespace: str, function: Callable[[], Result]) -> Result:
    """`function()` on a short-lived thread inside `namespace` (this thread stays put)."""
    results: list[Result] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            with inside(namespace):
                results.append(function())
        except BaseException as error:  # handed to the caller below
            errors.append(error)

    thread = threading.Thread(target=target, name=f"inside-{namespace}")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


def bound_port(host: str) -> int:
    """A port the OS hands out on `host` now (bound, read, released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def namespaces() -> list[str]:
    """Names of every named network namespace on the machine."""
    return [line.split()[0] for line in run_ip("netns list").splitlines() if line.strip()]


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphaned_namespaces() -> list[str]:
    """Delete namespaces of ours whose test process is gone (killed before it cleaned up);
    those of live processes, other test runs in parallel included, are left alone."""
    removed: list[str] = []
    for name in namespaces():
        if not name.startswith(NAMESPACE_PREFIX):
            continue
        pid_text = name[len(NAMESPACE_PREFIX) :].split("-", 1)[0]
        if pid_text.isdigit() and not process_exists(int(pid_text)):
            with contextlib.suppress(NamespaceError):
                run_ip(f"netns delete {name}")
                removed.append(name)
    return removed


@functools.cache
def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None if they can. Probed once per process by
    building and removing a tiny network, and entering it from a thread."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, not {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    try:
        remove_orphaned_namespaces()
        with NodeNetwork(["probe"]) as probe:
            host = probe.host(CLIENT_MEMBER)
            run_inside(probe.namespace(CLIENT_MEMBER), functools.partial(bound_port, host))
    except (NamespaceError, OSError, subprocess.SubprocessError) as error:
        return f"network namespaces are not usable here: {error}"
    return None


def require_namespaces() -> None:
    """Skip the calling test, saying why, where namespaces are not available."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


class NodeNetwork:
    """The namespaces, bridge and addresses of one test's nodes and clients.

    Use as a context manager: entering builds it all, leaving deletes every namespace it
    made (with them go their veth pairs, the bridge and every fault route)."""

    def __init__(self, node_ids: Iterable[str]) -> None:
        self.node_ids = list(node_ids)
        if not 1 <= len(self.node_ids) <= NODE_COUNT_MAX:
            raise ValueError(f"1 to {NODE_COUNT_MAX} nodes, not {len(self.node_ids)}")
        self.name = f"{NAMESPACE_PREFIX}{os.getpid()}-{next(_run_numbers)}"
        self.hosts = {
            node_id: f"{SUBNET_PREFIX}{NODE_ADDRESS_FIRST_HOST + number}"
            for number, node_id in enumerate(self.node_ids)
        }
        self.hosts[CLIENT_MEMBER] = f"{SUBNET_PREFIX}{CLIENT_ADDRESS_HOST}"
        self.created: list[str] = []
        """Namespaces made so far, so a build that fails halfway is undone too."""

    def namespace(self, member: str) -> str:
        """The namespace of a node id, of CLIENT_MEMBER or of HUB_MEMBER."""
        return f"{self.name}-{member}"

    def host(self, member: str) -> str:
        """The IPv4 address of a node id or of CLIENT_MEMBER."""
        return self.hosts[member]

    @property
    def client_namespace(self) -> str:
        return self.namespace(CLIENT_MEMBER)

    # --- life cycle ---------------------------------------------------------------------

    def __enter__(self) -> NodeNetwork:
        try:
            self.build()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(
        self,
        exception_type: type[BaseException] | None,
        exception: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.destroy()

    def add_namespace(self, member: str) -> str:
        namespace = self.namespace(member)
        run_ip(f"netns add {namespace}")
        self.created.append(namespace)
        run_ip(f"-n {namespace} link set lo up")
        return namespace

    def build(self) -> None:
        remove_orphaned_namespaces()
        hub = self.add_namespace(HUB_MEMBER)
        run_ip(f"-n {hub} link add name {BRIDGE} type bridge")
        run_ip(f"-n {hub} link set {BRIDGE} up")
        for member in [*self.node_ids, CLIENT_MEMBER]:
            namespace = self.add_namespace(member)
            port = f"p-{member}"[:15]  # interface names are at most 15 bytes
            run_ip(
                f"-n {hub} link add name {port} type veth"
                f" peer name {NODE_INTERFACE} netns {namespace}"
            )
            run_ip(f"-n {hub} link set {port} master {BRIDGE}")
            run_ip(f"-n {hub} link set {port} up")
            address = f"{self.host(member)}/{SUBNET_PREFIX_LENGTH}"
            run_ip(f"-n {namespace} address add {address} dev {NODE_INTERFACE}")
            run_ip(f"-n {namespace} link set {NODE_INTERFACE} up")

    def destroy(self) -> None:
        """Delete every namespace made; raise at the end if one could not be deleted."""
        failures: list[str] = []
        for namespace in reversed(self.created):
            try:
                run_ip(f"netns delete {namespace}")
            except NamespaceError as error:
                if (NAMESPACE_DIRECTORY / namespace).exists():
                    failures.append(str(error))
        self.created = []
        if failures:
            raise NamespaceError("; ".join(failures))

    # --- using it -----------------------------------------------------------------------

    def client_side(self) -> contextlib.AbstractContextManager[None]:
        """The calling thread in the client namespace for the block (see `inside`)."""
        return inside(self.client_namespace)

    def free_port(self, node_id: str) -> int:
        """A port the OS hands out on the node's address, asked inside its namespace."""
        return run_inside(
            self.namespace(node_id), functools.partial(bound_port, self.host(node_id))
        )

    def exec_prefix(self, node_id: str) -> list[str]:
        """Put before a command to run it in the node's namespace (`ip netns exec` execs,
        it does not fork: the process started is the command itself)."""
        return ["ip", "netns", "exec", self.namespace(node_id)]


class Nemesis:
    """Partitions between the nodes of a `NodeNetwork`, and healing.

    Every fault adds to those in place; `heal` removes them all. Clients reach every node
    whatever the partition, except a node that is unplugged."""

    def __init__(self, network: NodeNetwork) -> None:
        self.network = network
        self.cuts: set[tuple[str, str]] = set()
        """(source, destination): the source's packets to the destination are dropped."""
        self.unplugged: set[str] = set()

    def route(self, destination: str) -> str:
        """The route that drops a node's packets to `destination`."""
        return f"blackhole {self.network.host(destination)}/32"

    def cut_one_way(self, source: str, destination: str) -> None:
        """Drop every packet `source` sends to `destination` (not the other way)."""
        if source == destination or (source, destination) in self.cuts:
            return
        run_ip(f"-n {self.network.namespace(source)} route add {self.route(destination)}")
        self.cuts.add((source, destination))

    def cut(self, first: str, second: str) -> None:
        """No packet between the two nodes, either way."""
        self.cut_one_way(first, second)
        self.cut_one_way(second, first)

    def split(self, *sides: Iterable[str]) -> None:
        """Cut every pair of nodes on different sides: split(["n1", "n2"], ["n3"]) is 2|1,
        split(["n1"], ["n2"], ["n3"]) is 1|1|1."""
        groups = [list(side) for side in sides]
        for number, group in enumerate(groups):
            for other in groups[number + 1 :]:
                for first in group:
                    for second in other:
                        self.cut(first, second)

    def isolate(self, node_id: str) -> None:
        """Cut one node from every other node; clients still reach it."""
        others = [other for other in self.network.node_ids if other != node_id]
        self.split([node_id], others)

    def unplug(self, node_id: str) -> None:
        """Take the node's link down: it reaches no one and no one reaches it."""
        namespace = self.network.namespace(node_id)
        run_ip(f"-n {namespace} link set {NODE_INTERFACE} down")
        self.unplugged.add(node_id)

    def heal(self) -> None:
        """Remove every fault; the network is whole again."""
        for source, destination in sorted(self.cuts):
            run_ip(f"-n {self.network.namespace(source)} route delete {self.route(destination)}")
        self.cuts.clear()
        for node_id in sorted(self.unplugged):
            namespace = self.network.namespace(node_id)
            run_ip(f"-n {namespace} link set {NODE_INTERFACE} up")
            # Taking a link down drops its address's subnet route; up brings it back.
        self.unplugged.clear()

    def describe(self) -> str:
        parts = [f"{source}->{destination}" for source, destination in sorted(self.cuts)]
        parts += [f"{node_id} unplugged" for node_id in sorted(self.unplugged)]
        return ", ".join(parts) or "whole"


class NamespacedProcessCluster(ProcessCluster):
    """A `ProcessCluster` whose nodes each run in their namespace of `network`, listening on
    its address. Status queries and clients are made by the test's thread, which must be
    in the client namespace (`network.client_side()`)."""

    def __init__(
        self,
        base_directory: Path,
        network: NodeNetwork,
        tick_ms: int = TICK_MS_DEFAULT,
        cluster_id: str = "netns",
        extra_arguments: Iterable[str] = (),
    ) -> None:
        super().__init__(
            base_directory, len(network.node_ids), tick_ms, cluster_id, extra_arguments
        )
        self.network = network

    def new_nodes(self) -> dict[str, NodeProcess]:
        return {
            node_id: NodeProcess(
                node_id,
                self.network.free_port(node_id),
                self.base_directory,
                host=self.network.host(node_id),
            )
            for node_id in self.network.node_ids
        }

    def command(self, node: NodeProcess) -> list[str]:
        return [*self.network.exec_prefix(node.node_id), *super().command(node)]
