"""A multi-chunk shard move on real node processes survives a SIGKILL of a group leader.

Three `quorumlog node` processes (fsync on) each host the shard controller and shard groups
1 and 2. One shard of group 1 is loaded with BULK_KEY_COUNT values of VALUE_BYTES (about
5 MiB), then moved to group 2 with 64 KiB pull chunks and a 2 MiB/s migration throttle, so
the move takes a few seconds and 80 chunks. While chunks are flowing, the leader of the
destination group (after a fifth of the chunks) or of the source group (after half) is
SIGKILLed, and restarted once its group has a new leader, with the move still under way.
The move must finish on every replica, the old owner must drop its copy, every value must
read back exactly, and two client threads that kept appending unique tokens to keys of the
moving shard and of shards that stay must find every acknowledged token exactly once, in
the order they were sent.

Progress is read from the destination leader's ShardStatusResponse: its stored keys beyond
those it held before the move are the moving shard's keys applied so far, KEYS_PER_CHUNK of
them per chunk. Waits are conditions with deadlines (`wait_until`), never bare sleeps.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from quorumlog import AsyncKVClient, ShardAdmin, ShardedKVClient
from quorumlog.codec.wire import ShardStatusResponse, shard_group_name
from quorumlog.errors import QuorumLogError, UnavailableError, UnknownOutcomeError
from quorumlog.node.preferred_leaders import preferred_leader
from quorumlog.shard.config import ShardConfiguration, shard_for_key

from .process_cluster import ProcessCluster, wait_until

SHARD_COUNT = 8
SOURCE_GID = 1
DESTINATION_GID = 2
GIDS = [SOURCE_GID, DESTINATION_GID]
NODE_IDS = ["n1", "n2", "n3"]
PREFERRED_LEADERS = {gid: preferred_leader(gid, NODE_IDS) for gid in GIDS}

PULL_KIB = 64
MIGRATION_MIB_PER_SECOND = 2
VALUE_BYTES = 16 * 1024
"""With a key of up to 12 characters and the 8 bytes a pair adds, 3 pairs stay under 64 KiB
and 4 reach it: a chunk carries KEYS_PER_CHUNK bulk keys."""
KEYS_PER_CHUNK = 4
BULK_KEY_COUNT = 320
BULK_CHUNK_COUNT = BULK_KEY_COUNT // KEYS_PER_CHUNK
DESTINATION_KILL_AFTER_CHUNKS = 16
"""The destination leader dies once this many chunks are applied on it (a fifth)."""
SOURCE_KILL_AFTER_CHUNKS = 40
"""The source leader dies once this many chunks are applied on the destination (half)."""
FILL_PUTS_IN_FLIGHT = 16

MOVING_TOKEN_KEY_COUNT = 2
CLIENT_TIMEOUT_SECONDS = 30.0
"""Long enough for an append to the moving shard to wait out the whole move."""
SETTLE_SECONDS = 30.0
LEADER_SECONDS = 10.0
PROGRESS_SECONDS = 20.0
APPENDS_BEFORE_MOVE = 3
APPENDS_AFTER_MOVE = 3


def node_arguments() -> list[str]:
    members = ",".join(NODE_IDS)
    arguments = ["--controller", members, "--shard-count", str(SHARD_COUNT)]
    for gid in GIDS:
        arguments += ["--shard-group", f"{gid}={members}"]
    throttle = ["--shard-migration-mib-per-second", str(MIGRATION_MIB_PER_SECOND)]
    return [*arguments, "--shard-pull-kib", str(PULL_KIB), *throttle]


def keys_in_shard(shard: int, prefix: str, count: int) -> list[str]:
    """The first `count` keys "<prefix>-<n>" (n = 0, 1, ...) that hash to `shard`."""
    keys: list[str] = []
    number = 0
    while len(keys) < count:
        key = f"{prefix}-{number}"
        if shard_for_key(key, SHARD_COUNT) == shard:
            keys.append(key)
        number += 1
    return keys


def bulk_value(key: str) -> str:
    """VALUE_BYTES characters that name their key, so a value read under another key shows."""
    unit = f"{key}|"
    return (unit * (VALUE_BYTES // len(unit) + 1))[:VALUE_BYTES]


async def fill(endpoints: list[str], cluster_id: str, gid: int, values: dict[str, str]) -> None:
    """Put `values` into group `gid` (which must own their shards), several in flight."""
    pending = sorted(values.items(), reverse=True)
    async with AsyncKVClient(
        endpoints,
        timeout=CLIENT_TIMEOUT_SECONDS,
        cluster_id=cluster_id,
        group=shard_group_name(gid),
    ) as client:

        async def worker() -> None:
            while pending:
                key, value = pending.pop()
                await client.put(key, value)

        await asyncio.gather(*(worker() for _ in range(FILL_PUTS_IN_FLIGHT)))


# --- observing the groups ---------------------------------------------------------------------


def replica_statuses(
    admin: ShardAdmin, cluster: ProcessCluster, gid: int
) -> dict[str, ShardStatusResponse | None]:
    """Each node's view of group `gid`; None where the node is down or does not answer."""
    statuses: dict[str, ShardStatusResponse | None] = {}
    for node_id, node in cluster.nodes.items():
        if not node.running:
            statuses[node_id] = None
            continue
        try:
            statuses[node_id] = admin.replica_status(gid, node.address)
        except QuorumLogError:
            statuses[node_id] = None
    return statuses


def group_leader(
    admin: ShardAdmin, cluster: ProcessCluster, gid: int, excluding: str | None = None
) -> tuple[str, ShardStatusResponse] | None:
    """The one answering replica of `gid` that says it leads (not `excluding`), with its
    status; None while there is none or more than one."""
    leaders = [
        (node_id, status)
        for node_id, status in replica_statuses(admin, cluster, gid).items()
        if status is not None and status.is_leader and node_id != excluding
    ]
    return leaders[0] if len(leaders) == 1 else None


def stored_keys(admin: ShardAdmin, cluster: ProcessCluster, gid: int) -> list[int | None]:
    """Each node's count of keys stored in group `gid` (None where it does not answer)."""
    return [
        status.stored_keys if status is not None else None
        for status in replica_statuses(admin, cluster, gid).values()
    ]


def leaders(admin: ShardAdmin, cluster: ProcessCluster) -> dict[int, str] | None:
    """Each group's leader node, once every group has one."""
    found = {gid: group_leader(admin, cluster, gid) for gid in GIDS}
    if any(leader is None for leader in found.values()):
        return None
    return {gid: leader[0] for gid, leader in found.items() if leader is not None}


def settled(admin: ShardAdmin, cluster: ProcessCluster, number: int) -> bool:
    """Every replica of both groups answers, applied configuration `number` and serves
    every shard it holds: the move and its garbage collection are over everywhere."""
    return all(
        status is not None
        and status.configuration_number >= number
        and all(state == "serving" for state in status.shard_states.values())
        for gid in GIDS
        for status in replica_statuses(admin, cluster, gid).values()
    )


# --- the client threads -----------------------------------------------------------------------


def appended_tokens(value: str | None) -> list[str]:
    return [token for token in (value or "").split(";") if token]


class AppendWorker:
    """One client thread appending unique tokens "<name><n>;" round-robin to its keys
    through its own ShardedKVClient, recording each token's outcome, until stopped.

    An exception other than an unknown outcome or a certain failure ends the loop and is
    raised again by `stop`, so a failing worker fails the test."""

    def __init__(self, name: str, keys: list[str], client: ShardedKVClient) -> None:
        self.name = name
        self.keys = keys
        self.client = client
        self.lock = threading.Lock()
        self.acknowledged: dict[str, list[str]] = {key: [] for key in keys}
        self.unknown: dict[str, list[str]] = {key: [] for key in keys}
        self.failed: dict[str, list[str]] = {key: [] for key in keys}
        self.acknowledged_count = 0
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, name=f"append-{name}", daemon=True)

    def start(self) -> AppendWorker:
        self.thread.start()
        return self

    def run(self) -> None:
        try:
            number = 0
            while not self.stopping.is_set():
                self.append_once(self.keys[number % len(self.keys)], f"{self.name}{number}")
                number += 1
        except BaseException as error:  # handed to the test thread by stop()
            self.error = error

    def append_once(self, key: str, token: str) -> None:
        try:
            self.client.append(key, f"{token};")
        except UnknownOutcomeError:
            outcomes = self.unknown
        except UnavailableError:
            outcomes = self.failed  # certainly not applied
        else:
            outcomes = self.acknowledged
        with self.lock:
            outcomes[key].append(token)
            if outcomes is self.acknowledged:
                self.acknowledged_count += 1

    def count(self) -> int:
        with self.lock:
            return self.acknowledged_count

    def wait_for_appends(self, count: int, what: str) -> None:
        target = self.count() + count
        wait_until(lambda: self.count() >= target, PROGRESS_SECONDS, f"{count} appends {what}")

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=CLIENT_TIMEOUT_SECONDS + 5.0)
        if self.thread.is_alive():
            raise AssertionError(f"append worker {self.name} did not stop in time")
        if self.error is not None:
            raise self.error

    def check(self, reader: ShardedKVClient) -> None:
        """Each key holds every acknowledged token exactly once, an unknown one at most
        once, no failed or invented one, all in the order they were sent."""
        for key in self.keys:
            tokens = appended_tokens(reader.get(key))
            acknowledged, unknown = self.acknowledged[key], self.unknown[key]
            duplicated = sorted({token for token in tokens if tokens.count(token) > 1})
            assert not duplicated, f"{key}: appended more than once: {duplicated}"
            missing = [token for token in acknowledged if token not in tokens]
            assert not missing, f"{key}: acknowledged appends lost: {missing}"
            failed = [token for token in self.failed[key] if token in tokens]
            assert not failed, f"{key}: appends reported as not applied are there: {failed}"
            invented = sorted(set(tokens) - set(acknowledged) - set(unknown))
            assert not invented, f"{key}: appends nobody made: {invented}"
            numbers = [int(token.removeprefix(self.name)) for token in tokens]
            assert numbers == sorted(numbers), f"{key}: appends out of order: {tokens}"
            assert len(acknowledged) >= 1, f"{key}: no append was acknowledged"


# --- the scenario -----------------------------------------------------------------------------


@dataclass
class KillReport:
    killed_node: str
    roles: list[str]
    chunks_applied_at_kill: int
    new_leader: str
    moved_shard_on_destination_at_restart: str
    move_seconds: float
    kill_to_settled_seconds: float
    appends_to_staying_keys_during_move: int
    appends_to_moving_keys: int


def pick_shards(configuration: ShardConfiguration) -> tuple[int, int, int]:
    """The shard to move (group 1's first), one that stays in group 1, one of group 2."""
    source_shards = [shard for shard, gid in enumerate(configuration.shards) if gid == SOURCE_GID]
    destination_shards = [
        shard for shard, gid in enumerate(configuration.shards) if gid == DESTINATION_GID
    ]
    assert len(source_shards) >= 2 and destination_shards, configuration.shards
    return source_shards[0], source_shards[1], destination_shards[0]


def move_with_a_leader_killed(
    tmp_path: Path, killed_gid: int, kill_after_chunks: int
) -> KillReport:
    """Load a shard of group 1, move it to group 2 under two append workers, SIGKILL the
    leader of `killed_gid` once `kill_after_chunks` chunks are applied on the destination,
    restart it, and check everything once the move settled."""
    with ProcessCluster(tmp_path, extra_arguments=node_arguments()) as cluster:
        servers = cluster.endpoints
        cluster_id = cluster.cluster_id

        def new_client() -> ShardedKVClient:
            return ShardedKVClient(servers, timeout=CLIENT_TIMEOUT_SECONDS, cluster_id=cluster_id)

        admin = ShardAdmin(servers, timeout=CLIENT_TIMEOUT_SECONDS, cluster_id=cluster_id)
        reader = new_client()
        workers: list[AppendWorker] = []
        try:
            joined = admin.join({gid: servers for gid in GIDS})
            wait_until(lambda: settled(admin, cluster, joined), SETTLE_SECONDS, "the join")
            moved, staying_in_source, staying_in_destination = pick_shards(admin.query())

            bulk = {key: bulk_value(key) for key in keys_in_shard(moved, "bulk", BULK_KEY_COUNT)}
            asyncio.run(fill(servers, cluster_id, SOURCE_GID, bulk))
            moving_token_keys = keys_in_shard(moved, "tokens", MOVING_TOKEN_KEY_COUNT)
            staying_source_key = keys_in_shard(staying_in_source, "tokens", 1)[0]
            staying_destination_key = keys_in_shard(staying_in_destination, "tokens", 1)[0]
            for key in [*moving_token_keys, staying_source_key, staying_destination_key]:
                reader.put(key, "")  # every key exists: stored counts stay put while appending

            source_keys = BULK_KEY_COUNT + MOVING_TOKEN_KEY_COUNT + 1
            wait_until(
                lambda: stored_keys(admin, cluster, SOURCE_GID) == [source_keys] * 3,
                SETTLE_SECONDS,
                f"{source_keys} keys on every replica of group {SOURCE_GID}",
            )
            destination_keys_before = 1  # staying_destination_key

            # Let the preferred leaders take over while the groups are idle (a transfer waits
            # for a follower that is fully caught up, which a steady write load can put off):
            # group 1 on n1, group 2 on n2, so the kill hits one group's leader and only a
            # follower of the other. n1 is also the first of group 1's servers, which the
            # destination asks for chunks first.
            wait_until(
                lambda: leaders(admin, cluster) == PREFERRED_LEADERS,
                LEADER_SECONDS,
                f"the preferred group leaders {PREFERRED_LEADERS}",
            )

            moving_worker = AppendWorker("m", moving_token_keys, new_client())
            staying_keys = [staying_source_key, staying_destination_key]
            staying_worker = AppendWorker("s", staying_keys, new_client())
            workers = [moving_worker.start(), staying_worker.start()]
            moving_worker.wait_for_appends(APPENDS_BEFORE_MOVE, "to the moving shard")
            staying_worker.wait_for_appends(APPENDS_BEFORE_MOVE, "to the staying shards")

            staying_before_move = staying_worker.count()
            move_started = time.monotonic()
            number = admin.move(moved, DESTINATION_GID)

            def chunks_applied() -> int | None:
                """Whole chunks of the moving shard applied on the destination leader, once
                at least `kill_after_chunks` are; None before."""
                leader = group_leader(admin, cluster, DESTINATION_GID)
                if leader is None or leader[1].configuration_number < number:
                    return None
                arrived = leader[1].stored_keys - destination_keys_before
                assert arrived < BULK_KEY_COUNT, "the move finished before the kill"
                chunks = arrived // KEYS_PER_CHUNK
                return chunks if chunks >= kill_after_chunks else None

            at_kill = wait_until(
                chunks_applied, SETTLE_SECONDS, f"{kill_after_chunks} chunks on the destination"
            )
            leaders_at_kill = wait_until(
                lambda: leaders(admin, cluster), LEADER_SECONDS, "both groups' leaders"
            )
            victim = leaders_at_kill[killed_gid]
            roles = [f"leader of group {gid}" for gid in GIDS if leaders_at_kill[gid] == victim]
            cluster.kill(victim)
            killed_at = time.monotonic()

            new_leader, _ = wait_until(
                lambda: group_leader(admin, cluster, killed_gid, excluding=victim),
                LEADER_SECONDS,
                f"a new leader of group {killed_gid}",
            )
            cluster.restart(victim)
            destination = group_leader(admin, cluster, DESTINATION_GID)
            moved_state_at_restart = (
                destination[1].shard_states.get(moved, "absent") if destination else "no leader"
            )
            wait_until(lambda: settled(admin, cluster, number), SETTLE_SECONDS, "the move")
            settled_at = time.monotonic()
            staying_during_move = staying_worker.count() - staying_before_move
            for worker in workers:
                worker.wait_for_appends(APPENDS_AFTER_MOVE, f"by {worker.name} after the move")
        finally:
            try:
                for worker in workers:
                    worker.stop()
            finally:
                for worker in workers:
                    worker.client.close()

        try:
            # The old owner dropped the moved shard on every replica; the new one holds it.
            for node_id, status in replica_statuses(admin, cluster, SOURCE_GID).items():
                assert status is not None, node_id
                assert moved not in status.shard_states, (node_id, status.shard_states)
                assert status.stored_keys == 1, (node_id, status.stored_keys)
            destination_keys = BULK_KEY_COUNT + MOVING_TOKEN_KEY_COUNT + 1
            for node_id, status in replica_statuses(admin, cluster, DESTINATION_GID).items():
                assert status is not None, node_id
                assert status.shard_states.get(moved) == "serving", (node_id, status)
                assert status.stored_keys == destination_keys, (node_id, status.stored_keys)
            assert admin.query().shards[moved] == DESTINATION_GID

            wrong = [key for key, value in bulk.items() if reader.get(key) != value]
            assert not wrong, f"{len(wrong)} values differ after the move, e.g. {wrong[:3]}"
            for worker in workers:
                worker.check(reader)
        finally:
            reader.close()
            admin.close()

    return KillReport(
        killed_node=victim,
        roles=roles,
        chunks_applied_at_kill=at_kill,
        new_leader=new_leader,
        moved_shard_on_destination_at_restart=moved_state_at_restart,
        move_seconds=round(settled_at - move_started, 2),
        kill_to_settled_seconds=round(settled_at - killed_at, 2),
        appends_to_staying_keys_during_move=staying_during_move,
        appends_to_moving_keys=moving_worker.count(),
    )


def test_move_survives_a_sigkill_of_the_destination_leader_mid_migration(
    tmp_path: Path,
) -> None:
    report = move_with_a_leader_killed(tmp_path, DESTINATION_GID, DESTINATION_KILL_AFTER_CHUNKS)
    print(f"\ndestination leader killed, of {BULK_CHUNK_COUNT} chunks: {report}")
    assert report.roles == [f"leader of group {DESTINATION_GID}"]
    assert DESTINATION_KILL_AFTER_CHUNKS <= report.chunks_applied_at_kill < BULK_CHUNK_COUNT


def test_move_survives_a_sigkill_of_the_source_leader_mid_migration(tmp_path: Path) -> None:
    report = move_with_a_leader_killed(tmp_path, SOURCE_GID, SOURCE_KILL_AFTER_CHUNKS)
    print(f"\nsource leader killed, of {BULK_CHUNK_COUNT} chunks: {report}")
    assert report.roles == [f"leader of group {SOURCE_GID}"]
    assert SOURCE_KILL_AFTER_CHUNKS <= report.chunks_applied_at_kill < BULK_CHUNK_COUNT
