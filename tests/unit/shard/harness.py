"""Drives a ControllerMachine the way its Raft group would: one encoded entry per call."""

from __future__ import annotations

from quorumlog.shard.config import UNASSIGNED_GID, ShardConfiguration
from quorumlog.shard.controller import ControllerMachine
from quorumlog.shard.controller_commands import (
    ControllerBatch,
    ControllerCommand,
    ControllerEntry,
    ControllerResult,
    Join,
    Leave,
    Move,
    Query,
    encode_entry,
)


def servers_of(gid: int) -> list[str]:
    return [f"group{gid}-node{replica}:7000" for replica in range(3)]


class Admin:
    """One client of one machine: numbers its commands and applies one entry per call."""

    def __init__(self, machine: ControllerMachine | None = None, client_id: str = "admin") -> None:
        self.machine = machine if machine is not None else ControllerMachine()
        self.client_id = client_id
        self.next_sequence = 1
        self.index = 0
        self.timestamp_ms = 1_000

    def run_commands(
        self, *commands: ControllerCommand, first_unacknowledged: int = 0
    ) -> list[ControllerResult]:
        self.index += 1
        self.timestamp_ms += 10
        batch = ControllerBatch(self.client_id, first_unacknowledged, list(commands))
        data = encode_entry(ControllerEntry(self.timestamp_ms, [batch]))
        [results] = self.machine.apply(self.index, data)
        return results

    def take_sequence(self) -> int:
        sequence = self.next_sequence
        self.next_sequence += 1
        return sequence

    def run(self, command: ControllerCommand) -> ControllerResult:
        [result] = self.run_commands(command)
        return result

    def join(self, *gids: int) -> ControllerResult:
        return self.run(Join(self.take_sequence(), {gid: servers_of(gid) for gid in gids}))

    def leave(self, *gids: int) -> ControllerResult:
        return self.run(Leave(self.take_sequence(), list(gids)))

    def move(self, shard: int, gid: int) -> ControllerResult:
        return self.run(Move(self.take_sequence(), shard, gid))

    def query(self, number: int = -1) -> ShardConfiguration:
        result = self.run(Query(self.take_sequence(), number))
        assert result.ok
        assert result.configuration is not None
        return result.configuration


def check(configuration: ShardConfiguration, gids: set[int]) -> None:
    """The reference's check: exactly these groups, every shard on one, counts within one."""
    assert set(configuration.groups) == gids
    for gid in gids:
        assert configuration.groups[gid] == servers_of(gid)
    if not gids:
        assert configuration.shards == [UNASSIGNED_GID] * configuration.shard_count
        return
    assert all(owner in gids for owner in configuration.shards)
    counts = [configuration.shards.count(gid) for gid in gids]
    assert max(counts) - min(counts) <= 1


def changed_shards(before: ShardConfiguration, after: ShardConfiguration) -> list[int]:
    return [
        shard
        for shard, (old, new) in enumerate(zip(before.shards, after.shards, strict=True))
        if old != new
    ]
