"""Bad sharded-KV requests get typed errors and the node keeps serving: undecodable
controller commands and group messages, unknown groups, shards out of range, keys of
shards the group does not serve, and controller commands it must refuse."""

from __future__ import annotations

import asyncio
from pathlib import Path

from quorumlog.codec import wire
from quorumlog.node.server import Node, NodeSettings
from quorumlog.shard.controller_commands import Join, Query, decode_results, encode_commands
from quorumlog.shard.group_commands import PullResponse, PullStatus, encode_message
from tests.unit.node.test_kv_requests import RawClient

BAD = wire.ErrorCode.BAD_REQUEST
UNKNOWN = wire.ErrorCode.UNKNOWN_GROUP


def test_bad_sharded_requests_get_typed_errors(tmp_path: Path) -> None:
    async def scenario() -> None:
        node = Node(
            NodeSettings(
                node_id="n1",
                listen="127.0.0.1:0",
                data_dir=str(tmp_path),
                tick_ms=5,
                election_ticks=2,
                fsync=False,
                controller=["n1"],
                shard_groups={1: ["n1"], 2: ["n2"]},
                shard_count=4,
            )
        )
        port = await node.start()
        try:
            assert sorted(node.shard_services) == [1], "hosts only the groups it is in"
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while not all(group.core.is_leader for group in node.groups.values()):
                assert loop.time() < deadline, "no leader"
                await asyncio.sleep(0.005)
            client = await RawClient.connect(port)
            stray = encode_message(PullResponse(1, 1, PullStatus.GONE))
            cases: list[tuple[wire.Frame, wire.ErrorCode]] = [
                (wire.ControllerRequest(request_id=1, client_id="c", commands=b"\xc1"), BAD),
                (wire.ControllerRequest(request_id=2, client_id="c", commands=b"\x90"), BAD),
                (wire.ShardGroupRequest(request_id=3, gid=1, message=b"garbage"), BAD),
                (wire.ShardGroupRequest(request_id=4, gid=1, message=stray), BAD),
                (wire.ShardGroupRequest(request_id=5, gid=2, message=stray), UNKNOWN),
                (wire.ShardStatusRequest(request_id=6, gid=7), UNKNOWN),
                (wire.KVRead(request_id=7, keys=["k"], group="shard-x"), UNKNOWN),
                (wire.KVRead(request_id=8, keys=["k"], group="shard-2"), UNKNOWN),
                # Found in review: these reached int() and closed the connection ...
                (wire.KVRead(request_id=16, keys=["k"], group="shard-\u00b2"), UNKNOWN),
                (wire.KVRead(request_id=17, keys=["k"], group="shard-" + "9" * 5000), UNKNOWN),
                # ... and a KV request naming the controller was served by the "kv" group.
                (
                    wire.KVWrite(
                        request_id=18,
                        client_id="c",
                        commands=[wire.KVCommand(1, "put", "k", "v")],
                        group="controller",
                    ),
                    UNKNOWN,
                ),
                (
                    wire.KVWrite(
                        request_id=9,
                        client_id="c",
                        commands=[wire.KVCommand(1, "put", "k", "v")],
                        group="shard-1",
                    ),
                    wire.ErrorCode.WRONG_GROUP,  # configuration 0: no group owns anything
                ),
                (
                    wire.KVRead(request_id=10, keys=["k"], group="shard-1"),
                    wire.ErrorCode.WRONG_GROUP,
                ),
                (wire.KVScan(request_id=11, group="shard-1", shards=[99]), BAD),
                (
                    wire.KVWrite(
                        request_id=12,
                        client_id="c",
                        commands=[wire.KVCommand(1, "put", "k" * 5000, "v")],
                        group="shard-1",
                    ),
                    wire.ErrorCode.TOO_LARGE,
                ),
            ]
            for request, code in cases:
                answer = await client.ask(request)
                assert isinstance(answer, wire.ErrorResponse), (request, answer)
                assert answer.code is code, (request, answer)
                assert answer.request_id == getattr(request, "request_id", None)

            # A command the controller must refuse is answered, not applied.
            refused = await client.ask(
                wire.ControllerRequest(
                    request_id=13, client_id="c", commands=encode_commands([Join(1, {0: ["x:1"]})])
                )
            )
            assert isinstance(refused, wire.ControllerResponse)
            [result] = decode_results(refused.results)
            assert not result.ok and result.error is not None and "gid" in result.error

            # The node still serves: the controller answers and the group reports its state.
            query = await client.ask(
                wire.ControllerRequest(
                    request_id=14, client_id="c", commands=encode_commands([Query(2)])
                )
            )
            assert isinstance(query, wire.ControllerResponse)
            [latest] = decode_results(query.results)
            assert latest.configuration is not None and latest.configuration.number == 0
            status = await client.ask(wire.ShardStatusRequest(request_id=15, gid=1))
            assert isinstance(status, wire.ShardStatusResponse)
            assert status.is_leader and status.configuration_number == 0
            await client.close()
        finally:
            await node.stop()

    asyncio.run(scenario())
