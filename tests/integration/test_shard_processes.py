"""The sharded KV on real node processes: groups join and leave and a shard moves while
client threads keep reading and writing, one node is SIGKILLed and restarted in the middle,
and the recorded history must be linearizable.

Three `quorumlog node` processes (fsync on) each host the shard controller and three shard
groups; see `process_cluster.py`. Waits are conditions with deadlines, never bare sleeps.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

from quorumlog.codec.wire import ShardStatusResponse
from quorumlog.errors import ClientError, QuorumLogError, UnavailableError
from quorumlog.shard.admin import ShardAdmin
from quorumlog.shard.client import ShardedKVClient
from quorumlog.shard.config import shard_for_key
from quorumlog.testing.history import History, OperationStatus
from quorumlog.testing.linearizability import KV_MODEL, check_linearizable

from .process_cluster import ProcessCluster, wait_until

SHARD_COUNT = 8
GIDS = [1, 2, 3]
CLIENT_COUNT = 4
REGISTER_KEYS = ["r0", "r1", "r2", "r3"]
"""Keys the clients put, append to and read."""
APPEND_KEYS = ["a0", "a1", "a2", "a3"]
"""Keys the clients only append to and read, so every append must show exactly once."""
SETTLE_SECONDS = 30.0
PROGRESS_SECONDS = 20.0
PROGRESS_OPERATIONS = 15
"""Operations that must complete after each change: the load really runs across them."""
CLIENT_TIMEOUT_SECONDS = 10.0


def node_arguments() -> list[str]:
    members = "n1,n2,n3"
    arguments = ["--controller", members, "--shard-count", str(SHARD_COUNT)]
    for gid in GIDS:
        arguments += ["--shard-group", f"{gid}={members}"]
    return arguments


class HistoryWorker:
    """One client thread: random puts, appends and gets through its own ShardedKVClient,
    every operation recorded in the shared history, until stopped.

    Any exception other than a client error ends the loop and is raised again by `stop`,
    so a failing worker fails the test instead of vanishing with its thread."""

    def __init__(self, history: History, client: ShardedKVClient, client_number: int) -> None:
        self.history = history
        self.client = client
        self.client_number = client_number
        self.random = random.Random(client_number)
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self) -> HistoryWorker:
        self.thread.start()
        return self

    def run(self) -> None:
        try:
            number = 0
            while not self.stopping.is_set():
                self.step(number)
                number += 1
        except BaseException as error:  # handed to the test thread by stop()
            self.error = error

    def step(self, number: int) -> None:
        if self.random.random() < 0.5:
            key = self.random.choice(APPEND_KEYS)
            kind = self.random.choice(("append", "get"))
        else:
            key = self.random.choice(REGISTER_KEYS)
            kind = self.random.choice(("put", "append", "get"))
        argument = None if kind == "get" else f"c{self.client_number}.{number};"
        operation_id = self.history.invoke(
            self.client_number, kind, key, argument, time.monotonic_ns()
        )
        output: str | None = None
        try:
            if kind == "get":
                output = self.client.get(key)
            elif kind == "put":
                self.client.put(key, argument or "")
            else:
                self.client.append(key, argument or "")
        except UnavailableError:
            self.history.fail(operation_id, time.monotonic_ns())  # certainly not applied
        except ClientError:
            self.history.unknown(operation_id)
        else:
            self.history.complete(operation_id, output, time.monotonic_ns())

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=CLIENT_TIMEOUT_SECONDS * 3)
        if self.thread.is_alive():
            raise AssertionError("a client thread did not stop in time")
        if self.error is not None:
            raise self.error


def completed_count(history: History) -> int:
    return sum(1 for operation in history.operations() if operation.status is OperationStatus.OK)


def replica_statuses(
    admin: ShardAdmin, cluster: ProcessCluster, gid: int
) -> list[ShardStatusResponse | None]:
    statuses: list[ShardStatusResponse | None] = []
    for address in cluster.endpoints:
        try:
            statuses.append(admin.replica_status(gid, address))
        except QuorumLogError:
            statuses.append(None)
    return statuses


def settled(admin: ShardAdmin, cluster: ProcessCluster, number: int) -> bool:
    """Every replica of every group applied configuration `number` and serves every shard it
    holds: the migrations and garbage collections of `number` are over."""
    return all(
        status is not None
        and status.configuration_number >= number
        and all(state == "serving" for state in status.shard_states.values())
        for gid in GIDS
        for status in replica_statuses(admin, cluster, gid)
    )


def change_under_load(
    admin: ShardAdmin,
    cluster: ProcessCluster,
    history: History,
    what: str,
    change: Callable[[], int],
) -> int:
    """Make one change, wait until it settled and the clients completed more operations."""
    completed_before = completed_count(history)
    number = change()
    wait_until(lambda: settled(admin, cluster, number), SETTLE_SECONDS, f"{what} to settle")
    wait_until(
        lambda: completed_count(history) >= completed_before + PROGRESS_OPERATIONS,
        PROGRESS_SECONDS,
        f"client operations across {what}",
    )
    return number


def appended_tokens(value: str | None) -> list[str]:
    return [token for token in (value or "").split(";") if token]


def check_appends(history: History, reader: ShardedKVClient) -> None:
    """Each append-only key holds every acknowledged append exactly once, unknown ones at
    most once, and nothing that was never appended."""
    for key in APPEND_KEYS:
        appends = [
            operation
            for operation in history.operations()
            if operation.key == key and operation.kind == "append"
        ]
        acknowledged = {
            operation.argument.rstrip(";")
            for operation in appends
            if operation.status is OperationStatus.OK
        }
        attempted = {operation.argument.rstrip(";") for operation in appends}
        tokens = appended_tokens(reader.get(key))
        duplicated = sorted({token for token in tokens if tokens.count(token) > 1})
        assert not duplicated, f"{key}: appended more than once: {duplicated}"
        missing = sorted(acknowledged - set(tokens))
        assert not missing, f"{key}: acknowledged appends lost: {missing}"
        invented = sorted(set(tokens) - attempted)
        assert not invented, f"{key}: appends nobody made: {invented}"


def test_joins_leaves_and_a_move_under_load_with_a_node_killed_stay_linearizable(
    tmp_path: Path,
) -> None:
    history = History()
    with ProcessCluster(tmp_path, extra_arguments=node_arguments()) as cluster:
        servers = cluster.endpoints
        admin = ShardAdmin(servers, timeout=CLIENT_TIMEOUT_SECONDS, cluster_id=cluster.cluster_id)
        clients = [
            ShardedKVClient(servers, timeout=CLIENT_TIMEOUT_SECONDS, cluster_id=cluster.cluster_id)
            for _ in range(CLIENT_COUNT)
        ]
        workers: list[HistoryWorker] = []
        try:
            number = admin.join({1: servers})
            wait_until(lambda: settled(admin, cluster, number), SETTLE_SECONDS, "group 1")
            workers = [
                HistoryWorker(history, client, client_number).start()
                for client_number, client in enumerate(clients)
            ]
            wait_until(
                lambda: completed_count(history) >= PROGRESS_OPERATIONS,
                PROGRESS_SECONDS,
                "client operations on group 1",
            )
            change_under_load(admin, cluster, history, "join 2", lambda: admin.join({2: servers}))
            change_under_load(admin, cluster, history, "join 3", lambda: admin.join({3: servers}))
            # Move a shard that holds a key the clients use to a group that does not own it.
            configuration = admin.query()
            shard = shard_for_key("r0", SHARD_COUNT)
            target = next(gid for gid in GIDS if gid != configuration.shards[shard])
            change_under_load(admin, cluster, history, "move", lambda: admin.move(shard, target))
            # A crash in the middle of a change: group 1's shards leave while n2 is down
            # (two replicas of three keep every group going), then n2 comes back and must
            # catch up with the configurations and shard data it missed.
            cluster.kill("n2")
            completed_before = completed_count(history)
            number = admin.leave([1])
            wait_until(
                lambda: completed_count(history) >= completed_before + PROGRESS_OPERATIONS,
                PROGRESS_SECONDS,
                "client operations with n2 down",
            )
            cluster.restart("n2")
            wait_until(lambda: settled(admin, cluster, number), SETTLE_SECONDS, "leave 1")
            change_under_load(admin, cluster, history, "leave 2", lambda: admin.leave([2]))
        finally:
            try:
                for worker in workers:
                    worker.stop()
            finally:
                for client in clients:
                    client.close()

        final = admin.query()
        assert set(final.shards) == {3}
        # Groups 1 and 2 dropped every shard that moved away, on every replica.
        for gid in (1, 2):
            statuses = replica_statuses(admin, cluster, gid)
            stored = [status.stored_keys if status else None for status in statuses]
            assert stored == [0, 0, 0], f"group {gid} still stores keys: {stored}"
        written = {
            operation.key
            for operation in history.operations()
            if operation.kind != "get" and operation.status is OperationStatus.OK
        }
        stored_by_owner = [
            status.stored_keys if status else None for status in replica_statuses(admin, cluster, 3)
        ]
        assert stored_by_owner == [len(written)] * 3
        with ShardedKVClient(
            servers, timeout=CLIENT_TIMEOUT_SECONDS, cluster_id=cluster.cluster_id
        ) as reader:
            check_appends(history, reader)
        admin.close()

    operations = history.operations()
    result = check_linearizable(operations, KV_MODEL)
    assert result.ok is True, result.explanation
    completed = [operation for operation in operations if operation.status is OperationStatus.OK]
    assert len(completed) >= 100, f"only {len(completed)} of {len(operations)} completed"
