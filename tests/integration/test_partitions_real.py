"""The replicated KV on real node processes under real network partitions.

Each node runs in its own network namespace and the nemesis cuts links between them with
blackhole routes (see `netns.py`); the clients, in their own namespace, reach every node
throughout. Several clients run random puts, appends, gets and compare-and-sets on a few
keys, recorded in a `History`; a fault is held for a bounded while, then healed; the
cluster must serve again and the whole history must be linearizable.

Waits are conditions with deadlines. A fault is held until it has visibly bitten (the
majority elected a leader and served, or, with no majority anywhere, every client has had
an operation end without an answer), and for at least `FAULT_SECONDS_MIN`, so that
elections, step-downs and pre-votes happen while it lasts.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import random
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from quorumlog.errors import ClientError, UnavailableError
from quorumlog.kv.client import KVClient
from quorumlog.testing.history import History, Operation, OperationStatus
from quorumlog.testing.linearizability import KV_MODEL, check_linearizable

from .netns import (
    CLIENT_MEMBER,
    NAMESPACE_PREFIX,
    NamespacedProcessCluster,
    NamespaceError,
    Nemesis,
    NodeNetwork,
    namespaces,
    remove_orphaned_namespaces,
    require_namespaces,
    run_inside,
    run_ip,
)
from .process_cluster import ProcessCluster, wait_until
from .test_kv_processes import ClientThread, StatusWatcher

NODE_IDS = ("n1", "n2", "n3")
KEYS = ("x", "y", "z")
CLIENT_TIMEOUTS_SECONDS = (0.4, 0.4, 2.0, 2.0)
"""One per client. Short ones end as unknown when a fault catches them in flight (one
attempt, no time to retry), long ones retry through an election and are answered; the
history gets both."""
CLIENT_COUNT = len(CLIENT_TIMEOUTS_SECONDS)
PROBE_TIMEOUT_SECONDS = 2.0
FAULT_SECONDS_MIN = 1.5
"""Several election timeouts (10 to 20 ticks of 25 ms) and client timeouts' worth."""
WAIT_SECONDS = 15.0
OPERATIONS_BEFORE_FAULT = 20
OPERATIONS_SERVED_MIN = 10
"""Operations called in a phase (under a fault, after healing) that must complete."""
CONNECT_SECONDS = 0.5
CHECK_STEPS_MAX = 10_000_000
"""Search steps per key. Measured: at most about 10,000 on these histories, a few million
(a few seconds) on ones with twice the unknown outcomes; beyond, the test fails (gave up)."""


@pytest.fixture
def network() -> Iterator[NodeNetwork]:
    """Namespaces for NODE_IDS; the test's thread sits in the client namespace."""
    require_namespaces()
    with NodeNetwork(NODE_IDS) as built, built.client_side():
        yield built


def now() -> int:
    return time.monotonic_ns()


class WorkloadClient:
    """One client of the history: random put, append, get and cas on a few keys.

    Half of its gets go through its long-lived client, which asks the leader it cached;
    the other half through a new client that asks a node chosen at random first, as a new
    process would: a node that wrongly answers for the leader (a deposed leader, a cut-off
    follower) is then asked too. A cas expects the value this client last read of the key,
    so that some succeed."""

    def __init__(
        self,
        history: History,
        client_number: int,
        cluster: ProcessCluster,
        timeout_seconds: float,
    ) -> None:
        self.history = history
        self.client_number = client_number
        self.endpoints = cluster.endpoints
        self.cluster_id = cluster.cluster_id
        self.timeout_seconds = timeout_seconds
        self.random = random.Random(client_number)
        self.last_read: dict[str, str | None] = {}
        self.unanswered_end_ns = -1
        """When an operation last ended without an answer (-1: never)."""

    def __call__(self, client: KVClient, number: int) -> None:
        key = self.random.choice(KEYS)
        action = self.random.choice(("put", "append", "get", "get-anywhere", "cas"))
        kind = action.removesuffix("-anywhere")
        value = f"{self.client_number}.{number};"
        expected = self.last_read.get(key)
        argument = {"get": None, "put": value, "append": value, "cas": (expected, value)}[kind]
        operation_id = self.history.invoke(self.client_number, kind, key, argument, now())
        try:
            output = self.perform(client, action, key, value, expected)
        except UnavailableError:
            self.history.fail(operation_id, now())  # no node took it: it never happened
            self.unanswered_end_ns = now()
        except ClientError:
            self.history.unknown(operation_id)  # it may or may not have happened
            self.unanswered_end_ns = now()
        else:
            self.history.complete(operation_id, output, now())

    def perform(
        self, client: KVClient, action: str, key: str, value: str, expected: str | None
    ) -> str | bool | None:
        if action == "get":
            read = client.get(key)
            self.last_read[key] = read
            return read
        if action == "get-anywhere":
            first = self.random.randrange(len(self.endpoints))
            endpoints = self.endpoints[first:] + self.endpoints[:first]
            with KVClient(endpoints, self.timeout_seconds, self.cluster_id) as new_client:
                read = new_client.get(key)
            self.last_read[key] = read
            return read
        if action == "put":
            client.put(key, value)
            return None
        if action == "append":
            client.append(key, value)
            return None
        return client.cas(key, expected, value)


class Workload:
    """CLIENT_COUNT client threads, each with its own KVClient, recording one history."""

    def __init__(self, cluster: ProcessCluster, history: History) -> None:
        self.history = history
        self.clients = [
            WorkloadClient(history, number, cluster, timeout_seconds)
            for number, timeout_seconds in enumerate(CLIENT_TIMEOUTS_SECONDS)
        ]
        self.threads = [
            ClientThread(cluster.client(timeout=client.timeout_seconds), client)
            for client in self.clients
        ]

    def __enter__(self) -> Workload:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exception: object) -> None:
        for thread in self.threads:
            thread.stop()

    def answered_since(self, time_ns: int) -> int:
        """Operations called at or after `time_ns` that got an answer."""
        return sum(
            1
            for operation in self.history.operations()
            if operation.call_time >= time_ns and is_ok(operation)
        )

    def every_client_stalled_since(self, time_ns: int) -> bool:
        """Whether each client has had an operation end without an answer (failed, or
        unknown at its timeout) at or after `time_ns`."""
        return all(client.unanswered_end_ns >= time_ns for client in self.clients)


def is_ok(operation: Operation) -> bool:
    return operation.status is OperationStatus.OK


# --- the faults -----------------------------------------------------------------------


class Effect(enum.Enum):
    """What a fault visibly does while it lasts; it is held until that shows."""

    NEW_LEADER = "the majority elects a new leader and serves"
    FOLLOWER_LAGS = "the cut follower falls behind while the others serve"
    NO_MAJORITY = "no side can serve: every client's operations end unanswered"


@dataclass(frozen=True)
class Fault:
    name: str
    apply: Callable[[Nemesis, str, str, str], None]
    """Given the nemesis, the leader and the two followers, put the fault in place. The
    first follower is the one cut off when only one is."""
    effect: Effect


FAULTS = [
    Fault(
        "isolate-leader",
        lambda nemesis, leader, first, second: nemesis.isolate(leader),
        Effect.NEW_LEADER,
    ),
    Fault(
        "unplug-leader",  # clients cannot reach it either: their packets vanish
        lambda nemesis, leader, first, second: nemesis.unplug(leader),
        Effect.NEW_LEADER,
    ),
    Fault(
        "split-2-1",
        lambda nemesis, leader, first, second: nemesis.split([leader, second], [first]),
        Effect.FOLLOWER_LAGS,
    ),
    Fault(
        "split-1-1-1",
        lambda nemesis, leader, first, second: nemesis.split([leader], [first], [second]),
        Effect.NO_MAJORITY,
    ),
    Fault(
        "one-way-leader-to-follower",
        lambda nemesis, leader, first, second: nemesis.cut_one_way(leader, first),
        Effect.FOLLOWER_LAGS,
    ),
    Fault(
        "one-way-follower-to-leader",
        lambda nemesis, leader, first, second: nemesis.cut_one_way(first, leader),
        Effect.FOLLOWER_LAGS,
    ),
]

LAG_ENTRIES_MIN = 10
"""Entries a cut follower is behind the leader's commit; a connected one is a few at most."""


def lags(cluster: ProcessCluster, follower: str) -> bool:
    leader = cluster.leader()
    leader_status = None if leader is None else cluster.status(leader)
    follower_status = cluster.status(follower)
    if leader_status is None or follower_status is None:
        return False
    return follower_status.applied_index + LAG_ENTRIES_MIN <= leader_status.commit_index


def hold(
    fault: Fault,
    workload: Workload,
    cluster: ProcessCluster,
    leader: str,
    cut_follower: str,
) -> None:
    """Wait, with a deadline, until the fault has bitten and lasted FAULT_SECONDS_MIN."""
    started_ns = now()
    held_until = time.monotonic() + FAULT_SECONDS_MIN

    def serving() -> bool:
        return workload.answered_since(started_ns) >= OPERATIONS_SERVED_MIN

    def bitten() -> bool:
        if time.monotonic() < held_until:
            return False
        if fault.effect is Effect.NO_MAJORITY:
            return workload.every_client_stalled_since(started_ns)
        if fault.effect is Effect.NEW_LEADER:
            return cluster.leader() not in (None, leader) and serving()
        return lags(cluster, cut_follower) and serving()

    wait_until(bitten, WAIT_SECONDS, f"{fault.name} to bite: {fault.effect.value}")


def write_succeeds(client: KVClient, key: str, value: str) -> bool:
    try:
        client.put(key, value)
    except ClientError:
        return False
    return True


def nodes_caught_up(cluster: ProcessCluster) -> bool:
    """Every node answers and has applied what the leader had committed when asked."""
    leader = cluster.leader()
    leader_status = None if leader is None else cluster.status(leader)
    statuses = cluster.statuses()
    if leader_status is None or len(statuses) < len(cluster.nodes):
        return False
    return all(status.applied_index >= leader_status.commit_index for status in statuses.values())


@pytest.mark.parametrize("fault", FAULTS, ids=[fault.name for fault in FAULTS])
def test_kv_history_under_a_real_partition_is_linearizable_and_the_cluster_recovers(
    fault: Fault, network: NodeNetwork, tmp_path: Path
) -> None:
    history = History()
    nemesis = Nemesis(network)
    with NamespacedProcessCluster(tmp_path, network) as cluster, StatusWatcher(cluster) as watcher:
        leader = cluster.wait_for_leader()
        first, second = sorted(node_id for node_id in NODE_IDS if node_id != leader)
        with Workload(cluster, history) as workload:
            wait_until(
                lambda: workload.answered_since(0) >= OPERATIONS_BEFORE_FAULT,
                WAIT_SECONDS,
                f"{OPERATIONS_BEFORE_FAULT} operations before the fault",
            )
            fault.apply(nemesis, leader, first, second)
            cut_ns = now()
            hold(fault, workload, cluster, leader, first)
            healed_ns = now()
            nemesis.heal()
            probe = cluster.client(timeout=PROBE_TIMEOUT_SECONDS)
            wait_until(
                functools.partial(write_succeeds, probe, "probe", "after-heal"),
                WAIT_SECONDS,
                "a write after healing",
            )
            wait_until(
                lambda: workload.answered_since(healed_ns) >= OPERATIONS_SERVED_MIN,
                WAIT_SECONDS,
                f"{OPERATIONS_SERVED_MIN} operations called after healing to be answered",
            )
            wait_until(
                functools.partial(nodes_caught_up, cluster), WAIT_SECONDS, "every node to catch up"
            )
    operations = history.operations()
    if fault.effect is Effect.NO_MAJORITY:
        # Nothing called after the cut can be answered before the heal: a write needs a
        # quorum to commit, a linearizable read a quorum round.
        answered = [
            operation
            for operation in operations
            if is_ok(operation)
            and operation.call_time >= cut_ns
            and operation.return_time < healed_ns
        ]
        assert not answered, f"answered with no majority anywhere: {answered}"
    for term, leaders in watcher.leaders_by_term.items():
        assert len(leaders) == 1, f"term {term} had leaders {sorted(leaders)}"
    result = check_linearizable(operations, KV_MODEL, time_budget_steps=CHECK_STEPS_MAX)
    assert result.ok is True, result.explanation


# --- the checker sees an anomaly on real processes ----------------------------------------


def recorded(
    history: History, client_id: str, kind: str, key: str, call: Callable[[], object]
) -> int:
    """Run one operation and record it: answered, failed (no node took it) or unknown."""
    operation_id = history.invoke(client_id, kind, key, None, now())
    try:
        output = call()
    except UnavailableError:
        history.fail(operation_id, now())
    except ClientError:
        history.unknown(operation_id)
    else:
        history.complete(operation_id, output, now())
    return operation_id


def test_a_stale_read_from_an_isolated_old_leader_is_reported_by_the_checker(
    network: NodeNetwork, tmp_path: Path
) -> None:
    """The harness can see an anomaly: a `stale=True` read, answered by an old leader cut
    off from the others, returns a value the majority has already overwritten."""
    history = History()
    nemesis = Nemesis(network)
    with NamespacedProcessCluster(tmp_path, network) as cluster:
        old_leader = cluster.wait_for_leader()
        writer = cluster.client(timeout=WAIT_SECONDS)
        recorded(history, "writer", "put", "x", lambda: writer.put("x", "before"))
        nemesis.isolate(old_leader)
        cluster.wait_for_leader(excluding={old_leader})
        written = recorded(history, "writer", "put", "x", lambda: writer.put("x", "after"))
        old_leader_only = KVClient(
            [cluster.address(old_leader)],
            timeout=PROBE_TIMEOUT_SECONDS,
            cluster_id=cluster.cluster_id,
        )
        cluster.clients.append(old_leader_only)  # closed with the cluster
        stale = recorded(
            history, "stale-reader", "get", "x", lambda: old_leader_only.get("x", stale=True)
        )
        # A linearizable read there must not see the old value: it fails, or it is
        # answered by the new leader the old one points to.
        linearizable = recorded(
            history, "reader", "get", "x", lambda: old_leader_only.get("x", stale=False)
        )
    operations = {operation.operation_id: operation for operation in history.operations()}
    assert operations[written].status is OperationStatus.OK
    assert operations[stale].output == "before", "the isolated old leader saw the new write"
    assert operations[linearizable].output != "before"

    result = check_linearizable(list(operations.values()), KV_MODEL)
    assert result.ok is False, result.explanation
    [failing] = [partition for partition in result.partitions if partition.ok is False]
    assert failing.culprit is not None and failing.culprit.operation_id == stale
    without_stale = [
        operation for operation in operations.values() if operation.operation_id != stale
    ]
    assert check_linearizable(without_stale, KV_MODEL).ok is True


# --- the network itself ---------------------------------------------------------------


def thread_namespace() -> str:
    return os.readlink("/proc/thread-self/ns/net")


def test_a_network_is_removed_and_the_thread_comes_back_even_when_the_test_fails() -> None:
    require_namespaces()
    home = thread_namespace()
    network = NodeNetwork(NODE_IDS)
    with pytest.raises(RuntimeError, match="the test failed"), network, network.client_side():
        assert thread_namespace() != home
        assert set(network.created) <= set(namespaces())
        assert len(network.created) == len(NODE_IDS) + 2  # the hub and the clients too
        raise RuntimeError("the test failed")
    assert thread_namespace() == home
    assert not [name for name in namespaces() if name.startswith(f"{network.name}-")]


def test_namespaces_of_a_test_process_that_died_are_removed_and_live_ones_kept() -> None:
    require_namespaces()
    finished = subprocess.Popen(["true"])
    finished.wait()
    orphan = f"{NAMESPACE_PREFIX}{finished.pid}-1-n1"
    live = f"{NAMESPACE_PREFIX}{os.getpid()}-0-n1"  # run numbers start at 1: no clash
    try:
        run_ip(f"netns add {orphan}")
        run_ip(f"netns add {live}")
        removed = remove_orphaned_namespaces()
        assert orphan in removed
        assert orphan not in namespaces()
        assert live in namespaces()
    finally:
        for name in (orphan, live):
            with contextlib.suppress(NamespaceError):
                run_ip(f"netns delete {name}")


def connects(network: NodeNetwork, source: str, destination: str, port: int) -> bool:
    """Whether a TCP connection from `source`'s namespace to `destination` opens in time."""

    def attempt() -> bool:
        try:
            with socket.create_connection((network.host(destination), port), CONNECT_SECONDS):
                return True
        except OSError:
            return False

    return run_inside(network.namespace(source), attempt)


def listening_socket(network: NodeNetwork, node_id: str) -> socket.socket:
    """A socket listening on the node's address, made inside its namespace."""

    def listen() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((network.host(node_id), 0))
        sock.listen(16)
        return sock

    return run_inside(network.namespace(node_id), listen)


def test_the_nemesis_cuts_tcp_between_namespaces_one_way_or_whole_and_heals(
    network: NodeNetwork,
) -> None:
    nemesis = Nemesis(network)
    with listening_socket(network, "n2") as n2, listening_socket(network, "n1") as n1:
        n1_port, n2_port = n1.getsockname()[1], n2.getsockname()[1]
        assert connects(network, "n1", "n2", n2_port)
        assert connects(network, CLIENT_MEMBER, "n2", n2_port)

        nemesis.cut_one_way("n1", "n2")  # n1's packets to n2 go nowhere
        assert not connects(network, "n1", "n2", n2_port)
        assert not connects(network, "n2", "n1", n1_port)  # n1's answers go nowhere too
        assert connects(network, "n3", "n2", n2_port)
        assert connects(network, CLIENT_MEMBER, "n2", n2_port)
        nemesis.heal()
        assert connects(network, "n1", "n2", n2_port)
        assert connects(network, "n2", "n1", n1_port)

        nemesis.split(["n1"], ["n2", "n3"])
        assert not connects(network, "n3", "n1", n1_port)
        assert connects(network, "n3", "n2", n2_port)
        assert connects(network, CLIENT_MEMBER, "n1", n1_port)
        nemesis.heal()

        nemesis.unplug("n2")
        assert not connects(network, CLIENT_MEMBER, "n2", n2_port)
        nemesis.heal()
        assert connects(network, CLIENT_MEMBER, "n2", n2_port)
        assert nemesis.describe() == "whole"
