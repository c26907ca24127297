"""The real group runner on one node: group commit, restart, and a full disk."""

from __future__ import annotations

import asyncio
import errno
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration
from quorumlog.raft.messages import Message
from quorumlog.runtime.group import GroupRunner, GroupSettings
from quorumlog.storage.files import storage_error
from quorumlog.storage.filesystem import OsFileHandle


class ListMachine:
    """A state machine that remembers what it applied, in order."""

    def __init__(self) -> None:
        self.items: list[bytes] = []

    def apply(self, index: int, data: bytes) -> int:
        self.items.append(data)
        return len(self.items)

    def mark_applied(self, index: int) -> None:
        pass

    def snapshot(self) -> bytes:
        return b"\n".join(self.items)

    def restore(self, data: bytes) -> None:
        self.items = data.split(b"\n") if data else []


def no_peers(group: str, target: str, message: Message) -> None:
    raise AssertionError(f"a single-node group sent {message!r}")


async def single_node_group(
    directory: Path, executor: ThreadPoolExecutor, machine: ListMachine
) -> GroupRunner:
    group = GroupRunner(
        "g",
        RaftConfig(node_id="n1", election_ticks=2),
        directory,
        machine,
        no_peers,
        Configuration(voters=("n1",)),
        executor,
        GroupSettings(tick_seconds=0.001, snapshot_entries=50, snapshot_trailing_entries=5),
    )
    group.start()
    await wait_for(lambda: group.core.is_leader)
    return group


async def wait_for(condition: Any, timeout_seconds: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.001)


def test_proposals_apply_in_order_and_survive_a_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        with ThreadPoolExecutor(1) as executor:
            machine = ListMachine()
            group = await single_node_group(tmp_path, executor, machine)
            futures = [group.propose(f"v{i}".encode()) for i in range(120)]
            results = await asyncio.gather(*futures)
            assert results == list(range(1, 121))
            await wait_for(lambda: group.store.first_index > 1)  # snapshots compact the log
            await group.stop()
            restarted_machine = ListMachine()
            restarted = await single_node_group(tmp_path, executor, restarted_machine)
            await wait_for(lambda: len(restarted_machine.items) == 120)
            assert restarted_machine.items == [f"v{i}".encode() for i in range(120)]
            await restarted.stop()

    asyncio.run(scenario())


def test_a_full_disk_delays_writes_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk_full = {"on": False, "refused": 0}
    real_write = OsFileHandle.write_at

    def maybe_full(handle: OsFileHandle, data: bytes, offset: int) -> None:
        # Only the log's segments fill up, as the segment writes alone did before.
        if disk_full["on"] and handle.path.name.startswith("log_inprogress_"):
            disk_full["refused"] += 1
            raise storage_error(handle.path, OSError(errno.ENOSPC, "No space left on device"))
        real_write(handle, data, offset)

    monkeypatch.setattr(OsFileHandle, "write_at", maybe_full)

    async def scenario() -> None:
        with ThreadPoolExecutor(1) as executor:
            machine = ListMachine()
            group = await single_node_group(tmp_path, executor, machine)
            assert await group.propose(b"before") == 1
            disk_full["on"] = True
            waiting = group.propose(b"during")
            await wait_for(lambda: disk_full["refused"] >= 2)
            assert not waiting.done()  # not acknowledged: it is not durable
            assert group.failure is None  # the group keeps going
            disk_full["on"] = False
            assert await asyncio.wait_for(waiting, 10) == 2
            assert await group.propose(b"after") == 3
            await group.stop()
            restarted_machine = ListMachine()
            restarted = await single_node_group(tmp_path, executor, restarted_machine)
            await wait_for(lambda: len(restarted_machine.items) == 3)
            assert restarted_machine.items == [b"before", b"during", b"after"]
            await restarted.stop()

    asyncio.run(scenario())
