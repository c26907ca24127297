"""Shard configurations: key hashing, the empty configuration, the well-formedness checks."""

from __future__ import annotations

import msgspec
import pytest

from quorumlog.shard.config import (
    SHARD_COUNT_DEFAULT,
    UNASSIGNED_GID,
    ShardConfiguration,
    check_configuration,
    empty_configuration,
    make_configuration,
    shard_for_key,
)


def test_shard_for_key_is_crc32c_of_utf8_modulo_count() -> None:
    # 0xE3069283 is the published CRC32C check value of "123456789".
    assert shard_for_key("123456789", 2**32) == 0xE3069283
    assert shard_for_key("123456789", 16) == 0xE3069283 % 16
    assert shard_for_key("héllo", 1000) == shard_for_key("héllo", 1000)
    assert all(0 <= shard_for_key(f"key-{n}") < SHARD_COUNT_DEFAULT for n in range(200))


def test_shard_for_key_spreads_keys_over_all_shards() -> None:
    shards = {shard_for_key(f"user:{n}", 16) for n in range(1000)}
    assert shards == set(range(16))


def test_empty_configuration() -> None:
    configuration = empty_configuration(10)
    assert configuration.number == 0
    assert configuration.shards == [UNASSIGNED_GID] * 10
    assert configuration.groups == {}
    assert configuration.shard_count == 10
    with pytest.raises(ValueError, match="shard_count"):
        empty_configuration(0)


def test_make_configuration_sorts_groups_so_bytes_do_not_depend_on_order() -> None:
    first = make_configuration(1, [2, 1, 2], {2: ["b:1"], 1: ["a:1"]})
    second = make_configuration(1, [2, 1, 2], {1: ["a:1"], 2: ["b:1"]})
    assert list(first.groups) == [1, 2]
    assert msgspec.msgpack.encode(first) == msgspec.msgpack.encode(second)
    assert first.shards_of_group(2) == [0, 2]
    assert first.shards_by_group() == {1: [1], 2: [0, 2]}
    assert first.gid_of_shard(1) == 1


def test_make_configuration_copies_its_inputs() -> None:
    shards = [1, 1]
    servers = ["a:1"]
    configuration = make_configuration(1, shards, {1: servers})
    shards[0] = 7
    servers.append("b:1")
    assert configuration.shards == [1, 1]
    assert configuration.groups == {1: ["a:1"]}


@pytest.mark.parametrize(
    ("configuration", "message"),
    [
        (ShardConfiguration(-1, [0], {}), "negative"),
        (ShardConfiguration(1, [], {}), "shard_count"),
        (ShardConfiguration(1, [1, 2], {2: ["b"], 1: ["a"]}), "gid order"),
        (ShardConfiguration(1, [0], {0: ["a"]}), "invalid gid"),
        (ShardConfiguration(1, [1], {1: []}), "no servers"),
        (ShardConfiguration(1, [3], {1: ["a"]}), "not a group"),
        (ShardConfiguration(1, [1, 0], {1: ["a"]}), "unassigned while groups exist"),
    ],
)
def test_check_configuration_rejects(configuration: ShardConfiguration, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_configuration(configuration)
