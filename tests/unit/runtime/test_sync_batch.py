"""BatchedBackground: the syncs of one loop turn go out together; reports come back in bulk
on the loop thread, each with its own job's error."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration
from quorumlog.raft.messages import Message
from quorumlog.runtime.group import GroupRunner, GroupSettings
from quorumlog.runtime.sync_batch import BatchedBackground

DEADLINE_SECONDS = 10.0


async def wait_for_reports(reports: dict[int, Any], count: int) -> None:
    async with asyncio.timeout(DEADLINE_SECONDS):
        while len(reports) < count:
            await asyncio.sleep(0.001)  # polls a condition under a deadline


def test_jobs_of_one_turn_go_out_as_one_batch_and_report_on_the_loop() -> None:
    async def scenario() -> None:
        background = BatchedBackground(threads=4)
        loop_thread = threading.get_ident()
        ran_on: list[int] = []
        reports: dict[int, Any] = {}

        def job(number: int) -> Any:
            def run() -> None:
                ran_on.append(threading.get_ident())
                if number == 3:
                    raise OSError("disk gone")

            return run

        def done(number: int) -> Any:
            def report(error: BaseException | None) -> None:
                assert threading.get_ident() == loop_thread
                reports[number] = error

            return report

        try:
            for number in range(10):
                background.submit(job(number), done(number))
            await wait_for_reports(reports, 10)
            assert background.batches == 1
            assert loop_thread not in ran_on
            assert isinstance(reports.pop(3), OSError)
            assert set(reports.values()) == {None}
            # A later turn is a batch of its own.
            background.submit(job(11), done(11))
            await wait_for_reports(reports, 10)
            assert background.batches == 2
        finally:
            background.shutdown()

    asyncio.run(scenario())


def test_a_report_that_raises_does_not_lose_the_others() -> None:
    async def scenario() -> None:
        background = BatchedBackground(threads=1)
        handled: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: handled.append(context))
        reports: dict[int, Any] = {}

        def failing_report(error: BaseException | None) -> None:
            raise RuntimeError("a broken owner")

        try:
            background.submit(lambda: None, failing_report)
            background.submit(lambda: None, lambda error: reports.setdefault(1, error))
            await wait_for_reports(reports, 1)
            assert reports == {1: None}
            assert [str(context["exception"]) for context in handled] == ["a broken owner"]
        finally:
            background.shutdown()

    asyncio.run(scenario())


class CountingMachine:
    def __init__(self) -> None:
        self.applied = 0

    def apply(self, index: int, data: bytes) -> int:
        self.applied += 1
        return self.applied

    def mark_applied(self, index: int) -> None:
        pass

    def snapshot(self) -> bytes:
        return str(self.applied).encode()

    def restore(self, data: bytes) -> None:
        self.applied = int(data or b"0")


def no_peers(group: str, target: str, message: Message) -> None:
    raise AssertionError(f"a single-node group sent {message!r}")


def test_groups_sharing_one_batched_background_commit_and_restart(tmp_path: Path) -> None:
    """Many single-node groups whose syncs go through one BatchedBackground: every
    proposal is acknowledged, and what was acknowledged is there after a restart."""
    group_count = 20
    proposals_per_group = 5

    async def run_groups() -> list[int]:
        background = BatchedBackground(threads=4)
        groups = [
            GroupRunner(
                f"g{number}",
                RaftConfig(node_id="n1", election_ticks=2),
                tmp_path / f"g{number}",
                CountingMachine(),
                no_peers,
                Configuration(voters=("n1",)),
                background.executor,
                GroupSettings(tick_seconds=0.005),
                background=background,
            )
            for number in range(group_count)
        ]
        try:
            for group in groups:
                group.start()
            async with asyncio.timeout(DEADLINE_SECONDS):
                while not all(group.core.is_leader for group in groups):
                    await asyncio.sleep(0.005)  # polls a condition under a deadline
                futures = [
                    group.propose(b"x") for group in groups for _ in range(proposals_per_group)
                ]
                await asyncio.gather(*futures)
            return [group.core.applied_index for group in groups]
        finally:
            for group in groups:
                await group.stop()
            background.shutdown()

    first_applied = asyncio.run(run_groups())
    # A no-op of the first term, then the proposals: all acknowledged and applied.
    assert all(applied >= proposals_per_group + 1 for applied in first_applied)
    restarted_applied = asyncio.run(run_groups())
    # Each restart adds a leader no-op and the new proposals; nothing acknowledged is lost.
    for before, after in zip(first_applied, restarted_applied, strict=True):
        assert after >= before + proposals_per_group + 1
