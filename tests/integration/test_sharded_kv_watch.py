"""ShardedKVClient's ranges with revisions and watches per shard, against three real nodes
in this process (one cluster for the module): a watch keeps every event in order across a
leader change of its shard's group and across a move of its shard to another group, even
one that was behind when the shard moved (the history moves with the shard)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from quorumlog import ShardAdmin, ShardedKVClient
from quorumlog.cli.main import cli
from quorumlog.codec import wire
from quorumlog.codec.kv_v3 import WatchEvent
from quorumlog.errors import RequestRejectedError
from quorumlog.shard.config import shard_for_key
from quorumlog.shard.v3_client import ShardWatch
from tests.integration.test_sharded_kv_client import (
    GIDS,
    NODE_IDS,
    SHARD_COUNT,
    InProcessCluster,
    join_both_groups,
    key_in_group,
    wait_until,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCluster]:
    started = InProcessCluster(Path(tmp_path_factory.mktemp("sharded-watch")))
    started.start()
    try:
        with ShardAdmin(started.endpoints, timeout=20.0) as admin:
            join_both_groups(started, admin)
        yield started
    finally:
        started.stop()


@pytest.fixture
def admin(cluster: InProcessCluster) -> Iterator[ShardAdmin]:
    with ShardAdmin(cluster.endpoints, timeout=20.0) as shard_admin:
        yield shard_admin


@pytest.fixture
def client(cluster: InProcessCluster) -> Iterator[ShardedKVClient]:
    with ShardedKVClient(cluster.endpoints, timeout=20.0) as sharded:
        yield sharded


class Collector:
    """Iterates a watch on a thread of its own, keeping every event or the error."""

    def __init__(self, watch: ShardWatch) -> None:
        self.watch = watch
        self.events: list[WatchEvent] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        try:
            for event in self.watch:
                self.events.append(event)
        except Exception as error:  # handed to the test thread, which raises it
            self.error = error

    def wait_for(self, count: int) -> list[WatchEvent]:
        wait_until(lambda: len(self.events) >= count or self.error is not None, f"{count} events")
        if self.error is not None:
            raise self.error
        return list(self.events)

    def close(self) -> None:
        self.watch.close()
        self.thread.join(timeout=30)


def values_of(events: list[WatchEvent]) -> list[tuple[str, str]]:
    return [(event.type, event.kv.value.decode()) for event in events]


def leader_of(cluster: InProcessCluster, gid: int) -> str | None:
    name = wire.shard_group_name(gid)
    return next((node.node_id for node in cluster.nodes if node.groups[name].core.is_leader), None)


def transfer_leadership(cluster: InProcessCluster, gid: int) -> str:
    """Hand group `gid` to another node; the new leader's id once it leads."""
    old = wait_until(lambda: leader_of(cluster, gid), f"a leader of group {gid}")
    target = next(node_id for node_id in NODE_IDS if node_id != old)
    host = next(node for node in cluster.nodes if node.node_id == old).groups[
        wire.shard_group_name(gid)
    ]
    cluster.loop.call_soon_threadsafe(host.transfer_leadership, target)
    return wait_until(
        lambda: (leader := leader_of(cluster, gid)) not in (None, old) and leader,
        f"group {gid} to change leader",
    )


def test_ranges_carry_revisions_within_and_across_shards(client: ShardedKVClient) -> None:
    values = {f"range/{number:02}": f"v{number}" for number in range(20)}
    for key, value in values.items():
        client.put(key, value)
    every = client.range("range/", prefix=True)
    assert [kv.key for kv in every.kvs] == sorted(values)  # merged by key across shards
    assert every.count == 20 and not every.more and every.revision == 0
    assert set(every.shard_revisions) == set(range(SHARD_COUNT))
    for kv in every.kvs:
        shard = shard_for_key(kv.key, SHARD_COUNT)
        assert 0 < kv.create_revision == kv.mod_revision <= every.shard_revisions[shard]
        assert kv.version == 1 and kv.value == values[kv.key].encode()
    limited = client.range("range/", prefix=True, limit=5, keys_only=True)
    assert [kv.key for kv in limited.kvs] == sorted(values)[:5]
    assert limited.more and limited.count == 20 and all(kv.value == b"" for kv in limited.kvs)

    key = "range/03"
    shard = client.shard_of(key)
    before = client.range(key)
    client.put(key, "changed")
    after = client.range(key)
    [old], [new] = before.kvs, after.kvs
    assert after.revision > before.revision and after.shard_revisions == {shard: after.revision}
    assert (new.create_revision, new.version) == (old.create_revision, 2)
    assert new.mod_revision > old.mod_revision
    # The past of one shard, at a revision of that shard.
    past = client.range("range/", prefix=True, shard=shard, revision=before.revision)
    assert {kv.key: kv.value for kv in past.kvs}[key] == b"v3"
    assert all(shard_for_key(kv.key, SHARD_COUNT) == shard for kv in past.kvs)
    with pytest.raises(ValueError, match="per shard"):
        client.range("range/", prefix=True, revision=before.revision)


def test_a_watch_keeps_every_event_in_order_across_a_leader_change(
    cluster: InProcessCluster, admin: ShardAdmin, client: ShardedKVClient
) -> None:
    gid = GIDS[0]
    key = key_in_group(admin, gid, prefix="leader-change")
    client.put(key, "v0")
    start = client.range(key).revision + 1
    collector = Collector(client.watch(key, start_revision=start))
    try:
        for number in range(1, 6):
            client.put(key, f"v{number}")
        collector.wait_for(2)  # the watch is polling the first leader
        transfer_leadership(cluster, gid)
        for number in range(6, 11):
            client.put(key, f"v{number}")
        events = collector.wait_for(10)
    finally:
        collector.close()
    assert values_of(events) == [("PUT", f"v{number}") for number in range(1, 11)]
    assert [event.kv.mod_revision for event in events] == list(range(start, start + 10))


def test_a_watch_follows_its_shard_to_another_group(
    cluster: InProcessCluster, admin: ShardAdmin, client: ShardedKVClient
) -> None:
    source, target = GIDS
    key = key_in_group(admin, source, prefix="moving")
    shard = shard_for_key(key, SHARD_COUNT)
    client.put(key, "a")
    [created] = client.range(key).kvs
    caught_up = Collector(client.watch(key, start_revision=created.mod_revision + 1))
    behind = client.watch(key, start_revision=created.mod_revision)
    try:
        client.put(key, "b")
        assert values_of(caught_up.wait_for(1)) == [("PUT", "b")]
        number = admin.move(shard, target)
        wait_until(lambda: cluster.settled(number), "the move to settle")
        client.put(key, "c")
        client.delete(key)
        events = caught_up.wait_for(3)
        # A watch that starts only now, from before the move, reads the history that
        # moved with the shard.
        from_before = [next(behind) for _ in range(4)]
    finally:
        caught_up.close()
        behind.close()
    assert values_of(events) == [("PUT", "b"), ("PUT", "c"), ("DELETE", "")]
    revisions = [event.kv.mod_revision for event in events]
    assert revisions == list(range(created.mod_revision + 1, created.mod_revision + 4))
    assert events[1].kv.create_revision == created.create_revision
    assert events[1].kv.version == 3
    assert values_of(from_before) == [("PUT", "a"), *values_of(events)]
    assert from_before[2].prev_kv is not None and from_before[2].prev_kv.value == b"b"


def test_a_prefix_watch_names_its_shard(admin: ShardAdmin, client: ShardedKVClient) -> None:
    with pytest.raises(ValueError, match="revisions are per shard"):
        client.watch("prefix/", prefix=True)
    key = key_in_group(admin, GIDS[1], prefix="prefix/")
    shard = client.shard_of(key)
    other = next(
        f"prefix/{number}"
        for number in range(10_000)
        if shard_for_key(f"prefix/{number}", SHARD_COUNT) != shard
    )
    start = client.range("prefix/", prefix=True, shard=shard).revision + 1
    collector = Collector(client.watch("prefix/", prefix=True, shard=shard, start_revision=start))
    try:
        client.put(other, "elsewhere")  # another shard: not this watch's
        client.put(key, "here")
        client.put("prefiy", "outside the prefix")
        events = collector.wait_for(1)
    finally:
        collector.close()
    assert [(event.kv.key, event.kv.value) for event in events] == [(key, b"here")]


def test_the_shard_watch_command_prints_events(
    cluster: InProcessCluster, client: ShardedKVClient
) -> None:
    key = "command/watched"
    client.put(key, "one")
    [created] = client.range(key).kvs
    client.put(key, "two")
    endpoints = ",".join(cluster.endpoints)
    arguments = ["shard", "watch", key, "--rev", str(created.mod_revision), "--max-events", "2"]
    result = CliRunner().invoke(cli, [*arguments, "--endpoints", endpoints])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["PUT", key, "one", "PUT", key, "two"]
    refused = CliRunner().invoke(cli, ["shard", "watch", "command/", "--prefix"])
    assert refused.exit_code == 2 and "per shard" in refused.output


def test_a_range_or_watch_names_one_shard_on_the_wire(client: ShardedKVClient) -> None:
    with pytest.raises(RequestRejectedError, match="exactly one shard"):
        client.routed(
            "range of two shards",
            "",
            lambda request_id, group: wire.KVRangeRequest(
                request_id=request_id, key="a", end="\x00", group=group, shards=[0, 1]
            ),
            wire.KVRangeResult,
            side_effects=False,
            shard=0,
        )
