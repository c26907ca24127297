"""A member takes its join answers in the order it asked: a `subscribe` while the
heartbeat loop's join is out waits for it, so a reordered answer cannot take the member
back a generation."""

from __future__ import annotations

import asyncio
from typing import cast

from quorumlog.stream.assignors import ASSIGNOR_DEFAULT
from quorumlog.stream.client_common import StreamTransport
from quorumlog.stream.group_client import CoordinatorLink
from quorumlog.stream.group_model import GroupCommand, GroupResult
from quorumlog.stream.membership import Membership

STEPS_MAX = 100


class NewestFirstLink:
    """A coordinator whose answers come back newest first (a network that reorders them):
    each join's answer has the generation of its arrival."""

    def __init__(self) -> None:
        self.answers: list[asyncio.Event] = []

    async def send(self, what: str, command: GroupCommand) -> GroupResult:
        generation = len(self.answers) + 1
        answered = asyncio.Event()
        self.answers.append(answered)
        await answered.wait()
        return GroupResult(ok=True, generation=generation, assignment=[("t", generation)])

    def answer_newest(self) -> None:
        waiting = [answered for answered in self.answers if not answered.is_set()]
        if waiting:
            waiting[-1].set()


async def two_joins_at_once() -> tuple[Membership, NewestFirstLink]:
    link = NewestFirstLink()
    membership = Membership(
        cast(CoordinatorLink, link),
        cast(StreamTransport, None),
        "g",
        "client",
        10_000,
        3.0,
        ASSIGNOR_DEFAULT,
    )
    membership.topics = ["t"]
    loop_join = asyncio.ensure_future(membership.heartbeat())
    subscribe_join = asyncio.ensure_future(membership.heartbeat())
    for _ in range(STEPS_MAX):
        if loop_join.done() and subscribe_join.done():
            break
        link.answer_newest()
        await asyncio.sleep(0)  # one turn of the loop: the joins move on, no time passes
    assert loop_join.done() and subscribe_join.done()
    return membership, link


def test_a_join_waits_for_the_one_in_flight_so_the_newest_answer_is_taken_last() -> None:
    membership, link = asyncio.run(two_joins_at_once())
    assert len(link.answers) == 2
    assert membership.current.generation == 2
    assert membership.current.assignment == {("t", 2)}
