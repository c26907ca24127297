"""Chunked pulls: a shard too large for one entry or frame moves in bounded chunks, in
(shard, key) order, and ends exactly where a whole pull would have."""

from __future__ import annotations

import msgspec
import pytest

from quorumlog.codec.wire import KVCommand
from quorumlog.kv.commands import ClientBatch
from quorumlog.shard.group_commands import ClientWrites, PullRequest, PullStatus, encode_message
from quorumlog.shard.group_driver import (
    entry_for_pull_response,
    handle_pull_request,
    next_pull_request,
    pull_actions,
)
from quorumlog.shard.group_machine import ShardState
from tests.unit.shard.test_group_machine import SHARD_COUNT, Replica, key_in_shard


def moved_pair(keys_per_shard: int) -> tuple[Replica, Replica]:
    """Group 1 owned every shard and wrote keys; configuration 2 gives shards 1 and 3 to
    group 2. Returns (old owner, new owner), both at configuration 2."""
    old, new = Replica(1), Replica(2)
    old.configure(1, [1] * SHARD_COUNT)
    new.configure(1, [1] * SHARD_COUNT)
    sequence = 1
    for shard in range(SHARD_COUNT):
        for number in range(keys_per_shard):
            old.write(key_in_shard(shard, number), f"v{shard}-{number}" * 3, sequence=sequence)
            sequence += 1
    for replica in (old, new):
        replica.configure(2, [1, 2, 1, 2])
    assert new.machine.shard_state(1) is ShardState.PULLING
    return old, new


@pytest.mark.parametrize("bytes_max", [1, 40, 200, 10_000])
def test_chunked_pull_moves_the_same_data_and_sessions_as_one_pull(bytes_max: int) -> None:
    old, new = moved_pair(keys_per_shard=7)
    whole = old.machine.pull_request_for(2, [1, 3])
    assert whole.insert is not None
    request: PullRequest | None = PullRequest(2, 2, [1, 3], bytes_max=bytes_max)
    chunks = 0
    while request is not None:
        response = handle_pull_request(old.machine, request)
        assert response.status is PullStatus.OK
        entry = entry_for_pull_response(new.machine, response)
        assert entry is not None
        new.control(entry)
        chunks += 1
        request = next_pull_request(request, response)
        if request is not None:
            # Until its last chunk a shard stays PULLING and serves nothing.
            shard, _ = request.resume_at or (0, 0)
            assert new.machine.shard_state(shard) is ShardState.PULLING
    assert chunks >= (2 if bytes_max <= 200 else 1)
    for shard in (1, 3):
        assert new.machine.shard_state(shard) is ShardState.GARBAGE_COLLECTING
        assert new.machine.shard_data(shard) == whole.insert.shards[shard]
        sessions = new.machine.shards[shard].sessions.to_records()
        assert [s.client_id for s in sessions] == [
            s.client_id for s in whole.insert.sessions[shard]
        ]


def test_a_repeated_chunk_after_the_shard_finished_changes_nothing() -> None:
    old, new = moved_pair(keys_per_shard=5)
    request = PullRequest(2, 2, [1, 3], bytes_max=30)
    first = handle_pull_request(old.machine, request)
    responses = [first]
    follow = next_pull_request(request, first)
    while follow is not None:
        response = handle_pull_request(old.machine, follow)
        responses.append(response)
        follow = next_pull_request(follow, response)
    for response in responses:
        entry = entry_for_pull_response(new.machine, response)
        assert entry is not None
        new.control(entry)
    key = key_in_shard(1, 0)
    new.write(key, "written after the move", client_id="other", sequence=1)
    # A new leader restarts the pull from the first chunk: the shard is not PULLING
    # any more, so the stale chunk is not even proposed, and applied it would change nothing.
    assert entry_for_pull_response(new.machine, first) is None
    result = new.machine.apply_entry(responses[0].insert)  # type: ignore[arg-type]
    assert result.shards == []  # type: ignore[union-attr]
    assert new.machine.shard_data(1)[key] == "written after the move"
    assert new.replayed().snapshot() == new.machine.snapshot()


def test_resume_positions_are_the_same_on_every_replica() -> None:
    old, _ = moved_pair(keys_per_shard=6)
    replica = old.replayed()
    request = PullRequest(2, 2, [1, 3], bytes_max=50)
    assert handle_pull_request(old.machine, request) == handle_pull_request(replica, request)


def test_sessions_count_against_the_chunk_bound() -> None:
    """500 clients each keep an unacknowledged failed cas whose result holds the 20 KB value
    it found: 10 MB of sessions. They follow the keys in bounded chunks instead of riding
    in one (found in review: one chunk of 50 MB, over a frame at 700 clients), and the new
    owner ends with every one of them."""
    key = key_in_shard(1, 0)
    old, new = Replica(1), Replica(2)
    for replica in (old, new):
        replica.configure(1, [1] * SHARD_COUNT)
    put = KVCommand(1, "put", key, "v" * 20_000)
    old.propose(ClientWrites(2_000, [ClientBatch("w", 0, [put])]))
    failed_cas = [
        ClientBatch(f"c{i}", 0, [KVCommand(1, "cas", key, "x", "nope")]) for i in range(500)
    ]
    old.propose(ClientWrites(3_000, failed_cas))
    for replica in (old, new):
        replica.configure(2, [1, 2, 1, 2])
    bytes_max = 256 * 1024
    request: PullRequest | None = PullRequest(2, 2, [1, 3], bytes_max=bytes_max)
    largest = 0
    while request is not None:
        response = handle_pull_request(old.machine, request)
        largest = max(largest, len(encode_message(response)))
        entry = entry_for_pull_response(new.machine, response)
        assert entry is not None
        new.control(entry)
        request = next_pull_request(request, response)
    assert largest < 2 * bytes_max
    assert new.machine.shard_state(1) is ShardState.GARBAGE_COLLECTING
    clients = {record.client_id for record in new.machine.shards[1].sessions.to_records()}
    assert {f"c{i}" for i in range(500)} <= clients


def pull_until_done(old: Replica, new: Replica, request: PullRequest | None) -> int:
    chunks = 0
    while request is not None:
        response = handle_pull_request(old.machine, request)
        entry = entry_for_pull_response(new.machine, response)
        assert entry is not None
        new.control(entry)
        chunks += 1
        request = next_pull_request(request, response)
    return chunks


@pytest.mark.parametrize("bytes_max", [30, 60, 150])
def test_a_new_leader_goes_on_from_what_arrived(bytes_max: int) -> None:
    """The leader that began a pull is gone after k chunks (every k); its successor's
    driver works out where to resume from the applied state: it sends no key twice and
    skips none, and the pull ends as a whole one would."""
    whole = moved_pair(keys_per_shard=7)[0].machine.pull_request_for(2, [1, 3])
    assert whole.insert is not None
    total = pull_until_done(
        *moved_pair(keys_per_shard=7), PullRequest(2, 2, [1, 3], bytes_max=bytes_max)
    )
    resumed_mid_shard = 0
    for chunks_before_the_change in range(1, total):
        old, new = moved_pair(keys_per_shard=7)
        request: PullRequest | None = PullRequest(2, 2, [1, 3], bytes_max=bytes_max)
        for _ in range(chunks_before_the_change):
            assert request is not None
            response = handle_pull_request(old.machine, request)
            entry = entry_for_pull_response(new.machine, response)
            assert entry is not None
            new.control(entry)
            request = next_pull_request(request, response)
        actions = pull_actions(new.machine)
        if actions:
            [action] = actions
            resumed = msgspec.structs.replace(action.request, bytes_max=bytes_max)
            if resumed.resume_at is not None:
                resumed_mid_shard += 1
                shard, position = resumed.resume_at
                first = handle_pull_request(old.machine, resumed)
                assert first.insert is not None
                keys = sorted(whole.insert.shards[shard])
                # No key sent twice, none skipped.
                assert next(iter(first.insert.shards[shard]), None) == (
                    keys[position] if position < len(keys) else None
                )
            pull_until_done(old, new, resumed)
        for shard in (1, 3):
            assert new.machine.shard_state(shard) is ShardState.GARBAGE_COLLECTING
            assert new.machine.shard_data(shard) == whole.insert.shards[shard]
    assert resumed_mid_shard > 0


def test_a_resume_point_that_does_not_hold_starts_the_pull_over() -> None:
    """A wrong last key (or a point past the keys) makes the previous owner start over:
    slower, never a gap."""
    old, new = moved_pair(keys_per_shard=7)
    whole = old.machine.pull_request_for(2, [1, 3])
    assert whole.insert is not None
    first_key = sorted(whole.insert.shards[1])[0]
    for resume_at, last_key in [((1, 3), "not-a-key-held"), ((1, 99), "x"), ((3, 1), first_key)]:
        request = PullRequest(2, 2, [1, 3], resume_at=resume_at, resume_last_key=last_key)
        response = handle_pull_request(old.machine, msgspec.structs.replace(request, bytes_max=60))
        assert response.insert is not None
        assert next(iter(response.insert.shards)) == 1
        assert next(iter(response.insert.shards[1])) == first_key
    assert (
        pull_until_done(
            old,
            new,
            PullRequest(2, 2, [1, 3], resume_at=(1, 2), resume_last_key="bad", bytes_max=60),
        )
        > 0
    )
    for shard in (1, 3):
        assert new.machine.shard_data(shard) == whole.insert.shards[shard]
