"""Fail-stop: a violated invariant in a group stops the whole node, with a one-line reason.

Storage errors stop only their group (the node keeps serving the others); anything that is
not a typed `QuorumLogError` means the code is wrong, and going on could persist or send
wrong state.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quorumlog.errors import CorruptLogError
from quorumlog.node.server import Node, NodeFailedError, NodeSettings, is_fatal, run_node
from quorumlog.raft.invariants import InvariantViolation
from quorumlog.raft.messages import VoteRequest


def settings_for(directory: Path) -> NodeSettings:
    return NodeSettings(node_id="n1", listen="127.0.0.1:0", data_dir=str(directory), fsync=False)


def test_an_invariant_violation_in_a_group_stops_the_node(tmp_path: Path) -> None:
    async def scenario() -> None:
        stop = asyncio.Event()
        hosted: list[Node] = []
        running = asyncio.create_task(run_node(settings_for(tmp_path), stop, hosted.append))
        while not hosted:
            assert not running.done(), "the node did not start"
            await asyncio.sleep(0)  # start() runs in the task: give it the loop
        group = hosted[0].groups["kv"]
        # A message addressed to another node breaks the core's first invariant.
        misrouted = VoteRequest(source="n2", target="n9", term=5, last_log_index=0, last_log_term=0)
        group.step(misrouted)  # the transport is not bothered: the group stops
        assert group.failure is not None and "InvariantViolation" in group.failure
        with pytest.raises(NodeFailedError, match="InvariantViolation"):
            await asyncio.wait_for(running, 10)
        assert stop.is_set()

    asyncio.run(scenario())


def test_typed_and_io_errors_are_not_fatal_but_bugs_are() -> None:
    assert not is_fatal(CorruptLogError("log", 0, "bad checksum"))
    assert not is_fatal(ConnectionResetError())
    assert not is_fatal(None)
    assert is_fatal(InvariantViolation("two leaders"))
    assert is_fatal(TypeError("a bug"))
