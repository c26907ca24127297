"""A real node, in process, with the real KV service and AsyncKVClient: a client whose
session the node's KV machine evicted gets SessionExpiredError, its write is not applied,
and its next write goes under a new session. Also how the error travels on the wire."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from quorumlog import AsyncKVClient
from quorumlog.codec import wire
from quorumlog.errors import SessionExpiredError
from quorumlog.node.errors_to_wire import error_code, error_response
from quorumlog.node.server import Node, NodeSettings

LEADER_WAIT_SECONDS = 10.0


async def wait_for_leader(node: Node) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LEADER_WAIT_SECONDS
    while not node.groups["kv"].core.is_leader:
        assert loop.time() < deadline, "no leader"
        await asyncio.sleep(0.005)


def test_an_evicted_client_is_refused_by_a_real_node_and_goes_on(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = Node(
            NodeSettings(
                node_id="n1",
                listen="127.0.0.1:0",
                data_dir=str(tmp_path),
                tick_ms=5,
                election_ticks=2,
                fsync=False,
            )
        )
        port = await node.start()
        try:
            await wait_for_leader(node)
            assert node.kv is not None
            machine = node.kv.machine
            # One session place, so a second client evicts the first (the node has no
            # setting for it: the bound is the machine's).
            machine.sessions.session_count_max = 1
            endpoints = [f"127.0.0.1:{port}"]
            async with AsyncKVClient(endpoints) as alice, AsyncKVClient(endpoints) as bob:
                await alice.append("k", "x")
                first_id = alice.client_id
                await bob.put("other", "y")
                try:
                    await alice.append("k", "z")
                except SessionExpiredError:
                    pass
                else:
                    raise AssertionError("the evicted client's write was accepted")
                assert machine.get("k") == "x"
                assert machine.session_expired_count == 1
                assert alice.client_id != first_id
                await alice.append("k", "w")
                assert await alice.get("k") == "xw"
        finally:
            await node.stop()

    asyncio.run(scenario())


def test_the_error_travels_as_its_own_code() -> None:
    error = SessionExpiredError("gone")
    assert error_code(error) is wire.ErrorCode.SESSION_EXPIRED
    response = error_response(7, error, lambda: "127.0.0.1:1")
    assert response == wire.ErrorResponse(7, wire.ErrorCode.SESSION_EXPIRED, "gone", None)
    assert wire.decode(wire.encode(response)) == response


class ResultBeforeErrors(msgspec.Struct, frozen=True, array_like=True):
    """KVCommandResult as builds before SESSION_EXPIRED knew it."""

    ok: bool = True
    value: str | None = None


def test_results_stay_readable_across_versions() -> None:
    """KVCommandResult grew a trailing `error`: results from an older node decode with
    none, and an older client reads a refusal as ok=False (it ignores the extra field)."""
    old_bytes = msgspec.msgpack.encode(ResultBeforeErrors(True, "v"))
    assert msgspec.msgpack.decode(old_bytes, type=wire.KVCommandResult) == wire.KVCommandResult(
        True, "v", None
    )
    refused = wire.KVCommandResult(False, None, wire.ErrorCode.SESSION_EXPIRED)
    assert msgspec.msgpack.decode(
        msgspec.msgpack.encode(refused), type=ResultBeforeErrors
    ) == ResultBeforeErrors(False, None)
