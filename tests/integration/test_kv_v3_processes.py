"""The etcd v3-style KV on real node processes: ranges, txns, leases and watches across
leader kills, and the README's lock and election recipes.

One cluster serves the whole module (starting one is the slow part); tests that kill the
leader restart it before they end. Each test uses its own key prefix.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from quorumlog.cli.main import cli
from quorumlog.codec.kv_v3 import WatchEvent
from quorumlog.errors import ClientError, LeaseNotFoundError
from quorumlog.kv.async_client import AsyncKVClient
from quorumlog.kv.recipes import Election, Lock

from .process_cluster import ProcessCluster, wait_until

WAIT_SECONDS = 30.0
"""Generous: the machine running the suite is shared and busy."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with ProcessCluster(Path(tmp_path_factory.mktemp("kv-v3")), node_count=3) as running:
        running.wait_for_leader(timeout_seconds=WAIT_SECONDS)
        yield running


def kill_leader_and_restart_later(cluster: ProcessCluster) -> str:
    """Kill the leader; the caller restarts it (`cluster.restart`) once done."""
    leader = cluster.wait_for_leader(timeout_seconds=WAIT_SECONDS)
    cluster.kill(leader)
    cluster.wait_for_leader(excluding=[leader], timeout_seconds=WAIT_SECONDS)
    return leader


def test_range_txn_and_compaction(cluster: ProcessCluster) -> None:
    client = cluster.client(timeout=WAIT_SECONDS)
    client.put("range/a", b"\x00binary")
    client.put("range/b", "text")
    assert client.put("range/b", "again", prev_kv=True) is not None
    result = client.range("range/", prefix=True)
    assert [(kv.key, kv.value) for kv in result.kvs] == [
        ("range/a", b"\x00binary"),
        ("range/b", b"again"),
    ]
    b = result.kvs[1]
    assert b.version == 2 and b.mod_revision > b.create_revision
    assert client.get("range/b") == "again"  # the text API reads the same key
    before = client.range("range/b", revision=b.create_revision).kvs
    assert [kv.value for kv in before] == [b"text"]
    swapped = client.txn(
        [("mod", "range/b", "==", b.mod_revision), ("version", "range/none", "==", 0)],
        [("put", "range/c", "c"), ("delete", "range/a"), ("get", "range/", "range0")],
        [("get", "range/b")],
    )
    assert swapped.succeeded
    assert client.range("range/", prefix=True, keys_only=True).count == 2
    assert not client.txn([("value", "range/b", "==", "stale")], [], [("get", "range/b")]).succeeded
    assert client.delete_range("range/", prefix=True) == 2
    client.compact(swapped.revision)
    with pytest.raises(ClientError, match="compacted"):
        client.range("range/b", revision=b.create_revision)


def test_watch_sees_every_change_in_order_across_a_leader_kill(cluster: ProcessCluster) -> None:
    client = cluster.client(timeout=WAIT_SECONDS)
    start = client.range("watch/", prefix=True).revision + 1
    written: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        writer_client = cluster.client(timeout=WAIT_SECONDS)
        number = 0
        while not stop.is_set() and number < 400:
            key = f"watch/{number % 7}"
            try:
                writer_client.put(key, f"v{number}".encode())
            except ClientError:
                continue  # unknown outcome: may or may not be in the history
            written.append(f"v{number}")
            number += 1

    thread = threading.Thread(target=writer, daemon=True)
    events: list[WatchEvent] = []
    with client.watch("watch/", prefix=True, start_revision=start) as watch:
        thread.start()
        wait_until(lambda: len(events) >= 20 or events.extend(watch.poll()), WAIT_SECONDS, "events")
        victim = kill_leader_and_restart_later(cluster)
        wait_until(lambda: len(events) >= 60 or events.extend(watch.poll()), WAIT_SECONDS, "events")
        stop.set()
        thread.join(timeout=WAIT_SECONDS)
        last = max(kv.mod_revision for kv in client.range("watch/", prefix=True).kvs)
        wait_until(
            lambda: (events and events[-1].kv.mod_revision >= last) or events.extend(watch.poll()),
            WAIT_SECONDS,
            "the last events",
        )
    cluster.restart(victim)
    revisions = [event.kv.mod_revision for event in events]
    assert revisions == sorted(set(revisions)), "out of order or repeated"
    seen = {event.kv.value.decode() for event in events}
    missing = [value for value in written if value not in seen]
    assert not missing, f"acknowledged puts the watch never saw: {missing[:5]}"
    # A second watch from the same start replays exactly what the first saw.
    with cluster.client(timeout=WAIT_SECONDS).watch(
        "watch/", prefix=True, start_revision=start
    ) as replay:
        again: list[WatchEvent] = []
        while len(again) < len(events):
            again.extend(replay.poll(wait_seconds=0.5))
    assert again[: len(events)] == events


def test_a_lease_expires_through_a_leader_change(cluster: ProcessCluster) -> None:
    client = cluster.client(timeout=WAIT_SECONDS)
    lease = client.lease_grant(3)
    granted = time.monotonic()
    client.put("lease/held", "x", lease=lease)
    assert client.lease_time_to_live(lease, keys=True).keys == ["lease/held"]
    victim = kill_leader_and_restart_later(cluster)
    try:
        wait_until(lambda: client.range("lease/held").count == 0, WAIT_SECONDS, "expiry")
        # The new leader gave the lease one more TTL from its election: never early.
        assert time.monotonic() - granted >= 3
        with pytest.raises(LeaseNotFoundError):
            client.lease_keepalive(lease)
        assert client.lease_time_to_live(lease).ttl_seconds == -1
    finally:
        cluster.restart(victim)


def test_keepalive_keeps_a_lease_and_revoke_deletes_its_keys(cluster: ProcessCluster) -> None:
    client = cluster.client(timeout=WAIT_SECONDS)
    lease = client.lease_grant(2)
    client.put("keep/a", "x", lease=lease)
    client.put("keep/b", "y", lease=lease)
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        client.lease_keepalive(lease)
        assert client.range("keep/", prefix=True).count == 2
        time.sleep(0.4)  # the keepalive period under test, not a wait for a condition
    client.lease_revoke(lease)
    assert client.range("keep/", prefix=True).count == 0


def test_lock_recipe_excludes_and_frees_on_release(cluster: ProcessCluster) -> None:
    first = cluster.client(timeout=WAIT_SECONDS)
    second = cluster.client(timeout=WAIT_SECONDS)
    with Lock(first, "locks/job", ttl_seconds=5):
        contender = Lock(second, "locks/job", ttl_seconds=5)
        assert not contender.acquire(timeout_seconds=0.5)
    with Lock(second, "locks/job", ttl_seconds=5) as held:
        assert held.held
    # A holder that dies (its lease not kept alive) frees the lock within its TTL.
    abandoned = Lock(first, "locks/job", ttl_seconds=2)
    assert abandoned.acquire(timeout_seconds=5)
    abandoned.keeper_stop.set()
    assert Lock(second, "locks/job", ttl_seconds=5).acquire(timeout_seconds=WAIT_SECONDS)


def test_election_recipe_has_one_leader_and_fails_over(cluster: ProcessCluster) -> None:
    alice = Election(cluster.client(timeout=WAIT_SECONDS), "elect/service", "alice", ttl_seconds=2)
    bob = Election(cluster.client(timeout=WAIT_SECONDS), "elect/service", "bob", ttl_seconds=2)
    assert alice.campaign(timeout_seconds=5)
    assert not bob.campaign(timeout_seconds=0.5)
    assert bob.leader() == "alice"
    alice.resign()
    assert bob.campaign(timeout_seconds=5)
    assert alice.leader() == "bob"
    bob.keeper_stop.set()  # bob dies: his lease runs out and alice takes over
    assert alice.campaign(timeout_seconds=WAIT_SECONDS)
    alice.resign()


def run_cli(cluster: ProcessCluster, *arguments: str, stdin: str | None = None) -> str:
    result = CliRunner().invoke(
        cli,
        list(arguments),
        input=stdin,
        env={
            "QUORUMLOG_ENDPOINTS": ",".join(cluster.endpoints),
            "QUORUMLOG_CLUSTER_ID": cluster.cluster_id,
        },
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result.output


def test_the_commands(cluster: ProcessCluster) -> None:
    for key, value in [("cli/a", "1"), ("cli/b", "2"), ("cli/c", "3"), ("clj", "4")]:
        run_cli(cluster, "kv", "put", key, value)
    assert run_cli(cluster, "kv", "get", "cli/", "--prefix") == "cli/a\n1\ncli/b\n2\ncli/c\n3\n"
    assert run_cli(cluster, "kv", "get", "cli/b", "--from-key", "--keys-only", "--limit", "3") == (
        "cli/b\ncli/c\nclj\n"
    )
    answer = json.loads(
        run_cli(cluster, "kv", "get", "cli/", "--prefix", "--limit", "2", "-w", "json")
    )
    assert [kv["key"] for kv in answer["kvs"]] == ["cli/a", "cli/b"]
    assert answer["count"] == 3 and answer["more"] is True
    revision = answer["header"]["revision"]
    transaction = (
        'value("cli/a") = "1"\nmod("cli/b") > "0"\n\nput cli/a 10\nget cli/b\n\nget cli/a\n'
    )
    assert run_cli(cluster, "kv", "txn", stdin=transaction) == "SUCCESS\n\nOK\n\ncli/b\n2\n"
    assert run_cli(cluster, "kv", "txn", stdin=transaction).startswith("FAILURE\n\ncli/a\n10\n")
    watched = run_cli(cluster, "kv", "watch", "cli/a", "--rev", str(revision), "--max-events", "1")
    assert watched == "PUT\ncli/a\n10\n"
    assert run_cli(cluster, "kv", "del", "cli/", "--prefix") == "3\n"
    granted = run_cli(cluster, "lease", "grant", "30")
    lease_id = granted.split()[1]
    assert granted == f"lease {lease_id} granted with TTL(30s)\n"
    assert "remaining(" in run_cli(cluster, "lease", "timetolive", lease_id, "--keys")
    assert run_cli(cluster, "lease", "keep-alive", lease_id, "--once") == (
        f"lease {lease_id} keepalived with TTL(30)\n"
    )
    assert run_cli(cluster, "lease", "revoke", lease_id) == f"lease {lease_id} revoked\n"
    assert (
        run_cli(cluster, "lease", "timetolive", lease_id) == f"lease {lease_id} already expired\n"
    )
    assert run_cli(cluster, "kv", "compact", str(revision)) == f"compacted revision {revision}\n"


def test_the_async_client_has_the_same_calls(cluster: ProcessCluster) -> None:
    async def scenario() -> None:
        async with AsyncKVClient(
            cluster.endpoints, timeout=WAIT_SECONDS, cluster_id=cluster.cluster_id
        ) as client:
            lease = await client.lease_grant(30)
            start = (await client.range("async/", prefix=True)).revision + 1
            await client.put("async/a", b"\x01", lease=lease)
            assert await client.put("async/a", "two", prev_kv=True) is not None
            result = await client.txn(
                [("version", "async/a", "==", 2)], [("put", "async/b", "b")], []
            )
            assert result.succeeded
            kvs = (await client.range("async/", prefix=True)).kvs
            assert [(kv.key, kv.value) for kv in kvs] == [("async/a", b"two"), ("async/b", b"b")]
            seen = []
            async with client.watch("async/", prefix=True, start_revision=start) as watch:
                async for event in watch:
                    seen.append((event.type, event.kv.key))
                    if len(seen) == 3:
                        break
            assert seen == [("PUT", "async/a"), ("PUT", "async/a"), ("PUT", "async/b")]
            assert (await client.lease_time_to_live(lease)).granted_ttl_seconds == 30
            await client.lease_revoke(lease)  # async/a was put again without it: it stays
            assert await client.delete_range("async/", prefix=True) == 2

    asyncio.run(scenario())
