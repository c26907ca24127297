"""Shard configurations: which replica group owns each shard, and where each group listens.

A configuration is one numbered version of the shard map the controller hands out. Keys map
to shards by a stable hash (CRC32C of the UTF-8 key, modulo the shard count) so every
client, group and controller agrees on a key's shard without asking anyone.

Configurations are built canonical — groups sorted by gid — so equal configurations encode
to equal bytes whichever order the groups arrived in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from quorumlog.codec.checksum import crc32c

SHARD_COUNT_DEFAULT = 16

UNASSIGNED_GID = 0
"""The gid a shard has when no group owns it (the empty configuration, or no group left)."""


class ShardConfiguration(msgspec.Struct, frozen=True):
    """One version of the shard map. Treat as immutable: history entries are shared."""

    number: int
    """0 for the empty configuration; each join, leave or move adds one."""
    shards: list[int]
    """The gid owning each shard (index = shard), `UNASSIGNED_GID` when none does."""
    groups: dict[int, list[str]]
    """gid → the group's servers ("host:port" or node ids), in ascending gid order."""

    @property
    def shard_count(self) -> int:
        return len(self.shards)

    def gid_of_shard(self, shard: int) -> int:
        return self.shards[shard]

    def shards_of_group(self, gid: int) -> list[int]:
        """The shards `gid` owns, ascending."""
        return [shard for shard, owner in enumerate(self.shards) if owner == gid]

    def shards_by_group(self) -> dict[int, list[int]]:
        """gid → owned shards (ascending) for every group, including groups owning none."""
        owned: dict[int, list[int]] = {gid: [] for gid in self.groups}
        for shard, owner in enumerate(self.shards):
            if owner != UNASSIGNED_GID:
                owned[owner].append(shard)
        return owned


def empty_configuration(shard_count: int = SHARD_COUNT_DEFAULT) -> ShardConfiguration:
    """Configuration 0: no groups, every shard unassigned."""
    check_shard_count(shard_count)
    return ShardConfiguration(number=0, shards=[UNASSIGNED_GID] * shard_count, groups={})


def make_configuration(
    number: int, shards: Sequence[int], groups: Mapping[int, Sequence[str]]
) -> ShardConfiguration:
    """A canonical configuration: fresh lists, groups sorted by gid, then checked."""
    configuration = ShardConfiguration(
        number=number,
        shards=list(shards),
        groups={gid: list(groups[gid]) for gid in sorted(groups)},
    )
    check_configuration(configuration)
    return configuration


def check_shard_count(shard_count: int) -> None:
    if shard_count <= 0:
        raise ValueError(f"shard_count must be positive, got {shard_count}")


def check_configuration(configuration: ShardConfiguration) -> None:
    """Raise ValueError unless the configuration is well formed and canonical.

    Run on every configuration the controller builds and on every one a snapshot brings
    in: a shard owned by a group the configuration does not list would send clients to
    nowhere.
    """
    if configuration.number < 0:
        raise ValueError(f"configuration number must not be negative: {configuration.number}")
    check_shard_count(len(configuration.shards))
    gids = list(configuration.groups)
    if gids != sorted(gids):
        raise ValueError(f"configuration {configuration.number}: groups not in gid order {gids}")
    for gid, servers in configuration.groups.items():
        if gid <= UNASSIGNED_GID:
            raise ValueError(f"configuration {configuration.number}: invalid gid {gid}")
        if not servers:
            raise ValueError(f"configuration {configuration.number}: group {gid} has no servers")
    for shard, owner in enumerate(configuration.shards):
        if owner != UNASSIGNED_GID and owner not in configuration.groups:
            raise ValueError(
                f"configuration {configuration.number}: shard {shard} owned by gid {owner}, "
                f"which is not a group"
            )
    if configuration.groups and UNASSIGNED_GID in configuration.shards:
        # Balancing always places every shard once a group exists; an unassigned shard
        # next to live groups would be unavailable for no reason.
        raise ValueError(
            f"configuration {configuration.number}: shards unassigned while groups exist"
        )


def shard_for_key(key: str, shard_count: int = SHARD_COUNT_DEFAULT) -> int:
    """The shard holding `key`: CRC32C of its UTF-8 bytes modulo `shard_count`.

    CRC32C rather than Python's `hash`, which is salted per process and so differs
    between clients and servers.
    """
    return crc32c(key.encode("utf-8")) % shard_count


__all__ = [
    "SHARD_COUNT_DEFAULT",
    "UNASSIGNED_GID",
    "ShardConfiguration",
    "check_configuration",
    "check_shard_count",
    "empty_configuration",
    "make_configuration",
    "shard_for_key",
]
