"""Three real nodes in one process host the shard controller and two shard groups: joins,
moves and leaves migrate shards (in chunks) while every key keeps its value, the old owner
drops what moved away, and a key sent to the wrong group gets WRONG_GROUP."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from quorumlog.codec import wire
from quorumlog.node.server import Node
from quorumlog.shard.config import ShardConfiguration, shard_for_key
from quorumlog.shard.controller_commands import (
    ControllerCommand,
    ControllerResult,
    Join,
    Leave,
    Move,
    Query,
    decode_results,
    encode_commands,
)
from tests.unit.node.in_process_cluster import node_settings, start_nodes
from tests.unit.node.test_kv_requests import RawClient

SHARD_COUNT = 4
NODE_IDS = ["n1", "n2", "n3"]


class Cluster:
    def __init__(self, nodes: list[Node], clients: list[RawClient]) -> None:
        self.nodes = nodes
        self.clients = clients
        self.request_id = 0
        self.sequence = 0

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{node.port}" for node in self.nodes]

    async def ask_leader(self, make: type, **fields: object) -> wire.Frame:
        """Send to every node in turn until one answers other than NOT_LEADER."""
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            for client in self.clients:
                self.request_id += 1
                answer = await client.ask(make(request_id=self.request_id, **fields))
                if not (
                    isinstance(answer, wire.ErrorResponse)
                    and answer.code in (wire.ErrorCode.NOT_LEADER, wire.ErrorCode.UNAVAILABLE)
                ):
                    return answer
            assert asyncio.get_running_loop().time() < deadline, "no leader answered"
            await asyncio.sleep(0.01)

    async def controller(self, command: ControllerCommand) -> ControllerResult:
        answer = await self.ask_leader(
            wire.ControllerRequest, client_id="admin", commands=encode_commands([command])
        )
        assert isinstance(answer, wire.ControllerResponse), answer
        [result] = decode_results(answer.results)
        assert result.ok, result
        return result

    def next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    async def latest(self) -> ShardConfiguration:
        result = await self.controller(Query(0, -1))
        assert result.configuration is not None
        return result.configuration

    async def put(self, key: str, value: str) -> None:
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            configuration = await self.latest()
            gid = configuration.shards[shard_for_key(key, SHARD_COUNT)]
            command = wire.KVCommand(self.next_sequence(), "put", key, value)
            answer = await self.ask_leader(
                wire.KVWrite,
                client_id="writer",
                commands=[command],
                group=wire.shard_group_name(gid),
            )
            if isinstance(answer, wire.KVWriteResult):
                return
            assert isinstance(answer, wire.ErrorResponse), answer
            assert answer.code is wire.ErrorCode.WRONG_GROUP, answer
            assert asyncio.get_running_loop().time() < deadline, "shard never served"
            await asyncio.sleep(0.02)

    async def get(self, key: str) -> str | None:
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            configuration = await self.latest()
            gid = configuration.shards[shard_for_key(key, SHARD_COUNT)]
            answer = await self.ask_leader(
                wire.KVRead, keys=[key], group=wire.shard_group_name(gid)
            )
            if isinstance(answer, wire.KVReadResult):
                return answer.values[0]
            assert isinstance(answer, wire.ErrorResponse), answer
            assert answer.code is wire.ErrorCode.WRONG_GROUP, answer
            assert asyncio.get_running_loop().time() < deadline, "shard never served"
            await asyncio.sleep(0.02)

    async def settled(self, number: int) -> None:
        """Wait until every shard group replica is at `number` with every shard SERVING."""
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            done = all(
                service.machine.current_configuration.number == number
                and service.machine.all_serving()
                for node in self.nodes
                for service in node.shard_services.values()
            )
            if done:
                return
            assert asyncio.get_running_loop().time() < deadline, "migration did not finish"
            await asyncio.sleep(0.02)


async def eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + 30
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_joins_moves_and_leaves_migrate_shards_between_real_groups(tmp_path: Path) -> None:
    async def scenario() -> None:
        nodes = await start_nodes(
            node_settings(
                NODE_IDS,
                tmp_path,
                tick_ms=10,
                election_ticks=5,
                fsync=False,
                controller=NODE_IDS,
                shard_groups={1: NODE_IDS, 2: NODE_IDS},
                shard_count=SHARD_COUNT,
                shard_monitor_ms=20,
                shard_pull_bytes_max=200,
            )
        )
        addresses = {node.node_id: node.addresses[node.node_id] for node in nodes}
        clients = [await RawClient.connect(node.port) for node in nodes]
        cluster = Cluster(nodes, clients)
        try:
            servers = list(addresses.values())
            await cluster.controller(Join(cluster.next_sequence(), {1: servers}))
            await cluster.settled(1)
            values = {f"key-{number}": f"value-{number}-" + "x" * 40 for number in range(40)}
            for key, value in values.items():
                await cluster.put(key, value)

            await cluster.controller(Join(cluster.next_sequence(), {2: servers}))
            await cluster.settled(2)
            moved = await cluster.latest()
            assert sorted(set(moved.shards)) == [1, 2]
            for key, value in values.items():
                assert await cluster.get(key) == value

            # Group 1 drops what moved away (garbage collection, once group 2 confirms it
            # holds it: a step after both serve), on every replica.
            def moved_data_dropped() -> bool:
                return all(
                    node.shard_services[1].machine.shard_data(shard) == {}
                    for node in nodes
                    for shard in range(SHARD_COUNT)
                    if moved.shards[shard] == 2
                )

            await eventually(moved_data_dropped, "group 1 to drop the shards that moved away")

            # A scan naming a shard twice returns its keys once.
            shard_of_group_two = moved.shards.index(2)
            scan = await cluster.ask_leader(
                wire.KVScan,
                group=wire.shard_group_name(2),
                shards=[shard_of_group_two, shard_of_group_two],
            )
            assert isinstance(scan, wire.KVScanResult), scan
            expected_keys = sorted(
                k for k in values if shard_for_key(k, SHARD_COUNT) == shard_of_group_two
            )
            assert [key for key, _ in scan.items] == expected_keys

            # A key sent to the group that does not own its shard gets WRONG_GROUP.
            key = next(k for k in values if moved.shards[shard_for_key(k, SHARD_COUNT)] == 2)
            wrong = await cluster.ask_leader(
                wire.KVRead, keys=[key], group=wire.shard_group_name(1)
            )
            assert isinstance(wrong, wire.ErrorResponse)
            assert wrong.code is wire.ErrorCode.WRONG_GROUP

            shard = shard_for_key(key, SHARD_COUNT)
            await cluster.controller(Move(cluster.next_sequence(), shard, 1))
            await cluster.settled(3)
            await cluster.put(key, "after the move")
            await cluster.controller(Leave(cluster.next_sequence(), [1]))
            await cluster.settled(4)
            assert set((await cluster.latest()).shards) == {2}
            values[key] = "after the move"
            for key, value in values.items():
                assert await cluster.get(key) == value
            services = [node.shard_services[1] for node in nodes]
            await eventually(
                lambda: all(service.machine.stored_key_count() == 0 for service in services),
                "group 1 to drop every key after it left",
            )
        finally:
            for client in clients:
                await client.close()
            for node in nodes:
                await node.stop()

    asyncio.run(scenario())


def test_shard_group_leaders_spread_to_their_preferred_members(tmp_path: Path) -> None:
    """Groups 1..3 on n1..n3 end up led by n1, n2, n3; with n3 stopped, group 3 keeps a
    leader elsewhere and nobody tries to hand it to the dead node."""

    async def scenario() -> None:
        nodes = await start_nodes(
            node_settings(
                NODE_IDS,
                tmp_path,
                tick_ms=10,
                election_ticks=5,
                fsync=False,
                shard_groups={1: NODE_IDS, 2: NODE_IDS, 3: NODE_IDS},
                shard_count=SHARD_COUNT,
                preferred_leader_ms=30,
            )
        )
        loop = asyncio.get_running_loop()

        def leader_of(gid: int) -> str | None:
            return next(
                (
                    node.node_id
                    for node in nodes
                    if not node.groups[wire.shard_group_name(gid)].stopped
                    and node.groups[wire.shard_group_name(gid)].core.is_leader
                ),
                None,
            )

        try:
            deadline = loop.time() + 20
            while [leader_of(gid) for gid in (1, 2, 3)] != NODE_IDS:
                assert loop.time() < deadline, [leader_of(gid) for gid in (1, 2, 3)]
                await asyncio.sleep(0.01)
            await nodes[2].stop()
            stopped_at = [len(node.preferred_leaders.transfers) for node in nodes[:2]]
            deadline = loop.time() + 20
            while leader_of(3) not in ("n1", "n2"):
                assert loop.time() < deadline, "group 3 found no leader without n3"
                await asyncio.sleep(0.01)
            # Let ten check periods pass on both live nodes: nobody hands group 3 to n3.
            checks_then = [node.preferred_leaders.checks for node in nodes[:2]]
            deadline = loop.time() + 20
            while any(
                node.preferred_leaders.checks < then + 10
                for node, then in zip(nodes[:2], checks_then, strict=True)
            ):
                assert loop.time() < deadline, "the preferred-leader checks stopped running"
                await asyncio.sleep(0.01)
            for node, first in zip(nodes[:2], stopped_at, strict=True):
                assert ("shard-3", "n3") not in list(node.preferred_leaders.transfers)[first:]
        finally:
            for node in nodes:
                if not node.groups["kv"].stopped:
                    await node.stop()

    asyncio.run(scenario())


class NoTimer:
    def cancel(self) -> None:
        pass


class ManualClock:
    """A scheduler whose time moves only when a test says so (no real waiting)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def call_soon(self, callback: Callable[[], None]) -> None:
        callback()

    def call_later(self, delay_seconds: float, callback: Callable[[], None]) -> NoTimer:
        self.timers.append((self.now + delay_seconds, callback))
        return NoTimer()

    def monotonic_seconds(self) -> float:
        return self.now

    def wall_time_ms(self) -> int:
        return int(self.now * 1000)

    def run_due(self) -> None:
        """Move the clock to the earliest timer and run it."""
        self.timers.sort(key=lambda timer: timer[0])
        due, callback = self.timers.pop(0)
        self.now = max(self.now, due)
        callback()


def test_the_migration_pacer_holds_pulls_to_its_rate() -> None:
    from quorumlog.node.shard_migration import ByteRatePacer

    clock = ManualClock()
    pacer = ByteRatePacer(bytes_per_second=20_000)
    passed: list[float] = []
    pacer.pace(clock, 1_000, lambda: passed.append(clock.now))
    assert passed == [100.0]  # the first chunk goes at once
    for _ in range(4):
        pacer.pace(clock, 1_000, lambda: passed.append(clock.now))
    while clock.timers:
        clock.run_due()
    # Four more chunks wait for the four booked before them: 1,000 / 20,000 s each.
    assert [round(at - 100.0, 6) for at in passed] == [0.0, 0.05, 0.1, 0.15, 0.2]
    assert round(pacer.paced_seconds, 6) == 0.5
    unlimited = ByteRatePacer(0)
    unlimited.pace(clock, 10**9, lambda: passed.append(-1.0))
    assert passed[-1] == -1.0
    assert unlimited.paced_seconds == 0
