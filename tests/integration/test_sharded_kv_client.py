"""ShardedKVClient and ShardAdmin against three real nodes in this process (their event loop
runs in a background thread; the blocking clients run in the test's thread).

The nodes host the shard controller and two shard groups. The tests cover the KV methods
across shards, routing again after WRONG_GROUP while a shard moves, a write whose answer
was lost and that is retried across a migration (applied exactly once), and the admin
commands.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

from quorumlog import ShardAdmin, ShardedKVClient
from quorumlog.codec.wire import Frame, KVWrite, KVWriteResult
from quorumlog.errors import SessionExpiredError, UnavailableError, UnknownOutcomeError
from quorumlog.kv.client import BlockingConnection
from quorumlog.node.server import Node
from quorumlog.shard.client import BlockingTransport
from quorumlog.shard.config import shard_for_key
from tests.unit.node.in_process_cluster import node_settings, start_nodes

SHARD_COUNT = 8
NODE_IDS = ["n1", "n2", "n3"]
GIDS = [1, 2]
SETTLE_TIMEOUT_SECONDS = 30.0
POLL_INTERVAL_SECONDS = 0.02

Value = TypeVar("Value")


class InProcessCluster:
    """Three nodes on an event loop in a background thread."""

    def __init__(self, directory: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.settings = node_settings(
            NODE_IDS,
            directory,
            tick_ms=10,
            election_ticks=5,
            fsync=False,
            controller=NODE_IDS,
            shard_groups={gid: NODE_IDS for gid in GIDS},
            shard_count=SHARD_COUNT,
            shard_monitor_ms=20,
        )
        self.nodes: list[Node] = []
        self.addresses: dict[str, str] = {}

    @property
    def endpoints(self) -> list[str]:
        return list(self.addresses.values())

    def run(self, coroutine: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout=SETTLE_TIMEOUT_SECONDS)

    def start(self) -> None:
        self.thread.start()
        self.nodes = self.run(start_nodes(self.settings))
        self.addresses = {node.node_id: node.addresses[node.node_id] for node in self.nodes}

    def stop(self) -> None:
        for node in self.nodes:
            self.run(node.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=SETTLE_TIMEOUT_SECONDS)
        self.loop.close()

    def settled(self, number: int) -> bool:
        """Every replica of every group reached configuration `number`, all shards serving.

        Read across threads without a lock: a torn read only makes one poll say "not yet"."""
        return all(
            service.machine.current_configuration.number >= number and service.machine.all_serving()
            for node in self.nodes
            for service in node.shard_services.values()
        )


def wait_until(condition: Callable[[], Value | None], what: str) -> Value:
    deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {SETTLE_TIMEOUT_SECONDS}s waiting for {what}")
        time.sleep(POLL_INTERVAL_SECONDS)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[InProcessCluster]:
    started = InProcessCluster(tmp_path)
    started.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def admin(cluster: InProcessCluster) -> Iterator[ShardAdmin]:
    with ShardAdmin(cluster.endpoints, timeout=20.0) as shard_admin:
        yield shard_admin


def join_both_groups(cluster: InProcessCluster, admin: ShardAdmin) -> int:
    number = admin.join({gid: cluster.endpoints for gid in GIDS})
    wait_until(lambda: cluster.settled(number), f"configuration {number} to settle")
    return number


def key_in_group(admin: ShardAdmin, gid: int, prefix: str = "key") -> str:
    configuration = admin.query()
    return next(
        f"{prefix}-{number}"
        for number in range(10_000)
        if configuration.shards[shard_for_key(f"{prefix}-{number}", SHARD_COUNT)] == gid
    )


def other_gid(gid: int) -> int:
    return GIDS[1] if gid == GIDS[0] else GIDS[0]


def test_kv_methods_across_shards(cluster: InProcessCluster, admin: ShardAdmin) -> None:
    join_both_groups(cluster, admin)
    values = {f"key-{number}": f"value-{number}" for number in range(24)}
    with ShardedKVClient(cluster.endpoints, timeout=10.0) as client:
        for key, value in values.items():
            client.put(key, value)
        owners = {client.router.gid_of_key(key) for key in values}
        assert owners == set(GIDS), "the keys should land on both groups"
        for key, value in values.items():
            assert client.get(key) == value
            assert client.get(key, stale=True) in (value, None)
        client.append("key-0", "+more")
        assert client.get("key-0") == "value-0+more"
        assert client.cas("key-1", "value-1", "swapped") is True
        assert client.cas("key-1", "value-1", "again") is False
        assert client.get("key-1") == "swapped"
        assert client.cas("fresh", None, "created") is True
        client.delete("key-2")
        assert client.get("key-2") is None
        assert client.query().number == admin.query().number
        # A range across shards comes in key order, paged within each shard.
        expected = sorted(
            {**values, "key-0": "value-0+more", "key-1": "swapped"}.items() - {("key-2", "value-2")}
        )
        assert client.range_items("key-", prefix=True, page_keys=3) == expected
        assert client.range_items("key-1", "key-2") == [
            item for item in expected if "key-1" <= item[0] < "key-2"
        ]
        assert client.range_items("", limit=2) == sorted([*expected, ("fresh", "created")])[:2]


def test_wrong_group_after_a_move_routes_again(
    cluster: InProcessCluster, admin: ShardAdmin
) -> None:
    join_both_groups(cluster, admin)
    with ShardedKVClient(cluster.endpoints, timeout=10.0) as client:
        key = key_in_group(admin, GIDS[0])
        client.put(key, "before")
        cached = client.router.configuration
        assert cached is not None
        # Another admin moves the shard: this client's cached configuration is now stale.
        shard = shard_for_key(key, SHARD_COUNT)
        number = admin.move(shard, GIDS[1])
        wait_until(lambda: cluster.settled(number), "the move to settle")
        assert client.router.configuration is cached
        assert client.get(key) == "before"  # WRONG_GROUP from group 1, then group 2
        refreshed = client.router.configuration
        assert refreshed is not None and refreshed.number == number
        assert client.router.gid_of_key(key) == GIDS[1]
        client.put(key, "after")
        assert client.get(key) == "after"


def test_reads_and_writes_during_a_move_keep_every_value(
    cluster: InProcessCluster, admin: ShardAdmin
) -> None:
    """A write issued while its shard is pulled waits (WRONG_GROUP, back-off) and lands."""
    join_both_groups(cluster, admin)
    key = key_in_group(admin, GIDS[0])
    shard = shard_for_key(key, SHARD_COUNT)
    with ShardedKVClient(cluster.endpoints, timeout=10.0) as client:
        client.put(key, "0")
        admin.move(shard, GIDS[1])
        for number in range(1, 20):
            client.append(key, f",{number}")
        assert client.get(key) == "0," + ",".join(str(n) for n in range(1, 20))


class LosingTransport(BlockingTransport):
    """Loses the answers to the first append, after it reached a group (the write applied),
    and runs `on_lost` each time: the test moves the shard there."""

    def __init__(self, *arguments: Any, answers_to_lose: int, on_lost: Callable[[], None]) -> None:
        super().__init__(*arguments)
        self.answers_to_lose = answers_to_lose
        self.on_lost = on_lost
        self.lost_groups: list[str] = []
        self.sent_appends: list[KVWrite] = []

    def attempt(self, attempts: Any, endpoint: str, deadline: float, make_request: Any) -> Any:
        def recording(request_id: int) -> Any:
            request = make_request(request_id)
            if isinstance(request, KVWrite) and request.commands[0].op == "append":
                self.sent_appends.append(request)
            return request

        return super().attempt(attempts, endpoint, deadline, recording)

    def receive(self, connection: BlockingConnection, request_id: int, deadline: float) -> Frame:
        answer = super().receive(connection, request_id, deadline)
        request = self.sent_appends[-1] if self.sent_appends else None
        if (
            self.answers_to_lose > 0
            and isinstance(answer, KVWriteResult)
            and request is not None
            and request.request_id == request_id
        ):
            self.answers_to_lose -= 1
            self.lost_groups.append(request.group)
            self.on_lost()
            raise TimeoutError("the test lost this answer")
        return answer


def losing_client(
    cluster: InProcessCluster, timeout: float, answers_to_lose: int, on_lost: Callable[[], None]
) -> tuple[ShardedKVClient, LosingTransport]:
    client = ShardedKVClient(cluster.endpoints, timeout=timeout)
    transport = LosingTransport(
        client.transport.cluster_id,
        client.client_id,
        client.transport.attempt_timeout_seconds,
        answers_to_lose=answers_to_lose,
        on_lost=on_lost,
    )
    client.transport = transport
    client.controller.transport = transport
    return client, transport


def touch_every_group(client: ShardedKVClient, admin: ShardAdmin) -> None:
    """One write to every group, so each group's entry clock is current (see
    `test_sessions_moved_to_a_group_without_client_writes_survive` for why)."""
    for gid in GIDS:
        client.put(key_in_group(admin, gid, prefix="warm"), "up")


def test_a_lost_answer_retried_across_a_migration_applies_once(
    cluster: InProcessCluster, admin: ShardAdmin
) -> None:
    lost_answer_retried_across_a_migration(cluster, admin, touch_groups=True)


def test_sessions_moved_to_a_group_without_client_writes_survive(
    cluster: InProcessCluster, admin: ShardAdmin
) -> None:
    lost_answer_retried_across_a_migration(cluster, admin, touch_groups=False)


def lost_answer_retried_across_a_migration(
    cluster: InProcessCluster, admin: ShardAdmin, touch_groups: bool
) -> None:
    join_both_groups(cluster, admin)
    key = key_in_group(admin, GIDS[0])
    shard = shard_for_key(key, SHARD_COUNT)

    def move_away() -> None:
        number = admin.move(shard, GIDS[1])
        wait_until(lambda: cluster.settled(number), "the move to settle")

    client, transport = losing_client(cluster, 20.0, answers_to_lose=1, on_lost=move_away)
    with client:
        if touch_groups:
            touch_every_group(client, admin)
        client.put(key, "base")
        client.append(key, "+suffix")  # applied by group 1, answer lost, retried at group 2
        assert transport.lost_groups == ["shard-1"]
        retries = [request.group for request in transport.sent_appends]
        assert retries[-1] == "shard-2", retries
        sequences = {request.commands[0].sequence for request in transport.sent_appends}
        assert len(sequences) == 1, "every retry must carry the same sequence"
        assert client.get(key) == "base+suffix"


def test_an_unknown_outcome_repeated_after_a_migration_applies_once(
    cluster: InProcessCluster, admin: ShardAdmin
) -> None:
    """The caller repeats a write that ended in UnknownOutcomeError, after its shard moved:
    the repeat reuses the sequence, and the new owner knows it is a duplicate."""
    join_both_groups(cluster, admin)
    key = key_in_group(admin, GIDS[0])
    shard = shard_for_key(key, SHARD_COUNT)
    client, transport = losing_client(cluster, 2.0, answers_to_lose=1_000, on_lost=lambda: None)
    with client:
        touch_every_group(client, admin)
        client.put(key, "base")
        with pytest.raises(UnknownOutcomeError):
            client.append(key, "+suffix")
        number = admin.move(shard, GIDS[1])
        wait_until(lambda: cluster.settled(number), "the move to settle")
        transport.answers_to_lose = 0
        client.append(key, "+suffix")
        assert {request.commands[0].sequence for request in transport.sent_appends} == {
            transport.sent_appends[0].commands[0].sequence
        }
        assert transport.sent_appends[-1].group == "shard-2"
        assert client.get(key) == "base+suffix"


def test_admin_join_leave_move_query_status(cluster: InProcessCluster, admin: ShardAdmin) -> None:
    assert admin.query().number == 0
    assert admin.join({GIDS[0]: cluster.endpoints}) == 1
    number = admin.join({GIDS[1]: cluster.endpoints})
    assert number == 2
    wait_until(lambda: cluster.settled(number), "both groups to serve")
    configuration = admin.query()
    assert set(configuration.shards) == set(GIDS)
    assert admin.query(1).shards == [GIDS[0]] * SHARD_COUNT

    status = admin.status()
    assert status.configuration.number == number
    assert [group.gid for group in status.groups] == GIDS
    for group in status.groups:
        assert group.leader in cluster.endpoints
        assert group.errors == []
        assert group.configuration_number == number
    rows = status.rows()
    assert [row.shard for row in rows] == list(range(SHARD_COUNT))
    assert {row.state for row in rows} == {"serving"}
    assert [row.gid for row in rows] == configuration.shards

    shard = configuration.shards.index(GIDS[0])
    number = admin.move(shard, GIDS[1])
    wait_until(lambda: cluster.settled(number), "the move to settle")
    assert admin.query().shards[shard] == GIDS[1]

    number = admin.leave([GIDS[0]])
    wait_until(lambda: cluster.settled(number), "the leave to settle")
    after = admin.status()
    assert set(after.configuration.shards) == {GIDS[1]}
    assert [group.gid for group in after.groups] == [GIDS[1]]
    assert {row.gid for row in after.rows()} == {GIDS[1]}


def test_a_rejected_change_raises_and_no_group_means_unavailable(
    cluster: InProcessCluster, admin: ShardAdmin
) -> None:
    from quorumlog.errors import RequestRejectedError

    with pytest.raises(RequestRejectedError):
        admin.leave([7])
    with ShardedKVClient(cluster.endpoints, timeout=0.5) as client, pytest.raises(UnavailableError):
        client.get("nobody-serves-this")


def test_a_dropped_session_is_refused_before_and_after_its_shard_moves(
    cluster: InProcessCluster, admin: ShardAdmin
) -> None:
    """Alice's session on a shard is evicted (Bob takes the only place); the shard moves to
    the other group, which refuses her with SessionExpiredError: her write is not applied,
    and her next write goes under a new session."""
    join_both_groups(cluster, admin)
    key = key_in_group(admin, GIDS[0], prefix="expiry")
    shard = shard_for_key(key, SHARD_COUNT)
    bob_key = next(
        f"bob-{number}"
        for number in range(10_000)
        if shard_for_key(f"bob-{number}", SHARD_COUNT) == shard
    )

    async def one_session_place() -> None:
        # On the event loop, before Bob's write exists: every replica evicts alike.
        for node in cluster.nodes:
            node.shard_services[GIDS[0]].machine.shards[shard].sessions.session_count_max = 1

    with (
        ShardedKVClient(cluster.endpoints, timeout=10.0) as alice,
        ShardedKVClient(cluster.endpoints, timeout=10.0) as bob,
    ):
        alice.append(key, "x")
        first_id = alice.client_id
        cluster.run(one_session_place())
        bob.put(bob_key, "y")
        number = admin.move(shard, GIDS[1])
        wait_until(lambda: cluster.settled(number), "the move to settle")
        with pytest.raises(SessionExpiredError):
            alice.append(key, "z")
        assert alice.router.gid_of_key(key) == GIDS[1]
        assert alice.get(key) == "x"
        assert alice.client_id != first_id
        alice.append(key, "w")
        assert alice.get(key) == "xw"
        bob.append(bob_key, "+")  # Bob's session moved as a live one
        assert bob.get(bob_key) == "y+"
